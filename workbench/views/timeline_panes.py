"""The timeline with its panes: a search bar (and buttons collapsing or expanding every lane) above it; the details
of the clicked event, its related events (launcher, launched kernels: click one to jump to it) and the aggregate of
a selected range below it; and, when the real spans are embedded for some windows only (a static report of a large
trace), the list of those windows to jump to. The figure and its sources come from `views.timeline`; this module
only lays them out and wires the search (`views.timeline_select_js.SEARCH`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from bokeh.layouts import column, row
from bokeh.models import Button, CheckboxGroup, ColumnDataSource, CustomJS, DataTable, Div, LayoutDOM, Select, TextInput

from workbench.analysis.timeline import MAX_LANES
from workbench.trace import Trace
from workbench.views import timeline_js as js
from workbench.views import timeline_select_js as select_js
from workbench.views._table import data_table
from workbench.views.timeline import (
    AGGREGATE,
    AGGREGATE_INFO,
    DETAILS,
    FOLDED,
    LANES,
    MARKER,
    RELATED,
    REMOTE,
    SPANS_SOURCE,
    WINDOWS,
    timeline,
)

SEARCH_INPUT = "timeline search"
"""`name` of the search box (its `value` runs a search; the panel's browser test types into it)."""
SEARCH_STATUS = "timeline search status"
"""`name` of the Div with the search's count and position."""

DETAIL_COLUMNS = [("field", "field", None), ("value", "value", None)]
RELATED_COLUMNS = [("relation", "relation", None), ("name", "name", None), ("start", "start", None),
                   ("duration", "duration", None)]
AGGREGATE_COLUMNS = [("name", "name", None), ("kind", "kind", None), ("count", "count", "0,0"),
                     ("total_ms", "total (ms)", "0,0.000"), ("self_ms", "self (ms)", "0,0.000")]


def timeline_panel(trace: Trace, *, width: int = 1200, below: LayoutDOM | None = None,
                   **options: Any) -> LayoutDOM:
    """`views.timeline.timeline(trace, width=width, **options)` with its search bar, details, related events,
    range aggregate and (for several embedded windows) the list of windows to jump to; `below` (the counter
    tracks, on the same time axis) sits right under the lanes."""
    fig = timeline(trace, width=width, **options)
    source = fig.select_one({"name": SPANS_SOURCE})
    if source is None:  # a trace without events: the note alone
        return fig
    remote = fig.select_one({"name": REMOTE})
    lanes = fig.select_one({"name": LANES})
    buttons = _collapse_buttons(fig) if max(lanes.data["rows"]) > 1 else []
    parts: list[LayoutDOM] = [_search_bar(fig, source, remote, width, buttons), fig,
                              *([] if below is None else [below])]
    folded = fig.tags[0][FOLDED] if fig.tags else []
    if folded:
        parts.insert(1, _lane_expander(remote, folded, width))
    windows = fig.select_one({"name": WINDOWS})
    if len(windows.data["left"]) > 1:
        parts.append(_window_picker(fig, windows))
    half = (width - 20) // 2
    details = _table_of(fig.select_one({"name": DETAILS}), DETAIL_COLUMNS, half, 300, {"field": 110, "value": 420})
    related = _table_of(fig.select_one({"name": RELATED}), RELATED_COLUMNS, half, 160,
                        {"relation": 90, "name": 300, "start": 90, "duration": 90})
    aggregate = _table_of(fig.select_one({"name": AGGREGATE}), AGGREGATE_COLUMNS, half, 440,
                          {"name": 300, "kind": 70, "count": 70, "total_ms": 90, "self_ms": 90})
    info = fig.select_one({"name": AGGREGATE_INFO})
    info.width = half
    left = column(Div(text="Details of the clicked span", render_as_text=True), details,
                  Div(text="Related events (click one to jump to it)", render_as_text=True), related)
    parts.append(row(left, column(info, aggregate)))
    return column(*parts)


def _search_bar(fig: LayoutDOM, source: ColumnDataSource, remote: ColumnDataSource, width: int,
                buttons: list[Button]) -> LayoutDOM:
    """Search box, previous/next buttons, a regex switch, `buttons` and the count; Enter searches, the buttons
    step."""
    box = TextInput(placeholder="search event names (Enter); W/S zoom, A/D pan over the plot", width=360,
                    name=SEARCH_INPUT)
    regex = CheckboxGroup(labels=["regex"], active=[])
    previous, following = Button(label="◀ previous", width=90), Button(label="next ▶", width=70)
    taken = 560 + sum(button.width + 10 for button in buttons)
    status = Div(text="", render_as_text=True, width=max(width - taken, 200), name=SEARCH_STATUS)
    args = {"input": box, "use_regex": regex, "remote": remote, "status": status, "source": source,
            "xr": fig.x_range, "details": fig.select_one({"name": DETAILS}), "marker": fig.select_one({"name": MARKER})}
    box.js_on_change("value", CustomJS(args={**args, "step": 0}, code=select_js.SEARCH))
    previous.js_on_event("button_click", CustomJS(args={**args, "step": -1}, code=select_js.SEARCH))
    following.js_on_event("button_click", CustomJS(args={**args, "step": 1}, code=select_js.SEARCH))
    return row(box, previous, following, regex, *buttons, status)


def _collapse_buttons(fig: LayoutDOM) -> list[Button]:
    """Collapse every lane of several rows to one row, or expand them all back (a click on a lane's label toggles
    that lane alone: `views.timeline_js.COLLAPSE`, whose figure callback lends these buttons its arguments)."""
    tap = fig.select_one({"name": js.COLLAPSE_CALLBACK})
    buttons = []
    for what, label in (("collapse", "collapse lanes"), ("expand", "expand lanes")):
        button = Button(label=label, width=110)
        button.js_on_event("button_click", CustomJS(args={**tap.args, "what": what}, code=js.COLLAPSE))
        buttons.append(button)
    return buttons


def _lane_expander(remote: ColumnDataSource, folded: list[dict[str, Any]], width: int) -> LayoutDOM:
    """Pick a folded lane to draw its tracks as lanes of their own, `MAX_LANES` at a time (the `spans` route's
    `expand`): shown in the panel only, where the server answers; a report keeps the folded lanes."""
    picker = Select(title="", width=360, value="", options=[
        ("", "folded lanes: expand one…"),
        *((str(lane["lane"]), f"{lane['device']} · {lane['label']}") for lane in folded)])
    previous = Button(label=f"◀ previous {MAX_LANES}", width=120)
    following = Button(label=f"next {MAX_LANES} ▶", width=100)
    pages = Div(text="", render_as_text=True, width=max(width - 620, 200))
    box = row(picker, previous, following, pages, visible=False)
    args = {"remote": remote, "picker": picker, "pages": pages, "box": box, "page": MAX_LANES,
            "tracks": {str(lane["lane"]): lane["tracks"] for lane in folded}}
    picker.js_on_change("value", CustomJS(args={**args, "step": 0}, code=js.EXPAND))
    previous.js_on_event("button_click", CustomJS(args={**args, "step": -1}, code=js.EXPAND))
    following.js_on_event("button_click", CustomJS(args={**args, "step": 1}, code=js.EXPAND))
    remote.js_on_change("tags", CustomJS(args={**args, "step": 0}, code=js.EXPAND))
    return box


def _window_picker(fig: LayoutDOM, windows: ColumnDataSource) -> LayoutDOM:
    """The windows whose real spans are embedded, to jump to (elsewhere the view shows density only)."""
    data = windows.data
    options = [(str(k), f"{label or 'window'}: {left / 1e6:,.3f} ms to {right / 1e6:,.3f} ms")
               for k, (left, right, label) in enumerate(zip(data["left"], data["right"], data["label"], strict=True))]
    picker = Select(title=f"Real spans are embedded in {len(options)} windows (density elsewhere); jump to one:",
                    options=[("", "—"), *options], value="", width=600)
    picker.js_on_change("value", CustomJS(args={"windows": windows, "xr": fig.x_range}, code=js.GO_TO_WINDOW))
    return picker


def _table_of(source: ColumnDataSource, columns: list[tuple[str, str, str | None]], width: int, height: int,
              widths: dict[str, int]) -> DataTable:
    """A table over one of the timeline's (initially empty) sources, sharing that source."""
    table = data_table(pd.DataFrame({field: [] for field, _, _ in columns}), columns, width=width, height=height,
                       widths=widths)
    table.source = source
    # BokehJS redraws a table when its view's indices change, so new rows of the same count would stay unseen
    # (the details of a second kernel, its one related event): redraw on every new data
    source.js_on_change("data", CustomJS(args={"table": table}, code=js.REDRAW_TABLE))
    return table
