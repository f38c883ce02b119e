"""Graph-replayed kernels of a serving trace, attributed to the ops that launched them when the graph was captured.

vLLM and SGLang run their decode steps (and vLLM the pieces of a PIECEWISE model) as CUDA/HIP graph replays: the
execution trace holds one `cudaGraphLaunch`/`hipGraphLaunch` runtime call and the kernels it replays (they carry
its correlation id), with no op around them. A trace profiled while the engine captured its graphs (the engines
write one per rank: `capture_traces/` beside the execution trace) holds, between each `…StreamBeginCapture` and
`…StreamEndCapture` call, the launch calls that built the graph's nodes, nested in the ops, modules and Python
frames that made them; the kernels themselves do not run there.

The key: a replayed kernel's position among its graph launch's kernels (start order) is the position of its launch
call among the captured graph's kernel launches (call order). No finer key exists in these traces: Kineto on ROCm
writes no `graph id`/`graph node id` on either side, and a launch call's correlation id is not the replay's. The
position is checked: the capture's launch calls name their kernel (arg `kernel`), and a kernel whose name is not the
captured one at its position is unmatched (`matched` false, no op): mismatches are counted, never guessed. A capture
whose launch calls name no kernel (CUDA's) cannot be checked and is refused, and so is one that leaves most replayed
kernels unmatched: it holds other graphs (another model, batch size or graph mode).

Which graph a launch replays: the first captured graph, from the one after the previous launch's on (cyclically, in
capture order), whose kernel names are the launch's; with none, the graph at that place, compared kernel by kernel.
So the pieces of a PIECEWISE step, identical layers included, pair with the graphs captured in the same order, and
a trace of several steps starts over at each step's first piece.

One row per replayed kernel, in launch then start order: | row | graph_launch_row | graph_id | node | dur_ns | op |
op_row_in_capture | op_path | capture_kernel | matched |. `row` is the kernel's row and `graph_launch_row` the
runtime call's in the execution trace's events; `graph_id` the captured graph's number in capture order (0-based,
counting the graphs that launch a kernel); `node` the kernel's position in it; `op` the innermost op around the
launch call in the capture trace (else its annotation, else its Python frame) and `op_row_in_capture` that op's row
there; `op_path` the ops, annotations and `nn.Module` frames around it and its own name, outermost first, joined
with " > " (at most `PATH_CHARS` characters: the outer names give way to a leading "…"). `op`, `op_row_in_capture`
and `op_path` are null where `matched` is false; `capture_kernel` is null past the end of the captured graph.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.timeline import dictionary_codes
from workbench.errors import TraceFormatError
from workbench.trace import Trace
from workbench.trace.columns import lookup
from workbench.trace.launches import enclosing

GRAPH_KERNELS_SCHEMA = pa.schema([
    ("row", pa.int64()), ("graph_launch_row", pa.int64()), ("graph_id", pa.int64()), ("node", pa.int64()),
    ("dur_ns", pa.int64()), ("op", pa.string()), ("op_row_in_capture", pa.int64()), ("op_path", pa.string()),
    ("capture_kernel", pa.string()), ("matched", pa.bool_()),
])
"""Columns of the `graph_kernels` table."""

PATH_CHARS = 400
"""Longest `op_path`: a longer one keeps its inner names after a leading "… > "."""

_SEPARATOR = " > "
_MODULE_FRAME = "nn.Module: "


class _Events:
    """The columns of an events table that the join reads, names and kinds decoded."""

    def __init__(self, trace: Trace) -> None:
        events = trace.events
        codes, names = dictionary_codes(events["name"])
        kind_codes, kinds = dictionary_codes(events["kind"])
        self.names, self.name_codes = names, codes
        self.kind = kinds[kind_codes]
        self.args = events["args"]
        self.start, self.dur, self.pid, self.tid, self.corr, self.parent = (
            events[c].to_numpy() for c in ("start_ns", "dur_ns", "pid", "tid", "corr", "parent"))
        self.file = trace.metadata.get("source", {}).get("file") or "trace"

    def runtime_named(self, part: str) -> np.ndarray:
        """Rows of the runtime calls whose name contains `part`."""
        hits = np.flatnonzero([part in str(name) for name in self.names])
        return np.flatnonzero((self.kind == "runtime") & np.isin(self.name_codes, hits))


class _Capture:
    """The kernel launches of a capture trace's graphs, in graph then call order."""

    def __init__(self, trace: Trace) -> None:
        ev = _Events(trace)
        self.file = ev.file
        rows, graph, self.names = _captured_launches(ev)
        if not len(rows):
            raise TraceFormatError(ev.file, "no graph capture with kernel launches that name their kernel (a "
                                            "…StreamBeginCapture…StreamEndCapture span holding launch calls with a "
                                            "`kernel` arg): not a graph-capture trace, or one that names no kernel")
        self.size = np.bincount(graph)
        self.offset = np.concatenate([[0], np.cumsum(self.size)[:-1]])
        self.op_row = _launching_op(ev, rows)
        self.op = np.where(self.op_row >= 0, ev.names[ev.name_codes[np.maximum(self.op_row, 0)]], None)
        self.op_path = _paths(ev, self.op_row)
        self.by_names: dict[tuple[str, ...], list[int]] = {}
        for g in range(len(self.size)):
            self.by_names.setdefault(self.graph_names(g), []).append(g)

    def graph_names(self, graph: int) -> tuple[str, ...]:
        """The kernel names of one captured graph, in launch order."""
        return tuple(self.names[self.offset[graph]:self.offset[graph] + self.size[graph]])

    def choose(self, names: tuple[str, ...], cursor: int) -> int:
        """The graph a launch of kernels `names` replays (see the module docstring), from `cursor` on."""
        same = self.by_names.get(names)
        if not same:
            return cursor % len(self.size)
        at = bisect_left(same, cursor % len(self.size))
        return same[at] if at < len(same) else same[0]


def _captured_launches(ev: _Events) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The launch calls (runtime calls with a `kernel` arg) inside a capture span of their thread, in graph then
    start order: their rows, the number of each one's graph (in capture order, counting the graphs that launch a
    named kernel), and the kernels they name."""
    begins, ends = ev.runtime_named("StreamBeginCapture"), ev.runtime_named("StreamEndCapture")
    named = pc.fill_null(pc.match_substring(ev.args, '"kernel"'), False).to_numpy(zero_copy_only=False)
    launches = np.flatnonzero((ev.kind == "runtime") & named)
    rows, spans = [], []  # per thread: the launch rows in a span, and their span as (begin time, thread number)
    for thread, (pid, tid) in enumerate(sorted({(int(ev.pid[r]), int(ev.tid[r])) for r in begins})):
        own_begins = np.sort(ev.start[begins[(ev.pid[begins] == pid) & (ev.tid[begins] == tid)]])
        own_ends = np.sort(ev.start[ends[(ev.pid[ends] == pid) & (ev.tid[ends] == tid)]])
        closing = np.searchsorted(own_ends, own_begins, side="right")
        closed = closing < len(own_ends)
        own_begins, own_ends = own_begins[closed], own_ends[closing[closed]]
        own = launches[(ev.pid[launches] == pid) & (ev.tid[launches] == tid)]
        slot = np.searchsorted(own_begins, ev.start[own], side="left") - 1
        inside = (slot >= 0) & (ev.start[own] < own_ends[np.maximum(slot, 0)])
        rows.append(own[inside])
        spans.append(np.column_stack([own_begins[slot[inside]], np.full(inside.sum(), thread)]))
    if not rows:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=object)
    rows_at, span = np.concatenate(rows), np.concatenate(spans)
    order = np.lexsort((rows_at, ev.start[rows_at], span[:, 1], span[:, 0]))
    rows_at, span = rows_at[order], span[order]
    names = np.asarray([_kernel_arg(text) for text in ev.args.take(rows_at).to_pylist()], dtype=object)
    named = names != None  # noqa: E711 (elementwise)
    return rows_at[named], np.unique(span[named], axis=0, return_inverse=True)[1].ravel(), names[named]


def _kernel_arg(text: str) -> str | None:
    """The `kernel` arg of a launch call's args JSON (None where it has none)."""
    value = json.loads(text).get("kernel")
    return value if isinstance(value, str) else None


def _launching_op(ev: _Events, rows: np.ndarray) -> np.ndarray:
    """Per launch call, its innermost enclosing op, else annotation, else its parent (a Python frame; -1 if none)."""
    op = enclosing(ev.parent[rows], ev.parent, ev.kind == "op")
    bare = op < 0
    op[bare] = enclosing(ev.parent[rows[bare]], ev.parent, ev.kind == "annotation")
    bare = op < 0
    op[bare] = ev.parent[rows[bare]]
    return op


def _paths(ev: _Events, rows: np.ndarray) -> np.ndarray:
    """Per row, the names of its enclosing ops, annotations and `nn.Module` frames and its own, outermost first,
    joined and cut to `PATH_CHARS`. Each ancestor's path is built once, so the cost follows the rows visited."""
    memo: dict[int, tuple[str, ...]] = {-1: ()}

    def ancestry(row: int) -> tuple[str, ...]:
        chain = []
        while row not in memo:
            chain.append(row)
            row = int(ev.parent[row])
        for r in reversed(chain):
            name = str(ev.names[ev.name_codes[r]])
            shown = ev.kind[r] in ("op", "annotation", "module") or name.startswith(_MODULE_FRAME)
            memo[r] = (*memo[int(ev.parent[r])], name) if shown else memo[int(ev.parent[r])]
        return memo[chain[0] if chain else row]

    return np.asarray([_bounded((*ancestry(int(ev.parent[r])), str(ev.names[ev.name_codes[r]]))) if r >= 0 else None
                       for r in rows], dtype=object)


def _bounded(names: tuple[str, ...]) -> str:
    """`names` joined, the outer ones giving way to a leading "…" where they would pass `PATH_CHARS`."""
    text = _SEPARATOR.join(names)
    if len(text) <= PATH_CHARS:
        return text
    inner_first = [_SEPARATOR + name for name in reversed(names)]
    keep = int(np.searchsorted(np.cumsum([len(part) for part in inner_first]), PATH_CHARS - 1, side="right"))
    if not keep:
        return "…" + names[-1][-(PATH_CHARS - 1):]
    return "…" + "".join(reversed(inner_first[:keep]))


def graph_kernels(execution: Trace, capture: Trace) -> pa.Table | None:
    """The `graph_kernels` table (see the module docstring) of the kernels `execution`'s graph launches replay,
    attributed through `capture`; None when `execution` launches no graph. Raises TraceFormatError naming the capture
    file when it holds no graph capture, or when most replayed kernels match none it captured."""
    captured = _Capture(capture)
    ev = _Events(execution)
    launches = ev.runtime_named("GraphLaunch")
    launches = launches[ev.corr[launches] >= 0]
    kernels = np.flatnonzero(ev.kind == "kernel")
    by = lookup(ev.corr[kernels], ev.corr[launches], launches)
    kernels, by = kernels[by >= 0], by[by >= 0]
    if not len(kernels):
        return None
    order = np.lexsort((kernels, ev.start[kernels], by, ev.start[by]))
    kernels, by = kernels[order], by[order]
    first = np.flatnonzero(np.concatenate([[True], by[1:] != by[:-1]]))
    node = np.arange(len(kernels)) - np.repeat(first, np.diff(np.append(first, len(kernels))))
    names = ev.names[ev.name_codes[kernels]]
    graph = np.empty(len(kernels), dtype=np.int64)
    cursor = 0
    for begin, end in zip(first.tolist(), [*first[1:].tolist(), len(kernels)], strict=True):
        chosen = captured.choose(tuple(names[begin:end]), cursor)
        graph[begin:end] = chosen
        cursor = chosen + 1
    inside = node < captured.size[graph]
    at = np.where(inside, captured.offset[graph] + node, 0)
    capture_kernel = np.where(inside, captured.names[at], None)
    matched = inside & (capture_kernel == names)
    if 2 * int(matched.sum()) < len(kernels):
        sizes = ", ".join(str(int(n)) for n in captured.size[:8]) + (", …" if len(captured.size) > 8 else "")
        raise TraceFormatError(captured.file, f"does not capture the graphs of {ev.file}: only {int(matched.sum())} "
                                              f"of its {len(kernels)} replayed kernels ({len(first)} graph launches, "
                                              f"first {names[0]!r}) are the kernel launched at their place in the "
                                              f"{len(captured.size)} captured graphs (of {sizes} kernels)")
    return pa.table({
        "row": kernels, "graph_launch_row": by, "graph_id": graph, "node": node, "dur_ns": ev.dur[kernels],
        "op": np.where(matched, captured.op[at], None),
        "op_row_in_capture": pa.array(captured.op_row[at], mask=~matched),
        "op_path": np.where(matched, captured.op_path[at], None), "capture_kernel": capture_kernel, "matched": matched,
    }, schema=GRAPH_KERNELS_SCHEMA)


def graph_kernels_summary(table: pa.Table | None, top: int = 10) -> dict[str, Any] | None:
    """The headline of a `graph_kernels` table (`workbench show`): how many graph launches and replayed kernels,
    how many matched, and per op (the `top` by kernel time, most first) its kernel count and summed kernel ns;
    `other_ops` sums the rest. None without a table or rows."""
    if table is None or not table.num_rows:
        return None
    matched = table.filter(table["matched"])
    per_op = matched.group_by("op").aggregate([("dur_ns", "count"), ("dur_ns", "sum")])
    ns = per_op["dur_ns_sum"].to_numpy()
    order = np.lexsort((per_op["op"].to_numpy(zero_copy_only=False), -ns))
    ops = [{"op": per_op["op"][int(i)].as_py(), "kernels": per_op["dur_ns_count"][int(i)].as_py(),
            "kernel_ns": int(ns[i])} for i in order]
    rest = ops[top:]
    return {"graph_launches": len(pc.unique(table["graph_launch_row"])), "kernels": table.num_rows,
            "matched": matched.num_rows, "kernel_ns": int(pc.sum(table["dur_ns"]).as_py()),
            "unmatched_ns": int(pc.sum(table["dur_ns"]).as_py()) - int(ns.sum()), "by_op": ops[:top],
            "other_ops": {"ops": len(rest), "kernels": sum(o["kernels"] for o in rest),
                          "kernel_ns": sum(o["kernel_ns"] for o in rest)}}
