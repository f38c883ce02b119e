"""Optimized inference paths, their benchmark harness and numerics checks.

A `Variant` names a path (backend × precision × compile × device × batch); each backend is one module
behind `workbench.backends.registry` that declares its variants and prepares them; `prepare` turns a
variant plus a `LoadedModel` into a `Prepared` through its backend; `run_benchmark` times several interleaved;
`compare_outputs` measures how far a variant's output is from the fp32 eager reference. Nothing here
probes hardware at import.
"""

from workbench.backends.benchmark import (
    CudaEventTimer,
    LatencyStats,
    ProgressCallback,
    Timer,
    WallClockTimer,
    Workload,
    run_benchmark,
)
from workbench.backends.devices import available_devices, resolve_device
from workbench.backends.numerics import Numerics, compare_outputs
from workbench.backends.prepared import Prepared
from workbench.backends.quantize import quantize_int8_dynamic, quantize_int8_weight_only, torchao_available
from workbench.backends.registry import BackendSpec, backends, get_backend, get_variant, list_variants, prepare
from workbench.backends.variants import REFERENCE, Variant

__all__ = [
    "REFERENCE",
    "BackendSpec",
    "CudaEventTimer",
    "LatencyStats",
    "Numerics",
    "Prepared",
    "ProgressCallback",
    "Timer",
    "Variant",
    "WallClockTimer",
    "Workload",
    "available_devices",
    "backends",
    "compare_outputs",
    "get_backend",
    "get_variant",
    "list_variants",
    "prepare",
    "quantize_int8_dynamic",
    "quantize_int8_weight_only",
    "resolve_device",
    "run_benchmark",
    "torchao_available",
]
