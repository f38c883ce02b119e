"""Generation runs: the per-step decode timeline of a run, and TTFT / TPOT per variant across runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Paragraph, Range1d, Whisker
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.llm.tables import timed_steps, timeline_steps, variant_table
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name
from workbench.views._table import data_table

STEP_COLORS = {"prefill": "#dd8452", "decode": "#4c72b0", "draft": "#8172b2", "verify": "#55a868"}
"""Colour of each kind of generation step."""

TABLE_COLUMNS = [
    ("variant", "variant", None), ("status", "status", None), ("ttft_ms", "TTFT ms", "0.000"),
    ("tpot_ms", "TPOT p50 ms", "0.000"), ("tpot_p99_ms", "TPOT p99 ms", "0.000"), ("itl_p99_ms", "ITL p99 ms", "0.000"),
    ("tokens_per_s", "tokens/s", "0,0.0"), ("kv_cache_bytes", "KV bytes", "0,0"),
    ("kv_cache_bytes_predicted", "KV bytes predicted", "0,0"), ("peak_memory_bytes", "peak bytes", "0,0"),
    ("acceptance_rate", "acceptance", "0.000"), ("speedup_vs_greedy", "speedup vs greedy", "0.00"),
    ("sqnr_db", "SQNR dB vs fp32 cache", "0.0"), ("token_match", "token match", "0.000"),
]


def generation_view(bundles: Sequence[Bundle], *, width: int = 1100):
    """TTFT and TPOT per variant, the figures table, then each run's decode timeline and step latencies."""
    table = variant_table(bundles)
    parts = [Paragraph(text=f"{len(table)} generation run(s)", width=width),
             ttft_tpot_figures(table, width=width),
             data_table(table, TABLE_COLUMNS, width=width, height=30 + 28 * max(len(table), 1))]
    for bundle in bundles:
        if bundle.record.llm is not None:
            parts.append(Paragraph(text=display_name(bundle.record), width=width, styles={"font-weight": "bold"}))
            parts.append(row(decode_timeline_figure(bundle, width=width // 2),
                             step_latency_figure(bundle, width=width // 2)))
    return column(*parts)


def ttft_tpot_figures(table: pd.DataFrame, *, width: int = 1100):
    """Two bar charts side by side: TTFT per variant, and TPOT per variant (median bar, p99 whisker)."""
    variants = table["variant"].astype(str).tolist() if not table.empty else ["-"]
    colors = [Category10_10[i % 10] for i in range(len(variants))]
    data = ColumnDataSource({
        "variant": variants, "color": colors,
        "ttft_ms": _floats(table, "ttft_ms"), "tpot_ms": _floats(table, "tpot_ms"),
        "tpot_p99_ms": _floats(table, "tpot_p99_ms"), "tokens_per_s": _floats(table, "tokens_per_s"),
    })
    figures = []
    for field, title in (("ttft_ms", "time to first token (ms)"), ("tpot_ms", "time per output token (ms, p50, p99)")):
        fig = figure(x_range=FactorRange(*variants), width=width // 2, height=320, title=title,
                     tools="pan,wheel_zoom,box_zoom,reset,save", y_axis_label="ms")
        fig.xaxis.major_label_orientation = 0.6
        bars = fig.vbar("variant", 0.6, top=field, source=data, fill_color="color", line_color="black")
        tips = [("variant", "@variant"), ("TTFT", "@ttft_ms{0.000} ms"), ("TPOT p50", "@tpot_ms{0.000} ms"),
                ("TPOT p99", "@tpot_p99_ms{0.000} ms"), ("tokens/s", "@tokens_per_s{0,0.0}")]
        if field == "tpot_ms":
            fig.add_layout(Whisker(source=data, base="variant", lower="tpot_ms", upper="tpot_p99_ms"))
        tops = [v for v in (*data.data[field], *(data.data["tpot_p99_ms"] if field == "tpot_ms" else ()))
                if np.isfinite(v)]
        if tops:  # annotations (the whiskers) do not widen the automatic range
            fig.y_range = Range1d(0, max(tops) * 1.08 or 1.0)
        fig.add_tools(HoverTool(renderers=[bars], tooltips=tips))
        figures.append(fig)
    return row(*figures)


def decode_timeline_figure(bundle: Bundle, *, width: int = 550):
    """The captured generation's steps on a time axis (ms from the prefill's start), one lane per kind of
    step; from the profiled trace, else from the run's first timed generation."""
    steps, source = timeline_steps(bundle)
    lanes = [kind for kind in STEP_COLORS if kind in set(steps["kind"])] or ["decode"]
    fig = figure(y_range=FactorRange(*reversed(lanes)), width=width, height=90 + 40 * len(lanes),
                 title=f"decode timeline ({source})", x_axis_label="ms from the prefill's start",
                 tools="xpan,xwheel_zoom,box_zoom,reset,save")
    if steps.empty:
        return fig
    start_ms = steps["start_ns"].to_numpy() / 1e6
    dur_ms = steps["dur_ns"].to_numpy() / 1e6
    data = ColumnDataSource({
        "kind": steps["kind"].astype(str).to_numpy(), "label": steps["label"].astype(str).to_numpy(),
        "left": start_ms, "right": start_ms + dur_ms, "dur_ms": dur_ms,
        "color": [STEP_COLORS.get(k, "#b0b0b0") for k in steps["kind"]],
    })
    bars = fig.hbar(y="kind", left="left", right="right", height=0.7, source=data, fill_color="color",
                    line_color="white")
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("step", "@label"), ("start", "@left{0.000} ms"),
                                                        ("duration", "@dur_ms{0.000} ms")]))
    return fig


def step_latency_figure(bundle: Bundle, *, width: int = 550):
    """Each decode step's time per output token against its index, every timed generation as faint points
    and their median as a line; the prefill (TTFT) is left out, its scale differs."""
    timed = timed_steps(bundle.record)
    decode = timed[timed["kind"] == "decode"] if not timed.empty else timed
    fig = figure(width=width, height=260, title="time per output token by decode step (ms)",
                 x_axis_label="decode step", y_axis_label="ms / token", tools="pan,wheel_zoom,box_zoom,reset,save")
    if decode.empty:
        return fig
    per_token = decode["dur_ms"].to_numpy() / decode["tokens"].to_numpy()
    fig.scatter(decode["step"].to_numpy(), per_token, size=4, alpha=0.35, color="gray")
    median = pd.DataFrame({"step": decode["step"].to_numpy(), "ms": per_token}).groupby("step")["ms"].median()
    line = fig.line(median.index.to_numpy(), median.to_numpy(), color=STEP_COLORS["decode"], line_width=2)
    fig.add_tools(HoverTool(renderers=[line], tooltips=[("step", "@x"), ("median", "@y{0.000} ms")]))
    return fig


def _floats(table: pd.DataFrame, column: str) -> np.ndarray:
    """A column as floats (NaN where missing), or an empty-table placeholder."""
    if table.empty:
        return np.array([np.nan])
    return pd.to_numeric(table[column], errors="coerce").astype(float).to_numpy()
