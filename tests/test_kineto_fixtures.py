"""The Kineto reader on real traces from real GPUs: counts must match what the raw JSON says."""

from __future__ import annotations

import gzip
import re
from collections import Counter, defaultdict
from decimal import Decimal

import numpy as np
import pytest
from conftest import fixture_path, load_raw

from workbench.trace import read_trace

KINETO = [
    "resnet50_v100_train.pt.trace.json.gz",
    "diff_control.json.gz",
    "diff_test.json.gz",
    "ns_resolution_rank0.pt.trace.json.gz",
    "amd_mi250_train.json.gz",
    "cpu_only_rank34.pt.trace.json.gz",
    "triton_example.json.gz",
]
KERNEL_CATS = {"kernel", "Kernel"}
OP_CATS = {"cpu_op", "Operator"}


def _raw_facts(events: list[dict]) -> dict:
    """What the raw records say, computed independently of the reader."""
    kernel_ns: dict[int, int] = defaultdict(int)
    kernels = 0
    for e in events:
        if e.get("cat") in KERNEL_CATS:
            kernels += 1
            kernel_ns[e["args"].get("device", e["pid"])] += round(e["dur"] * 1000)
    return {
        "records": len(events),
        "kernels": kernels,
        "kernel_ns": dict(kernel_ns),
        "ops": sum(e.get("cat") in OP_CATS for e in events),
        "flows": sum(e.get("ph") in ("s", "t", "f") for e in events),
        "memory": sum(e.get("name") == "[memory]" and e.get("ph") in ("i", "I") for e in events),
        "meta": sum(e.get("ph") == "M" for e in events),
        "memcpy": sum(e.get("cat") in ("gpu_memcpy", "Memcpy") for e in events),
    }


@pytest.fixture(scope="module", params=KINETO)
def pair(request):
    path = fixture_path("kineto", request.param)
    return read_trace(path), _raw_facts(load_raw(path)["traceEvents"])


def test_every_record_is_accounted_for(pair):
    trace, raw = pair
    reader = trace.metadata["reader"]
    assert reader["records"] == raw["records"]
    skipped = reader["skipped"]
    assert skipped.get("flow events (links kept as correlation ids)", 0) == raw["flows"]
    assert skipped.get("metadata records (kept in metadata processes/threads)", 0) == raw["meta"]
    assert trace.memory.num_rows == raw["memory"]
    assert trace.events.num_rows + trace.memory.num_rows + raw["flows"] + raw["meta"] == raw["records"]


def test_kernel_and_op_counts_match_raw(pair):
    trace, raw = pair
    kinds = trace.kind_counts()
    assert kinds.get("kernel", 0) == raw["kernels"]
    assert kinds.get("op", 0) == raw["ops"]
    assert kinds.get("memcpy", 0) == raw["memcpy"]


def test_kernel_time_per_device_matches_raw(pair):
    trace, raw = pair
    df = trace.df()
    kernels = df[df["kind"] == "kernel"]
    per_device = kernels.groupby("device", observed=True)["dur_ns"].sum()
    got = {int(str(d).split(":")[1]): int(ns) for d, ns in per_device.items()}
    assert got == raw["kernel_ns"]


def test_every_kernel_has_a_device_stream_lane(pair):
    trace, _ = pair
    df = trace.df()
    kernels = df[df["kind"] == "kernel"]
    assert kernels["device"].astype(str).str.match(r"^(cuda|rocm):\d+$").all()
    assert kernels["track"].astype(str).str.match(r"^(cuda|rocm):\d+/stream \d+$").all()


@pytest.mark.parametrize(
    ("name", "linked"),
    [
        ("resnet50_v100_train.pt.trace.json.gz", 8772),
        ("ns_resolution_rank0.pt.trace.json.gz", 4350),
        ("diff_control.json.gz", 8568),
        ("amd_mi250_train.json.gz", 14),
    ],
)
def test_kernels_linked_to_their_launching_op(name, linked):
    trace = read_trace(fixture_path("kineto", name))
    df = trace.df()
    kernels = df[df["kind"] == "kernel"]
    launchers = kernels["launcher"]
    assert int((launchers >= 0).sum()) == linked
    launcher_kinds = df["kind"].to_numpy()[launchers[launchers >= 0].to_numpy()]
    assert set(launcher_kinds) <= {"op", "annotation"}
    # The launcher is the op around the runtime call with the same correlation id.
    runtime = df[(df["kind"] == "runtime") & (df["corr"] >= 0)].set_index("corr")
    sample = kernels[launchers >= 0].head(200)
    for corr, launcher in zip(sample["corr"], sample["launcher"], strict=True):
        call = runtime.loc[corr]
        assert df["start_ns"].iat[launcher] <= call["start_ns"]
        assert df["start_ns"].iat[launcher] + df["dur_ns"].iat[launcher] >= call["start_ns"] + call["dur_ns"]


def test_rocm_trace_uses_rocm_devices():
    trace = read_trace(fixture_path("kineto", "amd_mi250_train.json.gz"))
    devices = set(trace.df()["device"].astype(str))
    assert devices == {"cpu", "rocm:2"}
    assert trace.metadata["devices"][0]["name"] == "AMD Radeon Graphics"


def test_old_format_memory_events_have_running_totals():
    trace = read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))
    mem = trace.df("memory")
    raw = [e for e in load_raw(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))["traceEvents"]
           if e.get("name") == "[memory]"]
    assert int(mem["delta_bytes"].sum()) == sum(e["args"]["Bytes"] for e in raw)
    cpu = mem[mem["device"] == "cpu"].sort_values("ts_ns", kind="stable")
    assert (cpu["allocated_bytes"].to_numpy() == np.cumsum(cpu["delta_bytes"].to_numpy())).all()
    # Most allocations happen inside an op; those rows name it.
    inside = mem["event"] >= 0
    assert inside.mean() > 0.5
    assert set(trace.df()["kind"].to_numpy()[mem.loc[inside, "event"].to_numpy()]) == {"op"}


def test_nesting_is_consistent(pair):
    trace, _ = pair
    df = trace.df()
    child = df[df["parent"] >= 0]
    parent = df.iloc[child["parent"].to_numpy()]
    assert (parent["track"].to_numpy() == child["track"].to_numpy()).all()
    assert (parent["start_ns"].to_numpy() <= child["start_ns"].to_numpy()).all()
    assert (parent["depth"].to_numpy() + 1 == child["depth"].to_numpy()).all()
    assert (df.loc[df["parent"] < 0, "depth"] == 0).all()


def test_shapes_and_types_kept_for_ops():
    trace = read_trace(fixture_path("kineto", "diff_test.json.gz"))
    df = trace.df()
    first = df[(df["kind"] == "op") & (df["name"] == "aten::zeros")].iloc[0]
    assert first["shapes"] == "[[], [], [], [], []]"
    assert first["dtypes"] == '["", "", "", "", "Scalar"]'
    assert '"External id": 1' in first["args"]


def test_header_and_distributed_info_in_metadata():
    trace = read_trace(fixture_path("kineto", "ns_resolution_rank0.pt.trace.json.gz"))
    header = trace.metadata["source"]["header"]
    assert header["displayTimeUnit"] == "ns"
    assert header["distributedInfo"]["backend"] == "nccl"
    assert Counter(d["name"] for d in trace.metadata["devices"]) == {"Tesla V100-SXM2-32GB": 8}


def test_nanosecond_timestamps_kept_exactly():
    """Absolute epoch µs with three decimals (1.7e15) lose ns as float64; the reader keeps every one."""
    path = fixture_path("kineto", "ns_resolution_rank0.pt.trace.json.gz")
    trace = read_trace(path)
    with gzip.open(path, "rt") as f:
        written = [Decimal(ts) for ts in re.findall(r'"ts": *([0-9.]+)', f.read())]
    origin_ns = int(min(written) * 1000)
    assert trace.metadata["origin_ns"] == origin_ns
    exact = {int(ts * 1000) - origin_ns for ts in written}
    starts = set(trace.events["start_ns"].to_pylist())
    assert starts <= exact
    assert len({start % 250 for start in starts}) > 200  # float64 µs there only holds multiples of 250 ns
