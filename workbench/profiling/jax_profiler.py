"""`JaxProfilerSession`: jax.profiler as a context manager that writes an XSpace (XProf) capture.

It mirrors `TorchProfilerSession` so one lifecycle drives both: `start()`/`close()` (or `with`),
`step()` after each iteration, `step_scope(n)` around iteration n, then `trace_path` and
`raw_paths`. The capture goes to `<out_dir>/<name>/plugins/profile/<timestamp>/<host>.xplane.pb`
(with `<host>.trace.json.gz` beside it), the TensorBoard layout XProf's server reads.

`record_setup` True records from start to close (load and XLA compilation included); False starts
the trace only after `warmup_steps` calls to `step()`, so only the measured steps are kept. Steps are
marked with `StepTraceAnnotation` (XProf's step boundaries); phase names come from `phase()`, which
adds a `TraceAnnotation` whenever JAX is loaded.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import TracebackType
from typing import Any

from workbench.errors import WorkbenchError
from workbench.profiling.quiet import NativeChatter
from workbench.profiling.session import SessionContext, register_session
from workbench.profiling.settings import ProfileSettings

STEP_NAME = "step"
"""Name of the `StepTraceAnnotation` around each iteration (its `step_num` stat numbers it)."""


def _profiler() -> Any:
    import jax.profiler

    return jax.profiler


class JaxProfilerSession:
    """One jax.profiler recording into `<out_dir>/<name>/` (see the module docstring)."""

    def __init__(self, out_dir: str | Path, name: str, settings: ProfileSettings | None = None) -> None:
        self.settings = settings or ProfileSettings()
        self.log_dir = Path(out_dir) / name
        self.trace_path: Path | None = None
        self.op_flops: dict[str, float] = {}  # XLA's FLOPs live in the compile facts, not per op
        self._steps = 0
        self._started = self._tracing = self._closed = False
        self._chatter = NativeChatter.off()

    @property
    def raw_paths(self) -> tuple[Path, ...]:
        """What goes into the bundle's raw/: the `plugins` folder, keeping XProf's layout."""
        return (self.log_dir / "plugins",) if self.trace_path else ()

    def start(self) -> None:
        """Start recording (once); with `record_setup` off, recording waits for the warm-up steps."""
        if self._started or self._closed:
            raise WorkbenchError("a profiler session can be started only once")
        self._started = True
        if self.settings.record_setup or self.settings.warmup_steps == 0:
            self._begin()

    def _begin(self) -> None:
        profiler = _profiler()
        options = profiler.ProfileOptions()
        options.host_tracer_level = self.settings.host_tracer_level
        options.python_tracer_level = self.settings.python_tracer_level
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._chatter = NativeChatter()  # XLA's and TensorFlow's log lines are left out while tracing
        try:
            profiler.start_trace(str(self.log_dir), profiler_options=options)
        except BaseException:
            self._chatter.close()
            raise
        self._tracing = True

    def step_scope(self, n: int) -> contextlib.AbstractContextManager[Any]:
        """The `StepTraceAnnotation` of iteration `n` while recording (nothing before)."""
        if not self._tracing:
            return contextlib.nullcontext()
        return _profiler().StepTraceAnnotation(STEP_NAME, step_num=n)

    def step(self) -> None:
        """Mark the end of an iteration; starts recording after the warm-up when `record_setup` is off."""
        if not self._started or self._closed:
            raise WorkbenchError("the profiler session is not running")
        self._steps += 1
        if not self._tracing and self._steps >= self.settings.warmup_steps:
            self._begin()

    def close(self, *, export: bool = True) -> Path | None:
        """Stop recording; with `export`, find the written run folder and return it (None when nothing
        was recorded). Later calls only return the same path."""
        if self._closed:
            return self.trace_path
        self._closed = True
        if not self._tracing:
            return None
        self._tracing = False
        try:
            _profiler().stop_trace()
        finally:
            self._chatter.close()
        if export:
            runs = sorted((self.log_dir / "plugins" / "profile").glob("*/*.xplane.pb"))
            if not runs:
                raise WorkbenchError(f"jax.profiler wrote no .xplane.pb under {self.log_dir}")
            self.trace_path = runs[-1].parent
        return self.trace_path

    def __enter__(self) -> JaxProfilerSession:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(export=exc_type is None)


def _open(out_dir: Path, name: str, settings: ProfileSettings, context: SessionContext) -> JaxProfilerSession:
    return JaxProfilerSession(out_dir, name, settings)


register_session("jax.profiler", _open)
