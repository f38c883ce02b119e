"""Refusing a model too large for this machine before its weights are made or read.

The estimate is parameters × bytes per parameter (fp32: every LoadedModel is fp32), the parameters counted
on a copy of the model built on the meta device (no memory, no weights). The limit is a fraction of the
memory available now (MemAvailable), so the backends' copies and the activations still fit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from workbench.errors import WorkbenchError, first_line
from workbench.machine import available_memory
from workbench.models.loaded import count_parameters

BYTES_PER_PARAMETER = 4
"""fp32, the dtype of every LoadedModel."""
MEMORY_FRACTION = 0.8
"""The part of the available memory a model's weights may take."""


class ModelTooLarge(WorkbenchError):
    """A model whose weights would not fit in this machine's memory; gives the estimate and the limit."""


def meta_parameter_count(what: str, build: Callable[[], nn.Module]) -> int:
    """Parameters of `build()` (shared ones counted once), built on the meta device so no weights are made;
    `what` names the model when that fails."""
    try:
        with torch.device("meta"):
            return count_parameters(build())
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        raise WorkbenchError(f"{what}: cannot build it on the meta device to estimate its size: "
                             f"{first_line(exc)}") from exc


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def check_fits(what: str, parameters: int, bytes_per_parameter: int = BYTES_PER_PARAMETER) -> None:
    """ModelTooLarge unless `parameters` × `bytes_per_parameter` fits in MEMORY_FRACTION of the available
    memory; `what` names the model in the message."""
    need = parameters * bytes_per_parameter
    available = available_memory()
    limit = int(available * MEMORY_FRACTION)
    if need > limit:
        raise ModelTooLarge(
            f"{what} is too large for this machine: {parameters / 1e9:.2f} B parameters × {bytes_per_parameter} "
            f"bytes = {_gb(need)}, over the limit of {_gb(limit)} ({MEMORY_FRACTION:.0%} of the {_gb(available)} "
            f"of memory available); scale it down (e.g. --set layers=2 --set hidden=512) or use a larger machine"
        )
