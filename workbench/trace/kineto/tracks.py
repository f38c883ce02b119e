"""Where each Kineto / Chrome-trace row runs: its device and its track (display lane).

| row                                          | device                 | track                            |
|----------------------------------------------|------------------------|----------------------------------|
| of a device category (`kernel`,              | `<vendor>:N`, N the    | `<device>/stream <args.stream>`  |
| `mtia_ccp_events`...)                        | `device` arg, else pid | (else the tid)                   |
| a CUPTI range (`cuda_profiler_range`)        | the same               | `<device>/profiler ranges`       |
| another row in a device's process (MTIA      | that device            | `<device>/thread <tid>`          |
| runtime calls on the device's pid)           |                        |                                  |
| async record with an id (`b`/`n`/`S`/`T`/`p`) | `cpu`                 | `cpu/async <category>:<id>`      |
| any other row                                | `cpu`                  | `cpu/thread <tid>`; `cpu/pid     |
|                                              |                        | <pid>/thread <tid>` when several |
|                                              |                        | processes have threads, and for  |
|                                              |                        | a pid that is a name or negative |

A pid or tid that is a name (`"Spans"`, `"MainThread"`) shows as written. Callers may also give rows
a track label of their own (`Lanes.named`, used for XSpace-converted JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.trace.columns import group_codes, lookup
from workbench.trace.kineto.values import MISSING

THREAD, STREAM, RANGES, ASYNC, NAMED = range(5)
"""Lane kinds: a thread (of the host, or of a device's process), a device stream, a device's profiler
ranges, an async id, or a label given by the caller (`Lanes.named`)."""


@dataclass
class Lanes:
    """Per row: `device` (code into `devices`, 0 = `cpu`), lane `kind` and `lane` (tid, stream, async key
    code, or code into `named`)."""

    device: np.ndarray
    kind: np.ndarray
    lane: np.ndarray
    devices: list[str]
    named: list[str] = field(default_factory=list)

    def device_code(self, label: str) -> int:
        """The code of a device label, added if new."""
        if label not in self.devices:
            self.devices.append(label)
        return self.devices.index(label)

    def name_lane(self, rows: np.ndarray, device: str, labels: list[str]) -> None:
        """Put `rows` on `device`, each on the track labelled `labels[i]`."""
        self.device[rows] = self.device_code(device)
        self.kind[rows] = NAMED
        offsets = {label: i for i, label in enumerate(self.named)}
        for label in labels:
            offsets.setdefault(label, len(offsets))
        self.named = list(offsets)
        self.lane[rows] = [offsets[label] for label in labels]


def place(vendor: str, on_device: np.ndarray, ranges: np.ndarray, device_arg: np.ndarray, stream: np.ndarray,
          pid: np.ndarray, tid: np.ndarray, async_key: np.ndarray) -> Lanes:
    """Device and lane of every row (see the module docstring). `on_device`, `ranges`: rows of device
    categories and of CUPTI range categories; `async_key`: async key code per row (-1 for none)."""
    n = len(pid)
    index = np.where(on_device, np.where(device_arg != MISSING, device_arg, pid), -1)
    device_rows = np.flatnonzero(on_device)
    guest = ~on_device & np.isin(pid, pid[device_rows])
    index[guest] = lookup(pid[guest], pid[device_rows], index[device_rows])
    is_async = (async_key >= 0) & ~on_device
    index[is_async] = -1
    numbers = np.unique(index[index >= 0])
    devices = ["cpu", *(f"{vendor}:{d}" for d in numbers.tolist())]
    device = np.zeros(n, dtype=np.int32)
    device[index >= 0] = np.searchsorted(numbers, index[index >= 0]) + 1
    kind = np.full(n, THREAD, dtype=np.int8)
    kind[on_device] = np.where(ranges[on_device], RANGES, STREAM)
    kind[is_async] = ASYNC
    lane = np.where(kind == STREAM, np.where(stream != MISSING, stream, tid), tid)
    lane[kind == RANGES] = 0
    lane[is_async] = async_key[is_async]
    return Lanes(device, kind, lane, devices)


def track_labels(lanes: Lanes, pid: np.ndarray, names: dict[int, str],
                 async_keys: list[str]) -> tuple[np.ndarray, list[str]]:
    """Track code per row and the track labels (see the module docstring)."""
    host_thread = (lanes.kind == THREAD) & (lanes.device == 0)
    owner = np.where(host_thread, pid, MISSING)
    codes, first = group_codes(lanes.device, lanes.kind, lanes.lane, owner)
    real_pids = np.unique(pid[host_thread & (pid >= 0)])
    several = len(real_pids) > 1

    def text(value: int) -> str:
        return names.get(value, str(value)) or '""'  # an empty name shows as such

    labels = []
    for row in first.tolist():
        kind, lane, device = int(lanes.kind[row]), int(lanes.lane[row]), lanes.devices[lanes.device[row]]
        if kind == NAMED:
            labels.append(lanes.named[lane])
        elif kind == ASYNC:
            labels.append(f"cpu/async {async_keys[lane]}")
        elif kind == RANGES:
            labels.append(f"{device}/profiler ranges")
        elif kind == STREAM:
            stream = text(lane)
            labels.append(f"{device}/{stream}" if stream.startswith("stream ") else f"{device}/stream {stream}")
        elif device != "cpu":
            labels.append(f"{device}/thread {text(lane)}")
        else:
            process = int(pid[row])
            qualified = several or process < 0
            labels.append(f"cpu/pid {text(process)}/thread {text(lane)}" if qualified else f"cpu/thread {text(lane)}")
    return codes, labels


def host_thread_tracks(lanes: Lanes, pid: np.ndarray, tid: np.ndarray, track: np.ndarray) -> dict[tuple[int, int], int]:
    """(pid, tid) → track code of the host threads (where `[memory]` records are matched to ops)."""
    rows = np.flatnonzero((lanes.kind == THREAD) & (lanes.device == 0))
    _, first = group_codes(pid[rows], tid[rows])
    return {(int(pid[r]), int(tid[r])): int(track[r]) for r in rows[first].tolist()}
