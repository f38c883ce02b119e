"""Experiments side by side: latency distributions, speedups, numerics and ops aligned across variants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    Div,
    FactorRange,
    HoverTool,
    Paragraph,
    Range1d,
)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.analysis.breakdown import phase_window
from workbench.analysis.experiment_tables import latency_samples, op_comparison, variant_table
from workbench.analysis.fusion import fusion_inputs, fusion_table
from workbench.analysis.steps import aligned_on_first_step
from workbench.analysis.summary import RANDOM_WEIGHTS_NOTE
from workbench.analysis.sweep import is_sweep
from workbench.analysis.timeline import count_spans
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle
from workbench.views._table import data_table, frame_source
from workbench.views.sweep import sweep_view
from workbench.views.timeline import timeline

SUMMARY_COLUMNS = [
    ("variant", "variant", None), ("status", "status", None), ("p50_ms", "p50 ms", "0.000"),
    ("p99_ms", "p99 ms", "0.000"), ("noise", "noisy", None), ("items_per_s", "items/s", "0,0.0"),
    ("speedup", "speedup", "0.00"),
    ("first_call_s", "compile / first call s", "0.00"), ("peak_bytes", "peak bytes", "0,0"),
    ("sqnr_db", "SQNR dB", "0.0"), ("cosine", "cosine", "0.000000"), ("max_abs_error", "max abs err", "0.000000"),
    ("top1", "top-1", "0.000"),
]


def experiments_view(bundles: Sequence[Bundle], reference: str = "eager", *, width: int = 1100, top_ops: int = 40):
    """The comparison layout of several runs (usually the runs of one experiment); a sweep's curves first
    (`workbench.views.sweep`) when some variant ran at several shapes."""
    table = variant_table(bundles, reference)
    variants = table["variant"].tolist() if not table.empty else []
    colors = {v: Category10_10[i % 10] for i, v in enumerate(variants)}
    traces = {display: b.trace() for display, b in zip(variants, bundles, strict=True) if b.has_trace}
    note = f"; {RANDOM_WEIGHTS_NOTE}" if any(b.record.model_weights == "random" for b in bundles) else ""
    parts = [
        Paragraph(text=f"{len(bundles)} runs compared against {reference}{note}", width=width),
        row(latency_figure(bundles, colors, width=width // 2), speedup_figure(table, colors, width=width // 2)),
        data_table(table, SUMMARY_COLUMNS, width=width, height=30 + 28 * max(len(table), 1)),
    ]
    if is_sweep(bundles):
        parts.insert(1, sweep_view(bundles, reference, width=width))
    if traces:
        fusion = fusion_table([fusion_inputs(b) for b in bundles if b.has_trace])
        parts.append(Paragraph(text="fusion, per profiled step: kernels (XLA ops, device kernels, TensorRT engine "
                                    "layers, or dispatched ops and generated kernels on CPU), fusions, ops fused "
                                    "and left unfused, kernel and step time, XLA's bytes accessed and FLOPs",
                               width=width))
        parts.append(data_table(fusion, [(c, c.replace("_", " "), None if c in ("variant", "framework") else "0,0.0")
                                         for c in fusion.columns], width=width, height=30 + 28 * len(fusion)))
        ops = op_comparison(traces).head(top_ops)
        parts.append(Paragraph(text=f"ops and kernels aligned across variants, per step (top {top_ops} by time)",
                               width=width))
        parts.append(data_table(ops, [(c, c, None if c in ("name", "kind") else "0.000") for c in ops.columns],
                                width=width, height=420))
        parts.append(stacked_timelines(traces, width=width))
    return column(*parts)


def stacked_timelines(traces: dict[str, Trace], *, width: int = 1100, max_spans: int = 20_000):
    """The variants' timelines one above the other, each shifted so that its first profiled step starts at
    0, on one shared time axis (zooming one zooms all); they open on the steady state."""
    aligned = {variant: aligned_on_first_step(trace) for variant, trace in traces.items()}
    windows = {variant: phase_window(trace, PHASE_MEASURE) for variant, trace in aligned.items()}
    ends = [w[1] for w in windows.values() if w] or [int(t.events["start_ns"].to_numpy().max(initial=1))
                                                       for t in aligned.values()]
    starts = [int(t.events["start_ns"].to_numpy().min(initial=0)) for t in aligned.values()]
    lasts = [int((t.events["start_ns"].to_numpy() + t.events["dur_ns"].to_numpy()).max(initial=1))
             for t in aligned.values()]
    end = max(ends)
    margin = max(end * 0.02, 1)
    x_range = Range1d(-margin, end + margin, bounds=(min(starts) - margin, max(lasts) + margin))
    parts = [Paragraph(text="timelines aligned on each variant's first profiled step (shared time axis)",
                       width=width)]
    for variant, trace in aligned.items():
        parts.append(Div(text=variant, render_as_text=True, width=width, styles={"font-weight": "bold"}))
        detail = (-int(2 * margin), int(end + 2 * margin))  # a bit wider than the view, so it opens on spans
        fits = count_spans(trace, detail) <= max_spans
        parts.append(timeline(trace, x_range=x_range, width=width, max_spans=max_spans,
                              detail=detail if fits else None))
    return column(*parts)


def latency_figure(bundles: Sequence[Bundle], colors: dict[str, str], *, width: int = 550):
    """Box plot of each variant's timed samples (quartiles, 5th–95th percentile whiskers, every sample)."""
    samples = latency_samples(bundles)
    variants = list(dict.fromkeys(samples["variant"])) or ["-"]
    fig = figure(x_range=FactorRange(*variants), width=width, height=320, title="latency per call (ms)",
                 tools="pan,wheel_zoom,box_zoom,reset,save", y_axis_label="ms")
    if samples.empty:
        return fig
    stats = samples.groupby("variant", sort=False)["sample_ms"].quantile([0.05, 0.25, 0.5, 0.75, 0.95]).unstack()
    stats.columns = ["p5", "q1", "median", "q3", "p95"]
    stats = stats.reset_index()
    stats["color"] = stats["variant"].map(colors)
    boxes = frame_source(stats)
    fig.segment("variant", "p5", "variant", "p95", source=boxes, line_color="black")
    bars = fig.vbar("variant", 0.6, top="q3", bottom="q1", source=boxes, fill_color="color", fill_alpha=0.5,
                    line_color="black")
    fig.scatter("variant", "median", source=boxes, size=12, marker="dash", color="black")
    rng = np.random.default_rng(0)
    jitter = pd.DataFrame({"x": [(v, float(j)) for v, j in zip(samples["variant"],
                                                                rng.uniform(-0.25, 0.25, len(samples)), strict=True)],
                           "sample_ms": samples["sample_ms"]})
    fig.scatter(x="x", y="sample_ms", source=ColumnDataSource({"x": jitter["x"].tolist(),
                                                               "sample_ms": jitter["sample_ms"].to_numpy()}),
                size=3, alpha=0.4, color="gray")
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("variant", "@variant"), ("median", "@median{0.000} ms"),
                                                        ("IQR", "@q1{0.000} – @q3{0.000} ms"),
                                                        ("p5–p95", "@p5{0.000} – @p95{0.000} ms")]))
    return fig


def speedup_figure(table: pd.DataFrame, colors: dict[str, str], *, width: int = 550):
    """Median speedup of each variant over the reference (1.0 = the reference)."""
    variants = table["variant"].tolist() if not table.empty else ["-"]
    fig = figure(x_range=FactorRange(*variants), width=width, height=320, title="speedup vs reference (median)",
                 tools="save,reset")
    if table.empty:
        return fig
    data = table[["variant", "speedup", "p50_ms"]].copy()
    data["speedup"] = data["speedup"].fillna(0.0)
    data["color"] = data["variant"].map(colors)
    bars = fig.vbar("variant", 0.6, top="speedup", source=frame_source(data), fill_color="color")
    fig.line(x=[variants[0], variants[-1]], y=[1, 1], line_dash="dashed", color="black")
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("variant", "@variant"), ("speedup", "@speedup{0.00}x"),
                                                        ("p50", "@p50_ms{0.000} ms")]))
    return fig
