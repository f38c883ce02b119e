"""Views of the analytical LLM model (`workbench.llm.perf_model`): KV-cache size against context length
per attention variant and cache precision, and predicted against measured TTFT / TPOT.

The KV figure draws one line per (variant, precision) on log-log axes, colour by variant and dash by
precision, with the memory left for the cache on the device as a horizontal line when given. The
prediction figures put each metric on its own log-log axes with the y = x line: points above it took
longer than predicted (the model is optimistic there). Data comes from `kv_cache_table` and
`prediction_errors`; nothing here computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    Div,
    HoverTool,
    Legend,
    LegendItem,
    NumeralTickFormatter,
    Span,
)
from bokeh.models.layouts import LayoutDOM
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.errors import WorkbenchError
from workbench.hardware.units import format_bytes
from workbench.views._table import data_table
from workbench.views.memory import BYTES_FORMAT

DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")
"""Line dash of each cache precision, in the table's order."""
_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
SCENARIO_COLUMNS = ("batch", "prompt", "new")


def kv_cache_figure(table: pd.DataFrame, *, kv_budget_bytes: float | None = None, width: int = 820,
                    height: int = 420, title: str | None = None) -> figure:
    """KV-cache bytes against context length: a `kv_cache_table` frame, one line per (variant, kv_dtype).

    `kv_budget_bytes` (device memory left after the weights) is drawn as a horizontal line.
    """
    missing = {"variant", "kv_dtype", "context", "kv_bytes"} - set(table.columns)
    if missing:
        raise WorkbenchError(f"KV-cache view: the table lacks column(s) {', '.join(sorted(missing))}")
    batch = int(table["batch"].iloc[0]) if "batch" in table and len(table) else 1
    fig = figure(title=title or f"KV-cache size against context length (batch {batch})", width=width,
                 height=height, x_axis_type="log", y_axis_type="log", tools=_TOOLS, active_scroll="wheel_zoom")
    variants = list(dict.fromkeys(table["variant"]))
    dtypes = list(dict.fromkeys(table["kv_dtype"]))
    items = []
    for (variant, dtype), group in table.groupby(["variant", "kv_dtype"], sort=False):
        group = group.sort_values("context")
        source = ColumnDataSource({
            "context": group["context"].to_numpy(), "kv_bytes": group["kv_bytes"].to_numpy(),
            "variant": [variant] * len(group), "kv_dtype": [dtype] * len(group),
            "vs_mha": group["vs_mha"].to_numpy() if "vs_mha" in group else [float("nan")] * len(group),
        })
        color = Category10_10[variants.index(variant) % len(Category10_10)]
        dash = DASHES[dtypes.index(dtype) % len(DASHES)]
        line = fig.line("context", "kv_bytes", source=source, color=color, line_dash=dash, line_width=2)
        dots = fig.scatter("context", "kv_bytes", source=source, color=color, size=4)
        items.append(LegendItem(label=f"{variant} {dtype}", renderers=[line, dots]))
        fig.add_tools(HoverTool(renderers=[dots], tooltips=[
            ("variant", "@variant"), ("cache dtype", "@kv_dtype"), ("context", "@context{0,0} tokens"),
            ("KV cache", f"@kv_bytes{{{BYTES_FORMAT}}}"), ("vs MHA", "@vs_mha{0.000}x")]))
    if kv_budget_bytes is not None and kv_budget_bytes > 0:
        fig.add_layout(Span(location=kv_budget_bytes, dimension="width", line_color="crimson", line_dash="dashed"))
        fig.title.text += f"; red: {format_bytes(kv_budget_bytes)} left for the cache on the device"
    legend = Legend(items=items, click_policy="hide", title="variant, cache dtype", label_text_font_size="8pt",
                    glyph_height=12, label_height=12, spacing=0, padding=4)
    fig.add_layout(legend, "right")
    fig.height = max(height, 16 * len(items) + 80)  # every legend entry visible
    fig.xaxis.axis_label = "context (tokens per sequence)"
    fig.xaxis.formatter = NumeralTickFormatter(format="0,0")
    fig.yaxis.axis_label = "KV cache"
    fig.yaxis.formatter = NumeralTickFormatter(format=BYTES_FORMAT)
    return fig


def prediction_figures(errors: pd.DataFrame, *, width: int = 400, height: int = 360) -> LayoutDOM:
    """Predicted against measured values, one log-log figure per `metric` of a `prediction_errors`
    frame, with y = x; then a table of every row and its relative error."""
    if errors.empty:
        return Div(text="No measurements to compare with.", render_as_text=True)
    figures = []
    scenario = [c for c in SCENARIO_COLUMNS if c in errors]
    for metric, group in errors.groupby("metric", sort=False):
        unit = str(group["unit"].iloc[0]) if "unit" in group else ""
        data = {c: group[c].to_numpy() for c in ("predicted", "measured", "rel_error")}
        data.update({c: group[c].to_numpy() for c in scenario})
        source = ColumnDataSource(data)
        fig = figure(title=f"{metric}: measured against predicted", width=width, height=height,
                     x_axis_type="log", y_axis_type="log", tools=_TOOLS)
        low = float(min(group["predicted"].min(), group["measured"].min()))
        high = float(max(group["predicted"].max(), group["measured"].max()))
        fig.line([low, high], [low, high], color="gray", line_dash="dashed", legend_label="y = x")
        dots = fig.scatter("predicted", "measured", source=source, size=8, color=Category10_10[0])
        fig.add_tools(HoverTool(renderers=[dots], tooltips=[
            *[(c, f"@{c}") for c in scenario], ("predicted", f"@predicted{{0.000}} {unit}"),
            ("measured", f"@measured{{0.000}} {unit}"), ("error", "@rel_error{+0.0%}")]))
        fig.xaxis.axis_label = f"predicted ({unit})" if unit else "predicted"
        fig.yaxis.axis_label = f"measured ({unit})" if unit else "measured"
        fig.legend.location = "top_left"
        figures.append(fig)
    columns = [("metric", "metric", None), *((c, c, "0,0") for c in scenario), ("predicted", "predicted", "0,0.000"),
               ("measured", "measured", "0,0.000"), ("rel_error", "error", "+0.0%")]
    shown = errors[["metric", *scenario, "predicted", "measured", "rel_error"]]
    table = data_table(shown, columns, width=width * max(len(figures), 1), height=min(320, 30 + 25 * len(shown)),
                       widths={"metric": 90, **dict.fromkeys(scenario, 60), "predicted": 90, "measured": 90,
                               "rel_error": 80})
    return column(row(figures), table)


def llm_model_view(kv_table: pd.DataFrame, errors: pd.DataFrame | None = None, *,
                   kv_budget_bytes: float | None = None, title: str | None = None) -> LayoutDOM:
    """The LLM model's page: the KV-cache figure and, when measurements are given, the predicted
    against measured figures."""
    parts: list[LayoutDOM] = []
    if title:
        parts.append(Div(text=title, render_as_text=True, styles={"font-weight": "bold"}))
    parts.append(kv_cache_figure(kv_table, kv_budget_bytes=kv_budget_bytes))
    if errors is not None:
        parts.append(prediction_figures(errors))
    return column(parts)


def projection_view(result: Mapping[str, Any], *, title: str | None = None, width: int = 1100) -> LayoutDOM:
    """The page of a `workbench llm-model` projection (`llm_projection`'s result): its text report
    (`llm_text.llm_model_blocks`), then the KV-cache figure with the memory the device leaves for the cache."""
    from workbench.views.llm_text import llm_model_blocks
    from workbench.views.text_tables import blocks_view

    device_bytes = result["device"].get("memory_bytes")
    budget = device_bytes * result["memory_fraction"] - result["weights"]["bytes"] if device_bytes else None
    return column(blocks_view(llm_model_blocks(result), width=width),
                  llm_model_view(pd.DataFrame(result["kv_cache"]), kv_budget_bytes=budget, title=title))
