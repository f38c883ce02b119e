"""`workbench report` and `capture --report`: self-contained HTML, atomic writes, bad references."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import PAYLOADS, TINY_CAPTURE, fixture_path, payload_report

from workbench.cli import main


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    report = root / "experiment.html"
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root),
                                       "--report", str(report), "--json"])
    assert result.exit_code == 0, result.output
    return root, json.loads(result.stdout), report


def test_capture_writes_the_experiment_report(captured):
    _, result, report = captured
    assert result["report"] == str(report)
    html = report.read_text()
    assert "<script" in html and "Bokeh" in html
    assert "https://cdn.bokeh.org" not in html  # BokehJS inline: opens offline
    assert not [p for p in report.parent.iterdir() if p.name.startswith(f".{report.name}.")]
    # each run's Perfetto trace beside it, under an "Open in Perfetto" button, with the step's critical path
    from workbench.trace.registry import read_trace

    for run in result["runs"]:
        trace = report.with_name(f"{report.stem}.{run['run_id']}.perfetto-trace")
        assert trace.name in html and "ui.perfetto.dev" in html
        tracks = read_trace(trace).events["track"].to_pandas().astype(str)
        assert tracks.str.contains("critical path", regex=False).any()


def test_report_of_a_run_and_of_an_experiment(captured, tmp_path):
    root, result, _ = captured
    runner = CliRunner()
    first = result["runs"][0]["run_id"]
    one = runner.invoke(main, ["report", first, "--out", str(root), "-o", str(tmp_path / "a.html")])
    assert one.exit_code == 0, one.output
    assert one.stdout.strip() == str(tmp_path / "a.html")
    both = runner.invoke(main, ["report", result["experiment"], "--out", str(root), "-o", str(tmp_path / "b.html")])
    assert both.exit_code == 0, both.output
    assert "compare" in (tmp_path / "b.html").read_text()


def test_report_of_an_imported_fixture(tmp_path):
    runner = CliRunner()
    root = tmp_path / "t"
    fixture = fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz")
    (run_id,) = json.loads(runner.invoke(main, ["import", str(fixture), "--out", str(root), "--json"]).stdout)
    out = runner.invoke(main, ["report", run_id, "--out", str(root), "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "r.html").stat().st_size < 10_000_000


def test_report_unknown_reference(tmp_path):
    target = tmp_path / "x.html"
    result = CliRunner().invoke(main, ["report", "nothing-here", "--out", str(tmp_path), "-o", str(target)])
    assert result.exit_code == 2
    assert "nothing-here" in result.stderr
    assert not target.exists()


def test_payload_names_are_not_live_html(tmp_path):
    html = payload_report(tmp_path).read_text()
    for payload in PAYLOADS:
        assert payload not in html
