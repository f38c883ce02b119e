"""The `workbench` CLI: import, ls, show, rm, their --json output, exit codes and bad input."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner
from conftest import TINY_CAPTURE, fixture_path, write_trace

from workbench.cli import main


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def trace_file(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 4, "dur": 3,
         "args": {"correlation": 5, "device": 0, "stream": 7}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1024, "Total Allocated": 1024, "Addr": 1}},
    ]
    return write_trace(tmp_path / "trace.json", events)


def _invoke(runner, *args):
    return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_import_json_then_ls_and_show(runner, tmp_path, trace_file):
    root = tmp_path / "traces"
    result = _invoke(runner, "import", trace_file, "--out", root, "--json")
    assert result.exit_code == 0, result.output
    (run_id,) = json.loads(result.stdout)
    assert (root / run_id / "raw" / "trace.json").read_bytes() == trace_file.read_bytes()

    listing = json.loads(_invoke(runner, "ls", "--out", root, "--json").stdout)
    assert [row["run"] for row in listing] == [run_id]

    summary = json.loads(_invoke(runner, "show", run_id, "--out", root, "--json").stdout)
    assert summary["run"] == run_id
    assert summary["events"] == {"op": 1, "runtime": 1, "kernel": 1}
    assert summary["kernel_ns"] == {"cuda:0": 3000}
    assert summary["ops"] == 1
    assert summary["memory_peak_bytes"] == {"cuda:0": 1024}
    assert summary["top_ops"][0]["name"] == "aten::mm"
    assert summary["top_ops"][0]["device_ns"] == 3000
    assert {"latency_ms", "numerics"} <= summary.keys()
    assert summary["ops_window"] == "whole trace"

    by_path = json.loads(_invoke(runner, "show", root / run_id, "--json").stdout)
    assert by_path["run"] == run_id


def test_import_plain_output_and_env_root(runner, tmp_path, trace_file, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TRACES", str(tmp_path / "env-root"))
    result = _invoke(runner, "import", trace_file)
    assert result.exit_code == 0
    run_id = result.stdout.strip()
    assert (tmp_path / "env-root" / run_id / "run.json").exists()
    assert run_id in _invoke(runner, "ls").stdout


def test_human_show_prints_tables(runner, tmp_path, trace_file):
    root = tmp_path / "t"
    run_id = _invoke(runner, "import", trace_file, "--out", root).stdout.strip()
    text = _invoke(runner, "show", run_id, "--out", root).stdout
    assert "aten::mm" in text
    assert "top kernels" in text


@pytest.mark.parametrize(
    ("content", "gz", "problem"),
    [
        (b"", False, "empty file"),
        (b'{"traceEvents": [{"ph": "X", "na', False, "truncated"),
        (b"\x00\x01binary", False, "unrecognized trace format"),
        (b'{"schema": "something else"}', False, "no 'traceEvents'"),
        (b'{"traceEvents": []}', True, "not gzip-compressed"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_left(runner, tmp_path, content, gz, problem):
    bad = tmp_path / ("bad.json.gz" if gz else "bad.json")
    bad.write_bytes(content)
    root = tmp_path / "traces"
    result = runner.invoke(main, ["import", str(bad), "--out", str(root)])
    assert result.exit_code == 2
    assert problem in result.stderr
    assert str(bad) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not root.exists() or list(root.iterdir()) == []


def test_import_is_all_or_nothing(runner, tmp_path, trace_file):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    root = tmp_path / "traces"
    result = runner.invoke(main, ["import", str(trace_file), str(bad), "--out", str(root)])
    assert result.exit_code == 2
    assert not root.exists() or list(root.iterdir()) == []


def test_truncated_gzip_import(runner, tmp_path, trace_file):
    data = gzip.compress(trace_file.read_bytes() * 50)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    result = runner.invoke(main, ["import", str(cut), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "cut.json.gz" in result.stderr


def test_show_unknown_run(runner, tmp_path):
    result = runner.invoke(main, ["show", "no-such-run", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "workbench ls" in result.stderr


def test_rm(runner, tmp_path, trace_file):
    root = tmp_path / "t"
    run_id = _invoke(runner, "import", trace_file, "--out", root).stdout.strip()
    assert _invoke(runner, "rm", run_id, "--out", root).exit_code == 0
    assert json.loads(_invoke(runner, "ls", "--out", root, "--json").stdout) == []


def test_import_real_fixture_counts(runner, tmp_path):
    path = fixture_path("kineto", "diff_test.json.gz")
    root = tmp_path / "t"
    (run_id,) = json.loads(_invoke(runner, "import", path, "--out", root, "--json").stdout)
    summary = json.loads(_invoke(runner, "show", run_id, "--out", root, "--json").stdout)
    assert summary["events"]["kernel"] == 9876
    assert summary["events"]["op"] == 31236




def test_capture_json_then_show(runner, tmp_path):
    root = tmp_path / "traces"
    result = runner.invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["variant"] for r in report["runs"]] == ["eager", "bf16"]
    assert all(r["status"] == "ok" for r in report["runs"])
    summary = json.loads(_invoke(runner, "show", report["runs"][1]["run_id"], "--out", root, "--json").stdout)
    assert summary["variant"] == "bf16"
    assert summary["latency_ms"]["p50"] > 0
    assert 0 < summary["numerics"]["top1_agreement"] <= 1
    assert summary["events"]["op"] > 0
    assert summary["memory_peak_bytes"]["cpu"] > 0
    assert summary["ops_window"] == "measure"
    assert any(row["name"].startswith("aten::") for row in summary["top_ops"])
    assert (root / "experiments" / f"{report['experiment']}.json").exists()


def test_capture_unknown_variant_is_bad_input(runner, tmp_path):
    result = runner.invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,warp-speed", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "warp-speed" in result.stderr
    assert "eager" in result.stderr  # lists the valid names
    assert list(tmp_path.iterdir()) == []


def test_capture_bad_override(runner, tmp_path):
    result = runner.invoke(main, ["capture", *TINY_CAPTURE, "--set", "layers", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.stderr


def test_capture_with_failing_model_exits_1_and_names_variant(runner, tmp_path, monkeypatch):
    module = tmp_path / "boom_model.py"
    module.write_text(
        "import torch\n"
        "class Boom(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.dtype == torch.bfloat16 or torch.is_autocast_enabled('cpu'):\n"
        "            raise RuntimeError('kaboom in bf16')\n"
        "        return x * 2\n"
        "def build():\n"
        "    return Boom(), (torch.ones(2, 4),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "traces"
    result = runner.invoke(main, ["capture", "--model", "boom_model:build", "--variants", "eager,bf16",
                                  "--batch", "2", "--iterations", "2", "--warmup", "0", "--out", str(root)])
    assert result.exit_code == 1, result.output
    assert "bf16" in result.stderr and "kaboom" in result.stderr
    runs = {row["variant"]: row for row in json.loads(_invoke(runner, "ls", "--out", root, "--json").stdout)}
    assert runs["eager"]["status"] == "ok"
    assert runs["bf16"]["status"] == "failed"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
