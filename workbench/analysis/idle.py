"""Device busy and idle time, measured on the union of each device's work, and what caused each idle gap.

Device work is every kernel, memcpy and memset of a device, and every XLA op (`hlo`) on a device lane
(the device work of TPU profiles, which have no kernels). Spans that overlap, on several streams,
count once: `busy_ns` is the length of their union. A device's span runs from the start of its first
work to the end of its last (the profiler's start and stop around it are not the workload's idle
time), or is the given window; `idle_ns` is the span minus busy time, and the gaps are the idle
intervals in it, each with its start (ns from the trace origin, as every time in a `Trace`) and
duration. The CPU is never a device here: a CPU-only trace has no devices and an empty summary.

Gap causes come from what the host processes that launched the device's work were doing during the
gap, time split in this order of precedence (a sync call inside an op counts as sync):

| part        | host events                                                                            |
|-------------|----------------------------------------------------------------------------------------|
| `sync`      | synchronize calls (`cudaDeviceSynchronize`, `cudaStreamSynchronize`, nsys `Stream      |
|             | sync`...), blocking copies (`cudaMemcpy`, `hipMemcpyWithStream`), `cudaFree`           |
| `memcpy`    | other copy calls (`cudaMemcpyAsync`: staging pageable memory, the copy API's own cost) |
| `runtime`   | any other runtime call: launches, allocations, event queries                           |
| `host`      | framework ops and Python (NVTX ranges in traces without ops), other host spans; step   |
|             | and phase markers (`ProfilerStep#N`, `measure`) are left out: they span whole steps    |
| `untraced`  | nothing recorded on the host (data loading outside profiled ops, another process...)   |

The `cause` of a gap is the largest of sync, memcpy, host-bound (runtime + host) and untraced.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.timeline import PHASE_NAMES, STEP_NAME, union_intervals
from workbench.trace import Trace

DEVICE_WORK_KINDS = ("kernel", "memcpy", "memset", "hlo")
"""Event kinds that make a device busy."""

SYNC_CALL = re.compile(
    r"synchroni[sz]e|^(?:stream|event|context|device) sync$|^(?:cuda|hip)Memcpy(?:2D|3D|Peer|WithStream)?$"
    r"|^(?:cuda|hip)(?:Free|FreeHost|HostFree)$|^cuMemcpy[DH]to[DH](?:_v\d+)?$",
    re.IGNORECASE,
)
"""Host calls that block until the device (or a copy) is done."""

COPY_CALL = re.compile(r"memcpy", re.IGNORECASE)
"""Host calls that issue copies (those not blocking, see `SYNC_CALL`)."""

PARTS = ("sync", "memcpy", "runtime", "host", "untraced")
"""Parts of a gap's time, in order of precedence (see the module docstring)."""

GAP_COLUMNS = ("device", "start_ns", "end_ns", "dur_ns", "cause", *(f"{p}_ns" for p in PARTS))
"""Columns of `idle_gaps`, in order."""

_CAUSES = ("sync", "memcpy", "host-bound", "untraced")


@dataclass(frozen=True)
class DeviceBusy:
    """The busy intervals of one device (disjoint, sorted) and the span they are measured in."""

    device: str
    starts: np.ndarray
    ends: np.ndarray
    span_start_ns: int
    span_end_ns: int

    @property
    def busy_ns(self) -> int:
        return int((self.ends - self.starts).sum())

    @property
    def span_ns(self) -> int:
        return self.span_end_ns - self.span_start_ns

    @property
    def idle_ns(self) -> int:
        return self.span_ns - self.busy_ns

    def gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (ns) of every idle interval of the span, in time order."""
        starts = np.concatenate([[self.span_start_ns], self.ends])
        ends = np.concatenate([self.starts, [self.span_end_ns]])
        keep = ends > starts
        return starts[keep].astype(np.int64), ends[keep].astype(np.int64)

    def summary(self) -> dict[str, int | None]:
        """`{"busy_ns", "idle_ns", "largest_gap_ns", "largest_gap_start_ns", "span_ns", "span_start_ns",
        "span_end_ns", "gaps"}`; the largest gap's start is None when the device was never idle."""
        starts, ends = self.gaps()
        largest = int(np.argmax(ends - starts)) if len(starts) else -1
        return {
            "busy_ns": self.busy_ns,
            "idle_ns": self.idle_ns,
            "largest_gap_ns": int(ends[largest] - starts[largest]) if largest >= 0 else 0,
            "largest_gap_start_ns": int(starts[largest]) if largest >= 0 else None,
            "span_ns": self.span_ns,
            "span_start_ns": self.span_start_ns,
            "span_end_ns": self.span_end_ns,
            "gaps": len(starts),
        }


def busy_by_device(trace: Trace, window: tuple[int, int] | None = None) -> dict[str, DeviceBusy]:
    """Per device (not the CPU), the union of its work; inside `window` ([start, end) ns) when given.

    Work is clipped to the window, and the window is then the span (idle before the first work
    in it counts); without one the span is the device's first to last work.
    """
    work = _device_work(trace)
    start, end = work["start_ns"].to_numpy(), work["end_ns"].to_numpy()
    if window is not None:
        start, end = np.maximum(start, window[0]), np.minimum(end, window[1])
    keep = end > start  # instants and work outside the window make no device busy
    codes, devices = pd.factorize(work["device"].astype(str).to_numpy()[keep])
    if len(codes) == 0:
        return {}
    lane, merged_start, merged_end = union_intervals(codes, start[keep], end[keep], _bound(start[keep], end[keep]))
    result = {}
    bounds = np.searchsorted(lane, np.arange(len(devices) + 1))  # the union comes in lane order
    for code, device in enumerate(devices):
        s, e = merged_start[bounds[code]:bounds[code + 1]], merged_end[bounds[code]:bounds[code + 1]]
        span = window if window is not None else (int(s[0]), int(e[-1]))
        result[str(device)] = DeviceBusy(str(device), s, e, int(span[0]), int(span[1]))
    return dict(sorted(result.items()))


def idle_summary(trace: Trace, window: tuple[int, int] | None = None) -> dict[str, dict[str, int | None]]:
    """Per device: `{"busy_ns", "idle_ns", "largest_gap_ns", "largest_gap_start_ns", ...}` (see
    `DeviceBusy.summary`); empty for a trace without device work."""
    return {device: busy.summary() for device, busy in busy_by_device(trace, window).items()}


def idle_gaps(trace: Trace, window: tuple[int, int] | None = None, busy: dict[str, DeviceBusy] | None = None,
              host: HostActivity | None = None) -> pd.DataFrame:
    """Every idle gap of every device with what the host did during it, longest first.

    | device | start_ns | end_ns | dur_ns | cause | sync_ns | memcpy_ns | runtime_ns | host_ns | untraced_ns |

    The five parts add up to the gap's duration (see the module docstring). `busy` and `host` are
    `busy_by_device(trace, window)` and `HostActivity(trace)` when the caller has them already.
    """
    busy = busy_by_device(trace, window) if busy is None else busy
    host = HostActivity(trace) if host is None else host
    frames = []
    for device, dev in busy.items():
        starts, ends = dev.gaps()
        if not len(starts):
            continue
        parts = _attribute(host.of_device(device), starts, ends)
        frame = pd.DataFrame({"device": device, "start_ns": starts, "end_ns": ends, "dur_ns": ends - starts,
                              **{f"{p}_ns": parts[p] for p in PARTS}})
        by_cause = np.stack([parts["sync"], parts["memcpy"], parts["runtime"] + parts["host"], parts["untraced"]])
        frame["cause"] = np.asarray(_CAUSES, dtype=object)[np.argmax(by_cause, axis=0)]
        frames.append(frame)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("device", "cause") else np.int64)
                             for c in GAP_COLUMNS})
    table = pd.concat(frames, ignore_index=True)[list(GAP_COLUMNS)]
    return table.sort_values(["dur_ns", "start_ns"], ascending=[False, True], ignore_index=True)


class HostActivity:
    """The host spans of a trace, each with the part of a gap it explains, for repeated window queries.

    `events`: | name | kind | device | pid | start_ns | end_ns | part |. Sync calls recorded on a
    device lane (Kineto's `cuda_sync`) are kept: they time the host's wait.
    """

    def __init__(self, trace: Trace) -> None:
        self.events = _host_events(trace)
        self.pids = _launching_pids(trace)

    def of_device(self, device: str) -> pd.DataFrame:
        """The spans of the processes that launched `device`'s work (all host spans when that is unknown)."""
        events = self.events
        mine = events[events["pid"].isin(self.pids.get(device, ())) | (events["device"] == device)]
        return mine if len(mine) else events[events["device"] == "cpu"]

    def top(self, start_ns: int, end_ns: int, device: str | None = None, top: int = 5) -> list[dict[str, object]]:
        """What the host did in [start_ns, end_ns): `[{"name", "kind", "overlap_ns", "count"}]`, most time
        first; only `device`'s launching processes when it is given. Nested spans each count (an op and
        the call inside it)."""
        host = self.events if device is None else self.of_device(device)
        overlap = np.minimum(host["end_ns"].to_numpy(), end_ns) - np.maximum(host["start_ns"].to_numpy(), start_ns)
        hit = host[overlap > 0].assign(overlap_ns=overlap[overlap > 0])
        if hit.empty:
            return []
        grouped = hit.groupby(["name", "kind"], observed=True).agg(overlap_ns=("overlap_ns", "sum"),
                                                                   count=("overlap_ns", "size"))
        grouped = grouped.sort_values("overlap_ns", ascending=False).head(top).reset_index()
        return [{"name": str(r.name), "kind": str(r.kind), "overlap_ns": int(r.overlap_ns), "count": int(r.count)}
                for r in grouped.itertuples(index=False)]


def host_activity(trace: Trace, start_ns: int, end_ns: int, device: str | None = None,
                  top: int = 5) -> list[dict[str, object]]:
    """What the host did in [start_ns, end_ns) (see `HostActivity.top`)."""
    return HostActivity(trace).top(start_ns, end_ns, device, top)


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted disjoint intervals (empty ones dropped)."""
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    keep = end > start
    if not keep.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lanes = np.zeros(int(keep.sum()), dtype=np.int64)
    _, s, e = union_intervals(lanes, start[keep], end[keep], _bound(start[keep], end[keep]))
    return s, e


def covered_ns(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each query interval [a, b), how many ns of it the disjoint sorted intervals cover."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if len(starts) == 0:
        return np.zeros(len(a), dtype=np.int64)
    cumulative = np.concatenate([[0], np.cumsum(ends - starts)])

    def upto(t: np.ndarray) -> np.ndarray:  # covered time before t
        k = np.searchsorted(starts, t, side="right") - 1
        inside = np.clip(t - starts[np.maximum(k, 0)], 0, (ends - starts)[np.maximum(k, 0)])
        return np.where(k >= 0, cumulative[np.maximum(k, 0)] + inside, 0)

    return np.maximum(upto(b) - upto(a), 0)


# -- pieces -----------------------------------------------------------------------------------------


def _device_work(trace: Trace) -> pd.DataFrame:
    """| row | device | kind | start_ns | end_ns | of every device-work event off the CPU."""
    events = trace.events.select(["start_ns", "dur_ns", "kind", "device"]).to_pandas()
    mask = events["kind"].isin(DEVICE_WORK_KINDS) & (events["device"].astype(str) != "cpu")
    work = events[mask]
    return pd.DataFrame({"row": np.flatnonzero(mask.to_numpy()), "device": work["device"].astype(str).to_numpy(),
                         "kind": work["kind"].astype(str).to_numpy(), "start_ns": work["start_ns"].to_numpy(),
                         "end_ns": (work["start_ns"] + work["dur_ns"]).to_numpy()})


def _host_events(trace: Trace) -> pd.DataFrame:
    """`HostActivity.events` (see there)."""
    events = trace.events.select(["start_ns", "dur_ns", "name", "kind", "device", "pid"]).to_pandas()
    kind, names = events["kind"], events["name"]
    host_kinds = ["op", "python", "other", "runtime"]
    if not (kind == "op").any():  # Nsight: framework ops are NVTX ranges
        host_kinds.append("annotation")
    sync = names_where(names, lambda n: n.str.contains(SYNC_CALL)) & kind.isin(["runtime", "other"])
    marker = names_where(names, lambda n: n.str.fullmatch(STEP_NAME) | n.isin(PHASE_NAMES))  # whole steps: say nothing
    keep = ((kind.isin(host_kinds) & (events["device"] == "cpu") & ~marker) | sync) & (events["dur_ns"] > 0)
    rows = events[keep]
    copy = names_where(rows["name"], lambda n: n.str.contains(COPY_CALL))
    runtime = (rows["kind"] == "runtime").to_numpy()
    part = np.where(sync[keep], "sync", np.where(runtime & copy, "memcpy", np.where(runtime, "runtime", "host")))
    return pd.DataFrame({"name": rows["name"].astype(str).to_numpy(), "kind": rows["kind"].astype(str).to_numpy(),
                         "device": rows["device"].astype(str).to_numpy(), "pid": rows["pid"].to_numpy(),
                         "start_ns": rows["start_ns"].to_numpy(),
                         "end_ns": (rows["start_ns"] + rows["dur_ns"]).to_numpy(), "part": part})


def names_where(names: pd.Series, test: Callable[[pd.Series], pd.Series]) -> np.ndarray:
    """`test` (a vectorized string predicate) on each row's name, evaluated once per distinct name."""
    categories = pd.Series(names.cat.categories.astype(str))
    hit = test(categories).fillna(False).to_numpy(dtype=bool)
    codes = names.cat.codes.to_numpy()
    return np.where(codes >= 0, hit[np.maximum(codes, 0)], False)


def _launching_pids(trace: Trace) -> dict[str, set[int]]:
    """Per device, the pids of the host ops that launched its work, and the pids of the work itself
    (Nsight gives device work its process's pid; Kineto gives it the device number, which no host
    process has)."""
    work = _device_work(trace)
    if work.empty:
        return {}
    rows = work["row"].to_numpy()
    devices = work["device"].to_numpy()
    launcher = trace.events["launcher"].to_numpy()[rows]
    pid = trace.events["pid"].to_numpy()
    linked = launcher >= 0
    pairs = pd.DataFrame({"device": np.concatenate([devices[linked], devices]),
                          "pid": np.concatenate([pid[launcher[linked]], pid[rows]])})
    unique = pairs.drop_duplicates().sort_values("device", kind="stable")
    device, pid = unique["device"].astype(str).to_numpy(), unique["pid"].to_numpy()
    starts = np.flatnonzero(np.r_[True, device[1:] != device[:-1]]) if len(device) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(device)]  # one slice per device: no per-group DataFrame (a trace may name 200k)
    return {device[a]: set(pid[a:b].tolist()) for a, b in zip(starts, ends, strict=True)}


def _attribute(host: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> dict[str, np.ndarray]:
    """Split each gap [starts, ends) into the `PARTS`, by precedence: a part gets the gap time covered
    by its host events and not by those of an earlier part."""
    parts: dict[str, np.ndarray] = {}
    covered_before = np.zeros(len(starts), dtype=np.int64)
    so_far: list[pd.DataFrame] = []
    for part in PARTS[:-1]:
        so_far.append(host[host["part"] == part])
        union = pd.concat(so_far)
        s, e = merge_intervals(union["start_ns"].to_numpy(), union["end_ns"].to_numpy())
        covered = covered_ns(s, e, starts, ends)
        parts[part] = covered - covered_before
        covered_before = covered
    parts["untraced"] = (ends - starts) - covered_before
    return parts


def _bound(start: np.ndarray, end: np.ndarray) -> int:
    """A bound on |time| of the intervals, for `union_intervals`'s lane separation."""
    return int(max(np.abs(start).max(), np.abs(end).max())) + 1
