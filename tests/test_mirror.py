"""A URL traces root read through its local mirror: listings read run.json only, a bundle's files come down
whole on first use and equal the ones at the URL, unpublished prefixes stay unseen, removed runs leave the
mirror, writing commands refuse a URL root, and the ranks view of a remote job copies no table down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner
from conftest import emptied_memory
from test_multirank import NAMES, SLOW_RANK, _write_job

from workbench.cli import main
from workbench.errors import BundleError, WorkbenchError
from workbench.paths import checked_root
from workbench.rank_import import import_rank_job
from workbench.storage import location
from workbench.trace.store.bundle import RUN_JSON, TABLES, list_bundles, open_bundle
from workbench.trace.store.experiment import list_experiments
from workbench.trace.store.mirror import mirror_root
from workbench.trace.store.mirror_bundle import REMOTE_JSON, remote_root

ROOT = "/mirrored"
URL = f"memory://{ROOT.lstrip('/')}"


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[fsspec.AbstractFileSystem]:
    """The memory filesystem, emptied before and after; mirrors in a temporary cache."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    with emptied_memory(ROOT) as fs:
        yield fs


@pytest.fixture
def imported(memory: fsspec.AbstractFileSystem, tmp_path: Path):
    """A synthetic job of 4 ranks imported at the URL root."""
    return import_rank_job(_write_job(tmp_path / "job"), URL)


def _local_tables(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".parquet")


def test_listing_reads_run_json_only(imported, memory: fsspec.AbstractFileSystem) -> None:
    mirror = mirror_root(location(URL))
    assert remote_root(mirror) == location(URL)
    bundles = list_bundles(mirror)
    assert sorted(b.run_id for b in bundles) == sorted(imported.run_ids)
    assert [e.experiment_id for e in list_experiments(mirror)] == [imported.experiment_id]
    for bundle in bundles:
        assert _local_tables(bundle.path) == []  # nothing but run.json and the marker came down
        assert bundle.has_trace  # known from the URL's listing
        assert json.loads((bundle.path / RUN_JSON).read_text()) == json.loads(
            memory.cat_file(f"{ROOT}/{bundle.run_id}/{RUN_JSON}"))


def test_first_use_copies_the_bundle_whole(imported, memory: fsspec.AbstractFileSystem) -> None:
    mirror = mirror_root(location(URL))
    run_id = imported.run_ids[0]
    bundle = open_bundle(run_id, mirror)
    assert bundle.trace().events.num_rows > 0
    for table in TABLES:
        assert (bundle.path / f"{table}.parquet").read_bytes() == memory.cat_file(f"{ROOT}/{run_id}/{table}.parquet")
    raw = bundle.raw_files()
    assert len(raw) == 1 and raw[0].name in NAMES.values()
    assert raw[0].read_bytes() == memory.cat_file(f"{ROOT}/{run_id}/raw/{raw[0].name}")
    assert json.loads((bundle.path / REMOTE_JSON).read_text())["complete"] is True
    others = [open_bundle(r, mirror) for r in imported.run_ids[1:]]
    assert all(_local_tables(b.path) == [] for b in others)  # only the run used came down
    assert not [p for p in mirror.iterdir() if p.name.startswith(".tmp-")]


def test_unpublished_and_removed_runs(imported, memory: fsspec.AbstractFileSystem) -> None:
    memory.pipe_file(f"{ROOT}/20261203-000000-half-written/events.parquet", b"PAR1")  # no run.json yet
    mirror = mirror_root(location(URL))
    assert "20261203-000000-half-written" not in {b.run_id for b in list_bundles(mirror)}
    gone = imported.run_ids[2]
    memory.rm(f"{ROOT}/{gone}", recursive=True)
    mirror_root(location(URL))
    assert gone not in {b.run_id for b in list_bundles(mirror)} and not (mirror / gone).exists()


def test_a_file_gone_during_the_copy_is_named_and_nothing_half_kept(imported,
                                                                     memory: fsspec.AbstractFileSystem) -> None:
    mirror = mirror_root(location(URL))
    run_id = imported.run_ids[1]
    memory.rm(f"{ROOT}/{run_id}/memory.parquet")
    with pytest.raises(BundleError, match=rf"run '{run_id}': cannot copy it down from {URL}/{run_id}"):
        open_bundle(run_id, mirror).trace()
    assert _local_tables(mirror / run_id) == []
    assert not [p for p in mirror.iterdir() if p.name.startswith(".") and p.is_dir()]


def test_cli_reads_a_url_root(imported, tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["ls", "--out", URL, "--json"])
    assert listed.exit_code == 0, listed.output
    assert sorted(row["run"] for row in json.loads(listed.stdout)) == sorted(imported.run_ids)
    shown = runner.invoke(main, ["show", imported.run_ids[0], "--out", URL, "--json"])
    assert shown.exit_code == 0, shown.output
    report = tmp_path / "job.html"
    made = runner.invoke(main, ["report", imported.experiment_id, "--out", URL, "-o", str(report)])
    assert made.exit_code == 0, made.output
    html = report.read_text()
    assert "ranks on a URL root" in html and f"rank {SLOW_RANK}" in html
    missing = runner.invoke(main, ["show", "no-such-run", "--out", URL])
    assert missing.exit_code == 2 and f"no run 'no-such-run' in {URL};" in missing.stderr  # the URL, not the cache
    mirror = checked_root(URL, writing=False)
    # the report's ranks view was reduced where the bundles lie: only the run `show` opened came down
    assert [b.run_id for b in list_bundles(mirror) if _local_tables(b.path)] == [imported.run_ids[0]]
    assert len(imported.run_ids) == len(NAMES)


@pytest.mark.parametrize("command", [["capture"], ["import", "x.json"], ["rm", "some-run"]])
def test_writing_commands_refuse_a_url_root(memory, command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--out", URL])
    assert result.exit_code == 2
    assert "import --ranks" in result.output  # the one command that writes to a URL root
    assert not memory.exists(ROOT)
    with pytest.raises(WorkbenchError, match="only `workbench import --ranks` writes to one"):
        checked_root(URL, writing=True)


def test_a_damaged_mirror_marker_is_named_then_made_anew(imported) -> None:
    mirror = mirror_root(location(URL))
    run_id = imported.run_ids[0]
    (mirror / run_id / REMOTE_JSON).write_text("{not json")
    with pytest.raises(BundleError, match=rf"run '{run_id}': its mirror's .* is unreadable"):
        open_bundle(run_id, mirror).trace()
    mirror_root(location(URL))  # the next listing copies it anew
    assert open_bundle(run_id, mirror).trace().events.num_rows > 0


def test_an_unreachable_store_is_one_line_without_tracebacks(memory, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from workbench.cli import STORE_LOGGERS

    def unreachable(*args, **kwargs):
        raise OSError("Cannot connect to host")

    with monkeypatch.context() as broken:
        for name in STORE_LOGGERS:
            broken.setattr(logging.getLogger(name), "level", logging.NOTSET)
        broken.setattr(type(memory), "exists", unreachable)
        result = CliRunner().invoke(main, ["ls", "--out", URL])
        # the clients log their retries with tracebacks (gcsfs, s3fs): the command words the error once instead
        assert all(logging.getLogger(name).level == logging.CRITICAL for name in ("gcsfs", "s3fs", "botocore"))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: traces root {URL}: cannot list or copy it: Cannot connect to host")
