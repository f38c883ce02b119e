"""Memory analyses over a Trace's `memory` table: the allocated/reserved timeline, allocations paired
with their frees by address, and the live set at the peak. Pure and vectorized; nothing here plots.

Memory rows follow the Trace contract: `ts_ns, device, addr (-1 unknown), delta_bytes (+alloc, -free),
allocated_bytes, reserved_bytes (-1 unknown), event (row of the op active at that time, -1)`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.trace import Trace

BEFORE_TRACE = "(before trace)"
"""`op_name` of an allocation freed in the trace but made before it began (its allocating op is unknown)."""
NO_OP = "(no op)"
"""`op_name` of an allocation made while no op was running on the allocating thread."""

ALLOCATION_COLUMNS = ["device", "addr", "size", "alloc_ns", "free_ns", "freed", "before_trace",
                      "alloc_row", "free_row", "op_row", "op_name", "offset"]


def trace_end_ns(trace: Trace) -> int:
    """End of the trace in ns from its origin: the last event's end or the last memory record, whichever is later."""
    events, memory = trace.events, trace.memory
    ends = [0]
    if events.num_rows:
        ends.append(int((events["start_ns"].to_numpy() + events["dur_ns"].to_numpy()).max()))
    if memory.num_rows:
        ends.append(int(memory["ts_ns"].to_numpy().max()))
    return max(ends)


def memory_timeline(trace: Trace) -> pd.DataFrame:
    """Allocated and reserved bytes after each memory record, per device, as a step series.

    | device | ts_ns | allocated_bytes | reserved_bytes |

    Sorted by device then time (records at the same time keep their order). `reserved_bytes` is NaN
    where the trace does not record it.
    """
    memory = trace.df("memory")
    table = pd.DataFrame({
        "device": memory["device"].astype(str),
        "ts_ns": memory["ts_ns"].to_numpy(),
        "allocated_bytes": memory["allocated_bytes"].to_numpy(),
        "reserved_bytes": memory["reserved_bytes"].to_numpy().astype(np.float64),
    })
    table.loc[table["reserved_bytes"] < 0, "reserved_bytes"] = np.nan
    return table.sort_values(["device", "ts_ns"], kind="stable", ignore_index=True)


def downsample_timeline(table: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """A `memory_timeline` with at most about `max_points` rows per device.

    A device with more rows keeps those holding the minimum and maximum allocated bytes of each of
    `max_points // 2` equal time bins (so peaks and troughs survive), and its first and last row.
    """
    table = table.reset_index(drop=True)
    bins = max(max_points // 2, 1)
    grouped = table.groupby("device", sort=False)
    sizes = grouped["ts_ns"].transform("size").to_numpy()
    t0 = grouped["ts_ns"].transform("min").to_numpy()
    span = grouped["ts_ns"].transform("max").to_numpy() - t0 + 1
    bin_of = (table["ts_ns"].to_numpy() - t0) * bins // span
    by_bin = table["allocated_bytes"].groupby([table["device"], bin_of], sort=False)
    keep = np.zeros(len(table), dtype=bool)
    keep[by_bin.idxmin().to_numpy()] = True
    keep[by_bin.idxmax().to_numpy()] = True
    keep[grouped.head(1).index] = True
    keep[grouped.tail(1).index] = True
    keep |= sizes <= max_points
    return table[keep].reset_index(drop=True)


def allocations(trace: Trace) -> pd.DataFrame:
    """Each allocation paired with its free, by address, per device.

    | device | addr | size | alloc_ns | free_ns | freed | before_trace | alloc_row | free_row | op_row |
    | op_name | offset |

    An address can be reused once freed: each free pairs with the most recent unmatched allocation at
    its address. An allocation never freed ends at the trace end with `freed` False; a free without an
    allocation (made before the trace began) starts at the origin with `before_trace` True. `alloc_row`
    and `free_row` are rows of the memory table (-1 where there is none), `op_row` the events row of
    the allocating op (-1 unknown) and `op_name` its name (`BEFORE_TRACE` or `NO_OP` without one).
    `offset` maps `addr` to a compact offset per device: address ranges in use, with the unused gaps
    between them removed. Sorted by device, then allocation time.

    Records without an address cannot be paired: their count per device is in
    `attrs["unknown_address"]` (every record of a trace from a profiler that writes no addresses).
    """
    memory = trace.df("memory")
    device = memory["device"].astype(str).to_numpy()
    addr, delta = memory["addr"].to_numpy(), memory["delta_bytes"].to_numpy()
    changes = delta != 0
    unknown = pd.Series(device[changes & (addr < 0)]).value_counts()
    rows = np.flatnonzero(changes & (addr >= 0))
    rows = rows[np.lexsort((rows, memory["ts_ns"].to_numpy()[rows], addr[rows], device[rows]))]
    alloc_rows, free_rows, before_rows, open_rows = _pair(device[rows], addr[rows], delta[rows] > 0, rows)

    end = trace_end_ns(trace)
    ts, event = memory["ts_ns"].to_numpy(), memory["event"].to_numpy()
    first = np.concatenate([alloc_rows, before_rows, open_rows])
    table = pd.DataFrame({
        "device": device[first],
        "addr": addr[first],
        "size": np.abs(delta[first]),
        "alloc_ns": np.concatenate([ts[alloc_rows], np.zeros(len(before_rows), np.int64), ts[open_rows]]),
        "free_ns": np.concatenate([ts[free_rows], ts[before_rows], np.full(len(open_rows), end, np.int64)]),
        "freed": np.repeat([True, True, False], [len(alloc_rows), len(before_rows), len(open_rows)]),
        "before_trace": np.repeat([False, True, False], [len(alloc_rows), len(before_rows), len(open_rows)]),
        "alloc_row": np.concatenate([alloc_rows, np.full(len(before_rows), -1), open_rows]),
        "free_row": np.concatenate([free_rows, before_rows, np.full(len(open_rows), -1)]),
    })
    table["op_row"] = np.where(table["before_trace"], -1, event[first])
    table["op_name"] = _op_names(trace, table["op_row"].to_numpy(), table["before_trace"].to_numpy())
    table["offset"] = _compact_offsets(table["device"].to_numpy(), table["addr"].to_numpy(),
                                       table["size"].to_numpy())
    table = table.sort_values(["device", "alloc_ns", "alloc_row"], kind="stable", ignore_index=True)
    table = table[ALLOCATION_COLUMNS]
    table.attrs["unknown_address"] = {str(d): int(n) for d, n in unknown.items()}
    return table


def _pair(device: np.ndarray, addr: np.ndarray, is_alloc: np.ndarray,
          rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Match allocs and frees sorted by (device, addr, time) like brackets, per address.

    Returns memory rows of (paired allocs, their frees, frees without an alloc, allocs never freed).
    The nesting depth per address is the running sum of +1/-1 reflected at zero (a free at depth 0
    has no alloc); the alloc that brings an address to depth k pairs with the next free leaving depth k.
    """
    n = len(rows)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (device[1:] != device[:-1]) | (addr[1:] != addr[:-1])
    group = np.cumsum(new_group) - 1
    step = np.where(is_alloc, 1, -1)
    total = np.cumsum(step)
    depth = total - (total - step)[new_group][group]  # running sum restarted at each address
    floor = np.minimum(pd.Series(depth).groupby(group).cummin().to_numpy(), 0)
    after = depth - floor  # depth reflected at zero
    before = np.where(new_group, 0, np.roll(after, 1))
    orphan = ~is_alloc & (before == 0)
    level = np.where(is_alloc, after, before)
    candidates = np.flatnonzero(~orphan)
    candidates = candidates[np.lexsort((candidates, level[candidates], group[candidates]))]
    same = (group[candidates[1:]] == group[candidates[:-1]]) & (level[candidates[1:]] == level[candidates[:-1]])
    opens = np.flatnonzero(same & is_alloc[candidates[:-1]] & ~is_alloc[candidates[1:]])
    alloc_at, free_at = candidates[opens], candidates[opens + 1]
    paired = np.zeros(n, dtype=bool)
    paired[alloc_at] = True
    never_freed = np.flatnonzero(is_alloc & ~paired)
    return rows[alloc_at], rows[free_at], rows[np.flatnonzero(orphan)], rows[never_freed]


def _op_names(trace: Trace, op_row: np.ndarray, before_trace: np.ndarray) -> np.ndarray:
    """Names of the events at `op_row`, with placeholders where there is none."""
    names = np.full(len(op_row), NO_OP, dtype=object)
    names[before_trace] = BEFORE_TRACE
    known = op_row >= 0
    if known.any():
        column = trace.events["name"].combine_chunks()
        codes = column.indices.to_numpy(zero_copy_only=False)[op_row[known]]
        names[known] = np.asarray(column.dictionary.to_pylist(), dtype=object)[codes]
    return names


def _compact_offsets(device: np.ndarray, addr: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Per device, each address as an offset into its used address ranges laid end to end."""
    offsets = np.zeros(len(addr), dtype=np.int64)
    if not len(addr):
        return offsets
    order = np.lexsort((addr, device))
    start, end, dev = addr[order], addr[order] + size[order], device[order]
    new_device = np.ones(len(order), dtype=bool)
    new_device[1:] = dev[1:] != dev[:-1]
    # A range starts where an address lies beyond every earlier range's end on its device.
    reach = pd.Series(end).groupby(np.cumsum(new_device)).cummax().to_numpy()
    new_range = new_device.copy()
    new_range[1:] |= start[1:] > reach[:-1]
    range_id = np.cumsum(new_range) - 1
    range_start = start[new_range]
    range_len = np.maximum.reduceat(end, np.flatnonzero(new_range)) - range_start
    base = np.cumsum(range_len) - range_len  # bytes of all earlier ranges, then only the device's own
    device_of_range = np.cumsum(new_device[new_range]) - 1
    base -= base[range_id[new_device]][device_of_range]
    offsets[order] = start - range_start[range_id] + base[range_id]
    return offsets


def peak(trace: Trace, device: str, table: pd.DataFrame | None = None) -> tuple[int, int, pd.DataFrame]:
    """(ts_ns, allocated bytes, live allocations) at the device's first maximum of allocated bytes in time.

    The live allocations are the rows of `allocations(trace)` (pass it as `table` to reuse one) made
    at or before the peak record and freed after it, largest first. Allocations without an address
    cannot be placed, so the live set is empty for traces that record none. Raises KeyError for a
    device without memory records.
    """
    memory = trace.df("memory")
    ts = memory["ts_ns"].to_numpy()
    in_time_order = np.argsort(ts, kind="stable")
    on_device = in_time_order[(memory["device"].astype(str) == device).to_numpy()[in_time_order]]
    if not len(on_device):
        raise KeyError(f"no memory records for device {device!r}")
    allocated = memory["allocated_bytes"].to_numpy()[on_device]
    at = on_device[int(np.argmax(allocated))]
    position = np.empty(len(ts), dtype=np.int64)  # of each memory row in time order
    position[in_time_order] = np.arange(len(ts))
    if table is None:
        table = allocations(trace)
    rows = table[table["device"] == device]
    alloc_pos = np.where(rows["alloc_row"] >= 0, position[rows["alloc_row"].to_numpy()], -1)
    free_pos = np.where(rows["free_row"] >= 0, position[rows["free_row"].to_numpy()], len(ts))
    live = rows[(alloc_pos <= position[at]) & (free_pos > position[at])]
    live = live.sort_values(["size", "alloc_ns"], ascending=[False, True], kind="stable", ignore_index=True)
    return int(ts[at]), int(allocated.max()), live
