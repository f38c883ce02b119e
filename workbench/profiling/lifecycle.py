"""A variant's life, labelled by phase: `load`, `compile`, then iterations under a profiler session.

`prepare_variant` is the setup every run shares (timed benchmark or profiled run): `load` prepares
the variant through its backend (a copy of the model on its device, quantized, wrapped for compilation)
and places the inputs; `compile` is the first call, where compilers compile (for eager it is just a call).
`profile_variant` adds the iterations: `warmup`, then `measure` with one `step N` per iteration, all
recorded by a profiler session (`workbench.profiling.session`): the backend's framework session
(torch.profiler, jax.profiler), or, in a child process an external tool launched, the session that
profiler names (`cuda-range`, which only brackets the measured iterations). With `record_setup` the
session is already running during `load` and `compile`, so quantization and compilation work is in the
trace too. A backend that records the CUDA caching allocator's history (torch) does so on CUDA with
`profile_memory` and leaves its snapshot beside the trace (see `workbench.trace.formats.cuda_snapshot`).

A backend's `after_profile` phase (TensorRT's per-layer IProfiler runs) comes after the framework session
has closed, never inside `measure`, and adds what it recorded to the `ProfiledRun`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.backends import Prepared, Variant, get_backend, prepare
from workbench.backends.devices import parse_device
from workbench.models import LoadedModel
from workbench.profiling.phases import phase
from workbench.profiling.result import ProfiledRun
from workbench.profiling.session import SessionContext, open_session
from workbench.profiling.settings import ProfileSettings
from workbench.trace.formats.cuda_snapshot import SNAPSHOT_SUFFIX
from workbench.trace.schema import PHASE_COMPILE, PHASE_LOAD, PHASE_MEASURE, PHASE_WARMUP, step_label

if TYPE_CHECKING:
    from workbench.profiling.registry import ProfilerSpec

MEMORY_HISTORY_ENTRIES = 200_000
"""Most allocator events a CUDA memory history keeps (a ring buffer: the latest ones survive)."""


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
    with phase(PHASE_LOAD, timings):
        prepared = prepare(variant, loaded, kernel_profile=kernel_profile)
        placed = prepared.place(inputs)
    done()
    with phase(PHASE_COMPILE, timings):
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
    tool: ProfilerSpec | None = None,
) -> ProfiledRun:
    """Prepare `variant` afresh (with compiler kernels named in traces) and run its labelled lifecycle under
    a profiler session writing into `out_dir`. `on_progress` is called after each setup phase and each
    iteration. `tool` is the external profiler that launched this process, whose in-child session then records
    (module docstring); None (the default): the framework's own session, in this process."""
    settings = settings or ProfileSettings()
    tick = on_progress or _nothing
    timings: dict[str, float] = {}
    spec = get_backend(variant.backend)
    device_type = parse_device(variant.device).type
    context = SessionContext(device_type, emit_nvtx=tool is not None and tool.records_nvtx and spec.emits_nvtx)
    in_child = tool.child_session if tool is not None else None
    session = open_session(in_child or spec.framework_profiler, out_dir, variant.name, settings, context)
    snapshot = None
    keeps_history = tool is None or tool.memory_history
    if settings.profile_memory and keeps_history and spec.cuda_memory_history and device_type == "cuda":
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
        with phase(PHASE_WARMUP, timings):
            for _ in range(settings.warmup_steps):
                prepared.run(placed)
                prepared.sync()
                session.step()
                tick()
        with phase(PHASE_MEASURE, timings):
            for n in range(settings.active_steps):
                with session.step_scope(n), phase(step_label(n), timings):
                    prepared.run(placed)
                    prepared.sync()
                session.step()
                tick()
    assert session.trace_path is not None  # a session closed without an exception has exported
    raw = (*session.raw_paths, snapshot) if snapshot is not None else session.raw_paths
    run = ProfiledRun(session.trace_path, session.op_flops, timings, dict(prepared.notes), raw,
                      dict(getattr(prepared, "artifacts", {})), snapshot)
    if spec.after_profile is not None and (tool is None or tool.framework_trace):
        run = spec.after_profile(prepared, placed, run, Path(out_dir), settings.active_steps, timings)
    return run


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


def _nothing() -> None:
    """Default progress hook."""
