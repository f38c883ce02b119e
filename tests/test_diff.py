"""Trace diff, checked against counts computed from the raw JSON of the shared control/test pair."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import fixture_path, load_raw, write_trace

from workbench.analysis.diff import DIFF_COLUMNS, aligned_pair, diff_summary, trace_diff
from workbench.trace import Trace, read_trace

RAW_KIND = {"kernel": "kernel", "cpu_op": "op", "gpu_memcpy": "memcpy", "cuda_runtime": "runtime"}


@pytest.fixture(scope="module")
def pair() -> dict:
    paths = {side: fixture_path("kineto", f"diff_{side}.json.gz") for side in ("control", "test")}
    raws = {side: load_raw(p)["traceEvents"] for side, p in paths.items()}
    traces = {side: read_trace(p) for side, p in paths.items()}
    return {"paths": paths, "raw": raws, "trace": traces, "diff": trace_diff(traces["control"], traces["test"])}


def raw_totals(events: list[dict]) -> tuple[Counter, Counter]:
    """Count and total ns per (name, kind) of the complete spans of the categories in `RAW_KIND`."""
    count: Counter = Counter()
    time: Counter = Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in RAW_KIND:
            key = (e["name"], RAW_KIND[e["cat"]])
            count[key] += 1
            time[key] += round(e["dur"] * 1000)
    return count, time


def test_counts_and_times_match_the_raw_json(pair: dict) -> None:
    diff = pair["diff"]
    assert list(diff.columns) == list(DIFF_COLUMNS)
    rows = diff[diff["kind"].isin(set(RAW_KIND.values()))].set_index(["name", "kind"])
    for side, suffix in (("control", "a"), ("test", "b")):
        count, time = raw_totals(pair["raw"][side])
        present = rows[rows[f"count_{suffix}"] > 0]
        assert dict(present[f"count_{suffix}"]) == dict(count)
        assert dict(present[f"time_{suffix}_ns"]) == dict(time)
    assert (diff["delta_count"] == diff["count_b"] - diff["count_a"]).all()
    assert (diff["delta_ns"] == diff["time_b_ns"] - diff["time_a_ns"]).all()
    assert diff["delta_ns"].abs().is_monotonic_decreasing


def test_new_and_vanished_kernels_are_the_raw_set_differences(pair: dict) -> None:
    diff = pair["diff"]
    names = {side: {n for (n, k) in raw_totals(pair["raw"][side])[0] if k == "kernel"} for side in ("control", "test")}
    kernels = diff[diff["kind"] == "kernel"]
    new = set(kernels.loc[kernels["status"] == "new", "name"])
    vanished = set(kernels.loc[kernels["status"] == "vanished", "name"])
    assert new == names["test"] - names["control"] and new
    assert vanished == names["control"] - names["test"] and vanished
    both = kernels[kernels["name"].isin(names["test"] & names["control"])]
    assert set(both["status"]) <= {"changed", "unchanged"}
    assert (kernels.loc[kernels["status"] == "new", "count_a"] == 0).all()
    assert kernels.loc[kernels["status"] == "new", "ratio"].isna().all()


def test_summary_agrees_with_the_table(pair: dict) -> None:
    diff = pair["diff"]
    summary = json.loads(json.dumps(diff_summary(diff, top=5)))
    assert summary["names"] == {s: int((diff["status"] == s).sum()) for s in ("new", "vanished", "changed",
                                                                              "unchanged")}
    kernel = summary["time_ns"]["kernel"]
    assert kernel["a"] == int(diff.loc[diff["kind"] == "kernel", "time_a_ns"].sum())
    assert kernel["delta"] == kernel["b"] - kernel["a"]
    assert len(summary["new"]) == 5 and all(r["count_a"] == 0 for r in summary["new"])
    assert all(r["count_b"] == 0 for r in summary["vanished"])
    assert [r["time_b_ns"] for r in summary["new"]] == sorted((r["time_b_ns"] for r in summary["new"]), reverse=True)
    assert all(r["delta_ns"] > 0 for r in summary["grew"]) and all(r["delta_ns"] < 0 for r in summary["shrank"])


def test_per_step_divides_by_the_profiled_steps(pair: dict) -> None:
    steps = {side: sum(1 for e in pair["raw"][side] if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
             for side in ("control", "test")}
    per_step = trace_diff(pair["trace"]["control"], pair["trace"]["test"], per_step=True).set_index(["name", "kind"])
    whole = pair["diff"].set_index(["name", "kind"])
    key = ("cudaLaunchKernel", "runtime")
    assert per_step.loc[key, "count_a"] == pytest.approx(whole.loc[key, "count_a"] / steps["control"])
    assert per_step.loc[key, "time_b_ns"] == pytest.approx(whole.loc[key, "time_b_ns"] / steps["test"])


def test_aligned_pair_starts_both_at_their_first_step(pair: dict) -> None:
    a, b = aligned_pair(pair["trace"]["control"], pair["trace"]["test"])
    for side, trace in (("control", a), ("test", b)):
        raw = pair["raw"][side]
        origin = min(e["ts"] for e in raw if e.get("ph") != "M" and "ts" in e)
        first_step = min(e["ts"] for e in raw if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
        assert trace.metadata["aligned_offset_ns"] == round((first_step - origin) * 1000)
        events = trace.df()
        steps = events[events["name"].astype(str).str.startswith("ProfilerStep#")]
        assert steps["start_ns"].min() == 0


def test_a_trace_against_itself_is_unchanged(pair: dict) -> None:
    diff = trace_diff(pair["trace"]["control"], pair["trace"]["control"])
    assert set(diff["status"]) == {"unchanged"}
    assert (diff["delta_ns"] == 0).all()


def _ops(path: Path, names: list[str], start: int = 0) -> Trace:
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": start + 10 * i, "dur": 5}
              for i, n in enumerate(names)]
    return read_trace(write_trace(path, events))


def test_fusion_shows_as_vanished_ops_and_new_fused_names(tmp_path: Path) -> None:
    eager = _ops(tmp_path / "eager.json", ["aten::mul", "aten::add", "aten::relu", "aten::mm"] * 2)
    compiled = _ops(tmp_path / "compiled.json", ["triton_poi_fused_add_mul_relu_0", "aten::mm"] * 2)
    diff = trace_diff(eager, compiled).set_index("name")
    assert set(diff.index[diff["status"] == "vanished"]) == {"aten::mul", "aten::add", "aten::relu"}
    assert list(diff.index[diff["status"] == "new"]) == ["triton_poi_fused_add_mul_relu_0"]
    assert diff.loc["aten::mm", "status"] == "unchanged"
    assert diff.loc["aten::mul", ["count_a", "count_b", "time_a_ns", "time_b_ns"]].tolist() == [2, 0, 10_000, 0]


def test_windows_and_kinds_limit_what_is_diffed(tmp_path: Path) -> None:
    a = _ops(tmp_path / "a.json", ["aten::mul", "aten::add", "aten::mul"])
    b = _ops(tmp_path / "b.json", ["aten::mul"])
    diff = trace_diff(a, b, window_a=(0, 15_000)).set_index("name")  # the second mul starts at 20 µs
    assert diff.loc["aten::mul", ["count_a", "count_b"]].tolist() == [1, 1]
    assert trace_diff(a, b, kinds=("kernel",)).empty
