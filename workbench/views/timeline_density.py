"""The timeline's density bars: precomputed levels for the whole trace, and the per-pixel density of busy lanes
that a `spans` reply brings (docs/api-spans.md), with what the level-of-detail rule shows before any zoom."""

from __future__ import annotations

import numpy as np
import pandas as pd
from bokeh.models import ColumnDataSource, CustomJSHover, GlyphRenderer, HoverTool, LinearColorMapper, Range1d, Title
from bokeh.plotting import figure

from workbench.analysis.timeline import Density, select_level
from workbench.trace.schema import KINDS
from workbench.views import timeline_js as js
from workbench.views._style import KIND_PALETTE

REMOTE_BARS = "timeline remote density"
"""`name` of the renderer of the busy lanes' density in a `spans` reply."""


def draw_density(fig: figure, lod: Density, layout: pd.DataFrame) -> list[GlyphRenderer]:
    """One renderer of density bars per level, all hidden (the LOD logic shows one); hover counts the events
    that make a bar (those overlapping it: a bar drawn busy always has some, though all may have started
    earlier) and names its dominant span through a name list shipped once, not per bar."""
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
            "lane": lane.astype(np.int32),
            "x": ((cells["start_ns"].to_numpy()[at] + cells["end_ns"].to_numpy()[at]) / 2).astype(np.float64),
            "y": (top + rows / 2).astype(np.float32),
            "h": (rows - 0.1).astype(np.float32),
            "busy": busy.astype(np.float32),
            "alpha": (0.15 + 0.85 * busy).astype(np.float32),
            "count": cells["count"].to_numpy()[at].astype(np.int32),
            "overlap": cells["overlap"].to_numpy()[at].astype(np.int32),
            "kind_id": cells["kind"][at].astype(str).map(kind_index).fillna(kind_index["other"])
                                        .to_numpy(dtype=np.int8),
            "name_id": names.cat.codes.to_numpy()[at].astype(np.int32),
        })
        mapper = LinearColorMapper(palette=list(KIND_PALETTE), low=-0.5, high=len(KINDS) - 0.5)
        renderers.append(fig.rect(x="x", y="y", width=lod.bin_ns(level), height="h", source=source,
                                  fill_color={"field": "kind_id", "transform": mapper}, fill_alpha="alpha",
                                  line_color=None, visible=False))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[
        ("events", "@overlap{0,0} overlapping this bar, @count{0,0} starting in it"), ("busy", "@busy{0%}"),
        ("mostly", "@name_id{name}"), ("kind", "@kind_id{kind}")],
        formatters={"@name_id": CustomJSHover(args={"names": vocabulary}, code="return names[value]"),
                    "@kind_id": CustomJSHover(args={"kinds": list(KINDS)}, code="return kinds[value]")}))
    return renderers


def draw_remote_density(fig: figure) -> GlyphRenderer:
    """The bars of the lanes a `spans` reply gives as density (empty until one arrives; `APPLY_REPLY` fills it). A
    reply counts the events starting in each pixel (docs/api-spans.md), so the hover says so: a pixel inside a long
    span is busy with none starting there."""
    source = ColumnDataSource({key: [] for key in ("lane", "x", "w", "y", "h", "alpha", "kind_id", "name", "count",
                                                   "busy")})
    mapper = LinearColorMapper(palette=list(KIND_PALETTE), low=-0.5, high=len(KINDS) - 0.5)
    bars = fig.rect(x="x", y="y", width="w", height="h", source=source, line_color=None, visible=False,
                    name=REMOTE_BARS, fill_color={"field": "kind_id", "transform": mapper}, fill_alpha="alpha")
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("events starting in this pixel", "@count{count}"),
        ("busy", "@busy{0%} (spans that started earlier count too)"), ("longest starting here", "@name")],
        formatters={"@count": js.hover(js.COUNT_HOVER)}))
    return bars


def set_initial_mode(source: ColumnDataSource, lod: Density, span_renderers: list[GlyphRenderer],
                      level_renderers: list[GlyphRenderer], boxes: GlyphRenderer, status: Title, x_range: Range1d,
                      extent: tuple[int, int], width: int) -> None:
    """What the LOD callback would show for the initial range, so the page is right before any zoom."""
    x0, x1 = max(x_range.start, extent[0]), min(x_range.end, extent[1])
    tags = source.tags
    inside = any(x0 >= tags[k] and x1 <= tags[k + 1] for k in range(0, len(tags) - 1, 2))
    for renderer in span_renderers:
        renderer.visible = inside
    boxes.visible = not inside and len(tags) >= 2
    if inside:
        data = source.data
        status.text = f"{int(np.count_nonzero((data['left'] <= x1) & (data['right'] >= x0))):,} spans in view"
        return
    level = select_level(lod, x_range.end - x_range.start, width)
    level_renderers[level].visible = True
    cells = lod.cells[(lod.cells["level"] == level) & (lod.cells["end_ns"] > x0) & (lod.cells["start_ns"] < x1)]
    where = (f" (real spans embedded for {tags[0] / 1e6:.3f} ms to {tags[1] / 1e6:.3f} ms, the dashed box)"
             if len(tags) == 2 else f" (real spans embedded in {len(tags) // 2} windows, the dashed boxes: jump to one "
             "below)" if len(tags) > 2 else "")
    status.text = f"aggregated: {int(cells['count'].sum()):,} events in {len(cells):,} bins — zoom in for spans{where}"
