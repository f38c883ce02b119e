"""A bundle as Chrome Trace Event JSON, written to a stream event by event (never one string in memory).

Written as PyTorch's profiler writes it, so that chrome://tracing, Perfetto and our Kineto reader open it alike:

| bundle                               | Trace Event JSON                                                     |
|--------------------------------------|----------------------------------------------------------------------|
| lanes (`source.Lane`)                | `process_name` / `thread_name` metadata; device lanes on the device's |
|                                      | pid with their stream as tid                                          |
| events                               | `X` records, `cat` from the kind (`export.categories`), the original |
|                                      | args, and `correlation`, `device`, `stream`, `flops`, `bytes`,        |
|                                      | `Input Dims`, `Input type` from the columns                           |
| flows (launch → device work)         | `ac2g` flow pairs (`s` at the launch, `f` bound to the work)          |
| counters                             | `C` records, one series each, under one `Counters` process            |
| memory                               | `[memory]` instants with Kineto's fields                              |

Times are µs from the trace's origin (ns kept as three decimals); `baseTimeNanoseconds` holds the origin.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import IO, Any

import msgspec

from workbench.export.categories import category
from workbench.export.source import Lane, Source, args_object, event_batches
from workbench.trace.kineto.categories import DEVICE_TYPES
from workbench.trace.schema import KINDS

COUNTERS_PROCESS = "Counters"
_TYPE_OF_DEVICE = {name: code for code, name in DEVICE_TYPES.items()}
_encode = msgspec.json.Encoder().encode


def write_chrome(source: Source, stream: IO[bytes], advance: Callable[[int], None]) -> dict[str, int]:
    """Write `source` as Trace Event JSON to the binary `stream`; `advance(n)` is told of each n events written.
    Returns the records written by type."""
    origin = source.metadata.get("origin_ns")
    header: dict[str, Any] = {"schemaVersion": 1, "displayTimeUnit": "ns", "traceName": source.run_id}
    if isinstance(origin, int) and not isinstance(origin, bool):
        header["baseTimeNanoseconds"] = origin
    head = _encode(header)
    stream.write(head[:-1] + b', "traceEvents": [\n')
    first = True

    def put(record: dict[str, Any]) -> None:
        nonlocal first
        stream.write(_encode(record) if first else b",\n" + _encode(record))
        first = False

    for record in _metadata(source):
        put(record)
    vendor = source.vendor
    for rows, batch in event_batches(source):
        for r, row in zip(rows.tolist(), batch, strict=True):
            put(_event(row, source.lanes[int(source.lane[r])], int(source.corr_out[r]), vendor))
        advance(len(batch))
    starts = source.events["start_ns"].to_numpy()
    for i, (launch, work) in enumerate(source.pairs.tolist()):
        for ph, row in (("s", launch), ("f", work)):
            lane = source.lanes[int(source.lane[row])]
            flow = {"ph": ph, "id": i, "pid": lane.pid, "tid": lane.tid, "ts": _us(int(starts[row])),
                    "cat": "ac2g", "name": "ac2g"}
            put({**flow, "bp": "e"} if ph == "f" else flow)
    for ts, device, name, value in _rows(source.counters, ("ts_ns", "device", "name", "value")):
        if math.isfinite(value):
            put({"ph": "C", "name": name, "pid": COUNTERS_PROCESS, "tid": 0, "ts": _us(ts), "args": {"value": value},
                 "cat": device})
    host = next((lane for lane in source.lanes if not lane.on_device), None)
    for ts, device, addr, delta, allocated, reserved, event in _rows(source.memory, (
            "ts_ns", "device", "addr", "delta_bytes", "allocated_bytes", "reserved_bytes", "event")):
        lane = source.lanes[int(source.lane[event])] if event >= 0 else host
        if lane is None or lane.on_device:
            lane = host
        base, _, index = device.rpartition(":") if ":" in device else (device, "", "-1")
        args = {"Addr": addr, "Bytes": delta, "Total Allocated": allocated, "Total Reserved": reserved,
                "Device Type": _TYPE_OF_DEVICE.get(base.rsplit("/", 1)[-1], 1 if base != "cpu" else 0),
                "Device Id": int(index) if index.lstrip("-").isdigit() else -1}
        put({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]",
             "pid": lane.pid if lane else 0, "tid": lane.tid if lane else 0, "ts": _us(ts), "args": args})
    stream.write(b"\n]}\n")
    return {"events": source.events.num_rows, "flows": len(source.pairs), "counters": source.counters.num_rows,
            "memory": source.memory.num_rows}


def _metadata(source: Source) -> list[dict[str, Any]]:
    """process_name and thread_name records of every lane (and the counters' process)."""
    processes = source.metadata.get("processes") or {}
    names: dict[int | str, str] = {}
    records = []
    for lane in source.lanes:
        pid = _pid(lane)
        if pid not in names:
            if lane.on_device:
                names[pid] = lane.device
            else:
                known = processes.get(str(lane.pid))
                names[pid] = known.get("name") if isinstance(known, dict) and known.get("name") else str(pid)
            records.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": names[pid]}})
        records.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": _tid(lane), "args": {"name": lane.name}})
    if source.counters.num_rows:
        records.append({"ph": "M", "name": "process_name", "pid": COUNTERS_PROCESS, "tid": 0,
                        "args": {"name": COUNTERS_PROCESS}})
    return records


def _pid(lane: Lane) -> int | str:
    return lane.pid_name if lane.pid_name is not None else lane.pid


def _tid(lane: Lane) -> int | str:
    return lane.tid_name if lane.tid_name is not None else lane.tid


def _event(row: dict[str, Any], lane: Lane, corr: int, vendor: str) -> dict[str, Any]:
    """One `X` record: the original args, the columns over them under Kineto's names (`corr`: the correlation id
    written)."""
    kind = row["kind"]
    args = args_object(row["args"])
    args.pop("correlation", None)
    if row["corr"] >= 0 and row["corr"] != corr:
        args["source correlation"] = row["corr"]
    if corr >= 0:
        args["correlation"] = corr
    if lane.on_device:
        args["device"], args["stream"] = lane.pid, lane.tid
    for key, column in (("flops", "flops"), ("bytes", "bytes")):
        value = row[column]
        if value is not None and not math.isnan(value):
            args[key] = value
    for key, column in (("Input Dims", "shapes"), ("Input type", "dtypes")):
        if row[column] is not None:
            args[key] = _json_or_text(row[column])
    return {"ph": "X", "cat": category(kind if kind in KINDS else "other", lane.on_device, vendor),
            "name": row["name"], "pid": _pid(lane), "tid": _tid(lane), "ts": _us(row["start_ns"]),
            "dur": _us(row["dur_ns"]), "args": args}


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _us(ns: int) -> float:
    """ns as µs, exact to the ns when read back and rounded (`rint(us * 1000)`)."""
    return ns / 1000.0


def _rows(table: Any, columns: tuple[str, ...]):
    """The rows of a small table (counters, memory) as tuples, a batch of columns at a time."""
    for batch in table.select(list(columns)).to_batches(max_chunksize=65536):
        values = [batch.column(i).to_pylist() for i in range(len(columns))]
        yield from zip(*values, strict=True)

