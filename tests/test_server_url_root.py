"""The Jupyter server extension on a URL traces root (memory://, which lives in this process, as the test server
does): the panel lists the runs of the URL through its mirror, opens them (copying a run's files down), sees runs
written there after start, and is refused every write; a URL it cannot read is a 503 naming it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest
from conftest import emptied_memory
from test_multirank import NAMES, _write_job

from workbench.cache import CACHE_ENV
from workbench.rank_import import RankImport, import_rank_job
from workbench.storage import location
from workbench.trace.store.bundle import EXPERIMENTS_DIR
from workbench.trace.store.mirror_bundle import remote_root

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import TINY_JOB, make_run, server_config

from workbench.server import state as server_state
from workbench.server.app import resolve_traces_root

api = test_server.api
"""The API client fixture of the server tests (its server is configured here, by `jp_server_config`)."""

ROOT = "/wbtest-server-url-root/traces"
URL = f"memory://{ROOT.lstrip('/')}"


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    return _write_job(tmp_path_factory.mktemp("ranks") / "job")


@pytest.fixture
def memory() -> Iterator[fsspec.AbstractFileSystem]:
    with emptied_memory("/" + ROOT.split("/")[1]) as fs:
        yield fs


@pytest.fixture
def imported(job, memory, tmp_path, monkeypatch) -> RankImport:
    """The job's 4 ranks imported at URL; mirrors go under tmp_path."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    result = import_rank_job(job, URL)
    assert not result.failed and len(result.run_ids) == len(NAMES)
    return result


@pytest.fixture
def jp_server_config(imported, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACES", raising=False)
    return server_config(traces_root=URL)


@pytest.fixture
def mirror(api, jp_serverapp) -> Path:
    """The folder the server reads the URL through."""
    (extension,) = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    assert extension.state.remote == location(URL)
    return extension.state.root


def _snapshot(memory) -> dict[str, bytes]:
    return {path: memory.cat_file(path) for path in memory.find(ROOT)}


def test_the_runs_of_the_url_are_listed(api, mirror, imported, memory):
    listing = api.ok("GET", "runs")
    assert listing["root"] == URL and listing["problems"] == []
    assert sorted(row["run"] for row in listing["runs"]) == sorted(imported.run_ids)
    files = {row["run"]: row["file"] for row in listing["runs"]}
    for run_id in imported.run_ids:
        written = json.loads(memory.cat_file(f"{ROOT}/{run_id}/run.json"))
        assert files[run_id] == NAMES[written["rank"]]
    (experiment,) = listing["experiments"]
    assert experiment["experiment"] == imported.experiment_id
    assert sorted(experiment["runs"]) == sorted(imported.run_ids)
    assert api.ok("GET", "config") == {"traces_root": URL, "default_traces_root": URL}
    assert remote_root(mirror) == location(URL)


def test_a_rank_opens_its_tables_copied_down(api, mirror, imported, memory):
    run_id = imported.run_ids[1]
    assert not (mirror / run_id / "events.parquet").exists()  # listed, not copied yet
    events = pq.read_table(io.BytesIO(memory.cat_file(f"{ROOT}/{run_id}/events.parquet"))).to_pandas()

    summary = api.ok("GET", f"runs/{run_id}")
    assert summary["events"] == {kind: int(n) for kind, n in events["kind"].value_counts().items() if n}
    assert (mirror / run_id / "events.parquet").read_bytes() == memory.cat_file(f"{ROOT}/{run_id}/events.parquet")
    dashboard = api.ok("GET", f"runs/{run_id}/dashboard")
    assert dashboard["run"] == run_id and dashboard["item"]["doc"]["roots"]
    kernels = sorted(events.loc[events["kind"] == "kernel", "name"].unique())
    found = api.ok("GET", f"runs/{run_id}/search?q={kernels[0]}")
    assert found["count"] == int((events["name"] == kernels[0]).sum())
    ranks = json.dumps(api.ok("POST", "compare", {"runs": imported.run_ids[2:]})["item"])
    assert "2 ranks on one time axis" in ranks and "ranks on a URL root" in ranks  # the ranks view alone:
    assert "ops and kernels aligned across variants" not in ranks  # no comparison, which reads every rank whole
    assert not (mirror / imported.run_ids[3] / "events.parquet").exists()


def test_runs_written_at_the_url_after_start_appear_after_a_refresh(api, mirror, imported, memory, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(server_state, "MIRROR_REFRESH_S", 1e9)  # no refresh now
    before = api.ok("GET", "traces/version")["version"]
    make_run(tmp_path / "local", "late-run", tmp_path)
    location(URL).join("late-run").upload(tmp_path / "local" / "late-run")
    memory.rm(f"{ROOT}/{imported.run_ids[0]}", recursive=True)
    assert api.ok("GET", "traces/version")["version"] == before
    assert "late-run" not in {row["run"] for row in api.ok("GET", "runs")["runs"]}

    monkeypatch.setattr(server_state, "MIRROR_REFRESH_S", 0)
    after = api.ok("GET", "traces/version")["version"]
    assert after != before
    listed = {row["run"] for row in api.ok("GET", "runs")["runs"]}
    assert listed == {"late-run", *imported.run_ids[1:]}
    api.ok("GET", f"runs/{imported.run_ids[1]}/dashboard")  # opening a run does not change the version
    assert api.ok("GET", "traces/version")["version"] == after
    assert api.ok("GET", "runs/late-run")["run"] == "late-run"


def test_every_write_is_refused_and_changes_nothing_at_the_url(api, mirror, imported, memory, jp_root_dir,
                                                               tmp_path):
    stored, mirrored = _snapshot(memory), sorted(p.name for p in mirror.iterdir())
    (jp_root_dir / "trace.json").write_text('{"traceEvents": []}')
    refused = [("POST", "jobs", TINY_JOB), ("POST", "import", {"path": "trace.json"}),
               ("DELETE", f"runs/{imported.run_ids[0]}", None)]
    for method, path, body in refused:
        code, reply = api.call(method, path, body)
        assert code == 409, (path, reply)
        assert reply["message"].startswith(f"the traces root is {URL}, read-only in the panel")
        assert "workbench import --ranks" in reply["message"]
    upload = api.raw("POST", "api/upload?name=trace.json", b'{"traceEvents": []}')
    assert upload.code == 409 and URL in json.loads(upload.body)["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}
    assert _snapshot(memory) == stored and sorted(p.name for p in mirror.iterdir()) == mirrored

    code, reply = api.call("PUT", "config", {"traces_root": "memory://elsewhere"})
    assert code == 400 and "is a URL" in reply["message"]
    local = jp_root_dir / "local"
    make_run(local, "mine", tmp_path)
    assert api.ok("PUT", "config", {"traces_root": "local"})["traces_root"] == "local"
    assert api.ok("DELETE", "runs/mine") == {"deleted": "mine"}  # a folder chosen in the panel is writable
    assert api.ok("PUT", "config", {"traces_root": ""})["traces_root"] == URL
    assert api.call("DELETE", f"runs/{imported.run_ids[0]}")[0] == 409
    assert _snapshot(memory) == stored


ROUTES = [("GET", "runs"), ("GET", "traces/version"), ("GET", "runs/x/dashboard"), ("DELETE", "runs/x"),
          ("POST", "jobs"), ("POST", "upload?name=t.json"), ("PUT", "config")]


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_routes_still_require_a_token(api, mirror, imported, memory, method, path):
    stored = _snapshot(memory)
    code, reply = api.call(method, path, {} if method in ("POST", "PUT") else None, token=False)
    assert code == 403 and reply["message"]
    assert _snapshot(memory) == stored


def test_a_url_that_cannot_be_read_is_a_503_naming_it(api, mirror, imported, memory, monkeypatch):
    monkeypatch.setattr(server_state, "MIRROR_REFRESH_S", 0)

    def unreachable(*args, **kwargs):
        raise ConnectionError("connection refused")

    with monkeypatch.context() as broken:
        broken.setattr(type(memory), "find", unreachable)
        for path in ("runs", "traces/version"):
            code, reply = api.call("GET", path)
            assert code == 503, reply
            assert URL in reply["message"] and "connection refused" in reply["message"]
            assert "Traceback" not in reply["message"]
    assert sorted(row["run"] for row in api.ok("GET", "runs")["runs"]) == sorted(imported.run_ids)


def test_resolve_traces_root_gives_the_mirror_of_a_url(imported, tmp_path, monkeypatch):
    mirror = resolve_traces_root(URL, tmp_path)
    assert remote_root(mirror) == location(URL)
    assert sorted(p.name for p in mirror.iterdir() if not p.name.startswith(".")) == \
        sorted([*imported.run_ids, EXPERIMENTS_DIR])
    assert resolve_traces_root(f"file://{tmp_path}/here", Path("/elsewhere")) == tmp_path / "here"
    monkeypatch.setenv("WORKBENCH_TRACES", URL)
    assert resolve_traces_root("", tmp_path) == mirror


def test_a_url_unreachable_at_start_gives_its_mirror_still_read_only(memory, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))

    def unreachable(*args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(type(memory), "exists", unreachable)
    monkeypatch.setattr(type(memory), "find", unreachable)
    mirror = resolve_traces_root(URL, tmp_path)  # the server starts; its listings will say why they are empty
    assert remote_root(mirror) == location(URL)  # so the panel refuses writes into it
    assert [p.name for p in mirror.iterdir() if not p.name.startswith(".")] == []  # no bundle, no records
