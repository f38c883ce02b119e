"""What an import keeps exactly (issue 23): the trace origin of Kineto traces written in absolute epoch µs, to the
ns, in run.json as in the Trace; and unknown numbers (a copy's `bytes`) as NULL in SQL, which aggregates skip."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import fixture_path, write_trace

import workbench as wb
from workbench.cli import main
from workbench.imports import import_traces
from workbench.trace import read_trace
from workbench.trace.store.bundle import open_bundle

NO_ORIGIN = ("M", "s", "t", "f", "C")
"""Phases of the records that set no origin: metadata, flows and counters."""


def exact_origin_ns(path: Path) -> int:
    """The trace origin in epoch ns from the file's text: its earliest `ts` as written, read as decimals (float64
    holds 1.7e15 µs only to 0.25 µs), plus `baseTimeNanoseconds`."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    ts = [Decimal(e["ts"]) for e in doc["traceEvents"] if e.get("ph") not in NO_ORIGIN and "ts" in e]
    return int((min(ts) * 1000).to_integral_value()) + doc.get("baseTimeNanoseconds", 0)


def run_json(root: Path, run_id: str) -> dict:
    return json.loads((root / run_id / "run.json").read_text())


@pytest.mark.parametrize("name", ["resnet50_v100_train.pt.trace.json.gz", "cupti_range_profiler.json.gz"])
def test_origin_of_absolute_microsecond_traces_is_exact(name, tmp_path):
    """Whole epoch µs (1.6e15): their ns pass 2**53, where float64 was 128 and 80 ns off on these two."""
    path = fixture_path("kineto", name)
    origin = exact_origin_ns(path)
    (run_id,) = import_traces([path], tmp_path)
    assert run_json(tmp_path, run_id)["trace"]["origin_ns"] == origin
    assert open_bundle(run_id, tmp_path).trace().metadata["origin_ns"] == origin


@pytest.mark.parametrize("ts", ["1700000000123458", "1700000000123456.789"])
def test_origin_of_a_synthetic_epoch_trace_is_exact(ts, tmp_path):
    """A first timestamp whose ns float64 misses by tens (48 and 21 ns); the other records' times on the same axis
    are exact too."""
    first = Decimal(ts)
    origin = int(first * 1000)
    assert abs(round(float(first) * 1000) - origin) >= 20  # the defect this guards against
    offsets_us = [0, 1, 2500]
    records = ", ".join(f'{{"ph": "X", "cat": "cpu_op", "name": "op{i}", "pid": 1, "tid": 1, "ts": {first + us}, '
                        '"dur": 1}' for i, us in enumerate(offsets_us))
    path = tmp_path / "epoch.json"
    path.write_text(f'{{"traceEvents": [{records}]}}')  # the numbers as written, not through float
    trace = read_trace(path)
    assert trace.metadata["origin_ns"] == origin
    assert trace.events["start_ns"].to_pylist() == [us * 1000 for us in offsets_us]
    (run_id,) = import_traces([path], tmp_path / "traces")
    assert run_json(tmp_path / "traces", run_id)["trace"]["origin_ns"] == origin


def copies_trace(path: Path) -> Path:
    """A ROCm-like trace of device-to-device copies, two of which say how many bytes they moved, and one op with
    flops."""
    sizes = [None, 4096, None, 1000, None]
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
               "args": {"External id": 1, "flops": 2048}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
               "args": {"External id": 2}}]
    for i, size in enumerate(sizes):
        args = {"device": 0, "stream": 3, "correlation": 100 + i, **({} if size is None else {"bytes": size})}
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 3,
                       "ts": 30 + 10 * i, "dur": 4, "args": args})
    return write_trace(path, events, deviceProperties=[{"id": 0, "name": "AMD Instinct MI250X"}])


def test_unknown_bytes_are_null_in_sql(tmp_path):
    root = tmp_path / "traces"
    (run_id,) = import_traces([copies_trace(tmp_path / "copies.json")], root)
    events = open_bundle(run_id, root).trace().events
    assert sum(b != b for b in events["bytes"].to_pylist()) > 0  # NaN in the Trace, as the analyses read it
    result = CliRunner().invoke(main, ["query", run_id, "SELECT sum(bytes) AS total, count(bytes) AS known, "
                                       "count(*) AS copies FROM events WHERE kind = 'memcpy'",
                                       "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == [[5096, 2, 5]]
    frame = wb.sql("SELECT count(flops) AS known, sum(flops) AS flops, count(*) FILTER (WHERE isnan(bytes)) AS nan "
                   "FROM events", runs=[run_id], root=root)
    assert frame.to_dict("records") == [{"known": 1, "flops": 2048.0, "nan": 0}]


def test_copies_of_a_real_rocm_trace_without_bytes_sum_to_null(tmp_path):
    """The AMD MI250 trace's two host-to-device copies state no bytes: their sum is NULL, not NaN."""
    root = tmp_path / "traces"
    (run_id,) = import_traces([fixture_path("kineto", "amd_mi250_train.json.gz")], root)
    frame = wb.sql("SELECT sum(bytes) IS NULL AS unknown, count(bytes) AS known, count(*) AS copies FROM events "
                   "WHERE kind = 'memcpy'", runs=[run_id], root=root)
    assert frame.to_dict("records") == [{"unknown": True, "known": 0, "copies": 2}]
