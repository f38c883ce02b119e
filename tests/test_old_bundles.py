"""Bundles written by the previous release (0.1.0 at d3606ea: an mlp capture of eager and bf16, a Kineto
import, a tiny-gpt generation run, their experiment records) still open, list, show, compare and report, and their
SQL reads unknown numbers as NULL."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.analysis.sql import run_query
from workbench.cli import main
from workbench.trace.store.bundle import list_bundles, open_bundle
from workbench.trace.store.records import ExperimentRecord, RunInfo

ARCHIVE = Path(__file__).parent / "data" / "bundles-0.1.0-d3606ea.tar.gz"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("old-bundles")
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(folder, filter="data")
    return folder


def _run_ids(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if (p / "run.json").is_file())


def test_every_old_run_json_reads_as_a_typed_record(root):
    ids = _run_ids(root)
    assert len(ids) == 4
    for run_id in ids:
        raw = json.loads((root / run_id / "run.json").read_text())
        info = RunInfo.from_json(raw, run_id)
        assert info.run_id == run_id and info.status == "ok" and info.schema_version == 1
        assert info.to_json()["run_id"] == run_id and not set(raw) - set(info.to_json())  # nothing lost
    kinds = {RunInfo.from_json(json.loads((root / r / "run.json").read_text()), r).kind for r in ids}
    assert kinds == {None, "generation"}
    for path in (root / "experiments").glob("*.json"):
        record = ExperimentRecord.from_json(json.loads(path.read_text()), path.stem)
        assert record.runs and all((root / run).is_dir() for run in record.runs)


def test_old_bundles_open_with_their_traces(root):
    bundles = list_bundles(root)
    assert sorted(b.run_id for b in bundles) == _run_ids(root)
    for bundle in bundles:
        trace = open_bundle(bundle.run_id, root).trace()
        assert trace.events.num_rows > 0


def test_the_cli_lists_shows_compares_and_reports_old_bundles(root, tmp_path):
    runner = CliRunner()
    listed = runner.invoke(main, ["ls", "--json", "--out", str(root)], catch_exceptions=False)
    assert listed.exit_code == 0
    rows = json.loads(listed.output)
    assert sorted(r["run"] for r in rows) == _run_ids(root)
    assert {r["variant"] for r in rows} == {"eager", "bf16", "mha-fp32", None}
    for run_id in _run_ids(root):
        shown = runner.invoke(main, ["show", run_id, "--json", "--out", str(root)], catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["run"] == run_id
    capture = next(p.stem for p in (root / "experiments").glob("*mlp*.json"))
    report = tmp_path / "old.html"
    done = runner.invoke(main, ["report", capture, "-o", str(report), "--out", str(root)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert report.stat().st_size > 100_000


def test_sql_over_old_bundles_gives_null_for_unknown_numbers(root):
    """Their Parquet files hold an unknown `flops` or `bytes` as NaN; SQL reads it as NULL, so sums skip it."""
    bundles = list_bundles(root)
    events = [b.trace().events for b in bundles]
    flops = [f for e in events for f in e["flops"].to_pylist() if f == f]
    unknown = sum(f != f for e in events for f in e["flops"].to_pylist())
    assert flops and unknown  # the old files do hold NaN
    result = run_query(bundles, "SELECT sum(flops) AS flops, count(flops) AS known, count(*) - count(flops) AS "
                       "unknown, count(*) FILTER (WHERE isnan(flops) OR isnan(bytes)) AS nan, sum(bytes) AS bytes "
                       "FROM events")
    assert result.to_json()["rows"] == [[pytest.approx(sum(flops)), len(flops), unknown, 0, None]]
