"""Synthetic bundles for the timeline data tests: events given as plain rows, written as a capture would."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.trace import Trace
from workbench.trace.schema import EVENTS
from workbench.trace.store.bundle import write_bundle

CPU, STREAM = "cpu/thread 1", "cuda:0/stream 7"


def events_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """An events table from dicts holding start_ns, dur_ns, name, kind, track and optionally parent, depth,
    launcher, shapes (the other columns get neutral values)."""
    def col(key: str, default: Any) -> list[Any]:
        return [row.get(key, default) for row in rows]

    tracks = col("track", CPU)
    data = {
        "start_ns": col("start_ns", 0), "dur_ns": col("dur_ns", 0), "name": col("name", ""),
        "kind": col("kind", "op"), "device": [t.split("/")[0] for t in tracks], "track": tracks,
        "pid": [1] * len(rows), "tid": [1] * len(rows), "corr": [-1] * len(rows), "parent": col("parent", -1),
        "depth": col("depth", 0), "launcher": col("launcher", -1), "flops": col("flops", float("nan")),
        "bytes": [float("nan")] * len(rows), "shapes": col("shapes", None), "dtypes": [None] * len(rows),
        "args": col("args", None),
    }
    return pa.Table.from_pydict({k: pa.array(v).cast(EVENTS.field(k).type) for k, v in data.items()}, schema=EVENTS)


def write_run(root: Path, run_id: str, rows: Sequence[dict[str, Any]]) -> Path:
    """A bundle of the events `rows` under `root`; its folder."""
    return write_bundle(root, run_id, {"device": "cuda:0"}, Trace(events=events_table(rows)))


def gpu_steps(steps: int, ops_per_step: int, seed: int = 0) -> list[dict[str, Any]]:
    """A step-annotated GPU-like trace: per step a `ProfilerStep#k` annotation (depth 0) on the CPU thread
    holding ops (depth 1) that each hold a launch (depth 2), and a kernel per op on the stream, launched by
    the op. Rows are shuffled (a reader need not write them in time order); parents and launchers follow."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    t = 0
    for step in range(steps):
        step_row = len(rows)
        rows.append({"start_ns": t, "name": f"ProfilerStep#{step}", "kind": "annotation", "track": CPU})
        for i in range(ops_per_step):
            dur = int(rng.integers(2_000, 9_000))
            name = ("aten::mm", "aten::add", "aten::gelu")[i % 3]
            op = len(rows)
            rows.append({"start_ns": t, "dur_ns": dur, "name": name, "kind": "op", "track": CPU, "depth": 1,
                         "parent": step_row, "shapes": "[[8, 64], [64, 64]]", "flops": 1e6})
            rows.append({"start_ns": t + 200, "dur_ns": 800, "name": "cudaLaunchKernel", "kind": "runtime",
                         "track": CPU, "depth": 2, "parent": op})
            rows.append({"start_ns": t + 1_500, "dur_ns": int(rng.integers(500, 3_000)),
                         "name": ("gemm_kernel", "add_kernel", "gelu_kernel")[i % 3], "kind": "kernel",
                         "track": STREAM, "launcher": op})
            t += dur + int(rng.integers(0, 2_000))
        rows[step_row]["dur_ns"] = t - rows[step_row]["start_ns"]
        rows.append({"start_ns": t, "dur_ns": 0, "name": "[instant]", "kind": "other", "track": CPU})
        t += 5_000
    order = rng.permutation(len(rows))
    new_of_old = np.empty(len(rows), dtype=np.int64)
    new_of_old[order] = np.arange(len(rows))
    shuffled = [dict(rows[i]) for i in order]
    for row in shuffled:
        for key in ("parent", "launcher"):
            if row.get(key, -1) >= 0:
                row[key] = int(new_of_old[row[key]])
    return shuffled
