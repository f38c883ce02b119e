"""The panel's op replay routes (`POST replay`, `GET replay/<job>/view`, `workbench.server.replay_handlers`) through a
real Jupyter server (pytest-jupyter): both are authenticated; every field of the body is checked (400 naming the
field, never a path of the server), the run opened as every route opens one (404 for none, 422 for a link out of the
traces root); a real replay of an imported trace runs as a job of the queue, its result the CLI's rows, and the view
route draws them at the width asked; a run recorded without shapes fails with the replay's own message."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from conftest import PAYLOADS, write_trace
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import TINY_JOB, is_finished, jp_server_config, make_run  # noqa: F401 (jp_server_config: a fixture)
from test_replay import CUSTOM, MM, STRIDED_ADD, _op

from workbench.imports import import_traces
from workbench.server.replay_handlers import MAX_TOP

api = test_server.api
"""The API client fixture of the server tests (its server is configured here, by `jp_server_config`)."""

EVENTS = [_op("aten::mm", 100, 40, MM), _op("aten::add", 200, 30, STRIDED_ADD),
          _op("mylib::fused_gelu", 300, 60, CUSTOM), _op("aten::relu", 400, 45), _op(PAYLOADS[0], 500, 35, CUSTOM)]
"""One call each (µs apart, none nested): two ops that replay, a custom op, one without shapes, a name that is no op."""
CHART_TITLE = "median time per call (µs): in the trace and replayed alone"


@pytest.fixture
def runs(jp_root_dir, tmp_path) -> tuple[str, str]:
    """An imported trace of `EVENTS` and one whose ops recorded no shapes, in the server's traces root."""
    root = jp_root_dir / "traces"
    (shapes,) = import_traces([write_trace(tmp_path / "ops.json", EVENTS)], root)
    bare_events = [_op("aten::mm", 100, 40), _op("aten::relu", 200, 5)]
    (bare,) = import_traces([write_trace(tmp_path / "bare.json", bare_events)], root)
    return shapes, bare


def body(run: str, **changes: Any) -> dict[str, Any]:
    """A valid `POST replay` body for `run` with `changes` (a value of `...` removes the key)."""
    value = {"run": run, "top": 5, "variants": ["eager"]}
    value.update(changes)
    return {key: item for key, item in value.items() if item is not ...}


def _extension(jp_serverapp):
    (extension,) = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    return extension


def _data(item: Any, key: str) -> list[list[Any]]:
    """The `key` column of every ColumnDataSource of a json_item that has one (as a list)."""
    found, pending = [], [item]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("name") == "ColumnDataSource":
                entries = dict(node["attributes"]["data"]["entries"])
                if key in entries:
                    column = entries[key]
                    found.append(column["array"] if isinstance(column, dict) else column)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def test_the_routes_refuse_requests_without_a_token(api, runs):
    code, reply = api.call("POST", "replay", body(runs[0]), token=False)
    assert code == 403 and reply["message"]
    code, reply = api.call("GET", "replay/0123/view", token=False)
    assert code == 403 and reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}  # nothing started


BAD = [
    ([1, 2], 400, "the body must be a JSON object"),
    ({"run": "RUN", "iterations": 3}, 400, "unknown key(s) 'iterations'"),
    ({"top": 5}, 400, "run: expected a run id of the traces root, got None"),
    ({"run": 7}, 400, "run: expected a run id"),
    ({"run": "../elsewhere"}, 400, "'../elsewhere' is not a run id"),
    ({"run": "--help"}, 400, "'--help' is not a run id"),
    ({"run": "no-such-run"}, 404, "no run 'no-such-run' in the traces root"),
    ({"run": "RUN", "top": 0}, 400, f"top: expected a whole number from 1 to {MAX_TOP}, got 0"),
    ({"run": "RUN", "top": MAX_TOP + 1}, 400, f"top: expected a whole number from 1 to {MAX_TOP}"),
    ({"run": "RUN", "top": True}, 400, "top: expected a whole number"),
    ({"run": "RUN", "top": "5"}, 400, "top: expected a whole number"),
    ({"run": "RUN", "top": 2.5}, 400, "top: expected a whole number"),
    ({"run": "RUN", "variants": "eager"}, 400, "variants: expected a list of 1 to 3 of eager, bf16, compile"),
    ({"run": "RUN", "variants": []}, 400, "variants: expected a list of 1 to 3"),
    ({"run": "RUN", "variants": [1]}, 400, "variants: expected a list of 1 to 3"),
    ({"run": "RUN", "variants": ["eager", "bf16", "compile", "ort"]}, 400, "variants: expected a list of 1 to 3"),
    ({"run": "RUN", "variants": ["ort"]}, 400, "variants: 'ort' is no replay variant; choose from eager, bf16, "
                                               "compile (ORT does not apply"),
    ({"run": "RUN", "variants": ["eager", "eager"]}, 400, "variants: one is named more than once"),
]


@pytest.mark.parametrize(("request_body", "status", "message"), BAD, ids=[m for _, _, m in BAD])
def test_each_bad_field_is_refused_with_its_message(api, runs, jp_root_dir, request_body, status, message):
    if isinstance(request_body, dict) and request_body.get("run") == "RUN":
        request_body = {**request_body, "run": runs[0]}
    code, reply = api.call("POST", "replay", request_body)
    assert code == status, reply
    assert message in reply["message"]
    assert str(jp_root_dir) not in reply["message"] and str(Path.home()) not in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_a_run_that_leads_outside_the_traces_root_is_refused(api, jp_root_dir, tmp_path):
    make_run(tmp_path / "elsewhere", "victim", tmp_path)
    traces = jp_root_dir / "traces"
    traces.mkdir(exist_ok=True)
    (traces / "escape").symlink_to(tmp_path / "elsewhere" / "victim", target_is_directory=True)
    code, reply = api.call("POST", "replay", body("escape"))
    assert code == 422 and "leads outside the traces root" in reply["message"], reply
    assert str(tmp_path) not in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_the_view_of_no_replay_job_is_not_found(api):
    code, reply = api.call("GET", "replay/0123/view")
    assert code == 404 and "no replay job '0123'" in reply["message"]
    capture = api.ok("POST", "jobs", TINY_JOB, status=202)  # a job, but no replay job
    code, reply = api.call("GET", f"replay/{capture['id']}/view")
    assert code == 404 and "no replay job" in reply["message"]
    api.ok("DELETE", f"jobs/{capture['id']}")


@pytest.mark.slow
def test_a_replay_job_runs_the_cli_and_its_view_draws_at_any_width(api, jp_serverapp, jp_root_dir, runs):
    shapes, _ = runs
    response = api.raw("POST", "api/replay", json.dumps(body(shapes)))
    assert response.code == 202, response.body
    job = json.loads(response.body)
    assert response.headers["Location"].endswith(f"/workbench/api/jobs/{job['id']}")
    assert job["request"] == {"replay": {"run": shapes, "top": 5, "variants": ["eager"]}}
    assert [j["id"] for j in api.ok("GET", "jobs")["jobs"]] == [job["id"]]  # in the one job list
    argv = _extension(jp_serverapp).state.jobs.get(job["id"]).argv
    assert argv == [sys.executable, "-m", "workbench", "replay", "--top=5", "--variants=eager",
                    f"--out={jp_root_dir / 'traces'}", "--json", "--", shapes]
    before = sorted(p.name for p in (jp_root_dir / "traces" / shapes).iterdir())

    done = api.wait_job(job["id"], is_finished, "ended")
    assert done["status"] == "succeeded", done
    rows = done["result"]["rows"]
    by_time = sorted(EVENTS, key=lambda event: -event["dur"])  # one call each: self time is the duration
    assert [row["name"] for row in rows] == [event["name"] for event in by_time]
    assert [row["trace_ns"] for row in rows] == [event["dur"] * 1e3 for event in by_time]
    assert {row["name"] for row in rows if row["status"] == "ok"} == {"aten::mm", "aten::add"}
    assert all(row["reason"] for row in rows if row["status"] == "skipped")  # each says why
    assert sorted(p.name for p in (jp_root_dir / "traces" / shapes).iterdir()) == before  # it wrote nothing

    for width in (900, 700):
        reply = api.ok("GET", f"replay/{job['id']}/view?width={width}")
        assert reply["job"] == job["id"] and reply["run"] == shapes
        names = _data(reply["item"], "name")
        assert [event["name"] for event in by_time] in names  # the table's rows, in the replay's order
        text = json.dumps(reply, ensure_ascii=False)
        assert CHART_TITLE in text and f'"width": {width}' in text
        assert str(jp_root_dir) not in text
    code, reply = api.call("GET", f"replay/{job['id']}/view?width=10")
    assert code == 400 and "width: expected an integer number of pixels from 400" in reply["message"]


@pytest.mark.slow
def test_a_run_without_shapes_fails_with_the_replays_message(api, runs, jp_root_dir):
    _, bare = runs
    job = api.ok("POST", "replay", body(bare), status=202)
    code, reply = api.call("GET", f"replay/{job['id']}/view")
    assert code == 409 and "has not succeeded" in reply["message"]
    done = api.wait_job(job["id"], is_finished, "ended")
    assert done["status"] == "failed"
    assert done["error"].startswith(f"run {bare!r} recorded no op inputs: capture it with shapes recorded"), done
    assert "record_shapes=True" in done["error"] and str(jp_root_dir) not in json.dumps(done)
    code, reply = api.call("GET", f"replay/{job['id']}/view")
    assert code == 409 and "(failed)" in reply["message"]
