"""The curves of a sweep (`workbench.analysis.sweep`): latency and throughput against batch per variant, peak
memory against batch, where one variant starts to beat the reference, and the Pareto front of latency against
throughput. `experiments_view` places this view first when its runs form a sweep, so the HTML report, the panel's
compare dashboard and the notebook show the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import FixedTicker, HoverTool, NumeralTickFormatter, Paragraph, Span
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from workbench.analysis.sweep import crossovers, pareto, sweep_table
from workbench.trace.store.bundle import Bundle
from workbench.views._table import data_table, frame_source

SWEEP_TABLE_COLUMNS = [
    ("label", "run", None), ("series", "variant", None), ("status", "status", None), ("batch", "batch", "0"),
    ("seq", "seq", "0"), ("new", "new", "0"), ("p50_ms", "p50 ms", "0.000"), ("p99_ms", "p99 ms", "0.000"),
    ("items_per_s", "items/s", "0,0.0"), ("tokens_per_s", "tokens/s", "0,0.0"), ("peak_bytes", "peak bytes", "0,0"),
    ("speedup", "speedup", "0.00"),
]
CROSSOVER_TABLE_COLUMNS = [
    ("winner", "winner", None), ("loser", "over", None), ("seq", "seq", "0"), ("new", "new", "0"),
    ("batch_below", "loses at batch", "0"), ("batch_above", "wins at batch", "0"),
    ("crossover_batch", "crossover batch", "0.00"), ("speedup_below", "speedup below", "0.00"),
    ("speedup_above", "speedup above", "0.00"),
]
DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")
"""Line styles of the slices (sequence lengths) of a sweep, in order."""
TOOLS = "pan,wheel_zoom,box_zoom,reset,save"


def sweep_view(bundles: Sequence[Bundle], reference: str = "eager", *, width: int = 1100):
    """The sweep layout of `bundles`: four figures (latency and throughput against batch with crossover markers,
    peak memory against batch, the Pareto chart), then the crossovers and every run's figures as tables."""
    table = _plain(sweep_table(bundles, reference))
    crossings = _plain(crossovers(table, reference))
    front = _plain(pareto(table))
    colors = {series: Category10_10[i % 10] for i, series in enumerate(dict.fromkeys(table["series"]))}
    half = width // 2
    shapes = table[["batch", "seq", "new"]].drop_duplicates()
    parts = [
        Paragraph(text=f"sweep: {len(colors)} variants at {len(shapes)} shapes, timed interleaved; speedups and "
                       f"crossovers against {reference} at the same shape", width=width),
        row(latency_curves(table, crossings, colors, width=half), throughput_curves(table, colors, width=half)),
        row(memory_curves(table, colors, width=half), pareto_chart(front, colors, width=half)),
    ]
    if len(crossings):
        parts.append(Paragraph(text=f"crossovers: the batch where a variant starts to beat the other ({reference} "
                                    "is one of each pair), interpolated in log2(batch)", width=width))
        parts.append(data_table(crossings, CROSSOVER_TABLE_COLUMNS, width=width, height=30 + 28 * len(crossings)))
    parts.append(data_table(table, SWEEP_TABLE_COLUMNS, width=width, height=30 + 28 * min(max(len(table), 1), 20)))
    return column(*parts)


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with nullable integer columns as floats (NaN for missing), which Bokeh can send."""
    return frame.astype({name: float for name, dtype in frame.dtypes.items() if isinstance(dtype, pd.Int64Dtype)})


def _curves(fig, table: pd.DataFrame, y: str, colors: dict[str, str], *, legend: bool = True, **style) -> list:
    """One line with markers per (series, slice) of `table`'s `y` against batch; returns the renderers."""
    ok = table[(table["status"] == "ok") & table[y].notna()]
    slices = list(dict.fromkeys(zip(ok["seq"].fillna(-1), ok["new"].fillna(-1), strict=True)))
    renderers = []
    for (series, seq, new), part in ok.groupby([ok["series"], ok["seq"].fillna(-1), ok["new"].fillna(-1)],
                                                sort=False):
        dash = DASHES[slices.index((seq, new)) % len(DASHES)]
        name = " ".join([series, *([f"s{int(seq)}"] if seq >= 0 and len(slices) > 1 else []),
                         *([f"n{int(new)}"] if new >= 0 and len(slices) > 1 else [])])
        source = frame_source(part.sort_values("batch"))
        named = {"legend_label": name} if legend else {}
        fig.line("batch", y, source=source, color=colors[series], line_dash=dash, **named, **style)
        renderers.append(fig.scatter("batch", y, source=source, color=colors[series], size=7, **style))
    return renderers


def _batch_axis(fig, table: pd.DataFrame) -> None:
    """Ticks at the batch sizes that ran, on the log2 x axis."""
    batches = sorted({int(b) for b in table["batch"].dropna()}) or [1]
    fig.xaxis.ticker = FixedTicker(ticks=batches)
    fig.xaxis.formatter = NumeralTickFormatter(format="0")
    fig.xaxis.axis_label = "batch (log2)"


def _batch_figure(title: str, y_label: str, table: pd.DataFrame, *, width: int, y_log: bool = False):
    """A figure with batch on a log2 x axis."""
    fig = figure(title=title, width=width, height=340, x_axis_type="log", y_axis_type="log" if y_log else "linear",
                 tools=TOOLS, y_axis_label=y_label)
    _batch_axis(fig, table)
    return fig


def _hover(renderers: list, *extra: tuple[str, str]) -> HoverTool:
    """A hover naming the run and batch of a curve's point, then `extra` tooltips."""
    return HoverTool(renderers=renderers, tooltips=[("run", "@label"), ("batch", "@batch"), *extra])


def _legend(fig) -> None:
    """A small legend whose entries hide their curves when clicked."""
    if fig.legend:
        fig.legend.click_policy = "hide"
        fig.legend.label_text_font_size = "8pt"
        fig.legend.location = "top_left"


def latency_curves(table: pd.DataFrame, crossings: pd.DataFrame, colors: dict[str, str], *, width: int = 550):
    """Median (solid markers) and p99 (faint) latency against batch per variant, both axes logarithmic; each
    crossover is a vertical rule at its batch and a diamond where the curves meet."""
    fig = _batch_figure("latency per call (ms): p50, p99 faint", "ms", table, width=width, y_log=True)
    medians = _curves(fig, table, "p50_ms", colors)
    _curves(fig, table, "p99_ms", colors, legend=False, alpha=0.3)
    fig.add_tools(_hover(medians, ("p50", "@p50_ms{0.000} ms"), ("p99", "@p99_ms{0.000} ms"),
                         ("speedup", "@speedup{0.00}x")))
    if len(crossings):
        for batch in crossings["crossover_batch"]:
            fig.add_layout(Span(location=float(batch), dimension="height", line_dash="dashed", line_color="gray"))
        marks = fig.scatter("crossover_batch", "value", source=frame_source(crossings), marker="diamond", size=14,
                            fill_color="white", line_color="black", line_width=2)
        fig.add_tools(HoverTool(renderers=[marks], tooltips=[("", "@winner beats @loser from batch @batch_above"),
                                                             ("crossover batch", "@crossover_batch{0.00}")]))
    _legend(fig)
    return fig


def throughput_curves(table: pd.DataFrame, colors: dict[str, str], *, width: int = 550):
    """Items per second (at the median latency) against batch per variant."""
    fig = _batch_figure("throughput (items/s at p50)", "items/s", table, width=width)
    fig.add_tools(_hover(_curves(fig, table, "items_per_s", colors), ("items/s", "@items_per_s{0,0.0}"),
                         ("tokens/s", "@tokens_per_s{0,0.0}")))
    _legend(fig)
    return fig


def memory_curves(table: pd.DataFrame, colors: dict[str, str], *, width: int = 550):
    """Peak allocated memory of each profiled run against batch per variant (runs not profiled have none)."""
    profiled = table["peak_bytes"].notna().any()
    title = "peak memory (MiB, profiled runs)" if profiled else "peak memory: no profiled run recorded memory"
    fig = _batch_figure(title, "MiB", table, width=width)
    fig.add_tools(_hover(_curves(fig, table.assign(peak_mib=table["peak_bytes"] / 2**20), "peak_mib", colors),
                         ("peak", "@peak_mib{0,0.00} MiB")))
    _legend(fig)
    return fig


def pareto_chart(front: pd.DataFrame, colors: dict[str, str], *, width: int = 550):
    """Every run as latency (x, log) against throughput (y); the runs on the Pareto front (per slice) are large,
    outlined and joined, the others faint."""
    fig = figure(title="Pareto: latency vs throughput (front outlined)", width=width, height=340, x_axis_type="log",
                 tools=TOOLS, x_axis_label="p50 ms", y_axis_label="items/s")
    if front.empty:
        return fig
    data = front.assign(color=front["series"].map(colors))
    on_front = data[data["on_front"]]
    behind = fig.scatter("p50_ms", "items_per_s", source=frame_source(data[~data["on_front"]]), color="color",
                         size=7, alpha=0.35)
    ahead = fig.scatter("p50_ms", "items_per_s", source=frame_source(on_front), fill_color="color", size=13,
                        line_color="black", line_width=2)
    for _, part in on_front.groupby([on_front["seq"].fillna(-1), on_front["new"].fillna(-1)], sort=False):
        fig.step("p50_ms", "items_per_s", source=frame_source(part.sort_values("p50_ms")), mode="after",
                 color="black", line_dash="dashed")
    fig.add_tools(HoverTool(renderers=[behind, ahead], tooltips=[("run", "@label"), ("p50", "@p50_ms{0.000} ms"),
                                                          ("items/s", "@items_per_s{0,0.0}"),
                                                          ("on the front", "@on_front")]))
    return fig
