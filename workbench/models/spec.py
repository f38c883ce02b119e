"""What a built-in model is: default config, a seeded builder and an example-input maker."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.errors import WorkbenchError

Config = Mapping[str, Any]


@dataclass(frozen=True)
class BuiltinSpec:
    """One entry of the built-in model registry.

    `build` returns the module with seeded weights for a full config (defaults merged with
    overrides; it validates the values). `make_inputs(config, batch, seq)` returns the example
    inputs; `seq` is None for models without a sequence axis. `default_seq` gives the sequence
    length used when the caller passes none, or None when the model has no sequence axis.
    """

    name: str
    summary: str
    defaults: Mapping[str, Any]
    build: Callable[[Config], nn.Module]
    make_inputs: Callable[[Config, int, int | None], tuple[torch.Tensor, ...]]
    default_seq: Callable[[Config], int | None] = lambda config: None


def require_int(model: str, config: Config, key: str, minimum: int = 1) -> None:
    """Raise WorkbenchError unless `config[key]` is an int (not a bool) of at least `minimum`."""
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkbenchError(f"{model}: {key} must be an integer >= {minimum}, got {value!r}")
