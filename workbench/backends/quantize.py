"""Int8 quantization of a module's Linear layers: torchao first, torch.ao as the int8 fallback.

Each quantizer takes the module (already on its device) and returns the quantized module with
a short description of the path taken, which `prepare` records in the variant's notes.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import warnings
from types import ModuleType

import torch
from torch import nn

from workbench.errors import VariantUnavailable

TORCHAO_HINT = "pip install torchao"


def torchao_available() -> bool:
    """Whether torchao can be imported (checked without importing it)."""
    return importlib.util.find_spec("torchao") is not None


def _use_torchao(requested: bool | None) -> bool:
    return torchao_available() if requested is None else requested


def _torchao_quantization() -> ModuleType:
    """`torchao.quantization`, imported without torchao's warnings about its optional CUDA kernels
    (mxfp8, cutlass) that cannot load on a CPU build and do not matter here."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module("torchao.quantization")
    finally:
        logger.setLevel(level)


def _torchao_quantize(module: nn.Module, config_name: str) -> tuple[nn.Module, str]:
    tq = _torchao_quantization()
    tq.quantize_(module, getattr(tq, config_name)())
    return module, f"torchao.quantize_({config_name})"


def quantize_int8_dynamic(
    module: nn.Module, device: torch.device, *, use_torchao: bool | None = None
) -> tuple[nn.Module, str]:
    """Dynamic int8 activations × int8 weights on every Linear.

    With torchao (`use_torchao` None means "if installed") this is
    Int8DynamicActivationInt8WeightConfig; without it, torch.ao's `quantize_dynamic` (qint8 Linear,
    CPU only).
    """
    if _use_torchao(use_torchao):
        return _torchao_quantize(module, "Int8DynamicActivationInt8WeightConfig")
    if device.type != "cpu":
        raise VariantUnavailable(
            f"int8 on {device} needs torchao (the torch.ao fallback is CPU only): {TORCHAO_HINT}"
        )
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as exc:
        raise VariantUnavailable(f"int8 needs torchao on torch {torch.__version__}: {TORCHAO_HINT}") from exc
    with warnings.catch_warnings():
        # torch.ao.quantization and quantized tensors are deprecated in favour of torchao.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8)
    return quantized, "torch.ao.quantize_dynamic(qint8 Linear)"


def quantize_int8_weight_only(
    module: nn.Module, device: torch.device, *, use_torchao: bool | None = None
) -> tuple[nn.Module, str]:
    """Int8 weights with fp32 activations on every Linear (torchao Int8WeightOnlyConfig; no fallback)."""
    if not _use_torchao(use_torchao):
        raise VariantUnavailable(f"int8-weight-only needs torchao: {TORCHAO_HINT}")
    return _torchao_quantize(module, "Int8WeightOnlyConfig")


FP8_MIN_CAPABILITY = (8, 9)
"""fp8 matmuls need Ada (sm_89) or Hopper (sm_90) and later."""


def quantize_fp8_dynamic(module: nn.Module, device: torch.device) -> tuple[nn.Module, str]:
    """Dynamic fp8 (e4m3) activations × fp8 weights on every Linear (torchao
    Float8DynamicActivationFloat8WeightConfig); only on CUDA GPUs of compute capability 8.9 or more."""
    if device.type != "cuda":
        raise VariantUnavailable(f"fp8 needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper), not {device}")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        gpu = torch.cuda.get_device_name(device)
        raise VariantUnavailable(f"fp8 needs compute capability >= 8.9; {gpu} is {capability[0]}.{capability[1]}")
    if not torchao_available():
        raise VariantUnavailable(f"fp8 needs torchao: {TORCHAO_HINT}")
    return _torchao_quantize(module, "Float8DynamicActivationFloat8WeightConfig")
