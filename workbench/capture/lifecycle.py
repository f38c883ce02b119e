"""A variant's life, labelled by phase: `load`, `compile`, then iterations under the profiler.

`prepare_variant` is the setup every run shares (timed benchmark or profiled run): `load` prepares
the variant (a copy of the model on its device, quantized, wrapped for compilation) and places the
inputs; `compile` is the first call, where torch.compile compiles (for eager it is just a call).
`profile_variant` adds the iterations: `warmup`, then `measure` with one `step N` per iteration,
all recorded by a `TorchProfilerSession` (a `JaxProfilerSession` for JAX variants; for a run under
Nsight Systems or Compute, a `CudaRangeSession` that only brackets the measured iterations). With
`record_setup` the profiler is already running during `load` and `compile`, so quantization and
compilation work is in the trace too. A torch variant on CUDA profiled with `profile_memory` also
records the caching allocator's history and leaves its snapshot beside the trace (see
`workbench.trace.cuda_snapshot`).

A TensorRT variant profiled with the framework's profiler then gets a `layers` phase: as many runs as
measured steps through TensorRT's IProfiler, which times each layer but slows the execution, so it comes
after the profiler session has closed and never inside `measure`. Its timings (`LayerTimes`, also written
beside the trace as `<variant>.trt_layers.json`) and the build's compile files (ONNX graphs, timing cache,
moved out of the variant's temporary folder into `<variant>.compile/`) are kept on the `ProfiledRun`.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.backends import Prepared, Variant, prepare
from workbench.backends.devices import parse_device
from workbench.capture.jax_profiler import JaxProfilerSession
from workbench.capture.nsight import FRAMEWORK, CudaRangeSession
from workbench.capture.phases import SETUP, phase, step_label
from workbench.capture.torch_profiler import ProfileSettings, TorchProfilerSession
from workbench.models import LoadedModel
from workbench.trace.cuda_snapshot import SNAPSHOT_SUFFIX
from workbench.trace.trt_layers import LayerTimes

MEMORY_HISTORY_ENTRIES = 200_000
"""Most allocator events a CUDA memory history keeps (a ring buffer: the latest ones survive)."""

LAYERS_PHASE = "layers"
"""The phase of a TensorRT variant's IProfiler runs, after the profiled iterations."""

LAYER_TIMES_SUFFIX = ".trt_layers.json"
"""File of a TensorRT run's `LayerTimes.to_dict()`, beside the trace (it goes to the bundle's raw/)."""

COMPILE_SUFFIX = ".compile"
"""Folder of a TensorRT run's compile files beside the trace (it becomes the bundle's compile/)."""


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


def progress_units(settings: ProfileSettings) -> int:
    """How many times `profile_variant` reports progress: once per setup phase and per iteration."""
    return len(SETUP) + settings.steps


def prepare_variant(
    variant: Variant,
    loaded: LoadedModel,
    inputs: Sequence[torch.Tensor],
    *,
    kernel_profile: bool = False,
    timings: MutableMapping[str, float] | None = None,
    on_phase: Callable[[], None] | None = None,
) -> tuple[Prepared, tuple[Any, ...]]:
    """The prepared variant and the inputs placed on its device, after its first call. The `load` and
    `compile` phases are labelled, timed into `timings`, and each followed by `on_phase()`."""
    done = on_phase or _nothing
    with phase("load", timings):
        prepared = prepare(variant, loaded, kernel_profile=kernel_profile)
        placed = prepared.place(inputs)
    done()
    with phase("compile", timings):
        prepared.first_call(placed)
    done()
    return prepared, placed


def profile_variant(
    variant: Variant,
    loaded: LoadedModel,
    inputs: Sequence[torch.Tensor],
    out_dir: str | Path,
    settings: ProfileSettings | None = None,
    on_progress: Callable[[], None] | None = None,
    *,
    profiler: str = FRAMEWORK,
) -> ProfiledRun:
    """Prepare `variant` afresh (with inductor kernel profiling, so generated kernels are named
    events) and run it under torch.profiler; the trace goes to `out_dir/<variant>.pt.trace.json`.
    `on_progress` is called after each setup phase and each iteration. `profiler` "nsys" or "ncu"
    (in a process the tool launched) brackets only the measured iterations for the tool instead.
    A TensorRT variant under the framework's profiler also gets its `layers` phase (module docstring)."""
    settings = settings or ProfileSettings()
    tick = on_progress or _nothing
    timings: dict[str, float] = {}
    session = _session(variant, out_dir, settings, profiler)
    snapshot = None
    if (settings.profile_memory and profiler != "ncu" and variant.backend == "torch"
            and parse_device(variant.device).type == "cuda"):
        snapshot = Path(out_dir) / f"{variant.name}{SNAPSHOT_SUFFIX}"
    with ExitStack() as stack:
        if snapshot is not None:
            stack.enter_context(cuda_memory_history(snapshot))
        if settings.record_setup:
            stack.enter_context(session)
        prepared, placed = prepare_variant(
            variant, loaded, inputs, kernel_profile=True, timings=timings, on_phase=tick
        )
        if not settings.record_setup:
            stack.enter_context(session)
        with phase("warmup", timings):
            for _ in range(settings.warmup_steps):
                prepared.run(placed)
                prepared.sync()
                session.step()
                tick()
        with phase("measure", timings):
            for n in range(settings.active_steps):
                with session.step_scope(n), phase(step_label(n), timings):
                    prepared.run(placed)
                    prepared.sync()
                session.step()
                tick()
    assert session.trace_path is not None  # a session closed without an exception has exported
    raw = (*session.raw_paths, snapshot) if snapshot is not None else session.raw_paths
    layer_times = compile_dir = None
    if variant.backend == "tensorrt" and profiler == FRAMEWORK:
        layer_times, compile_dir, layers_json = _tensorrt_layers(prepared, placed, Path(out_dir), variant.name,
                                                                 settings.active_steps, timings)
        raw = (*raw, layers_json)
    return ProfiledRun(session.trace_path, session.op_flops, timings, dict(prepared.notes), raw,
                       dict(getattr(prepared, "artifacts", {})), snapshot, layer_times, compile_dir)


def _tensorrt_layers(prepared: Any, placed: Sequence[Any], out_dir: Path, name: str, iterations: int,
                     timings: dict[str, float]) -> tuple[LayerTimes, Path, Path]:
    """The `layers` phase of a TensorRT variant, once its profiler session is closed: `iterations` IProfiler
    runs (slower than the measured ones, hence outside them), their timings written to
    `<name>.trt_layers.json`, and the compile files moved to `<name>.compile/` in `out_dir`."""
    from workbench.backends.tensorrt.prepared import keep_compile_files

    with phase(LAYERS_PHASE, timings):
        times = prepared.profile_layers(placed, iterations=iterations)
    path = out_dir / f"{name}{LAYER_TIMES_SUFFIX}"
    path.write_text(json.dumps(times.to_dict()), encoding="utf-8")
    compile_dir = out_dir / f"{name}{COMPILE_SUFFIX}"
    keep_compile_files(prepared.compile_dir, compile_dir)
    return times, compile_dir, path


@contextmanager
def cuda_memory_history(path: Path, max_entries: int = MEMORY_HISTORY_ENTRIES) -> Iterator[None]:
    """Record the CUDA caching allocator's history (with Python stacks) during the block and, when it
    ends without an exception, pickle `torch.cuda.memory._snapshot()` to `path`; recording stops either way."""
    memory = torch.cuda.memory
    memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    try:
        yield
        with open(path, "wb") as f:
            pickle.dump(memory._snapshot(), f)
    finally:
        memory._record_memory_history(enabled=None)


def _session(variant: Variant, out_dir: str | Path, settings: ProfileSettings,
             profiler: str = FRAMEWORK) -> TorchProfilerSession | JaxProfilerSession | CudaRangeSession:
    """The profiler session: the CUDA profiler range for a run under Nsight, else the backend's own
    profiler: jax.profiler (XSpace) for JAX, torch.profiler otherwise."""
    if profiler != FRAMEWORK:
        return CudaRangeSession(out_dir, variant.name, settings, device_type=parse_device(variant.device).type,
                                emit_nvtx=profiler == "nsys" and variant.backend == "torch")
    if variant.backend == "jax":
        return JaxProfilerSession(out_dir, variant.name, settings)
    return TorchProfilerSession(out_dir, variant.name, settings, device_type=parse_device(variant.device).type)


def _nothing() -> None:
    """Default progress hook."""
