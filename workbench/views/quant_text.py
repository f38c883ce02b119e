"""The quantization lab as text blocks (`workbench quant` prints them; the HTML view embeds them): what the model
was judged on, the recipes side by side, the most sensitive layers, the tensor kinds, the outlier channels and a
mixed-precision plan."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from workbench.hardware.units import format_bytes
from workbench.views.quant import short_recipe
from workbench.views.text_tables import Block, Cell, TextTable, cells, format_count, format_duration, format_number

RECIPE_TEXT_COLUMNS = ("recipe", "SQNR dB", "KL", "metric", "Δ metric", "weights", "KV/token", "projected",
                       "measured CPU", "measured with / note")


def _db(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "exact" if value == math.inf else f"{value:.1f}"


def _signed(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.3g}"


def _bytes(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format_bytes(value)


def recipes_text(recipes: pd.DataFrame, device: str, metric: str | None) -> TextTable:
    """One row per recipe: accuracy, bytes, projected time on `device`, measured CPU time where a kernel ran."""
    rows = tuple(cells(
        short_recipe(r.recipe), Cell(_db(r.sqnr_db)), Cell("-" if pd.isna(r.kl) else f"{r.kl:.2g}"),
        Cell(format_number(None if pd.isna(r.metric) else r.metric)),
        Cell(_signed(r.metric_delta)), Cell(_bytes(r.weight_bytes)),
        Cell(_bytes(None if pd.isna(r.kv_bytes_per_token) else round(r.kv_bytes_per_token))),
        Cell(format_duration(None if pd.isna(r.projected_us) else r.projected_us * 1e3)),
        Cell(format_duration(None if pd.isna(getattr(r, "measured_ms", None)) else r.measured_ms * 1e6)),
        getattr(r, "kernel", "-") or "-") for r in recipes.itertuples(index=False))
    title = (f"recipes (W: the layers' weights, A: their inputs, KV: the KV cache): accuracy against the fp32 model"
             f"{f' and {metric}' if metric else ''}, memory, time projected on {device} (a roofline, no kernel ran) "
             "and measured on this CPU where a kernel exists")
    return TextTable(title, RECIPE_TEXT_COLUMNS, rows, left=frozenset({"recipe", "measured with / note"}))


def sensitivity_text(layers: pd.DataFrame, top: int = 8) -> TextTable:
    """The `top` most sensitive layers of each format, worst first."""
    frame = layers.dropna(subset=["sqnr_db"]).sort_values(["format", "rank"]).groupby("format", sort=False).head(top)
    rows = tuple(cells(r.format, Cell(format_count(r.rank)), r.layer, Cell(format_count(r.params)),
                       Cell(_db(r.sqnr_db)), Cell(f"{r.kl:.2g}"), Cell(_signed(r.metric_delta)))
                 for r in frame.itertuples(index=False))
    return TextTable(f"most sensitive layers: one layer alone in each format (top {top} per format)",
                     ("format", "rank", "layer", "params", "SQNR dB", "KL", "Δ metric"), rows,
                     left=frozenset({"format", "layer"}))


def tensors_text(tensors: pd.DataFrame) -> TextTable:
    """Each tensor kind in each format across the whole model."""
    rows = tuple(cells(r.tensor, r.format, Cell(format_number(r.bits)), Cell(_db(r.sqnr_db)),
                       Cell("-" if pd.isna(r.kl) else f"{r.kl:.2g}"), Cell(_signed(r.metric_delta)), r.note or "")
                 for r in tensors.itertuples(index=False))
    return TextTable("tensor kinds: one kind in each format across the whole model",
                     ("tensor", "format", "bits/value", "SQNR dB", "KL", "Δ metric", "note"), rows,
                     left=frozenset({"tensor", "format", "note"}))


def outliers_text(outliers: pd.DataFrame, smoothing: pd.DataFrame, top: int = 8) -> TextTable:
    """The layers whose inputs have the worst outlier channels, and SmoothQuant's effect on them."""
    frame = outliers.head(top).merge(smoothing, on="layer", how="left")
    rows = tuple(cells(r.layer, Cell(format_count(r.channels)), Cell(format_number(r.ratio)),
                       ", ".join(str(c) for c in r.top_channels), Cell(_db(r.sqnr_db)),
                       Cell(format_number(r.ratio_after)), Cell(_signed(r.gain_db)))
                 for r in frame.itertuples(index=False))
    return TextTable("activation outliers: max/median of the input channels' largest |value| (INT8 per tensor "
                     "suffers above ~10), and SmoothQuant (α = 0.5)",
                     ("layer", "channels", "max/median", "top channels", "INT8 input SQNR dB", "smoothed ratio",
                      "SQNR gain dB"), rows, left=frozenset({"layer", "top channels"}))


def plan_text(plan: Any, fmt: str, budget: str) -> Block:
    """A mixed-precision plan in one paragraph."""
    kept = ", ".join(plan.kept) if plan.kept else "none"
    verdict = Cell("meets", "good") if plan.met else Cell("cannot meet", "bad")
    return (Cell("plan: "), Cell(fmt, "strong"), Cell(" with budget "), Cell(budget, "strong"), Cell(": "), verdict,
            Cell(f" it keeping {len(plan.kept)} layer(s) in bf16 ({kept}); output SQNR {_db(plan.sqnr_db)} dB, KL "
                 f"{plan.kl:.2g}, weights {format_bytes(plan.weight_bytes)}; recipe {plan.recipe}"))
