"""The roofline view: ops and kernels on a device's log–log roofline, sized by time, coloured by bound.

x is arithmetic intensity (FLOP/byte), y achieved FLOP/s; one horizontal ceiling per dtype the device has a
peak for (from that dtype's ridge point on) and the memory-bandwidth slope below them. Each row of a
`workbench.analysis.roofline.roofline` table whose FLOPs and bytes are both known (and FLOPs > 0: a log axis
has no zero) is one point, its area proportional to the row's time. Rows without known work cannot be
placed; the heading says how many.

Linking: the points' source (named `ROOFLINE_SOURCE`) has a `name` column; `link_roofline` makes a selection
of points select the spans of those names in the timeline and the rows of those names in the op tables.
Names come from traces: they reach the page only as data fields (hover `@name`, never formatted into a
template), so they render as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, CustomJS, Div, HoverTool, LayoutDOM, Legend, LegendItem, Range1d
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from workbench.analysis.roofline import ROOFLINE_COLUMNS
from workbench.hardware.device import DeviceSpec

ROOFLINE_SOURCE = "roofline points"
"""`name` of the points' ColumnDataSource, so a layout holding the view can find it to link from."""

BOUND_COLORS: dict[str, str] = {"compute": "#4c72b0", "memory": "#c44e52", "latency": "#dd8452",
                                "unknown": "#b0b0b0"}
"""Colour of each bound (`workbench.analysis.roofline.classify_bound`'s values)."""

KIND_MARKERS: dict[str, str] = {"op": "circle", "kernel": "square", "hlo": "triangle"}
"""Marker of each event kind on the roofline; other kinds are diamonds."""

MAX_POINT_PX = 40.0
"""Diameter of the point with the most time; the others' areas scale with their time."""
MIN_POINT_PX = 4.0
"""Smallest diameter drawn, so that short rows stay visible (their area no longer scales below it)."""

CEILING_COLORS = ("#222222", "#555555", "#777777", "#999999", "#444444", "#666666", "#888888", "#333333", "#aaaaaa")
"""Line colours of the dtype ceilings, highest peak first."""

_SELECT_NAMES = """
const names = new Set(points.selected.indices.map((i) => points.data.name[i]))
const pick = (source) => {
  const column = source.data.name
  const hits = []
  if (names.size > 0) {
    for (let i = 0; i < column.length; i++) {
      if (names.has(column[i])) hits.push(i)
    }
  }
  return hits
}
for (const table of tables) table.selected.indices = pick(table)
if (spans !== null) setTimeout(() => { spans.selected.indices = pick(spans) }, 0)
"""

_NUMERIC = ("calls", "time_ns", "mean_ns", "flops", "bytes", "intensity", "achieved_flops_per_s",
            "achieved_bytes_per_s", "peak_flops_per_s", "ridge_point", "roof_ns", "fraction_of_roof", "known_calls")


def roofline_frame(table: pd.DataFrame | Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A roofline table as a DataFrame with `ROOFLINE_COLUMNS` and float numbers, from a DataFrame or from
    the JSON-ready records of `workbench analyze --json` (where NaN became None)."""
    frame = pd.DataFrame(list(table) if not isinstance(table, pd.DataFrame) else table, columns=list(ROOFLINE_COLUMNS))
    for name in _NUMERIC:
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype(np.float64)
    return frame


def placeable(table: pd.DataFrame) -> np.ndarray:
    """Which rows can be drawn on log–log axes: finite, positive intensity and achieved FLOP/s."""
    intensity = table["intensity"].to_numpy(dtype=np.float64)
    achieved = table["achieved_flops_per_s"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(intensity) & np.isfinite(achieved) & (intensity > 0) & (achieved > 0)


def roofline_view(table: pd.DataFrame | Sequence[Mapping[str, Any]], device: DeviceSpec, *, width: int = 1000,
                  height: int = 560) -> LayoutDOM:
    """A heading and the roofline figure of `table` (a `roofline` DataFrame or its records) on `device`;
    a note instead of the figure when no row can be placed."""
    frame = roofline_frame(table)
    if not device.peak_flops:
        return Div(text=f"No roofline: the figures of {device.name} give no peak FLOP/s.", render_as_text=True,
                   width=width)
    if frame.empty:
        return Div(text=f"No ops or kernels to place on the roofline of {device.name}.", render_as_text=True,
                   width=width)
    mask = placeable(frame)
    if not mask.any():
        return Div(text=f"None of the {len(frame):,} ops and kernels has both FLOPs and bytes known (with FLOPs "
                        f"> 0), so none can be placed on the roofline of {device.name}.", render_as_text=True,
                   width=width)
    heading = Div(render_as_text=True, width=width, text=(
        f"Roofline on {device.name}: {int(mask.sum()):,} of {len(frame):,} rows placed (the others have no known "
        f"FLOPs and bytes); point area ∝ time, colour = bound, marker = kind (● op, ■ kernel, ▲ hlo); select "
        f"points to highlight their names in the timeline and tables"))
    return column(heading, roofline_figure(frame[mask].reset_index(drop=True), device, width=width, height=height))


def roofline_figure(points: pd.DataFrame, device: DeviceSpec, *, width: int = 1000, height: int = 560) -> figure:
    """The log–log figure: dtype ceilings, the bandwidth slope and one point per row of `points` (rows that
    `placeable` accepts)."""
    bandwidth = float(device.memory_bw_bytes_per_s)
    peaks = sorted(((str(d), float(p)) for d, p in device.peak_flops.items()), key=lambda item: -item[1])
    ridges = [peak / bandwidth for _, peak in peaks]
    intensity = points["intensity"].to_numpy(dtype=np.float64)
    achieved = points["achieved_flops_per_s"].to_numpy(dtype=np.float64)
    x_lo, x_hi = min(intensity.min(), *ridges) / 4, max(intensity.max(), *ridges) * 4
    y_lo, y_hi = min(achieved.min(), bandwidth * x_lo) / 2, max(achieved.max(), peaks[0][1]) * 3
    fig = figure(width=width, height=height, x_axis_type="log", y_axis_type="log",
                 x_range=Range1d(x_lo, x_hi), y_range=Range1d(y_lo, y_hi),
                 tools="pan,wheel_zoom,box_zoom,box_select,lasso_select,tap,reset,save", active_scroll="auto",
                 title=f"Roofline: {device.name} ({_si(bandwidth)}B/s memory bandwidth)",
                 x_axis_label="arithmetic intensity (FLOP/byte)", y_axis_label="achieved FLOP/s")
    colors = dict(zip(sorted({peak for _, peak in peaks}, reverse=True), CEILING_COLORS * 2, strict=False))
    for (dtype, peak), ridge in zip(peaks, ridges, strict=True):
        fig.line(x=[ridge, x_hi], y=[peak, peak], line_color=colors[peak], line_width=2, name=f"ceiling {dtype}")
    labels = ceiling_labels(peaks, (y_lo, y_hi), height - PLOT_FRAME_PX)
    fig.text(x=[x_hi] * len(labels), y=[label.peak for label in labels], text=[label.text for label in labels],
             y_offset=[label.offset_px for label in labels], text_align="right", text_baseline="bottom",
             text_font_size=f"{LABEL_PX - 4}px", text_color=[colors[label.peak] for label in labels],
             background_fill_color="white", background_fill_alpha=0.85, padding=1, name="ceiling labels")
    fig.line(x=[x_lo, max(ridges)], y=[bandwidth * x_lo, peaks[0][1]], line_color="black", line_width=2,
             line_dash="dashed", name="bandwidth")
    fig.text(x=[x_lo * 1.2], y=[bandwidth * x_lo * 1.2], text=[f"memory {_si(bandwidth)}B/s"], text_align="left",
             text_baseline="bottom", text_font_size="11px")
    source = points_source(points)
    dots = fig.scatter(x="intensity", y="achieved_flops_per_s", size="size", marker="marker", source=source,
                       fill_color=factor_cmap("bound", list(BOUND_COLORS.values()), list(BOUND_COLORS)),
                       fill_alpha=0.6, line_color="black", line_alpha=0.5, selection_fill_alpha=0.9,
                       nonselection_fill_alpha=0.15, nonselection_line_alpha=0.15)
    fig.add_tools(HoverTool(renderers=[dots], tooltips=[
        ("name", "@name"), ("kind", "@kind"), ("dtype", "@dtype"), ("calls", "@calls{0,0}"),
        ("time", "@time_ms{0,0.000} ms"), ("intensity", "@intensity{0,0.000} FLOP/B"),
        ("achieved", "@gflops{0,0.00} GFLOP/s, @gbytes{0,0.00} GB/s"), ("of roof", "@fraction{0.0%}"),
        ("ceiling", "@peak_dtype"), ("bound", "@bound")]))
    bounds = set(source.data["bound"].tolist())
    kinds = [kind for kind in KIND_MARKERS if kind in set(source.data["kind"].tolist())]
    if set(source.data["marker"].tolist()) - set(KIND_MARKERS.values()):
        kinds.append("other")
    # The legends draw stand-ins of one size (the points' sizes vary from MIN_POINT_PX to MAX_POINT_PX):
    # each bound's colour, then each kind's marker.
    fig.add_layout(Legend(title="bound", items=[LegendItem(label=bound, renderers=[_legend_glyph(
        fig, "circle", BOUND_COLORS[bound])]) for bound in BOUND_COLORS if bound in bounds]), "right")
    fig.add_layout(Legend(title="kind", items=[LegendItem(label=kind, renderers=[_legend_glyph(
        fig, KIND_MARKERS.get(kind, "diamond"), BOUND_COLORS["unknown"])]) for kind in kinds]), "right")
    return fig


LEGEND_POINT_PX = 11
"""Size of the legends' markers."""
LABEL_PX = 15
"""Height of a ceiling label (12px text and its padding): labels closer than this are moved apart."""
LABEL_GAP_PX = 3
"""Space between a ceiling and a label moved under it."""
PLOT_FRAME_PX = 90
"""The figure's height outside its plotting area (title, axis, toolbar), roughly."""


@dataclass(frozen=True)
class CeilingLabel:
    """The label of one ceiling height: the dtypes with that peak, and how far (px, down) it is moved so that it
    does not overlap the label above it."""

    peak: float
    text: str
    offset_px: float


def ceiling_labels(peaks: Sequence[tuple[str, float]], y_range: tuple[float, float], plot_px: float
                   ) -> list[CeilingLabel]:
    """One label per peak value (dtypes sharing a peak share one: "bf16, fp16 312 TFLOP/s"), highest first, each
    drawn just above its line unless that overlaps the label above, then moved down below it. `y_range` is the
    log y axis and `plot_px` its height in pixels."""
    span = np.log10(y_range[1]) - np.log10(y_range[0])
    by_peak: dict[float, list[str]] = {}
    for dtype, peak in peaks:
        by_peak.setdefault(peak, []).append(dtype)
    labels: list[CeilingLabel] = []
    free_from = -np.inf  # the screen y (px from the top) below the last label placed
    for peak in sorted(by_peak, reverse=True):
        line_px = plot_px * (np.log10(y_range[1]) - np.log10(peak)) / span
        above = line_px - LABEL_PX  # the label's top when it sits on its line
        # on its line if there is room; else just under its line (never across it), or under the label above
        top = above if above >= free_from else max(line_px + LABEL_GAP_PX, free_from)
        labels.append(CeilingLabel(peak, f"{', '.join(sorted(by_peak[peak]))} {_si(peak)}FLOP/s", top - above))
        free_from = top + LABEL_PX
    return labels


def _legend_glyph(fig: figure, marker: str, color: str) -> Any:
    """A renderer drawn nowhere in the plot (its one point is NaN) that stands for points in a legend."""
    return fig.scatter(x=[np.nan], y=[np.nan], marker=marker, size=LEGEND_POINT_PX, fill_color=color,
                       fill_alpha=0.8, line_color="black", line_alpha=0.6, name="legend marker")


def points_source(points: pd.DataFrame) -> ColumnDataSource:
    """The points' data: one row per roofline row, `size` its diameter in px (area ∝ time)."""
    time_ns = points["time_ns"].to_numpy(dtype=np.float64)
    kind = points["kind"].astype(str).to_numpy(dtype=object)
    return ColumnDataSource({
        "name": points["name"].astype(str).to_numpy(dtype=object),
        "kind": kind,
        "dtype": _text(points["dtype"]),
        "calls": points["calls"].to_numpy(dtype=np.float64),
        "time_ms": time_ns / 1e6,
        "intensity": points["intensity"].to_numpy(dtype=np.float64),
        "achieved_flops_per_s": points["achieved_flops_per_s"].to_numpy(dtype=np.float64),
        "gflops": points["achieved_flops_per_s"].to_numpy(dtype=np.float64) / 1e9,
        "gbytes": points["achieved_bytes_per_s"].to_numpy(dtype=np.float64) / 1e9,
        "fraction": points["fraction_of_roof"].to_numpy(dtype=np.float64),
        "peak_dtype": _text(points["peak_dtype"]),
        "bound": points["bound"].astype(str).to_numpy(dtype=object),
        "size": point_sizes(time_ns),
        "marker": np.array([KIND_MARKERS.get(k, "diamond") for k in kind], dtype=object),
    }, name=ROOFLINE_SOURCE)


def point_sizes(time_ns: np.ndarray) -> np.ndarray:
    """Diameters in px whose squares (areas) are proportional to `time_ns`: `MAX_POINT_PX` for the longest,
    never below `MIN_POINT_PX`."""
    time_ns = np.nan_to_num(np.asarray(time_ns, dtype=np.float64), nan=0.0)
    longest = time_ns.max(initial=0.0)
    if longest <= 0:
        return np.full(len(time_ns), MIN_POINT_PX)
    return np.maximum(MAX_POINT_PX * np.sqrt(np.clip(time_ns, 0, None) / longest), MIN_POINT_PX)


def link_roofline(points: ColumnDataSource, spans: ColumnDataSource | None, *tables: ColumnDataSource) -> CustomJS:
    """Selecting points selects the rows of the same names in each of `tables` and the spans of those names
    in the timeline's `spans` source (each source needs a `name` column); returns the callback.

    Each table's own link to the timeline (`link_table_to_timeline`) reacts to the selection set here and
    selects only that table's names; BokehJS runs callbacks as promises, after this one, so the spans are
    set on a timer that fires once they are done, to every name the points selected.
    """
    callback = CustomJS(args={"points": points, "tables": list(tables), "spans": spans}, code=_SELECT_NAMES)
    points.selected.js_on_change("indices", callback)
    return callback


def _text(values: pd.Series) -> np.ndarray:
    """Strings for display: missing values (None, NaN) become ""."""
    return np.array(["" if pd.isna(v) else str(v) for v in values], dtype=object)


def _si(value: float) -> str:
    """`value` with an SI prefix and a trailing space before the unit: 19.5e12 -> "19.5 T"."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "
