"""Nsight Compute's per-launch metrics (`kernel_metrics`) joined to the kernels of a trace.

The two come from different runs of the same variant (ncu replays each kernel, so its durations are
not the timeline's): they are matched by kernel name and order. The n-th launch of a kernel inside the
trace's measured region pairs with the n-th profiled launch of that kernel, since both runs bracket
the same measured iterations (`measure` phase; ncu profiles from cudaProfilerStart). Names are
compared by `name_key`, the function's own name: the tools spell the rest differently (on an H200, Kineto's
`void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, ...)`
is ncu's `void at::<unnamed>::vectorized_layer_norm_kernel<float, float, 0>(int, T2, ...)`).

`measured_work` turns the joined rows into the work the roofline takes from Nsight Compute: FLOPs from
the SASS and tensor-pipe counters (`workbench.trace.formats.ncu`), DRAM bytes read plus written, and ncu's own
kernel duration, measured in the same replay as the counters.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE

DRAM_BYTES = "dram__bytes.sum"
"""DRAM bytes read and written together: the metric of Nsight Compute's roofline sections, used when
`dram__bytes_read.sum` and `dram__bytes_write.sum` were not both collected."""

MEASURED_COLUMNS = ["flops", "bytes", "duration_ns", "dtype", "flops_complete"]
"""Columns of `measured_work`."""

JOIN_COLUMNS = ["row", "name", "start_ns", "dur_ns", "device", "launch"]
"""The trace side of the join: events row, kernel name, times, device, and launch index per name."""


def name_key(name: str) -> str:
    """The form of a kernel name used for matching Kineto's and Nsight Compute's spellings: the function's
    own name, without return type, namespaces, template arguments or parameters. The two tools spell
    those parts differently for one kernel, and launches of one name are paired in order, so the
    instantiations of a template (all named `elementwise_kernel`) pair as the runs launched them."""
    key = _without_trailing_group(_without_trailing_group(name.strip(), "(", ")"), "<", ">")
    words = key.split("::")[-1].split()
    return words[-1] if words else name


def _without_trailing_group(text: str, opening: str, closing: str) -> str:
    """`text` less the bracketed group that ends it (with what it nests), if it ends in one."""
    text = text.rstrip()
    if not text.endswith(closing):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += (text[i] == closing) - (text[i] == opening)
        if depth == 0:
            return text[:i].rstrip() if i > 0 else text
    return text


def trace_kernels(trace: Trace, phase: str | None = PHASE_MEASURE) -> pd.DataFrame:
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


def join_kernel_metrics(trace: Trace, metrics: pa.Table | pd.DataFrame,
                        phase: str | None = PHASE_MEASURE) -> pd.DataFrame:
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
    # the table's `launch` counts launches per ncu spelling; the join counts them per key, as the trace side does
    frame = frame.sort_values("id", kind="stable", na_position="last") if "id" in frame.columns else frame
    frame["launch"] = frame.groupby("_key", sort=False).cumcount().astype(np.int64)
    frame = frame.drop(columns=[c for c in ("row", "name", "start_ns", "dur_ns") if c in frame.columns])
    frame = frame.rename(columns={"device": "ncu_device"}) if "device" in frame.columns else frame
    joined = kernels.merge(frame, how="left", on=["_key", "launch"], sort=False)
    matched = set(zip(kernels["_key"], kernels["launch"], strict=True))
    unmatched = sum((key, launch) not in matched for key, launch in zip(frame["_key"], frame["launch"], strict=True))
    joined = joined.drop(columns="_key")
    joined.attrs["unmatched"] = int(unmatched)
    return joined


def measured_work(trace: Trace, metrics: pa.Table | pd.DataFrame,
                  phase: str | None = PHASE_MEASURE) -> pd.DataFrame:
    """The work Nsight Compute measured for each trace kernel joined to a profiled launch
    (`join_kernel_metrics`), indexed by the kernel's events row.

    | (events row) | flops | bytes | duration_ns | dtype | flops_complete |

    `flops` is ncu's `flops` (CUDA-core plus tensor-core FLOPs); `flops_complete` says a tensor-core counter
    was collected: without one the count misses MMA work and is a lower bound. `bytes` is
    `dram_bytes_read + dram_bytes_write` (else `dram__bytes.sum`), `duration_ns` ncu's
    `gpu__time_duration.sum`, `dtype` the precision with the most FLOPs. NaN / None where not collected.
    Tables written before `flops_tensor` existed count as incomplete.
    """
    joined = join_kernel_metrics(trace, metrics, phase)
    joined = joined[joined["kernel"].notna()] if "kernel" in joined.columns else joined.iloc[:0]
    n = len(joined)
    read, write = (_floats(joined, column, n) for column in ("dram_bytes_read", "dram_bytes_write"))
    moved = np.where(np.isnan(read) | np.isnan(write), _floats(joined, DRAM_BYTES, n), read + write)
    dtype = joined["flops_dtype"] if "flops_dtype" in joined.columns else pd.Series([None] * n, dtype=object)
    return pd.DataFrame({
        "flops": _floats(joined, "flops", n),
        "bytes": moved,
        "duration_ns": _floats(joined, "duration_ns", n),
        "dtype": dtype.astype(object).where(dtype.notna(), None).to_numpy(),
        "flops_complete": ~np.isnan(_floats(joined, "flops_tensor", n)),
    }, index=pd.Index(joined["row"].to_numpy(dtype=np.int64), name="row"))[MEASURED_COLUMNS]


def _floats(frame: pd.DataFrame, column: str, n: int) -> np.ndarray:
    """A numeric column as float64, NaN everywhere when the table lacks it."""
    if column not in frame.columns:
        return np.full(n, np.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
