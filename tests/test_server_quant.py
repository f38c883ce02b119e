"""The panel's quantization lab routes (`POST quant`, `GET quant/<job>/view`, `workbench.server.quant_handlers`)
through a real Jupyter server (pytest-jupyter): both are authenticated, every field of the body is checked (400
naming the field, a format's or recipe's own one-line message, never a path of the server; 403 for a model the
policy refuses), and a real job of the lab on the small built-in `mlp` with random weights runs as a job of the
queue, writes nothing into the traces root, and leaves its tables for the view route, which draws the lab's views
at the width asked without running the lab again."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from conftest import json_item_figures
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import TINY_JOB, is_finished, jp_server_config  # noqa: F401 (jp_server_config: a fixture)

from workbench.server.quant_handlers import MAX_FORMATS, MAX_RECIPES

api = test_server.api
"""The API client fixture of the server tests (its server is configured here, by `jp_server_config`)."""

HEAT_MAP_TITLE = "output SQNR (dB) with one layer alone in each format: lower is worse"
PARETO_TITLE = "recipes: weight memory against output SQNR"
MLP_LAYERS = 4
"""The Linear layers of the built-in mlp (`models/builtin`: Linear, ReLU, Linear, ReLU, Linear, ReLU, Linear)."""


def body(**changes: Any) -> dict[str, Any]:
    """A small valid `POST quant` body with `changes` (a value of `...` removes the key)."""
    value = {"model": "mlp", "weights": "random", "formats": ["int8/channel", "nvfp4"],
             "recipes": ["*.weight=int8/channel", "*.weight=nvfp4,*.input=nvfp4"], "batch": 2, "measure": False}
    value.update(changes)
    return {key: item for key, item in value.items() if item is not ...}


def _extension(jp_serverapp):
    (extension,) = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    return extension


def _tables(jp_serverapp, job_id: str) -> Path:
    """The folder the job writes the lab's tables into, from its command line."""
    argv = _extension(jp_serverapp).state.jobs.get(job_id).argv
    (option,) = [word for word in argv if word.startswith("--tables=")]
    return Path(option.removeprefix("--tables="))


def test_the_routes_refuse_requests_without_a_token(api):
    code, reply = api.call("POST", "quant", body(), token=False)
    assert code == 403 and reply["message"]
    code, reply = api.call("GET", "quant/0123/view", token=False)
    assert code == 403 and reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}  # nothing started


BAD = [
    ([1, 2], "the body must be a JSON object"),
    ({"scan": False}, "unknown key(s) 'scan'"),
    ({"model": ...}, "model: expected a model name"),
    ({"model": ""}, "model: expected a model name"),
    ({"model": "--help"}, "model: expected a model name"),
    ({"model": 3}, "model: expected a model name"),
    ({"model": "no such model"}, "model: 'no such model' names no model"),
    ({"weights": "pretrained"}, 'weights: expected "trained" or "random"'),
    ({"model": "hf-config:llama-tiny"}, "weights: applies to the built-in models"),
    ({"formats": "int8"}, f"formats: expected a list of 1 to {MAX_FORMATS}"),
    ({"formats": []}, f"formats: expected a list of 1 to {MAX_FORMATS}"),
    ({"formats": ["int8"] * (MAX_FORMATS + 1)}, f"formats: expected a list of 1 to {MAX_FORMATS}"),
    ({"formats": ["fp7"]}, "formats: unknown format 'fp7' in 'fp7'"),
    ({"formats": ["int8/slice"]}, "formats: unknown granularity 'slice' in 'int8/slice'"),
    ({"formats": ["nvfp4/channel"]}, "formats: 'nvfp4/channel': nvfp4 scales fixed blocks of 16"),
    ({"formats": ["int8,int4"]}, "formats: 'int8,int4' is one format per item"),
    ({"formats": ["int8", " int8 "]}, "formats: one is named more than once"),
    ({"formats": [8]}, "formats: expected texts"),
    ({"recipes": "int8"}, f"recipes: expected a list of 0 to {MAX_RECIPES}"),
    ({"recipes": ["x"] * (MAX_RECIPES + 1)}, f"recipes: expected a list of 0 to {MAX_RECIPES}"),
    ({"recipes": ["linear.weight"]}, "recipes: recipe part 'linear.weight' is not TARGET=FORMAT"),
    ({"recipes": ["fc.bias=int8"]}, "recipes: recipe target 'fc.bias' names no tensor"),
    ({"recipes": ["kv=fp7"]}, "recipes: unknown format 'fp7'"),
    ({"recipes": ["kv=int8\x00"]}, "recipes: expected texts"),
    ({"budget": "sqnr"}, "budget: 'sqnr': give sqnr=DB (a floor) and/or kl=NATS"),
    ({"budget": "sqnr=high"}, "budget: 'sqnr=high': 'high' is no number"),
    ({"budget": 30}, "budget: expected sqnr=DB and/or kl=NATS"),
    ({"device": "accelerators/mine.yaml"}, "device: expected a device of the hardware table"),
    ({"device": "b300x"}, "device: expected a device of the hardware table"),
    ({"batch": 0}, "batch: expected a whole number from 1 to 256"),
    ({"batch": 257}, "batch: expected a whole number from 1 to 256"),
    ({"batch": True}, "batch: expected a whole number"),
    ({"seq": 4097}, "seq: expected a whole number from 1 to 4,096"),
    ({"seq": "16"}, "seq: expected a whole number"),
    ({"measure": "yes"}, "measure: expected true or false"),
]


@pytest.mark.parametrize(("changes", "message"), BAD, ids=[m for _, m in BAD])
def test_each_bad_field_is_refused_with_its_message(api, jp_root_dir, changes, message):
    request = body(**changes) if isinstance(changes, dict) else changes
    code, reply = api.call("POST", "quant", request)
    assert code == 400, reply
    assert message in reply["message"]
    for path in (jp_root_dir, Path.home(), Path(tempfile.gettempdir()) / "workbench-quant-"):
        assert str(path) not in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_a_model_the_policy_refuses_is_forbidden(api):
    code, reply = api.call("POST", "quant", body(model="os:system", weights=...))
    assert code == 403
    assert "c.WorkbenchServerApp.allowed_factory_modules" in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_the_view_of_no_quantization_job_is_not_found(api):
    code, reply = api.call("GET", "quant/0123/view")
    assert code == 404 and "no quantization job '0123'" in reply["message"]
    capture = api.ok("POST", "jobs", TINY_JOB, status=202)  # a job, but no quantization job
    code, reply = api.call("GET", f"quant/{capture['id']}/view")
    assert code == 404 and "no quantization job" in reply["message"]
    api.ok("DELETE", f"jobs/{capture['id']}")


@pytest.mark.slow
def test_a_quantization_job_runs_the_lab_and_its_view_draws_at_any_width(api, jp_serverapp, jp_root_dir):
    request = body(budget="sqnr=20")
    response = api.raw("POST", "api/quant", json.dumps(request))
    assert response.code == 202, response.body
    job = json.loads(response.body)
    assert response.headers["Location"].endswith(f"/workbench/api/jobs/{job['id']}")
    assert job["request"] == {"quant": request}
    assert [j["id"] for j in api.ok("GET", "jobs")["jobs"]] == [job["id"]]  # in the one job list
    argv = _extension(jp_serverapp).state.jobs.get(job["id"]).argv
    tables = _tables(jp_serverapp, job["id"])
    assert argv[:4] == [sys.executable, "-m", "workbench", "quant"]
    assert argv[4:] == ["--model=mlp", "--weights=random", "--formats=int8/channel,nvfp4",
                        "--quant=*.weight=int8/channel", "--quant=*.weight=nvfp4,*.input=nvfp4",
                        "--budget=sqnr=20", "--batch=2", "--no-measure", "--json", f"--tables={tables}"]
    assert not tables.is_relative_to(jp_root_dir)  # a folder of the server's own, not the traces root
    code, reply = api.call("GET", f"quant/{job['id']}/view")
    assert code == 409 and "has not succeeded" in reply["message"]  # nothing to draw yet

    done = api.wait_job(job["id"], is_finished, "ended")
    assert done["status"] == "succeeded", done
    result = done["result"]
    assert result["model"] == "mlp" and result["device"] == "b200"
    assert [row["recipe"] for row in result["recipes"]] == ["fp32 (reference)", *request["recipes"]]
    assert sorted((row["layer"], row["format"]) for row in result["layers"]) == sorted(
        (str(index), fmt) for index in range(0, 2 * MLP_LAYERS, 2) for fmt in request["formats"])
    assert result["plan"]["budget"] == {"sqnr": 20.0}
    assert not (jp_root_dir / "traces").exists()  # the lab's results are no run

    views = {}
    for width in (900, 700):  # neither the figure default (600), which json_item leaves out
        reply = api.ok("GET", f"quant/{job['id']}/view?width={width}")
        assert reply["job"] == job["id"]
        views[width] = figures = json_item_figures(reply["item"])
        assert HEAT_MAP_TITLE in figures
        heat_map = json.dumps(figures[HEAT_MAP_TITLE])
        assert all(fmt in heat_map for fmt in request["formats"])
        (pareto,) = [attributes for title, attributes in figures.items() if title.startswith(PARETO_TITLE)]
        assert pareto["width"] == width  # laid out as wide as asked
        text = json.dumps(reply)
        assert all(recipe in text for recipe in request["recipes"])  # the recipes' table and Pareto name them
        for path in (jp_root_dir, tables, Path(tempfile.gettempdir()) / "workbench-quant-"):
            assert str(path) not in text
    assert views[900].keys() == views[700].keys()
    code, reply = api.call("GET", f"quant/{job['id']}/view?width=10")
    assert code == 400 and "width: expected an integer number of pixels from 400" in reply["message"]
    assert str(tables) not in json.dumps(api.ok("GET", f"jobs/{job['id']}"))


@pytest.mark.slow
@pytest.mark.parametrize("jp_server_config", [{"max_queued_jobs": 0}], indirect=True)
def test_a_full_queue_refuses_and_a_cancelled_job_leaves_no_folder(api, jp_serverapp):
    job = api.ok("POST", "quant", body(), status=202)
    tables = _tables(jp_serverapp, job["id"])
    code, reply = api.call("POST", "quant", body())
    assert code == 429 and "the capture queue is full" in reply["message"]
    assert [j["id"] for j in api.ok("GET", "jobs")["jobs"]] == [job["id"]]
    assert tables.is_dir()
    cancelled = api.ok("DELETE", f"jobs/{job['id']}")
    assert cancelled["status"] == "cancelled"
    code, reply = api.call("GET", f"quant/{job['id']}/view")
    assert code == 409 and "(cancelled)" in reply["message"]
    assert not tables.exists()  # removed once the job ended without success
    assert [entry.name for entry in tables.parent.iterdir()] == []  # neither the refused job's
