"""Bottleneck findings, checked against what the raw Kineto JSON and Nsight SQLite show."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import fixture_path, write_trace
from test_idle import kineto_origin_ns, raw_events, raw_idle, raw_kineto_work, raw_nsys_work

from workbench.analysis.findings.bottlenecks import FINDING_COLUMNS, analyze, find_bottlenecks, findings_table
from workbench.analysis.findings.finding import Finding, Thresholds
from workbench.analysis.idle import merge_intervals
from workbench.errors import WorkbenchError
from workbench.trace import Trace, read_trace

KINDS = {"device_idle", "launch_bound", "memcpy", "unfused_elementwise", "low_occupancy", "dtype_cast",
         "recompilation", "memory_bound"}
SHORT_NS = Thresholds().short_kernel_ns


def by_kind(findings: list[Finding], kind: str, device: str | None = None) -> Finding:
    """The one finding of `kind` (on `device`)."""
    (found,) = [f for f in findings if f.kind == kind and (device is None or f.device == device)]
    return found


def assert_well_formed(findings: list[Finding]) -> None:
    assert findings, "expected findings"
    shares = [f.time_share for f in findings]
    assert shares == sorted(shares, reverse=True)
    for f in findings:
        assert f.kind in KINDS
        assert 0.0 <= f.time_share <= 1.0
        assert isinstance(f.evidence, dict) and f.evidence
        assert f.suggestion and f.title
        out = json.loads(json.dumps(f.to_dict()))
        assert {"kind", "time_share", "evidence", "suggestion"} <= set(out)


# -- ResNet-50 on a V100 (Kineto 2021) --------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet() -> tuple[Path, Trace, list[dict], list[Finding]]:
    path = fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz")
    trace = read_trace(path)
    return path, trace, raw_events(path), find_bottlenecks(trace)


def test_resnet_findings_are_well_formed(resnet) -> None:
    assert_well_formed(resnet[3])


def test_resnet_idle_finding_is_the_raw_largest_gap(resnet) -> None:
    path, trace, _, findings = resnet
    raw = raw_idle(*raw_kineto_work(path)["cuda:0"])
    idle = by_kind(findings, "device_idle", "cuda:0")
    assert idle.evidence["largest_gap_ns"] == raw["largest_gap_ns"]
    assert idle.evidence["largest_gap_start_ns"] == raw["largest_gap_start_abs"] - kineto_origin_ns(path, trace)
    assert idle.evidence["busy_ns"] == raw["busy_ns"]
    assert idle.time_share == pytest.approx(1 - raw["busy_ns"] / raw["span_ns"])
    assert idle.evidence["largest_gap_cause"] == "host-bound"  # the DataLoader, see test_idle
    assert findings[0] is idle  # 39% idle: nothing else takes as much of the GPU's time


def test_resnet_launch_bound_counts_the_raw_short_kernels(resnet) -> None:
    _, _, raw, findings = resnet
    kernels = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "Kernel"]
    short = [e for e in kernels if round(e["dur"] * 1000) < SHORT_NS]
    assert len(short) > len(kernels) / 2
    launch = by_kind(findings, "launch_bound", "cuda:0")
    assert launch.evidence["short_kernels"] == len(short)
    assert launch.evidence["kernels"] == len(kernels)
    assert launch.evidence["stretches"] >= 1
    assert 0 < launch.evidence["stretch_busy_ns"] < launch.evidence["stretch_ns"]
    assert "CUDA graph" in launch.suggestion


def test_resnet_memcpy_finding_matches_the_raw_copies(resnet) -> None:
    _, _, raw, findings = resnet
    copies = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "Memcpy"]
    memcpy = by_kind(findings, "memcpy", "cuda:0")
    assert memcpy.evidence["count"] == len(copies) == 12
    assert memcpy.evidence["total_ns"] == sum(round(e["dur"] * 1000) for e in copies)
    assert memcpy.evidence["by_direction"]["host_to_device"]["count"] == sum("HtoD" in e["name"] for e in copies)
    assert memcpy.evidence["pageable"]["count"] == sum("Pageable" in e["name"] for e in copies)
    assert "pinned" in memcpy.suggestion


def test_resnet_low_occupancy_matches_the_raw_estimates(resnet) -> None:
    _, _, raw, findings = resnet
    low = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "Kernel"
           and e["args"].get("est. achieved occupancy %", 100) < Thresholds().low_occupancy_pct]
    finding = by_kind(findings, "low_occupancy", "cuda:0")
    assert finding.evidence["low_kernels"] == len(low)
    assert finding.evidence["low_ns"] == sum(round(e["dur"] * 1000) for e in low)
    assert finding.evidence["source"] == "est. achieved occupancy %"


def test_resnet_dtype_casts_are_the_raw_copies_between_types(resnet) -> None:
    _, _, raw, findings = resnet

    def is_cast(types: list[str]) -> bool:
        return len(types) > 1 and "" not in types[:2] and "Scalar" not in types[:2] and types[0] != types[1]

    casts = [e for e in raw if e.get("ph") == "X" and e.get("name") == "aten::copy_"
             and is_cast(e["args"].get("Input type", []))]
    finding = by_kind(findings, "dtype_cast")
    assert finding.evidence["copies"] == len(casts) > 0
    assert "unsigned char→float" in {p["cast"] for p in finding.evidence["top_pairs"]}  # images to tensors


# -- 2× H100, Nsight Systems ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100() -> tuple[Path, Trace, list[Finding]]:
    path = fixture_path("nsys", "h100_2gpu_1s.sqlite")
    trace = read_trace(path)
    return path, trace, find_bottlenecks(trace)


def test_h100_host_to_device_copies_rank_first(h100) -> None:
    path, _, findings = h100
    assert_well_formed(findings)
    work = raw_nsys_work(path)
    query = """SELECT m.deviceId, COUNT(*), SUM(m.end - m.start),
                      SUM(o.label = 'Host-to-Device'), SUM(s.label = 'Pageable' OR d.label = 'Pageable')
               FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind
               JOIN ENUM_CUDA_MEM_KIND s ON s.id = m.srcKind JOIN ENUM_CUDA_MEM_KIND d ON d.id = m.dstKind
               GROUP BY m.deviceId"""
    with sqlite3.connect(path) as db:
        raw = {f"cuda:{d}": (n, ns, htod, pageable) for d, n, ns, htod, pageable in db.execute(query)}
        rows = np.array(db.execute("SELECT deviceId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchall())
    assert {f.device for f in findings[:2]} == set(raw) and {f.kind for f in findings[:2]} == {"memcpy"}
    for device, (count, ns, htod, pageable) in raw.items():
        memcpy = by_kind(findings, "memcpy", device)
        assert memcpy.evidence["count"] == count
        assert memcpy.evidence["total_ns"] == ns
        assert memcpy.evidence["by_direction"]["host_to_device"]["count"] == htod
        assert memcpy.evidence["pageable"]["count"] == pageable > 0
        mine = rows[rows[:, 0] == int(device[-1])]
        s, e = merge_intervals(mine[:, 1], mine[:, 2])
        assert memcpy.time_share == pytest.approx((e - s).sum() / raw_idle(*work[device])["span_ns"])
        assert memcpy.time_share > 0.9


def test_h100_launch_bound_and_idle_match_the_sqlite(h100) -> None:
    path, trace, findings = h100
    with sqlite3.connect(path) as db:
        short = dict(db.execute(f"SELECT deviceId, SUM(end - start < {SHORT_NS}) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                "GROUP BY deviceId").fetchall())
    for device, work in raw_nsys_work(path).items():
        launch = by_kind(findings, "launch_bound", device)
        assert launch.evidence["short_kernels"] == short[int(device[-1])]
        raw = raw_idle(*work)
        idle = by_kind(findings, "device_idle", device)
        assert idle.evidence["largest_gap_ns"] == raw["largest_gap_ns"]
        assert idle.evidence["largest_gap_start_ns"] == raw["largest_gap_start_abs"] - trace.metadata["origin_ns"]


# -- CPU only, and small traces with known answers --------------------------------------------------


def test_cpu_only_trace_has_no_device_findings() -> None:
    trace = read_trace(fixture_path("kineto", "cpu_only_rank34.pt.trace.json.gz"))
    out = analyze(trace)
    assert out["idle"] == {}
    assert all(f["device"] is None for f in out["findings"])
    assert not any(f["kind"] in ("device_idle", "launch_bound", "memcpy", "low_occupancy") for f in out["findings"])
    json.dumps(out)


def _launch(ts: int, op: str, kernel: str, corr: int, kernel_ts: int, dur: int = 5) -> list[dict]:
    """An op on the host launching one kernel on cuda:0."""
    return [
        {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": ts, "dur": 8, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1, "dur": 5,
         "args": {"correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": kernel_ts, "dur": dur,
         "args": {"device": 0, "stream": 7, "correlation": corr}},
    ]


def _chain_trace(path: Path) -> Trace:
    """mul → add → relu (elementwise), mm, then mul → add: one chain of 3 and one of 2."""
    plan = [("aten::mul", "vectorized_elementwise_kernel<MulFunctor>"), ("aten::add", "elementwise_kernel<Add>"),
            ("aten::relu", "elementwise_kernel<Relu>"), ("aten::mm", "ampere_sgemm_128x64_nn"),
            ("aten::mul", "vectorized_elementwise_kernel<MulFunctor>"), ("aten::add", "elementwise_kernel<Add>")]
    events = [e for i, (op, kernel) in enumerate(plan) for e in _launch(10 * i, op, kernel, i + 1, 10 * i + 7)]
    return read_trace(write_trace(path / "chain.json", events))


def test_unfused_elementwise_chains(tmp_path: Path) -> None:
    trace = _chain_trace(tmp_path)
    chain = by_kind(find_bottlenecks(trace), "unfused_elementwise", "cuda:0")
    assert (chain.evidence["chains"], chain.evidence["items"], chain.evidence["longest_chain"]) == (1, 3, 3)
    assert chain.evidence["top_patterns"] == [{"ops": "aten::mul → aten::add → aten::relu", "count": 1,
                                               "ns": 15_000}]
    assert "torch.compile" in chain.suggestion
    two = by_kind(find_bottlenecks(trace, thresholds=Thresholds(min_chain=2)), "unfused_elementwise")
    assert (two.evidence["chains"], two.evidence["items"]) == (2, 5)


def _compile(ts: int, compile_id: str, dur: int) -> list[dict]:
    """One Dynamo frame compile as torch 2.13's profiler records it (names seen in a real CPU capture)."""
    return [
        {"ph": "X", "cat": "cpu_op", "name": "TorchDynamo Cache Lookup", "pid": 1, "tid": 1, "ts": ts, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "entire_frame_compile", "pid": 1, "tid": 1, "ts": ts + 10, "dur": dur},
        {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": ts + 11, "dur": 2,
         "name": f"entire_frame_compile_data: fn_name=_compile.compile_inner, compile_id={compile_id}"},
        {"ph": "X", "cat": "cpu_op", "name": "_compile.compile_inner (dynamo_timed)", "pid": 1, "tid": 1,
         "ts": ts + 12, "dur": dur - 4},
        {"ph": "X", "cat": "cpu_op", "name": "backend_compile", "pid": 1, "tid": 1, "ts": ts + 20, "dur": dur - 20},
        {"ph": "X", "cat": "cpu_op", "name": f"Torch-Compiled Region: {compile_id}", "pid": 1, "tid": 1,
         "ts": ts + dur + 20, "dur": 50},
    ]


def test_torch_recompilation_from_compile_ids(tmp_path: Path) -> None:
    first = read_trace(write_trace(tmp_path / "first.json", _compile(0, "0/0", 1000)))
    assert not [f for f in find_bottlenecks(first) if f.kind == "recompilation"]  # a first compile is no recompile
    events = _compile(0, "0/0", 1000) + _compile(2000, "0/1", 3000) + _compile(6000, "0/2", 500)
    trace = read_trace(write_trace(tmp_path / "again.json", events))
    finding = by_kind(find_bottlenecks(trace), "recompilation")
    assert finding.evidence["recompiles"] == 2
    assert finding.evidence["torch_compile_ids"] == ["0/0", "0/1", "0/2"]
    assert [r["compile_id"] for r in finding.evidence["torch_recompiles"]] == ["0/1", "0/2"]
    assert finding.evidence["compile_ns"] == 3_500_000
    assert finding.evidence["torch_regions"] == ["0/0", "0/1", "0/2"]
    assert finding.time_share == pytest.approx(3_500_000 / 6_570_000)
    assert "mark_dynamic" in finding.suggestion


def test_jax_recompilation_from_a_real_capture(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    @jax.jit
    def f(x):
        return jnp.tanh(x * 2 + 1).sum()

    x4, x5, x6 = jnp.ones((4, 8)), jnp.ones((5, 8)), jnp.ones((6, 8))
    f(x4).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        f(x4).block_until_ready()  # cached: no compile
        f(x5).block_until_ready()  # new shape: compiles
        f(x6).block_until_ready()  # and again
    (xspace,) = tmp_path.glob("plugins/profile/*/*.xplane.pb")
    finding = by_kind(find_bottlenecks(read_trace(xspace)), "recompilation")
    assert finding.evidence["xla_compiles_by_function"]["f"] == 2
    assert [r["function"] for r in finding.evidence["xla_recompiles"]] == ["f"]
    assert finding.evidence["recompiles"] == 1


def test_memory_bound_needs_a_roofline(tmp_path: Path) -> None:
    trace = _chain_trace(tmp_path)
    assert not [f for f in find_bottlenecks(trace) if f.kind == "memory_bound"]
    roofline = pd.DataFrame({"name": ["aten::mm", "aten::mul", "aten::add"], "time_ns": [600, 300, 100],
                             "bound": ["compute", "memory", "memory"], "arithmetic_intensity": [40.0, 0.1, 0.1]})
    finding = by_kind(find_bottlenecks(trace, roofline), "memory_bound")
    assert finding.time_share == pytest.approx(0.4)
    assert finding.evidence["ops"] == 2
    assert [t["name"] for t in finding.evidence["top"]] == ["aten::mul", "aten::add"]
    assert "precision" in finding.suggestion and "fuse" in finding.suggestion
    with pytest.raises(WorkbenchError, match="bound"):
        find_bottlenecks(trace, pd.DataFrame({"name": ["x"], "time_ns": [1]}))
    out = analyze(trace, roofline)
    assert out["roofline"] == json.loads(json.dumps(roofline.to_dict("records")))


def test_analyze_covers_the_measure_phase(tmp_path: Path) -> None:
    """A capture's warmup (long idle before `measure`) stays out of the steady-state figures."""
    events = _launch(0, "aten::mul", "k", 1, 5) + _launch(1000, "aten::mul", "k", 2, 1005)
    events += _launch(1100, "aten::mul", "k", 3, 1105) + _launch(1120, "aten::mul", "k", 4, 1125)
    events.append({"ph": "X", "cat": "user_annotation", "name": "measure", "pid": 1, "tid": 1, "ts": 1000,
                   "dur": 140})
    trace = read_trace(write_trace(tmp_path / "capture.json", events))
    out = analyze(trace)
    assert out["window"] == {"phase": "measure", "start_ns": 1_000_000, "end_ns": 1_140_000}
    idle = out["idle"]["cuda:0"]
    assert idle["busy_ns"] == 15_000
    assert (idle["largest_gap_ns"], idle["largest_gap_start_ns"]) == (95_000, 1_010_000)
    assert {"findings", "roofline", "idle"} <= set(out) and out["roofline"] == []
    for f in out["findings"]:
        assert {"kind", "time_share", "evidence", "suggestion"} <= set(f)
    table = findings_table(find_bottlenecks(trace))
    assert list(table.columns) == list(FINDING_COLUMNS)
    assert table["time_share"].is_monotonic_decreasing
