"""The diff view of two traces (two runs, or two imported traces): what changed, per op and kernel name.

Built on `workbench.analysis.diff.trace_diff`: a sortable table with one row per (name, kind) and its
status coloured (new: only in B, vanished: only in A, what fusion removed; changed; unchanged), a bar chart
of the largest time deltas, and the two timelines one above the other, aligned on their first profiled
step and sharing one time axis (`views.experiments.stacked_timelines`). Selecting table rows or bars selects
those names' spans in both timelines. Names render as text (table cells, axis labels and hover fields).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from bokeh.core.properties import field
from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource,
    DataTable,
    Div,
    FixedTicker,
    HoverTool,
    LayoutDOM,
    Range1d,
    Span,
    StringFormatter,
)
from bokeh.plotting import figure

from workbench.analysis.breakdown import phase_window
from workbench.analysis.diff import COMPARE_KINDS, RunFigures, RunPair, TraceComparison, diff_summary, trace_diff
from workbench.errors import WorkbenchError
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.views._table import data_table, rows_note
from workbench.views.experiments import stacked_timelines
from workbench.views.tables import link_table_to_timeline
from workbench.views.text_tables import Block, Cell, TextTable, cells
from workbench.views.timeline import SPANS_SOURCE

DIFF_TABLE = "diff table"
"""Bokeh `name` of the diff DataTable."""
DELTA_BARS = "diff deltas"
"""Bokeh `name` of the top-deltas bar source."""

STATUS_COLORS: dict[str, str] = {"new": "#d9f0d3", "vanished": "#f4cccc", "changed": "#fff2cc",
                                 "unchanged": "#ffffff"}
"""Cell background of each status in the table."""
STATUS_BAR_COLORS: dict[str, str] = {"new": "#55a868", "vanished": "#c44e52", "changed": "#dd8452",
                                     "unchanged": "#b0b0b0"}
"""Bar colour of each status in the deltas chart."""

LABEL_CHARS = 70
"""Axis labels of the deltas chart are cut to this many characters (kernel names run to hundreds)."""

DIFF_TABLE_COLUMNS = [("status", "status", None), ("name", "name", None), ("kind", "kind", None),
                      ("count_a", "calls A", "0,0.[00]"), ("count_b", "calls B", "0,0.[00]"),
                      ("delta_count", "Δ calls", "+0,0.[00]"), ("time_a_ms", "A ms", "0,0.000"),
                      ("time_b_ms", "B ms", "0,0.000"), ("delta_ms", "Δ ms", "+0,0.000"), ("ratio", "B / A", "0.00")]


def diff_view(a: Trace, b: Trace, labels: tuple[str, str] = ("A", "B"), *, phase: str | None = PHASE_MEASURE,
              per_step: bool = False, top: int = 20, width: int = 1100, max_spans: int = 20_000) -> LayoutDOM:
    """The diff of `a` (the control) and `b` (the test): heading, status-coloured table, top `top` time
    deltas, and both timelines aligned on their first step.

    Only events in each trace's `phase` annotation count when it has one (a capture's measured steps; an
    imported trace counts whole); `per_step` divides counts and times by each trace's profiled steps.
    """
    if labels[0] == labels[1]:
        raise WorkbenchError(f"diff: the two traces need different labels, both are {labels[0]!r}")
    windows = [phase_window(t, phase) if phase else None for t in (a, b)]
    table = trace_diff(a, b, window_a=windows[0], window_b=windows[1], per_step=per_step)
    scope = ", ".join(f"{side}: {'the ' + phase + ' phase' if w else 'whole trace'}"
                      for side, w in zip("AB", windows, strict=True))
    heading = Div(text=_heading(table, labels, scope, per_step), render_as_text=True, width=width)
    if table.empty:
        return column(heading, Div(text="No events of the diffed kinds in either trace.", render_as_text=True))
    diff_table = _table(table, width)
    bars, bar_source = _deltas(table, top, width)
    timelines = stacked_timelines({labels[0]: a, labels[1]: b}, width=width, max_spans=max_spans)
    spans = list(timelines.select({"name": SPANS_SOURCE}))
    link_table_to_timeline(diff_table.source, *spans)
    link_table_to_timeline(bar_source, diff_table.source)  # the table's selection then selects the spans
    return column(heading, diff_table, bars, timelines)


def _heading(table: pd.DataFrame, labels: tuple[str, str], scope: str, per_step: bool) -> str:
    """What the diff found, in one paragraph (labels are user text: it renders as text)."""
    summary = diff_summary(table, top=0)
    names = summary["names"]
    unit = " per step" if per_step else ""
    kinds = "; ".join(f"{kind} {(t['a'] or 0) / 1e6:,.3f} → {(t['b'] or 0) / 1e6:,.3f} ms"
                      for kind, t in summary["time_ns"].items())
    return (f"A = {labels[0]}, B = {labels[1]} ({scope}). Names: {names['new']} new, {names['vanished']} vanished "
            f"(what fusion or the change removed), {names['changed']} changed, {names['unchanged']} unchanged. "
            f"Time{unit}: {kinds or 'none'}. Select rows or bars to highlight their spans in both timelines."
            f"{rows_note(len(table), 'names')}")


def _table(table: pd.DataFrame, width: int) -> DataTable:
    """The diff table, status and name cells coloured by status."""
    frame = pd.DataFrame({
        "status": table["status"].astype(str).to_numpy(dtype=object),
        "name": table["name"].astype(str).to_numpy(dtype=object),
        "kind": table["kind"].astype(str).to_numpy(dtype=object),
        "count_a": table["count_a"].to_numpy(dtype=np.float64),
        "count_b": table["count_b"].to_numpy(dtype=np.float64),
        "delta_count": table["delta_count"].to_numpy(dtype=np.float64),
        "time_a_ms": table["time_a_ns"].to_numpy(dtype=np.float64) / 1e6,
        "time_b_ms": table["time_b_ns"].to_numpy(dtype=np.float64) / 1e6,
        "delta_ms": table["delta_ns"].to_numpy(dtype=np.float64) / 1e6,
        "ratio": table["ratio"].to_numpy(dtype=np.float64),
    })
    whole = bool(np.all(np.mod(frame[["count_a", "count_b"]].to_numpy(), 1) == 0))  # not per step: counts
    columns = [(f, t, fmt.replace(".[00]", "") if whole and fmt and "[00]" in fmt else fmt)
               for f, t, fmt in DIFF_TABLE_COLUMNS]
    view = data_table(frame, columns, width=width, height=420, name=DIFF_TABLE, hover=("name",))
    view.source.add([STATUS_COLORS.get(s, "#ffffff") for s in view.source.data["status"]], "status_color")
    for col in view.columns:
        if col.field in ("status", "name"):
            col.formatter = StringFormatter(background_color=field("status_color"))
    return view


def _deltas(table: pd.DataFrame, top: int, width: int) -> tuple[figure, ColumnDataSource]:
    """Horizontal bars of the `top` largest time deltas (B - A), coloured by status, largest at the top."""
    rows = table[table["delta_ns"] != 0].head(top)  # trace_diff sorts by |delta_ns|
    n = len(rows)
    labels = [_label(name, kind) for name, kind in zip(rows["name"], rows["kind"], strict=True)]
    source = ColumnDataSource({
        "y": np.arange(n, dtype=np.float64),
        "delta_ms": rows["delta_ns"].to_numpy(dtype=np.float64) / 1e6,
        "time_a_ms": rows["time_a_ns"].to_numpy(dtype=np.float64) / 1e6,
        "time_b_ms": rows["time_b_ns"].to_numpy(dtype=np.float64) / 1e6,
        "count_a": rows["count_a"].to_numpy(dtype=np.float64),
        "count_b": rows["count_b"].to_numpy(dtype=np.float64),
        "name": rows["name"].astype(str).to_numpy(dtype=object),
        "kind": rows["kind"].astype(str).to_numpy(dtype=object),
        "status": rows["status"].astype(str).to_numpy(dtype=object),
        "color": np.array([STATUS_BAR_COLORS.get(s, "#b0b0b0") for s in rows["status"]], dtype=object),
    }, name=DELTA_BARS)
    fig = figure(width=width, height=80 + 22 * max(n, 1), y_range=Range1d(max(n, 1) - 0.5, -0.5),
                 title=f"largest time deltas, B - A (top {n}; green new, red vanished, orange changed)",
                 tools="tap,box_select,reset,save", x_axis_label="Δ ms")
    bars = fig.hbar(y="y", left=0, right="delta_ms", height=0.7, source=source, fill_color="color",
                    line_color=None, nonselection_fill_alpha=0.3)
    fig.add_layout(Span(location=0, dimension="height", line_color="black", line_width=1))
    fig.yaxis.ticker = FixedTicker(ticks=list(range(n)))
    fig.yaxis.major_label_overrides = {i: label for i, label in enumerate(labels)}
    fig.ygrid.grid_line_color = None
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("name", "@name"), ("kind", "@kind"), ("status", "@status"), ("Δ", "@delta_ms{+0,0.000} ms"),
        ("A → B", "@time_a_ms{0,0.000} → @time_b_ms{0,0.000} ms"),
        ("calls", "@count_a{0,0.[00]} → @count_b{0,0.[00]}")]))  # whole numbers print without decimals
    return fig, source


def _label(name: str, kind: str) -> str:
    """An axis label: the name (cut to `LABEL_CHARS`) and its kind."""
    text = name if len(name) <= LABEL_CHARS else name[:LABEL_CHARS - 1] + "…"
    return f"{text} [{kind}]"


# -- the comparison of several runs as text (the CLI's `workbench diff`) -------------------------------------

DELTA_TEXT_COLUMNS = ("status", "name", "calls base", "calls", "Δ calls", "base ms", "ms", "Δ ms", "mean base µs",
                      "mean µs")
"""Columns of the op and kernel delta tables of `comparison_blocks`."""
STEP_TEXT_COLUMNS = ("run", "steps from", "steps", "median ms", "p10 ms", "p90 ms", "spread", "Δ median ms", "ratio")
DEVICE_TEXT_COLUMNS = ("run", "device", "busy ms", "Δ busy ms", "idle ms", "Δ idle ms", "busy %", "copy ms",
                       "copy hidden %", "Δ overlap ms")


def comparison_blocks(comparison: TraceComparison, top: int = 15) -> list[Block]:
    """The comparison as text blocks: which runs against which baseline, step times, then per other run its
    device activity and its op and kernel deltas (largest regressions first, then improvements); every run is
    named by its name, counts print as integers."""
    base = comparison.baseline
    others = [r.name for r in comparison.runs if r.run_id != base.run_id]
    blocks: list[Block] = [
        (Cell(f"{len(others)} run{'s' if len(others) != 1 else ''} ("), Cell(", ".join(others), "strong"),
         Cell(") compared against "), Cell(base.name, "strong"),
         Cell(f"; counted over: {'; '.join(f'{r.name}: {r.scope}' for r in comparison.runs)}")),
    ]
    pairs = {p.run_id: p for p in comparison.pairs}
    blocks.append(TextTable("step time", STEP_TEXT_COLUMNS, tuple(
        _step_row(r, pairs.get(r.run_id)) for r in comparison.runs), left=frozenset({"run", "steps from"})))
    for pair in comparison.pairs:
        if pair.devices:
            blocks.append(TextTable(f"devices: {pair.name} against {base.name}", DEVICE_TEXT_COLUMNS, tuple(
                row for d in pair.devices for row in _device_rows(base.name, pair.name, d)),
                left=frozenset({"run", "device"})))
        for kind in COMPARE_KINDS:
            names = pair.names(kind)
            if not any(names.values()):
                continue
            deltas = pair.deltas(kind, top)
            title = (f"{kind}s: {pair.name} against {base.name}: {names['new']} new, {names['vanished']} vanished, "
                     f"{names['changed']} changed, {names['unchanged']} unchanged (top {top} regressions, then "
                     "improvements)")
            blocks.append(TextTable(title, DELTA_TEXT_COLUMNS, tuple(
                cells(Cell(str(r.status), _STATUS_TONE.get(str(r.status))), str(r.name), _count(r.count_a),
                      _count(r.count_b), _signed(r.delta_count, 0), _ms(r.time_a_ns), _ms(r.time_b_ns),
                      _signed(r.delta_ns / 1e6, 3), _us(r.mean_a_ns), _us(r.mean_b_ns))
                for r in deltas.itertuples()), left=frozenset({"status", "name"})))
    return blocks


_STATUS_TONE = {"new": "bad", "vanished": "good"}


def _count(value: float) -> str:
    return f"{int(value):,}"


def _signed(value: float, digits: int) -> Cell:
    text = f"{value:+,.{digits}f}"
    return Cell(text, "bad" if value > 0 else "good" if value < 0 else None)


def _us(value: float) -> str:
    return "-" if value != value else f"{value / 1e3:,.1f}"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value / 1e6:,.3f}"


def _step_row(run: RunFigures, pair: RunPair | None) -> tuple:
    s = run.steps
    spread = s.get("spread")
    delta = ("baseline" if pair is None else
             "-" if pair.step_delta_ns is None else _signed(pair.step_delta_ns / 1e6, 3))
    ratio = "" if pair is None else ("-" if pair.step_ratio is None else f"{pair.step_ratio:.2f}×")
    return cells(run.name, s["source"], _count(s["steps"]), _ms(s.get("median_ns")), _ms(s.get("p10_ns")),
                 _ms(s.get("p90_ns")), "-" if spread is None else f"{spread:.0%}", delta, ratio)


def _device_rows(base: str, name: str, d: dict[str, Any]) -> list[tuple]:
    def share(v: Any) -> str:
        return "-" if v is None else f"{v:.0%}"

    rows = []
    if d["baseline_device"] is not None:
        rows.append(cells(base, d["baseline_device"], _ms(d["baseline_busy_ns"]), "", _ms(d["baseline_idle_ns"]), "",
                          share(d["baseline_busy_share"]), _ms(d["baseline_copy_ns"]),
                          share(d["baseline_copy_hidden_share"]), ""))
    if d["device"] is not None:
        def delta(key: str) -> Cell | str:
            v = d[f"delta_{key}"]
            return "-" if v is None else _signed(v / 1e6, 3)

        rows.append(cells(name, d["device"], _ms(d["busy_ns"]), delta("busy_ns"), _ms(d["idle_ns"]), delta("idle_ns"),
                          share(d["busy_share"]), _ms(d["copy_ns"]), share(d["copy_hidden_share"]),
                          delta("overlap_ns")))
    return rows
