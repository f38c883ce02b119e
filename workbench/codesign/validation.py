"""How far projections are from measured times: per operator kind and in total, for a graph whose `measured_ns`
is known (a captured run's ops, or a forward timed op by op on this CPU).

The error of a group is projected / measured − 1 over its summed times (negative: the projection is faster than
what was measured, as a roofline of perfect kernels is); `abs_log_error` is the median over operators of
|ln(projected / measured)|, the typical factor by which one operator is off whatever the sign.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.codesign.description import Description
from workbench.codesign.projection import project

ERROR_COLUMNS = ("group", "ops", "measured_ns", "projected_ns", "error", "abs_log_error")


def projection_error(graph: pd.DataFrame, description: Description) -> pd.DataFrame:
    """Per operator kind, then "total": | group | ops | measured_ns | projected_ns | error | abs_log_error |, over
    the operators with a measured time."""
    projection = project(graph, description)
    timed = projection[projection["measured_ns"] > 0]
    rows = [_error(kind, ops) for kind, ops in timed.groupby("kind", sort=False)]
    rows.sort(key=lambda row: -row["measured_ns"])
    rows.append(_error("total", timed))
    return pd.DataFrame(rows, columns=list(ERROR_COLUMNS))


def _error(group: str, ops: pd.DataFrame) -> dict[str, Any]:
    measured, projected = float(ops["measured_ns"].sum()), float(ops["time_ns"].sum())
    ratios = ops["time_ns"].to_numpy() / ops["measured_ns"].to_numpy()
    positive = ratios[ratios > 0]
    return {"group": group, "ops": len(ops), "measured_ns": measured, "projected_ns": projected,
            "error": projected / measured - 1.0 if measured else np.nan,
            "abs_log_error": float(np.median(np.abs(np.log(positive)))) if len(positive) else np.nan}


def timed_forward_graph(module: Any, inputs: Sequence[Any], repeats: int = 5) -> pd.DataFrame:
    """The graph of a forward with each op's shortest wall time over `repeats` timed forwards (after one warm-up):
    the shortest, not the median, since on a shared CPU a time slice lost to another process lands on whichever op
    was running, and the fastest call is the one nothing interrupted."""
    from workbench.codesign.graph import graph_from_model

    graph_from_model(module, inputs, timed=True)
    runs = [graph_from_model(module, inputs, timed=True) for _ in range(repeats)]
    graph = runs[0].copy()
    graph["measured_ns"] = np.min(np.stack([run["measured_ns"].to_numpy() for run in runs]), axis=0)
    return graph


def dispatch_overhead_s(repeats: int = 2000) -> float:
    """This CPU's cost of one eager op that does no work (median of timed adds of one-element tensors): what an op
    costs before its FLOPs and bytes, the `op_overhead` of a CPU description."""
    import torch

    a, b = torch.ones(1), torch.ones(1)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        torch.add(a, b)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) * 1e-9
