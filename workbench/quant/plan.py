"""A mixed-precision plan under an error budget: which layers stay in 16 bits so the rest can take a low-bit format.

Greedy on the per-layer sensitivity: every Linear weight starts in the low-bit format; while the model's output
misses the budget (an SQNR floor in dB and/or a KL ceiling), the most sensitive layer still quantized goes back to
`keep` (bf16). Each step is measured on the whole model, not summed from the single-layer figures, since errors
of layers compound. The result names the recipe, the layers kept, the error reached and the weight bytes.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import nn

from workbench.errors import WorkbenchError
from workbench.quant.cost import weight_footprint
from workbench.quant.formats import parse_spec
from workbench.quant.recipe import quantized
from workbench.quant.sensitivity import layer_sensitivity, output_error


@dataclass(frozen=True)
class Plan:
    """The recipe meeting the budget (or the last tried, `met` False), the layers kept in 16 bits, its error and
    weight bytes, and every step of the search."""

    recipe: str
    kept: tuple[str, ...]
    met: bool
    sqnr_db: float
    kl: float
    weight_bytes: int
    steps: pd.DataFrame


def mixed_precision_plan(model: nn.Module, inputs: Sequence[Any], fmt: str, *, min_sqnr_db: float | None = None,
                         max_kl: float | None = None, keep: str = "bf16",
                         sensitivity: pd.DataFrame | None = None) -> Plan:
    """The fewest layers to keep in `keep` so that the output's SQNR is at least `min_sqnr_db` and its KL at most
    `max_kl` with every other Linear weight in `fmt` (see the module docstring). `sensitivity` is a
    `layer_sensitivity` table; one is computed when it is not given or does not hold `fmt`."""
    if min_sqnr_db is None and max_kl is None:
        raise WorkbenchError("a plan needs a budget: min_sqnr_db, max_kl, or both")
    text = str(parse_spec(fmt))
    if sensitivity is None or text not in set(sensitivity["format"]):
        sensitivity = layer_sensitivity(model, inputs, [fmt])
    ranked = sensitivity[sensitivity["format"] == text].sort_values("sqnr_db", na_position="first")
    order = ranked["layer"].tolist()
    with torch.no_grad():
        reference = model.eval()(*inputs)
    steps, kept = [], []
    while True:
        recipe = ",".join([f"linear.weight={fmt}", *(f"{glob.escape(name)}.weight={keep}" for name in kept)])
        error = output_error(reference, quantized(model, recipe)(*inputs))
        met = ((min_sqnr_db is None or error["sqnr_db"] >= min_sqnr_db)
               and (max_kl is None or error["kl"] <= max_kl))
        footprint = int(weight_footprint(model, recipe, base=keep)["bytes"].sum())
        steps.append({"kept": len(kept), "layer_kept": kept[-1] if kept else "", **error, "weight_bytes": footprint,
                      "met": met})
        if met or len(kept) == len(order):
            return Plan(recipe, tuple(kept), met, error["sqnr_db"], error["kl"], footprint, pd.DataFrame(steps))
        kept.append(order[len(kept)])

