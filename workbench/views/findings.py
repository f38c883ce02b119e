"""The findings panel: ranked bottleneck findings, the evidence of the selected one, and device idle time.

It shows what `workbench analyze RUN` prints (`workbench.analysis.bottlenecks.analyze_run`): one table row per
finding, largest time share first (kind, device, share, title, next step); selecting a row shows that
finding's suggestion and evidence (JSON) below the table; then the idle summary per device (busy and idle
time, largest gap). Every text, evidence included, renders as text: evidence holds op and kernel names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import column
from bokeh.models import CustomJS, Div, LayoutDOM

from workbench.analysis.bottlenecks import FINDING_COLUMNS
from workbench.views._table import data_table

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


def findings_panel(findings: pd.DataFrame | Sequence[Mapping[str, Any]],
                   idle: Mapping[str, Mapping[str, int | None]] | None = None, *, scope: str = "",
                   width: int = 1200) -> LayoutDOM:
    """The panel of `findings` (a `findings_table` DataFrame, or the "findings" records of `analyze`) and
    `idle` (`analyze`'s "idle": per device, `DeviceBusy.summary()`); `scope` says what time they cover."""
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
        table = data_table(table_frame, FINDING_TABLE_COLUMNS, width=width, height=min(40 + 28 * len(frame), 360),
                           widths={"rank": 30, "kind": 130, "device": 70, "time_share": 60, "title": 480,
                                   "suggestion": 520}, name=FINDINGS_TABLE)
        table.source.add(table_frame["detail"].tolist(), "detail")  # shown in the evidence box, not as a column
        hint = "Select a finding to see its next step and evidence."
        evidence = Div(text=table_frame["detail"].iloc[0], render_as_text=True, width=width, name=EVIDENCE,
                       styles={"white-space": "pre-wrap", "font-family": "monospace", "font-size": "12px",
                               "max-height": "360px", "overflow": "auto", "border": "1px solid #ddd",
                               "padding": "4px"})
        table.source.selected.indices = [0]
        table.source.selected.js_on_change("indices", CustomJS(
            args={"source": table.source, "div": evidence, "hint": hint}, code=_SHOW_EVIDENCE))
        parts += [Div(text=f"{len(frame)} findings{where}, largest share of time first; select one to see its "
                           "evidence", render_as_text=True, width=width), table, evidence]
    parts.append(idle_table(idle or {}, width=width))
    return column(*parts)


def idle_table(idle: Mapping[str, Mapping[str, int | None]], *, width: int = 1200) -> LayoutDOM:
    """Per device: span, busy and idle time, idle share, the largest gap and where it starts; a note when
    the trace has no device work (a CPU-only run has no device idle time)."""
    if not idle:
        return Div(text="Device idle time: no device work in this trace (the CPU is no device here).",
                   render_as_text=True, width=width)
    rows = [{"device": str(device),
             "span_ms": _ms(summary.get("span_ns")), "busy_ms": _ms(summary.get("busy_ns")),
             "idle_ms": _ms(summary.get("idle_ns")),
             "idle_share": (summary.get("idle_ns") or 0) / max(summary.get("span_ns") or 0, 1),
             "largest_gap_ms": _ms(summary.get("largest_gap_ns")),
             "largest_gap_at_ms": _ms(summary.get("largest_gap_start_ns")),
             "gaps": summary.get("gaps")}
            for device, summary in idle.items()]
    heading = Div(text="Device idle time (on the union of each device's work; the device_idle finding's "
                       "evidence splits it by cause)", render_as_text=True, width=width)
    return column(heading, data_table(pd.DataFrame(rows), IDLE_COLUMNS, width=width, height=40 + 28 * len(rows)))


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
