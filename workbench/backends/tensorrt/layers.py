"""TensorRT's per-layer timings in a profiled run: the `layers` phase and the trace enricher.

IProfiler times each engine layer but slows the execution, so its runs come after the framework profiler
has closed (`profile_layers`, the backend's `after_profile`), never inside `measure`: as many runs as
measured steps, their `LayerTimes` written beside the trace as `<variant>.trt_layers.json` (it goes to the
bundle's raw/), and the build's compile files (ONNX graphs, timing cache) moved out of the variant's
temporary folder into `<variant>.compile/` (the bundle's compile/). `with_layer_times` then merges the
timings into the trace as `layer` events carrying the engine inspector's fusion facts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.backends.registry import Enriched
from workbench.backends.variants import Variant

if TYPE_CHECKING:
    from workbench.profiling.result import ProfiledRun
    from workbench.trace import Trace

LAYERS_PHASE = "layers"
"""The phase of a TensorRT variant's IProfiler runs, after the profiled iterations."""

LAYER_TIMES_SUFFIX = ".trt_layers.json"
"""File of a TensorRT run's `LayerTimes.to_dict()`, beside the trace (it goes to the bundle's raw/)."""

COMPILE_SUFFIX = ".compile"
"""Folder of a TensorRT run's compile files beside the trace (it becomes the bundle's compile/)."""


def profile_layers(prepared: Any, placed: Sequence[Any], run: ProfiledRun, out_dir: Path, iterations: int,
                   timings: dict[str, float]) -> ProfiledRun:
    """The `layers` phase, once the profiler session is closed: `iterations` IProfiler runs, their timings
    written to `<name>.trt_layers.json` in `out_dir` (added to the raw files), the compile files moved to
    `<name>.compile/`; returns `run` with its `layer_times` and `compile_dir`."""
    from workbench.backends.tensorrt.prepared import keep_compile_files
    from workbench.profiling.phases import phase

    name = prepared.variant.name
    with phase(LAYERS_PHASE, timings):
        times = prepared.profile_layers(placed, iterations=iterations)
    path = out_dir / f"{name}{LAYER_TIMES_SUFFIX}"
    path.write_text(json.dumps(times.to_dict()), encoding="utf-8")
    compile_dir = out_dir / f"{name}{COMPILE_SUFFIX}"
    keep_compile_files(prepared.compile_dir, compile_dir)
    return replace(run, raw_paths=(*run.raw_paths, path), layer_times=times, compile_dir=compile_dir)


def with_layer_times(trace: Trace, variant: Variant, profiled: ProfiledRun, folder: Path) -> Enriched:
    """The trace with the IProfiler layer timings merged in as `layer` events (with the inspector's fusion
    facts), and the compile files as the bundle's compile/ folder."""
    if profiled.layer_times is None:
        return Enriched(trace)
    from workbench.analysis.trt_fusion import artifact_fusions
    from workbench.trace.formats.trt_layers import merge_layer_times

    device = profiled.notes.get("device", variant.device)
    trace = merge_layer_times(trace, profiled.layer_times, device, engine=variant.name,
                              layers=artifact_fusions(profiled.artifacts))
    compiled = profiled.compile_dir
    return Enriched(trace, folders={"compile": compiled} if compiled is not None and compiled.is_dir() else {})
