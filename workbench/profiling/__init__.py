"""Profiling: profiler sessions and phase labels around a variant's runs.

`phase(name)` labels a region for torch.profiler and NVTX at once; profiler sessions
(`workbench.profiling.session`) record one run: torch.profiler, jax.profiler, or the CUDA range a tool's child
process records; profilers (`workbench.profiling.registry`: framework, nsys, ncu) say how a profiled run
happens; `workbench.profiling.lifecycle.profile_variant` runs a variant's whole labelled lifecycle;
`attach_flops` joins the profiler's FLOP totals into the trace read back from the export. (Named apart from
the notebook's `wb.capture(...)`, which runs a whole experiment.) The registry and the lifecycle are imported
from their modules, not re-exported here: they load the backends and torch, which a phase label around an
import of traces must not.
"""

from __future__ import annotations

from workbench.profiling.environment import environment
from workbench.profiling.flops import attach_flops
from workbench.profiling.phases import NVTX_DOMAIN, phase
from workbench.profiling.result import ProfiledRun
from workbench.profiling.settings import ProfileSettings, progress_units

__all__ = [
    "NVTX_DOMAIN",
    "ProfileSettings",
    "ProfiledRun",
    "attach_flops",
    "environment",
    "phase",
    "progress_units",
]

