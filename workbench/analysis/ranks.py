"""Multi-rank jobs: per-rank device time, collective time and its overlap with compute, stragglers.

Input: the ranks of one job on one time axis (`workbench.trace.multirank.read_ranks`, or a mapping
rank → Trace such as the bundles of a rank import). All times are ns, each sum over the rank's
devices of per-device unions (work on several streams counts once):

| column                  | meaning                                                                     |
|-------------------------|-----------------------------------------------------------------------------|
| `busy_ns`, `idle_ns`    | device busy/idle time between each device's first and last work (`idle.py`)  |
| `kernel_ns`             | union of all kernels                                                         |
| `collective_ns`         | union of collective kernels (`COLLECTIVE_KERNEL`: `ncclKernel_*`,           |
|                         | `ncclDevKernel_*`, `rccl*`)                                                  |
| `compute_ns`            | union of the other kernels                                                   |
| `overlap_ns`            | collective time during which a compute kernel ran on the same device         |
| `exposed_collective_ns` | collective time with no compute beside it: communication the rank waits on  |
| `host_collective_ns`    | union of host-side collective calls (`nccl:all_reduce`, `gloo:*`, `c10d::*`) |

so `kernel_ns = compute_ns + collective_ns - overlap_ns`. Steps are `step_windows` of each rank.

Stragglers: a rank whose median step time exceeds the median over ranks of those medians by more
than `threshold` (relative, default 10%) and by more than `mad_k` (default 2) median absolute
deviations of the ranks' medians (raw MAD, not scaled to a normal σ). The second test keeps a job
whose ranks all vary from flagging half of them; with all other ranks equal the MAD is 0 and the
first test decides. With two ranks the MAD is half their difference, so neither is ever flagged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from workbench.analysis.idle import busy_by_device, covered_ns, merge_intervals, names_where
from workbench.analysis.steps import step_windows
from workbench.trace import Trace
from workbench.trace.multirank import COLLECTIVE_KERNEL, COLLECTIVE_OP, RankTrace

RANK_COLUMNS = ("rank", "devices", "steps", "median_step_ns", "busy_ns", "idle_ns", "kernel_ns", "compute_ns",
                "collective_ns", "overlap_ns", "exposed_collective_ns", "overlap_frac", "host_collective_ns",
                "step_excess", "straggler")
"""Columns of `rank_table`, in order."""

Ranks = Sequence[RankTrace] | Mapping[int, Trace]


def by_rank(ranks: Ranks) -> dict[int, Trace]:
    """rank → trace, in rank order, from `read_ranks`'s list or a mapping."""
    pairs = ranks.items() if isinstance(ranks, Mapping) else ((r.rank, r.trace) for r in ranks)
    return dict(sorted(pairs))


def collective_overlap(trace: Trace) -> dict[str, dict[str, int]]:
    """Per device: `{"kernel_ns", "compute_ns", "collective_ns", "overlap_ns"}` (module docstring)."""
    events = trace.events.select(["start_ns", "dur_ns", "name", "kind", "device"]).to_pandas()
    kernels = events[(events["kind"] == "kernel") & (events["device"].astype(str) != "cpu")]
    collective = names_where(kernels["name"], lambda n: n.str.match(COLLECTIVE_KERNEL))
    result = {}
    for device, rows in kernels.groupby(kernels["device"].astype(str), observed=True):
        mine = collective[(kernels["device"].astype(str) == device).to_numpy()]
        start = rows["start_ns"].to_numpy()
        end = start + rows["dur_ns"].to_numpy()
        all_s, all_e = merge_intervals(start, end)
        comp_s, comp_e = merge_intervals(start[~mine], end[~mine])
        coll_s, coll_e = merge_intervals(start[mine], end[mine])
        result[str(device)] = {
            "kernel_ns": int((all_e - all_s).sum()),
            "compute_ns": int((comp_e - comp_s).sum()),
            "collective_ns": int((coll_e - coll_s).sum()),
            "overlap_ns": int(covered_ns(comp_s, comp_e, coll_s, coll_e).sum()),
        }
    return dict(sorted(result.items()))


def host_collective_ns(trace: Trace) -> int:
    """Time (union) the host spent in collective calls (`COLLECTIVE_OP` ops and annotations)."""
    events = trace.events.select(["start_ns", "dur_ns", "name", "kind", "device"]).to_pandas()
    host = events[events["kind"].isin(["op", "annotation"]) & (events["device"].astype(str) == "cpu")]
    hit = names_where(host["name"], lambda n: n.str.match(COLLECTIVE_OP))
    start = host["start_ns"].to_numpy()[hit]
    s, e = merge_intervals(start, start + host["dur_ns"].to_numpy()[hit])
    return int((e - s).sum())


def rank_steps(ranks: Ranks) -> pd.DataFrame:
    """Every profiled step of every rank, on the shared axis: | rank | step | start_ns | end_ns | dur_ns |."""
    frames = [step_windows(trace).assign(rank=rank) for rank, trace in by_rank(ranks).items()]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in ("rank", "step", "start_ns", "end_ns", "dur_ns")})
    steps = pd.concat(frames, ignore_index=True)
    steps["dur_ns"] = steps["end_ns"] - steps["start_ns"]
    return steps[["rank", "step", "start_ns", "end_ns", "dur_ns"]]


def stragglers(median_step_ns: pd.Series, threshold: float = 0.10, mad_k: float = 2.0) -> pd.DataFrame:
    """Per rank (the series' index): `step_excess` (median step over the ranks' median, minus 1) and
    `straggler` (module docstring)."""
    values = median_step_ns.astype(float)
    center = float(values.median()) if len(values) else np.nan
    mad = float((values - center).abs().median()) if len(values) else np.nan
    excess = values / center - 1.0 if center > 0 else values * np.nan
    flag = (excess > threshold) & ((values - center) > mad_k * mad)
    return pd.DataFrame({"step_excess": excess, "straggler": flag.fillna(False).astype(bool)}, index=values.index)


def rank_table(ranks: Ranks, threshold: float = 0.10, mad_k: float = 2.0) -> pd.DataFrame:
    """One row per rank: device busy/idle, kernel, collective and overlap time, median step time and
    whether the rank is a straggler (columns `RANK_COLUMNS`, see the module docstring)."""
    traces = by_rank(ranks)
    steps = rank_steps(traces)
    rows = []
    for rank, trace in traces.items():
        busy = busy_by_device(trace)
        kernels = collective_overlap(trace)
        mine = steps[steps["rank"] == rank]["dur_ns"]
        row = {"rank": rank, "devices": ",".join(sorted(busy.keys() | kernels.keys())), "steps": len(mine),
               "median_step_ns": float(mine.median()) if len(mine) else np.nan,
               "busy_ns": sum(b.busy_ns for b in busy.values()), "idle_ns": sum(b.idle_ns for b in busy.values())}
        for key in ("kernel_ns", "compute_ns", "collective_ns", "overlap_ns"):
            row[key] = sum(k[key] for k in kernels.values())
        row["exposed_collective_ns"] = row["collective_ns"] - row["overlap_ns"]
        row["overlap_frac"] = row["overlap_ns"] / row["collective_ns"] if row["collective_ns"] else np.nan
        row["host_collective_ns"] = host_collective_ns(trace)
        rows.append(row)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in RANK_COLUMNS})
    table = pd.DataFrame(rows)
    flags = stragglers(table.set_index("rank")["median_step_ns"], threshold, mad_k)
    table = table.join(flags, on="rank")
    return table[list(RANK_COLUMNS)]
