"""Which execution provider an ONNX Runtime variant runs on, checked against this machine: the provider must
be among `onnxruntime.get_available_providers()` (the CUDA and TensorRT ones come with onnxruntime-gpu) and
the variant's device must be the provider's (cpu for the CPU provider, cuda[:N] for the GPU ones)."""

from __future__ import annotations

from typing import Any

from workbench.backends.devices import parse_device
from workbench.backends.onnxruntime.recipes import CPU, CUDA, TENSORRT, OrtRecipe
from workbench.backends.variants import Variant
from workbench.errors import VariantUnavailable

GPU_INSTALL = "pip install onnxruntime-gpu (in place of onnxruntime) on a machine with an NVIDIA GPU"
"""How to get the CUDA and TensorRT execution providers."""


def session_providers(variant: Variant, recipe: OrtRecipe, available: list[str]) -> tuple[list[Any], str]:
    """The `providers` argument of the variant's `InferenceSession` (its provider with options, then the
    fallbacks: TensorRT → CUDA → CPU) and the device it runs on; VariantUnavailable when the provider is not
    available here or the variant's device is not the provider's."""
    if recipe.provider not in available:
        extra = f": {GPU_INSTALL}" if recipe.provider in (CUDA, TENSORRT) else ""
        raise VariantUnavailable(f"variant {variant.name}: onnxruntime has no {recipe.provider} here (available: "
                                 f"{', '.join(available)}){extra}")
    device = parse_device(variant.device)
    if recipe.provider == CPU:
        if device.type != "cpu":
            raise VariantUnavailable(f"variant {variant.name}: ONNX Runtime runs here on its CPU execution "
                                     f"provider (device cpu), not {variant.device}")
        return [CPU], "cpu"
    if device.type != "cuda":
        raise VariantUnavailable(f"variant {variant.name}: the {recipe.provider} runs on NVIDIA GPUs "
                                 f"(device cuda[:N]), not {variant.device}")
    index = device.index or 0
    chain: list[Any] = [(CUDA, {"device_id": index}), CPU]
    if recipe.provider == TENSORRT:
        chain.insert(0, (TENSORRT, {"device_id": index}))
    return chain, f"cuda:{index}"
