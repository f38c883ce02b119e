"""What the bottleneck detectors share: the `Finding` record, the `Thresholds` knobs, the `FindingContext`
(events in the window, busy intervals per device, reference spans) and the small formatting helpers of
their evidence and titles (`workbench.analysis.findings.bottlenecks` runs the detectors)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.idle import DEVICE_WORK_KINDS, DeviceBusy, HostActivity, busy_by_device, names_where
from workbench.trace import Trace

EVENT_COLUMNS = ["start_ns", "dur_ns", "name", "kind", "device", "pid", "parent", "depth", "launcher", "bytes",
                 "dtypes"]
"""Event columns the detectors read (`FindingContext.events`)."""
MAX_DEVICES = 64
"""Devices the detectors look at, the busiest first: a trace naming thousands of devices (a hostile upload, a
mislabelled export) costs the findings no more than a node of real accelerators."""


@dataclass(frozen=True)
class Thresholds:
    """Knobs of the detectors."""

    short_kernel_ns: int = 10_000
    """Device work shorter than this is at the scale of a kernel launch (~5-10 µs)."""
    min_stretch: int = 20
    """Consecutive short device items that make a launch-bound stretch."""
    min_stretch_idle: float = 0.2
    """Idle fraction of a stretch below which the device keeps up (queue full): not launch-bound."""
    min_chain: int = 3
    """Consecutive elementwise kernels (or host ops) that make an unfused chain."""
    low_occupancy_pct: float = 25.0
    """Achieved occupancy (%) below which a kernel counts as low-occupancy."""
    min_share: float = 0.0
    """Findings with a smaller time_share are left out."""


@dataclass(frozen=True)
class Finding:
    """One bottleneck: its kind, the share of time it concerns, the evidence and what to try next."""

    kind: str
    time_share: float
    evidence: dict[str, Any]
    suggestion: str
    title: str = ""
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `{"kind", "time_share", "evidence", "suggestion", "title", "device"}`."""
        return {"kind": self.kind, "time_share": float(self.time_share), "evidence": json_ready(self.evidence),
                "suggestion": self.suggestion, "title": self.title, "device": self.device}


@dataclass
class FindingContext:
    """What the detectors share: events (in the window), busy intervals per device (the `MAX_DEVICES`
    busiest), reference spans."""

    trace: Trace
    window: tuple[int, int] | None
    thresholds: Thresholds
    events: pd.DataFrame = field(init=False)
    busy: dict[str, DeviceBusy] = field(init=False)
    host: HostActivity = field(init=False)
    trace_span_ns: int = field(init=False)

    def __post_init__(self) -> None:
        events = self.trace.events.select(EVENT_COLUMNS).to_pandas()  # name stays categorical: regexes per name
        events["row"] = np.arange(len(events))
        for column in ("kind", "device"):
            events[column] = events[column].astype(str)
        events["end_ns"] = events["start_ns"] + events["dur_ns"]
        if self.window is not None:
            events = events[(events["start_ns"] >= self.window[0]) & (events["start_ns"] < self.window[1])]
            self.trace_span_ns = max(self.window[1] - self.window[0], 1)
        else:
            self.trace_span_ns = max(int(events["end_ns"].max() - events["start_ns"].min()), 1) if len(events) else 1
        self.events = events
        busy = busy_by_device(self.trace, self.window)
        busiest = sorted(busy, key=lambda device: -busy[device].busy_ns)[:MAX_DEVICES]
        self.busy = {device: busy[device] for device in sorted(busiest)}
        self.host = HostActivity(self.trace)
        self._work_by_device: dict[str, pd.DataFrame] | None = None

    def named(self, pattern: re.Pattern[str]) -> pd.Series:
        """Which events' names match `pattern` (from their start)."""
        return pd.Series(names_where(self.events["name"], lambda n: n.str.match(pattern)), index=self.events.index)

    def device_work(self, device: str) -> pd.DataFrame:
        """The device's work events, in time order (split by device once, for all detectors)."""
        if self._work_by_device is None:
            work = self.events[self.events["device"].isin(self.busy) & self.events["kind"].isin(DEVICE_WORK_KINDS)]
            work = work.sort_values(["start_ns", "row"], kind="stable")
            self._work_by_device = dict(tuple(work.groupby("device", sort=False)))
        return self._work_by_device.get(device, self.events.iloc[:0])


def top_names(rows: pd.DataFrame, top: int = 5) -> list[dict[str, Any]]:
    """The names with most time among `rows`: `[{"name", "count", "ns"}]`."""
    if rows.empty:
        return []
    grouped = rows.groupby("name")["dur_ns"].agg(["size", "sum"]).sort_values("sum", ascending=False).head(top)
    return [{"name": str(n), "count": int(r["size"]), "ns": int(r["sum"])} for n, r in grouped.iterrows()]


def clamp_share(value: float) -> float:
    """A time share clamped to [0, 1]."""
    return float(min(max(value, 0.0), 1.0))


def number_or_none(value: Any) -> float | None:
    """A float, None for a missing or NaN value (pandas sums of nothing)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def ms_text(ns: int | None) -> str:
    """A duration in ns as milliseconds for titles, "n/a" when unknown."""
    return "n/a" if ns is None else f"{ns / 1e6:.3f} ms"


def json_ready(value: Any) -> Any:
    """JSON-ready copy: numpy scalars to Python, NaN to None, tuples and arrays to lists."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_ready(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
