"""The `ProfilerSession` protocol and the registry of sessions that record inside the profiled process.

A session brackets a variant's profiled iterations: `start()` (or `with`), `step()` after each
iteration, `step_scope(n)` around iteration n, and `close(export=...)`, which is idempotent; after a
clean close `trace_path` names what the run's trace is read from, `raw_paths` what goes to the
bundle's raw/, and `op_flops` any per-op FLOP totals. Sessions register under a name: a backend names
its framework's (`torch.profiler`, `jax.profiler`), a profiler that runs the variant under an external
tool names the one used in the tool's child process (`cuda-range`). The built-in session modules are
imported on first use, each importing its framework only then.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from workbench.errors import WorkbenchError
from workbench.profiling.settings import ProfileSettings

BUILTIN = {
    "torch.profiler": "workbench.profiling.torch_profiler",
    "jax.profiler": "workbench.profiling.jax_profiler",
    "cuda-range": "workbench.profiling.cuda_range",
}
"""Built-in session names and the modules that register them."""


class ProfilerSession(Protocol):
    """One recording around a variant's profiled iterations (see the module docstring)."""

    trace_path: Path | None
    op_flops: dict[str, float]

    @property
    def raw_paths(self) -> tuple[Path, ...]:
        """Files and folders for the bundle's raw/ (after a clean close)."""

    def start(self) -> None:
        """Start the session (once)."""

    def step(self) -> None:
        """Mark the end of an iteration."""

    def step_scope(self, n: int) -> contextlib.AbstractContextManager[Any]:
        """A context around iteration `n` (a step marker where the profiler wants one)."""

    def close(self, *, export: bool = True) -> Path | None:
        """Stop; with `export`, write the trace. Later calls return the same path."""

    def __enter__(self) -> ProfilerSession: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


@dataclass(frozen=True)
class SessionContext:
    """What a session may need of the run beyond its settings: the device type it runs on, and whether
    the framework's ops should emit NVTX ranges (for a tool that records them)."""

    device_type: str = "cpu"
    emit_nvtx: bool = False


SessionFactory = Callable[[Path, str, ProfileSettings, SessionContext], ProfilerSession]
"""Opens a session writing into a folder, for a variant name, with settings and context."""

_SESSIONS: dict[str, SessionFactory] = {}


def register_session(name: str, factory: SessionFactory) -> None:
    """Add (or replace) a session kind."""
    _SESSIONS[name] = factory


def open_session(name: str, out_dir: str | Path, variant: str, settings: ProfileSettings,
                 context: SessionContext) -> ProfilerSession:
    """A new (not yet started) session of kind `name`."""
    if name not in _SESSIONS and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in _SESSIONS:
        raise WorkbenchError(f"unknown profiler session {name!r}; known: {', '.join(sorted({*BUILTIN, *_SESSIONS}))}")
    return _SESSIONS[name](Path(out_dir), variant, settings, context)
