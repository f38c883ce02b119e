"""Op and kernel breakdowns over a Trace: pure functions returning DataFrames and plain dicts."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from workbench.trace import Trace
from workbench.trace.schema import DEVICE_KINDS, PHASE_MEASURE

OP_TABLE_COLUMNS = ("name", "calls", "total_ns", "self_ns", "mean_ns", "device_ns", "flops", "flops_per_s", "share",
                    "step_share")


WRAPPER_PATTERN = re.compile(r"ProfilerStep#\d+|## .* ##|\[[^\]]*\|[^\]]*\]", re.DOTALL)
"""Names of profiler wrappers rather than work: the profiler's step ranges (`ProfilerStep#7`), the `## forward ##`
markers of training loops and compiled graphs (`## Call CompiledFxGraph abc ##`) and the bracketed, pipe-separated
labels benchmark harnesses record (`[param|pytorch.model.alex_net|1|measure|forward]`). They span the work of
their step, so a table ranked by total time would lead with them."""


def is_wrapper(names: pd.Series) -> np.ndarray:
    """Per name, whether it is a profiler wrapper (`WRAPPER_PATTERN`, matching the whole name)."""
    text = names.astype(str)
    return text.str.fullmatch(WRAPPER_PATTERN.pattern, flags=re.DOTALL).fillna(False).to_numpy(dtype=bool)


def kind_counts(trace: Trace) -> dict[str, int]:
    """Events per kind, most frequent first."""
    return trace.kind_counts()


def kernel_time_by_device(trace: Trace) -> dict[str, int]:
    """Total kernel time in ns per device (overlapping streams are summed, as nsys does)."""
    events = trace.df()
    kernels = events[events["kind"] == "kernel"]
    totals = kernels.groupby("device", observed=True)["dur_ns"].sum()
    return {str(device): int(ns) for device, ns in totals.items()}


def memory_peaks(trace: Trace) -> dict[str, int]:
    """Peak allocated bytes per device from the memory table."""
    memory = trace.df("memory")
    if memory.empty:
        return {}
    peaks = memory.groupby("device", observed=True)["allocated_bytes"].max()
    return {str(device): int(n) for device, n in peaks.items()}


def self_time_ns(events: pd.DataFrame) -> np.ndarray:
    """Each span's duration minus its children's (time not spent in nested spans on its track)."""
    child_total = np.zeros(len(events), dtype=np.int64)
    parents = events["parent"].to_numpy()
    has_parent = parents >= 0
    np.add.at(child_total, parents[has_parent], events["dur_ns"].to_numpy()[has_parent])
    return np.maximum(events["dur_ns"].to_numpy() - child_total, 0)


def device_time_launched_ns(events: pd.DataFrame) -> np.ndarray:
    """Per event, the duration of the device work launched inside it (its own and nested spans')."""
    launched = np.zeros(len(events), dtype=np.int64)
    launcher = events["launcher"].to_numpy()
    linked = launcher >= 0
    np.add.at(launched, launcher[linked], events["dur_ns"].to_numpy()[linked])
    parent, depth = events["parent"].to_numpy(), events["depth"].to_numpy()
    for level in range(int(depth.max()) if len(depth) else 0, 0, -1):
        rows = np.flatnonzero((depth == level) & (parent >= 0) & (launched > 0))
        np.add.at(launched, parent[rows], launched[rows])
    return launched


def phase_window(trace: Trace, name: str = PHASE_MEASURE) -> tuple[int, int] | None:
    """(start_ns, end_ns) of the first annotation called `name` (the steady-state steps of a capture)."""
    events = trace.df()
    hits = events[(events["kind"] == "annotation") & (events["name"] == name)]
    if hits.empty:
        return None
    first = hits.iloc[0]
    return int(first["start_ns"]), int(first["start_ns"] + first["dur_ns"])


def device_time_ns(events: pd.DataFrame) -> np.ndarray:
    """Per event, its device time: a device event's (kernel, memcpy, ...) own duration; a host event's the summed
    duration of the device work it launched, itself or through the spans nested in it
    (`device_time_launched_ns`)."""
    on_device = events["kind"].astype(str).isin(DEVICE_KINDS).to_numpy()
    return np.where(on_device, events["dur_ns"].to_numpy(dtype=np.int64), device_time_launched_ns(events))


def op_table(trace: Trace, kinds: tuple[str, ...] = ("op",), window: tuple[int, int] | None = None, *,
             wrappers: bool = True) -> pd.DataFrame:
    """Per name of the given kinds: calls, total/self/mean ns, device ns, flops, share.

    | name | calls | total_ns | self_ns | mean_ns | device_ns | flops | flops_per_s | share | step_share |

    Only events starting inside `window` (ns) count when one is given; without `wrappers`, names of profiler
    wrappers (`WRAPPER_PATTERN`: `ProfilerStep#N`...) are left out (their self time still counts in `share`).
    `device_ns` is a device event's own duration and a host event's device time launched (`device_time_ns`).
    `calls` is an int. `flops_per_s` is achieved
    FLOP/s: over the device time launched where the op launched device work, else over its own time.
    `share` is the fraction of all self time of those kinds; `step_share` the fraction of the wall time
    of the window (the profiled steps of a capture; the whole trace without one) that the name's calls
    span (nested names overlap, so these do not add up to 1). Sorted by total time.
    """
    events = trace.df()
    events = events.assign(self_ns=self_time_ns(events), device_ns=device_time_ns(events))
    rows = events[events["kind"].isin(kinds)]
    if window is not None:
        rows = rows[(rows["start_ns"] >= window[0]) & (rows["start_ns"] < window[1])]
    if rows.empty:
        return pd.DataFrame(columns=[*OP_TABLE_COLUMNS])
    grouped = rows.groupby(rows["name"].astype(str), observed=True)
    table = pd.DataFrame({
        "calls": grouped.size().astype(np.int64),
        "total_ns": grouped["dur_ns"].sum(),
        "self_ns": grouped["self_ns"].sum(),
        "device_ns": grouped["device_ns"].sum(),
        "flops": grouped["flops"].sum(min_count=1),
    })
    table["mean_ns"] = table["total_ns"] / table["calls"]
    seconds = np.where(table["device_ns"] > 0, table["device_ns"], table["total_ns"]) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        table["flops_per_s"] = np.where(seconds > 0, table["flops"].to_numpy(dtype=np.float64) / seconds, np.nan)
    total_self = table["self_ns"].sum()
    table["share"] = table["self_ns"] / total_self if total_self else 0.0
    table["step_share"] = table["total_ns"] / _span_ns(events, window)
    table = table.reset_index(names="name").sort_values("total_ns", ascending=False, ignore_index=True)
    if not wrappers:  # after the shares: a wrapper's self time is still part of all self time
        table = table[~is_wrapper(table["name"])].reset_index(drop=True)
    return table[[*OP_TABLE_COLUMNS]]


def _span_ns(events: pd.DataFrame, window: tuple[int, int] | None) -> int:
    """Wall time of the window, or of the whole trace, at least 1 ns."""
    if window is not None:
        return max(window[1] - window[0], 1)
    if events.empty:
        return 1
    return max(int((events["start_ns"] + events["dur_ns"]).max() - events["start_ns"].min()), 1)
