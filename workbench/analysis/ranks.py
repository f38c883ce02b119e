"""Multi-rank jobs: per-rank device time, collective time and its overlap with compute, stragglers.

Input: the ranks of one job on one time axis (`workbench.trace.ranks.multirank.read_ranks`, or a mapping
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

Every figure is computed in two halves, so that the ranks of a large job can be analysed where their
bundles are (`workbench.analysis.rank_queries`, on a Ray cluster or a local pool) without the driver loading
their events: `rank_partial` reduces one rank's trace to a `RankPartial` (a few numbers and its step
windows), `combine` joins the partials of all ranks into the per-rank table, the steps and their spread.
`rank_table` and `rank_steps` are the same two halves run here.

Stragglers: a rank whose median step time exceeds the median over ranks of those medians by more
than `threshold` (relative, default 10%) and by more than `mad_k` (default 2) median absolute
deviations of the ranks' medians (raw MAD, not scaled to a normal σ). The second test keeps a job
whose ranks all vary from flagging half of them; with all other ranks equal the MAD is 0 and the
first test decides. With two ranks the MAD is half their difference, so neither is ever flagged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.idle import busy_by_device, covered_ns, merge_intervals, names_where
from workbench.analysis.steps import step_windows
from workbench.trace import Trace
from workbench.trace.ranks.multirank import COLLECTIVE_KERNEL, COLLECTIVE_OP, RankTrace

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


@dataclass(frozen=True)
class RankPartial:
    """One rank's share of the job's analysis (module docstring): its sums and its step windows."""

    rank: int
    devices: str
    busy_ns: int
    idle_ns: int
    kernel_ns: int
    compute_ns: int
    collective_ns: int
    overlap_ns: int
    host_collective_ns: int
    steps: tuple[tuple[int, int, int], ...]
    """(step, start_ns, end_ns) of each profiled step, on the job's axis."""


@dataclass(frozen=True)
class RankAggregates:
    """The job's analysis from the partials of its ranks: `table` (`RANK_COLUMNS`), `steps` (`rank_steps`'
    columns) and `spread` (`SPREAD_COLUMNS`, `step_spread`)."""

    table: pd.DataFrame
    steps: pd.DataFrame
    spread: pd.DataFrame


SPREAD_COLUMNS = ("step", "ranks", "min_ns", "median_ns", "max_ns", "spread_ns", "slowest_rank")
"""Columns of `step_spread`: per step index, its duration over the ranks that have it, and the slowest rank."""

_STEP_COLUMNS = ("rank", "step", "start_ns", "end_ns", "dur_ns")


def rank_partial(rank: int, trace: Trace) -> RankPartial:
    """Reduce one rank's trace to its `RankPartial` (the half of the analysis that reads events)."""
    busy = busy_by_device(trace)
    kernels = collective_overlap(trace)
    windows = step_windows(trace)
    sums = {key: sum(k[key] for k in kernels.values()) for key in ("kernel_ns", "compute_ns", "collective_ns",
                                                                  "overlap_ns")}
    return RankPartial(rank=rank, devices=",".join(sorted(busy.keys() | kernels.keys())),
                       busy_ns=sum(b.busy_ns for b in busy.values()), idle_ns=sum(b.idle_ns for b in busy.values()),
                       host_collective_ns=host_collective_ns(trace), **sums,
                       steps=tuple(zip(windows["step"].tolist(), windows["start_ns"].tolist(),
                                       windows["end_ns"].tolist(), strict=True)))


def combine(partials: Iterable[RankPartial], threshold: float = 0.10, mad_k: float = 2.0) -> RankAggregates:
    """Join the ranks' partials (any order) into the job's `RankAggregates`; stragglers by `threshold` and
    `mad_k` (module docstring)."""
    ordered = sorted(partials, key=lambda p: p.rank)
    steps = pd.DataFrame([(p.rank, *step) for p in ordered for step in p.steps],
                         columns=list(_STEP_COLUMNS[:4])).astype(np.int64)
    steps["dur_ns"] = steps["end_ns"] - steps["start_ns"]
    rows = []
    for p in ordered:
        mine = steps.loc[steps["rank"] == p.rank, "dur_ns"]
        row = {"rank": p.rank, "devices": p.devices, "steps": len(mine),
               "median_step_ns": float(mine.median()) if len(mine) else np.nan, "busy_ns": p.busy_ns,
               "idle_ns": p.idle_ns, "kernel_ns": p.kernel_ns, "compute_ns": p.compute_ns,
               "collective_ns": p.collective_ns, "overlap_ns": p.overlap_ns,
               "exposed_collective_ns": p.collective_ns - p.overlap_ns,
               "overlap_frac": p.overlap_ns / p.collective_ns if p.collective_ns else np.nan,
               "host_collective_ns": p.host_collective_ns}
        rows.append(row)
    if not rows:
        table = pd.DataFrame({c: pd.Series(dtype=object) for c in RANK_COLUMNS})
    else:
        table = pd.DataFrame(rows)
        table = table.join(stragglers(table.set_index("rank")["median_step_ns"], threshold, mad_k), on="rank")
        table = table[list(RANK_COLUMNS)]
    return RankAggregates(table=table, steps=steps[list(_STEP_COLUMNS)], spread=step_spread(steps))


def step_spread(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step index (`rank_steps` rows): how many ranks have it, the min, median and max of its duration over
    them, the spread (max - min: the time the fastest rank waits at the step's end for the slowest, when each
    step ends in a collective) and the slowest rank."""
    if steps.empty:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in SPREAD_COLUMNS})
    by_step = steps.groupby("step")["dur_ns"]
    spread = pd.DataFrame({"ranks": by_step.size(), "min_ns": by_step.min(), "median_ns": by_step.median(),
                           "max_ns": by_step.max()})
    spread["spread_ns"] = spread["max_ns"] - spread["min_ns"]
    spread["slowest_rank"] = steps.loc[by_step.idxmax().to_numpy(), "rank"].to_numpy()
    return spread.reset_index()[list(SPREAD_COLUMNS)]


def rank_aggregates(ranks: Ranks, threshold: float = 0.10, mad_k: float = 2.0) -> RankAggregates:
    """The job's `RankAggregates`, computed here from the ranks' traces."""
    return combine((rank_partial(rank, trace) for rank, trace in by_rank(ranks).items()), threshold, mad_k)


def rank_steps(ranks: Ranks) -> pd.DataFrame:
    """Every profiled step of every rank, on the shared axis: | rank | step | start_ns | end_ns | dur_ns |."""
    frames = [step_windows(trace).assign(rank=rank) for rank, trace in by_rank(ranks).items()]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in _STEP_COLUMNS})
    steps = pd.concat(frames, ignore_index=True)
    steps["dur_ns"] = steps["end_ns"] - steps["start_ns"]
    return steps[list(_STEP_COLUMNS)]


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
    return rank_aggregates(ranks, threshold, mad_k).table
