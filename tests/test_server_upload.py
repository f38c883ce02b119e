"""The panel's run-management routes through a real Jupyter server (pytest-jupyter): SQL queries, trace uploads
imported as jobs (size limit, names, cleanup), imports of files under the server's root (never outside it), and
the cheap version token the panel polls; every route behind the server's authentication."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from conftest import payload_trace, write_trace
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import Api, is_finished, make_run, server_config

from workbench.trace import read_trace
from workbench.trace.store.bundle import list_bundles, write_bundle

UPLOAD_LIMIT_MB = 1


@pytest.fixture
def jp_server_config(monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACES", raising=False)  # the traces root is <root_dir>/traces
    return server_config(max_upload_mb=UPLOAD_LIMIT_MB)


api = test_server.api
"""The API client of the server tests (its server configured here, by `jp_server_config`)."""
traces = test_server.traces


def upload(api: Api, name: str, data: bytes, *, token: bool = True) -> tuple[int, dict]:
    response = api.raw("POST", f"api/upload?name={quote(name)}", data, token=token)
    return response.code, json.loads(response.body)


def kernel_trace(path: Path) -> Path:
    """A small trace with one kernel named after the file."""
    return write_trace(path, [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        {"ph": "X", "cat": "kernel", "name": f"gemm_{path.stem}", "pid": 0, "tid": 7, "ts": 120, "dur": 20,
         "args": {"device": 0, "stream": 7}}])


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "query", {"sql": "SELECT 1"}), ("POST", "upload?name=t.json", "{}"),
    ("POST", "import", {"path": "t.json"}), ("GET", "traces/version", None)])
def test_routes_refuse_requests_without_a_token(api, traces, tmp_path, jp_root_dir, method, path, body):
    kernel_trace(jp_root_dir / "t.json")
    code, reply = api.call(method, path, body, token=False)
    assert code == 403
    assert reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}
    assert not traces.exists() or not any(traces.iterdir())  # nothing stored


# --- queries -----------------------------------------------------------------------------------------------------

def test_query_runs_and_errors(api, traces, tmp_path):
    make_run(traces, "a", tmp_path, "eager", 2.0)
    make_run(traces, "b", tmp_path, "int8", 1.0)
    reply = api.ok("POST", "query", {"sql": "SELECT run, count(*) AS n FROM events GROUP BY run ORDER BY run"})
    assert reply["columns"] == ["run", "n"]
    assert reply["rows"] == [["a", 3], ["b", 3]]  # every run without `runs`: an op, a launch and a kernel each
    assert reply["truncated"] is False
    one = api.ok("POST", "query", {"sql": "SELECT run, variant, p50_ms FROM runs", "runs": ["b"]})
    assert one["rows"] == [["b", "int8", 1.0]]
    limited = api.ok("POST", "query", {"sql": "SELECT * FROM events", "limit": 2})
    assert (len(limited["rows"]), limited["truncated"]) == (2, True)

    for body, status, words in (
            ({"sql": "COPY events TO 'x.csv'"}, 400, "only SELECT"),
            ({"sql": "SELECT * FROM read_csv('/etc/passwd')"}, 400, "read_csv() is refused here"),
            ({"sql": "SELECT * FROM nope"}, 400, "tables: counters, events, memory, runs"),
            ({"sql": ""}, 400, "sql: expected one SELECT"),
            ({"sql": "SELECT 1", "limit": 0}, 400, "limit: expected"),
            ({"sql": "SELECT 1", "runs": []}, 400, "runs: expected a list"),
            ({"sql": "SELECT 1", "runs": ["../x"]}, 400, "is not a run id"),
            ({"sql": "SELECT 1", "runs": ["missing"]}, 404, "no run 'missing'"),
            ({"sql": "SELECT 1", "colour": 1}, 400, "'colour'")):
        code, error = api.call("POST", "query", body)
        assert (code, words in error["message"]) == (status, True), error
        assert "\n" not in error["message"]


def test_query_names_the_runs_it_covered(api, traces, tmp_path):
    make_run(traces, "a", tmp_path, "eager", 2.0)
    make_run(traces, "b", tmp_path, "int8", 1.0)
    trace = read_trace(payload_trace(tmp_path / "sweep.json"))
    write_bundle(traces, "s", {"model": {"name": "tiny-gpt"}, "variant": {"name": "eager"}, "batch": 8, "seq": 16,
                               "label": "eager-b8"}, trace)
    sql = "SELECT run, count(*) AS n FROM events GROUP BY run ORDER BY run"
    every = api.ok("POST", "query", {"sql": sql})
    assert [(row["run"], row["name"], row["batch"], row["seq"]) for row in every["runs"]] == [
        ("a", "eager", None, None), ("b", "int8", None, None), ("s", "eager-b8", 8, 16)]
    assert [row[0] for row in every["rows"]] == ["a", "b", "s"]
    chosen = api.ok("POST", "query", {"sql": sql, "runs": ["s", "b"]})
    assert [(row["run"], row["model"], row["name"]) for row in chosen["runs"]] == [("s", "tiny-gpt", "eager-b8"),
                                                                                   ("b", "mlp", "int8")]
    assert [row[0] for row in chosen["rows"]] == ["b", "s"]


# --- uploads and imports -----------------------------------------------------------------------------------------

def test_upload_imports_the_file_as_a_job(api, traces, tmp_path):
    before = api.ok("GET", "traces/version")["version"]
    data = gzip.compress(kernel_trace(tmp_path / "mine.json").read_bytes())
    code, job = upload(api, "my trace.json.gz", data)
    assert code == 202, job
    assert job["request"] == {"import": ["my trace.json.gz"]}
    done = api.wait_job(job["id"], is_finished, "finished")
    assert done["status"] == "succeeded", done
    (run_id,) = done["result"]
    (bundle,) = list_bundles(traces)
    assert bundle.run_id == run_id
    assert (bundle.path / "raw" / "my trace.json.gz").read_bytes() == data
    row = next(r for r in api.ok("GET", "runs")["runs"] if r["run"] == run_id)
    assert row["file"] == "my trace.json.gz"
    assert api.ok("POST", "query", {"sql": "SELECT name FROM events WHERE kind = 'kernel'"})["rows"] == [
        ["gemm_mine"]]
    assert api.ok("GET", "traces/version")["version"] != before
    api.sleep(0.2)  # the cleanup runs once the job has ended
    assert [p.name for p in traces.iterdir()] == [run_id]  # the upload's hidden folder is gone


def test_a_bad_upload_fails_its_job_and_keeps_nothing(api, traces):
    code, job = upload(api, "notes.json", b'{"not": "a trace"}')
    assert code == 202
    done = api.wait_job(job["id"], is_finished, "finished")
    assert done["status"] == "failed"
    assert "notes.json" in done["error"]
    api.sleep(0.2)
    assert list(traces.iterdir()) == []


@pytest.mark.parametrize(("name", "size", "status", "words"), [
    ("big.json", (UPLOAD_LIMIT_MB << 20) + 1, 413, "upload limit"),
    ("../escape.json", 10, 400, "name: expected"),
    (".hidden.json", 10, 400, "name: expected"),
    ("a/b.json", 10, 400, "name: expected"),
    ("", 10, 400, "name: expected"),
    ("empty.json", 0, 400, "the upload is empty"),
])
def test_uploads_are_refused(api, traces, jp_root_dir, name, size, status, words):
    code, reply = upload(api, name, b"x" * size)
    assert code == status, reply
    assert words in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}
    assert not traces.exists() or list(traces.iterdir()) == []
    assert not (jp_root_dir / "escape.json").exists()


def test_import_a_file_of_the_server_root(api, traces, jp_root_dir, tmp_path):
    (jp_root_dir / "data").mkdir()
    kernel_trace(jp_root_dir / "data" / "lab.json")
    code, job = api.call("POST", "import", {"path": "data/lab.json"})
    assert code == 202, job
    assert job["request"] == {"import": ["lab.json"]}
    done = api.wait_job(job["id"], is_finished, "finished")
    assert done["status"] == "succeeded", done
    (row,) = api.ok("GET", "runs")["runs"]
    assert row["file"] == "lab.json"
    assert (jp_root_dir / "data" / "lab.json").is_file()  # copied, not moved


def test_imports_outside_the_server_root_are_refused(api, jp_root_dir, tmp_path):
    outside = payload_trace(tmp_path / "outside.json")
    (jp_root_dir / "link.json").symlink_to(outside)
    (jp_root_dir / "folder").mkdir()
    for path, words in ((str(outside), "outside the server's root"), ("../outside.json", "outside the server's root"),
                        ("link.json", "outside the server's root"), ("folder", "is not a file"),
                        ("missing.json", "no readable file"), ("", "path: expected")):
        code, reply = api.call("POST", "import", {"path": path})
        assert code == 400, (path, reply)
        assert words in reply["message"]
        assert str(tmp_path) not in reply["message"]  # no server path leaks
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_version_changes_when_runs_appear_or_vanish(api, traces, tmp_path):
    first = api.ok("GET", "traces/version")["version"]
    assert api.ok("GET", "traces/version")["version"] == first  # stable while nothing changes
    make_run(traces, "a", tmp_path)
    second = api.ok("GET", "traces/version")["version"]
    assert second != first
    api.ok("DELETE", "runs/a")
    assert api.ok("GET", "traces/version")["version"] not in (first, second)
