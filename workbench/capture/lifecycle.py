"""A variant's life, labelled by phase: `load`, `compile`, then iterations under the profiler.

`prepare_variant` is the setup every run shares (timed benchmark or profiled run): `load` prepares
the variant (a copy of the model on its device, quantized, wrapped for compilation) and places the
inputs; `compile` is the first call, where torch.compile compiles (for eager it is just a call).
`profile_variant` adds the iterations: `warmup`, then `measure` with one `step N` per iteration,
all recorded by a `TorchProfilerSession` (a `JaxProfilerSession` for JAX variants). With
`record_setup` the profiler is already running during `load` and `compile`, so quantization and
compilation work is in the trace too.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.backends import Prepared, Variant, prepare
from workbench.backends.devices import parse_device
from workbench.capture.jax_profiler import JaxProfilerSession
from workbench.capture.phases import SETUP, phase, step_label
from workbench.capture.torch_profiler import ProfileSettings, TorchProfilerSession
from workbench.models import LoadedModel


@dataclass(frozen=True)
class ProfiledRun:
    """What a profiled run leaves: the trace to read (the exported Kineto JSON, or the XSpace run
    folder of a JAX variant), FLOP totals per op name (torch's `key_averages`), wall milliseconds per
    phase (profiler overhead included), the variant's preparation notes (quantization, autocast,
    kernel profiling, first-call time, XLA facts), the paths that belong in the bundle's raw/, and
    the compile-stage texts of a JAX variant (file name → text)."""

    trace_path: Path
    op_flops: dict[str, float]
    phases_ms: dict[str, float]
    notes: dict[str, Any]
    raw_paths: tuple[Path, ...] = ()
    artifacts: dict[str, str] = field(default_factory=dict)


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
) -> ProfiledRun:
    """Prepare `variant` afresh (with inductor kernel profiling, so generated kernels are named
    events) and run it under torch.profiler; the trace goes to `out_dir/<variant>.pt.trace.json`.
    `on_progress` is called after each setup phase and each iteration."""
    settings = settings or ProfileSettings()
    tick = on_progress or _nothing
    timings: dict[str, float] = {}
    session = _session(variant, out_dir, settings)
    with ExitStack() as stack:
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
    return ProfiledRun(session.trace_path, session.op_flops, timings, dict(prepared.notes), session.raw_paths,
                       dict(getattr(prepared, "artifacts", {})))


def _session(variant: Variant, out_dir: str | Path,
             settings: ProfileSettings) -> TorchProfilerSession | JaxProfilerSession:
    """The profiler for `variant`'s backend: jax.profiler (XSpace) for JAX, torch.profiler otherwise."""
    if variant.backend == "jax":
        return JaxProfilerSession(out_dir, variant.name, settings)
    return TorchProfilerSession(out_dir, variant.name, settings, device_type=parse_device(variant.device).type)


def _nothing() -> None:
    """Default progress hook."""
