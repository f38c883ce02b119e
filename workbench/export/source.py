"""What an export reads from a bundle: its tables, memory-mapped, and the plan both writers share — the lanes
(one per track, with the process and thread ids a trace file gives it), the launch flows and the correlation ids
that carry them.

Lanes: a host track keeps the pid and tid of its first event, unless another track took that pair or the pid is
one a device lane uses or no int32 (Perfetto's pids are int32), when it gets a fresh pid from `SYNTHETIC_PID` up; a
device track is written on its device's pid (the device's ordinal when the ordinals are distinct, else its index)
and on its stream (`<device>/stream N`) or a fresh lane number. Each lane's name is its label without the device
(`stream 7` under `cuda:0`, `thread 25738` under `cpu`), which the readers put back.

Flows: each piece of device work with a correlation id is linked to the runtime call with the same id in its
process (nsys, XSpace); in a trace where no device work shares its pid with a runtime call (Kineto, whose device
work runs on the device's pid), to the one runtime call of the whole trace with that id. Where runtime calls' ids
are unique in the trace (Kineto, one-process nsys), the ids are written as they are; where they repeat (the
per-process CUPTI ids of a multi-process nsys export or a multi-host XSpace), each linked call gets a fresh id
shared with its device work. Device work left unlinked whose id another process's call has is written without one.
Wherever the id written is not the one recorded, that one is kept in args as `source correlation`, so a reader that
joins by id alone links the same pairs and nothing is lost.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.trace.schema import DEVICE_KINDS, KIND_CODES, KINDS
from workbench.trace.store.bundle import Bundle, open_bundle

SYNTHETIC_PID = 1 << 30
"""First pid given to host lanes whose own cannot be written (taken, a device's, or past int32)."""
SYNTHETIC_TID = 1 << 30
"""First lane number given to device lanes that are no numbered stream."""
BATCH_ROWS = 16384
"""Events read, converted and written at a time: what bounds an export's memory besides the plan's columns."""

_STREAM = re.compile(r"stream (\d+)")
_INT32 = 2**31


@dataclass(frozen=True)
class Lane:
    """One track of the events table as a trace file places it."""

    label: str
    device: str
    name: str
    pid: int
    tid: int
    on_device: bool
    pid_name: str | None = None
    """The pid's text where the source named it (Kineto's `"Traces"` process)."""
    tid_name: str | None = None


@dataclass
class Source:
    """A bundle opened for export: its tables and the plan (see the module docstring)."""

    run_id: str
    events: pa.Table
    counters: pa.Table
    memory: pa.Table
    metadata: dict[str, Any]
    lanes: list[Lane]
    lane: np.ndarray
    """Lane index of each event row."""
    kind: np.ndarray
    """Kind code of each event row (into `schema.KINDS`)."""
    corr_out: np.ndarray
    """Correlation id written for each row (-1: none)."""
    pairs: np.ndarray
    """(launch row, device row) of every flow, shape (n, 2)."""
    device_numbers: dict[str, int]

    @property
    def vendor(self) -> str:
        """The accelerator vendor of the devices (`cuda` when none says otherwise)."""
        prefixes = {d.rsplit("/", 1)[-1].split(":")[0] for d in self.device_numbers}
        return next(iter(prefixes)) if len(prefixes) == 1 else "cuda"

    def kind_counts(self) -> dict[str, int]:
        """Events per kind, most frequent first (only kinds present)."""
        counts = np.bincount(self.kind, minlength=len(KINDS))
        return dict(sorted(((KINDS[k], int(c)) for k, c in enumerate(counts) if c), key=lambda p: (-p[1], p[0])))


def open_run_dir(run_dir: str | Path) -> Bundle:
    """The bundle in `run_dir` (a bundle folder, or its run.json); BundleError for a path that is no bundle."""
    run_dir = Path(run_dir)
    return open_bundle(run_dir, run_dir.parent)


def plan(bundle: Bundle, extra: pa.Table | None = None) -> Source:
    """The export plan of an opened bundle, with `extra` events (rows of the events schema, such as the critical
    path's track) after its own; BundleError for a run without a trace."""
    trace = bundle.trace()
    events = trace.events if extra is None else pa.concat_tables([trace.events, extra])
    kind = _codes(events, "kind", list(KINDS)).astype(np.int8)
    devices = _decoded(events, "device")
    tracks = _decoded(events, "track")
    track_codes = _codes(events, "track", tracks)
    device_codes = _codes(events, "device", devices)
    pid = events["pid"].to_numpy()
    tid = events["tid"].to_numpy()
    lanes, device_numbers = _lanes(tracks, devices, track_codes, device_codes, pid, tid, trace.metadata)
    corr_out, pairs = _flows(kind, events["corr"].to_numpy(), pid)
    return Source(bundle.run_id, events, trace.counters, trace.memory, trace.metadata, lanes, track_codes, kind,
                  corr_out, pairs, device_numbers)


def _decoded(table: pa.Table, column: str) -> list[str]:
    """The dictionary of a dictionary column (all chunks unified)."""
    chunked = table[column].unify_dictionaries() if table.num_rows else table[column]
    if not chunked.num_chunks:
        return []
    return chunked.chunk(0).dictionary.to_pylist()


def _codes(table: pa.Table, column: str, values: list[str]) -> np.ndarray:
    """Codes of a dictionary column into `values` (the unified dictionary, or another list holding its values)."""
    chunked = table[column].unify_dictionaries() if table.num_rows else table[column]
    parts = []
    for chunk in chunked.chunks:
        remap = np.asarray([values.index(v) for v in chunk.dictionary.to_pylist()] or [0], dtype=np.int32)
        parts.append(remap[chunk.indices.fill_null(0).to_numpy(zero_copy_only=False)])
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _lanes(tracks: list[str], devices: list[str], track_codes: np.ndarray, device_codes: np.ndarray, pid: np.ndarray,
           tid: np.ndarray, metadata: dict[str, Any]) -> tuple[list[Lane], dict[str, int]]:
    """One lane per track (see the module docstring) and each device's number (its pid in a trace file)."""
    accelerators = sorted({d for d in devices if d != "cpu"})
    ordinals = [_ordinal(d) for d in accelerators]
    distinct = None not in ordinals and len(set(ordinals)) == len(ordinals)
    numbers = {d: (o if distinct else i) for i, (d, o) in enumerate(zip(accelerators, ordinals, strict=True))}
    first = np.full(len(tracks), -1, dtype=np.int64)
    if len(track_codes):
        rows = np.arange(len(track_codes))[::-1]
        first[track_codes[::-1]] = rows
    named = (metadata.get("reader") or {}).get("named_ids") or {}
    taken: set[tuple[int, int]] = set()
    next_pid, next_tid = SYNTHETIC_PID, SYNTHETIC_TID
    lanes = []
    for code, label in enumerate(tracks):
        row = int(first[code])
        device = devices[device_codes[row]] if row >= 0 else "cpu"
        name = label[len(device) + 1:] if label.startswith(f"{device}/") else label
        on_device = device != "cpu"
        if on_device:
            stream = _STREAM.fullmatch(name)
            lane_pid = numbers[device]
            if stream and (lane_pid, int(stream.group(1))) not in taken:
                lane_tid = int(stream.group(1))
            else:
                lane_tid, next_tid = next_tid, next_tid + 1
            taken.add((lane_pid, lane_tid))
            lanes.append(Lane(label, device, name, lane_pid, lane_tid, True))
            continue
        p, t = (int(pid[row]), int(tid[row])) if row >= 0 else (0, 0)
        pid_name, tid_name = named.get(str(p)), named.get(str(t))
        if not -_INT32 <= p < _INT32 or p in numbers.values() or (p, t) in taken:
            p, next_pid = next_pid, next_pid + 1
        taken.add((p, t))
        lanes.append(Lane(label, device, name, p, t, False, pid_name, tid_name))
    return lanes, numbers


def _ordinal(device: str) -> int | None:
    """The number after a device label's last colon (`cuda:3` → 3), None if none."""
    text = device.rsplit(":", 1)[-1]
    return int(text) if text.isdigit() else None


def _flows(kind: np.ndarray, corr: np.ndarray, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(correlation id written per row, (launch, device) row pairs)."""
    rows = np.arange(len(kind))
    linked = corr >= 0
    runtime = pd.DataFrame({"launch": rows, "pid": pid, "corr": corr})[linked & (kind == KIND_CODES["runtime"])]
    device_kinds = np.isin(kind, [KIND_CODES[k] for k in DEVICE_KINDS])
    work = pd.DataFrame({"work": rows, "pid": pid, "corr": corr})[linked & device_kinds]
    by_process = work.merge(runtime.drop_duplicates(["pid", "corr"]), on=["pid", "corr"], how="inner")
    if len(by_process):
        pairs = by_process[["launch", "work"]].to_numpy()
    else:  # device work on pids of its own (Kineto: the device's): ids are the whole trace's
        unique = runtime.drop_duplicates("corr", keep=False).drop(columns="pid")
        pairs = work.drop(columns="pid").merge(unique, on="corr", how="inner")[["launch", "work"]].to_numpy()
    pairs = pairs.astype(np.int64).reshape(-1, 2)
    pairs = pairs[np.argsort(pairs[:, 1], kind="stable")]
    if runtime["corr"].is_unique:  # device work left unlinked must not take the id of another process's call
        out = np.where(linked, corr, -1)
        unpaired = np.setdiff1d(work["work"].to_numpy(), pairs[:, 1])
        out[unpaired[np.isin(corr[unpaired], runtime["corr"].to_numpy())]] = -1
        return out, pairs
    out = np.full(len(kind), -1, dtype=np.int64)
    launches, fresh = np.unique(pairs[:, 0], return_inverse=True)
    out[launches] = np.arange(1, len(launches) + 1)
    out[pairs[:, 1]] = fresh + 1
    return out, pairs


def args_object(text: str | None) -> dict[str, Any]:
    """An event's args as a dict (`{"args": text}` for args that are no JSON object, or nest too deep to decode)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {"args": text}
    return value if isinstance(value, dict) else {"args": value}


def event_batches(source: Source, order: np.ndarray | None = None, columns: list[str] | None = None):
    """The events (all columns, or `columns`), `BATCH_ROWS` at a time, in row order or in `order`: (rows, list of
    row dicts)."""
    table = source.events if columns is None else source.events.select(columns)
    n = table.num_rows
    for at in range(0, n, BATCH_ROWS):
        rows = np.arange(at, min(at + BATCH_ROWS, n)) if order is None else order[at:at + BATCH_ROWS]
        part = table.slice(at, len(rows)) if order is None else table.take(pa.array(rows))
        yield rows, part.to_pylist()

