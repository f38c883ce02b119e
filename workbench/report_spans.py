"""What a static report's timeline embeds: every real span when the trace fits a budget, else the busiest steps.

A report has no server to ask for the spans of a window, so it says exactly what it holds (docs/api-spans.md):

- A trace of at most `REPORT_SPAN_BUDGET` events embeds them all: the whole trace's `window` reply (the one
  the Lab panel gets from the server), gzip-compressed and base64-encoded into the page, which the browser
  unpacks on load (`DecompressionStream`) and applies with the timeline's own reply code. Packed, an event
  costs about 15 bytes, so a 200k-event trace fits in a 10 MB page.
- A larger one embeds the busiest steps in full (most events first, while `WINDOW_SPAN_BUDGET` lasts; the
  busiest equal slices of the trace when it has no steps, or no step fits), density everywhere, and lists
  the windows, labelled, for the timeline's window picker to jump to; outside them its status line says
  that real spans are only in those windows.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.models import CustomJS, LayoutDOM, Title

from workbench.analysis.spans.index import SpanIndex
from workbench.analysis.spans.queries import RunRef, open_run, window
from workbench.analysis.timeline import STEP_NAME
from workbench.trace.store.bundle import Bundle
from workbench.views.timeline import REMOTE, SPANS_SOURCE, TIMELINE_PLOT, WINDOWS

REPORT_SPAN_BUDGET = 250_000
"""Traces of at most this many events embed every span (packed)."""
WINDOW_SPAN_BUDGET = 30_000
"""Spans the windows of a larger trace embed together (as the timeline's own span source, unpacked)."""
SLICES_PER_BUDGET = 4
"""A trace without a usable step is cut into slices of about a quarter of the budget each."""

Window = tuple[int, int, str]

UNPACK = """
if (remote._wb_unpacked) return;
remote._wb_unpacked = true;
const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
const text = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
new Response(text).json().then((reply) => {
  remote._wb_complete = true;
  remote.tags = [reply];
}).catch((error) => { status.text = `could not unpack the embedded spans: ${error.message ?? error}`; });
"""
"""Once the plot is laid out (its inner width set): unpack the embedded reply and hand it to the timeline's
reply code (`views.timeline_js.APPLY_REPLY`, which the `REMOTE` source's tags trigger)."""


@dataclass(frozen=True)
class ReportPlan:
    """The windows whose real spans a report embeds, and whether they cover every event (`complete`)."""

    complete: bool
    windows: list[Window]
    spans: int
    events: int


def report_plan(run: RunRef, budget: int = REPORT_SPAN_BUDGET, window_budget: int = WINDOW_SPAN_BUDGET) -> ReportPlan:
    """The windows a report of `run` embeds (see the module docstring)."""
    _, index = open_run(run)
    first, last = index.extent
    if index.size <= budget:
        return ReportPlan(True, [(first, last, "whole trace")] if index.size else [], index.size, index.size)
    candidates = _steps(index) or []
    chosen = _busiest(index, candidates, window_budget)
    if not chosen:
        chosen = _busiest(index, _slices(first, last, index.size, window_budget), window_budget)
    total = sum(count for _, _, _, count in chosen)
    windows = [(start, end, f"{label}: {count:,} events") for start, end, label, count in sorted(chosen)]
    return ReportPlan(False, windows, total, index.size)


def packed_trace(run: RunRef, plan: ReportPlan, width_px: int = 1200) -> str:
    """The whole trace's `window` reply for a complete plan, as base64 of its gzip-compressed JSON."""
    if not plan.complete or not plan.windows:
        raise ValueError("only a complete plan embeds the whole trace packed")
    (start, end, _), = plan.windows
    reply = window(run, start, end, width_px, max_spans=max(plan.events, 1), launch=True)  # kernels' launch facts
    return pack(reply)


def pack(reply: dict[str, Any]) -> str:
    """A reply as base64 text of its gzip-compressed JSON (`unpack` reverses it; so does the page)."""
    text = json.dumps(reply, separators=(",", ":"), allow_nan=False).encode()
    return base64.b64encode(gzip.compress(text, compresslevel=9, mtime=0)).decode("ascii")


def unpack(packed: str) -> dict[str, Any]:
    """The reply `pack` packed."""
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def _steps(index: SpanIndex) -> list[tuple[int, int, str]]:
    """The trace's steps (step-marker events; a name recorded on several lanes keeps its first lane's span,
    host threads coming first) as (start, end, name), by start."""
    step_codes = np.flatnonzero([STEP_NAME.fullmatch(str(name)) is not None for name in index.names])
    if not len(step_codes):
        return []
    positions = np.flatnonzero(np.isin(index.name, step_codes))
    _, first = np.unique(index.name[positions], return_index=True)  # positions are by lane: host lanes first
    picked = positions[first]
    steps = [(int(index.start[p]), int(index.start[p] + max(index.dur[p], 1)), str(index.names[index.name[p]]))
             for p in picked]
    return sorted(steps)


def _slices(first: int, last: int, events: int, budget: int) -> list[tuple[int, int, str]]:
    """Equal slices of [first, last) holding about budget / SLICES_PER_BUDGET events each on average."""
    count = max(2, math.ceil(events * SLICES_PER_BUDGET / budget))
    edges = np.linspace(first, last, count + 1).round().astype(np.int64)
    return [(int(a), int(b), f"slice {i + 1} of {count}") for i, (a, b) in enumerate(itertools.pairwise(edges))
            if b > a]


def _busiest(index: SpanIndex, candidates: list[tuple[int, int, str]], budget: int) -> list[tuple[int, int, str, int]]:
    """The candidate windows with the most events, taken while their total stays within `budget` (a window
    over the budget alone is passed over), as (start, end, label, events)."""
    counted = [(start, end, label, sum(index.count_overlapping(lane, start, end) for lane in range(len(index.lanes))))
               for start, end, label in candidates]
    chosen, total = [], 0
    for start, end, label, count in sorted(counted, key=lambda c: (-c[3], c[0])):
        if count > 0 and total + count <= budget:
            chosen.append((start, end, label, count))
            total += count
    return chosen


def report_dashboard(bundle: Bundle, plan: ReportPlan | None = None) -> LayoutDOM:
    """The run's dashboard for a report: its timeline embeds what `plan` (by default `report_plan`'s) says."""
    from workbench.views.dashboard import dashboard

    if not bundle.has_trace:
        return dashboard(bundle)
    plan = report_plan(bundle) if plan is None else plan
    if not plan.complete:
        return dashboard(bundle, windows=plan.windows)
    if not plan.windows:  # a trace without spans (only counters or memory rows): nothing to embed
        return dashboard(bundle)
    layout = dashboard(bundle)
    embed_packed(layout, packed_trace(bundle, plan), plan)
    return layout


def embed_packed(layout: LayoutDOM, packed: str, plan: ReportPlan) -> None:
    """Replace what the timeline in `layout` embeds by the `packed` reply of a complete plan, unpacked in the
    browser once the plot is laid out (see `UNPACK`)."""
    source = layout.select_one({"name": SPANS_SOURCE})
    remote = layout.select_one({"name": REMOTE})
    plot = layout.select_one({"name": TIMELINE_PLOT})
    windows = layout.select_one({"name": WINDOWS})
    if source is None or remote is None or plot is None:
        return  # a note instead of a timeline
    source.data = {key: [] for key in source.data}
    source.tags = []
    if windows is not None:
        windows.data = {"left": [float(w[0]) for w in plan.windows], "right": [float(w[1]) for w in plan.windows],
                        "label": [w[2] for w in plan.windows]}
    status = next((t for t in plot.above if isinstance(t, Title)), None)
    plot.js_on_change("inner_width", CustomJS(args={"remote": remote, "packed": packed, "status": status or plot.title},
                                              code=UNPACK))
