"""CUDA memory snapshots: reading torch's snapshot format, merging it into a trace's memory table, and
(on a GPU) recording one during a profiled run.

The snapshot below is built in the format `torch.cuda.memory._snapshot()` returns: its docstring in
`torch/cuda/memory.py` lists segments, blocks, device_traces and frames, and
`torch/csrc/cuda/memory_snapshot.cpp` writes `time_us` (epoch microseconds) into every trace entry and
`device_free` instead of `addr` for an `oom`. An `alloc` or `free_*` entry carries the requested size.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from conftest import fixture_path, write_trace

from workbench.analysis.memory import allocations, memory_timeline
from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace import read_trace
from workbench.trace.formats.cuda_snapshot import (
    ALLOCATOR,
    SEGMENTS,
    load_snapshot,
    read_cuda_snapshot,
    trace_epoch_ns,
    with_cuda_snapshot,
)

T0 = 1_790_000_000_000_000  # µs since the epoch
MIB = 2**20
A, B, C = 0x7E00_0000_0000, 0x7F00_0000_0000, 0x7F00_0020_0000  # segments: before the history, kept, freed
FORWARD = [{"filename": "model.py", "line": 12, "name": "forward"}, {"filename": "run.py", "line": 3, "name": "main"}]


def _entry(action: str, t: int, size: int, addr: int | None = None, frames=(), **extra) -> dict:
    entry = {"action": action, "size": size, "stream": 0, "time_us": T0 + t, "frames": list(frames), **extra}
    if addr is not None:
        entry["addr"] = addr
    return entry


def _snapshot() -> dict:
    history = [
        _entry("free_requested", 20, 512, A),  # an allocation made before the history began
        _entry("free_completed", 21, 512, A),
        _entry("segment_alloc", 100, 2 * MIB, B, FORWARD),
        _entry("alloc", 110, 4096, B, FORWARD),
        _entry("alloc", 120, 8192, B + 0x1000, FORWARD),
        _entry("free_requested", 130, 4096, B),
        _entry("free_completed", 131, 4096, B),
        _entry("segment_alloc", 140, 20 * MIB, C),
        _entry("alloc", 150, 10 * MIB, C, FORWARD),
        _entry("oom", 160, 64 * MIB, device_free=3 * MIB),
        _entry("free_requested", 170, 10 * MIB, C),
        _entry("free_completed", 171, 10 * MIB, C),
        _entry("segment_free", 180, 20 * MIB, C),
    ]
    segments = [
        {"device": 0, "address": A, "total_size": 2 * MIB, "allocated_size": 1024, "active_size": 1024,
         "requested_size": 1000, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": [],
         "blocks": [{"address": A, "size": 512, "requested_size": 512, "state": "inactive", "frames": []},
                    {"address": A + 512, "size": 1024, "requested_size": 1000, "state": "active_allocated",
                     "frames": []},
                    {"address": A + 1536, "size": 2 * MIB - 1536, "requested_size": 0, "state": "inactive",
                     "frames": []}]},
        {"device": 0, "address": B, "total_size": 2 * MIB, "allocated_size": 8192, "active_size": 8192,
         "requested_size": 8192, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": FORWARD,
         "blocks": [{"address": B, "size": 4096, "requested_size": 4096, "state": "inactive", "frames": []},
                    {"address": B + 0x1000, "size": 8192, "requested_size": 8192, "state": "active_allocated",
                     "frames": FORWARD},
                    {"address": B + 0x3000, "size": 2 * MIB - 0x3000, "requested_size": 0, "state": "inactive",
                     "frames": []}]},
    ]
    return {"segments": segments, "device_traces": [history, []],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}}


def test_memory_rows_carry_addresses_sizes_and_absolute_totals():
    cuda = read_cuda_snapshot(_snapshot(), epoch_origin_ns=(T0 + 50) * 1000)
    rows = cuda.memory.to_pylist()
    assert [r["ts_ns"] for r in rows] == [-29_000, 50_000, 60_000, 70_000, 81_000, 90_000, 100_000, 121_000, 130_000]
    assert [r["addr"] for r in rows] == [A, B, B, B + 0x1000, B, C, C, C, C]
    assert [r["delta_bytes"] for r in rows] == [-512, 0, 4096, 8192, -4096, 0, 10 * MIB, -10 * MIB, 0]
    # 1,512 bytes were allocated before the history (512 then freed, 1,000 still live at the snapshot)
    assert [r["allocated_bytes"] for r in rows] == [1000, 1000, 5096, 13288, 9192, 9192, 9192 + 10 * MIB, 9192, 9192]
    assert [r["reserved_bytes"] for r in rows] == [2 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 24 * MIB, 24 * MIB,
                                                   24 * MIB, 4 * MIB]
    assert {r["device"] for r in rows} == {"cuda:0"} and {r["event"] for r in rows} == {-1}
    assert cuda.metadata["actions"]["alloc"] == 3 and cuda.metadata["segments_at_snapshot"] == 2
    assert cuda.metadata["skipped"] == {"free_requested entries (kept in cuda_allocator, no memory change)": 3,
                                        "oom entries (kept in cuda_allocator, no memory change)": 1}


def test_every_allocator_entry_is_kept_with_its_frames():
    cuda = read_cuda_snapshot(_snapshot(), epoch_origin_ns=0, device_prefix="rocm")
    assert cuda.allocator.schema.equals(ALLOCATOR)
    rows = cuda.allocator.to_pylist()
    assert len(rows) == 13 and rows[0]["ts_ns"] == (T0 + 20) * 1000 and rows[0]["device"] == "rocm:0"
    assert [r["action"] for r in rows][:4] == ["free_requested", "free_completed", "segment_alloc", "alloc"]
    assert json.loads(rows[3]["frames"]) == FORWARD and rows[0]["frames"] is None
    assert [r["memory_row"] for r in rows] == [-1, 0, 1, 2, 3, -1, 4, 5, 6, -1, -1, 7, 8]
    oom = rows[9]
    assert oom["action"] == "oom" and oom["addr"] == -1 and oom["size"] == 64 * MIB


def test_segments_over_time_for_the_memory_map():
    cuda = read_cuda_snapshot(_snapshot(), epoch_origin_ns=T0 * 1000)
    assert cuda.segments.schema.equals(SEGMENTS)
    segments = {row["addr"]: row for row in cuda.segments.to_pylist()}
    assert segments[C] | {"frames": None} == {
        "device": "cuda:0", "addr": C, "size": 20 * MIB, "alloc_ns": 140_000, "free_ns": 180_000, "stream": 0,
        "segment_type": None, "pool": None, "expandable": None, "allocated_bytes": -1, "frames": None}
    assert segments[B]["alloc_ns"] == 100_000 and segments[B]["free_ns"] == -1
    assert segments[B]["segment_type"] == "small" and segments[B]["allocated_bytes"] == 8192
    assert json.loads(segments[B]["frames"]) == FORWARD and segments[B]["pool"] == "0,0"
    assert segments[A]["alloc_ns"] == -1 and segments[A]["size"] == 2 * MIB and segments[A]["expandable"] is False


def test_snapshot_pickles_load_and_anything_else_is_refused(tmp_path):
    path = tmp_path / "eager.cuda-memory.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))
    assert load_snapshot(path) == _snapshot()
    assert read_cuda_snapshot(path).metadata["source"] == str(path)
    objects = tmp_path / "objects.pickle"
    objects.write_bytes(pickle.dumps({"segments": [Path("/etc/passwd")], "device_traces": []}))
    with pytest.raises(TraceFormatError, match="refusing to load pathlib"):
        load_snapshot(objects)
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(TraceFormatError, match="not a CUDA memory snapshot"):
        load_snapshot(other)
    old = _snapshot()
    del old["device_traces"][0][3]["time_us"]
    with pytest.raises(TraceFormatError, match="1 allocator trace entries have no time_us"):
        read_cuda_snapshot(old)


def _kineto(tmp_path: Path) -> Path:
    """A Kineto trace whose origin is T0 + 40 µs (epoch): two ops on thread 1, a CUDA memory record the
    snapshot replaces, a CPU one it keeps."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 40, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 145, "dur": 40},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 110,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": B, "Bytes": 4096, "Total Allocated": 4096,
                  "Total Reserved": 2 * MIB}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 120,
         "args": {"Device Type": 0, "Device Id": -1, "Addr": 77, "Bytes": 64, "Total Allocated": 64,
                  "Total Reserved": 0}},
    ]
    return write_trace(tmp_path / "eager.pt.trace.json", events, baseTimeNanoseconds=T0 * 1000)


def test_the_snapshot_replaces_the_cuda_rows_of_a_kineto_trace(tmp_path):
    trace = read_trace(_kineto(tmp_path))
    assert trace_epoch_ns(trace) == (T0 + 40) * 1000
    snapshot = tmp_path / "eager.cuda-memory.pickle"
    snapshot.write_bytes(pickle.dumps(_snapshot()))
    merged, tables = with_cuda_snapshot(trace, snapshot)
    assert set(tables) == {"cuda_allocator", "cuda_segments"} and tables["cuda_allocator"].num_rows == 13
    rows = merged.memory.to_pylist()
    cpu = [r for r in rows if r["device"] == "cpu"]
    cuda = [r for r in rows if r["device"] == "cuda:0"]
    assert [(r["ts_ns"], r["addr"]) for r in cpu] == [(80_000, 77)]
    # snapshot times from the trace origin; the free at T0 + 21 µs came before the trace: left out
    assert [r["ts_ns"] for r in cuda] == [60_000, 70_000, 80_000, 91_000, 100_000, 110_000, 131_000, 140_000]
    assert cuda[1]["addr"] == B and cuda[1]["allocated_bytes"] == 5096
    names = merged.events["name"].to_pylist()
    assert [names[r["event"]] for r in cuda] == ["aten::empty"] * 5 + ["aten::add"] * 3
    info = merged.metadata["cuda_snapshot"]
    assert info["replaced_rows"] == 1 and info["rows"] == 8 and info["outside_trace"] == 1
    assert info["devices"] == ["cuda:0"]
    table = allocations(merged)
    gpu = table[table["device"] == "cuda:0"]
    assert sorted(zip(gpu["addr"], gpu["size"], gpu["freed"], strict=True)) == [
        (B, 4096, True), (B + 0x1000, 8192, False), (C, 10 * MIB, True)]
    timeline = memory_timeline(merged)
    assert timeline[timeline["device"] == "cuda:0"]["reserved_bytes"].max() == 24 * MIB


def test_without_a_snapshot_the_trace_is_unchanged(tmp_path):
    trace = read_trace(_kineto(tmp_path))
    assert with_cuda_snapshot(trace, None) == (trace, {})


def test_nsys_traces_are_placed_by_their_session_start():
    trace = read_trace(fixture_path("nsys", "h100_2gpu_1s.sqlite"))
    assert trace_epoch_ns(trace) == trace.metadata["session"]["utcEpochNs"] + trace.metadata["origin_ns"]


def test_a_trace_without_an_epoch_origin_is_refused(tmp_path):
    trace = read_trace(_kineto(tmp_path))
    trace.metadata["source"]["format"] = "xspace"
    with pytest.raises(WorkbenchError, match="cannot place a CUDA memory snapshot on a xspace trace"):
        trace_epoch_ns(trace)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_capture_records_the_allocator_into_its_bundle(tmp_path):
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.profiling import ProfileSettings

    settings = ExperimentSettings(model="tiny-gpt", variants=("eager",), batch=2, seq=16, device="cuda",
                                  warmup=1, iterations=3, profile_settings=ProfileSettings(warmup_steps=1,
                                                                                           active_steps=2),
                                  model_overrides={"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16})
    (run,) = run_experiment(settings, tmp_path).runs
    assert run.status == "ok", run.error
    from workbench.trace.store.bundle import open_bundle

    bundle = open_bundle(run.run_id, tmp_path)
    memory = bundle.trace().memory.to_pandas()
    gpu = memory[memory["device"].astype(str) == "cuda:0"]
    assert len(gpu) and (gpu["addr"] > 0).all() and (gpu["reserved_bytes"] > 0).all()
    assert (gpu["event"] >= 0).any()
    assert bundle.table("cuda_allocator").num_rows >= len(gpu)
    assert bundle.table("cuda_segments").num_rows >= 1
    assert any(p.name == "eager.cuda-memory.pickle" for p in bundle.raw_files())
    assert bundle.info["trace"]["cuda_snapshot"]["rows"] == len(gpu)
