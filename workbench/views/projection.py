"""The projection report (`workbench project --html`): a model's operators projected onto an accelerator as bars
coloured by what bounds each, its time per operator kind, the sensitivity sweeps as step time against each knob's
value per model, and the guidance findings with their evidence. `result_view` draws it from the CLI's JSON alone,
so the HTML report and the panel's projection jobs (`server/project_handlers.py`) draw the same."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column, gridplot, row
from bokeh.models import ColumnDataSource, Div, HoverTool, LayoutDOM, Legend, LegendItem
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.codesign.guidance import Finding, shape_text
from workbench.codesign.projection import PROJECTION_COLUMNS
from workbench.codesign.sensitivity import SET_COLUMNS, SWEEP_COLUMNS
from workbench.views._table import duration_unit, frame_source
from workbench.views.text_tables import TextTable, cells, format_count, format_duration, html_table

BOUND_COLORS: dict[str, str] = {"compute": "#4c72b0", "memory": "#55a868", "host fallback": "#c44e52",
                                "launch overhead": "#ccb974", "chip link": "#8172b2", "none": "#b0b0b0"}
"""Colour of each bound category of an operator's bar."""
_CATEGORY = {"compute": "compute", "memory": "memory", "on-chip": "memory", "host": "host fallback",
             "overhead": "launch overhead", "floor": "launch overhead", "chip-link": "chip link"}
EVIDENCE_ROWS = 8
"""Evidence rows shown per finding (the slowest operators)."""


def bound_category(bound: str) -> str:
    """The bar colour's category of a projection's `bound` (on-chip feeds count as memory)."""
    return _CATEGORY.get(bound, "none")


def operator_bars(projection: pd.DataFrame, *, width: int = 1100) -> LayoutDOM:
    """One bar per operator in program order, its height the projected time, coloured by what bounds it; the
    hover names the operator (as text), its layer, shape and times."""
    size, unit, _ = duration_unit(projection["time_ns"])
    frame = pd.DataFrame({
        "x": np.arange(len(projection)), "top": projection["time_ns"].to_numpy() / size,
        "name": projection["name"].astype(str).to_numpy(), "layer": projection["layer"].fillna("").astype(str),
        "kind": projection["kind"].astype(str), "unit": projection["unit"].astype(str),
        "shape": [shape_text(row) for row in projection.to_dict("records")],
        "time": [format_duration(v) for v in projection["time_ns"]],
        "compute": [format_duration(v) for v in projection["compute_ns"]],
        "memory": [format_duration(v) for v in projection["memory_ns"]],
        "category": [bound_category(b) for b in projection["bound"]]})
    fig = figure(width=width, height=300, title="projected time per operator (program order), by bound",
                 x_axis_label="operator", y_axis_label=f"time ({unit})", tools="xpan,xwheel_zoom,box_zoom,reset",
                 toolbar_location="above")
    items = []
    for category, color in BOUND_COLORS.items():
        part = frame[frame["category"] == category]
        if part.empty:
            continue
        bars = fig.vbar(x="x", top="top", width=0.85, color=color, source=frame_source(part))
        items.append(LegendItem(label=f"{category} ({len(part)})", renderers=[bars]))
    fig.add_layout(Legend(items=items, orientation="horizontal", location="top_left"), "above")
    fig.add_tools(HoverTool(tooltips=[("op", "@name"), ("layer", "@layer"), ("kind", "@kind (@unit)"),
                                      ("shape", "@shape"), ("time", "@time"), ("compute", "@compute"),
                                      ("memory", "@memory"), ("bound", "@category")]))
    fig.y_range.start = 0
    fig.xgrid.visible = False
    return fig


def kind_totals(projection: pd.DataFrame, steps: int = 1, *, width: int = 1100) -> LayoutDOM:
    """Projected time per step of each operator kind, stacked by bound category, largest kind on top."""
    per_step = projection.assign(category=[bound_category(b) for b in projection["bound"]],
                                 time_ns=projection["time_ns"] / steps)
    table = per_step.pivot_table(index="kind", columns="category", values="time_ns", aggfunc="sum", fill_value=0.0)
    table = table.loc[table.sum(axis=1).sort_values().index]
    size, unit, _ = duration_unit(table.sum(axis=1))
    categories = [c for c in BOUND_COLORS if c in table.columns]
    source = ColumnDataSource({"kind": list(table.index), **{c: table[c].to_numpy() / size for c in categories},
                               "total": [format_duration(v) for v in table.sum(axis=1)]})
    fig = figure(y_range=list(table.index), width=width, height=60 + 28 * len(table),
                 title="projected time per step by operator kind", x_axis_label=f"time per step ({unit})",
                 tools="", toolbar_location=None)
    bars = fig.hbar_stack(categories, y="kind", height=0.7, color=[BOUND_COLORS[c] for c in categories],
                          source=source)
    fig.add_layout(Legend(items=[LegendItem(label=c, renderers=[r]) for c, r in zip(categories, bars, strict=True)],
                          location="top_left"), "right")
    fig.add_tools(HoverTool(tooltips=[("kind", "@kind"), ("per step", "@total")]))
    fig.x_range.start = 0
    return fig


def sweep_curves(table: pd.DataFrame, *, width: int = 1100) -> LayoutDOM:
    """Per knob, each model's step time over its step on the description as written (so models whose steps differ
    a hundredfold share one axis) against the knob's value, one line per model; the hover gives the step time:
    | model | figure | value | time_ns | ratio |."""
    figures = []
    models = list(dict.fromkeys(table["model"]))
    colors = {model: Category10_10[i % 10] for i, model in enumerate(models)}
    for name, rows in table.groupby("figure", sort=False):
        values = list(dict.fromkeys(rows["value"]))
        fig = figure(x_range=values, width=max(360, width // 2 - 10), height=360,
                     title=f"step time against {name}, relative to the description as written", x_axis_label=name,
                     y_axis_label="step time / as written", tools="", toolbar_location=None)
        items = []
        for model in models:
            part = rows[rows["model"] == model]
            source = ColumnDataSource({"value": part["value"].to_numpy(), "time_ns": part["time_ns"].to_numpy(),
                                       "time": [format_duration(v) for v in part["time_ns"]],
                                       "ratio": part["ratio"].to_numpy(), "model": part["model"].astype(str)})
            line = fig.line("value", "ratio", source=source, color=colors[model], line_width=2)
            dots = fig.scatter("value", "ratio", source=source, color=colors[model], size=7)
            items.append(LegendItem(label=model, renderers=[line, dots]))
        fig.add_tools(HoverTool(tooltips=[("model", "@model"), (name, "@value"), ("step", "@time"),
                                          ("vs as written", "@ratio{0.00}x")]))
        fig.y_range.start = 0
        fig.add_layout(Legend(items=items, orientation="horizontal", label_text_font_size="9pt"), "below")
        figures.append(fig)
    return gridplot(figures, ncols=2, toolbar_location=None)


def guidance_tables(findings: Sequence[Finding], *, width: int = 1100) -> LayoutDOM:
    """The findings (gain, share, change) and each one's slowest evidence rows, as escaped HTML tables."""
    summary = TextTable("guidance: what fits this accelerator badly, and what a change would save",
                        ("finding", "change projected", "gain", "of step", "step"), tuple(
                            cells(f.title, f.change, format_duration(f.gain_ns), f"{f.gain_share:.1%}", f.step)
                            for f in findings), left=frozenset({"finding", "change projected", "step"}))
    parts = [html_table(summary)]
    for f in findings:
        more = f" (first {EVIDENCE_ROWS} of {len(f.evidence)})" if len(f.evidence) > EVIDENCE_ROWS else ""
        parts.append(html_table(evidence_table(f"{f.kind}: {f.title}{more}", f.evidence.head(EVIDENCE_ROWS))))
    return Div(text='<div style="display:flex;flex-direction:column;gap:12px">' + "".join(parts) + "</div>",
               width=width)


def evidence_table(title: str, evidence: pd.DataFrame) -> TextTable:
    """Evidence rows as a text table: headers without units' suffixes ("time_ns" → "time"), text aligned left."""
    columns = tuple(evidence.columns)
    headers = tuple(c.removesuffix("_ns").replace("_", " ") for c in columns)
    rows = tuple(cells(*(evidence_cell(column, value) for column, value in zip(columns, row, strict=True)))
                 for row in evidence.itertuples(index=False))
    text = frozenset(h for c, h in zip(columns, headers, strict=True)
                     if not pd.api.types.is_numeric_dtype(evidence[c]))
    return TextTable(title, headers, rows, left=text)


def evidence_cell(column: str, value: object) -> str:
    """An evidence value as text: times in their unit, bytes and counts as integers, shares in %."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if column.endswith("_ns"):
        return format_duration(value)
    if column in ("utilization", "columns_used"):
        return f"{float(value):.0%}"  # type: ignore[arg-type]
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        return format_count(value)
    return str(value)


def chip_scaling(chips: Mapping[str, Any], *, width: int = 1100) -> LayoutDOM:
    """The step on each chip count (`workbench project --chips --json`'s `chips`), stacked: time on the chip and
    the all-reduces on the chip links; the hover gives speedup and efficiency. Beside it, the time per shard kind
    at the largest count, and the note when the graph had no dataflow to shard along."""
    scaling = pd.DataFrame.from_records(chips["scaling"])
    labels = [str(c) for c in scaling["chips"]]
    source = ColumnDataSource({
        "chips": labels, "on chip": (scaling["time_ns"] - scaling["comm_ns"]).to_numpy() / 1e3,
        "all-reduce": scaling["comm_ns"].to_numpy() / 1e3, "step": [format_duration(v) for v in scaling["time_ns"]],
        "speedup": scaling["speedup"].to_numpy(), "efficiency": scaling["efficiency"].to_numpy(),
        "comm": [format_duration(v) for v in scaling["comm_ns"]]})
    fig = figure(x_range=labels, width=max(360, width // 2 - 10), height=320, toolbar_location=None, tools="",
                 title="step on several chips, tensor-parallel", x_axis_label="chips",
                 y_axis_label="time per step (µs)")
    bars = fig.vbar_stack(["on chip", "all-reduce"], x="chips", width=0.6, source=source,
                          color=[BOUND_COLORS["compute"], BOUND_COLORS["chip link"]])
    fig.add_tools(HoverTool(renderers=bars, tooltips=[("chips", "@chips"), ("step", "@step"), ("all-reduce", "@comm"),
                                                      ("speedup", "@speedup{0.00}x"),
                                                      ("efficiency", "@efficiency{0%}")]))
    fig.y_range.start = 0
    fig.add_layout(Legend(items=[LegendItem(label=label, renderers=[bar]) for label, bar in
                                 zip(("on the chip", "all-reduce on the chip links"), bars, strict=True)],
                          orientation="horizontal", label_text_font_size="9pt"), "below")
    shards = TextTable(f"time per shard on {chips['largest']} chips", ("shard", "ops", "time", "share"), tuple(
        cells(row["shard"], f"{row['ops']:,}", format_duration(row["time_ns"]), f"{row['share']:.1%}")
        for row in chips["by_shard"]), left=frozenset({"shard"}))
    note = f"<p>{html.escape(chips['note'])}</p>" if chips.get("note") else ""
    return row(fig, Div(text=html_table(shards) + note, width=max(300, width // 2 - 10)))


def projection_view(heading: str, *, projection: pd.DataFrame | None = None, steps: int = 1,
                    findings: Sequence[Finding] = (), sweeps: pd.DataFrame | None = None,
                    tables: Sequence[TextTable] = (), chips: Mapping[str, Any] | None = None,
                    width: int = 1100) -> LayoutDOM:
    """The report: a heading, then what is given of the operator bars and kind totals (`projection`), the step on
    several chips (`chips`, `chip_scaling`), the sweep curves (`sweeps`: | model | figure | value | time_ns | ratio
    |), text `tables` (the model set's ratios) and the guidance (`findings`)."""
    parts: list[LayoutDOM] = [Div(text=f"<h2>{html.escape(heading)}</h2>", width=width)]
    if projection is not None and not projection.empty:
        parts += [operator_bars(projection, width=width), kind_totals(projection, steps, width=width)]
    if chips:
        parts.append(chip_scaling(chips, width=width))
    if sweeps is not None and not sweeps.empty:
        parts.append(sweep_curves(sweeps, width=width))
    if tables:
        parts.append(Div(text='<div style="display:flex;flex-wrap:wrap;gap:24px">'
                         + "".join(html_table(table) for table in tables) + "</div>", width=width))
    if findings:
        parts.append(guidance_tables(findings, width=width))
    return column(*parts)


def result_view(result: Mapping[str, Any], *, width: int = 1100) -> LayoutDOM:
    """The report of a `workbench project --json` result, drawn from it alone: a model's or run's (`ops`) operator
    bars and kind totals, its sweeps as curves (one model: the result's title) and its guidance; or a model set's
    curves and tables."""
    if "ops" not in result:
        table = pd.DataFrame.from_records(result["sweeps"], columns=list(SET_COLUMNS))
        return projection_view(result["title"], sweeps=table, tables=set_tables(result), width=width)
    label = result["title"]
    projection = pd.DataFrame.from_records(result["ops"], columns=list(PROJECTION_COLUMNS))
    swept = [pd.DataFrame.from_records(rows, columns=list(SWEEP_COLUMNS)) for rows in result["sweeps"]]
    curves = pd.concat([t.assign(model=label, ratio=1.0 / t["speedup"]) for t in swept]) if swept else None
    return projection_view(f"{label} on {result['accelerator']}: {format_duration(result['step_ns'])} per step",
                           projection=projection, steps=result["steps"],
                           findings=[Finding.from_dict(f) for f in result["guidance"]], sweeps=curves,
                           chips=result.get("chips"), width=width)


def set_tables(result: Mapping[str, Any]) -> list[TextTable]:
    """A model set's tables (`workbench project --models --json`): per knob each model's step ratio at each value,
    then which knob buys the most."""
    table = pd.DataFrame.from_records(result["sweeps"], columns=list(SET_COLUMNS))
    steps = {row["model"]: row["step_ns"] for row in result["models"]}
    tables = []
    for name, rows in table.groupby("figure", sort=False):
        values = list(dict.fromkeys(rows["value"]))
        ratios = rows.pivot(index="model", columns="value", values="ratio")
        tables.append(TextTable(f"sweep: {name} (step / as written)", ("model", "step as written", *values), tuple(
            cells(model, format_duration(steps[model]), *(f"{ratios.loc[model, v]:.2f}" for v in values))
            for model in steps), left=frozenset({"model"})))
    tables.append(TextTable("which knob buys the most", ("model", "knob", "value", "speedup"), tuple(
        cells(row["model"], row["figure"], row["value"], f"{row['speedup']:.2f}x") for row in result["buys_most"]),
        left=frozenset({"model", "knob", "value"})))
    return tables
