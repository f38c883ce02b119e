"""The dependency graph of one step behind `workbench.analysis.critical_path`: its nodes and edges, each node's
binding edge, a topological order, and the longest path under duration factors.

Bounded: the events overlapping one step's window, at most `MAX_STEP_EVENTS`. The edges and their timing are
described in `workbench.analysis.critical_path`; the syncs read here are Kineto's and nsys's sync records and the
CUDA/HIP sync, copy and memset calls.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.critical_path_threads import Chain, handoffs
from workbench.errors import WorkbenchError
from workbench.trace import Trace
from workbench.trace.schema import DEVICE_KINDS

SEGMENT_KINDS = ("cpu op", "untraced", "launch latency", "kernel", "memcpy", "memset", "wait", "thread handoff")
"""Kinds of the path's segments: a host event's own time, host time in no traced event, the time from a launch
(or from the stream's previous work) to a device event's start, device work, waits on other work, and the time a
thread took to start work another thread handed it or to resume when that work was done."""

SEGMENT_COLUMNS = ("kind", "name", "row", "start_ns", "dur_ns", "share")
"""Columns of `CriticalPath.segments`: `row` is the event's row in the trace's events (-1 for untraced time)."""

BY_NAME_COLUMNS = ("kind", "name", "segments", "path_ns", "share", "device_ns", "device_share")
"""Columns of `CriticalPath.by_name`."""


MAX_STEP_EVENTS = 500_000
"""Most events a step may have for its critical path (the graph walk is Python-paced: about 1 s per 100k events)."""
_CHAIN, _SPAN, _STREAM, _LAUNCH, _WAIT, _ORIGIN, _SINK = range(7)  # edge classes; lower wins a tie for binding
_KIND = {kind: code for code, kind in enumerate(SEGMENT_KINDS)}
_STREAM_LABEL = re.compile(r"/stream (-?\d+)$")
_DEVICE_INDEX = re.compile(r":(\d+)$")
_SYNC_ALL = re.compile(r"(?:cuda|hip)(?:Device|Ctx)Synchronize")
_SYNC_STREAM_OR_EVENT = re.compile(r"(?:cuda|hip)(?:Stream|Event)Synchronize")
_COPY_CALL = re.compile(r"(?:cuda|hip)Mem(?:cpy|set)", re.IGNORECASE)
QUEUE_FULL = "Command Buffer Full"
"""CUPTI's overhead record (nsys keeps it) of a launch that blocked on a full device queue: it waits, like a sync,
until device work finishes."""
_RECORD_NAMES = {"stream sync": "stream", "context sync": "all", "event sync": "event",
                 "stream wait event": "wait", "stream wait sync": "nsys wait"}
"""Sync records (lower-cased names) and what their call waits on."""



class StepGraph:
    """The step's dependency graph: nodes (0 the source; 1 + 2k and 2 + 2k the start and end of event k), edges with
    their class, the event they are attributed to and their segment kind, and each node's binding edge."""

    def __init__(self, trace: Trace, start_ns: int, end_ns: int, step_row: int) -> None:
        self.start_ns, self.end_ns = start_ns, end_ns
        cols = trace.events.select(["start_ns", "dur_ns", "name", "kind", "device", "track", "pid", "corr",
                                    "parent"]).to_pandas()
        begin, finish = cols["start_ns"].to_numpy(), (cols["start_ns"] + cols["dur_ns"]).to_numpy()
        inside = ((begin < end_ns) & (finish > start_ns)) | ((begin >= start_ns) & (begin < end_ns))
        rows = np.flatnonzero(inside)
        if len(rows) > MAX_STEP_EVENTS:
            raise WorkbenchError(f"the step has {len(rows)} events, more than the critical path's "
                                 f"{MAX_STEP_EVENTS}: pick a shorter step")
        ev = cols.iloc[rows]
        kind, device, track = (ev[c].astype(str).to_numpy() for c in ("kind", "device", "track"))
        on_host = (device == "cpu") & ~ev["track"].astype(str).str.contains("/async ", regex=False).to_numpy()
        on_device = np.isin(kind, list(DEVICE_KINDS)) & (device != "cpu")
        records = rows[_sync_record(ev["name"].astype(str).str.lower().to_numpy(), ev["corr"].to_numpy())]
        keep = on_host | on_device
        self.rows = rows[keep]
        if not len(self.rows):
            raise WorkbenchError(f"no events in the step [{start_ns:,}, {end_ns:,}) ns: no critical path to draw")
        self.name = ev["name"].astype(str).to_numpy()[keep]
        self.kind, self.device, self.track = kind[keep], device[keep], track[keep]
        self.on_device = on_device[keep]
        self.pid, self.corr = ev["pid"].to_numpy()[keep], ev["corr"].to_numpy()[keep]
        self.start = np.maximum(ev["start_ns"].to_numpy()[keep], start_ns)
        self.end = np.maximum(finish[rows][keep], self.start)
        n = len(self.rows)
        self.ts = np.zeros(2 * n + 2, dtype=np.int64)
        self.ts[0] = start_ns
        self.ts[1:2 * n + 1:2], self.ts[2:2 * n + 2:2] = self.start, self.end
        self.edges: list[tuple[int, int, int, int, int]] = []  # (src, dst, class, attributed event, segment kind)
        self.host_parent = np.full(n, -1, dtype=np.int64)
        self.push_order: list[int] = []
        self.dropped = 0
        step_k = int(np.searchsorted(self.rows, step_row)) if step_row >= 0 else -1
        self.sink = 2 + 2 * step_k if 0 <= step_k < n and self.rows[step_k] == step_row else 2 * n + 1
        self.ts[2 * n + 1] = end_ns
        self._host_chains(ev["parent"].to_numpy()[keep])
        self._device_streams()
        self._launches_and_waits(trace, records)
        self._close()

    # --- construction ---------------------------------------------------------------------------------------------

    def _host_chains(self, parent_rows: np.ndarray) -> None:
        """Per thread, the boundaries of its events in nesting order, each to the next (the innermost open event's
        own time); times made non-decreasing along the chain (overlapping siblings start when the last ends)."""
        parent = np.searchsorted(self.rows, parent_rows)
        parent = np.where((parent_rows >= 0) & (parent < len(self.rows))
                          & (self.rows[np.minimum(parent, len(self.rows) - 1)] == parent_rows), parent, -1)
        host = np.flatnonzero(~self.on_device)
        order = host[np.lexsort((self.rows[host], -(self.end[host] - self.start[host]), self.start[host],
                                 self.track[host]))]
        virtual_sink = self.sink == len(self.ts) - 1
        chains: list[Chain] = []
        for _, members in pd.Series(order).groupby(self.track[order], sort=False):
            chain: list[tuple[int, int]] = []  # (node, event open after it)
            stack: list[int] = []
            for k in members.tolist():
                while stack and stack[-1] != parent[k]:  # close what does not enclose k
                    done = stack.pop()
                    chain.append((2 + 2 * done, stack[-1] if stack else -1))
                self.host_parent[k] = stack[-1] if stack else -1
                self.push_order.append(k)
                stack.append(k)
                chain.append((1 + 2 * k, k))
            while stack:
                done = stack.pop()
                chain.append((2 + 2 * done, stack[-1] if stack else -1))
            nodes = np.array([c[0] for c in chain])
            self.ts[nodes] = np.maximum.accumulate(self.ts[nodes])
            chains.append((int(self.pid[members.iloc[0]]), nodes, np.array([c[1] >= 0 for c in chain])))
            self.edges.append((0, chain[0][0], _ORIGIN, -1, _KIND["untraced"]))
            for (a, open_k), (b, _) in pairwise(chain):
                self.edges.append((a, b, _CHAIN, open_k, _KIND["cpu op"] if open_k >= 0 else _KIND["untraced"]))
            if virtual_sink:
                self._to_sink(nodes)
        self._handoffs(chains)

    def _handoffs(self, chains: list[Chain]) -> None:
        """Fork and join edges between threads of one process (`critical_path_threads.handoffs`): the fork carries
        the burst's first event, the join the event the idle thread waited in."""
        for fork_from, burst_first, burst_last, resume in handoffs(self.ts, chains):
            self._edge(fork_from, burst_first, _WAIT, (burst_first - 1) // 2, _KIND["thread handoff"])
            self._edge(burst_last, resume, _WAIT, self._open_event(fork_from), _KIND["thread handoff"])

    def _open_event(self, node: int) -> int:
        """The host event a thread is in right after `node` (the event itself at its start, its parent at its end;
        -1 for none)."""
        k = (node - 1) // 2
        return k if node % 2 == 1 else int(self.host_parent[k])

    def _to_sink(self, nodes: np.ndarray) -> None:
        """An edge from a track's last node at or before the step's end to the virtual sink."""
        done = nodes[self.ts[nodes] <= self.end_ns]
        if len(done):
            self.edges.append((int(done[-1]), self.sink, _SINK, -1, _KIND["untraced"]))

    def _device_streams(self) -> None:
        """Each device event's span, and stream order: its stream's previous work end to its start (where they do not
        overlap)."""
        work = np.flatnonzero(self.on_device)
        order = work[np.lexsort((self.rows[work], self.start[work], self.track[work]))]
        stream_kind = {k: _KIND[k] if k in _KIND else _KIND["kernel"] for k in set(self.kind[order].tolist())}
        for _, members in pd.Series(order).groupby(self.track[order], sort=False):
            ks = members.to_numpy()
            for k in ks.tolist():
                self.edges.append((1 + 2 * k, 2 + 2 * k, _SPAN, k, stream_kind[self.kind[k]]))
            for a, b in zip(ks[:-1].tolist(), ks[1:].tolist(), strict=True):
                if self.end[a] <= self.start[b]:
                    self.edges.append((2 + 2 * a, 1 + 2 * b, _STREAM, b, _KIND["launch latency"]))
                else:
                    self.dropped += 1
            if self.sink == len(self.ts) - 1:
                self._to_sink(2 + 2 * ks[np.argsort(self.end[ks], kind="stable")])

    def _launches_and_waits(self, trace: Trace, records: np.ndarray) -> None:
        """Launch edges (runtime call → its device work by correlation id) and the waits of sync calls."""
        calls = np.flatnonzero(~self.on_device & (self.kind == "runtime") & (self.corr >= 0))
        work = np.flatnonzero(self.on_device)
        launch = _match(self.pid[work], self.corr[work], self.pid[calls], self.corr[calls], calls)
        for k, call in zip(work.tolist(), launch.tolist(), strict=True):
            if call >= 0:
                self._edge(1 + 2 * call, 1 + 2 * k, _LAUNCH, k, _KIND["launch latency"])
        self.launch_ts = np.full(len(self.rows), np.iinfo(np.int64).min, dtype=np.int64)  # before the step: unknown
        self.launch_ts[work[launch >= 0]] = self.start[launch[launch >= 0]]
        self.process = self.pid.copy()
        self.process[work[launch >= 0]] = self.pid[launch[launch >= 0]]
        keys = np.array([_stream_key(d, t) for d, t in zip(self.device, self.track, strict=True)],
                        dtype=np.int64).reshape(-1, 2)  # (0, 2) for a step with no event
        self.device_no, self.stream_no = keys[:, 0], keys[:, 1]
        waits = _records(trace, records)
        by_corr = {(int(p), int(c)): w for p, c, w in waits}
        by_corr_only = {int(c): w for _, c, w in waits}
        foreign = ~np.isin(self.process, np.unique(self.pid[~self.on_device]))  # launched by no process seen here
        own_work = pd.Series(work[launch >= 0]).groupby(launch[launch >= 0]).agg(list).to_dict()
        for c in calls.tolist():
            name = self.name[c]
            record = by_corr.get((int(self.pid[c]), int(self.corr[c]))) or by_corr_only.get(int(self.corr[c]))
            syncs = record is not None or _SYNC_ALL.search(name) or _SYNC_STREAM_OR_EVENT.search(name)
            if syncs:
                mine = work[(self.process[work] == self.pid[c]) | foreign[work]]
                if record is None:
                    self._sync(c, 2 + 2 * c, mine, {"what": "all"})
                elif record["what"] == "wait":
                    self._stream_wait(c, record, mine)
                elif record["what"] in ("stream", "event", "all"):
                    self._sync(c, self._waiting_node(c, record["row"]), mine, record)
            elif _COPY_CALL.search(name):
                for k in own_work.get(c, []):
                    if self.end[k] <= self.end[c]:
                        self._edge(2 + 2 * k, 2 + 2 * c, _WAIT, c, _KIND["wait"])
        for k in np.flatnonzero(~self.on_device & (self.name == QUEUE_FULL)).tolist():
            self._sync(k, 2 + 2 * k, work[(self.process[work] == self.pid[k]) | foreign[work]], {"what": "all"})

    def _waiting_node(self, call: int, record_row: int) -> int:
        """The node a sync call's waits lead into: the end of its sync record where the record is a host event
        nested in it (nsys's, which spans the wait), else the call's end."""
        k = int(np.searchsorted(self.rows, record_row))
        nested = k < len(self.rows) and self.rows[k] == record_row and not self.on_device[k] \
            and self.start[call] <= self.start[k] and self.end[k] <= self.end[call]
        return 2 + 2 * k if nested else 2 + 2 * call

    def _sync(self, call: int, into: int, work: np.ndarray, record: dict[str, Any]) -> None:
        """Wait edges into a sync call (node `into`): from each stream's (or the record's stream's, or the recorded
        event's) last work launched before the call that ended before it returned."""
        if record["what"] == "event":
            target = self._recorded(work, record)
            targets = [target] if target >= 0 and self.ts[2 + 2 * target] <= self.ts[into] else []
        else:
            wanted = work if record["what"] == "all" else self._on_stream(work, record["stream"])
            done = wanted[(self.launch_ts[wanted] < self.start[call]) & (self.end[wanted] <= self.ts[into])]
            targets = []
            for track in np.unique(self.track[done]).tolist():
                on = done[self.track[done] == track]
                targets.append(int(on[np.argmax(self.end[on])]))
        for k in targets:
            self._edge(2 + 2 * k, into, _WAIT, call, _KIND["wait"])

    def _stream_wait(self, call: int, record: dict[str, Any], work: np.ndarray) -> None:
        """A stream-wait-event: the recorded work's end → the first work launched on the waiting stream after the
        call."""
        source = self._recorded(work, record)
        waiting = self._on_stream(work, record["stream"])
        waiting = waiting[self.launch_ts[waiting] >= self.start[call]]
        if source < 0 or not len(waiting):
            return
        first = int(waiting[np.lexsort((self.start[waiting], self.launch_ts[waiting]))[0]])
        self._edge(2 + 2 * source, 1 + 2 * first, _WAIT, call, _KIND["wait"])

    def _recorded(self, work: np.ndarray, record: dict[str, Any]) -> int:
        """The last work launched on the record's `wait_on_stream` before its event record call (-1 if unknown)."""
        at = np.flatnonzero((self.corr == record.get("record_corr", -2)) & ~self.on_device)
        if not len(at):
            return -1
        on = self._on_stream(work, record["wait_on"])
        on = on[self.launch_ts[on] < self.start[at[0]]]
        return int(on[np.argmax(self.launch_ts[on])]) if len(on) else -1

    def _on_stream(self, work: np.ndarray, stream: tuple[int, int]) -> np.ndarray:
        """The work on a record's (device, stream): by stream number, on that device where the device has the stream
        (nsys records can name another device number than the kernels do; stream numbers are the process's own)."""
        on = work[self.stream_no[work] == stream[1]]
        same = on[self.device_no[on] == stream[0]]
        return same if len(same) else on

    def _edge(self, src: int, dst: int, cls: int, attr: int, kind: int) -> None:
        """A launch or wait edge, dropped (and counted) when it runs against the clocks."""
        if self.ts[src] > self.ts[dst]:
            self.dropped += 1
        else:
            self.edges.append((src, dst, cls, attr, kind))

    def _close(self) -> None:
        """Source edges into nodes nothing else reaches, each node's binding edge and weight, and a topological
        order."""
        n_nodes = len(self.ts)
        has_in = np.zeros(n_nodes, dtype=bool)
        has_in[[e[1] for e in self.edges]] = True
        for node in np.flatnonzero(~has_in[1:]).tolist():
            node += 1
            if node == n_nodes - 1 and self.sink != node:
                continue  # the unused virtual sink
            k = (node - 1) // 2
            if node % 2 == 1:  # a start nothing reaches: device work launched before the step
                self.edges.append((0, node, _ORIGIN, -1, _KIND["wait"] if self.on_device[k] else _KIND["untraced"]))
        e = np.array(self.edges, dtype=np.int64).reshape(-1, 5)
        self.src, self.dst, self.cls, self.attr, self.seg_kind = (e[:, i] for i in range(5))
        pick = np.lexsort((self.cls, -self.ts[self.src], self.dst))
        first = np.ones(len(pick), dtype=bool)
        first[1:] = self.dst[pick][1:] != self.dst[pick][:-1]
        self.binding = np.full(n_nodes, -1, dtype=np.int64)
        self.binding[self.dst[pick[first]]] = pick[first]
        self.weight = np.zeros(len(e), dtype=np.float64)
        bound = pick[first]
        self.weight[bound] = np.maximum(self.ts[self.dst[bound]] - self.ts[self.src[bound]], 0)
        self.order = _topological(self.ts, self.src, self.dst)
        by_dst = np.argsort(self.dst, kind="stable")
        self.in_ptr = np.searchsorted(self.dst[by_dst], np.arange(n_nodes + 1))
        self.in_edges = by_dst

    # --- queries --------------------------------------------------------------------------------------------------

    def factors(self, speedups: Mapping[str | int, float]) -> np.ndarray:
        """Per edge, the factor its weight is divided by for `speedups` (see `CriticalPath.what_if`)."""
        own = np.ones(len(self.rows), dtype=np.float64)
        named = np.zeros(len(self.rows), dtype=bool)
        for key, factor in speedups.items():
            if not isinstance(factor, int | float) or isinstance(factor, bool) or not math.isfinite(factor) \
                    or factor <= 0:
                raise WorkbenchError(f"speedup of {key!r} must be a positive number (2 halves its time), "
                                     f"not {factor!r}")
            hit = self.name == key if isinstance(key, str) else self.rows == key
            if not hit.any():
                raise WorkbenchError(f"no event {'named ' if isinstance(key, str) else 'at row '}{key!r} in this "
                                     "step: name an op or kernel of the step, or give its row")
            own[hit], named[hit] = float(factor), True
        for k in self.push_order:  # parents before children: an op's factor reaches the ops nested in it
            p = self.host_parent[k]
            if not named[k] and p >= 0:
                own[k] = own[p]
        per_edge = np.ones(len(self.src), dtype=np.float64)
        scaled = ((self.cls == _CHAIN) | (self.cls == _SPAN)) & (self.attr >= 0)
        per_edge[scaled] = own[self.attr[scaled]]
        return per_edge

    def times(self, factors: np.ndarray | None = None) -> np.ndarray:
        """Each node's time with the binding weights divided by `factors` (the observed times without)."""
        weight = self.weight if factors is None else self.weight / factors
        t = np.full(len(self.ts), -np.inf)
        t[0] = float(self.ts[0])
        src, w, ptr, edges = self.src.tolist(), weight.tolist(), self.in_ptr.tolist(), self.in_edges.tolist()
        tl = t.tolist()
        for v in self.order.tolist():
            best = tl[v]
            for i in range(ptr[v], ptr[v + 1]):
                e = edges[i]
                candidate = tl[src[e]] + w[e]
                if candidate > best:
                    best = candidate
            tl[v] = best
        return np.asarray(tl)

    def length(self, factors: np.ndarray | None = None) -> int:
        """The longest path from the source to the sink (ns)."""
        t = self.times(factors)
        return round(t[self.sink] - t[0])

    def segments(self) -> pd.DataFrame:
        """The binding edges from the source to the sink with a weight, as `SEGMENT_COLUMNS` rows in time order;
        consecutive pieces of one event's time are merged."""
        path = []
        node = self.sink
        while node > 0 and self.binding[node] >= 0:
            path.append(int(self.binding[node]))
            node = int(self.src[self.binding[node]])
        path = [e for e in reversed(path) if self.weight[e] > 0]
        merged: list[list[Any]] = []
        for e in path:
            kind, attr = int(self.seg_kind[e]), int(self.attr[e])
            start, dur = int(self.ts[self.src[e]]), int(self.weight[e])
            if merged and merged[-1][0] == kind and merged[-1][1] == attr and attr >= 0 \
                    and merged[-1][2] + merged[-1][3] == start:
                merged[-1][3] += dur
            else:
                merged.append([kind, attr, start, dur])
        total = max(sum(m[3] for m in merged), 1)
        return pd.DataFrame({
            "kind": [SEGMENT_KINDS[m[0]] for m in merged],
            "name": [self.name[m[1]] if m[1] >= 0 else _UNNAMED[SEGMENT_KINDS[m[0]]] for m in merged],
            "row": np.array([self.rows[m[1]] if m[1] >= 0 else -1 for m in merged], dtype=np.int64),
            "start_ns": np.array([m[2] for m in merged], dtype=np.int64),
            "dur_ns": np.array([m[3] for m in merged], dtype=np.int64),
            "share": np.array([m[3] / total for m in merged], dtype=np.float64),
        }, columns=list(SEGMENT_COLUMNS))

    def device_time(self) -> dict[str, int]:
        """Device time in the step per name of device work (clipped to the step's start)."""
        work = np.flatnonzero(self.on_device)
        totals = pd.Series(self.end[work] - self.start[work]).groupby(self.name[work]).sum()
        return {str(k): int(v) for k, v in totals.items()}

    def segment_devices(self, segments: pd.DataFrame) -> np.ndarray:
        """Per segment, the device of its event ("cpu" for host events, "" for untraced time)."""
        at = np.searchsorted(self.rows, segments["row"].to_numpy())
        at = np.minimum(at, max(len(self.rows) - 1, 0))
        return np.where(segments["row"].to_numpy() >= 0, self.device[at] if len(self.rows) else "", "")


_UNNAMED = {"untraced": "(untraced host time)", "wait": "(work before the step)", "cpu op": "", "kernel": "",
            "memcpy": "", "memset": "", "launch latency": "", "thread handoff": "(resuming after another thread)"}


def _sync_record(lower_names: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """Which rows are sync records (`_RECORD_NAMES`) with a correlation id."""
    return np.isin(lower_names, list(_RECORD_NAMES)) & (corr >= 0)


def _records(trace: Trace, rows: np.ndarray) -> list[tuple[int, int, dict[str, Any]]]:
    """(pid, corr, what its call waits on) per sync record: {"what": stream|event|all|wait|nsys wait, "stream" and
    "wait_on" ((device index, stream number), -1 for what the record does not name), "record_corr" (the event record
    call's correlation id, -2 if none), "row" (the record's own)}. A stream sync or stream wait that names no stream
    is left out (a stream sync's call then waits on all streams)."""
    if not len(rows):
        return []
    out = []
    table = trace.events.take(rows).select(["name", "pid", "corr", "device", "args"]).to_pylist()
    for row, r in zip(rows.tolist(), table, strict=True):
        try:
            args = json.loads(r["args"] or "{}")
        except ValueError:
            args = {}
        args = args if isinstance(args, dict) else {}
        device = args.get("device", args.get("deviceId"))
        if not isinstance(device, int):
            match = _DEVICE_INDEX.search(str(r["device"]))
            device = int(match[1]) if match else -1
        stream, wait_on = args.get("stream", args.get("streamId")), args.get("wait_on_stream")
        record_corr = args.get("wait_on_cuda_event_record_corr_id")
        out.append((int(r["pid"]), int(r["corr"]), {
            "what": _RECORD_NAMES[str(r["name"]).lower()],
            "stream": (device, stream if isinstance(stream, int) else -1),
            "wait_on": (device, wait_on if isinstance(wait_on, int) else -1),
            "record_corr": record_corr if isinstance(record_corr, int) else -2, "row": row}))
    return [(p, c, w) for p, c, w in out if w["what"] not in ("stream", "wait") or w["stream"][1] >= 0]


def _stream_key(device: str, track: str) -> tuple[int, int]:
    """(device index, stream number) of a device track (`<device>/stream N`); -1 for what the labels do not say."""
    stream = _STREAM_LABEL.search(track)
    index = _DEVICE_INDEX.search(device)
    return int(index[1]) if index else -1, int(stream[1]) if stream else -1


def _match(pid: np.ndarray, corr: np.ndarray, ref_pid: np.ndarray, ref_corr: np.ndarray,
           ref_rows: np.ndarray) -> np.ndarray:
    """Per (pid, corr), the ref row with the same pid and corr, else the one with the same corr (device work's
    pid is the device's in Kineto, the process's in nsys); -1 if none."""
    exact = {(int(p), int(c)): int(r) for p, c, r in zip(ref_pid, ref_corr, ref_rows, strict=True)}
    loose: dict[int, int] = {}
    for c, r in zip(ref_corr.tolist(), ref_rows.tolist(), strict=True):
        loose.setdefault(int(c), int(r))
    return np.array([exact.get((int(p), int(c)), loose.get(int(c), -1)) if c >= 0 else -1
                     for p, c in zip(pid, corr, strict=True)], dtype=np.int64)


def _topological(ts: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Nodes in an order where every edge goes forward, earliest time first among the ready ones (Kahn). Every
    edge runs forward in time, so no cycle is expected; were one left by equal times, its earliest node goes
    first."""
    n = len(ts)
    indegree = np.bincount(dst, minlength=n).tolist()
    by_src = np.argsort(src, kind="stable")
    ptr = np.searchsorted(src[by_src], np.arange(n + 1)).tolist()
    out_dst = dst[by_src].tolist()
    times = ts.tolist()
    ready = [(times[v], v) for v in range(n) if indegree[v] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    placed = [False] * n
    while len(order) < n:
        if not ready:  # a cycle of equal times: release its earliest node
            v = min((v for v in range(n) if not placed[v]), key=lambda v: (times[v], v))
            indegree[v] = 0
            heapq.heappush(ready, (times[v], v))
        _, v = heapq.heappop(ready)
        if placed[v]:
            continue
        placed[v] = True
        order.append(v)
        for i in range(ptr[v], ptr[v + 1]):
            w = out_dst[i]
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, (times[w], w))
    return np.asarray(order, dtype=np.int64)
