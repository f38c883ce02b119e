"""`ProfileSettings`: what a profiled run records, shared by every profiler session and the surfaces.

No framework import here: the CLI, the server and the notebook build settings without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.trace.schema import SETUP_PHASES


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


def progress_units(settings: ProfileSettings) -> int:
    """How many times a profiled run reports progress: once per setup phase and per iteration."""
    return len(SETUP_PHASES) + settings.steps
