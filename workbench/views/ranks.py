"""The ranks of one distributed job: the per-rank table, a ranks x steps heat map of step time, the spread of
each step over the ranks, step time per rank, and every rank's timeline on the job's shared time axis
(zooming one zooms all).

Everything but the timelines is drawn from the job's `RankAggregates`, which need no events in this process
(`workbench.analysis.rank_queries` computes them where the bundles are): `ranks_view` takes them in place of
the traces, and then leaves the timelines out. `bundles_ranks_view` (the report and the panel) draws timelines
only for a job of at most `MAX_TIMELINE_RANKS` ranks on this disk; a larger job, or one on a URL traces root,
is reduced rank by rank where its bundles lie.

`experiments.stacked_timelines` does not fit here: it re-aligns each trace on its own first step, which
would undo the clock alignment that makes simultaneous events of different ranks line up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColorBar, ColumnDataSource, Div, FactorRange, HoverTool, LinearColorMapper, Paragraph, Range1d
from bokeh.palettes import RdBu11
from bokeh.plotting import figure

from workbench.analysis.ranks import RankAggregates, Ranks, by_rank, rank_aggregates, rank_steps
from workbench.analysis.timeline import count_spans
from workbench.trace.store.bundle import Bundle
from workbench.views._table import data_table
from workbench.views.timeline import timeline

MAX_TIMELINE_RANKS = 16
"""`bundles_ranks_view` draws every rank's timeline up to this many ranks (beyond, a page of timelines says
little and costs every trace in memory)."""

TABLE_COLUMNS = [
    ("rank", "rank", "0"), ("devices", "devices", None), ("steps", "steps", "0"),
    ("median_step_ns", "median step ns", "0,0"), ("step_excess", "vs median", "+0.0%"),
    ("straggler", "straggler", None), ("busy_ns", "busy ns", "0,0"), ("idle_ns", "idle ns", "0,0"),
    ("kernel_ns", "kernel ns", "0,0"), ("compute_ns", "compute ns", "0,0"),
    ("collective_ns", "collective ns", "0,0"), ("overlap_ns", "overlap ns", "0,0"),
    ("exposed_collective_ns", "exposed collective ns", "0,0"), ("overlap_frac", "overlap", "0.0%"),
    ("host_collective_ns", "host collective ns", "0,0"),
]


SPREAD_COLUMNS = [("step", "step", "0"), ("ranks", "ranks", "0"), ("min_ns", "min ns", "0,0"),
                  ("median_ns", "median ns", "0,0"), ("max_ns", "max ns", "0,0"), ("spread_ns", "spread ns", "0,0"),
                  ("slowest_rank", "slowest rank", "0")]


def ranks_view(ranks: Ranks | RankAggregates, *, width: int = 1100, max_spans: int = 20_000, threshold: float = 0.10):
    """The layout of a multi-rank job: table, step heat map, step spread, step times (stragglers flagged), and
    all ranks' timelines when given their traces (not for `RankAggregates`)."""
    traces = {} if isinstance(ranks, RankAggregates) else by_rank(ranks)
    aggregates = ranks if isinstance(ranks, RankAggregates) else rank_aggregates(traces, threshold=threshold)
    table = aggregates.table
    flagged = table.loc[table["straggler"], "rank"].tolist() if not table.empty else []
    note = f"stragglers: {', '.join(f'rank {r}' for r in flagged)}" if flagged else "no straggler"
    shown = table.assign(straggler=table["straggler"].map({True: "yes", False: ""})) if not table.empty else table
    parts = [
        Paragraph(text=f"{len(table)} ranks on one time axis; {note} (median step > {threshold:.0%} "
                       "and > 2 MAD over the ranks' median)", width=width),
        data_table(shown, TABLE_COLUMNS, width=width, height=30 + 28 * min(max(len(table), 1), 20)),
        step_heatmap(aggregates.steps, width=width),
        data_table(aggregates.spread, SPREAD_COLUMNS, width=width,
                   height=30 + 28 * min(max(len(aggregates.spread), 1), 12)),
        _step_points(aggregates.steps, width),
    ]
    if traces:
        parts.append(rank_timelines(traces, width=width, max_spans=max_spans))
    return column(*parts)


def bundles_ranks_view(bundles: Sequence[Bundle], *, width: int = 1100, threshold: float = 0.10):
    """`ranks_view` of the ranks' bundles (those with a trace): with every rank's timeline for a job of at most
    `MAX_TIMELINE_RANKS` ranks on this disk; else from the aggregates alone, each rank reduced where its bundle
    lies (`bundles_aggregates`: one trace at a time, none copied down from a URL root)."""
    from workbench.analysis.rank_queries import bundles_aggregates

    traced = [bundle for bundle in bundles if bundle.has_trace and bundle.record.rank is not None]
    why = aggregates_only(traced)
    if why is None:
        return ranks_view({bundle.record.rank: bundle.trace() for bundle in traced}, width=width, threshold=threshold)
    note = Paragraph(text=f"No timelines for {why} (each would be read whole): open a rank's run for its timeline.",
                     width=width)
    return column(ranks_view(bundles_aggregates(traced, threshold=threshold), width=width, threshold=threshold), note)


def aggregates_only(bundles: Sequence[Bundle]) -> str | None:
    """Why the ranks `bundles` are shown by their aggregates alone (more than `MAX_TIMELINE_RANKS` of them, or on
    a URL traces root), or None when their traces may be read here."""
    from workbench.trace.store.mirror_bundle import remote_bundle

    if len(bundles) > MAX_TIMELINE_RANKS:
        return f"more than {MAX_TIMELINE_RANKS} ranks"
    if any(remote_bundle(bundle.path) is not None for bundle in bundles):
        return "ranks on a URL root"
    return None


def step_heatmap(steps: pd.DataFrame, *, width: int = 1100):
    """Ranks x steps: each cell a step of a rank, coloured by its time over that step's median over the ranks
    (red slower, blue faster); a straggler is a red row, a slow step a red column."""
    ranks = sorted(steps["rank"].unique().tolist()) if not steps.empty else []
    labels = [f"rank {r}" for r in ranks] or ["-"]
    step_ids = [str(s) for s in sorted(steps["step"].unique().tolist())] if not steps.empty else ["-"]
    fig = figure(x_range=FactorRange(*step_ids), y_range=FactorRange(*reversed(labels)), width=width,
                 height=min(80 + 14 * len(labels), 900), title="step time per rank and step, vs the step's median",
                 tools="hover,save,reset", x_axis_label="step", toolbar_location="right")
    if steps.empty:
        return fig
    median = steps.groupby("step")["dur_ns"].transform("median").astype(float)
    excess = np.where(median > 0, steps["dur_ns"] / median.where(median > 0, 1.0) - 1.0, 0.0)
    limit = max(float(np.abs(excess).max()), 0.01)
    mapper = LinearColorMapper(palette=list(reversed(RdBu11)), low=-limit, high=limit)
    source = ColumnDataSource({"step": steps["step"].astype(str).tolist(),
                               "rank": [f"rank {r}" for r in steps["rank"]], "ms": (steps["dur_ns"] / 1e6).to_numpy(),
                               "excess": excess})
    fig.rect("step", "rank", 1, 1, source=source, line_color=None, fill_color={"field": "excess", "transform": mapper})
    fig.add_layout(ColorBar(color_mapper=mapper, title="vs median", width=10), "right")
    fig.select_one(HoverTool).tooltips = [("", "@rank, step @step"), ("time", "@ms{0.000} ms"),
                                          ("vs median", "@excess{+0.0%}")]
    fig.xaxis.major_label_orientation = 0 if len(step_ids) <= 40 else 1.2
    return fig


def step_figure(ranks: Ranks, *, width: int = 1100):
    """Each rank's step durations (ms) as points, one column per rank, medians as dashes."""
    return _step_points(rank_steps(ranks), width)


def _step_points(steps: pd.DataFrame, width: int):
    """`step_figure` of `rank_steps`' rows."""
    factors = [f"rank {r}" for r in sorted(steps["rank"].unique())] or ["-"]
    fig = figure(x_range=FactorRange(*factors), width=width, height=260, title="step time per rank (ms)",
                 tools="save,reset", y_axis_label="ms")
    if steps.empty:
        return fig
    points = ColumnDataSource({"x": [f"rank {r}" for r in steps["rank"]], "ms": (steps["dur_ns"] / 1e6).to_numpy(),
                               "step": steps["step"].to_numpy()})
    dots = fig.scatter("x", "ms", source=points, size=7, alpha=0.6)
    medians = steps.groupby("rank")["dur_ns"].median()
    fig.scatter(x=[f"rank {r}" for r in medians.index], y=(medians / 1e6).to_numpy(), marker="dash", size=24,
                color="black")
    fig.add_tools(HoverTool(renderers=[dots], tooltips=[("rank", "@x"), ("step", "@step"), ("time", "@ms{0.000} ms")]))
    return fig


def rank_timelines(ranks: Ranks, *, width: int = 1100, max_spans: int = 20_000):
    """Every rank's timeline, one above the other on the shared axis (ns from the job's first event)."""
    traces = by_rank(ranks)
    if not traces:
        return Div(text="No ranks to draw.", render_as_text=True)
    starts = [int(t.events["start_ns"].to_numpy().min(initial=0)) for t in traces.values()]
    ends = [int((t.events["start_ns"].to_numpy() + t.events["dur_ns"].to_numpy()).max(initial=1))
            for t in traces.values()]
    first, last = min(starts), max(ends)
    margin = max((last - first) * 0.01, 1)
    x_range = Range1d(first - margin, last + margin, bounds=(first - margin, last + margin))
    parts = [Paragraph(text="timelines of all ranks on the job's clock (shared time axis)", width=width)]
    budget = max(max_spans // len(traces), 1)
    for rank, trace in traces.items():
        parts.append(Div(text=f"rank {rank}", render_as_text=True, width=width, styles={"font-weight": "bold"}))
        whole = (first, last + 1)
        parts.append(timeline(trace, x_range=x_range, width=width, max_spans=budget,
                              detail=whole if count_spans(trace, whole) <= budget else None))
    return column(*parts)
