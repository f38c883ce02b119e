"""Device busy/idle time and gap causes, checked against the raw Kineto JSON and Nsight SQLite."""

from __future__ import annotations

import sqlite3
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import fixture_path, load_raw, write_trace

from workbench.analysis.idle import (
    GAP_COLUMNS,
    PARTS,
    busy_by_device,
    covered_ns,
    host_activity,
    idle_gaps,
    idle_summary,
    merge_intervals,
)
from workbench.trace import Trace, read_trace
from workbench.trace import schema as trace_schema

KINETO_DEVICE_CATEGORIES = {"Kernel", "Memcpy", "Memset", "kernel", "gpu_memcpy", "gpu_memset"}


# -- raw-trace references, computed without the workbench -------------------------------------------


@lru_cache(maxsize=2)
def raw_events(path: Path) -> list[dict]:
    """The raw `traceEvents` of a Kineto file (the last two kept: several checks read the same file)."""
    return load_raw(path)["traceEvents"]


def raw_kineto_work(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per device (`cuda:N`), start and end (absolute ns) of every kernel/memcpy/memset span of positive length."""
    per_device: dict[str, list[tuple[int, int]]] = {}
    for event in raw_events(path):
        if event.get("ph") == "X" and event.get("cat") in KINETO_DEVICE_CATEGORIES and event.get("dur", 0) > 0:
            start = round(event["ts"] * 1000)
            end = start + round(event["dur"] * 1000)
            per_device.setdefault(f"cuda:{event['args']['device']}", []).append((start, end))
    return {d: (np.array([s for s, _ in v]), np.array([e for _, e in v])) for d, v in per_device.items()}


def raw_nsys_work(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per device, start and end (nsys clock ns) of every kernel, memcpy and memset with positive length."""
    query = " UNION ALL ".join(f"SELECT deviceId, start, end FROM {t} WHERE end > start" for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    with sqlite3.connect(path) as db:
        rows = np.array(db.execute(query).fetchall(), dtype=np.int64)
    return {f"cuda:{d}": (rows[rows[:, 0] == d, 1], rows[rows[:, 0] == d, 2]) for d in np.unique(rows[:, 0])}


def raw_idle(starts: np.ndarray, ends: np.ndarray) -> dict[str, int]:
    """Busy time on the union of the intervals, and the largest gap between consecutive merged intervals."""
    order = np.argsort(starts, kind="stable")
    merged: list[list[int]] = []
    for s, e in zip(starts[order].tolist(), ends[order].tolist(), strict=True):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    gaps = [(merged[i + 1][0] - merged[i][1], merged[i][1]) for i in range(len(merged) - 1)]
    largest = max(gaps) if gaps else (0, None)
    busy = sum(e - s for s, e in merged)
    return {"busy_ns": busy, "span_ns": merged[-1][1] - merged[0][0], "largest_gap_ns": largest[0],
            "largest_gap_start_abs": largest[1], "span_start_abs": merged[0][0], "gaps": len(gaps)}


def kineto_origin_ns(path: Path, trace: Trace) -> int:
    """The reader's origin on the raw file's clock (µs × 1000): the earliest timestamp of any record but
    metadata. `metadata["origin_ns"]` states it too, but only to ~0.1 µs (µs floats past 2^53 once × 1000)."""
    origin = round(min(e["ts"] for e in raw_events(path) if e.get("ph") != "M" and "ts" in e) * 1000)
    base = trace.metadata["source"]["header"].get("baseTimeNanoseconds", 0)
    assert abs(trace.metadata["origin_ns"] - base - origin) < 1000
    return origin


# -- real GPU traces --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["resnet50_v100_train.pt.trace.json.gz", "diff_control.json.gz",
                                  "diff_test.json.gz"])
def test_kineto_idle_matches_the_raw_trace(name: str) -> None:
    path = fixture_path("kineto", name)
    trace = read_trace(path)
    raw = {d: raw_idle(*w) for d, w in raw_kineto_work(path).items()}
    summary = idle_summary(trace)
    assert set(summary) == set(raw)
    origin = kineto_origin_ns(path, trace)
    for device, expected in raw.items():
        got = summary[device]
        assert got["busy_ns"] == expected["busy_ns"]
        assert got["idle_ns"] == expected["span_ns"] - expected["busy_ns"]
        assert got["largest_gap_ns"] == expected["largest_gap_ns"] > 0
        assert got["largest_gap_start_ns"] == expected["largest_gap_start_abs"] - origin
        assert got["span_start_ns"] == expected["span_start_abs"] - origin
        assert got["gaps"] == expected["gaps"]


def test_nsys_idle_matches_the_sqlite_tables() -> None:
    path = fixture_path("nsys", "h100_2gpu_1s.sqlite")
    trace = read_trace(path)
    raw = {d: raw_idle(*w) for d, w in raw_nsys_work(path).items()}
    summary = idle_summary(trace)
    assert set(summary) == set(raw) == {"cuda:0", "cuda:1"}
    for device, expected in raw.items():
        got = summary[device]
        assert got["busy_ns"] == expected["busy_ns"]
        assert got["idle_ns"] == expected["span_ns"] - expected["busy_ns"]
        assert got["largest_gap_ns"] == expected["largest_gap_ns"]
        assert got["largest_gap_start_ns"] == expected["largest_gap_start_abs"] - trace.metadata["origin_ns"]


def test_resnet_largest_gap_is_the_data_loader_on_the_host() -> None:
    """The raw trace shows the DataLoader op covering the largest gap: the gap is host-bound."""
    path = fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz")
    trace = read_trace(path)
    gaps = idle_gaps(trace)
    largest = gaps.iloc[0]
    origin = kineto_origin_ns(path, trace)
    a, b = largest["start_ns"] + origin, largest["end_ns"] + origin
    covering = {e["name"] for e in raw_events(path)
                if e.get("ph") == "X" and e.get("cat") == "Operator" and not e["name"].startswith("ProfilerStep")
                and min(b, round((e["ts"] + e["dur"]) * 1000)) - max(a, round(e["ts"] * 1000)) > 0.9 * (b - a)}
    assert any("DataLoader" in n for n in covering)
    assert largest["cause"] == "host-bound"
    assert largest["host_ns"] >= 0.9 * largest["dur_ns"]
    top = host_activity(trace, int(largest["start_ns"]), int(largest["end_ns"]), "cuda:0")
    assert any("DataLoader" in t["name"] for t in top)
    assert not any(t["name"].startswith("ProfilerStep") for t in top)  # step markers explain nothing


@pytest.mark.parametrize("name", ["resnet50_v100_train.pt.trace.json.gz", "amd_mi250_train.json.gz"])
def test_gap_parts_add_up_and_gaps_sum_to_idle(name: str) -> None:
    trace = read_trace(fixture_path("kineto", name))
    gaps = idle_gaps(trace)
    assert list(gaps.columns) == list(GAP_COLUMNS)
    parts = gaps[[f"{p}_ns" for p in PARTS]]
    assert (parts >= 0).all().all()
    assert (parts.sum(axis=1) == gaps["dur_ns"]).all()
    assert (gaps["dur_ns"].diff().dropna() <= 0).all()  # longest first
    for device, summary in idle_summary(trace).items():
        mine = gaps[gaps["device"] == device]
        assert mine["dur_ns"].sum() == summary["idle_ns"]
        assert len(mine) == summary["gaps"]


def test_cpu_only_trace_has_no_devices() -> None:
    trace = read_trace(fixture_path("kineto", "cpu_only_rank34.pt.trace.json.gz"))
    assert idle_summary(trace) == {}
    gaps = idle_gaps(trace)
    assert gaps.empty and list(gaps.columns) == list(GAP_COLUMNS)


# -- small traces with known answers ---------------------------------------------------------------


def _gap_trace(path: Path, host_call: str) -> Trace:
    """Kernel A [0, 10) µs, then on the host `host_call` [12, 50), an op [51, 59) launching kernel B
    [60, 70) through cudaLaunchKernel [52, 58). The first event is at 0: times are the same in ns from
    the origin."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "A", "pid": 0, "tid": 7, "ts": 0, "dur": 10,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": host_call, "pid": 1, "tid": 1, "ts": 12, "dur": 38,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 51, "dur": 8, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 52, "dur": 6,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "B", "pid": 0, "tid": 7, "ts": 60, "dur": 10,
         "args": {"device": 0, "stream": 7, "correlation": 2}},
    ]
    return read_trace(write_trace(path / f"{host_call}.json", events))


@pytest.mark.parametrize(("host_call", "part", "cause"), [
    ("cudaStreamSynchronize", "sync", "sync"),
    ("cudaDeviceSynchronize", "sync", "sync"),
    ("cudaMemcpy", "sync", "sync"),  # a blocking copy waits like a sync
    ("cudaMemcpyAsync", "memcpy", "memcpy"),
    ("cudaMalloc", "runtime", "host-bound"),
])
def test_gap_cause_from_the_host_call_during_it(tmp_path: Path, host_call: str, part: str, cause: str) -> None:
    trace = _gap_trace(tmp_path, host_call)
    gaps = idle_gaps(trace)
    assert len(gaps) == 1
    gap = gaps.iloc[0]
    assert (gap["start_ns"], gap["dur_ns"]) == (10_000, 50_000)
    expected = {"sync": 0, "memcpy": 0, "runtime": 6_000, "host": 2_000, "untraced": 4_000}
    expected[part] += 38_000
    assert {p: int(gap[f"{p}_ns"]) for p in PARTS} == expected
    assert gap["cause"] == cause
    assert idle_summary(trace)["cuda:0"] == {
        "busy_ns": 20_000, "idle_ns": 50_000, "largest_gap_ns": 50_000, "largest_gap_start_ns": 10_000,
        "span_ns": 70_000, "span_start_ns": 0, "span_end_ns": 70_000, "gaps": 1}


def test_window_clips_work_and_counts_leading_and_trailing_idle(tmp_path: Path) -> None:
    trace = _gap_trace(tmp_path, "cudaStreamSynchronize")
    got = idle_summary(trace, window=(5_000, 80_000))["cuda:0"]
    assert got["busy_ns"] == 5_000 + 10_000
    assert got["idle_ns"] == 75_000 - 15_000
    assert got["gaps"] == 2  # [10, 60) and the trailing [70, 80)
    assert (got["largest_gap_ns"], got["largest_gap_start_ns"]) == (50_000, 10_000)
    assert idle_summary(trace, window=(20_000, 55_000)) == {}


def _events(rows: list[dict]) -> Trace:
    """A Trace from a few rows (other columns get their neutral values)."""
    n = len(rows)
    columns = {"pid": [0] * n, "tid": [0] * n, "corr": [-1] * n, "parent": [-1] * n, "depth": [0] * n,
               "launcher": [-1] * n, "flops": [float("nan")] * n, "bytes": [float("nan")] * n,
               "shapes": [None] * n, "dtypes": [None] * n, "args": [None] * n}
    for key in ("start_ns", "dur_ns", "name", "kind", "device"):
        columns[key] = [r[key] for r in rows]
    columns["track"] = [f"{r['device']}/x" for r in rows]
    table = pa.table({f.name: pa.array(columns[f.name], type=f.type if not pa.types.is_dictionary(f.type)
                                       else pa.string()) for f in trace_schema.EVENTS})
    return Trace(events=table)


def test_union_over_streams_and_kinds_xla_ops_count_modules_do_not() -> None:
    trace = _events([
        {"start_ns": 0, "dur_ns": 100, "name": "k1", "kind": "kernel", "device": "cuda:0"},
        {"start_ns": 50, "dur_ns": 100, "name": "copy", "kind": "memcpy", "device": "cuda:0"},  # other stream
        {"start_ns": 300, "dur_ns": 0, "name": "instant", "kind": "kernel", "device": "cuda:0"},  # not busy
        {"start_ns": 400, "dur_ns": 10, "name": "set", "kind": "memset", "device": "cuda:0"},
        {"start_ns": 0, "dur_ns": 1000, "name": "jit_f", "kind": "module", "device": "tpu:0"},
        {"start_ns": 10, "dur_ns": 20, "name": "fusion", "kind": "hlo", "device": "tpu:0"},
        {"start_ns": 60, "dur_ns": 20, "name": "dot", "kind": "hlo", "device": "tpu:0"},
        {"start_ns": 0, "dur_ns": 500, "name": "aten::mm", "kind": "op", "device": "cpu"},
    ])
    summary = idle_summary(trace)
    assert set(summary) == {"cuda:0", "tpu:0"}
    assert summary["cuda:0"]["busy_ns"] == 160
    assert (summary["cuda:0"]["largest_gap_ns"], summary["cuda:0"]["largest_gap_start_ns"]) == (250, 150)
    assert summary["cuda:0"]["gaps"] == 1
    assert summary["tpu:0"] == {"busy_ns": 40, "idle_ns": 30, "largest_gap_ns": 30, "largest_gap_start_ns": 30,
                                "span_ns": 70, "span_start_ns": 10, "span_end_ns": 80, "gaps": 1}
    assert busy_by_device(trace)["cuda:0"].starts.tolist() == [0, 400]


def test_merge_and_coverage_agree_with_counting_every_ns() -> None:
    rng = np.random.default_rng(7)
    start = rng.integers(0, 1000, 60)
    end = start + rng.integers(0, 40, 60)
    s, e = merge_intervals(start, end)
    timeline = np.zeros(1100, dtype=bool)
    for a, b in zip(start, end, strict=True):
        timeline[a:b] = True
    assert (e - s).sum() == timeline.sum()
    assert (s[1:] > e[:-1]).all()
    qa = rng.integers(0, 1000, 50)
    qb = qa + rng.integers(0, 200, 50)
    expected = [timeline[a:b].sum() for a, b in zip(qa, qb, strict=True)]
    assert covered_ns(s, e, qa, qb).tolist() == expected
    assert covered_ns(np.zeros(0, np.int64), np.zeros(0, np.int64), qa, qb).tolist() == [0] * 50
