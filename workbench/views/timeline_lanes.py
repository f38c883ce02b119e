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

import numpy as np
import pandas as pd

from workbench.analysis.timeline import dictionary_codes, first_rows
from workbench.trace import Trace

STREAM_ROLES = (("kernel", "compute"), ("memcpy", "copy"), ("memset", "memset"))
"""What a device stream does, by the kinds of its events, in the order the label lists them."""

_THREAD = re.compile(r"(?:pid (?P<pid>.*)/)?thread (?P<tid>.*)")
_GENERIC_THREAD_NAME = re.compile(r"thread -?\d+( \(.*\))?")
"""Kineto's automatic thread names (`thread 25738 (python)`): no better than the id."""


def lane_names(trace: Trace, lane_table: pd.DataFrame) -> list[str]:
    """One label per row of `lane_table` (`workbench.analysis.timeline.lanes` of `trace`), without the device;
    a folded lane keeps its label ("1,200 more threads"). Reads a few codes per event, never a Python object
    per event or per track."""
    events = trace.events
    track_codes, track_names = dictionary_codes(events["track"])
    kind_codes, kind_names = dictionary_codes(events["kind"])
    first = first_rows(track_codes, len(track_names))
    code_of_track = {name: code for code, name in enumerate(track_names)}
    pairs = np.unique(track_codes * len(kind_names) + kind_codes) if len(kind_names) else np.zeros(0, np.int64)
    pid, tid, metadata = events["pid"], events["tid"], trace.metadata
    labels = []
    for row in lane_table.itertuples(index=False):
        code = code_of_track.get(row.track)
        if code is None or first[code] >= len(track_codes):  # a folded lane, or no event on the track
            labels.append(row.label)
        elif row.device != "cpu":
            held = pairs[(pairs >= code * len(kind_names)) & (pairs < (code + 1) * len(kind_names))]
            labels.append(stream_label(row.label, {str(kind_names[k % len(kind_names)]) for k in held}))
        else:
            at = int(first[code])
            labels.append(thread_label(row.label, int(pid[at].as_py()), int(tid[at].as_py()), metadata))
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
