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
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from workbench.errors import WorkbenchError
from workbench.profiling.quiet import NativeChatter
from workbench.profiling.session import SessionContext, register_session
from workbench.profiling.settings import ProfileSettings

TRACE_SUFFIX = ".pt.trace.json"


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
        self._chatter = NativeChatter.off()
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
        self._chatter = NativeChatter()  # Kineto's USDT/STAGE lines are left out until the session closes
        self._stack = ExitStack()
        try:
            self._profiler = self._stack.enter_context(profiler)
        except BaseException:
            self._chatter.close()
            raise

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
        try:
            stack.close()
            if export:
                profiler.export_chrome_trace(str(self._target))
                self.trace_path = self._target
                self.op_flops = {avg.key: float(avg.flops) for avg in profiler.key_averages() if avg.flops}
        finally:
            self._chatter.close()
        return self.trace_path

    def __enter__(self) -> TorchProfilerSession:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(export=exc_type is None)


def _open(out_dir: Path, name: str, settings: ProfileSettings, context: SessionContext) -> TorchProfilerSession:
    return TorchProfilerSession(out_dir, name, settings, device_type=context.device_type)


register_session("torch.profiler", _open)
