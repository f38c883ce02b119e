"""Profilers behind a registry keyed by the name users choose (`--profiler framework|nsys|ncu`).

A profiler is one module that declares a `ProfilerSpec` and registers it when imported: how a variant's
profiled run happens under it (in this process with the backend's framework session, or in a child
process an external tool launches), the session that child records with, what it adds after the run
(Nsight Compute's `kernel_metrics`), and what it needs (a tool on PATH, a CUDA device). The built-in
profiler modules (`BUILTIN`) are imported on first use of the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError
from workbench.plugins import Plugins

if TYPE_CHECKING:
    import pyarrow as pa

    from workbench.backends.variants import Variant
    from workbench.models import LoadedModel
    from workbench.profiling.child import ChildSpec
    from workbench.profiling.result import ProfiledRun
    from workbench.profiling.settings import ProfileSettings

FRAMEWORK = "framework"
"""The default profiler: the framework's own (torch.profiler, or jax.profiler for JAX variants)."""

BUILTIN = {"framework": "workbench.profiling.framework", "nsys": "workbench.profiling.nsys",
           "ncu": "workbench.profiling.ncu"}
"""The built-in profilers and their modules, in the order they are offered."""

DEFAULT_LAUNCH_COUNT = 50
"""Kernel launches Nsight Compute profiles by default: each one is replayed once per counter pass."""


@dataclass(frozen=True)
class ProfileRequest:
    """One variant's profiled run as a profiler receives it: the variant, the loaded model and its example
    inputs, the temporary folder for the profiler's output, the settings, the spec of a child process that
    runs the same variant, progress (`on_progress(n)` per unit of `progress_units`), and the kernel launches
    Nsight Compute profiles (`kernel_name`, `launch_count`)."""

    variant: Variant
    loaded: LoadedModel
    inputs: Sequence[Any]
    folder: Path
    settings: ProfileSettings
    child: ChildSpec
    on_progress: Callable[[int], None]
    kernel_name: str | None = None
    launch_count: int = DEFAULT_LAUNCH_COUNT


@dataclass(frozen=True)
class Addition:
    """What a profiler adds after the profiled run: tables for the bundle, raw files, and notes (under the
    profiler's name in the capture notes)."""

    tables: Mapping[str, pa.Table] = field(default_factory=dict)
    raw_paths: tuple[Path, ...] = ()
    notes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfilerSpec:
    """A registered profiler.

    `profile` makes the profiled run. `child_session` names the session a child process of the profiler's
    tool records with (None: the run happens in this process under the backend's framework session, so the
    trace is the framework's and the backend's enrichers apply). `records_nvtx` asks the framework's ops
    for NVTX ranges in that child; `memory_history` whether a CUDA run records the allocator's history.
    `adds` runs after the profiled run. `tool` is an executable it needs; `needs_cuda` a CUDA device.
    `label` is run.json's `capture.profiler`, formatted with the framework profiler's name.
    """

    name: str
    description: str
    profile: Callable[[ProfileRequest], ProfiledRun]
    label: str
    child_session: str | None = None
    records_nvtx: bool = False
    memory_history: bool = True
    adds: Callable[[ProfileRequest], Addition] | None = None
    tool: str | None = None
    needs_cuda: bool = False

    @property
    def framework_trace(self) -> bool:
        """Whether the run's trace is the framework profiler's (recorded in this process)."""
        return self.child_session is None


_PROFILERS: Plugins[ProfilerSpec] = Plugins(BUILTIN)


def register_profiler(spec: ProfilerSpec) -> None:
    """Add (or replace) a profiler."""
    _PROFILERS.register(spec.name, spec)


def _registry() -> dict[str, ProfilerSpec]:
    """The registered profilers, the built-in ones first in `BUILTIN` order."""
    return _PROFILERS.entries()


def profilers() -> list[str]:
    """Names of the registered profilers, the framework's first."""
    return list(_registry())


def get_profiler(name: str) -> ProfilerSpec:
    """The registered profiler `name`."""
    registry = _registry()
    if name not in registry:
        raise WorkbenchError(f"unknown profiler {name!r}; choose one of {', '.join(registry)}")
    return registry[name]


def check_profiler(name: str, device: str, profile: bool = True) -> None:
    """Check, before anything runs, that profiler `name` can profile variants on `device`: the tool exists
    (first, so a machine without it says how to install it), profiling is on, and the device is CUDA when
    the profiler needs it."""
    spec = get_profiler(name)
    if spec.tool is None:
        return
    from workbench.profiling.tools import find_tool

    find_tool(spec.tool)
    if not profile:
        raise WorkbenchError(f"--profiler {name} profiles the variants: it cannot be combined with --no-profile")
    if spec.needs_cuda and device.partition(":")[0] != "cuda":  # the type of a device name (torch's cuda[:N])
        raise WorkbenchError(f"--profiler {name} profiles CUDA work: run with --device cuda (got {device!r})")
