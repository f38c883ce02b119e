"""The noise verdict on a run's latency samples (`workbench.analysis.noise`) and where it shows: `runs.noise` of
SQL and `workbench ls --json`, the `ls`, `show` and capture tables, the dashboard's heading."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from workbench.analysis.noise import latency_noise
from workbench.cli import main
from workbench.trace.store.bundle import open_bundle, write_bundle


def stats(samples: list[float]) -> dict:
    p50, p99 = np.percentile(samples, [50, 99])
    return {"samples_ms": samples, "p50": float(p50), "p99": float(p99), "iterations": len(samples)}


STEADY = [10.0 + 0.01 * (i % 7) for i in range(40)]
TAILED = [*STEADY[:-2], 30.0, 31.0]  # p99 about 3× p50
BIMODAL = [10.0 + 0.01 * i for i in range(28)] + [13.0 + 0.01 * i for i in range(12)]  # 30% of calls 30% slower


@pytest.mark.parametrize(("samples", "noisy", "bimodal", "words"), [
    (STEADY, False, False, ""),
    (TAILED, True, False, "p99 is 3.1× p50"),
    (BIMODAL, True, True, "two clusters"),
    (STEADY[:9], None, None, None),  # too few samples to judge
])
def test_noise_verdict(samples, noisy, bimodal, words):
    noise = latency_noise(stats(samples))
    if noisy is None:
        assert noise is None
        return
    assert (noise.noisy, noise.bimodal) == (noisy, bimodal)
    assert words in noise.reason
    expected_tail = np.percentile(samples, 99) / np.percentile(samples, 50)
    assert noise.tail_ratio == pytest.approx(expected_tail)


def test_a_lone_outlier_is_a_tail_not_two_clusters():
    samples = [*STEADY[:-1], 40.0]  # one slow call in 40: under 10% on its side of the gap
    noise = latency_noise(stats(samples))
    assert not noise.bimodal


def test_statistics_only_bundles_are_judged_by_their_tail():
    assert latency_noise({"p50": 1.0, "p99": 2.0, "iterations": 30}).reason == "p99 is 2.0× p50"
    assert latency_noise({"p50": 1.0, "p99": 2.0, "iterations": 3}) is None
    assert latency_noise(None) is None


def test_noise_shows_in_ls_show_sql_and_the_dashboard(tmp_path):
    from workbench.analysis.experiment_tables import variant_table
    from workbench.analysis.sql import run_query
    from workbench.views.dashboard import dashboard

    root = tmp_path / "traces"
    write_bundle(root, "noisy", {"benchmark": stats(BIMODAL), "batch": 4})
    write_bundle(root, "steady", {"benchmark": stats(STEADY), "batch": 4})
    runner = CliRunner()
    listing = json.loads(runner.invoke(main, ["ls", "--out", str(root), "--json"]).stdout)
    assert {row["run"]: row["noise"] for row in listing} == {"noisy": "samples split in two clusters", "steady": None}
    assert {row["batch"] for row in listing} == {4}
    table = runner.invoke(main, ["ls", "--out", str(root)])
    assert table.stdout.count("noisy") == 2  # the run id, and the flag beside its median
    shown = runner.invoke(main, ["show", "noisy", "--out", str(root)])
    assert "noisy:" in shown.stderr and "two clusters" in shown.stderr
    assert "noisy:" not in runner.invoke(main, ["show", "steady", "--out", str(root)]).stderr

    bundles = [open_bundle(run, root) for run in ("noisy", "steady")]
    verdicts = run_query(bundles, "SELECT run, noisy, noise FROM runs ORDER BY run").table.to_pylist()
    assert verdicts == [{"run": "noisy", "noisy": True, "noise": "samples split in two clusters"},
                        {"run": "steady", "noisy": False, "noise": None}]
    heading = dashboard(bundles[0]).children[0].text
    assert "p50" in heading and "noisy: samples split in two clusters" in heading
    compared = variant_table(bundles)  # the comparison of the report, the panel and wb.compare
    assert compared.set_index("run")["noise"].to_dict() == {"noisy": "samples split in two clusters", "steady": ""}


def test_the_capture_table_flags_a_noisy_median(tmp_path):
    from workbench.cli.capture import capture_table

    root = tmp_path / "traces"
    runs = [{"variant": name, "status": "ok", "p50_ms": 10.0, "p99_ms": 13.0, "run_id": name,
             "path": str(write_bundle(root, name, {"benchmark": stats(samples)}))}
            for name, samples in (("noisy", BIMODAL), ("steady", STEADY))]
    table = capture_table("exp", runs)
    medians = [row[table.columns.index("p50 ms")] for row in table.rows]
    assert [cell.text for cell in medians[0]] == ["10", " noisy"] and medians[0][1].tone == "bad"
    assert medians[1].text == "10"
