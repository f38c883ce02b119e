"""Readable lane names for the timeline: `python main thread`, `stream 7 (compute, copy)`, never `thread -1`.

A track (`workbench.trace` contract) names where an event ran: `cpu/thread 25738`, `cuda:0/stream 7`. The
timeline labels its lanes for people: a host thread by its process and role (the thread whose id is the
process id is the main thread) or by the name the trace gives it, a device stream by what runs on it
(kernels: compute; memcpy: copy; memset), a thread id that is no Linux id (Kineto writes some as negative
32-bit numbers) as its unsigned value, and a lane named by hashed ids (Kineto's marker lanes) by its names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench.trace import Trace

STREAM_ROLES = (("kernel", "compute"), ("memcpy", "copy"), ("memset", "memset"))
"""What a device stream does, by the kinds of its events, in the order the label lists them."""

_THREAD = re.compile(r"(?:pid (?P<pid>.*)/)?thread (?P<tid>.*)")
_GENERIC_THREAD_NAME = re.compile(r"thread -?\d+( \(.*\))?")
"""Kineto's automatic thread names (`thread 25738 (python)`): no better than the id."""


def lane_names(trace: Trace, lane_table: pd.DataFrame) -> list[str]:
    """One label per row of `lane_table` (`workbench.analysis.timeline.lanes` of `trace`), without the device."""
    events = trace.events
    frame = pd.DataFrame({"track": events["track"].to_pandas(), "kind": events["kind"].to_pandas(),
                          "pid": events["pid"].to_numpy(), "tid": events["tid"].to_numpy()})
    by_track = frame.groupby("track", observed=True, sort=False)
    first = by_track[["pid", "tid"]].first()
    kinds = {str(track): set(map(str, group.unique())) for track, group in by_track["kind"]}
    metadata = trace.metadata
    labels = []
    for row in lane_table.itertuples(index=False):
        if row.device != "cpu":
            labels.append(stream_label(row.label, kinds.get(row.track, set())))
        elif row.track in first.index:
            labels.append(thread_label(row.label, int(first.at[row.track, "pid"]), int(first.at[row.track, "tid"]),
                                       metadata))
        else:
            labels.append(row.label)
    return labels


def stream_label(label: str, kinds: set[str]) -> str:
    """A device lane's label with what runs on it: `stream 7 (compute, copy)`; kept when it says so already."""
    roles = [role for kind, role in STREAM_ROLES if kind in kinds]
    if not roles or "(" in label:
        return label
    return f"{label} ({', '.join(roles)})"


def thread_label(label: str, pid: int, tid: int, metadata: Mapping[str, Any]) -> str:
    """A host lane's label from its track label (`thread 25738`, `pid P/thread T`) and the trace metadata's
    `processes` and `threads` names."""
    match = _THREAD.fullmatch(label)
    if match is None:
        return label  # a label given by the reader (XSpace lines): already a name
    pid_text, tid_text = match["pid"], match["tid"]
    if not tid_text.lstrip("-").isdigit():  # named ids: Kineto's marker lanes
        thread, process = tid_text.strip('"'), (pid_text or "").strip('"')
        if not thread:
            return f"{process} markers" if process else "unnamed markers"
        return f"{thread} ({process})" if process and process != thread else thread
    process = _name(metadata.get("processes"), str(pid))
    thread = _name(metadata.get("threads"), f"{pid}/{tid}")
    where = f" (pid {pid})" if pid_text else ""  # the track names the process when several have threads
    if thread and thread != process and not _GENERIC_THREAD_NAME.fullmatch(thread):
        return thread + where
    if tid == pid and tid > 0:
        return (f"{process} main thread" if process else "main thread") + where
    shown = tid if tid >= 0 else tid & 0xFFFFFFFF
    return (f"{process} thread {shown}" if process else f"thread {shown}") + where


def _name(table: Any, key: str) -> str:
    """The stripped `name` of `table[key]` in the trace metadata, '' when absent."""
    entry = table.get(key) if isinstance(table, Mapping) else None
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return str(name).strip() if name else ""
