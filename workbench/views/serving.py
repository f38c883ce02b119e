"""A serving run's views (`workbench serve`): what each request went through and what the engine did meanwhile,
all on the run's one clock, and a sweep's throughput–latency curves.

`serving_view(bundle)`: the latency headline (TTFT, TPOT, ITL, E2E percentiles; requests, tokens and goodput per
second) as tables, then three x-linked parts: the **request waterfall** (one row per request by arrival: queued,
prefill and decode bars where the request was joined to the engine steps, arrival → first token → end where
not, failed requests red, a tick per streamed chunk), the **step lane** (one bar per engine step, coloured by
mode, as tall as its batch) and the **counter tracks** of the server's sampled metrics (requests running and
waiting, KV-cache usage, counters as rates per second). Clicking a request selects the steps it was in flight
for (its first to last step) in the lane; clicking a step selects the requests in flight during it. Both are
CustomJS on the tap tools, so they work in a static report.

`serving_sweep_view(points)`: p90 TTFT and E2E against output tokens per second (each point labelled with its
load), goodput against load, and the Pareto front of tokens per second per user against tokens per second, the
knee and the highest load meeting the SLO marked (`workbench.serving.metrics.sweep_summary`).

`serving_panels(bundles)` is the "serving" tab `views.run_kinds` places on every surface.
What is drawn is bounded (`workbench.analysis.serving`); every text from a trace or a generator reaches the page
as Bokeh text or escaped HTML.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    Div,
    HoverTool,
    LabelSet,
    LayoutDOM,
    Legend,
    LegendItem,
    Range1d,
    Span,
    TabPanel,
    Tabs,
    TapTool,
)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.analysis.serving import (
    counter_tracks,
    in_flight,
    point_of,
    step_lane,
    summary_tables,
    sweep_curve,
    waterfall,
)
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name
from workbench.views._style import time_ticks
from workbench.views._table import data_table, frame_source
from workbench.views.timeline import TIMELINE_PLOT

SERVING = "serving"
"""The record kind of a serving run's bundles."""
PHASE_COLORS = {"queued": "#bdbdbd", "prefill": "#dd8452", "delivery": "#55a868", "to first token": "#f3c69f",
                "decode": "#4c72b0", "failed": "#d62728"}
"""Colour of each waterfall bar kind (`workbench.analysis.serving.PHASES`)."""
MODE_COLORS = {"prefill": "#dd8452", "decode": "#4c72b0", "mixed": "#8172b2", "extend": "#dd8452",
               "unknown": "#b0b0b0"}
"""Colour of each engine step mode (prefill and decode as in the generation views)."""
WATERFALL, STEP_LANE = "serving waterfall", "serving steps"
"""`name`s of the waterfall and the step lane figures."""
SEGMENTS, STEPS = "serving segments", "serving step source"
"""`name`s of the sources of the waterfall's bars and of the step lane (a layout finds them to link to)."""
LATENCY_COLUMNS = [("metric", "metric", None), ("mean", "mean ms", "0,0.00"), ("p50", "p50 ms", "0,0.00"),
                   ("p90", "p90 ms", "0,0.00"), ("p99", "p99 ms", "0,0.00"), ("slo_ms", "SLO ms", "0,0.##")]
THROUGHPUT_COLUMNS = [("requests", "requests", "0,0"), ("ok", "ok", "0,0"), ("failed", "failed", "0,0"),
                      ("duration_s", "duration s", "0,0.00"), ("request_throughput", "requests/s", "0,0.00"),
                      ("output_token_throughput", "output tokens/s", "0,0.0"), ("good", "met SLO", "0,0"),
                      ("goodput", "goodput req/s", "0,0.00"), ("goodput_pct", "goodput %", "0.0")]
CURVE_COLUMNS = [("label", "load point", None), ("load", "load", "0,0.##"),
                 ("request_throughput", "requests/s", "0,0.00"),
                 ("output_token_throughput", "output tokens/s", "0,0.0"),
                 ("tokens_per_user", "tokens/s per user", "0,0.0"), ("ttft_p90_ms", "TTFT p90 ms", "0,0.00"),
                 ("e2e_p90_ms", "E2E p90 ms", "0,0.00"), ("goodput", "goodput req/s", "0,0.00"),
                 ("goodput_pct", "goodput %", "0.0")]
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
LEGEND_ABOVE = {"border_line_color": None, "padding": 2, "margin": 2, "spacing": 12, "location": "top_left",
                "label_text_font_size": "8pt", "orientation": "horizontal"}
"""A legend above a figure kept to one thin line."""
BORDER_LEFT = 80
"""Left border of the x-linked figures, so their plot areas line up whatever their y labels."""

SELECT_STEPS = """
// a tapped request: select its bars, and in the step lane the steps from its first to its last (the steps in
// flight between its arrival and end where it was not joined to steps)
const seg = segments.data, st = steps.data
const picked = new Set(segments.selected.indices.map((i) => seg.y[i]))
const bars = [], chosen = []
for (let i = 0; i < seg.y.length; i++) if (picked.has(seg.y[i])) bars.push(i)
const spans = bars.map((i) => [seg.first_step[i], seg.last_step[i], seg.arrival_ns[i], seg.end_ns[i]])
for (let j = 0; j < st.step.length; j++) {
  for (const [first, last, arrival, end] of spans) {
    const joined = Number.isFinite(first) && Number.isFinite(last)
    if (joined ? (st.step[j] >= first && st.step[j] <= last) : (st.left[j] < end && st.right[j] > arrival)) {
      chosen.push(j); break
    }
  }
}
segments.selected.indices = bars
steps.selected.indices = chosen
"""
FOCUS_TIMELINE = """
// the run's timeline (the dashboard tab, same clock) follows: zoomed to the chosen steps, their ops and kernels
const sel = steps.selected.indices
if (sel.length) {
  let lo = Infinity, hi = -Infinity
  for (const j of sel) { lo = Math.min(lo, steps.data.left[j]); hi = Math.max(hi, steps.data.right[j]) }
  const pad = Math.max((hi - lo) * 0.05, 1000)
  try {
    const timeline = cb_obj.document.get_model_by_name(timeline_name)
    if (timeline != null) timeline.x_range.setv({start: lo - pad, end: hi + pad})
  } catch (error) {}  // several runs' timelines in one page: none is this run's alone
}
"""
SELECT_REQUESTS = """
// a tapped step: select the requests in flight during it (their bars) in the waterfall
const seg = segments.data, st = steps.data
const picked = steps.selected.indices
const bars = []
for (let i = 0; i < seg.y.length; i++) {
  for (const j of picked) {
    if (seg.arrival_ns[i] < st.right[j] && seg.end_ns[i] > st.left[j]) { bars.push(i); break }
  }
}
segments.selected.indices = bars
"""


def _heading(text: str, width: int, *, size: str = "13px", bold: bool = True) -> Div:
    """A line of text as a Div, escaped (names come from traces and generators)."""
    weight = "bold" if bold else "normal"
    return Div(text=f'<div style="font-size:{size};font-weight:{weight}">{html.escape(text)}</div>', width=width)


def _counters(bundle: Bundle) -> pa.Table | None:
    """The bundle's counters table alone (not its events: a large trace need not be read for its metrics)."""
    if not bundle.has_trace:
        return None
    path = bundle.local_files() / "counters.parquet"
    return pq.read_table(path, memory_map=True) if path.exists() else None


def serving_view(bundle: Bundle, *, width: int = 1100) -> LayoutDOM:
    """One serving run: its headline tables, then the request waterfall, the step lane and the counter tracks on
    one x range (see the module docstring)."""
    record = bundle.record
    serving = record.serving or {}
    summary = serving.get("summary") or {}
    latency, throughput = summary_tables(summary)
    parts: list[LayoutDOM] = [_heading(f"serving: {display_name(record)}{_describe(serving)}", width),
                              data_table(latency, LATENCY_COLUMNS, width=min(width, 640), height=150),
                              data_table(throughput, THROUGHPUT_COLUMNS, width=width, height=60)]
    notes = _notes(serving)
    if notes:
        parts.append(Div(text="<br>".join(html.escape(n) for n in notes), width=width,
                         styles={"color": "#a33", "font-size": "12px"}))
    flow = waterfall(bundle.table("requests"))
    lane, total_steps = step_lane(bundle.table("steps"))
    tracks = counter_tracks(_counters(bundle))
    flight, bin_ns = in_flight(bundle.table("requests"))
    x_range = _time_range(flow, lane, tracks)
    fall, segments = waterfall_figure(flow, x_range, width=width)
    steps_fig, steps_source = step_figure(lane, total_steps, x_range, width=width)
    link_selection(fall, segments, steps_fig, steps_source)
    parts += [fall, steps_fig]
    if len(flight):
        binned = f", the most in each {bin_ns / 1e6:,.3g} ms" if bin_ns else ""
        parts.append(counter_figure(f"requests in flight (the generator's times{binned})", "requests", flight,
                                    x_range, width=width))
    parts += [counter_figure(f"server: {title}", unit, frame, x_range, width=width) for title, unit, frame in tracks]
    if not tracks:
        parts.append(_heading("no sampled server metrics (run with --metrics-period above 0)", width, bold=False,
                              size="12px"))
    return column(*parts)


def _describe(serving: dict[str, Any]) -> str:
    """", aiperf, rate 8/s poisson, 24 requests" for the heading."""
    load = serving.get("load") or {}
    bits = [str(serving["generator"])] if serving.get("generator") else []
    if load.get("rate") is not None:
        bits.append(f"rate {load['rate']:g}/s {load.get('arrival', '')}".strip())
    if load.get("concurrency") is not None:
        bits.append(f"concurrency {load['concurrency']:g}")
    if load.get("requests") is not None:
        bits.append(f"{load['requests']:,} requests")
    if load.get("isl") is not None and load.get("osl") is not None:
        bits.append(f"ISL {load['isl']} / OSL {load['osl']} tokens")
    return f" ({', '.join(bits)})" if bits else ""


def _notes(serving: dict[str, Any]) -> list[str]:
    """The run's request errors (message: count) and warnings, at most ten lines."""
    errors = serving.get("errors") or {}
    lines = [f"{count} failed: {message}" for message, count in list(errors.items())[:5]] \
        if isinstance(errors, dict) else [str(e) for e in list(errors)[:5]]
    lines += [f"warning: {w}" for w in list(serving.get("warnings") or [])[:5]]
    return lines


def _time_range(flow, lane: pd.DataFrame, tracks) -> Range1d:
    """The shared x range: the requests' span, else the steps', else the counters', padded 2%."""
    if len(flow.requests):
        lo, hi = flow.requests["arrival_ns"].min(), flow.requests["end_ns"].max()
    elif len(lane):
        lo, hi = lane["left"].min(), lane["right"].max()
    elif tracks:
        lo = min(frame["ts_ns"].min() for _, _, frame in tracks)
        hi = max(frame["ts_ns"].max() for _, _, frame in tracks)
    else:
        lo, hi = 0.0, 1e9
    pad = max((hi - lo) * 0.02, 1e6)
    return Range1d(float(lo - pad), float(hi + pad))


def waterfall_figure(flow, x_range: Range1d, *, width: int = 1100):
    """The request waterfall of a `workbench.analysis.serving.Waterfall`; returns the figure and its bars'
    source."""
    n = len(flow.requests)
    note = flow.note + flow.ticks_note
    height = int(min(max(26 + 14 * n, 140), 560)) + 90
    fig = figure(title=f"request waterfall: {flow.total:,} requests by arrival{note}; click one for its steps",
                 width=width, height=height, x_range=x_range, y_range=Range1d(max(n, 1) - 0.5, -0.5),
                 tools=TOOLS, name=WATERFALL, y_axis_label="requests", min_border_left=BORDER_LEFT)
    fig.xaxis.formatter = time_ticks()
    fig.yaxis.major_label_text_font_size = "0pt"
    fig.yaxis.major_tick_line_color = None
    fig.yaxis.minor_tick_line_color = None
    fig.ygrid.grid_line_color = None
    segments = flow.segments.assign(color=flow.segments["phase"].map(PHASE_COLORS))
    source = frame_source(segments)
    source.name = SEGMENTS
    bar_height = 0.7 if n < 200 else 0.9
    bars = fig.hbar(y="y", left="left", right="right", height=bar_height, source=source, fill_color="color",
                    line_color=None, selection_line_color="black", nonselection_fill_alpha=0.35)
    fig.add_layout(Legend(items=[LegendItem(label=phase, renderers=[bars],
                                            index=int(segments.index[segments["phase"] == phase][0]))
                                 for phase in PHASE_COLORS if (segments["phase"] == phase).any()],
                          **LEGEND_ABOVE), "above")
    ticks = fig.scatter("x", "y", source=frame_source(flow.ticks), marker="dash", angle=1.5708,
                        size=min(max(int(300 / max(n, 1)), 4), 9), line_color="black", line_alpha=0.4)
    ticks.nonselection_glyph = None
    failed = segments[segments["phase"] == "failed"]
    if len(failed):  # a request refused at once has a bar too thin to see: mark where it ended
        fig.scatter("right", "y", source=frame_source(failed), marker="x", size=9, line_width=2,
                    line_color=PHASE_COLORS["failed"])
    fig.add_tools(TapTool(renderers=[bars]))
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("request", "@id (#@request{0})"), ("status", "@status @error"), ("bar", "@phase: @phase_ms{0,0.000} ms"),
        ("tokens", "@prompt_tokens{0,0} in, @output_tokens{0,0} out"), ("TTFT", "@ttft_ms{0,0.000} ms"),
        ("TPOT", "@tpot_ms{0,0.000} ms"), ("E2E", "@e2e_ms{0,0.000} ms"),
        ("queued / prefill / delivery / decode",
         "@queued_ms{0,0.000} / @prefill_ms{0,0.000} / @delivery_ms{0,0.000} / @decode_ms{0,0.000} ms"),
        ("stalled behind prefill", "@stalled_ms{0,0.000} ms"), ("steps", "@steps{0,0} (@first_step{0}–@last_step{0})"),
    ]))
    fig.legend.items.append(LegendItem(label="token", renderers=[ticks]))
    return fig, source


def step_figure(lane: pd.DataFrame, total: int, x_range: Range1d, *, width: int = 1100):
    """The engine step lane: one bar per step from its start to its end, as tall as its batch, coloured by
    mode; returns the figure and its source."""
    note = f" ({len(lane):,} longest of {total:,} shown)" if total > len(lane) else ""
    title = (f"engine steps: {total:,}{note}, height = requests in the batch; click one for its requests"
             if total else "engine steps: none recorded (no profiling window, or no step annotations)")
    fig = figure(title=title, width=width, height=190, x_range=x_range, tools=TOOLS, name=STEP_LANE,
                 y_axis_label="batch", min_border_left=BORDER_LEFT)
    fig.xaxis.formatter = time_ticks()
    data = lane.assign(color=lane["mode"].map(lambda m: MODE_COLORS.get(m, MODE_COLORS["unknown"])),
                       bottom=0.0)
    source = frame_source(data)
    source.name = STEPS
    if not len(lane):
        return fig, source
    bars = fig.quad(left="left", right="right", bottom="bottom", top="top", source=source, fill_color="color",
                    line_color=None, selection_line_color=None, nonselection_fill_alpha=0.15)
    fig.add_layout(Legend(items=[LegendItem(label=mode, renderers=[bars],
                                            index=int(data.index[data["mode"] == mode][0]))
                                 for mode in dict.fromkeys(data["mode"])],
                          **LEGEND_ABOVE), "above")
    fig.y_range.start = 0
    fig.add_tools(TapTool(renderers=[bars]))
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("step", "@step{0} (@mode)"), ("duration", "@dur_ms{0,0.000} ms"),
        ("prefill", "@prefill_requests{0,0} requests, @prefill_tokens{0,0} tokens"),
        ("decode", "@decode_requests{0,0} requests"), ("batch", "@batch_requests{0,0} requests, "
                                                               "@scheduled_tokens{0,0} tokens"),
        ("kernels", "@kernels{0,0} (@kernel_ms{0,0.000} ms)"),
    ]))
    return fig, source


def link_selection(fall, segments: ColumnDataSource, steps_fig, steps: ColumnDataSource) -> None:
    """Clicking a request selects its steps; clicking a step selects the requests in flight (CustomJS on the tap
    tools: a tap, not a selection change, so neither side's update starts the other's). Either way the run's
    timeline, where the page has one, zooms to the chosen steps: their ops and kernels."""
    args = {"segments": segments, "steps": steps, "timeline_name": TIMELINE_PLOT}
    for fig, code in ((fall, SELECT_STEPS), (steps_fig, SELECT_REQUESTS)):
        for tool in fig.select({"type": TapTool}):
            tool.callback = CustomJS(args=args, code=code + FOCUS_TIMELINE)


def counter_figure(title: str, unit: str, frame: pd.DataFrame, x_range: Range1d, *, width: int = 1100):
    """One counter track: each of its series as a stepped line over the run's clock."""
    if frame["value"].fillna(0).eq(0).all():
        title += " (0 at every sample)"
    fig = figure(title=title, width=width, height=150, x_range=x_range, tools=TOOLS, y_axis_label=unit,
                 min_border_left=BORDER_LEFT)
    fig.xaxis.formatter = time_ticks()
    renderers = []
    for i, (series, part) in enumerate(frame.groupby("series", sort=False)):
        source = frame_source(part.assign(ms=part["ts_ns"] / 1e6))
        renderers.append(fig.step("ts_ns", "value", source=source, mode="after", color=Category10_10[i % 10],
                                  line_width=2, legend_label=str(series)))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("", "@series"), ("at", "@ms{0,0.0} ms"),
                                                           ("value", "@value{0,0.00}")], mode="vline"))
    fig.y_range.start = 0
    if fig.legend:
        fig.legend.location = "top_left"
        fig.legend.label_text_font_size = "8pt"
        fig.legend.orientation = "horizontal"
        fig.legend.background_fill_alpha = 0.7
    return fig


def sweep_points(bundles: Sequence[Bundle]) -> list[dict[str, Any]]:
    """The serving runs among `bundles` as sweep points (`workbench.analysis.serving.point_of`)."""
    return [point for bundle in bundles if (point := point_of(bundle.record)) is not None]


def serving_sweep_view(points: Sequence[dict[str, Any]] | Sequence[Bundle], *, width: int = 1100,
                       slo_ms: dict[str, float] | None = None) -> LayoutDOM:
    """A sweep of load points (serving bundles, or points as `sweep_summary` takes them, each with a `label`):
    throughput–latency curves, goodput against load and the Pareto front, then the curve as a table. `slo_ms`
    (bounds in ms by metric) draws the TTFT and E2E bounds; by default the points' own."""
    if points and isinstance(points[0], Bundle):
        points = sweep_points(points)  # type: ignore[arg-type]
    points = list(points)
    curve, summary = sweep_curve(points)  # type: ignore[arg-type]
    if slo_ms is None:
        slo_ms = next((p["slo_ms"] for p in points if p.get("slo_ms")), None)  # type: ignore[union-attr]
    half = width // 2
    load = summary["load"]
    marks = []
    marks.append(f"knee at {load} {summary['knee']:g}" if summary["knee"] is not None else
                 "no knee (p90 latency never grows more than twice as fast as throughput)")
    marks.append(f"highest {load} meeting the SLO: {summary['max_load_meeting_slo']:g}"
                 if summary["max_load_meeting_slo"] is not None else "no load point met the SLO"
                 if slo_ms else "no SLO given (goodput needs --slo)")
    left_out = f"; {summary['left_out']} point(s) of another load axis left out" if summary["left_out"] else ""
    heading = _heading(f"serving sweep: {len(curve)} load points by {load}; {'; '.join(marks)}{left_out}", width)
    if curve.empty:
        return column(heading)
    curve = curve.assign(color=[Category10_10[i % 10] for i in range(len(curve))])
    return column(heading,
                  row(latency_curve(curve, slo_ms or {}, width=half), goodput_curve(curve, load, width=half)),
                  row(pareto_front(curve, width=half),
                      data_table(curve, CURVE_COLUMNS, width=half, height=30 + 28 * min(len(curve), 12))))


def _point_hover(renderers: list) -> HoverTool:
    return HoverTool(renderers=renderers, tooltips=[
        ("load point", "@label"), ("output tokens/s", "@output_token_throughput{0,0.0}"),
        ("requests/s", "@request_throughput{0,0.00}"), ("TTFT p90", "@ttft_p90_ms{0,0.00} ms"),
        ("E2E p90", "@e2e_p90_ms{0,0.00} ms"), ("tokens/s per user", "@tokens_per_user{0,0.0}"),
        ("goodput", "@goodput{0,0.00} req/s (@goodput_pct{0.0}%)")])


def _marks(fig, curve: pd.DataFrame, x: str, y: str) -> None:
    """The knee (a large ring) and the highest load meeting the SLO (a star) at (x, y)."""
    for flag, marker, color, label in (("knee", "circle", "black", "knee"),
                                       ("max_slo", "star", "#2ca02c", "highest load meeting SLO")):
        at = curve[curve[flag] & curve[y].notna()]
        if len(at):
            fig.scatter(x, y, source=frame_source(at), marker=marker, size=22, fill_alpha=0.0 if marker == "circle"
                        else 0.8, line_color=color, fill_color=color, line_width=2, legend_label=label)


def _labels(fig, source: ColumnDataSource, x: str, y: str) -> None:
    """Each point's load label beside it; the ranges padded so the labels at the edges stay inside."""
    fig.x_range.range_padding, fig.y_range.range_padding = 0.3, 0.2
    fig.add_layout(LabelSet(x=x, y=y, text="label", source=source, x_offset=6, y_offset=4, text_font_size="8pt"))


def latency_curve(curve: pd.DataFrame, slo_ms: dict[str, float], *, width: int = 550):
    """p90 TTFT and p90 E2E against output tokens per second, each point labelled with its load; the SLO's
    TTFT and E2E bounds as dashed rules."""
    fig = figure(title="throughput vs latency: p90 TTFT and E2E", width=width, height=360, tools=TOOLS,
                 x_axis_label="output tokens/s", y_axis_label="ms (log)", y_axis_type="log")
    source = frame_source(curve)
    renderers = []
    for y, color, label in (("ttft_p90_ms", "#dd8452", "TTFT p90"), ("e2e_p90_ms", "#4c72b0", "E2E p90")):
        if curve[y].notna().any():
            fig.line("output_token_throughput", y, source=source, color=color, line_width=2, legend_label=label)
            renderers.append(fig.scatter("output_token_throughput", y, source=source, color=color, size=8,
                                         legend_label=label))
            _labels(fig, source, "output_token_throughput", y)
    for key, color in (("ttft", "#dd8452"), ("e2e", "#4c72b0")):
        if slo_ms.get(key):
            fig.add_layout(Span(location=float(slo_ms[key]), dimension="width", line_dash="dashed",
                                line_color=color, line_alpha=0.7))
    _marks(fig, curve, "output_token_throughput", "ttft_p90_ms" if curve["ttft_p90_ms"].notna().any()
           else "e2e_p90_ms")
    fig.add_tools(_point_hover(renderers))
    _legend(fig)
    return fig


def goodput_curve(curve: pd.DataFrame, load: str, *, width: int = 550):
    """Goodput (requests per second meeting the SLO) and request throughput against the load."""
    unit = "requests/s offered" if load == "rate" else "concurrent requests"
    fig = figure(title=f"goodput vs load ({load})", width=width, height=360, tools=TOOLS,
                 x_axis_label=f"{load} ({unit})", y_axis_label="requests/s")
    source = frame_source(curve)
    renderers = [fig.scatter("load", "request_throughput", source=source, color="gray", size=7,
                             legend_label="throughput")]
    fig.line("load", "request_throughput", source=source, color="gray", line_dash="dashed",
             legend_label="throughput")
    if curve["goodput"].notna().any():
        fig.line("load", "goodput", source=source, color="#2ca02c", line_width=2, legend_label="goodput")
        renderers.append(fig.scatter("load", "goodput", source=source, color="#2ca02c", size=8,
                                     legend_label="goodput"))
        _labels(fig, source, "load", "goodput")
        _marks(fig, curve, "load", "goodput")
    fig.add_tools(_point_hover(renderers))
    _legend(fig)
    return fig


def pareto_front(curve: pd.DataFrame, *, width: int = 550):
    """Output tokens per second per user against output tokens per second in all; the front's points large,
    outlined and joined, the others faint; knee and highest load meeting the SLO marked."""
    fig = figure(title="Pareto: tokens/s per user vs tokens/s (front outlined)", width=width, height=360,
                 tools=TOOLS, x_axis_label="output tokens/s", y_axis_label="output tokens/s per user")
    known = curve[curve["tokens_per_user"].notna() & curve["output_token_throughput"].notna()]
    if known.empty:
        return fig
    front = known[known["on_front"]].sort_values("output_token_throughput")
    behind = fig.scatter("output_token_throughput", "tokens_per_user", source=frame_source(known[~known["on_front"]]),
                         color="color", size=8, alpha=0.35)
    ahead_source = frame_source(front)
    ahead = fig.scatter("output_token_throughput", "tokens_per_user", source=ahead_source, fill_color="color",
                        size=13, line_color="black", line_width=2)
    fig.line("output_token_throughput", "tokens_per_user", source=ahead_source, color="black", line_dash="dashed")
    _labels(fig, frame_source(known), "output_token_throughput", "tokens_per_user")
    _marks(fig, known, "output_token_throughput", "tokens_per_user")
    fig.add_tools(_point_hover([behind, ahead]))
    _legend(fig)
    return fig


def _legend(fig) -> None:
    if fig.legend:
        fig.legend.click_policy = "hide"
        fig.legend.label_text_font_size = "8pt"
        fig.legend.location = "top_left"
        fig.legend.background_fill_alpha = 0.7


def serving_layout(bundles: Sequence[Bundle], *, width: int | None = None) -> LayoutDOM | None:
    """The serving views of `bundles`' serving runs: one run's view; for several, the sweep first, then each
    run's view in a tab. None when none is a serving run."""
    sized = {} if width is None else {"width": width}
    runs = [bundle for bundle in bundles if bundle.record.kind == SERVING]
    if not runs:
        return None
    if len(runs) == 1:
        return serving_view(runs[0], **sized)
    panels = [TabPanel(child=serving_sweep_view(runs, **sized), title="sweep")]
    panels += [TabPanel(child=serving_view(run, **sized), title=display_name(run.record)) for run in runs]
    return Tabs(tabs=panels)


def serving_panels(bundles: Sequence[Bundle], *, width: int | None = None) -> list[TabPanel]:
    """The "serving" tab when some of `bundles` are serving runs (as `views.run_kinds.kind_views` lists the tabs
    a kind adds), else none."""
    layout = serving_layout(bundles, width=width)
    return [] if layout is None else [TabPanel(child=layout, title="serving")]
