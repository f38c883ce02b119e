"""The panel's accelerator projection routes (`GET project/options`, `POST project`, `GET project/<job>/view`,
`workbench.server.project_handlers`) through a real Jupyter server (pytest-jupyter): all are authenticated; every
field of the body is checked (400 naming the field, never a path of the server), an accelerator file only relative
to the traces root and inside it, the run opened as every route opens one; a real projection of tiny-gpt on a device
of the hardware table with a bandwidth sweep runs as a job whose result is `workbench project --json`'s, and the view
route draws its operator bars, kind totals and sweep curves with the CLI's figures at the width asked; a run's
projection onto a description file of the traces root runs too."""

from __future__ import annotations

import base64
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from conftest import json_item_figures, write_trace
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import TINY_JOB, is_finished, jp_server_config, make_run  # noqa: F401 (jp_server_config: a fixture)
from test_replay import CUSTOM, MM, STRIDED_ADD, _op

from tests.npu import npu_yaml
from workbench.imports import import_traces
from workbench.server.project_handlers import MAX_SWEEPS, MAX_VALUES

api = test_server.api
"""The API client fixture of the server tests (its server is configured here, by `jp_server_config`)."""

DEVICES = Path(__file__).resolve().parents[1] / "workbench" / "hardware" / "devices.yaml"
DEVICE = "h100-sxm"
"""A device of the hardware table (`devices.yaml`)."""
NPU = npu_yaml()
"""tests/test_codesign.py's chip, as a description file of the traces root."""
BARS_TITLE = "projected time per operator (program order), by bound"
KINDS_TITLE = "projected time per step by operator kind"
UNITS = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9}
EVENTS = [_op("aten::mm", 100, 40, MM), _op("aten::add", 200, 30, STRIDED_ADD),
          _op("mylib::fused_gelu", 300, 60, CUSTOM), _op("aten::relu", 400, 45)]
"""One call each: a matmul and an add with recorded shapes, a custom op and an op without shapes."""


@pytest.fixture
def traces(jp_root_dir) -> Path:
    """The server's traces root, with a description file in a subfolder."""
    root = jp_root_dir / "traces"
    (root / "accelerators").mkdir(parents=True)
    (root / "accelerators" / "npu.yaml").write_text(NPU)
    return root


def body(**changes: Any) -> dict[str, Any]:
    """A valid `POST project` body with `changes` (a value of `...` removes the key)."""
    value = {"model": "tiny-gpt", "accelerator": DEVICE, "sweeps": ["bandwidth=0.5,1,2"]}
    value.update(changes)
    return {key: item for key, item in value.items() if item is not ...}


def _extension(jp_serverapp):
    (extension,) = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    return extension


def _sources(node: Any) -> list[dict[str, list[Any]]]:
    """Every ColumnDataSource's columns under `node` (a figure's attributes), as lists."""
    found, pending = [], [node]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if item.get("name") == "ColumnDataSource":
                entries = dict(item["attributes"]["data"]["entries"])
                found.append({key: _column(value) for key, value in entries.items()})
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def _column(value: Any) -> list[Any]:
    """A ColumnDataSource column as a list: plain, or an ndarray (a base64 buffer, gzipped when Bokeh found that
    smaller)."""
    if isinstance(value, dict) and value.get("type") == "ndarray":
        array = value["array"]
        if isinstance(array, dict) and array.get("type") == "bytes":
            data = base64.b64decode(array["data"])
            data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
            return np.frombuffer(data, dtype=value["dtype"]).tolist()
        return list(array)
    return list(value)


def _unit(axis_label: str) -> float:
    """The scale of an axis labelled "time (µs)" or "time per step (µs)", in ns."""
    return UNITS[axis_label.rsplit("(", 1)[1].rstrip(")")]


def _axis_label(figure: dict[str, Any], side: str) -> str:
    (axis,) = figure[side]
    return axis["attributes"]["axis_label"]


def cli_json(*args: str, cwd: Path) -> dict[str, Any]:
    """`workbench project ... --json` run as a user would in a terminal (JSON's NaN read as NaN)."""
    done = subprocess.run([sys.executable, "-m", "workbench", "project", *args, "--json"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout)


def test_the_routes_refuse_requests_without_a_token(api, traces):
    for method, path, request in (("GET", "project/options", None), ("POST", "project", body()),
                                  ("GET", "project/0123/view", None)):
        code, reply = api.call(method, path, request, token=False)
        assert code == 403 and reply["message"], (path, reply)
    assert api.ok("GET", "jobs") == {"jobs": []}  # nothing started


def test_the_options_offer_the_hardware_tables_devices(api):
    options = api.ok("GET", "project/options")
    assert options["devices"] == list(yaml.safe_load(DEVICES.read_text())["devices"])
    assert options["dtypes"] == ["fp32", "bf16", "fp16", "fp8", "int8"]  # the CLI's --dtype choices
    assert options["model_set"] == ["tiny-gpt", "llama-reduced", "resnet50", "vit", "bert"]
    assert {"bandwidth", "on_chip", "rate", "link", "array"} <= set(options["knobs"])
    assert "tiny-gpt" in options["models"]


OUTSIDE = "/etc/npu.yaml"
BAD = [
    ([1, 2], "the body must be a JSON object"),
    ({"iterations": 3}, "unknown key(s) 'iterations'"),
    ({"model": ...}, "model, run or models: give exactly one"),
    ({"run": "RUN"}, "model, run or models: give exactly one (a model to run one forward of, a run of the traces "
                     "root, or model-set names), got model, run"),
    ({"model": ""}, "model: expected a model name"),
    ({"model": "--help"}, "model: expected a model name"),
    ({"model": 3}, "model: expected a model name"),
    ({"model": "no such model"}, "model: 'no such model' names no model"),
    ({"model": ..., "run": 7}, "run: expected a run id of the traces root, got 7"),
    ({"model": ..., "run": "../elsewhere"}, "'../elsewhere' is not a run id"),
    ({"model": ..., "models": "tiny-gpt"}, "models: expected a list of 1 to 5 of tiny-gpt, llama-reduced"),
    ({"model": ..., "models": []}, "models: expected a list of 1 to 5"),
    ({"model": ..., "models": ["gpt-5"]}, "models: 'gpt-5' is not in the model set; choose from tiny-gpt"),
    ({"model": ..., "models": ["vit", "vit"]}, "models: one is named more than once"),
    ({"model": ..., "models": ["vit"], "sweeps": ...}, "sweeps: a model set compares sweeps; give at least one"),
    ({"model": ..., "models": ["vit"], "seq": 8}, "seq: applies to one model"),
    ({"accelerator": ...}, "accelerator: expected a device of the hardware table"),
    ({"accelerator": 3}, "accelerator: expected a device of the hardware table"),
    ({"accelerator": "h100x"}, "'h100x' is neither"),
    ({"accelerator": "cpu"}, "'cpu' is neither"),  # this machine, probed: not through the server
    ({"accelerator": OUTSIDE}, "accelerator: '<server>' is an absolute path; a description file is given "
                               "relative to the traces root (no absolute path, nothing outside the root)"),
    ({"accelerator": "~/npu.yaml"}, "accelerator: '~/npu.yaml' is an absolute path"),
    ({"accelerator": "../npu.yaml"}, "accelerator: '../npu.yaml' leads outside the traces root; refused"),
    ({"accelerator": "accelerators/../../npu.yaml"}, "'accelerators/../../npu.yaml' leads outside the traces root"),
    ({"accelerator": "accelerators/missing.yaml"}, "accelerator: no file 'accelerators/missing.yaml'"),
    ({"accelerator": "accelerators/escape.yaml"}, "accelerator: 'accelerators/escape.yaml' leads outside the "
                                                  "traces root; refused"),
    ({"accelerator": "accelerators/bad.yaml"}, "accelerator: accelerators/bad.yaml: field 'off_chip.bandwidth': "
                                               "'-100 GB/s' must be a finite, non-negative bandwidth value"),
    ({"accelerator": "accelerators/folder.yaml"}, "accelerator: 'accelerators/folder.yaml' is no file"),
    ({"sweeps": "bandwidth=1,2"}, f"sweeps: expected a list of at most {MAX_SWEEPS} texts"),
    ({"sweeps": ["bandwidth=1,2"] * (MAX_SWEEPS + 1)}, f"sweeps: expected a list of at most {MAX_SWEEPS}"),
    ({"sweeps": [3]}, "sweeps: expected texts KNOB=V1,V2,..."),
    ({"sweeps": ["clock=2"]}, "sweeps: 'clock=2': expected NAME=V1,V2,... with NAME one of bandwidth, on_chip"),
    ({"sweeps": ["bandwidth=fast"]}, "sweeps: 'bandwidth=fast': factors must be numbers"),
    ({"sweeps": ["bandwidth=0,1"]}, "sweeps: 'bandwidth=0,1': factors must be positive"),
    ({"sweeps": ["array=64"]}, "sweeps: 'array=64': array values are ROWSxCOLS"),
    ({"sweeps": ["bandwidth=" + ",".join(["1"] * (MAX_VALUES + 1))]}, f"values; at most {MAX_VALUES} per knob"),
    ({"sweeps": ["bandwidth=1,2", "bandwidth = 4"]}, "sweeps: the knob 'bandwidth' is swept more than once"),
    ({"dtype": "fp64"}, "dtype: expected one of fp32, bf16, fp16, fp8, int8, got 'fp64'"),
    ({"batch": 0}, "batch: expected a whole number from 1 to 256"),
    ({"batch": True}, "batch: expected a whole number"),
    ({"seq": 4097}, "seq: expected a whole number from 1 to 4,096"),
    ({"model": ..., "run": "RUN", "batch": 2}, "batch: applies to a model (a run's shapes are as recorded)"),
]


@pytest.mark.parametrize(("changes", "message"), BAD, ids=[m for _, m in BAD])
def test_each_bad_field_is_refused_with_its_message(api, jp_root_dir, traces, tmp_path, changes, message):
    (traces / "accelerators" / "bad.yaml").write_text(NPU.replace("bandwidth: 100 GB/s", "bandwidth: -100 GB/s"))
    (traces / "accelerators" / "folder.yaml").mkdir()
    (tmp_path / "npu.yaml").write_text(NPU)  # a real description, outside the root
    (traces / "accelerators" / "escape.yaml").symlink_to(tmp_path / "npu.yaml")
    (jp_root_dir / "npu.yaml").write_text(NPU)  # beside the root: "../npu.yaml" exists, and is refused
    run = make_run(traces, "a-run", tmp_path)
    request = body(**changes) if isinstance(changes, dict) else changes
    if isinstance(request, dict) and request.get("run") == "RUN":
        request["run"] = run
    code, reply = api.call("POST", "project", request)
    assert code == 400, reply
    assert message in reply["message"]
    assert len(reply["message"].splitlines()) == 1
    for path in (jp_root_dir, tmp_path, Path.home()):
        assert str(path) not in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_runs_are_opened_strictly_inside_the_traces_root(api, traces, tmp_path):
    code, reply = api.call("POST", "project", body(model=..., run="no-such-run"))
    assert code == 404 and "no run 'no-such-run' in the traces root" in reply["message"]
    make_run(tmp_path / "elsewhere", "victim", tmp_path)
    (traces / "escape").symlink_to(tmp_path / "elsewhere" / "victim", target_is_directory=True)
    code, reply = api.call("POST", "project", body(model=..., run="escape"))
    assert code == 422 and "leads outside the traces root" in reply["message"], reply
    assert str(tmp_path) not in reply["message"]
    make_run(traces, "tiny-gpt", tmp_path)  # a run named like a model: the CLI would project the run
    code, reply = api.call("POST", "project", body())
    assert code == 400 and "model: 'tiny-gpt' is also a run of the traces root" in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_a_model_the_policy_refuses_is_forbidden(api, traces):
    code, reply = api.call("POST", "project", body(model="os:system"))
    assert code == 403
    assert "c.WorkbenchServerApp.allowed_factory_modules" in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_the_view_of_no_projection_job_is_not_found(api):
    code, reply = api.call("GET", "project/0123/view")
    assert code == 404 and "no projection job '0123'" in reply["message"]
    capture = api.ok("POST", "jobs", TINY_JOB, status=202)  # a job, but no projection job
    code, reply = api.call("GET", f"project/{capture['id']}/view")
    assert code == 404 and "no projection job" in reply["message"]
    api.ok("DELETE", f"jobs/{capture['id']}")


@pytest.mark.slow
def test_a_projection_job_draws_the_clis_figures_at_any_width(api, jp_serverapp, jp_root_dir, traces):
    request = body(sweeps=["bandwidth = 0.5, 1, 2"])
    response = api.raw("POST", "api/project", json.dumps(request))
    assert response.code == 202, response.body
    job = json.loads(response.body)
    assert response.headers["Location"].endswith(f"/workbench/api/jobs/{job['id']}")
    assert job["request"] == {"project": {"model": "tiny-gpt", "accelerator": DEVICE,
                                          "sweeps": ["bandwidth=0.5,1,2"]}}
    assert [j["id"] for j in api.ok("GET", "jobs")["jobs"]] == [job["id"]]  # in the one job list
    argv = _extension(jp_serverapp).state.jobs.get(job["id"]).argv
    assert argv == [sys.executable, "-m", "workbench", "project", f"--accelerator={DEVICE}",
                    "--sweep=bandwidth=0.5,1,2", f"--out={traces}", "--json", "--", "tiny-gpt"]
    code, reply = api.call("GET", f"project/{job['id']}/view")
    assert code == 409 and "has not succeeded" in reply["message"]  # nothing to draw yet

    done = api.wait_job(job["id"], is_finished, "ended")
    assert done["status"] == "succeeded", done
    cli = cli_json("tiny-gpt", "--accelerator", DEVICE, "--sweep", "bandwidth=0.5,1,2", cwd=jp_root_dir)
    result = done["result"]
    assert [(op["name"], op["bound"]) for op in result["ops"]] == [(op["name"], op["bound"]) for op in cli["ops"]]
    assert result["step_ns"] == pytest.approx(cli["step_ns"], rel=1e-12)
    assert sorted(p.name for p in traces.iterdir()) == ["accelerators"]  # it wrote nothing

    for width in (900, 700):
        reply = api.ok("GET", f"project/{job['id']}/view?width={width}")
        assert reply["job"] == job["id"] and reply["title"] == cli["title"]
        figures = json_item_figures(reply["item"])
        assert figures[BARS_TITLE]["width"] == width  # laid out as wide as asked

        # one bar per operator in program order, its height the CLI's projected time
        bars = json_item_figures(reply["item"])[BARS_TITLE]
        scale = _unit(_axis_label(bars, "left"))
        drawn = {}
        for source in _sources(bars):
            drawn.update({int(x): (top * scale, name) for x, top, name in
                          zip(source["x"], source["top"], source["name"], strict=True)})
        assert sorted(drawn) == list(range(len(cli["ops"])))
        for index, op in enumerate(cli["ops"]):
            assert drawn[index][1] == op["name"]
            assert drawn[index][0] == pytest.approx(op["time_ns"], rel=1e-9)

        # the time per kind, stacked by bound: its total per kind is the CLI's per-kind total
        kinds = figures[KINDS_TITLE]
        scale = _unit(_axis_label(kinds, "below"))
        (stack,) = [s for s in _sources(kinds) if "kind" in s]
        categories = [key for key in stack if key not in ("kind", "total", "index")]
        totals = {kind: sum(stack[c][i] for c in categories) * scale for i, kind in enumerate(stack["kind"])}
        assert totals == pytest.approx({row["kind"]: row["time_ns"] for row in cli["by_kind"]}, rel=1e-9)

        # the sweep curve: the step at each factor over the step as written
        (curve,) = [title for title in figures if title.startswith("step time against bandwidth")]
        points = next(s for s in _sources(figures[curve]) if "ratio" in s)  # the line's and the dots' source
        (swept,) = cli["sweeps"]
        assert points["value"] == [row["value"] for row in swept] == ["0.5x", "1x", "2x"]
        assert points["time_ns"] == pytest.approx([row["time_ns"] for row in swept], rel=1e-12)
        assert points["ratio"] == pytest.approx([1 / row["speedup"] for row in swept], rel=1e-12)
        text = json.dumps(reply, ensure_ascii=False)
        assert "guidance: what fits this accelerator badly" in text
        assert str(jp_root_dir) not in text
    code, reply = api.call("GET", f"project/{job['id']}/view?width=10")
    assert code == 400 and "width: expected an integer number of pixels from 400" in reply["message"]


@pytest.mark.slow
def test_a_run_projects_onto_a_description_file_of_the_traces_root(api, jp_serverapp, jp_root_dir, traces,
                                                                   tmp_path):
    (run,) = import_traces([write_trace(tmp_path / "ops.json", EVENTS)], traces)
    request = {"run": run, "accelerator": "accelerators/npu.yaml", "dtype": "bf16"}
    job = api.ok("POST", "project", request, status=202)
    assert job["request"] == {"project": request}
    argv = _extension(jp_serverapp).state.jobs.get(job["id"]).argv
    assert f"--accelerator={traces.resolve() / 'accelerators' / 'npu.yaml'}" in argv
    assert argv[-2:] == ["--", run]
    done = api.wait_job(job["id"], is_finished, "ended")
    assert done["status"] == "succeeded", done
    result = done["result"]
    cli = cli_json(run, "--accelerator", str(traces / "accelerators" / "npu.yaml"), "--dtype", "bf16",
                   "--out", str(traces), cwd=jp_root_dir)
    assert result["title"] == f"run {run} at bf16" and result["accelerator"] == "test-npu"
    # the ops with recorded shapes (mm, add), each beside the time the trace measured
    measured = {event["name"].removeprefix("aten::"): event["dur"] * 1e3 for event in EVENTS}
    assert [(op["name"], op["measured_ns"]) for op in result["ops"]] == [
        (op["name"], measured[op["name"]]) for op in cli["ops"]] == [("mm", 40e3), ("add", 30e3)]
    assert [op["time_ns"] for op in result["ops"]] == pytest.approx([op["time_ns"] for op in cli["ops"]])
    assert not any(math.isnan(op["time_ns"]) for op in cli["ops"])
    reply = api.ok("GET", f"project/{job['id']}/view?width=800")
    assert reply["title"] == f"run {run} at bf16"
    assert BARS_TITLE in json_item_figures(reply["item"])
    assert str(jp_root_dir) not in json.dumps(done) + json.dumps(reply)
