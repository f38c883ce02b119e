"""`workbench analyze`: findings, idle time and roofline of a run, for people and for scripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_CAPTURE, fixture_path

from workbench.analysis.breakdown import phase_window
from workbench.analysis.idle import idle_summary
from workbench.cli import main
from workbench.trace import read_trace


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("analyze")
    path = fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz")
    imported = _invoke("import", str(path), "--out", str(root), "--json")
    assert imported.exit_code == 0, imported.output
    return root, json.loads(imported.stdout)[0]


def test_json_has_the_public_fields_and_the_idle_of_the_trace(resnet: tuple[Path, str]) -> None:
    root, run = resnet
    result = _invoke("analyze", run, "--out", str(root), "--device", "a100", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["run"] == run and data["device"] == "a100-sxm-80gb"
    assert data["findings"] and all({"kind", "time_share", "evidence", "suggestion"} <= f.keys()
                                    for f in data["findings"])
    assert all(0 <= f["time_share"] <= 1 for f in data["findings"])
    ranks = [(-(f["path_share"] or 0.0), -f["time_share"]) for f in data["findings"]]  # on the path first
    assert ranks == sorted(ranks)
    trace = read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))
    expected = idle_summary(trace, phase_window(trace, "measure"))["cuda:0"]
    idle = data["idle"]["cuda:0"]
    for key in ("busy_ns", "idle_ns", "largest_gap_ns", "largest_gap_start_ns"):
        assert idle[key] == expected[key], key
    kinds = {row["kind"] for row in data["roofline"]}
    assert "kernel" in kinds and {row["bound"] for row in data["roofline"]} <= {"compute", "memory", "latency",
                                                                               "unknown"}


def test_a_device_the_run_does_not_name_needs_device(resnet: tuple[Path, str]) -> None:
    root, run = resnet
    result = _invoke("analyze", run, "--out", str(root))
    assert result.exit_code == 0, result.output
    assert "give --device" in result.output and "findings" in result.output
    bad = _invoke("analyze", run, "--out", str(root), "--device", "Z9000")
    assert bad.exit_code == 2 and "Z9000" in bad.output and "h100-sxm" in bad.output


def test_a_cpu_capture_is_drawn_against_the_measured_cpu(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    captured = _invoke("capture", *TINY_CAPTURE, "--variants", "eager", "--out", str(root), "--json")
    assert captured.exit_code == 0, captured.output
    run = json.loads(captured.stdout)["runs"][0]["run_id"]
    result = _invoke("analyze", run, "--out", str(root), "--json")
    data = json.loads(result.stdout)
    assert data["device"] == "cpu" and data["idle"] == {}
    linear = [row for row in data["roofline"] if row["name"] == "aten::addmm"]
    assert linear and linear[0]["flops"] > 0 and linear[0]["bound"] in ("compute", "memory", "latency")
    assert _invoke("analyze", "no-such-run", "--out", str(root)).exit_code == 2
