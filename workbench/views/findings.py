"""The findings panel: ranked bottleneck findings, the evidence of the selected one, and device idle time.

It shows what `workbench analyze RUN` prints (`workbench.analysis.findings.bottlenecks.analyze_run`): one table row per
finding, largest time share first (kind, device, share, title, next step); selecting a row shows that
finding's suggestion and evidence (JSON) below the table, and, given the timeline's x-range, jumps the timeline to
the time range the finding's evidence names (`finding_range`); then the idle summary per device (busy and idle
time, largest gap: selecting a device jumps to its largest gap). Every text, evidence included, renders as text:
evidence holds op and kernel names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import CustomJS, Div, LayoutDOM, Range1d

from workbench.analysis.findings.bottlenecks import FINDING_COLUMNS
from workbench.views._table import MAX_TABLE_ROWS, data_table, rows_note

FINDINGS_TABLE = "findings table"
"""Bokeh `name` of the findings DataTable."""
EVIDENCE = "finding evidence"
"""Bokeh `name` of the Div showing the selected finding's evidence."""

FINDING_TABLE_COLUMNS = [("rank", "#", "0"), ("kind", "kind", None), ("device", "device", None),
                         ("time_share", "share", "0.0%"), ("title", "what", None), ("suggestion", "next step", None)]
IDLE_COLUMNS = [("device", "device", None), ("span_ms", "span ms", "0,0.000"), ("busy_ms", "busy ms", "0,0.000"),
                ("idle_ms", "idle ms", "0,0.000"), ("idle_share", "idle", "0.0%"),
                ("largest_gap_ms", "largest gap ms", "0,0.000"), ("largest_gap_at_ms", "at ms", "0,0.000"),
                ("gaps", "gaps", "0,0")]

_SHOW_EVIDENCE = """
const i = source.selected.indices[0]
div.text = i == null ? hint : source.data.detail[i]
"""

_JUMP_TO_RANGE = """
const i = source.selected.indices[0];
if (i == null || xr == null) return;
const start = source.data.range_start_ns[i], end = source.data.range_end_ns[i];
if (!isFinite(start) || !isFinite(end)) return;
const pad = Math.max((end - start) * 0.1, 1000);
xr.setv({start: start - pad, end: end + pad});
"""


def findings_panel(findings: pd.DataFrame | Sequence[Mapping[str, Any]],
                   idle: Mapping[str, Mapping[str, int | None]] | None = None, *, scope: str = "",
                   width: int = 1200, x_range: Range1d | None = None) -> LayoutDOM:
    """The panel of `findings` (a `findings_table` DataFrame, or the "findings" records of `analyze`) and
    `idle` (`analyze`'s "idle": per device, `DeviceBusy.summary()`); `scope` says what time they cover. Given
    the timeline's `x_range`, selecting a finding or a device jumps the timeline to its time range."""
    frame = pd.DataFrame(list(findings) if not isinstance(findings, pd.DataFrame) else findings,
                         columns=list(FINDING_COLUMNS))
    where = f" ({scope})" if scope else ""
    parts: list[LayoutDOM] = []
    if frame.empty:
        parts.append(Div(text=f"No findings{where}: no detector found a bottleneck.", render_as_text=True,
                         width=width))
    else:
        table_frame = pd.DataFrame({
            "rank": np.arange(1, len(frame) + 1),
            "kind": frame["kind"].astype(str).to_numpy(dtype=object),
            "device": np.array(["" if pd.isna(d) else str(d) for d in frame["device"]], dtype=object),
            "time_share": pd.to_numeric(frame["time_share"], errors="coerce").to_numpy(dtype=np.float64),
            "title": frame["title"].fillna("").astype(str).to_numpy(dtype=object),
            "suggestion": frame["suggestion"].fillna("").astype(str).to_numpy(dtype=object),
            "detail": [_detail(row) for row in frame.itertuples(index=False)],
        })
        ranges = [finding_range(evidence) for evidence in frame["evidence"]]
        table = data_table(table_frame, FINDING_TABLE_COLUMNS, width=width, height=min(40 + 28 * len(frame), 360),
                           widths={"rank": 30, "kind": 130, "device": 70, "time_share": 60, "title": 480,
                                   "suggestion": 520}, name=FINDINGS_TABLE)
        table.source.add(table_frame["detail"].tolist(), "detail")  # shown in the evidence box, not as a column
        _add_ranges(table.source, ranges, x_range)
        hint = "Select a finding to see its next step and evidence."
        evidence = Div(text=table_frame["detail"].iloc[0], render_as_text=True, width=width, name=EVIDENCE,
                       styles={"white-space": "pre-wrap", "font-family": "monospace", "font-size": "12px",
                               "max-height": "360px", "overflow": "auto", "border": "1px solid #ddd",
                               "padding": "4px"})
        table.source.selected.indices = [0]
        table.source.selected.js_on_change("indices", CustomJS(
            args={"source": table.source, "div": evidence, "hint": hint}, code=_SHOW_EVIDENCE))
        jumps = " and jump the timeline to it" if x_range is not None and any(ranges) else ""
        parts += [Div(text=f"{len(frame)} findings{where}, largest share of time first; select one to see its "
                           f"evidence{jumps}", render_as_text=True, width=width), table, evidence]
    parts.append(idle_table(idle or {}, width=width, x_range=x_range))
    return column(*parts)


def idle_table(idle: Mapping[str, Mapping[str, int | None]], *, width: int = 1200,
               x_range: Range1d | None = None) -> LayoutDOM:
    """Per device: span, busy and idle time, idle share, the largest gap and where it starts; a note when
    the trace has no device work (a CPU-only run has no device idle time). Given the timeline's `x_range`,
    selecting a device jumps the timeline to its largest gap."""
    if not idle:
        return Div(text="Device idle time: no device work in this trace (the CPU is no device here).",
                   render_as_text=True, width=width)
    devices = len(idle)
    if devices > MAX_TABLE_ROWS:  # the busiest devices, as the table embeds only so many rows
        idle = dict(sorted(idle.items(), key=lambda item: -(item[1].get("busy_ns") or 0))[:MAX_TABLE_ROWS])
    rows = [{"device": str(device),
             "span_ms": _ms(summary.get("span_ns")), "busy_ms": _ms(summary.get("busy_ns")),
             "idle_ms": _ms(summary.get("idle_ns")),
             "idle_share": (summary.get("idle_ns") or 0) / max(summary.get("span_ns") or 0, 1),
             "largest_gap_ms": _ms(summary.get("largest_gap_ns")),
             "largest_gap_at_ms": _ms(summary.get("largest_gap_start_ns")),
             "gaps": summary.get("gaps")}
            for device, summary in idle.items()]
    jump = "; select a device to see its largest gap in the timeline" if x_range is not None else ""
    heading = Div(text="Device idle time (on the union of each device's work; the device_idle finding's "
                       f"evidence splits it by cause){jump}{rows_note(devices, 'devices, the busiest,')}",
                  render_as_text=True, width=width)
    table = data_table(pd.DataFrame(rows), IDLE_COLUMNS, width=width, height=40 + 28 * min(len(rows), 20))
    _add_ranges(table.source, [_gap_range(summary) for summary in idle.values()], x_range)
    return column(heading, table)


def finding_range(evidence: Any) -> tuple[int, int] | None:
    """The time range [start, end) ns a finding's evidence points at: its largest gap, its longest stretch, the
    first listed item with a start and a length, else the span it covers; None when it names no time."""
    if not isinstance(evidence, Mapping):
        return None
    gap = _gap_range(evidence)
    if gap is not None:
        return gap
    stretch = evidence.get("longest_stretch")
    if isinstance(stretch, Mapping) and _interval(stretch):
        return _interval(stretch)
    for value in evidence.values():
        items = value if isinstance(value, list) else []
        for item in items:
            if isinstance(item, Mapping) and _interval(item):
                return _interval(item)
    start, end = evidence.get("span_start_ns"), evidence.get("span_end_ns")
    return (int(start), int(end)) if _number(start) and _number(end) and end > start else None


def _interval(item: Mapping[str, Any]) -> tuple[int, int] | None:
    """[start, end) of a record with `start_ns` and one of `end_ns`, `dur_ns`, `ns`."""
    start = item.get("start_ns")
    if not _number(start):
        return None
    if _number(item.get("end_ns")):
        return int(start), int(item["end_ns"])
    length = next((item[key] for key in ("dur_ns", "ns") if _number(item.get(key))), None)
    return None if length is None else (int(start), int(start + length))


def _gap_range(summary: Mapping[str, Any]) -> tuple[int, int] | None:
    start, length = summary.get("largest_gap_start_ns"), summary.get("largest_gap_ns")
    return (int(start), int(start + length)) if _number(start) and _number(length) else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool) \
        and bool(np.isfinite(value))


def _add_ranges(source: Any, ranges: list[tuple[int, int] | None], x_range: Range1d | None) -> None:
    """Add each row's time range to a table's source (NaN for none) and jump `x_range` to it on selection."""
    source.add([np.nan if r is None else float(r[0]) for r in ranges], "range_start_ns")
    source.add([np.nan if r is None else float(r[1]) for r in ranges], "range_end_ns")
    if x_range is not None:
        source.selected.js_on_change("indices", CustomJS(args={"source": source, "xr": x_range},
                                                         code=_JUMP_TO_RANGE))


def _detail(finding: Any) -> str:
    """The evidence box's text for one finding: its title, next step and evidence as indented JSON."""
    evidence = json.dumps(finding.evidence, indent=1, ensure_ascii=False, default=_plain)
    return f"{finding.kind}: {finding.title}\n\nnext step: {finding.suggestion}\n\nevidence: {evidence}"


def _plain(value: Any) -> Any:
    """JSON for what `json` cannot write itself (numpy scalars and arrays; anything else as its text)."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    return str(value)


def _ms(ns: int | float | None) -> float:
    return np.nan if ns is None else float(ns) / 1e6
