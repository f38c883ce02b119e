"""`TorchProfilerSession`: torch.profiler as a context manager that exports a Kineto trace.

Two recording modes (`ProfileSettings.record_setup`):

- True (default): the profiler runs from start to close without a schedule, so everything in
  between is recorded, setup included (model copy, quantization, compilation).
- False: a `torch.profiler.schedule(wait=0, warmup=warmup_steps, active=active_steps)` driven by
  `step()`; only the active steps are kept, which costs less and records only the steady state.

On a clean close the trace is written with `export_chrome_trace` as `<name>.pt.trace.json` and the
per-op FLOP totals are taken from `key_averages()`: the exported JSON carries no FLOPs.
"""

from __future__ import annotations

import contextlib
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from workbench.errors import WorkbenchError

TRACE_SUFFIX = ".pt.trace.json"


@dataclass(frozen=True)
class ProfileSettings:
    """What a profiled run records: the mode (see the module docstring), how many warm-up and measured
    iterations it runs, and the profilers' recording options: `record_shapes` to `with_stack` are
    torch.profiler's; `host_tracer_level` (0 off, 1 user annotations, 2 plus runtime, 3 verbose) and
    `python_tracer_level` (0 off, 1 Python calls) are jax.profiler's `ProfileOptions` (JAX variants)."""

    record_setup: bool = True
    warmup_steps: int = 2
    active_steps: int = 3
    record_shapes: bool = True
    profile_memory: bool = True
    with_flops: bool = True
    with_stack: bool = False
    host_tracer_level: int = 2
    python_tracer_level: int = 0

    def __post_init__(self) -> None:
        for key, minimum, maximum in (("warmup_steps", 0, None), ("active_steps", 1, None),
                                      ("host_tracer_level", 0, 3), ("python_tracer_level", 0, 1)):
            value = getattr(self, key)
            if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
                    or (maximum is not None and value > maximum)):
                bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
                raise WorkbenchError(f"profile {key} must be an integer {bounds}, got {value!r}")

    @property
    def steps(self) -> int:
        """Iterations a profiled run makes after setup (warm-up plus measured)."""
        return self.warmup_steps + self.active_steps

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for run.json)."""
        return asdict(self)


def activities(device_type: str) -> list[ProfilerActivity]:
    """The profiler activities for a device type: CPU always, CUDA on a cuda device."""
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device_type == "cuda" else [ProfilerActivity.CPU]


class TorchProfilerSession:
    """One torch.profiler recording, exported into `out_dir` as `<name>.pt.trace.json`.

    Use as a context manager (or `start()` / `close()`); call `step()` after each iteration. Closing
    is idempotent; leaving the `with` block through an exception stops the profiler without
    exporting. After a clean close, `trace_path` names the written file and `op_flops` holds the
    FLOP totals per op name.
    """

    def __init__(self, out_dir: str | Path, name: str, settings: ProfileSettings | None = None,
                 *, device_type: str = "cpu") -> None:
        self.settings = settings or ProfileSettings()
        self.device_type = device_type
        self.trace_path: Path | None = None
        self.op_flops: dict[str, float] = {}
        self._target = Path(out_dir) / f"{name}{TRACE_SUFFIX}"
        self._stack: ExitStack | None = None
        self._profiler: torch.profiler.profile | None = None
        self._closed = False

    def start(self) -> None:
        """Start recording (once)."""
        if self._stack is not None or self._closed:
            raise WorkbenchError("a profiler session can be started only once")
        s = self.settings
        schedule = None if s.record_setup else torch.profiler.schedule(
            wait=0, warmup=s.warmup_steps, active=s.active_steps, repeat=1)
        profiler = torch.profiler.profile(
            activities=activities(self.device_type), schedule=schedule, record_shapes=s.record_shapes,
            profile_memory=s.profile_memory, with_flops=s.with_flops, with_stack=s.with_stack,
        )
        self._stack = ExitStack()
        self._profiler = self._stack.enter_context(profiler)

    def step(self) -> None:
        """Mark the end of an iteration (drives the schedule when `record_setup` is off)."""
        if self._profiler is None:
            raise WorkbenchError("the profiler session is not running")
        self._profiler.step()

    def step_scope(self, n: int) -> contextlib.AbstractContextManager[Any]:
        """Nothing: torch.profiler marks steps itself (`ProfilerStep#N`) and `phase` labels them."""
        return contextlib.nullcontext()

    @property
    def raw_paths(self) -> tuple[Path, ...]:
        """What goes into the bundle's raw/: the exported trace file."""
        return (self.trace_path,) if self.trace_path else ()

    def close(self, *, export: bool = True) -> Path | None:
        """Stop recording and, with `export`, write the trace and collect FLOPs; returns the trace
        path (None when nothing was exported). Later calls only return the same path."""
        if self._closed:
            return self.trace_path
        self._closed = True
        stack, profiler = self._stack, self._profiler
        self._stack = self._profiler = None
        if stack is None or profiler is None:
            return None
        stack.close()
        if export:
            profiler.export_chrome_trace(str(self._target))
            self.trace_path = self._target
            self.op_flops = {avg.key: float(avg.flops) for avg in profiler.key_averages() if avg.flops}
        return self.trace_path

    def __enter__(self) -> TorchProfilerSession:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(export=exc_type is None)
