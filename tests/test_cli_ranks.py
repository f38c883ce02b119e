"""`workbench ranks EXPERIMENT`: the per-rank analyses of a rank import, as distributed queries, from the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner
from conftest import emptied_memory
from test_multirank import SLOW_RANK, STEP_US, _write_job

from workbench.analysis import rank_queries
from workbench.analysis.ranks import RANK_COLUMNS, SPREAD_COLUMNS, RankPartial, combine, rank_aggregates
from workbench.cli import main
from workbench.distributed import engine
from workbench.rank_import import import_rank_job
from workbench.trace.ranks.multirank import read_ranks
from workbench.trace.store.experiment import write_experiment

MEMORY_ROOT = "/cli-ranks-traces"
"""Folder of the memory:// traces root, removed after the test that uses it."""


@pytest.fixture(autouse=True)
def two_workers(monkeypatch) -> None:
    """The local pool forks at most two workers (CI's cores), whatever this machine has."""
    monkeypatch.setattr(engine, "usable_cpus", lambda: 2)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    return _write_job(tmp_path_factory.mktemp("ranks") / "job")


@pytest.fixture(scope="module")
def imported(job: Path) -> tuple[Path, str, list[str]]:
    """The job imported into a local traces root: (root, experiment id, run ids in rank order)."""
    root = job.parent / "traces"
    result = import_rank_job(job, root, workers=1)
    assert not result.failed
    return root, result.experiment_id, result.run_ids


def _plain(value):
    """A pandas/numpy value as the plain JSON value it stands for (NaN: null)."""
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _ranks(*args: str):
    return CliRunner().invoke(main, ["ranks", *args])


def test_json_matches_the_ranks_read_from_the_job_folder(job: Path, imported) -> None:
    root, experiment, _ = imported
    result = _ranks(experiment, "--out", str(root), "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["experiment"] == experiment and got["stragglers"] == [SLOW_RANK]
    assert [r["rank"] for r in got["ranks"]] == [0, 1, 2, 3]
    assert all(list(r) == list(RANK_COLUMNS) for r in got["ranks"])
    expected = rank_aggregates(read_ranks(job, workers=1))
    assert got["ranks"] == [{k: _plain(v) for k, v in row.items()} for row in expected.table.to_dict("records")]
    assert got["steps"] == [{k: _plain(v) for k, v in row.items()} for row in expected.spread.to_dict("records")]
    assert all(list(s) == list(SPREAD_COLUMNS) for s in got["steps"])
    # figures from how _write_job built the job: 3 steps, per step compute [100, 500) + [650, 800) µs (+ the
    # slow rank's [900, 1200)), an all-reduce kernel [400, 700) overlapping compute for 100 + 50 µs
    for row in got["ranks"]:
        slow = row["rank"] == SLOW_RANK
        assert row["steps"] == 3 and row["median_step_ns"] == STEP_US[row["rank"]] * 1000
        assert row["compute_ns"] == 3 * (850_000 if slow else 550_000)
        assert (row["collective_ns"], row["overlap_ns"], row["exposed_collective_ns"]) == (900_000, 450_000, 450_000)
        assert row["overlap_frac"] == 0.5 and row["straggler"] is slow
    assert [(s["step"], s["ranks"], s["spread_ns"], s["slowest_rank"]) for s in got["steps"]] == \
        [(step, 4, 300_000, SLOW_RANK) for step in range(3)]


def test_text_names_the_straggler(imported) -> None:
    root, experiment, _ = imported
    result = _ranks(experiment, "--out", str(root))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == [experiment, "4", "ranks", "stragglers:", "rank", str(SLOW_RANK)]
    slow_row = next(line for line in lines if line.startswith("│") and line.split("│")[1].strip() == str(SLOW_RANK))
    assert "+30.0%" in slow_row and "yes" in slow_row
    assert "step spread over the ranks" in result.stdout and "--steps for all" not in result.stdout


def test_threshold_above_the_slow_ranks_excess_flags_nobody(imported) -> None:
    root, experiment, _ = imported
    result = _ranks(experiment, "--out", str(root), "--threshold", "0.5", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stragglers"] == []
    text = _ranks(experiment, "--out", str(root), "--threshold", "0.5")
    assert "no straggler" in text.stdout.splitlines()[0]


@pytest.fixture
def memory() -> Iterator[fsspec.AbstractFileSystem]:
    with emptied_memory(MEMORY_ROOT) as fs:
        yield fs


def test_url_root(job: Path, imported, memory) -> None:
    url = f"memory://{MEMORY_ROOT.lstrip('/')}"
    remote = import_rank_job(job, url)
    result = _ranks(remote.experiment_id, "--out", url, "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    local = json.loads(_ranks(imported[1], "--out", str(imported[0]), "--json").stdout)
    assert got["stragglers"] == [SLOW_RANK] and got["ranks"] == local["ranks"] and got["steps"] == local["steps"]


def test_unknown_experiment_and_a_run_id(imported) -> None:
    root, _, run_ids = imported
    for name in ("no-such-experiment", run_ids[0]):
        result = _ranks(name, "--out", str(root))
        assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
        assert f"no experiment '{name}' in {root}" in result.stderr and "import --ranks` printed" in result.stderr
    escaping = _ranks("../../etc/passwd", "--out", str(root))
    assert escaping.exit_code == 2 and "'../../etc/passwd' is not an experiment id" in escaping.stderr


def test_experiment_that_is_no_rank_import(tmp_path: Path) -> None:
    write_experiment(tmp_path, "exp-capture", {"model": "tiny-gpt", "reference": "eager", "runs": ["r-eager"]})
    result = _ranks("exp-capture", "--out", str(tmp_path))
    assert result.exit_code == 2 and "'exp-capture' is no import of a job's ranks" in result.stderr


def test_unreadable_rank_bundle_is_named(job: Path, tmp_path: Path) -> None:
    root = tmp_path / "traces"
    result = import_rank_job(job, root, workers=1)
    (root / result.run_ids[1] / "events.parquet").write_bytes(b"not parquet")
    failed = _ranks(result.experiment_id, "--out", str(root))
    assert failed.exit_code == 2 and f"rank 1: run '{result.run_ids[1]}'" in failed.stderr
    assert len(failed.stderr.splitlines()) == 1


def test_unknown_cluster_names_the_accepted_values(imported) -> None:
    root, experiment, _ = imported
    result = _ranks(experiment, "--out", str(root), "--cluster", "bogus")
    assert result.exit_code == 2 and "unknown cluster 'bogus'" in result.stderr
    assert all(value in result.stderr for value in engine.CLUSTERS)


def test_step_table_lists_the_largest_spreads_unless_steps(monkeypatch, tmp_path: Path) -> None:
    """12 steps; on rank 1, step s lasts 1 ms + s µs (rank 0: 1 ms), so the spread grows with the step index."""
    def partial(rank: int) -> RankPartial:
        ends = [(s, s * 2_000_000, s * 2_000_000 + 1_000_000 + rank * s * 1000) for s in range(12)]
        return RankPartial(rank=rank, devices="cuda:0", busy_ns=0, idle_ns=0, kernel_ns=0, compute_ns=0,
                           collective_ns=0, overlap_ns=0, host_collective_ns=0, steps=tuple(ends))

    monkeypatch.setattr(rank_queries, "job_aggregates", lambda *a, **k: combine([partial(0), partial(1)]))

    def listed_steps(*flags: str) -> list[int]:
        result = _ranks("exp", "--out", str(tmp_path), *flags)
        assert result.exit_code == 0, result.output
        table = result.stdout.split("step spread over the ranks", 1)[1].splitlines()
        return [int(line.split("│")[1]) for line in table if line.startswith("│")]

    assert listed_steps() == list(range(11, 1, -1))  # the 10 of largest spread, largest first
    assert listed_steps("--steps") == list(range(12))
    got = json.loads(_ranks("exp", "--out", str(tmp_path), "--json").stdout)
    assert len(got["steps"]) == 12 and {r["overlap_frac"] for r in got["ranks"]} == {None}  # no collective: NaN


def test_notebook_ranks_on_a_url_root_named_by_the_environment(job: Path, imported, memory, monkeypatch,
                                                               tmp_path: Path) -> None:
    import workbench as wb

    url = f"memory://{MEMORY_ROOT.lstrip('/')}"
    remote = import_rank_job(job, url)
    monkeypatch.setenv("WORKBENCH_TRACES", url)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    table = wb.ranks(remote.experiment_id)
    local = wb.ranks(imported[1], imported[0])
    assert table.equals(local) and table.loc[table["straggler"], "rank"].tolist() == [SLOW_RANK]
    mirrored = list((tmp_path / "cache").rglob("*.parquet"))
    assert mirrored == []  # read at the URL: no rank's tables were copied down
