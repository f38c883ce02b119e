"""`ProfiledRun`: what a variant's profiled run leaves for the runner to read, enrich and bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.trace.formats.trt_layers import LayerTimes


@dataclass(frozen=True)
class ProfiledRun:
    """What a profiled run leaves: the trace to read (the exported Kineto JSON, or the XSpace run
    folder of a JAX variant), FLOP totals per op name (torch's `key_averages`), wall milliseconds per
    phase (profiler overhead included), the variant's preparation notes (quantization, autocast,
    kernel profiling, first-call time, XLA facts), the paths that belong in the bundle's raw/, the
    compile-stage texts of a JAX or TensorRT variant (file name → text), and the CUDA memory snapshot
    (also in `raw_paths`) when one was recorded. A TensorRT variant adds its IProfiler `layer_times`
    (their `to_dict()` JSON is in `raw_paths` too) and `compile_dir`, the folder holding its ONNX graphs
    and timing cache."""

    trace_path: Path
    op_flops: dict[str, float]
    phases_ms: dict[str, float]
    notes: dict[str, Any]
    raw_paths: tuple[Path, ...] = ()
    artifacts: dict[str, str] = field(default_factory=dict)
    memory_snapshot: Path | None = None
    layer_times: LayerTimes | None = None
    compile_dir: Path | None = None
