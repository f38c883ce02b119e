"""What the server sends names no absolute path of its disk (job logs and results, listings, config, query
results), its SQL sandbox refuses DuckDB's settings, and capture requests are checked before they are queued
(a device this machine lacks, a model name that looks like an option): inputs made in each test."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest

from workbench.server.redact import SERVER_PATH, Redactor

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import Api, is_finished, jp_server_config, make_run  # noqa: F401 (jp_server_config: a fixture)

ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/>-])/([\w.-]+)")
"""An absolute POSIX path starting a word; one of this machine when its first folder exists here."""


api = test_server.api
traces = test_server.traces


def server_paths(*paths: Path) -> list[str]:
    """The absolute spellings a reply must not hold: `paths` as given and resolved, home and the temp folder."""
    spelled = {str(p) for path in paths for p in (path, path.resolve())}
    return sorted(spelled | {str(Path.home()), tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())},
                  key=len, reverse=True)


def assert_no_server_path(text: str, *paths: Path) -> None:
    for secret in server_paths(*paths):
        assert secret not in text, (secret, text[:2000])
    here = [match[0] for match in ABSOLUTE_PATH.finditer(text) if os.path.exists("/" + match[1])]
    assert not here, (here, text[:2000])


def raw_text(api: Api, method: str, path: str, body=None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body)
    response = api.raw(method, f"api/{path}", data)
    return response.code, response.body.decode()


# --- the redaction step ------------------------------------------------------------------------------------

def test_paths_become_relative_to_the_traces_root_and_others_a_placeholder(tmp_path):
    root = tmp_path / "lab" / "traces"
    root.mkdir(parents=True)
    (tmp_path / "lab" / "link").symlink_to(root, target_is_directory=True)
    redactor = Redactor(tmp_path / "lab" / "link")
    home = Path.home()
    cases = {
        f"{root}/.tmp-upload-1/big.json.gz: unrecognized trace format": ".tmp-upload-1/big.json.gz: unrecognized "
                                                                         "trace format",
        f"{tmp_path}/lab/link/run-a/raw/t.json": "run-a/raw/t.json",
        f"the traces root {root}.": "the traces root ..",
        f"'root': '{root}'": "'root': '.'",
        f"{root}-old/x": SERVER_PATH,  # another folder, not inside the root
        f"see {home}/.duckdb/stored_secrets and {tmp_path}/other": f"see {SERVER_PATH} and {SERVER_PATH}",
        f"file://{root}/run-a": "run-a",
        "lane /device:GPU:0 and /job:localhost/replica:0": "lane /device:GPU:0 and /job:localhost/replica:0",
        "GB/s, a/b, s3://bucket/traces, <server>/x, ./here": "GB/s, a/b, s3://bucket/traces, <server>/x, ./here",
    }
    for text, expected in cases.items():
        assert redactor.text(text) == expected, text
        assert redactor.text(expected) == expected  # twice changes nothing more
    value = {"log": [f"error: {root}/x: bad"], str(home): {"n": 1, "s": f"{home}"},
             "buffer": {"type": "bytes", "data": "+/usr/AAAA"}}
    assert redactor.value(value) == {"log": ["error: x: bad"], SERVER_PATH: {"n": 1, "s": SERVER_PATH},
                                     "buffer": {"type": "bytes", "data": "+/usr/AAAA"}}


# --- replies ------------------------------------------------------------------------------------------------

def test_jobs_of_a_failed_upload_name_no_server_path(api, traces, jp_root_dir, tmp_path):
    response = api.raw("POST", f"api/upload?name={quote('big.json.gz')}", b"not gzip, not a trace")
    assert response.code == 202, response.body
    job = json.loads(response.body)
    done = api.wait_job(job["id"], is_finished, "finished")
    assert done["status"] == "failed"
    assert "big.json.gz" in done["error"]
    for path in ("jobs", f"jobs/{job['id']}"):
        code, text = raw_text(api, "GET", path)
        assert code == 200
        assert "big.json.gz" in text
        assert ".tmp-upload-" in text  # the upload folder, named relative to the traces root
        assert_no_server_path(text, traces, jp_root_dir, tmp_path)


def test_listings_and_config_name_no_server_path(api, traces, jp_root_dir, tmp_path):
    make_run(traces, "a", tmp_path)
    (jp_root_dir / "other").mkdir()
    (traces / "broken").mkdir()
    (traces / "broken" / "run.json").write_text("{not json")
    for method, path, body in (("GET", "runs", None), ("GET", "config", None), ("GET", "traces/version", None),
                               ("GET", "runs/a", None), ("PUT", "config", {"traces_root": str(jp_root_dir / "other")}),
                               ("GET", "runs", None), ("GET", "config", None), ("PUT", "config", {"traces_root": ""})):
        code, text = raw_text(api, method, path, body)
        assert code == 200, text
        assert_no_server_path(text, traces, jp_root_dir, tmp_path)
    assert api.ok("GET", "config") == {"traces_root": "traces", "default_traces_root": "traces"}
    assert api.ok("GET", "runs")["root"] == "traces"


def test_query_refuses_the_settings_with_one_line(api, traces, jp_root_dir, tmp_path):
    make_run(traces, "a", tmp_path)
    for sql in ("SELECT name, value FROM duckdb_settings()", "SELECT current_setting('secret_directory') AS s",
                "SELECT * FROM duckdb_databases()", "SELECT * FROM information_schema.tables"):
        code, text = raw_text(api, "POST", "query", {"sql": sql})
        assert code == 400, text
        message = json.loads(text)["message"]
        assert "refused" in message or "no table" in message, message
        assert "\n" not in message
        assert_no_server_path(text, traces, jp_root_dir, tmp_path)
    code, text = raw_text(api, "POST", "query", {"sql": f"SELECT '{jp_root_dir}/x' AS p, '{traces}/a' AS q"})
    assert code == 200
    assert json.loads(text)["rows"] == [[SERVER_PATH, "a"]]


# --- capture requests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "words"), [
    ({"model": "mlp", "device": "cuda:999999999"}, "does not exist on this server"),
    ({"model": "mlp", "device": "tpu:999"}, "does not exist on this server"),
    ({"model": "--out=/elsewhere"}, "never starting with '-'"),
    ({"model": "mlp", "variants": ["--out=/elsewhere"]}, "never starts with '-'"),
    ({"model": "mlp", "device": "--out=/elsewhere"}, "never starts with '-'"),
])
def test_capture_requests_are_checked_before_they_are_queued(api, traces, jp_root_dir, tmp_path, body, words):
    code, text = raw_text(api, "POST", "jobs", body)
    assert code == 400, text
    message = json.loads(text)["message"]
    assert words in message
    assert "\n" not in message
    assert_no_server_path(text, traces, jp_root_dir, tmp_path)
    assert api.ok("GET", "jobs") == {"jobs": []}
    assert not traces.exists() or not any(traces.iterdir())  # no runs, no experiment
    assert not (Path("/elsewhere")).exists()
