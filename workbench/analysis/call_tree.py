"""The call tree of host spans over a time window, and the device work grouped by the op that launched it.

Pure functions over a `Trace` returning DataFrames (the flame graph of `workbench.views.flame` draws them). They
read the Arrow columns as numpy arrays: a node is a call path, built one nesting level at a time over whole
columns, never a Python object per event, so a trace of ten million events costs a few passes over its columns.

A host span's call path is the names of the host spans enclosing it on its thread, outermost first, then its own
(`parent` links the spans of one track; spans of other kinds between them, such as runtime calls, are skipped).
Its time in a window is its part inside the window (clipped), so a node's total is the time its calls spent in
the window and the totals of the top-level nodes add up to the host time the window holds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.timeline import STEP_NAME, dictionary_codes
from workbench.trace import Trace
from workbench.trace.columns import group_codes
from workbench.trace.launches import enclosing
from workbench.trace.schema import KINDS

HOST_KINDS = ("op", "annotation", "python")
"""Kinds of host span a call tree is built from by default: framework ops, annotations (record_function ranges,
the workbench's phases and steps) and Python frames, whichever a trace has."""

LAUNCHED_KINDS = ("kernel", "memcpy", "memset")
"""Kinds of device work `kernels_by_op` groups by default (not XLA modules, which hold their HLO ops' time)."""

MAX_NODES = 4_000
"""Call paths a call tree keeps by default: the heaviest; the rest of each parent's children become one
`OTHER` node (so what a flame graph draws follows the screen, not how many distinct paths a trace has)."""

OTHER = "other"
"""`kind` (and `name`) of a node standing for the children left out under a parent: their calls and their time,
their own children's inside it."""

HOST_DEVICE = "cpu"
"""`device` of host events in every reader."""

NO_LAUNCHER = "(launching op unknown)"
"""`op` of the device work whose launching host op the trace does not record."""

CALL_TREE_COLUMNS = ("node", "parent", "depth", "track", "name", "kind", "path", "count", "total_ns", "self_ns",
                     "offset_ns", "first_start_ns", "first_dur_ns")
"""Columns of `call_tree`, in order."""

KERNELS_BY_OP_COLUMNS = ("level", "op", "name", "kind", "launches", "calls", "device_ns", "share", "first_start_ns",
                         "first_dur_ns")
"""Columns of `kernels_by_op`, in order."""



def call_tree(trace: Trace, window: tuple[int, int] | None = None, *, kinds: tuple[str, ...] = HOST_KINDS,
              threads: bool = True, steps: bool = True, max_nodes: int = MAX_NODES) -> pd.DataFrame:
    """One row per call path of the host spans of `kinds` overlapping `window` ([start, end) ns; the whole trace when
    None), depth first, heaviest child first.

    | node | parent | depth | track | name | kind | path | count | total_ns | self_ns | offset_ns |
    | first_start_ns | first_dur_ns |

    `node` numbers the rows (0, 1, ...); `parent` is the node of the enclosing path (-1 at the top), `depth` 0 at
    the top, `path` the names from the top down joined by ";" (the collapsed-stack form of flame graph tools). With
    `threads` each track has paths of its own (`track` names it), else one path on several threads is one node
    (`track` ""). A track holding annotations alone (Kineto's range of the whole profiling session, a lane of
    markers) is left out while another holds ops or Python frames. With `steps` the iterations' spans
    (`ProfilerStep#7`, `step 3`: `workbench.analysis.timeline.STEP_NAME`) are one path, named with `*` for the
    number (`ProfilerStep#*`), so the steps' trees add up rather than stand side by side.

    `count` is the calls on the path, `total_ns` their time inside the window (an instant adds a call and no time),
    `self_ns` the total less its children's (never below 0, where spans overlap without nesting). `offset_ns` places
    a node in an icicle: the top-level nodes side by side (tracks busiest first, then heaviest first), each node's
    children from its own offset on, heaviest first, so a node spans [offset_ns, offset_ns + total_ns).
    `first_start_ns` and `first_dur_ns` are the whole extent of the path's first call (what a view jumps to). Past
    `max_nodes` paths the lightest go: each parent keeps its heaviest children and one `OTHER` node holds the calls
    and time of the rest.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown event kinds {unknown}: a call tree takes kinds of {list(KINDS)}")
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1, not {max_nodes}")
    events = trace.events
    start = events["start_ns"].to_numpy()
    end = start + events["dur_ns"].to_numpy()
    low, high = resolve_window(start, end, window)
    kind_codes, kind_names = dictionary_codes(events["kind"])
    device_codes, device_names = dictionary_codes(events["device"])
    track_codes, track_names = dictionary_codes(events["track"])
    host = np.isin(kind_names, list(kinds))[kind_codes] & (device_names == HOST_DEVICE)[device_codes]
    working = np.bincount(track_codes[host & np.isin(kind_names, ["op", "python"])[kind_codes]],
                          minlength=len(track_names)) > 0
    if working.any():  # leave out the tracks of annotations alone
        host &= working[track_codes]
    chosen = host & (start < high) & (np.maximum(end, start + 1) > low)
    rows = np.flatnonzero(chosen)
    if not len(rows):
        return pd.DataFrame(columns=list(CALL_TREE_COLUMNS))
    parent = events["parent"].to_numpy()
    position = np.full(len(start), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    above = enclosing(parent[rows], parent, chosen)  # the nearest chosen span enclosing each one
    up = np.where(above >= 0, position[np.maximum(above, 0)], -1)
    name_codes, names = dictionary_codes(events["name"])
    if steps:
        names, name_codes = _merged_steps(names, name_codes)
    track = track_codes[rows] if threads else np.zeros(len(rows), dtype=np.int64)
    node, depth = _path_nodes(up, name_codes[rows] * len(kind_names) + kind_codes[rows], track)
    clipped = np.maximum(np.minimum(end[rows], high) - np.maximum(start[rows], low), 0)
    order = np.lexsort((start[rows], node))  # by node, each node's earliest call first
    heads = np.flatnonzero(np.concatenate([[True], node[order][1:] != node[order][:-1]]))
    first = order[heads]  # position of each node's first call
    total = np.add.reduceat(clipped[order], heads)
    outer = np.where(up[first] >= 0, node[np.maximum(up[first], 0)], -1)
    children = np.zeros(len(first), dtype=np.int64)
    np.add.at(children, outer[outer >= 0], total[outer >= 0])
    nodes = pd.DataFrame({
        "parent": outer,
        "depth": depth[first],
        "track": track_names[track[first]] if threads else np.full(len(first), "", dtype=object),
        "name": names[name_codes[rows[first]]],
        "kind": kind_names[kind_codes[rows[first]]],
        "count": np.diff(np.append(heads, len(order))).astype(np.int64),
        "total_ns": total.astype(np.int64),
        "first_start_ns": start[rows[first]],
        "first_dur_ns": end[rows[first]] - start[rows[first]],
        "self_ns": np.maximum(total - children, 0).astype(np.int64),
    })
    return _depth_first(_bounded(nodes, max_nodes))


def _merged_steps(names: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The name dictionary and codes with every iteration's name (`STEP_NAME`) replaced by one with `*` for its
    number: the distinct names are rewritten, never the rows' names one by one."""
    values = pa.array(names, pa.string())
    step = pc.match_substring_regex(values, f"^(?:{STEP_NAME.pattern})$", ignore_case=True)
    merged = pc.if_else(step, pc.replace_substring_regex(values, r"\d+", "*"), values).dictionary_encode()
    return np.asarray(merged.dictionary.to_pylist(), dtype=object), merged.indices.to_numpy().astype(np.int64)[codes]


def resolve_window(start: np.ndarray, end: np.ndarray, window: tuple[int, int] | None) -> tuple[int, int]:
    """[low, high) ns of `window`, or of the whole trace (its first start to its last end) when None; a clear
    error for an empty or reversed window."""
    if window is None:
        if not len(start):
            return 0, 1
        return int(start.min()), max(int(end.max()), int(start.min()) + 1)
    low, high = int(window[0]), int(window[1])
    if high <= low:
        raise ValueError(f"the window [{low}, {high}) ns is empty: its end must come after its start")
    return low, high


def _path_nodes(up: np.ndarray, labels: np.ndarray, tracks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The call-path node and depth of every span: spans with the same enclosing node, track and label (a code of
    name and kind) share a node. Nodes are numbered a level at a time, the top first, so they come by depth."""
    depth = _levels(up)
    node = np.full(len(up), -1, dtype=np.int64)
    order = np.argsort(depth, kind="stable")
    made = 0
    for members in np.split(order, np.flatnonzero(np.diff(depth[order])) + 1):
        outer = up[members]
        parent_node = np.where(outer >= 0, node[np.maximum(outer, 0)], -1)
        codes, firsts = group_codes(parent_node, tracks[members], labels[members])
        node[members] = made + codes
        made += len(firsts)
    return node, depth


def _levels(up: np.ndarray) -> np.ndarray:
    """How many spans enclose each one (`up`: the enclosing span's position, -1 at the top), by pointer
    doubling: O(spans × log depth) however deep the nesting."""
    hops = (up >= 0).astype(np.int64)  # hops from each span to the one `jump` points at (or to the top)
    jump = up.copy()
    while (live := jump >= 0).any():
        target = np.maximum(jump, 0)
        hops = np.where(live, hops + hops[target], hops)
        jump = np.where(live, jump[target], -1)
    return hops


def _bounded(nodes: pd.DataFrame, max_nodes: int) -> pd.DataFrame:
    """Of the `max_nodes` heaviest nodes (shallower first on ties), those whose ancestors are all among them, plus
    one `OTHER` node per parent (or top level of a track) for the children left out; parents renumbered to rows."""
    if len(nodes) <= max_nodes:
        return nodes.reset_index(drop=True)
    rank = np.lexsort((np.arange(len(nodes)), nodes["depth"].to_numpy(), -nodes["total_ns"].to_numpy()))
    keep = np.zeros(len(nodes), dtype=bool)
    keep[rank[:max_nodes]] = True
    parent, depth = nodes["parent"].to_numpy(), nodes["depth"].to_numpy()
    for level in np.split(np.arange(len(nodes)), np.flatnonzero(np.diff(depth)) + 1)[1:]:
        keep[level] &= keep[np.maximum(parent[level], 0)]  # a node whose parent went, goes (rows are by depth)
    left = nodes[~keep & ((parent < 0) | keep[np.maximum(parent, 0)])]
    first = left.sort_values("first_start_ns", kind="stable").groupby(["parent", "track"], sort=False).head(1)
    grouped = left.groupby(["parent", "track"], sort=False)
    others = pd.DataFrame({"count": grouped["count"].sum(), "total_ns": grouped["total_ns"].sum(),
                           "depth": grouped["depth"].first()})
    others = others.join(first.set_index(["parent", "track"])[["first_start_ns", "first_dur_ns"]]).reset_index()
    others = others.assign(name=OTHER, kind=OTHER, self_ns=others["total_ns"])
    row = np.full(len(nodes), -1, dtype=np.int64)
    row[keep] = np.arange(int(keep.sum()))
    kept = nodes[keep].reset_index(drop=True)
    table = pd.concat([kept, others[kept.columns]], ignore_index=True)
    old_parent = table["parent"].to_numpy()
    table["parent"] = np.where(old_parent >= 0, row[np.maximum(old_parent, 0)], -1)
    return table


def _depth_first(nodes: pd.DataFrame) -> pd.DataFrame:
    """The nodes in depth-first order, numbered so, with their paths and icicle offsets (see `call_tree`). A walk
    over the nodes, which `max_nodes` bounds, never over events."""
    busy = nodes[nodes["parent"] < 0].groupby("track")["total_ns"].sum()
    track_rank = nodes["track"].map(busy.rank(ascending=False, method="first")).fillna(0).to_numpy()
    sibling_order = np.lexsort((nodes["name"].astype(str).to_numpy(), -nodes["total_ns"].to_numpy(), track_rank,
                                nodes["parent"].to_numpy()))
    children: dict[int, list[int]] = {}
    for i in sibling_order.tolist():
        children.setdefault(int(nodes["parent"].iat[i]), []).append(i)
    total, names = nodes["total_ns"].to_numpy(), nodes["name"].astype(str).tolist()
    order: list[int] = []
    offset = np.zeros(len(nodes), dtype=np.int64)
    path = [""] * len(nodes)
    stack = [(i, "") for i in reversed(children.get(-1, []))]
    cursor = 0
    for i in children.get(-1, []):  # top-level nodes side by side
        offset[i] = cursor
        cursor += int(total[i])
    while stack:
        i, prefix = stack.pop()
        order.append(i)
        path[i] = f"{prefix};{names[i]}" if prefix else names[i]
        at = int(offset[i])
        for child in children.get(i, []):
            offset[child] = at
            at += int(total[child])
        stack.extend((child, path[i]) for child in reversed(children.get(i, [])))
    new = np.empty(len(nodes), dtype=np.int64)
    new[order] = np.arange(len(order))
    table = nodes.iloc[order].reset_index(drop=True)
    old_parent = table["parent"].to_numpy()
    table["parent"] = np.where(old_parent >= 0, new[np.maximum(old_parent, 0)], -1)
    table["node"] = np.arange(len(table), dtype=np.int64)
    table["path"] = [path[i] for i in order]
    table["offset_ns"] = offset[order]
    for column in ("depth", "count", "total_ns", "self_ns", "first_start_ns", "first_dur_ns"):
        table[column] = table[column].astype(np.int64)
    return table[list(CALL_TREE_COLUMNS)]


def kernels_by_op(trace: Trace, window: tuple[int, int] | None = None, *,
                  kinds: tuple[str, ...] = LAUNCHED_KINDS) -> pd.DataFrame:
    """The device work of `kinds` grouped by the host op that launched it, then by its own name: a two-level tree
    as rows, each op (level 0) followed by its device work (level 1); ops by device time, most first.

    | level | op | name | kind | launches | calls | device_ns | share | first_start_ns | first_dur_ns |

    The launching op is the trace's `launcher` (the innermost op around the runtime call that launched it); device
    work without one is grouped under `NO_LAUNCHER`. Only work whose launching op starts inside `window` ([start,
    end) ns) counts, or that starts there itself when its launcher is unknown. `op` is the launching op's name on
    both levels, `name` the row's own (the op's, or the kernel's), `kind` its kind. `launches` counts device
    events, `calls` the distinct op calls that launched them (0 under `NO_LAUNCHER`), `device_ns` sums their
    durations (work on several streams at once adds up), `share` is the fraction of all of it in the table.
    `first_start_ns` and `first_dur_ns` are the extent of an op row's first launching call, or of a device row's
    first device event.
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown event kinds {unknown}: device work is of kinds {list(KINDS)}")
    events = trace.events
    start = events["start_ns"].to_numpy()
    dur = events["dur_ns"].to_numpy()
    kind_codes, kind_names = dictionary_codes(events["kind"])
    launcher = events["launcher"].to_numpy()
    rows = np.flatnonzero(np.isin(kind_names, list(kinds))[kind_codes])
    by = launcher[rows]
    anchor = np.where(by >= 0, start[np.maximum(by, 0)], start[rows])
    if window is not None:
        low, high = resolve_window(start, start + dur, window)
        inside = (anchor >= low) & (anchor < high)
        rows, by, anchor = rows[inside], by[inside], anchor[inside]
    if not len(rows):
        return pd.DataFrame(columns=list(KERNELS_BY_OP_COLUMNS))
    name_codes, names = dictionary_codes(events["name"])
    op_code = np.where(by >= 0, name_codes[np.maximum(by, 0)], -1)
    work = pd.DataFrame({"op": op_code, "name": name_codes[rows], "kind": kind_codes[rows], "launcher": by,
                         "dur": dur[rows], "start": start[rows], "op_start": anchor})
    ops = _launch_groups(work, ["op"], dur)
    device = _launch_groups(work, ["op", "name", "kind"], dur)
    op_names = np.append(names, NO_LAUNCHER)  # code -1 reads the last
    ops = ops.assign(level=0, name=op_names[ops["op"]], kind=kind_names[kind_codes[np.maximum(ops["first_op"], 0)]])
    ops.loc[ops["first_op"] < 0, "kind"] = ""
    device = device.assign(level=1, name=names[device["name"]], kind=kind_names[device["kind"]])
    ops["rank"] = ops["device_ns"].rank(ascending=False, method="first")
    device["rank"] = device["op"].map(ops.set_index("op")["rank"])
    table = pd.concat([ops, device], ignore_index=True)
    table = table.sort_values(["rank", "level", "device_ns"], ascending=[True, True, False], kind="stable")
    table["op"] = op_names[table["op"]]
    table["share"] = table["device_ns"] / max(int(ops["device_ns"].sum()), 1)
    for column in ("level", "launches", "calls", "device_ns", "first_start_ns", "first_dur_ns"):
        table[column] = table[column].astype(np.int64)
    return table.reset_index(drop=True)[list(KERNELS_BY_OP_COLUMNS)]


def _launch_groups(work: pd.DataFrame, keys: list[str], dur: np.ndarray) -> pd.DataFrame:
    """Per group of `keys`: launches, distinct launching calls, device time, and the first extent to jump to (the
    earliest launching call of an op group, the earliest device event of a device-work group; `dur` is the
    events' durations, for the launching calls')."""
    grouped = work.groupby(keys, sort=False)
    table = pd.DataFrame({"launches": grouped.size(), "device_ns": grouped["dur"].sum(),
                          "calls": work[work["launcher"] >= 0].groupby(keys, sort=False)["launcher"].nunique()})
    table["calls"] = table["calls"].fillna(0)
    if keys == ["op"]:  # jump to the op's first launching call (its first device event when none is known)
        earliest = work.sort_values(["op_start", "start"], kind="stable").groupby(keys, sort=False).head(1)
        earliest = earliest.set_index(keys).reindex(table.index)
        launched = earliest["launcher"] >= 0
        table["first_op"] = earliest["launcher"]
        table["first_start_ns"] = np.where(launched, earliest["op_start"], earliest["start"])
        table["first_dur_ns"] = np.where(launched, dur[np.maximum(earliest["launcher"], 0)], earliest["dur"])
    else:
        earliest = work.sort_values("start", kind="stable").groupby(keys, sort=False).head(1)
        earliest = earliest.set_index(keys).reindex(table.index)
        table["first_start_ns"] = earliest["start"]
        table["first_dur_ns"] = earliest["dur"]
    return table.reset_index()
