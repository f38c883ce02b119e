"""Profiling: profiler sessions and phase labels around a variant's runs.

`phase(name)` labels a region for torch.profiler and NVTX at once; profiler sessions
(`workbench.profiling.session`) record one run: torch.profiler, jax.profiler, or the CUDA range a tool's child
process records; profilers (`workbench.profiling.registry`: framework, nsys, ncu) say how a profiled run
happens; `profile_variant` runs a variant's whole labelled lifecycle; `attach_flops` joins the profiler's FLOP
totals into the trace read back from the export. (Named apart from the
notebook's `wb.capture(...)`, which runs a whole experiment.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.profiling.environment import environment
from workbench.profiling.flops import attach_flops
from workbench.profiling.phases import NVTX_DOMAIN, phase
from workbench.profiling.registry import FRAMEWORK, check_profiler, get_profiler, profilers
from workbench.profiling.result import ProfiledRun
from workbench.profiling.settings import ProfileSettings, progress_units

if TYPE_CHECKING:
    from workbench.profiling.lifecycle import prepare_variant, profile_variant

_LIFECYCLE = ("prepare_variant", "profile_variant")
"""Names of the lifecycle (backends, torch), loaded on first use: a phase label (`workbench.profiling.phases`,
which an import of traces times its steps with) loads this package but no framework."""

__all__ = [
    "FRAMEWORK",
    "NVTX_DOMAIN",
    "ProfileSettings",
    "ProfiledRun",
    "attach_flops",
    "check_profiler",
    "environment",
    "get_profiler",
    "phase",
    "prepare_variant",
    "profile_variant",
    "profilers",
    "progress_units",
]


def __getattr__(name: str) -> Any:
    if name in _LIFECYCLE:
        from workbench.profiling import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module 'workbench.profiling' has no attribute {name!r}")
