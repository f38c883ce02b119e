"""TensorRT variants: torch → ONNX → precision in the graph (ModelOpt) → strongly typed TensorRT engine.

`prepare_tensorrt(variant, loaded)` checks what the variant needs (TensorRT >= 10, a CUDA device able to
run its precision, the `workbench[onnx]` packages) and returns a `PreparedTrtVariant`, which builds
its engine on the first call. The steps live in `onnx_export` (dynamic-batch ONNX), `precision` (ModelOpt
AutoCast fp16/bf16, Q/DQ int8/fp8, on CPU) and `engine` (build with DETAILED profiling verbosity and a
timing cache; `execute_async_v3`; per-layer IProfiler timings). Nothing here imports TensorRT, onnx or
ModelOpt at module import.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.backends.devices import resolve_device
from workbench.backends.registry import BackendSpec, register_backend
from workbench.backends.tensorrt.deps import check_installed, require_tensorrt
from workbench.backends.tensorrt.layers import profile_layers, with_layer_times
from workbench.backends.tensorrt.onnx_export import OPSET
from workbench.backends.tensorrt.precision import PRECISIONS
from workbench.backends.tensorrt.prepared import CALIBRATION_SAMPLES, PreparedTrtVariant
from workbench.backends.variants import Variant
from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.models import LoadedModel

MIN_CAPABILITY = {"bf16": (8, 0), "fp8": (8, 9)}
"""Oldest GPU architecture (CUDA compute capability) with TensorRT kernels for a precision: bf16 from
Ampere, fp8 from Ada / Hopper."""

__all__ = ["PRECISIONS", "PreparedTrtVariant", "prepare_tensorrt"]


def prepare_tensorrt(variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False,
                     timing_cache: str | Path | None = None,
                     calibration_samples: int = CALIBRATION_SAMPLES) -> PreparedTrtVariant:
    """A TensorRT variant of `loaded`, built on its first call; VariantUnavailable when this machine cannot
    run it (no TensorRT: the message gives the install line; no CUDA device; a GPU too old for the
    precision), MissingDependency for a missing `workbench[onnx]` package.

    `timing_cache` is a TensorRT timing cache file to start from (e.g. a previous bundle's
    compile/timing.cache); it is updated after the build. `calibration_samples` example inputs feed
    ModelOpt's calibration. `kernel_profile` changes nothing: the engine's kernels are named in traces anyway.
    """
    if variant.precision not in PRECISIONS:
        raise WorkbenchError(f"variant {variant.name}: TensorRT precision must be one of "
                             f"{', '.join(PRECISIONS)}, got {variant.precision!r}")
    try:
        trt = require_tensorrt()
    except VariantUnavailable as exc:
        raise VariantUnavailable(f"variant {variant.name}: {exc}") from exc
    device = resolve_device(variant.device)
    if device.type != "cuda":
        raise VariantUnavailable(f"variant {variant.name}: TensorRT runs on NVIDIA GPUs (device cuda[:N]), "
                                 f"not {variant.device}")
    capability = torch.cuda.get_device_capability(device)
    gpu = torch.cuda.get_device_name(device)
    needed = MIN_CAPABILITY.get(variant.precision)
    if needed and capability < needed:
        raise VariantUnavailable(f"variant {variant.name}: {gpu} (compute capability {capability[0]}.{capability[1]}) "
                                 f"has no TensorRT {variant.precision} kernels; needs {needed[0]}.{needed[1]}+")
    check_installed("onnx", "onnxscript", *(() if variant.precision == "fp32" else ("onnxruntime", "modelopt")))
    notes = {
        "device": str(device),
        "gpu": gpu,
        "compute_capability": f"{capability[0]}.{capability[1]}",
        "tensorrt_version": trt.__version__,
        "torch_version": torch.__version__,
        "precision": variant.precision,
        "compile": "tensorrt",
        "onnx_opset": OPSET,
        "calibration_samples": None if variant.precision == "fp32" else calibration_samples,
    }
    return PreparedTrtVariant(variant, loaded, device, notes,
                              timing_cache=Path(timing_cache) if timing_cache is not None else None,
                              calibration_samples=calibration_samples)


VARIANTS = tuple(
    Variant(f"trt-{precision}", backend="tensorrt", precision=precision, compile="tensorrt",
            description=f"TensorRT engine, {precision} set in the ONNX graph (strongly typed; NVIDIA GPUs)")
    for precision in ("fp16", "bf16", "int8", "fp8")
)
"""The TensorRT variants, one per precision set in the ONNX graph."""

register_backend(BackendSpec("tensorrt", VARIANTS, prepare_tensorrt, framework_profiler="torch.profiler",
                             enrichers=(with_layer_times,), after_profile=profile_layers))
