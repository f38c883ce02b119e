"""Experiments side by side: latency distributions, speedups, numerics, the trace comparison against a baseline
(step time, devices, op and kernel deltas) and ops aligned across variants."""

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
from workbench.analysis.diff import COMPARE_KINDS, TraceComparison, baseline_index, run_names, trace_comparison
from workbench.analysis.experiment_tables import latency_samples, op_comparison, variant_table
from workbench.analysis.fusion import fusion_inputs, fusion_table
from workbench.analysis.steps import aligned_on_first_step
from workbench.analysis.summary import RANDOM_WEIGHTS_NOTE
from workbench.analysis.sweep import is_sweep
from workbench.analysis.timeline import count_spans
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name, series_name
from workbench.views._table import data_table, duration_unit, frame_source
from workbench.views.provenance import by_source_op_parts, fused_kernels_parts
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


FUSION_COUNTS = ("kernels", "fusions", "fused_ops", "unfused_ops", "elementwise_ops", "hlo_kernels")
"""Columns of the fusion table that count things (per profiled step: whole numbers print without decimals)."""


def experiments_view(bundles: Sequence[Bundle], reference: str = "eager", *, baseline: str | int | None = None,
                     width: int = 1100, top_ops: int = 40):
    """The comparison layout of several runs (usually the runs of one experiment); a sweep's curves first
    (`workbench.views.sweep`) when some variant ran at several shapes.

    Runs are compared against the `reference` variant when one of them ran it, else against the `baseline` run
    (its run id, name or position; the first by default). Every run is named by `analysis.diff.run_names`.
    Latency and speedup plots are drawn only where there are timed samples and speedups (an import has
    neither); runs with traces get the trace comparison: step time, devices, op and kernel deltas.
    """
    names = run_names([b.record for b in bundles])
    base = _baseline_position(bundles, names, reference, baseline)
    against = reference if base is None else series_name(bundles[base].record)
    against_name = reference if base is None else names[base]
    table = variant_table(bundles, against)
    if not table.empty:
        table["variant"] = names
    colors = {v: Category10_10[i % 10] for i, v in enumerate(names)}
    traces = {name: b.trace() for name, b in zip(names, bundles, strict=True) if b.has_trace}
    note = f"; {RANDOM_WEIGHTS_NOTE}" if any(b.record.model_weights == "random" for b in bundles) else ""
    trained = next((b.record.model_training for b in bundles if b.record.model_training), None)
    note += f"; model {trained}" if trained else ""
    parts: list = [Div(text=f"{len(bundles)} runs ({', '.join(names)}) compared against {against_name}{note}",
                       render_as_text=True, width=width)]
    plots = []
    samples = latency_samples(bundles)
    if not samples.empty:
        samples["variant"] = samples["variant"].map(dict(zip([display_name(b.record) for b in bundles], names,
                                                             strict=True)))
        plots.append(latency_figure(bundles, colors, width=width // 2, samples=samples))
    if not table.empty and np.isfinite(table["speedup"].astype(float)).any():
        plots.append(speedup_figure(table, colors, width=width // 2))
    if plots:
        parts.append(row(*plots))
    if not table.empty and (table["p50_ms"].notna().any() or table["sqnr_db"].notna().any()):
        parts.append(data_table(table, SUMMARY_COLUMNS, width=width, height=30 + 28 * max(len(table), 1)))
    if is_sweep(bundles):
        parts.insert(1, sweep_view(bundles, against, width=width))  # the chosen baseline's variant, shape by shape
    if traces:
        with_traces = [b for b in bundles if b.has_trace]
        fusion = fusion_table([fusion_inputs(b) for b in with_traces])
        fusion["variant"] = [name for name, b in zip(names, bundles, strict=True) if b.has_trace]
        parts.append(Paragraph(text="fusion, per profiled step: kernels (XLA ops, device kernels, TensorRT engine "
                                    "layers, or dispatched ops and generated kernels on CPU), fusions, ops fused "
                                    "and left unfused, kernel and step time, XLA's bytes accessed and FLOPs",
                               width=width))
        parts.append(data_table(fusion, _fusion_columns(fusion), width=width, height=30 + 28 * len(fusion)))
        parts.extend(fused_kernels_parts(with_traces, list(fusion["variant"]), width=width))
        if len(traces) >= 2:
            trace_base = names[base] if base is not None else None
            parts.extend(trace_comparison_parts(trace_comparison(with_traces, trace_base), top=top_ops, width=width))
            anchor = bundles[base] if base is not None else next(
                (b for b in with_traces if series_name(b.record) == against), with_traces[0])
            compiled = [b for b in with_traces if b is not anchor and b.record.variant_backend ==
                        anchor.record.variant_backend and b.record.notes.get("compile")]
            if anchor.has_trace:
                parts.extend(by_source_op_parts(anchor, compiled, width=width, top=top_ops))
        ops = op_comparison(traces).head(top_ops)
        parts.append(Paragraph(text=f"ops and kernels aligned across runs, per step (top {top_ops} by time)",
                               width=width))
        parts.append(data_table(ops, [(c, c, None if c in ("name", "kind") else
                                       "0,0.[00]" if c.endswith(" calls") else "0,0.000") for c in ops.columns],
                                width=width, height=420, hover=("name",)))
        parts.append(stacked_timelines(traces, width=width))
    return column(*parts)


def _fusion_columns(fusion: pd.DataFrame) -> list[tuple[str, str, str | None]]:
    """The fusion table's columns (field, title, format); its times (`*_ns`) scaled in place to one unit each. A
    figure no run has (XLA's bytes and FLOPs of a Kineto import) gets no empty column."""
    columns = []
    for name in fusion.columns:
        if fusion[name].isna().all():
            continue
        title = name.replace("_", " ")
        if name in ("variant", "framework"):
            columns.append((name, title, None))
        elif name.endswith("_ns"):
            size, unit, numeral = duration_unit(fusion[name])
            fusion[name] = fusion[name] / size
            columns.append((name, f"{title.removesuffix(' ns')} ({unit})", numeral))
        else:
            columns.append((name, title, "0,0" if name == "steps" else
                            "0,0.[0]" if name in FUSION_COUNTS else "0,0.0"))
    return columns


def _baseline_position(bundles: Sequence[Bundle], names: Sequence[str], reference: str,
                       baseline: str | int | None) -> int | None:
    """Position of the run the others are compared against: None when `reference` is one of the runs' variants
    and no `baseline` is given (each run against the reference at its shape), else the `baseline` run's
    (`analysis.diff.baseline_index`)."""
    if not bundles or (baseline is None and any(series_name(b.record) == reference for b in bundles)):
        return None
    return baseline_index(bundles, names, baseline)


STEP_COLUMNS = [("run", "run", None), ("source", "steps from", None), ("steps", "steps", "0,0"),
                ("median_ms", "median ms", "0,0.000"), ("p10_ms", "p10 ms", "0,0.000"), ("p90_ms", "p90 ms", "0,0.000"),
                ("spread", "spread", "0%"), ("delta_ms", "Δ median ms", "+0,0.000"), ("ratio", "ratio", "0.00")]
DEVICE_COLUMNS = [("run", "run", None), ("device", "device", None), ("busy_ms", "busy ms", "0,0.000"),
                  ("idle_ms", "idle ms", "0,0.000"), ("busy_share", "busy", "0%"),
                  ("compute_ms", "compute ms", "0,0.000"), ("copy_ms", "copy ms", "0,0.000"),
                  ("overlap_ms", "copy under compute ms", "0,0.000"),
                  ("copy_hidden_share", "copy hidden", "0%")]
DELTA_COLUMNS = [("status", "status", None), ("name", "name", None), ("count_a", "calls base", "0,0"),
                 ("count_b", "calls", "0,0"), ("delta_count", "Δ calls", "+0,0"), ("time_a_ms", "base ms", "0,0.000"),
                 ("time_b_ms", "ms", "0,0.000"), ("delta_ms", "Δ ms", "+0,0.000"),
                 ("mean_a_us", "mean base µs", "0,0.0"), ("mean_b_us", "mean µs", "0,0.0")]


def trace_comparison_parts(comparison: TraceComparison, *, top: int = 40, width: int = 1100) -> list:
    """The trace comparison as headings and tables: step time per run, each device's busy, idle and copy/compute
    overlap, then per run against the baseline its op and kernel deltas (largest regressions first)."""
    base = comparison.baseline
    pairs = {p.run_id: p for p in comparison.pairs}
    steps = pd.DataFrame([{
        "run": r.name, "source": r.steps["source"], "steps": r.steps["steps"],
        **{f"{k}_ms": (r.steps.get(f"{k}_ns") or np.nan) / 1e6 for k in ("median", "p10", "p90")},
        "spread": r.steps.get("spread"),
        "delta_ms": np.nan if r.run_id not in pairs or pairs[r.run_id].step_delta_ns is None
        else pairs[r.run_id].step_delta_ns / 1e6,
        "ratio": np.nan if r.run_id not in pairs else pairs[r.run_id].step_ratio} for r in comparison.runs])
    parts: list = [Div(text=f"trace comparison against {base.name}: step time ("
                            + "; ".join(f"{r.name}: {r.scope}" for r in comparison.runs) + ")",
                       render_as_text=True, width=width, styles={"font-weight": "bold"}),
                   data_table(steps, STEP_COLUMNS, width=width, height=30 + 28 * len(steps))]
    devices = pd.DataFrame([{"run": r.name, "device": device, **{f"{k}_ms": d[f"{k}_ns"] / 1e6 for k in (
        "busy", "idle", "compute", "copy", "overlap")}, "busy_share": d["busy_share"],
        "copy_hidden_share": d["copy_hidden_share"]} for r in comparison.runs for device, d in r.devices.items()])
    if not devices.empty:
        parts.append(Div(text="devices: busy and idle time, copies and how much of them ran under compute",
                         render_as_text=True, width=width))
        parts.append(data_table(devices, DEVICE_COLUMNS, width=width, height=30 + 28 * len(devices)))
    for pair in comparison.pairs:
        for kind in COMPARE_KINDS:
            names = pair.names(kind)
            if not any(names.values()):
                continue
            deltas = pair.deltas(kind, top)
            frame = pd.DataFrame({
                "status": deltas["status"].astype(str).to_numpy(dtype=object),
                "name": deltas["name"].astype(str).to_numpy(dtype=object),
                **{c: deltas[c].to_numpy(dtype=np.float64) for c in ("count_a", "count_b", "delta_count")},
                **{f"{c}_ms": deltas[f"{c}_ns"].to_numpy(dtype=np.float64) / 1e6
                   for c in ("time_a", "time_b", "delta")},
                **{f"{c}_us": deltas[f"{c}_ns"].to_numpy(dtype=np.float64) / 1e3 for c in ("mean_a", "mean_b")}})
            parts.append(Div(text=f"{kind}s, {pair.name} against {base.name}: {names['new']} new, "
                                  f"{names['vanished']} vanished, {names['changed']} changed, {names['unchanged']} "
                                  f"unchanged (top {top} regressions, then improvements)",
                             render_as_text=True, width=width))
            parts.append(data_table(frame, DELTA_COLUMNS, width=width, height=min(420, 30 + 28 * max(len(frame), 1)),
                                    hover=("name",)))
    return parts


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


def latency_figure(bundles: Sequence[Bundle], colors: dict[str, str], *, width: int = 550,
                   samples: pd.DataFrame | None = None):
    """Box plot of each variant's timed samples (quartiles, 5th–95th percentile whiskers, every sample);
    `samples` as `latency_samples` gives them, when the caller has them (renamed)."""
    samples = latency_samples(bundles) if samples is None else samples
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
