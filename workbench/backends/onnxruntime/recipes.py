"""What each ONNX Runtime variant does, as data: execution provider, graph optimization level, and the graph
transformation applied before the session opens (int8 quantization, fp16 conversion)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workbench.backends.variants import Variant

Optimization = Literal["disabled", "basic", "extended", "all"]
Quantization = Literal["dynamic", "static"]

OPTIMIZATIONS: tuple[Optimization, ...] = ("disabled", "basic", "extended", "all")
"""ORT's graph optimization levels (`GraphOptimizationLevel.ORT_DISABLE_ALL` ... `ORT_ENABLE_ALL`): basic folds
constants and removes redundant nodes, extended adds the node fusions (FusedMatMul, Gelu, LayerNormalization,
Attention ...), all adds layout changes (NCHWc)."""

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"


@dataclass(frozen=True)
class OrtRecipe:
    """One ORT variant's recipe: `provider` (the execution provider, the CPU one as fallback for the GPU ones),
    `optimization` level, and `quantization` (int8: dynamic, or static QDQ calibrated on generated inputs);
    fp16 is the variant's precision."""

    provider: str = CPU
    optimization: Optimization = "all"
    quantization: Quantization | None = None


RECIPES: dict[str, OrtRecipe] = {
    "ort": OrtRecipe(),
    "ort-extended": OrtRecipe(optimization="extended"),
    "ort-basic": OrtRecipe(optimization="basic"),
    "ort-noopt": OrtRecipe(optimization="disabled"),
    "ort-int8": OrtRecipe(quantization="dynamic"),
    "ort-int8-static": OrtRecipe(quantization="static"),
    "ort-fp16": OrtRecipe(),
    "ort-cuda": OrtRecipe(provider=CUDA),
    "ort-trt": OrtRecipe(provider=TENSORRT),
}
"""Variant name → recipe."""

_DESCRIPTIONS = {
    "ort": "the model's ONNX export on ONNX Runtime (CPU provider, all graph optimizations)",
    "ort-extended": "ONNX Runtime, CPU provider, graph optimizations up to extended (fusions, no layout changes)",
    "ort-basic": "ONNX Runtime, CPU provider, basic graph optimizations only (constant folding, no fusions)",
    "ort-noopt": "ONNX Runtime, CPU provider, graph optimizations disabled (an ONNX file's numerics reference)",
    "ort-int8": "ONNX Runtime int8: dynamic quantization (int8 weights, activations quantized per call), CPU",
    "ort-int8-static": "ONNX Runtime int8: static QDQ quantization calibrated on generated inputs, CPU",
    "ort-fp16": "ONNX Runtime fp16: the graph converted to float16 (inputs and outputs kept fp32), CPU",
    "ort-cuda": "ONNX Runtime on its CUDA execution provider (onnxruntime-gpu), all graph optimizations",
    "ort-trt": "ONNX Runtime on its TensorRT execution provider (onnxruntime-gpu with TensorRT)",
}
_PRECISIONS = {"ort-int8": "int8", "ort-int8-static": "int8", "ort-fp16": "fp16"}

VARIANTS = tuple(
    Variant(name, backend="onnxruntime", precision=_PRECISIONS.get(name, "fp32"),  # type: ignore[arg-type]
            compile="onnxruntime", fusion=recipe.optimization not in ("disabled", "basic"),
            description=_DESCRIPTIONS[name])
    for name, recipe in RECIPES.items()
)
"""The ONNX Runtime variants (`ort` first)."""
