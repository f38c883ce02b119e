"""Optimized inference paths, their benchmark harness and numerics checks.

A `Variant` names a path (backend × precision × compile × device × batch); `prepare` turns one
plus a `LoadedModel` into a `PreparedVariant`; `run_benchmark` times several of them interleaved;
`compare` measures how far a variant's output is from the fp32 eager reference. Nothing here
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
from workbench.backends.numerics import Numerics, compare
from workbench.backends.prepare import Prepared, PreparedVariant, prepare
from workbench.backends.quantize import quantize_int8_dynamic, quantize_int8_weight_only, torchao_available
from workbench.backends.variants import REFERENCE, Variant, get_variant, list_variants

__all__ = [
    "REFERENCE",
    "CudaEventTimer",
    "LatencyStats",
    "Numerics",
    "Prepared",
    "PreparedVariant",
    "ProgressCallback",
    "Timer",
    "Variant",
    "WallClockTimer",
    "Workload",
    "available_devices",
    "compare",
    "get_variant",
    "list_variants",
    "prepare",
    "quantize_int8_dynamic",
    "quantize_int8_weight_only",
    "resolve_device",
    "run_benchmark",
    "torchao_available",
]
