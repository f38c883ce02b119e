"""The ranks of one distributed job: the per-rank table, step time per rank, and every rank's timeline
on the job's shared time axis (zooming one zooms all).

`experiments.stacked_timelines` does not fit here: it re-aligns each trace on its own first step, which
would undo the clock alignment that makes simultaneous events of different ranks line up.
"""

from __future__ import annotations

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, Div, FactorRange, HoverTool, Paragraph, Range1d
from bokeh.plotting import figure

from workbench.analysis.ranks import Ranks, by_rank, rank_steps, rank_table
from workbench.analysis.timeline import count_spans
from workbench.views._table import data_table
from workbench.views.timeline import timeline

TABLE_COLUMNS = [
    ("rank", "rank", "0"), ("devices", "devices", None), ("steps", "steps", "0"),
    ("median_step_ns", "median step ns", "0,0"), ("step_excess", "vs median", "+0.0%"),
    ("straggler", "straggler", None), ("busy_ns", "busy ns", "0,0"), ("idle_ns", "idle ns", "0,0"),
    ("kernel_ns", "kernel ns", "0,0"), ("compute_ns", "compute ns", "0,0"),
    ("collective_ns", "collective ns", "0,0"), ("overlap_ns", "overlap ns", "0,0"),
    ("exposed_collective_ns", "exposed collective ns", "0,0"), ("overlap_frac", "overlap", "0.0%"),
    ("host_collective_ns", "host collective ns", "0,0"),
]


def ranks_view(ranks: Ranks, *, width: int = 1100, max_spans: int = 20_000, threshold: float = 0.10):
    """The layout of a multi-rank job: table, step times (stragglers in red), all ranks' timelines."""
    traces = by_rank(ranks)
    table = rank_table(traces, threshold=threshold)
    flagged = table.loc[table["straggler"], "rank"].tolist() if not table.empty else []
    note = f"stragglers: {', '.join(f'rank {r}' for r in flagged)}" if flagged else "no straggler"
    shown = table.assign(straggler=table["straggler"].map({True: "yes", False: ""})) if not table.empty else table
    return column(
        Paragraph(text=f"{len(traces)} ranks on one time axis; {note} (median step > {threshold:.0%} "
                       "and > 2 MAD over the ranks' median)", width=width),
        data_table(shown, TABLE_COLUMNS, width=width, height=30 + 28 * max(len(table), 1)),
        step_figure(traces, width=width),
        rank_timelines(traces, width=width, max_spans=max_spans),
    )


def step_figure(ranks: Ranks, *, width: int = 1100):
    """Each rank's step durations (ms) as points, one column per rank, medians as dashes."""
    steps = rank_steps(ranks)
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
