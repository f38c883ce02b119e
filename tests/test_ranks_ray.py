"""The multi-rank import and analyses on a local Ray cluster (2 CPUs on 127.0.0.1, started once for the
module): the same bundles, byte for byte in their tables, as the local path; a failed rank reported and the
others kept; Ctrl-C cancels and leaves nothing; distributed analyses equal local ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import fixture_path
from test_multirank import SLOW_RANK, _write_job

from workbench.analysis.rank_queries import job_aggregates
from workbench.analysis.ranks import rank_aggregates
from workbench.cli import main
from workbench.rank_import import WRITE_TASK, import_rank_job
from workbench.runner import NullProgress
from workbench.trace.ranks.multirank import read_ranks
from workbench.trace.store.bundle import TABLES, list_bundles
from workbench.trace.store.experiment import list_experiments

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'workbench[ray]'")
pytestmark = pytest.mark.slow  # starting Ray takes seconds (20+ on a loaded 2-core machine)

HTA_RANKS = ("ns_resolution_rank0.pt.trace.json.gz", "cpu_only_rank34.pt.trace.json.gz", "diff_test.json.gz")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs, shut down after the module; the engine the tests import with."""
    from workbench.distributed.ray_engine import RayEngine

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield RayEngine("auto")
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The HTA fixtures' ranks and the synthetic job, each in its own folder."""
    base = tmp_path_factory.mktemp("ranks")
    real = base / "hta"
    real.mkdir()
    for name in HTA_RANKS:
        shutil.copy(fixture_path("kineto", name), real / name)
    return {"hta": real, "synthetic": _write_job(base / "synthetic")}


def _same_bundles(local_root: Path, local_ids: list[str], ray_root: Path, ray_ids: list[str]) -> None:
    assert len(local_ids) == len(ray_ids)
    for local_id, ray_id in zip(local_ids, ray_ids, strict=True):
        for table in TABLES:
            assert (ray_root / ray_id / f"{table}.parquet").read_bytes() == \
                (local_root / local_id / f"{table}.parquet").read_bytes(), (ray_id, table)
        ours, theirs = (json.loads((root / run / "run.json").read_text()) for root, run in
                        ((local_root, local_id), (ray_root, ray_id)))
        assert ours["trace"] == theirs["trace"] and ours["rank"] == theirs["rank"]


@pytest.mark.parametrize("job", ["hta", "synthetic"])
def test_ray_import_equals_the_local_one(cluster, folders, job: str, tmp_path: Path) -> None:
    local = import_rank_job(folders[job], tmp_path / "local", workers=1)
    remote = import_rank_job(folders[job], tmp_path / "ray", engine=cluster)
    assert remote.failed == {}
    _same_bundles(tmp_path / "local", local.run_ids, tmp_path / "ray", remote.run_ids)
    (experiment,) = list_experiments(tmp_path / "ray")
    (expected,) = list_experiments(tmp_path / "local")
    assert [{k: r[k] for k in ("rank", "file", "offset_ns")} for r in experiment.info["ranks"]] == \
        [{k: r[k] for k in ("rank", "file", "offset_ns")} for r in expected.info["ranks"]]
    distributed = job_aggregates(tmp_path / "ray", remote.experiment_id, engine=cluster)
    here = rank_aggregates(read_ranks(folders[job], workers=1))
    pd.testing.assert_frame_equal(distributed.table, here.table)
    pd.testing.assert_frame_equal(distributed.steps, here.steps)
    pd.testing.assert_frame_equal(distributed.spread, here.spread)
    if job == "synthetic":
        assert distributed.table.loc[distributed.table["straggler"], "rank"].tolist() == [SLOW_RANK]


def test_failed_rank_is_named_and_the_others_kept(cluster, folders, tmp_path: Path) -> None:
    folder = tmp_path / "job"
    shutil.copytree(folders["synthetic"], folder)
    (folder / "rank9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')  # fails inside the decoder
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["import", "--ranks", str(folder), "--cluster", "auto", "--out", str(root),
                                       "--json"])
    assert result.exit_code == 1, result.output  # EXIT_PARTIAL
    out = json.loads(result.stdout)
    assert list(out["failed"]) == ["rank9.pt.trace.json"] and len(out["runs"]) == 4
    assert sorted(b.run_id for b in list_bundles(root)) == sorted(out["runs"])  # no bundle, half or whole, for rank 9
    (experiment,) = list_experiments(root)
    assert experiment.info["failed"] == ["rank9.pt.trace.json"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


class _InterruptOnWrite(NullProgress):
    """Ctrl-C as soon as the first bundle is written."""

    def advance(self, task: str, n: int = 1) -> None:
        if task == WRITE_TASK:
            raise KeyboardInterrupt


def test_ctrl_c_cancels_and_nothing_appears(cluster, folders, tmp_path: Path) -> None:
    root = tmp_path / "traces"
    with pytest.raises(KeyboardInterrupt):
        import_rank_job(folders["synthetic"], root, engine=cluster, progress=_InterruptOnWrite())
    assert list(root.iterdir()) == []  # no bundle, no record, no staging folder


def test_ranks_command_on_the_cluster_equals_the_local_pool(cluster, folders, tmp_path: Path) -> None:
    root = tmp_path / "traces"
    imported = import_rank_job(folders["synthetic"], root, engine=cluster)
    answers = [CliRunner().invoke(main, ["ranks", imported.experiment_id, "--out", str(root), "--json",
                                         "--cluster", where]) for where in ("auto", "local")]
    assert [a.exit_code for a in answers] == [0, 0], [a.output for a in answers]
    on_ray, here = (json.loads(a.stdout) for a in answers)
    assert on_ray == here and on_ray["stragglers"] == [SLOW_RANK]
