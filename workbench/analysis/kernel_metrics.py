"""Nsight Compute's per-launch metrics (`kernel_metrics`) joined to the kernels of a trace.

The two come from different runs of the same variant (ncu replays each kernel, so its durations are
not the timeline's): they are matched by kernel name and order. The n-th launch of a kernel inside the
trace's measured region pairs with the n-th profiled launch of that kernel, since both runs bracket
the same measured iterations (`measure` phase; ncu profiles from cudaProfilerStart). Names are
compared with whitespace removed, as tools print template arguments with and without spaces.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.trace import Trace

MEASURE = "measure"
"""The phase (annotation) holding the measured iterations that ncu profiles."""

JOIN_COLUMNS = ["row", "name", "start_ns", "dur_ns", "device", "launch"]
"""The trace side of the join: events row, kernel name, times, device, and launch index per name."""


def name_key(name: str) -> str:
    """The form of a kernel name used for matching: without whitespace."""
    return re.sub(r"\s+", "", name)


def trace_kernels(trace: Trace, phase: str | None = MEASURE) -> pd.DataFrame:
    """The trace's kernels (inside the first annotation named `phase`, when the trace has one), in start
    order, each with its launch index among the kernels of the same name.

    | row | name | start_ns | dur_ns | device | launch |
    """
    events = trace.df("events")
    kernels = events[events["kind"] == "kernel"]
    if phase is not None:
        marks = events[(events["kind"] == "annotation") & (events["name"] == phase)]
        if len(marks):
            start = int(marks["start_ns"].iloc[0])
            end = start + int(marks["dur_ns"].iloc[0])
            kernels = kernels[(kernels["start_ns"] >= start) & (kernels["start_ns"] <= end)]
    table = pd.DataFrame({
        "row": kernels.index.to_numpy(dtype=np.int64),
        "name": kernels["name"].astype(str).to_numpy(),
        "start_ns": kernels["start_ns"].to_numpy(),
        "dur_ns": kernels["dur_ns"].to_numpy(),
        "device": kernels["device"].astype(str).to_numpy(),
    })
    table = table.sort_values(["start_ns", "row"], kind="stable", ignore_index=True)
    table["launch"] = table.groupby(table["name"].map(name_key), sort=False).cumcount().astype(np.int64)
    return table[JOIN_COLUMNS]


def join_kernel_metrics(trace: Trace, metrics: pa.Table | pd.DataFrame, phase: str | None = MEASURE) -> pd.DataFrame:
    """The trace's kernels (see `trace_kernels`) with the metrics of the matching profiled launch.

    | row | name | start_ns | dur_ns | device | launch | id | kernel | duration_ns | sm_throughput_pct | … |

    Every trace kernel is kept; metric columns are NaN where ncu did not profile that launch (its
    `--kernel-name` filter or `--launch-count` left it out). `attrs["unmatched"]` counts profiled
    launches that match no trace kernel.
    """
    frame = metrics.to_pandas() if isinstance(metrics, pa.Table) else metrics.copy()
    kernels = trace_kernels(trace, phase)
    frame["_key"] = frame["kernel"].astype(str).map(name_key)
    kernels["_key"] = kernels["name"].map(name_key)
    frame = frame.drop(columns=[c for c in ("row", "name", "start_ns", "dur_ns") if c in frame.columns])
    frame = frame.rename(columns={"device": "ncu_device"}) if "device" in frame.columns else frame
    joined = kernels.merge(frame, how="left", on=["_key", "launch"], sort=False)
    matched = set(zip(kernels["_key"], kernels["launch"], strict=True))
    unmatched = sum((key, launch) not in matched for key, launch in zip(frame["_key"], frame["launch"], strict=True))
    joined = joined.drop(columns="_key")
    joined.attrs["unmatched"] = int(unmatched)
    return joined
