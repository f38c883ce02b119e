"""The `memory` and `counters` tables and the metadata of a Kineto / Chrome trace, from decoded chunks.

| source                                         | goes to                                                 |
|------------------------------------------------|---------------------------------------------------------|
| `[memory]` instants                            | `memory`, each tied to the op running on its thread     |
| `C` records                                    | `counters`: series `name` (`name[id]` with an id) plus  |
|                                                | `.key` for each arg but `value`; `pid <pid>/` before it |
|                                                | when several processes write counters                   |
| CUPTI ranges' numeric args                     | `counters` on the range's device, at the range's start  |
| `M` records                                    | `metadata["processes"]`, `metadata["threads"]`          |
| `deviceProperties`                             | `metadata["devices"]`                                   |
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.trace import schema
from workbench.trace.columns import dict_array, group_codes
from workbench.trace.kineto.categories import DEVICE_TYPES
from workbench.trace.kineto.values import MISSING, parse_number, plain
from workbench.trace.nesting import innermost_enclosing
from workbench.trace.schema import KIND_CODES

NOT_NUMBERS = "counter values that are not numbers"
FAR_NUMBERS = "counter values past float64 (kept out)"


def memory_table(src: np.ndarray, origin_us: float, vendor: str, events: pa.Table,
                 thread_tracks: dict[tuple[int, int], int]) -> pa.Table:
    """The memory table from `[memory]` instants (see `kineto_chunks._memory_columns`)."""
    if not len(src):
        return schema.MEMORY.empty_table()
    device, first = group_codes(src["device_type"], src["device_id"])
    labels = []
    for row in first.tolist():
        dtype, index = int(src["device_type"][row]), int(src["device_id"][row])
        base = DEVICE_TYPES.get(dtype, "cpu" if dtype == MISSING else f"device{dtype}")
        if base == "cuda":
            base = vendor
        labels.append(base if base == "cpu" or index < 0 else f"{base}:{index}")
    ts_ns = np.rint((src["ts"] - origin_us) * 1000.0).astype(np.int64)
    delta = np.where(src["bytes"] == MISSING, 0, src["bytes"])
    allocated = src["allocated"].copy()
    if (allocated == MISSING).any():  # old traces lack totals: running sum of the deltas per device
        running = np.empty_like(delta)
        for d in np.unique(device):
            rows = np.flatnonzero(device == d)
            rows = rows[np.argsort(ts_ns[rows], kind="stable")]
            running[rows] = np.cumsum(delta[rows])
        allocated = np.where(allocated == MISSING, running, allocated)
    thread = np.array([thread_tracks.get((int(p), int(t)), -1) for p, t in zip(src["pid"], src["tid"], strict=True)],
                      dtype=np.int64)
    track = events["track"].combine_chunks().indices.to_numpy().astype(np.int64)
    kind = events["kind"].combine_chunks().indices.to_numpy()
    event = innermost_enclosing(thread, ts_ns, track, events["start_ns"].to_numpy(), events["dur_ns"].to_numpy(),
                                events["parent"].to_numpy(), kind == KIND_CODES["op"])
    return pa.table(
        {
            "ts_ns": ts_ns,
            "device": dict_array(device, labels),
            "addr": np.where(src["addr"] == MISSING, -1, src["addr"]),
            "delta_bytes": delta,
            "allocated_bytes": allocated,
            "reserved_bytes": np.where(src["reserved"] == MISSING, -1, src["reserved"]),
            "event": event,
        },
        schema=schema.MEMORY,
    )


def counters_table(records: list[tuple[float, int, str | None, str, dict[str, Any]]], origin_us: float,
                   names: dict[int, str], ranges: list[tuple[int, str, dict[str, Any]]],
                   skipped: Counter[str]) -> pa.Table:
    """One row per numeric value of each `C` record (`records`: ts µs, pid, id, name, args) and of each
    CUPTI range (`ranges`: start ns, device, args); see the module docstring for the series names."""
    several = len({pid for _, pid, *_ in records}) > 1
    rows: list[tuple[int, str, str, float]] = []
    for ts, pid, ident, name, values in records:
        base = name if ident is None else f"{name}[{ident}]"
        if several:
            base = f"pid {names.get(pid, pid)}/{base}"
        ts_ns = round((ts - origin_us) * 1000.0)
        for key, value in values.items():
            number = _counter_value(value, skipped)
            if number is not None:
                rows.append((ts_ns, "cpu", base if key == "value" else f"{base}.{key}", number))
    for start_ns, device, values in ranges:
        for key, value in values.items():
            number = _counter_value(value, skipped)
            if number is not None:
                rows.append((start_ns, device, key, number))
    if not rows:
        return schema.COUNTERS.empty_table()
    ts_ns, devices, series, numbers = zip(*rows, strict=True)
    return pa.table({"ts_ns": list(ts_ns), "device": pa.array(list(devices)).dictionary_encode(),
                     "name": pa.array(list(series)).dictionary_encode(), "value": list(numbers)},
                    schema=schema.COUNTERS)


def _counter_value(value: Any, skipped: Counter[str]) -> float | None:
    """A counter value as a float (numbers, and strings holding one); None, counted, for anything else."""
    number = parse_number(value)
    if number is None or math.isnan(number):
        skipped[NOT_NUMBERS] += 1
        return None
    if math.isinf(number):
        skipped[FAR_NUMBERS] += 1
        return None
    return number


def names_metadata(meta: list[tuple[str, int, int, dict[str, Any]]],
                   names: dict[int, str]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """`processes` ({pid: {name, labels, sort_index}}) and `threads` ({"pid/tid": {...}}) from `M` records;
    a pid or tid that is a name is keyed as written."""
    processes: dict[str, dict[str, Any]] = {}
    threads: dict[str, dict[str, Any]] = {}
    for name, pid, tid, values in meta:
        value = plain(next((values[k] for k in ("name", "labels", "sort_index") if k in values), values))
        process, thread = names.get(pid, str(pid)), names.get(tid, str(tid))
        if name.startswith("process_"):
            processes.setdefault(process, {})[name.removeprefix("process_")] = value
        elif name.startswith("thread_"):
            threads.setdefault(f"{process}/{thread}", {})[name.removeprefix("thread_")] = value
    return processes, threads


def device_list(header: dict[str, Any], vendor: str, warnings: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """`metadata["devices"]` from the header's `deviceProperties` (a list of objects), and whether it is
    that; what is not is named in `warnings` (the caller keeps it in the header)."""
    props = header.get("deviceProperties")
    if props is None:
        return [], True
    if not isinstance(props, list):
        warnings.append(f"deviceProperties is a {type(props).__name__}, not a list of objects: kept in "
                        "source.header, no device properties read")
        return [], False
    devices = [_device_properties(p, vendor) for p in props if isinstance(p, dict)]
    if len(devices) < len(props):
        warnings.append(f"{len(props) - len(devices)} deviceProperties entries are not objects: kept in source.header")
    return devices, len(devices) == len(props)


def device_names(header: dict[str, Any]) -> str:
    """The device names of `deviceProperties`, joined (empty when it is no list of objects)."""
    props = header.get("deviceProperties")
    return " ".join(str(p.get("name", "")) for p in props if isinstance(p, dict)) if isinstance(props, list) else ""


def _device_properties(props: dict[str, Any], vendor: str) -> dict[str, Any]:
    """Kineto's deviceProperties entry in the workbench's device-metadata shape."""
    major = props.get("computeMajor")
    return {
        "device": f"{vendor}:{props.get('id', 0)}",
        "name": props.get("name"),
        "memory_bytes": props.get("totalGlobalMem"),
        "sm_count": props.get("numSms"),
        "compute_capability": None if major is None else f"{major}.{props.get('computeMinor')}",
        "source": props,
    }
