"""The op timeline: one lane per track, spans coloured by kind, nested by depth, with level of detail.

Lanes come grouped by device (host threads, then each accelerator's streams or cores); inside a lane
each nesting depth has its own row. Step and phase annotations are translucent bands across all
lanes, with a strip above the lanes to hover and click (a click zooms to that step). Selecting a
kernel selects the host op that launched it, and selecting an op selects the kernels it launched.

Large traces: the figure embeds (a) precomputed density levels (`workbench.analysis.timeline.density`)
and (b) the real spans of one detail window holding at most `max_spans` events, never the whole
trace, so a static report stays small whatever the event count. While the visible time range lies
inside the detail window the real spans are drawn; elsewhere the density level whose bins are no
wider than a pixel is, and a line above the plot says so ("aggregated: N events in M bins — zoom in
for spans"). In a static report single events are reachable inside the detail window only (a dashed
box marks it); in a notebook `refine` refills the spans for any window from Python.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from bokeh.models import (
    BoxAnnotation,
    BoxZoomTool,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    Div,
    FixedTicker,
    GlyphRenderer,
    HoverTool,
    Legend,
    LegendItem,
    LinearColorMapper,
    PanTool,
    Range1d,
    ResetTool,
    SaveTool,
    Span,
    TapTool,
    Title,
    WheelZoomTool,
)
from bokeh.models.layouts import LayoutDOM
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from workbench.analysis.timeline import (
    Density,
    count_spans,
    density,
    detail_window,
    lanes,
    phases,
    select_level,
    spans,
)
from workbench.trace import Trace
from workbench.trace.schema import KINDS
from workbench.views._style import KIND_COLORS, KIND_PALETTE, PHASE_BAND_COLOR, STEP_BAND_COLORS, time_ticks

SPANS_SOURCE = "timeline spans"
"""`name` of the timeline's span source, so a layout holding the timeline can find it to link to."""
LANE_GAP = 0.5
"""Rows of space between two lanes (twice that between devices)."""
ROW_PX = 16
"""Screen height of one nesting row at the default figure height."""
SHAPES_CHARS = 200
"""Input shapes longer than this are cut in the tooltip (some ops record thousands of characters)."""
INSTANT_PX = 9
"""Marker size of an instant (a 0 ns event), which has no width to draw."""

_SPAN_KEYS = ("left", "right", "y", "instant_px", "start_ms", "dur_us", "name", "kind", "shapes", "flops", "row",
              "launcher_idx", "launcher_name", "launched")
"""Columns of the span source (see `_span_columns`)."""

_LOD = """
const x0 = Math.max(xr.start, extent[0]), x1 = Math.min(xr.end, extent[1]);
const tags = source.tags;
const inside = tags.length == 2 && x0 >= tags[0] && x1 <= tags[1];
const fmt = (ns) => (ns / 1e6).toFixed(3) + " ms";
for (const r of spans) r.visible = inside;
box.visible = !inside && tags.length == 2;
if (inside) {
  const left = source.data.left, right = source.data.right;
  let n = 0;
  for (let i = 0; i < left.length; i++) if (left[i] <= x1 && right[i] >= x0) n++;
  status.text = `${n.toLocaleString()} spans in view`;
  for (const r of levels) r.visible = false;
  return;
}
const px = (xr.end - xr.start) / Math.max(plot.inner_width || width, 1);
let level = levels.length - 1;
for (let l = 0; l < levels.length; l++) if (bin_ns[l] <= px) { level = l; break; }
levels.forEach((r, l) => { r.visible = l == level; });
const data = levels[level].data_source.data, x = data.x, count = data.count, half = bin_ns[level] / 2;
let n = 0, m = 0;
for (let i = 0; i < x.length; i++) if (x[i] + half > x0 && x[i] - half < x1) { n += count[i]; m++; }
status.text = `aggregated: ${n.toLocaleString()} events in ${m.toLocaleString()} bins — zoom in for spans`
  + (tags.length == 2 ? ` (real spans embedded for ${fmt(tags[0])} to ${fmt(tags[1])}, the dashed box)` : "");
"""

_LINK = """
const key = cb_obj.indices.join(",");
if (cb_obj._linked === key) return;
const launcher = source.data.launcher_idx;
const picked = new Set(cb_obj.indices);
const out = new Set(picked);
for (const i of picked) if (launcher[i] >= 0) out.add(launcher[i]);
for (let j = 0; j < launcher.length; j++) if (picked.has(launcher[j])) out.add(j);
const indices = [...out].sort((a, b) => a - b);
cb_obj._linked = indices.join(",");
cb_obj.indices = indices;
"""

_ZOOM_TO_BAND = """
const i = cb_obj.indices[0];
if (i == null) return;
const left = bands.data.left[i], right = bands.data.right[i], pad = (right - left) * 0.02;
xr.setv({start: left - pad, end: right + pad});
"""


def timeline(trace: Trace, *, x_range: Range1d | None = None, width: int = 1200, max_spans: int = 20_000,
             detail: tuple[int, int] | None = None, bins: int = 2048, levels: int = 4) -> LayoutDOM:
    """The op timeline of `trace` as a Bokeh layout.

    `x_range` (ns from the trace origin) may be shared with other views to link their zoom; by
    default one spanning the trace. `detail` is the window ([start, end) ns) whose real spans are
    embedded; by default the longest one from the first step holding at most `max_spans` events
    (the whole trace when it has no more). Outside it the view shows `levels` density levels of
    `bins`, 2·`bins`, ... bins. A trace without events gives a note instead.
    """
    if trace.events.num_rows == 0:
        return Div(text="No events in this trace: nothing to draw on the timeline.", render_as_text=True)
    lane_table = lanes(trace)
    layout = _lane_layout(lane_table)
    bands = phases(trace)
    lod = density(trace, bins=bins, levels=levels, lane_table=lane_table)
    first, last = lod.origin_ns, lod.origin_ns + lod.span_ns
    pad = (last - first) * 0.01
    if x_range is None:
        x_range = Range1d(first - pad, last + pad, bounds=(first - pad, last + pad))
    window = detail_window(trace, max_spans) if detail is None else detail
    source = ColumnDataSource(data={}, name=SPANS_SOURCE)
    refine(trace, source, window[0], window[1], max_spans=max_spans, lane_table=lane_table)
    strip = _strip_rows(bands)
    fig = figure(width=width, height=_height(layout, strip), x_range=x_range,
                 y_range=Range1d(float(layout["bottom"].max()) + LANE_GAP, -strip - LANE_GAP),
                 tools=[PanTool(dimensions="width"), WheelZoomTool(dimensions="width"),
                        BoxZoomTool(dimensions="width"), ResetTool(), SaveTool()],
                 active_scroll="auto", title=f"Timeline: {trace.events.num_rows:,} events in {len(layout)} lanes")
    band_renderers = _draw_bands(fig, bands, layout, x_range)
    level_renderers = _draw_density(fig, lod, layout)
    span_renderers = _draw_spans(fig, source)
    box = BoxAnnotation(left=window[0], right=window[1], fill_alpha=0, line_color="black", line_dash="dashed",
                        line_alpha=0.6)
    fig.add_layout(box)
    fig.add_tools(TapTool(renderers=[*span_renderers, *band_renderers]))
    status = Title(text="", text_font_style="italic", text_font_size="11px")
    fig.add_layout(status, "above")
    _set_initial_mode(source, lod, span_renderers, level_renderers, box, status, x_range, (first, last), width)
    lod_callback = CustomJS(args={"xr": x_range, "source": source, "spans": span_renderers, "levels": level_renderers,
                                  "bin_ns": [lod.bin_ns(level) for level in range(len(lod.bins))],
                                  "status": status, "box": box, "plot": fig, "width": width,
                                  "extent": [first, last]}, code=_LOD)
    x_range.js_on_change("start", lod_callback)
    x_range.js_on_change("end", lod_callback)
    source.js_on_change("tags", lod_callback)
    source.selected.js_on_change("indices", CustomJS(args={"source": source}, code=_LINK))
    _style_axes(fig, layout)
    _add_legend(fig, trace)
    return fig


def refine(trace: Trace, source: ColumnDataSource, start_ns: int, end_ns: int, *, max_spans: int = 20_000,
           lane_table: pd.DataFrame | None = None) -> int:
    """Fill the timeline's span `source` with the real spans of [start_ns, end_ns); return their count.

    The hook for live refinement in a notebook (call it from an x-range callback). When the window
    holds more than `max_spans` events the source is emptied instead and the view keeps showing
    density bars for it. `source.tags` records the window the spans cover (empty when none).
    """
    lane_table = lanes(trace) if lane_table is None else lane_table
    count = count_spans(trace, (start_ns, end_ns))
    if count > max_spans:
        source.data, source.tags = {key: [] for key in _SPAN_KEYS}, []
        return count
    layout = _lane_layout(lane_table)
    table = spans(trace, (start_ns, end_ns), lane_table)
    source.data = _span_columns(trace, table, layout)
    source.tags = [int(start_ns), int(end_ns)]
    return count


def _lane_layout(lane_table: pd.DataFrame) -> pd.DataFrame:
    """Vertical placement of each lane: | lane | device | label | top | rows | bottom | (y grows downwards)."""
    rows = lane_table["max_depth"].to_numpy() + 1
    devices = lane_table["device"].to_numpy()
    new_device = np.r_[False, devices[1:] != devices[:-1]]
    gaps = np.where(new_device, 2 * LANE_GAP, LANE_GAP)
    gaps[0] = 0
    top = np.cumsum(gaps + np.r_[0, rows[:-1]])
    return pd.DataFrame({"lane": lane_table["lane"], "device": lane_table["device"], "label": lane_table["label"],
                         "top": top.astype(float), "rows": rows, "bottom": (top + rows).astype(float),
                         "new_device": new_device})


def _span_columns(trace: Trace, table: pd.DataFrame, layout: pd.DataFrame) -> dict[str, object]:
    """The span source's columns for the `spans` table of a window."""
    top = layout.set_index("lane")["top"]
    position = pd.Series(np.arange(len(table)), index=table["row"].to_numpy())
    launcher = table["launcher"].to_numpy()
    linked = launcher >= 0
    launcher_name = np.full(len(table), "", dtype=object)
    launcher_name[linked] = trace.events["name"].take(pa.array(launcher[linked])).cast(pa.string()).to_pylist()
    return {
        "left": table["start_ns"].to_numpy(dtype=np.float64),
        "right": table["end_ns"].to_numpy(dtype=np.float64),
        "y": (top.reindex(table["lane"]).to_numpy() + table["depth"].to_numpy() + 0.5).astype(np.float32),
        "instant_px": np.where(table["dur_ns"].to_numpy() == 0, INSTANT_PX, 0).astype(np.uint8),
        "start_ms": (table["start_ns"].to_numpy() / 1e6).astype(np.float64),
        "dur_us": (table["dur_ns"].to_numpy() / 1e3).astype(np.float64),
        "name": table["name"].to_numpy(dtype=object),
        "kind": table["kind"].to_numpy(dtype=object),
        "shapes": np.array([_clip(s, SHAPES_CHARS) for s in table["shapes"]], dtype=object),
        "flops": table["flops"].to_numpy(dtype=np.float64),
        "row": table["row"].to_numpy(dtype=np.int32),
        "launcher_idx": position.reindex(launcher).fillna(-1).to_numpy(dtype=np.int32),
        "launcher_name": launcher_name,
        "launched": table["launched"].to_numpy(dtype=np.int32),
    }


def _strip_rows(bands: pd.DataFrame) -> int:
    """Rows of the band strip above the lanes: one per tier present (phases, steps)."""
    return int(bands["tier"].nunique())


def _height(layout: pd.DataFrame, strip: int) -> int:
    """Figure height in px: `ROW_PX` per row, within bounds that keep big traces on one screen."""
    rows = float(layout["bottom"].max()) + strip + 2 * LANE_GAP
    return int(min(max(rows * ROW_PX + 140, 240), 1000))


def _draw_bands(fig: figure, bands: pd.DataFrame, layout: pd.DataFrame, x_range: Range1d) -> list[GlyphRenderer]:
    """Translucent step/phase bands across all lanes and the clickable strip above them."""
    if bands.empty:
        return []
    tiers = sorted(bands["tier"].unique())
    row = bands["tier"].map({tier: i for i, tier in enumerate(tiers)}).to_numpy()
    step_index = bands.groupby("tier").cumcount().to_numpy()
    color = np.where(bands["tier"].to_numpy() == 0, PHASE_BAND_COLOR,
                     np.array(STEP_BAND_COLORS, dtype=object)[step_index % 2])
    source = ColumnDataSource({
        "left": bands["start_ns"].to_numpy(dtype=np.float64),
        "right": bands["end_ns"].to_numpy(dtype=np.float64),
        "name": bands["name"].to_numpy(dtype=object),
        "dur_ms": (bands["end_ns"] - bands["start_ns"]).to_numpy() / 1e6,
        "color": color,
        "strip_top": row - len(tiers) + 0.05,
        "strip_bottom": row - len(tiers) + 0.95,
    })
    fig.quad(left="left", right="right", top=0, bottom=float(layout["bottom"].max()), source=source,
             fill_color="color", fill_alpha=0.18, line_color=None, selection_fill_alpha=0.3,
             nonselection_fill_alpha=0.18)
    strip = fig.quad(left="left", right="right", top="strip_top", bottom="strip_bottom", source=source,
                     fill_color="color", line_color="white", fill_alpha=0.9, nonselection_fill_alpha=0.9)
    fig.add_tools(HoverTool(renderers=[strip], tooltips=[("", "@name"), ("duration", "@dur_ms{0,0.000} ms"),
                                                         ("", "click to zoom to it")]))
    source.selected.js_on_change("indices", CustomJS(args={"xr": x_range, "bands": source}, code=_ZOOM_TO_BAND))
    return [strip]


def _draw_density(fig: figure, lod: Density, layout: pd.DataFrame) -> list[GlyphRenderer]:
    """One renderer of density bars per level, all hidden (the LOD logic shows one); hover names the
    dominant span of a bar through a name list shipped once, not per bar."""
    cells = lod.cells
    names = cells["name"].astype("category").cat.remove_unused_categories()
    vocabulary = [str(name) for name in names.cat.categories]
    kind_index = {kind: i for i, kind in enumerate(KINDS)}
    placed = layout.set_index("lane")
    renderers = []
    for level in range(len(lod.bins)):
        at = (cells["level"] == level).to_numpy()
        lane = cells["lane"].to_numpy()[at]
        top, rows = placed["top"].reindex(lane).to_numpy(), placed["rows"].reindex(lane).to_numpy()
        busy = cells["busy"].to_numpy()[at]
        source = ColumnDataSource({
            "x": ((cells["start_ns"].to_numpy()[at] + cells["end_ns"].to_numpy()[at]) / 2).astype(np.float64),
            "y": (top + rows / 2).astype(np.float32),
            "h": (rows - 0.1).astype(np.float32),
            "busy": busy.astype(np.float32),
            "alpha": (0.15 + 0.85 * busy).astype(np.float32),
            "count": cells["count"].to_numpy()[at].astype(np.int32),
            "kind_id": cells["kind"][at].astype(str).map(kind_index).fillna(kind_index["other"])
                                        .to_numpy(dtype=np.int8),
            "name_id": names.cat.codes.to_numpy()[at].astype(np.int32),
        })
        mapper = LinearColorMapper(palette=list(KIND_PALETTE), low=-0.5, high=len(KINDS) - 0.5)
        renderers.append(fig.rect(x="x", y="y", width=lod.bin_ns(level), height="h", source=source,
                                  fill_color={"field": "kind_id", "transform": mapper}, fill_alpha="alpha",
                                  line_color=None, visible=False))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[
        ("aggregated", "@count{0,0} events starting here"), ("busy", "@busy{0%}"),
        ("mostly", "@name_id{name}"), ("kind", "@kind_id{kind}")],
        formatters={"@name_id": CustomJSHover(args={"names": vocabulary}, code="return names[value]"),
                    "@kind_id": CustomJSHover(args={"kinds": list(KINDS)}, code="return kinds[value]")}))
    return renderers


def _draw_spans(fig: figure, source: ColumnDataSource) -> list[GlyphRenderer]:
    """Real spans as bars in their lane's row for their depth, coloured by kind; instants as diamonds."""
    color = factor_cmap("kind", list(KIND_PALETTE), list(KINDS))
    bars = fig.hbar(y="y", left="left", right="right", height=0.8, source=source, fill_color=color, line_color=None,
                    nonselection_fill_alpha=0.35, selection_line_color="black")
    instants = fig.scatter(x="left", y="y", size="instant_px", marker="diamond", source=source, fill_color=color,
                           line_color=None, nonselection_fill_alpha=0.35)
    fig.add_tools(HoverTool(renderers=[bars, instants], tooltips=[
        ("name", "@name"), ("kind", "@kind"), ("duration", "@dur_us{0,0.000} µs"),
        ("start", "@start_ms{0,0.000} ms"), ("shapes", "@shapes"), ("flops", "@flops{0.000a}"),
        ("launched by", "@launcher_name"), ("launches", "@launched device ops")]))
    return [bars, instants]


def _set_initial_mode(source: ColumnDataSource, lod: Density, span_renderers: list[GlyphRenderer],
                      level_renderers: list[GlyphRenderer], box: BoxAnnotation, status: Title, x_range: Range1d,
                      extent: tuple[int, int], width: int) -> None:
    """What the LOD callback would show for the initial range, so the page is right before any zoom."""
    x0, x1 = max(x_range.start, extent[0]), min(x_range.end, extent[1])
    tags = source.tags
    inside = len(tags) == 2 and x0 >= tags[0] and x1 <= tags[1]
    for renderer in span_renderers:
        renderer.visible = inside
    box.visible = not inside and len(tags) == 2
    if inside:
        data = source.data
        status.text = f"{int(np.count_nonzero((data['left'] <= x1) & (data['right'] >= x0))):,} spans in view"
        return
    level = select_level(lod, x_range.end - x_range.start, width)
    level_renderers[level].visible = True
    cells = lod.cells[(lod.cells["level"] == level) & (lod.cells["end_ns"] > x0) & (lod.cells["start_ns"] < x1)]
    status.text = (f"aggregated: {int(cells['count'].sum()):,} events in {len(cells):,} bins — zoom in for spans"
                   + (f" (real spans embedded for {tags[0] / 1e6:.3f} ms to {tags[1] / 1e6:.3f} ms, the dashed box)"
                      if len(tags) == 2 else ""))


def _style_axes(fig: figure, layout: pd.DataFrame) -> None:
    """Time axis below; one label per lane ("device · track") and a rule between devices."""
    fig.xaxis.formatter = time_ticks()
    fig.xaxis.axis_label = "time from trace start"
    centers = (layout["top"] + layout["rows"] / 2).to_list()
    fig.yaxis.ticker = FixedTicker(ticks=centers)
    fig.yaxis.major_label_overrides = {center: f"{device} · {label}" for center, device, label
                                       in zip(centers, layout["device"], layout["label"], strict=True)}
    fig.yaxis.major_tick_line_color = None
    fig.ygrid.grid_line_color = None
    for top in layout.loc[layout["new_device"], "top"]:
        fig.add_layout(Span(location=top - LANE_GAP, dimension="width", line_color="gray", line_alpha=0.6))


def _add_legend(fig: figure, trace: Trace) -> None:
    """A legend of the kinds in the trace (glyphs that draw nothing: the spans and bars share these colours)."""
    present = trace.kind_counts()
    items = []
    for kind in KINDS:
        if present.get(kind):
            swatch = fig.quad(left=[np.nan], right=[np.nan], top=[np.nan], bottom=[np.nan],
                              fill_color=KIND_COLORS[kind], line_color=None)
            items.append(LegendItem(label=kind, renderers=[swatch]))
    fig.add_layout(Legend(items=items, title="kind"), "right")


def _clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"
