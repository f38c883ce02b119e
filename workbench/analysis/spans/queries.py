"""Windowed timeline queries over a run: the spans or density of a window, search, range aggregates.

One implementation, two transports: the Jupyter server's `runs/<id>/spans|search|aggregate|events`
routes send these functions' dicts as JSON, and a notebook calls them directly. docs/api-spans.md
is the contract (field names and meaning). Each answers from the run's open `SpanIndex`
(`workbench.analysis.spans.index.RUNS`), never by reading the whole trace again.

Level of detail (`window`): lanes are taken in increasing order of the events they hold in the
window; a lane gets its real spans while the running total stays within `max_spans`, the others get
one density bin per pixel. A window holding at most `max_spans` events is therefore all spans (the
rule of `workbench.views.timeline`), and the sparse lanes of a dense window keep their spans.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workbench.analysis.launch_facts import (
    LAUNCH_COLUMNS,
    LaunchLinks,
    call_stack_frame,
    events_launch_facts,
    facts_text,
    launch_facts,
    launch_rows,
)
from workbench.analysis.spans.index import RUNS, SpanIndex
from workbench.analysis.spans.lanes import IndexLane, TrackLane, drawn_lanes
from workbench.errors import BundleError, WorkbenchError
from workbench.trace.schema import DEVICE_KINDS
from workbench.trace.store.bundle import Bundle, json_safe

MAX_SPANS = 20_000
"""Real spans a window holds at most by default (the timeline's budget on every surface)."""
MAX_SPANS_LIMIT = 100_000
"""Largest `max_spans` a request may ask for."""
SHAPES_CHARS = 200
"""Input shapes longer than this are cut in a window's reply (some ops record thousands of characters)."""
MAX_LAUNCHES = 1_000
"""Launched events `event` lists at most."""

RunRef = Bundle | str | os.PathLike[str] | SpanIndex


class QueryError(WorkbenchError):
    """A query parameter out of its range or malformed (the server answers 400 with the message)."""


def open_run(run: RunRef) -> tuple[str, SpanIndex]:
    """The run id and open index of `run`: a Bundle, the path of a bundle folder, or an index itself."""
    if isinstance(run, SpanIndex):
        return run.path.parent.name, run
    folder = run.local_files() if isinstance(run, Bundle) else Path(run)
    events = folder / "events.parquet"
    if not events.is_file():
        raise BundleError(f"run {folder.name!r} has no trace: {events} does not exist")
    return (run.run_id if isinstance(run, Bundle) else folder.name), RUNS.get(events)


def window(run: RunRef, start_ns: int, end_ns: int, width_px: int, *, max_spans: int = MAX_SPANS,
           expand: int | None = None, offset: int = 0, launch: bool = False) -> dict[str, Any]:
    """The timeline of [start_ns, end_ns) drawn `width_px` pixels wide: per lane, real spans or density
    (see the module docstring and docs/api-spans.md for the fields). `expand` names a folded lane whose
    tracks are drawn as lanes of their own, `MAX_LANES` of them from the `offset`-th busiest
    (`workbench.analysis.spans.lanes`). `launch` adds each span's launch facts (a static report, which has
    no `event` route to ask): `launch` in a lane's spans indexes the reply's `launch` texts (-1: none; a text
    holds one line per fact, `workbench.analysis.launch_facts.facts_text`)."""
    start_ns, end_ns, width_px, max_spans = int(start_ns), int(end_ns), int(width_px), int(max_spans)
    if end_ns <= start_ns:
        raise QueryError(f"end_ns ({end_ns}) must be greater than start_ns ({start_ns})")
    if width_px < 1 or max_spans < 1:
        raise QueryError(f"width_px and max_spans must be positive, got {width_px} and {max_spans}")
    run_id, index = open_run(run)
    try:
        lanes = drawn_lanes(index, expand, int(offset))
    except ValueError as exc:
        raise QueryError(str(exc)) from exc
    counts = [lane.count(index, start_ns, end_ns) for lane in lanes]
    with_spans, total = set(), 0
    for i in sorted(range(len(lanes)), key=lambda i: (counts[i], i)):
        if total + counts[i] > max_spans:
            break
        total += counts[i]
        with_spans.add(i)
    bin_ns = (end_ns - start_ns) / width_px
    edges = start_ns + np.floor(np.arange(width_px + 1) * bin_ns).astype(np.int64)
    edges[-1] = end_ns
    names, shapes = _Vocabulary(len(index.names)), _Vocabulary(len(index.shape_values))
    out_lanes, texts = [], _LaunchTexts(index) if launch else None
    for i, lane in enumerate(lanes):
        entry = lane.info | {"in_window": counts[i]}
        if i in with_spans:
            positions = lane.overlapping(index, start_ns, end_ns)
            entry |= {"mode": "spans", "bins": None, "spans": _spans(index, positions, names, shapes)}
            if texts is not None:
                entry["spans"]["launch"] = texts.encode(index.row[positions])
        else:
            entry |= {"mode": "density", "spans": None, "bins": _bins(index, lane, edges, bin_ns, names)}
        out_lanes.append(entry)
    reply = {"run": run_id, "start_ns": start_ns, "end_ns": end_ns, "width_px": width_px, "bin_ns": bin_ns,
             "extent_ns": list(index.extent), "max_spans": max_spans, "events": int(sum(counts)), "spans": total,
             "names": names.values(index.names), "kinds": [str(k) for k in index.kinds],
             "shapes": shapes.values(index.shape_values, SHAPES_CHARS), "lanes": out_lanes}
    if texts is not None:
        reply["launch"] = texts.values
    if expand is not None:
        folded = int(index.lanes.iloc[expand]["tracks"])
        shown = sum(lane.info.get("parent") == expand for lane in lanes)
        reply["expanded"] = {"lane": int(expand), "offset": int(offset), "shown": shown, "tracks": folded}
    return reply


def search(run: RunRef, pattern: str, *, regex: bool = False, limit: int = 100,
           from_ns: int | None = None) -> dict[str, Any]:
    """Events whose name matches `pattern` over the whole run: their count and the first `limit` (from
    `from_ns` on) by start. A plain pattern is a case-insensitive substring; `regex` a Python regular
    expression searched in the name."""
    if not pattern:
        raise QueryError("q: the search text is empty")
    if limit < 1:
        raise QueryError(f"limit must be positive, got {limit}")
    try:
        matcher = re.compile(pattern if regex else re.escape(pattern), 0 if regex else re.IGNORECASE)
    except re.error as exc:
        raise QueryError(f"q: not a regular expression: {exc}") from exc
    run_id, index = open_run(run)
    matched_names = np.array([matcher.search(name) is not None for name in index.names], dtype=bool)
    hits = np.flatnonzero(matched_names[index.name]) if matched_names.any() else np.zeros(0, np.int64)
    count = len(hits)
    listed = hits if from_ns is None else hits[index.start[hits] >= from_ns]
    truncated = len(listed) > limit
    if truncated:
        listed = listed[np.argpartition(index.start[listed], limit - 1)[:limit]]
    listed = listed[np.lexsort((index.row[listed], index.start[listed]))]
    if truncated:  # ties at the cut: the partition kept an arbitrary subset of equal starts
        listed = listed[:limit]
    lanes = _lane_of(index, listed)
    matches = [{"row": int(index.row[p]), "start_ns": int(index.start[p]), "dur_ns": int(index.dur[p]),
                "lane": int(lane), "depth": int(index.depth[p]), "name": str(index.names[index.name[p]]),
                "kind": str(index.kinds[index.kind[p]])} for p, lane in zip(listed, lanes, strict=True)]
    return {"run": run_id, "q": pattern, "regex": bool(regex), "count": int(count),
            "names": int(np.count_nonzero(np.bincount(index.name[hits], minlength=len(index.names)))),
            "truncated": bool(truncated), "matches": matches}


def aggregate(run: RunRef, start_ns: int, end_ns: int, *, limit: int = 500) -> dict[str, Any]:
    """Count, total and self time per (name, kind) of the events overlapping [start_ns, end_ns), times clipped
    to the range; self time subtracts the clipped time of an event's direct children."""
    start_ns, end_ns = int(start_ns), int(end_ns)
    if end_ns <= start_ns:
        raise QueryError(f"end_ns ({end_ns}) must be greater than start_ns ({start_ns})")
    if limit < 1:
        raise QueryError(f"limit must be positive, got {limit}")
    run_id, index = open_run(run)
    picked = np.concatenate([index.overlapping(lane, start_ns, end_ns) for lane in range(len(index.lanes))]
                            or [np.zeros(0, np.int64)])
    picked.sort()
    if not len(picked):
        return {"run": run_id, "start_ns": start_ns, "end_ns": end_ns, "events": 0, "groups": 0, "truncated": False,
                "rows": []}
    starts = index.start[picked]
    clipped = np.minimum(starts + index.dur[picked], end_ns) - np.maximum(starts, start_ns)
    clipped = np.maximum(clipped, 0)
    parent_rows = index.parent[picked].astype(np.int64)
    has_parent = (parent_rows >= 0) & (parent_rows < index.size)
    parent_pos = index.position[parent_rows[has_parent]].astype(np.int64)
    at = np.searchsorted(picked, parent_pos)
    found = (at < len(picked)) & (picked[np.minimum(at, len(picked) - 1)] == parent_pos)
    children_ns = np.bincount(at[found], weights=clipped[has_parent][found], minlength=len(picked))
    self_ns = clipped - children_ns
    n_kinds = len(index.kinds)
    group = index.name[picked].astype(np.int64) * n_kinds + index.kind[picked]
    keys, inverse = np.unique(group, return_inverse=True)
    count = np.bincount(inverse, minlength=len(keys))
    total = np.bincount(inverse, weights=clipped, minlength=len(keys))
    own = np.bincount(inverse, weights=self_ns, minlength=len(keys))
    names = index.names[keys // n_kinds]
    order = np.lexsort((names.astype(str), -total))[:limit]
    rows = [{"name": str(names[g]), "kind": str(index.kinds[keys[g] % n_kinds]), "count": int(count[g]),
             "total_ns": round(float(total[g])), "self_ns": round(float(own[g]))} for g in order]
    return {"run": run_id, "start_ns": start_ns, "end_ns": end_ns, "events": len(picked), "groups": len(keys),
            "truncated": len(keys) > limit, "rows": rows}


def event(run: RunRef, row: int) -> dict[str, Any]:
    """Every column of event `row` (args parsed), its lane, its launcher, the device events it launched and, for
    device work, its launch facts (`workbench.analysis.launch_facts`: [field, value] pairs)."""
    run_id, index = open_run(run)
    if not 0 <= row < index.size:
        raise IndexError(f"run {run_id!r} has no event row {row} (it has {index.size})")
    events = pq.ParquetFile(index.path, memory_map=True)
    record = _record(events, row)
    position = int(index.position[row])
    launcher = int(index.launcher[position])
    launches = np.flatnonzero(index.launcher == row)[:MAX_LAUNCHES]
    linked = [index.position[launcher]] if 0 <= launcher < index.size else []
    facts = _launch_facts(index, events, record, launcher) if record.get("kind") in DEVICE_KINDS else []
    with contextlib.suppress(ValueError):  # args that are not JSON stay the text they are
        record["args"] = json.loads(record["args"]) if record.get("args") else {}
    return json_safe({"run": run_id, "row": row, **record, "lane": int(_lane_of(index, np.array([position]))[0]),
                      "launched_by": _brief(index, np.asarray(linked, dtype=np.int64)),
                      "launches": _brief(index, np.sort(launches)), "launch": [list(fact) for fact in facts]})


def _record(events: pq.ParquetFile, row: int, columns: list[str] | None = None) -> dict[str, Any]:
    """The columns (all by default) of row `row` of an events table, reading its row group only."""
    before = 0
    for group in range(events.metadata.num_row_groups):
        rows = events.metadata.row_group(group).num_rows
        if row < before + rows:
            return events.read_row_group(group, columns=columns).slice(row - before, 1).to_pylist()[0]
        before += rows
    raise IndexError(f"{events.metadata.num_rows} rows: no row {row}")


def _launch_facts(index: SpanIndex, events: pq.ParquetFile, record: dict[str, Any],
                  launcher: int) -> list[tuple[str, str]]:
    """The launch facts of device event `record`, its launching op and Python frame found through the index."""
    def parent_of(row: int) -> int:
        parent = int(index.parent[index.position[row]]) if 0 <= row < index.size else -1
        return parent if 0 <= parent < index.size else -1

    def kind_of(row: int) -> str:
        return str(index.kinds[index.kind[index.position[row]]])

    def name_of(row: int) -> str:
        return str(index.names[index.name[index.position[row]]])

    start = launcher if 0 <= launcher < index.size else -1
    op, frame = launch_rows(start, parent_of, kind_of)
    if frame >= 0:
        python = name_of(frame)
    else:
        python = call_stack_frame(_record(events, op, ["args"])["args"]) if op >= 0 else ""
    corr = record.get("corr")
    links = LaunchLinks(track=str(record.get("track") or ""), corr=-1 if corr is None else int(corr),
                        op=name_of(op) if op >= 0 else "", python_frame=python)
    return launch_facts(record.get("args"), links)


class _LaunchTexts:
    """The launch facts of a reply's spans as texts shared by index (kernels of one op repeat them): reads the
    events table's columns the facts need once, when first asked."""

    def __init__(self, index: SpanIndex) -> None:
        self._index = index
        self._table: pa.Table | None = None
        self._codes: dict[str, int] = {}
        self.values: list[str] = []

    def encode(self, rows: np.ndarray) -> list[int]:
        """For each event row, the index of its facts' text (-1 when it has none: no device work)."""
        device = np.isin(self._index.kinds[self._index.kind[self._index.position[rows]]], list(DEVICE_KINDS))
        out = np.full(len(rows), -1, dtype=np.int64)
        if not device.any():
            return out.tolist()
        if self._table is None:
            try:
                self._table = pq.read_table(self._index.path, columns=list(LAUNCH_COLUMNS), memory_map=True)
            except (OSError, pa.ArrowException) as exc:
                raise BundleError(f"{self._index.path}: cannot read the launch columns: {exc}") from exc
        picked = np.flatnonzero(device)
        for k, facts in zip(picked.tolist(), events_launch_facts(self._table, rows[picked]), strict=True):
            text = facts_text(facts)
            if text and text not in self._codes:
                self._codes[text] = len(self.values)
                self.values.append(text)
            out[k] = self._codes.get(text, -1)
        return out.tolist()


class _Vocabulary:
    """The codes of a dictionary of `size` entries that a reply uses, renumbered densely in order of first use."""

    def __init__(self, size: int) -> None:
        self._codes: list[int] = []
        self._table = np.full(size + 1, -1, dtype=np.int64)  # the last entry answers code -1 (none)

    def encode(self, codes: np.ndarray) -> list[int]:
        """`codes` (-1 for none) as indices into this reply's entries."""
        unique = np.unique(codes)
        new = unique[(unique >= 0) & (self._table[unique] < 0)]
        self._table[new] = np.arange(len(self._codes), len(self._codes) + len(new))
        self._codes += new.tolist()
        return self._table[codes].tolist()

    def values(self, dictionary: np.ndarray, clip: int | None = None) -> list[str]:
        """The used entries of `dictionary` in reply order, each cut to `clip` characters (an ellipsis marks a cut)."""
        texts = [str(dictionary[code]) for code in self._codes]
        return texts if clip is None else [t if len(t) <= clip else t[:clip - 1] + "…" for t in texts]


def _numbers(values: np.ndarray) -> list[float | None]:
    """Floats as a JSON-safe list: NaN (unknown) becomes null."""
    listed = values.astype(np.float64).tolist()
    unknown = np.flatnonzero(np.isnan(values))
    if len(unknown) == len(listed):
        return [None] * len(listed)
    for i in unknown.tolist():
        listed[i] = None
    return listed


def _spans(index: SpanIndex, positions: np.ndarray, names: _Vocabulary, shapes: _Vocabulary) -> dict[str, list]:
    """The `spans` arrays of a lane (positions in start order)."""
    flops = index.flops[positions]
    launcher = index.launcher[positions].astype(np.int64)
    linked = (launcher >= 0) & (launcher < index.size)
    launcher_name = np.full(len(positions), -1, dtype=np.int64)
    launcher_name[linked] = index.name[index.position[launcher[linked]]]
    return {"row": index.row[positions].tolist(), "start_ns": index.start[positions].tolist(),
            "dur_ns": index.dur[positions].tolist(), "depth": index.depth[positions].tolist(),
            "name": names.encode(index.name[positions]), "kind": index.kind[positions].tolist(),
            "shapes": shapes.encode(index.shapes[positions]),
            "flops": _numbers(flops),
            "launcher": launcher.tolist(), "launcher_name": names.encode(launcher_name),
            "launched": index.launched[positions].tolist()}


def _bins(index: SpanIndex, lane: IndexLane | TrackLane, edges: np.ndarray, bin_ns: float,
          vocabulary: _Vocabulary) -> dict[str, list]:
    """The `bins` arrays of a lane: per non-empty pixel, events starting there, busy fraction, and the
    name and kind of its longest work event (markers rank below any work)."""
    at = lane.starting(index, edges)
    count = np.diff(at)
    busy = np.minimum(lane.busy_ns(index, edges) / bin_ns, 1.0)
    shown = np.flatnonzero((count > 0) | (busy > 0))
    name = np.full(len(shown), -1, dtype=np.int64)
    kind = np.full(len(shown), -1, dtype=np.int64)
    started = shown[count[shown] > 0]
    if len(started):
        best = lane.longest(index, at, started)
        keep = np.isin(shown, started)
        name[keep], kind[keep] = index.name[best], index.kind[best]
    return {"bin": shown.tolist(), "count": count[shown].tolist(), "busy": np.round(busy[shown], 4).tolist(),
            "name": vocabulary.encode(name), "kind": kind.tolist()}


def _lane_of(index: SpanIndex, positions: np.ndarray) -> np.ndarray:
    """The lane of each position."""
    return np.searchsorted(index.lane_start, positions, side="right") - 1


def _brief(index: SpanIndex, positions: np.ndarray) -> list[dict[str, Any]]:
    """Short descriptions of the events at `positions` (for an event's launcher and launches)."""
    lanes = _lane_of(index, positions)
    return [{"row": int(index.row[p]), "name": str(index.names[index.name[p]]), "kind": str(index.kinds[index.kind[p]]),
             "start_ns": int(index.start[p]), "dur_ns": int(index.dur[p]), "lane": int(lane)}
            for p, lane in zip(positions.tolist(), lanes.tolist(), strict=True)]
