"""The timeline data routes through a real Jupyter server: auth, parameters, runs outside the root, and the
replies being the notebook functions' dicts."""

from __future__ import annotations

import json
import os

import pytest
from spans_data import gpu_steps, write_run

from workbench.analysis.spans import queries as spans

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from pytest_jupyter.jupyter_server import *  # noqa: F403

ROUTES = ["runs/r/spans?start_ns=0&end_ns=100&width_px=10", "runs/r/search?q=mm",
          "runs/r/aggregate?start_ns=0&end_ns=9", "runs/r/events/0"]


jp_server_config = test_server.jp_server_config
"""The server of the server tests: every route behind a token, the traces root <root_dir>/traces."""
api = test_server.api


@pytest.fixture
def run(jp_root_dir):
    """Run `r` in the server's traces root: 2 steps of 50 ops."""
    return write_run(jp_root_dir / "traces", "r", gpu_steps(steps=2, ops_per_step=50))


@pytest.mark.parametrize("path", ROUTES)
def test_routes_refuse_requests_without_a_token(api, run, path):
    code, reply = api.call("GET", path, token=False)
    assert code == 403 and reply["message"]


def test_replies_are_the_notebook_functions_dicts(api, run):
    spans.RUNS.clear()
    window = api.ok("GET", "runs/r/spans?start_ns=-50&end_ns=400000&width_px=300&max_spans=150")
    assert window == json.loads(json.dumps(spans.window(run, -50, 400_000, 300, max_spans=150)))
    assert {lane["mode"] for lane in window["lanes"]} == {"spans", "density"}
    found = api.ok("GET", "runs/r/search?q=%5Eaten%3A%3Amm%24&regex=1&limit=3")
    assert found == spans.search(run, "^aten::mm$", regex=True, limit=3) and found["count"] == 34
    totals = api.ok("GET", "runs/r/aggregate?start_ns=0&end_ns=100000&limit=5")
    assert totals == spans.aggregate(run, 0, 100_000, limit=5)
    row = window["lanes"][-1]["spans"]["row"][0] if window["lanes"][-1]["spans"] else 0
    assert api.ok("GET", f"runs/r/events/{row}")["row"] == row


BAD = [("spans?end_ns=10&width_px=5", "start_ns: missing"), ("spans?start_ns=10&end_ns=10&width_px=5", "greater than"),
       ("spans?start_ns=0&end_ns=10&width_px=0", "width_px"), ("spans?start_ns=0&end_ns=10&width_px=abc", "width_px"),
       ("spans?start_ns=0x10&end_ns=99&width_px=5", "start_ns"), ("spans?start_ns=0&end_ns=9&width_px=5&max_spans=0",
                                                                 "max_spans"),
       ("spans?start_ns=0&end_ns=9&width_px=5&expand=0", "nothing to expand"),
       ("spans?start_ns=0&end_ns=9&width_px=5&expand=x", "expand"), ("spans?start_ns=0&end_ns=9&width_px=5&offset=-1",
                                                                    "offset"),
       ("search?q=", "q:"), ("search?q=a&regex=2", "regex"), ("search?q=(&regex=1", "regular expression"),
       ("search?q=a&limit=-1", "limit"), ("aggregate?start_ns=5&end_ns=1", "greater than"), ("events/abc", "row")]


@pytest.mark.parametrize(("query", "words"), BAD, ids=[q for q, _ in BAD])
def test_bad_parameters_are_400_naming_them(api, run, query, words):
    code, reply = api.call("GET", f"runs/r/{query}")
    assert code == 400 and words in reply["message"], reply


def test_runs_outside_the_root_are_not_reached(api, run, jp_root_dir, tmp_path):
    outside = write_run(tmp_path / "elsewhere", "outside", gpu_steps(steps=1, ops_per_step=3))
    code, reply = api.call("GET", "runs/outside/spans?start_ns=0&end_ns=9&width_px=5")
    assert code == 404 and "no run 'outside'" in reply["message"]
    code, _ = api.call("GET", "runs/..%2Felsewhere%2Foutside/spans?start_ns=0&end_ns=9&width_px=5")
    assert code in (400, 404)  # not an id (or not a route): never the run
    os.symlink(outside, jp_root_dir / "traces" / "linked")
    code, reply = api.call("GET", "runs/linked/search?q=mm")
    assert code == 422 and "outside the traces root" in reply["message"]
    assert api.call("GET", "runs/r/events/999999")[0] == 404


def test_a_folded_lane_expands_through_the_spans_route(api, jp_root_dir):
    from test_lane_folding import threads_trace

    from workbench.trace.store.bundle import write_bundle

    write_bundle(jp_root_dir / "traces", "threads", {"device": "cpu"}, threads_trace(300))
    folded = api.ok("GET", "runs/threads/spans?start_ns=0&end_ns=4000&width_px=50")["lanes"][-1]
    path = f"runs/threads/spans?start_ns=0&end_ns=4000&width_px=50&expand={folded['lane']}&offset=64"
    reply = api.ok("GET", path)
    expected = spans.window(jp_root_dir / "traces" / "threads", 0, 4_000, 50, expand=folded["lane"], offset=64)
    assert reply == json.loads(json.dumps(expected))
    assert reply["expanded"]["shown"] == 64 and reply["lanes"][-1]["tracks"] == folded["tracks"] - 64
