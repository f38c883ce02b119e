"""The panel's serving route (`POST serve`, `workbench.server.serve_handlers`) through a real Jupyter server
(pytest-jupyter): it is authenticated, checks every field of its body (400 naming the field, never a path of the
server), is refused on a URL traces root, and runs `workbench serve --url` as a job of the job queue: against a
small HTTP server that lists a model and fails every completion, the job ends failed (exit 1) with the bundle of
its failed requests written; cancelled, it keeps nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import emptied_memory
from test_serving_errors import AIPERF, SERVING, stub_server

from workbench.cache import CACHE_ENV
from workbench.trace.store.bundle import list_bundles, open_bundle

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import is_finished, server_config

from workbench.server.serve_handlers import MAX_POINTS, MAX_REQUESTS, MAX_TOKENS

api = test_server.api
"""The API client fixture of the server tests (its server is configured here, by `jp_server_config`)."""

needs_aiperf = pytest.mark.skipif(not AIPERF.is_file(), reason=f"no AIPerf in {SERVING}: run make serving")
URL_ROOT = "memory://wbtest-server-serve/traces"


@pytest.fixture
def jp_server_config(request, monkeypatch, tmp_path):
    """A folder traces root (`<root_dir>/traces`), or the URL a test names with an indirect parameter."""
    monkeypatch.delenv("WORKBENCH_TRACES", raising=False)
    monkeypatch.setenv("WORKBENCH_SERVING", str(SERVING))  # where the server looks for AIPerf
    url = getattr(request, "param", None)
    if url is None:
        return server_config()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # the URL's mirror
    return server_config(traces_root=url)


@pytest.fixture
def traces(jp_root_dir) -> Path:
    return jp_root_dir / "traces"


@pytest.fixture
def tokenizer(jp_root_dir) -> str:
    """A real tokenizer folder under the server's root_dir (the generator counts prompt tokens with it), by the
    path the panel sends: relative to root_dir."""
    from workbench.serving.model_folder import word_tokenizer

    word_tokenizer(64).save_pretrained(jp_root_dir / "tok")
    return "tok"


@pytest.fixture
def stub() -> Iterator[str]:
    """An OpenAI-compatible server on 127.0.0.1 that lists the model `stub` and answers every completion 500."""
    with stub_server() as url:
        yield url


def body(folder: str, /, **changes: Any) -> dict[str, Any]:
    """A valid `POST serve` body with the tokenizer `folder` and `changes` (a value of `...` removes the key)."""
    value = {"url": "http://127.0.0.1:9", "tokenizer": folder, "rate": [20], "requests": 2, "isl": 8, "osl": 4}
    value.update(changes)
    return {key: item for key, item in value.items() if item is not ...}


def test_the_route_refuses_requests_without_a_token(api, tokenizer):
    code, reply = api.call("POST", "serve", body(tokenizer), token=False)
    assert code == 403 and reply["message"]
    assert api.raw("GET", "api/serve", token=False).code in (403, 405)
    assert api.ok("GET", "jobs") == {"jobs": []}  # nothing started


BAD = [
    ([1, 2], None, "the body must be a JSON object"),
    ({"engine": "vllm"}, None, "unknown key(s) 'engine'"),
    ({"url": ...}, None, "url: expected the http(s) URL"),
    ({"url": 8000}, None, "url: expected the http(s) URL"),
    ({"url": "file:///etc/passwd"}, None, "is not an http:// or https:// URL"),
    ({"url": "ftp://127.0.0.1/"}, None, "is not an http:// or https:// URL"),
    ({"url": "127.0.0.1:8000"}, None, "is not an http:// or https:// URL"),
    ({"url": "http://"}, None, "names no host"),
    ({"url": "http://127.0.0.1:99999"}, None, "is not a valid URL"),
    ({"url": "http://me:secret@127.0.0.1:8000"}, None, "credentials in the URL are not supported"),
    ({"url": "http://127.0.0.1:8000/ --engine-arg x"}, None, "has spaces or control characters"),
    ({"tokenizer": ...}, None, "tokenizer: expected the path of a tokenizer folder"),
    ({"tokenizer": ""}, None, "tokenizer: expected the path of a tokenizer folder"),
    ({"tokenizer": "missing"}, None, "tokenizer: 'missing' is no folder under the server's root folder"),
    ({"tokenizer": "../outside"}, None, "tokenizer: '../outside' leads outside the server's root folder"),
    ({}, "outside", "leads outside the server's root folder"),  # the absolute path of a folder outside root_dir
    ({"tokenizer": "link"}, None, "tokenizer: 'link' leads outside the server's root folder"),
    ({"tokenizer": "tok/tokenizer.json"}, None, "is not a folder"),
    ({"tokenizer": "empty"}, None, "tokenizer: 'empty' holds no tokenizer"),
    ({"model": ""}, None, "model: expected the served model's name"),
    ({"model": "--engine-arg"}, None, "model: expected the served model's name"),
    ({"model": "a b"}, None, "model: expected the served model's name"),
    ({"model": 3}, None, "model: expected the served model's name"),
    ({"rate": ...}, None, "give rate (a list of requests per second: open loop) or concurrency"),
    ({"concurrency": [1]}, None, "closed loop), not both"),
    ({"rate": 4}, None, f"rate: expected a list of 1 to {MAX_POINTS} loads"),
    ({"rate": []}, None, f"rate: expected a list of 1 to {MAX_POINTS} loads"),
    ({"rate": list(range(1, MAX_POINTS + 2))}, None, f"rate: expected a list of 1 to {MAX_POINTS} loads"),
    ({"rate": [0]}, None, "rate: expected numbers of requests per second above 0"),
    ({"rate": [-1.5]}, None, "rate: expected numbers of requests per second above 0"),
    ({"rate": [1e9]}, None, "rate: expected numbers of requests per second above 0"),
    ({"rate": ["4"]}, None, "rate: expected numbers of requests per second above 0"),
    ({"rate": [True]}, None, "rate: expected numbers of requests per second above 0"),
    ({"rate": [2, 2.0]}, None, "rate: a load is named more than once"),
    ({"rate": ..., "concurrency": [1.5]}, None, "concurrency: expected whole numbers of requests in flight"),
    ({"rate": ..., "concurrency": [0]}, None, "concurrency: expected whole numbers of requests in flight"),
    ({"requests": ...}, None, "requests: expected a whole number of requests per load point"),
    ({"requests": 0}, None, "requests: expected a whole number of requests per load point"),
    ({"requests": MAX_REQUESTS + 1}, None, f"from 1 to {MAX_REQUESTS:,}, got {MAX_REQUESTS + 1}"),
    ({"requests": "2"}, None, "requests: expected a whole number"),
    ({"requests": 2.5}, None, "requests: expected a whole number"),
    ({"requests": True}, None, "requests: expected a whole number"),
    ({"isl": MAX_TOKENS + 1}, None, f"isl (prompt length): expected a whole number of tokens from 1 to {MAX_TOKENS:,}"),
    ({"osl": 0}, None, "osl (output length): expected a whole number of tokens"),
    ({"osl": ...}, None, "osl (output length): expected a whole number of tokens"),
    ({"slo": "ttft=fast"}, None, "slo: SLO 'ttft=fast'"),
    ({"slo": "speed=2ms"}, None, "unknown metric 'speed'"),
    ({"slo": 200}, None, "slo: expected bounds such as ttft=200ms,tpot=50ms"),
]


@pytest.mark.parametrize(("changes", "absolute", "message"), BAD, ids=[m for _, _, m in BAD])
def test_each_bad_field_is_refused_with_its_message(api, jp_root_dir, tmp_path, tokenizer, changes, absolute,
                                                    message):
    outside = tmp_path / "outside"
    word_folder = jp_root_dir / "tok"
    outside.mkdir()
    (outside / "tokenizer.json").write_text((word_folder / "tokenizer.json").read_text())
    (jp_root_dir / "link").symlink_to(outside)
    (jp_root_dir / "empty").mkdir()
    request = body(tokenizer, **changes) if isinstance(changes, dict) else changes
    if absolute:
        request["tokenizer"] = str(outside)
    code, reply = api.call("POST", "serve", request)
    assert code == 400, reply
    assert message in reply["message"]
    for path in (jp_root_dir, tmp_path, outside, Path.home(), SERVING):  # no path of the server in the message
        assert str(path) not in reply["message"]
        assert str(path.resolve()) not in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_a_body_that_is_not_json_is_refused(api):
    code, reply = api.call("POST", "serve", "{not json")
    assert code == 400 and "not valid JSON" in reply["message"]


def test_a_server_without_aiperf_says_how_to_get_it(api, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SERVING", str(tmp_path / "no-serving"))
    code, reply = api.call("POST", "serve", body(tokenizer))
    assert code == 400
    assert "this server has no AIPerf" in reply["message"] and "`make serving`" in reply["message"]
    assert str(tmp_path) not in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


@pytest.fixture
def memory() -> Iterator[None]:
    with emptied_memory("/wbtest-server-serve"):
        yield


@pytest.mark.parametrize("jp_server_config", [URL_ROOT], indirect=True)
def test_a_url_traces_root_is_refused(memory, api, tokenizer):
    code, reply = api.call("POST", "serve", body(tokenizer))
    assert code == 409
    assert URL_ROOT in reply["message"] and "read-only in the panel" in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def _extension(jp_serverapp):
    (extension,) = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    return extension


@needs_aiperf
@pytest.mark.slow
def test_a_serving_job_against_a_failing_server_keeps_its_failed_requests(api, jp_serverapp, jp_root_dir, traces,
                                                                          stub, tokenizer):
    request = body(tokenizer, url=stub, model="stub", slo="ttft=200ms, tpot=50ms")
    response = api.raw("POST", "api/serve", json.dumps(request))
    assert response.code == 202, response.body
    job = json.loads(response.body)
    assert response.headers["Location"].endswith(f"/workbench/api/jobs/{job['id']}")
    assert job["status"] in ("queued", "running")
    assert job["request"] == {"serve": {**request, "slo": "ttft=200ms,tpot=50ms"}}
    argv = _extension(jp_serverapp).state.jobs.get(job["id"]).argv
    assert argv[:4] == [sys.executable, "-m", "workbench", "serve"] and argv[-3:] == ["--json", "--out", str(traces)]
    assert sorted(argv[4:-3]) == sorted([
        f"--url={stub}", f"--tokenizer={(jp_root_dir / 'tok').resolve()}", "--model=stub", "--rate=20.0",
        "--requests=2", "--isl=8", "--osl=4", "--slo=ttft=200ms,tpot=50ms", "--profile-window=off",
        f"--aiperf={AIPERF.absolute()}"])
    assert [j["id"] for j in api.ok("GET", "jobs")["jobs"]] == [job["id"]]  # in the one job list

    done = api.wait_job(job["id"], is_finished, "ended")
    assert done["status"] == "failed" and done["exit_code"] == 1, done  # every request failed
    (point,) = done["result"]["runs"]
    assert point["load"] == "rate-20" and point["error"] is None
    assert point["summary"]["requests"] == 2 and point["summary"]["failed"] == 2 and point["summary"]["ok"] == 0
    requests = open_bundle(point["run"], traces).table("requests").to_pylist()
    assert len(requests) == 2 and all(r["status"] == "error" and "stub overloaded" in r["error"] for r in requests)
    assert [bundle.run_id for bundle in list_bundles(traces)] == [point["run"]]
    assert str(jp_root_dir) not in json.dumps(done)  # the result's paths (AIPerf's log) go out redacted
    # the panel lists the run and opens its dashboard, with the serving views of its kind
    assert [row["run"] for row in api.ok("GET", "runs")["runs"]] == [point["run"]]
    assert api.ok("GET", f"runs/{point['run']}/dashboard")["item"]["doc"]["roots"]


@needs_aiperf
@pytest.mark.slow
def test_a_cancelled_serving_job_keeps_nothing(api, traces, stub, tokenizer):
    job = api.ok("POST", "serve", body(tokenizer, url=stub, rate=[0.2], requests=50), status=202)
    api.wait_job(job["id"], lambda j: j["status"] == "running", "started")
    api.sleep(3)  # into the load: AIPerf is sending requests
    cancelled = api.ok("DELETE", f"jobs/{job['id']}")
    assert cancelled["status"] == "cancelled" and cancelled["exit_code"] == 130, cancelled
    assert not list_bundles(traces)
    hidden = [entry.name for entry in traces.iterdir() if entry.name.startswith(".")] if traces.exists() else []
    assert not hidden  # no staging folder left behind
