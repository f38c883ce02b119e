"""Progress of long trace reads (issue 22): each reader says how far it is, and `workbench import` shows it."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner
from conftest import fixture_path, write_trace

from workbench.cli import main
from workbench.trace import read_trace
from workbench.trace.progress import describe, listening


def _heard(path) -> list[tuple[str, int, int, str]]:
    heard: list[tuple[str, int, int, str]] = []
    with listening(lambda *report: heard.append(report)):
        read_trace(path)
    return heard


def _events(n: int) -> list[dict]:
    return [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
            for i in range(n)]


def test_a_json_read_reports_bytes_of_the_file_up_to_its_size(tmp_path):
    path = write_trace(tmp_path / "big.json", _events(60_000))
    heard = _heard(path)
    size = path.stat().st_size
    assert len(heard) > 1 and {(p, total, unit) for p, _, total, unit in heard} == {(str(path), size, "bytes")}
    done = [d for _, d, _, _ in heard]
    assert done == sorted(done) and done[-1] == size


def test_a_gzip_read_reports_compressed_bytes(tmp_path):
    path = tmp_path / "big.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": _events(60_000)}).encode()))
    heard = _heard(path)
    assert heard[-1][1:] == (path.stat().st_size, path.stat().st_size, "bytes")


def test_an_nsys_read_reports_its_tables():
    path = fixture_path("nsys", "h100_2gpu_1s.sqlite")
    heard = _heard(path)
    assert {unit for *_, unit in heard} == {"tables"}
    assert [done for _, done, _, _ in heard] == list(range(len(heard))) and heard[-1][2] == len(heard)


def test_an_xspace_read_reports_its_planes():
    pytest.importorskip("jax")
    folder = fixture_path("xspace", "tf_gpu_multi_worker")
    heard = _heard(folder)
    assert heard and {unit for *_, unit in heard} == {"planes"}
    assert all(0 <= done < total for _, done, total, _ in heard)


def test_reports_read_as_one_line():
    assert describe("/x/trace.json.gz", 45, 100, "bytes") == "reading trace.json.gz: 45% of 0.0 MB"
    assert describe("/x/run.sqlite", 3, 9, "tables") == "reading run.sqlite: table 3 of 9"


def test_nothing_listens_outside_a_listening_block(tmp_path):
    path = write_trace(tmp_path / "t.json", _events(10))
    assert read_trace(path).events.num_rows == 10
    assert CliRunner().invoke(main, ["import", str(path), "--out", str(tmp_path / "traces")]).exit_code == 0
