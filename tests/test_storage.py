"""Traces roots and inputs as fsspec URLs (memory://, file://) for the multi-rank import and its analyses,
the engine interface's local side, and the message without Ray."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import emptied_memory
from test_multirank import NAMES, SLOW_RANK, _write_job

from workbench.analysis.rank_queries import job_aggregates
from workbench.analysis.ranks import rank_aggregates
from workbench.cli import main
from workbench.errors import MissingDependency, TraceFormatError, WorkbenchError
from workbench.rank_import import import_rank_job
from workbench.storage import location
from workbench.trace.ranks.multirank import read_ranks
from workbench.trace.store import destination
from workbench.trace.store.bundle import TABLES, list_bundles, open_bundle
from workbench.trace.store.experiment import list_experiments


@pytest.fixture
def job(tmp_path: Path) -> Path:
    return _write_job(tmp_path / "job")


@pytest.fixture
def memory() -> Iterator[fsspec.AbstractFileSystem]:
    with emptied_memory("/jobs", "/traces") as fs:
        yield fs


def _upload(fs: fsspec.AbstractFileSystem, folder: Path) -> str:
    for path in folder.iterdir():
        fs.put_file(str(path), f"/jobs/job/{path.name}")
    return "memory://jobs/job"


def test_locations() -> None:
    assert location("file:///tmp/x").is_local and location("file:///tmp/x").path == "/tmp/x"
    memory = location("memory://a/b")
    assert (memory.protocol, memory.path, memory.url, memory.is_local) == ("memory", "/a/b", "memory://a/b", False)
    assert memory.join("c", "d.json").url == "memory://a/b/c/d.json"
    with pytest.raises(WorkbenchError, match="unknown storage protocol 'nosuch'"):
        location("nosuch://bucket/x")


def test_missing_filesystem_package_is_named() -> None:
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed here: the message for a missing package cannot be shown")
    with pytest.raises(WorkbenchError, match="s3fs"):
        location("s3://bucket/traces")


def test_memory_import_equals_local_byte_for_byte(job: Path, tmp_path: Path, memory) -> None:
    local = import_rank_job(job, tmp_path / "root", workers=1)
    remote = import_rank_job(_upload(memory, job), "memory://traces")
    assert not remote.failed and len(remote.run_ids) == len(local.run_ids) == 4
    for local_id, remote_id in zip(local.run_ids, remote.run_ids, strict=True):
        for table in TABLES:
            written = memory.cat_file(f"/traces/{remote_id}/{table}.parquet")
            assert written == (tmp_path / "root" / local_id / f"{table}.parquet").read_bytes(), (remote_id, table)
        info = json.loads(memory.cat_file(f"/traces/{remote_id}/run.json"))
        assert info["imported_from"].startswith("memory://jobs/job/") and info["rank"] is not None
    record = json.loads(memory.cat_file(f"/traces/experiments/{remote.experiment_id}.json"))
    assert record["runs"] == remote.run_ids and [r["file"] for r in record["ranks"]] == list(NAMES.values())
    expected = rank_aggregates(read_ranks(job, workers=1))
    got = job_aggregates("memory://traces", remote.experiment_id)
    pd.testing.assert_frame_equal(got.table, expected.table)
    pd.testing.assert_frame_equal(got.spread, expected.spread)
    assert got.table.loc[got.table["straggler"], "rank"].tolist() == [SLOW_RANK]
    assert got.spread["slowest_rank"].tolist() == [SLOW_RANK] * 3
    assert got.spread["spread_ns"].tolist() == [300_000] * 3  # 1.3 ms against 1.0 ms


def test_object_store_failed_rank_keeps_the_others_and_no_half_bundle(job: Path, memory) -> None:
    (job / "rank9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')  # fails inside the decoder
    folder = _upload(memory, job)
    with pytest.raises(TraceFormatError, match=r"rank9\.pt\.trace\.json"):
        import_rank_job(folder, "memory://traces", keep_going=False)
    assert not memory.exists("/traces") or memory.find("/traces") == []
    imported = import_rank_job(folder, "memory://traces", keep_going=True)
    assert list(imported.failed) == ["rank9.pt.trace.json"] and len(imported.run_ids) == 4
    entries = sorted(p.rsplit("/", 1)[-1] for p in memory.ls("/traces", detail=False))
    assert entries == sorted([*imported.run_ids, "experiments"])  # no prefix for the failed rank
    record = json.loads(memory.cat_file(f"/traces/experiments/{imported.experiment_id}.json"))
    assert record["failed"] == ["rank9.pt.trace.json"] and "rank9" in record["failed_ranks"][0]["file"]


def test_interrupted_object_store_import_leaves_nothing(job: Path, memory, monkeypatch) -> None:
    real = destination.Destination.write
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(destination.Destination, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        import_rank_job(_upload(memory, job), "memory://traces")
    assert len(calls) == 3 and (not memory.exists("/traces") or memory.find("/traces") == [])


def test_cli_imports_into_a_file_url_root(job: Path, tmp_path: Path) -> None:
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["import", "--ranks", str(job), "--out", f"file://{root}", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["failed"] == {} and sorted(b.run_id for b in list_bundles(root)) == sorted(out["runs"])
    (experiment,) = list_experiments(root)
    assert experiment.run_ids == out["runs"]
    assert open_bundle(out["runs"][0], root).trace().metadata["rank"]["rank"] == 0
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no staging or scratch left


def test_cli_imports_into_a_url_root_named_by_the_environment(job: Path, memory, monkeypatch) -> None:
    monkeypatch.setenv("WORKBENCH_TRACES", "memory://traces")  # no --out: the URL root comes from the environment
    result = CliRunner().invoke(main, ["import", "--ranks", str(job), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["failed"] == {} and len(out["runs"]) == len(NAMES)
    assert memory.exists(f"/traces/experiments/{out['experiment']}.json")
    assert all(memory.exists(f"/traces/{run_id}/run.json") for run_id in out["runs"])


def test_cluster_without_ray_says_how_to_get_it(job: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    from workbench.distributed import engine_for

    with pytest.raises(MissingDependency, match=r"pip install 'workbench\[ray\]'"):
        engine_for("auto")
    result = CliRunner().invoke(main, ["import", "--ranks", str(job), "--cluster", "ray://127.0.0.1:10001",
                                       "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "pip install 'workbench[ray]'" in result.stderr


def test_unknown_cluster_and_cluster_without_ranks(job: Path, tmp_path: Path) -> None:
    bad = CliRunner().invoke(main, ["import", "--ranks", str(job), "--cluster", "yarn", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown cluster 'yarn'" in bad.stderr
    alone = CliRunner().invoke(main, ["import", "x.json", "--cluster", "auto", "--out", str(tmp_path)])
    assert alone.exit_code == 2 and "--ranks" in alone.output


def test_view_from_aggregates_has_heatmap_and_no_timelines(job: Path) -> None:
    from bokeh.embed import json_item

    from workbench.views.ranks import ranks_view

    text = json.dumps(json_item(ranks_view(rank_aggregates(read_ranks(job, workers=1)), width=600)))
    assert "stragglers: rank 2" in text and "vs the step's median" in text and "slowest rank" in text
    assert "timelines of all ranks" not in text


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_job_over_the_memory_budget_is_decoded_twice_with_the_same_bundles(job: Path, tmp_path: Path, memory,
                                                                              monkeypatch, where: str) -> None:
    from workbench import rank_import
    from workbench.trace.ranks import tasks as rank_tasks

    kept = import_rank_job(job, tmp_path / "kept", workers=1)
    reads: list[str] = []
    real_read = rank_tasks._read
    monkeypatch.setattr(rank_tasks, "_read", lambda source: reads.append(source.name) or real_read(source))
    monkeypatch.setattr(rank_import, "keep_budget", lambda: 0)  # no job fits: every rank decoded again to write
    source = str(job) if where == "local" else _upload(memory, job)
    twice = import_rank_job(source, tmp_path / "twice", workers=1)
    assert sorted(reads) == sorted([*NAMES.values()] * 2)  # each file read for its facts, then for its bundle
    for kept_id, twice_id in zip(kept.run_ids, twice.run_ids, strict=True):
        for table in TABLES:
            assert (tmp_path / "twice" / twice_id / f"{table}.parquet").read_bytes() == \
                (tmp_path / "kept" / kept_id / f"{table}.parquet").read_bytes(), (twice_id, table)
