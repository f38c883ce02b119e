"""Capture: profiler sessions and phase labels around a variant's runs.

`phase(name)` labels a region for torch.profiler and NVTX at once; `TorchProfilerSession` records
a Kineto trace; `profile_variant` runs a variant's whole labelled lifecycle under it; `attach_flops`
joins the profiler's FLOP totals into the trace read back from the export.

The package is also the notebook's `wb.capture(...)`: once imported, `workbench.capture` names this
package (Python sets a subpackage as its parent's attribute), so the package is made callable and a
call runs an experiment (`workbench.notebook.capture`).
"""

import sys
import types
from typing import Any

from workbench.capture.environment import environment
from workbench.capture.flops import attach_flops
from workbench.capture.lifecycle import ProfiledRun, prepare_variant, profile_variant, progress_units
from workbench.capture.phases import LIFECYCLE, NVTX_DOMAIN, phase, step_label
from workbench.capture.torch_profiler import TRACE_SUFFIX, ProfileSettings, TorchProfilerSession

__all__ = [
    "LIFECYCLE",
    "NVTX_DOMAIN",
    "TRACE_SUFFIX",
    "ProfileSettings",
    "ProfiledRun",
    "TorchProfilerSession",
    "attach_flops",
    "environment",
    "phase",
    "prepare_variant",
    "profile_variant",
    "progress_units",
    "step_label",
]


class _CallablePackage(types.ModuleType):
    """This package, callable as `wb.capture(...)`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from workbench.notebook import capture

        return capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
