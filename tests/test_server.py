"""The Jupyter server extension: every route through a real Jupyter server (pytest-jupyter), auth, path
escapes, Bokeh items, and capture jobs (real tiny captures: start, progress, finish, cancel, queue)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.backends import list_variants
from workbench.limits import MAX_BATCH, MAX_ITERATIONS
from workbench.profiling.registry import profilers
from workbench.progress import JsonProgress
from workbench.server.capture_request import CaptureRequestError, capture_args
from workbench.server.jobs import LOG_LINES, JobManager
from workbench.trace import read_trace
from workbench.trace.store.bundle import list_bundles, write_bundle
from workbench.trace.store.experiment import write_experiment

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

# pytest-jupyter's fixtures, for this module only: as a plugin (`pytest_plugins`) its autouse event-loop and
# server-cleanup fixtures and its test-call hook would apply to every test of the suite.
from conftest import payload_trace
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import TINY_JOB, Api, is_finished, jp_server_config, make_run  # noqa: F401 (jp_server_config: a fixture)

from workbench.server.app import resolve_traces_root


@pytest.fixture
def api(jp_serverapp, http_server_client, jp_base_url, jp_auth_header, jp_asyncio_loop) -> Api:
    return Api(http_server_client, jp_base_url, jp_auth_header, jp_asyncio_loop)


@pytest.fixture
def traces(jp_root_dir) -> Path:
    return jp_root_dir / "traces"


# --- authentication ---------------------------------------------------------------------------------------

ROUTES = [("GET", "runs", None), ("GET", "runs/a", None), ("GET", "runs/a/dashboard", None),
          ("DELETE", "runs/a", None), ("POST", "compare", {"runs": ["a", "a"]}), ("GET", "jobs", None),
          ("POST", "jobs", TINY_JOB), ("GET", "jobs/0123", None), ("DELETE", "jobs/0123", None),
          ("GET", "config", None), ("PUT", "config", {"traces_root": "elsewhere"}), ("GET", "capture/options", None)]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_refuses_requests_without_a_token(api, traces, tmp_path, method, path, body):
    make_run(traces, "a", tmp_path)
    code, reply = api.call(method, path, body, token=False)
    assert code == 403
    assert reply["message"]
    assert (traces / "a" / "run.json").is_file()  # an unauthenticated DELETE deleted nothing
    assert api.ok("GET", "jobs") == {"jobs": []}  # and an unauthenticated POST started nothing


def test_bokehjs_is_served_from_the_installed_bokeh_behind_auth(api):
    import bokeh

    served = api.raw("GET", "static/bokeh/js/bokeh.min.js")
    assert served.code == 200
    assert bokeh.__version__.encode() in served.body
    assert api.raw("GET", "static/bokeh/js/bokeh.min.js", token=False).code in (302, 403)  # to the login page
    assert api.raw("GET", "static/bokeh/..%2F..%2F__init__.py").code in (403, 404)


# --- runs -------------------------------------------------------------------------------------------------

def test_list_runs_and_experiments(api, traces, tmp_path, jp_root_dir):
    assert api.ok("GET", "runs") == {"root": "traces", "runs": [], "experiments": [], "problems": []}
    make_run(traces, "run-eager", tmp_path, "eager", 2.0, experiment="exp-1")
    make_run(traces, "run-int8", tmp_path, "int8", 1.0, experiment="exp-1")
    write_experiment(traces, "exp-1", {"model": "mlp", "reference": "eager", "runs": ["run-eager", "run-int8"],
                                       "variants": ["eager", "int8"], "failed": []})
    (traces / "broken").mkdir()
    (traces / "broken" / "run.json").write_text("{not json")

    listing = api.ok("GET", "runs")
    rows = {row["run"]: row for row in listing["runs"]}
    assert rows.keys() == {"run-eager", "run-int8"}
    assert rows["run-int8"] | {"created": None} == {
        "run": "run-int8", "model": "mlp", "variant": "int8", "device": "cuda:0", "status": "ok", "p50_ms": 1.0,
        "experiment": "exp-1", "created": None, "batch": None, "seq": None, "name": "int8", "file": None,
        "noise": None}
    (experiment,) = listing["experiments"]
    assert experiment["experiment"] == "exp-1"
    assert experiment["runs"] == ["run-eager", "run-int8"]
    assert [p["entry"] for p in listing["problems"]] == ["broken"]
    assert "malformed" in listing["problems"][0]["message"]


def test_summary_dashboard_and_compare(api, traces, tmp_path):
    make_run(traces, "a", tmp_path, "eager", 2.0)
    make_run(traces, "b", tmp_path, "int8", 1.0)

    summary = api.ok("GET", "runs/a")
    assert summary["run"] == "a"
    assert summary["events"] == {"op": 1, "runtime": 1, "kernel": 1}
    assert summary["latency_ms"]["p50"] == 2.0
    assert len(api.ok("GET", "runs/a?top=1")["top_ops"]) == 1
    assert api.call("GET", "runs/a?top=zero")[0] == 400

    dashboard = api.ok("GET", "runs/a/dashboard")
    assert dashboard["run"] == "a"
    assert {"doc", "root_id", "version"} <= dashboard["item"].keys()
    assert dashboard["item"]["doc"]["roots"]

    compared = api.ok("POST", "compare", {"runs": ["a", "b"]})
    assert compared["runs"] == ["a", "b"]
    assert compared["item"]["doc"]["roots"]


def test_compare_against_a_chosen_baseline(api, traces, tmp_path):
    make_run(traces, "a", tmp_path, "eager", 2.0)
    make_run(traces, "b", tmp_path, "int8", 1.0)
    make_run(traces, "c", tmp_path, "bf16", 1.5)
    # without a baseline the reference variant (eager) is the baseline; with one, the run it names
    default = api.ok("POST", "compare", {"runs": ["b", "a", "c"]})
    assert default["baseline"] is None
    assert "compared against eager" in json.dumps(default["item"])
    chosen = api.ok("POST", "compare", {"runs": ["b", "a", "c"], "baseline": "c", "width": 900})
    assert chosen["baseline"] == "c"
    drawn = json.dumps(chosen["item"])
    assert "compared against bf16" in drawn and "compared against eager" not in drawn
    for baseline in ("d", 1, ["c"]):
        code, reply = api.call("POST", "compare", {"runs": ["a", "b"], "baseline": baseline})
        assert code == 400 and "baseline: expected one of the compared runs (a, b)" in reply["message"]


def test_views_add_what_the_kind_of_runs_adds(api, traces, tmp_path):
    trace = read_trace(payload_trace(tmp_path / "rank.json"))
    for rank in (0, 1):
        write_bundle(traces, f"rank{rank}", {"variant": f"rank{rank}", "rank": rank, "world_size": 2}, trace)
    write_bundle(traces, "gen", {"kind": "generation", "variant": {"name": "mha-fp32"},
                                 "llm": {"ttft_ms": 3.0, "tpot_ms": 1.0, "tpot_p99_ms": 1.5}}, trace)
    ranks = json.dumps(api.ok("POST", "compare", {"runs": ["rank0", "rank1"], "width": 800})["item"])
    assert "2 ranks on one time axis" in ranks and "step time per rank (ms)" in ranks
    generation = json.dumps(api.ok("GET", "runs/gen/dashboard")["item"])
    assert "time to first token" in generation and "decode timeline" in generation
    plain = json.dumps(api.ok("GET", "runs/rank0/dashboard")["item"])  # one rank: its dashboard alone
    assert "ranks on one time axis" not in plain and "time to first token" not in plain


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"runs": ["a"]}, 400, "two or more"),
    ({"runs": ["a", "a"]}, 400, "more than once"),
    ({"runs": "a,b"}, 400, "list"),
    ({"runs": ["a", "b"], "colour": 3}, 400, "'colour'"),
    ({"runs": ["a", "b"], "width": 3}, 400, "width: expected an integer"),
    ({"runs": ["a", "b"], "width": "800"}, 400, "width: expected an integer"),
    ([1, 2], 400, "JSON object"),
    ("{oops", 400, "not valid JSON"),
    ({"runs": ["a", "missing"]}, 404, "no run 'missing'"),
])
def test_compare_refuses_bad_bodies(api, traces, tmp_path, body, status, words):
    make_run(traces, "a", tmp_path)
    code, reply = api.call("POST", "compare", body)
    assert code == status
    assert words in reply["message"]


def layout_widths(item: dict[str, Any]) -> set[int]:
    """Every `width` attribute of the models in a json_item."""
    found: set[int] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            attributes = value.get("attributes")
            if isinstance(attributes, dict) and isinstance(attributes.get("width"), int):
                found.add(attributes["width"])
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(item["doc"])
    return found


def test_views_take_the_width_of_the_panel(api, traces, tmp_path):
    make_run(traces, "a", tmp_path, "eager", 2.0)
    make_run(traces, "b", tmp_path, "int8", 1.0)
    assert 1200 in layout_widths(api.ok("GET", "runs/a/dashboard")["item"])
    narrow = layout_widths(api.ok("GET", "runs/a/dashboard?width=640")["item"])
    assert 640 in narrow
    assert 1200 not in narrow
    assert 900 in layout_widths(api.ok("POST", "compare", {"runs": ["a", "b"], "width": 900})["item"])
    for bad in ("399", "4001", "wide", "-5"):
        code, reply = api.call("GET", f"runs/a/dashboard?width={bad}")
        assert code == 400
        assert "width: expected an integer" in reply["message"]


def test_delete_run(api, traces, tmp_path):
    make_run(traces, "a", tmp_path)
    make_run(traces, "b", tmp_path)
    assert api.ok("DELETE", "runs/a") == {"deleted": "a"}
    assert [b.run_id for b in list_bundles(traces)] == ["b"]
    code, reply = api.call("GET", "runs/a")
    assert code == 404
    assert "no run 'a'" in reply["message"]
    assert api.call("DELETE", "runs/a")[0] == 404


ESCAPES = ["..%2Foutside", "..%2F..%2Foutside%2Frun.json", "%2E%2E", "%2Fetc%2Fpasswd", "%2Ftmp", "a%2F..%2Fb",
           "experiments", "-rf", ".hidden"]


@pytest.mark.parametrize("ref", ESCAPES)
@pytest.mark.parametrize(("method", "suffix"), [("GET", ""), ("GET", "/dashboard"), ("DELETE", "")])
def test_run_ids_that_leave_the_root_are_refused(api, traces, tmp_path, ref, method, suffix):
    outside = tmp_path / "outside"
    make_run(tmp_path, "outside", tmp_path)
    make_run(traces, "a", tmp_path)
    make_run(traces, "b", tmp_path)
    code, reply = api.call(method, f"runs/{ref}{suffix}")
    assert code == 400
    assert "is not a run id" in reply["message"]
    assert (outside / "run.json").is_file()
    assert len(list_bundles(traces)) == 2


def test_a_symlink_out_of_the_root_is_refused(api, traces, tmp_path):
    make_run(tmp_path / "elsewhere", "victim", tmp_path)
    make_run(traces, "a", tmp_path)
    (traces / "escape").symlink_to(tmp_path / "elsewhere" / "victim", target_is_directory=True)

    for method, path in (("GET", "runs/escape"), ("GET", "runs/escape/dashboard"), ("DELETE", "runs/escape")):
        code, reply = api.call(method, path)
        assert code == 422, (method, path)
        assert "leads outside" in reply["message"]
    code, reply = api.call("POST", "compare", {"runs": ["a", "escape"]})
    assert code == 422
    assert api.call("POST", "compare", {"runs": ["a", "../elsewhere/victim"]})[0] == 400
    assert (tmp_path / "elsewhere" / "victim" / "run.json").is_file()
    listing = api.ok("GET", "runs")
    assert [row["run"] for row in listing["runs"]] == ["a"]
    assert [p["entry"] for p in listing["problems"]] == ["escape"]


# --- jobs: validation --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "words"), [
    ({"model": "mlp", "colour": "red"}, "unknown capture option(s) 'colour'"),
    ({"out_dir": "/tmp/elsewhere"}, "'out_dir'"),
    ({"report_path": "/tmp/x.html"}, "'report_path'"),
    ({"model": "mlp", "batch": "4"}, "batch: expected an integer"),
    ({"model": "mlp", "batch": True}, "batch: expected an integer"),
    ({"model": "mlp", "batch": 0}, "--batch"),
    ({"model": "mlp", "batch": [1, 0]}, "batch (--batch): must be at least 1, got 0"),
    ({"model": "mlp", "batch": [1, "8"]}, "batch: expected an integer or a list of integers"),
    ({"model": "mlp", "batch": []}, "batch: expected an integer or a non-empty list"),
    ({"model": "mlp", "batch": [2, 2]}, "batch value(s) listed more than once: 2"),
    ({"model": "mlp", "batch": [1, MAX_BATCH + 1]}, f"batch: must be at most {MAX_BATCH}"),
    ({"model": "mlp", "iterations": [1, 2]}, "iterations: expected an integer"),
    ({"model": "mlp", "profile": "yes"}, "profile: expected true or false"),
    ({"model": "mlp", "variants": []}, "variants: expected a non-empty list"),
    ({"model": "mlp", "overrides": ["layers=2"]}, "overrides: expected an object"),
    ({}, "model: required"),
    ({"variants": ["eager"]}, "model: required"),
    (["mlp"], "JSON object"),
    ("{oops", "not valid JSON"),
])
def test_job_bodies_are_validated(api, body, words):
    code, reply = api.call("POST", "jobs", body)
    assert code == 400
    assert words in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_capture_args_follow_the_cli_options():
    args = capture_args({"model": "mlp", "variants": ["eager", "int8"], "batch": 2, "seq": None, "profile": False,
                         "with_stack": True, "steady_state_only": False, "overrides": {"hidden": 64, "act": "relu"}})
    assert args == ["--model", "mlp", "--variants", "eager,int8", "--batch", "2", "--no-profile", "--with-stack",
                    "--set", "hidden=64", "--set", 'act="relu"']
    assert capture_args({"model": "mlp"}) == ["--model", "mlp"]
    # a list of sizes is a sweep, as the CLI's comma list; one value in a list is that value
    assert capture_args({"model": "tiny-gpt", "batch": [1, 8, 32], "seq": [16, 8]}) == [
        "--model", "tiny-gpt", "--batch", "1,8,32", "--seq", "16,8"]
    assert capture_args({"model": "mlp", "batch": [4]}) == ["--model", "mlp", "--batch", "4"]
    with pytest.raises(CaptureRequestError, match="model: required"):
        capture_args({})
    with pytest.raises(CaptureRequestError, match="iterations"):
        capture_args({"model": "mlp", "iterations": 0})


def test_capture_options_describe_every_job_key(api):
    options = api.ok("GET", "capture/options")
    fields = {field["key"]: field for field in options["fields"]}
    for key in ("model", "variants", "batch", "device", "profiler", "kernel_name", "launch_count", "overrides"):
        assert key in fields
    assert fields["batch"] | {"choices": None} == {"key": "batch", "type": "integer", "nullable": False, "default": 4,
                                                  "minimum": 1, "maximum": MAX_BATCH, "choices": None,
                                                  "flag": "--batch", "sweep": True}
    assert fields["seq"]["sweep"] and not fields["iterations"]["sweep"]
    assert fields["seq"]["nullable"] and fields["seq"]["default"] is None
    assert fields["profiler"]["choices"] == profilers() == [p["name"] for p in options["profilers"]]
    assert fields["variants"]["choices"] == list_variants() == [v["name"] for v in options["variants"]]
    assert all(v["description"] for v in options["variants"])
    assert options["devices"][0] == "cpu" and "mlp" in options["models"]
    assert "hf-config:llama-3-8b" in options["models"] and "torchvision:resnet50" in options["models"]
    assert options["builtin_models"] == ["convnet", "mlp", "tiny-gpt"]
    # every key the options name is one a job takes, and nothing else is
    code, reply = api.call("POST", "jobs", {"model": "mlp", "seed": 1})
    assert code == 400 and f"valid: {', '.join(fields)}" in reply["message"]


@pytest.mark.parametrize(("body", "words"), [
    ({"model": "mlp", "profiler": "perf"}, "unknown profiler 'perf'"),
    ({"model": "mlp", "device": "gpu0"}, "invalid device 'gpu0'"),
    ({"model": "mlp", "variants": ["eager", "turbo"]}, "unknown variant 'turbo'"),
    ({"model": "mlp", "variants": ["eager", "eager"]}, "listed more than once"),
    ({"model": "mlp", "launch_count": 0}, "--launch-count"),
    ({"model": "mlp", "kernel_name": ""}, "kernel_name: expected a non-empty string"),
])
def test_job_settings_are_checked_as_the_cli_checks_them(api, body, words):
    code, reply = api.call("POST", "jobs", body)
    assert code == 400, reply
    assert words in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}


def test_unknown_jobs_are_404(api):
    for method in ("GET", "DELETE"):
        code, reply = api.call(method, "jobs/nope")
        assert code == 404
        assert "no job 'nope'" in reply["message"]


# --- jobs: real captures -----------------------------------------------------------------------------------

def test_job_lifecycle_start_progress_finish(api, traces):
    response = api.raw("POST", "api/jobs", TINY_JOB)
    assert response.code == 202
    job = json.loads(response.body)
    assert job["status"] == "running"
    assert job["request"] == TINY_JOB
    assert response.headers["Location"].endswith(f"/workbench/api/jobs/{job['id']}")

    done = api.wait_job(job["id"], is_finished, "finished")
    assert done["status"] == "succeeded", done
    assert done["exit_code"] == 0
    assert done["error"] is None
    assert done["progress"]["tasks"]["benchmark"] == {"completed": 2, "total": 2, "done": True}
    assert done["progress"]["tasks"]["write"]["done"]
    (run,) = done["result"]["runs"]
    assert run["status"] == "ok"
    assert done["result"]["root"] == "."  # the traces root, as every reply names it (see `redact`)
    listing = api.ok("GET", "runs")
    assert [row["run"] for row in listing["runs"]] == [run["run_id"]]
    assert listing["experiments"][0]["experiment"] == done["result"]["experiment"]
    assert api.ok("GET", f"runs/{run['run_id']}")["variant"] == "eager"
    assert [j["id"] for j in api.ok("GET", "jobs")["jobs"]] == [job["id"]]

    code, reply = api.call("DELETE", f"jobs/{job['id']}")
    assert code == 409
    assert "already ended" in reply["message"]


def test_cancel_a_running_job(api, traces):
    # The server ignores SIGINT, as one started in the background does; the job inherits that, and must
    # still stop on the SIGINT of a cancel like on Ctrl-C, not wait for the kill after the grace period.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        job = api.ok("POST", "jobs", {**TINY_JOB, "iterations": MAX_ITERATIONS}, status=202)
        api.wait_job(job["id"], lambda j: (j["progress"]["tasks"].get("benchmark") or {}).get("completed", 0) > 0,
                     "reached its benchmark")
    finally:
        signal.signal(signal.SIGINT, previous)

    cancelled = api.ok("DELETE", f"jobs/{job['id']}")
    assert cancelled["status"] == "cancelled"
    assert cancelled["finished"] is not None
    assert cancelled["exit_code"] == 130  # the CLI stopped as on Ctrl-C
    assert any("interrupted" in line for line in cancelled["log"])
    assert list_bundles(traces) == []  # nothing half-written
    assert api.ok("GET", f"jobs/{job['id']}")["status"] == "cancelled"


def test_concurrent_starts_wait_in_the_queue(api):
    first = api.ok("POST", "jobs", TINY_JOB, status=202)
    second = api.ok("POST", "jobs", TINY_JOB, status=202)
    third = api.ok("POST", "jobs", TINY_JOB, status=202)
    assert first["status"] == "running"
    assert (second["status"], second["queue_position"]) == ("queued", 1)
    assert (third["status"], third["queue_position"]) == ("queued", 2)
    assert api.ok("GET", f"jobs/{second['id']}")["status"] == "queued"

    dropped = api.ok("DELETE", f"jobs/{third['id']}")  # a queued job just leaves the queue
    assert (dropped["status"], dropped["started"], dropped["exit_code"]) == ("cancelled", None, None)
    assert api.ok("GET", f"jobs/{second['id']}")["queue_position"] == 1

    done_first = api.wait_job(first["id"], is_finished, "finished")
    done_second = api.wait_job(second["id"], is_finished, "finished")
    assert (done_first["status"], done_second["status"]) == ("succeeded", "succeeded")
    assert done_second["started"] >= done_first["finished"]  # it started only once the first had ended
    assert api.ok("GET", f"jobs/{third['id']}")["started"] is None


# --- config: the traces root --------------------------------------------------------------------------------

def test_the_traces_root_follows_put_config(api, traces, tmp_path, jp_root_dir, jp_serverapp):
    assert api.ok("GET", "config") == {"traces_root": "traces", "default_traces_root": "traces"}
    make_run(traces, "here", tmp_path)
    make_run(jp_root_dir / "other", "there", tmp_path)

    assert api.ok("PUT", "config", {"traces_root": "other"}) == {
        "traces_root": "other", "default_traces_root": "traces"}  # relative to root_dir, as the setting names them
    listing = api.ok("GET", "runs")
    assert listing["root"] == "other"
    assert [row["run"] for row in listing["runs"]] == ["there"]
    assert api.call("GET", "runs/here")[0] == 404
    app = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    (extension,) = app
    command = extension.state.capture_command(["--model", "mlp"])
    assert command[command.index("--out") + 1] == str(jp_root_dir / "other")  # captures go there too

    absolute = jp_root_dir / "absolute-root"
    assert api.ok("PUT", "config", {"traces_root": str(absolute)})["traces_root"] == "absolute-root"
    assert api.ok("GET", "runs")["runs"] == []  # a folder that does not exist yet lists nothing
    outside = tmp_path / "outside-root"
    outside.mkdir()
    (jp_root_dir / "link-out").symlink_to(outside, target_is_directory=True)
    for escape in (str(outside), "../outside-root", "link-out"):
        code, reply = api.call("PUT", "config", {"traces_root": escape})
        assert code == 400 and "outside the server's root folder" in reply["message"], escape
    assert api.ok("GET", "config")["traces_root"] == "absolute-root"
    assert api.ok("PUT", "config", {"traces_root": ""})["traces_root"] == "traces"
    assert [row["run"] for row in api.ok("GET", "runs")["runs"]] == ["here"]


@pytest.mark.parametrize(("body", "words"), [
    ({"traces_root": 3}, "expected a path"),
    ({"traces_root": None}, "expected a path"),
    ({"root": "x"}, "unknown key(s) 'root'"),
    ({"traces_root": "a-file"}, "is not a folder"),
])
def test_put_config_refuses_bad_bodies(api, traces, jp_root_dir, body, words):
    (jp_root_dir / "a-file").write_text("not a folder")
    code, reply = api.call("PUT", "config", body)
    assert code == 400
    assert words in reply["message"]
    assert api.ok("GET", "config")["traces_root"] == "traces"


# --- pieces ------------------------------------------------------------------------------------------------

def test_traces_root_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_TRACES", raising=False)
    assert resolve_traces_root("", tmp_path) == tmp_path / "traces"
    assert resolve_traces_root("runs/here", tmp_path) == tmp_path / "runs" / "here"
    assert resolve_traces_root(str(tmp_path / "abs"), Path("/elsewhere")) == tmp_path / "abs"
    monkeypatch.setenv("WORKBENCH_TRACES", "from-env")
    assert resolve_traces_root("", tmp_path) == tmp_path / "from-env"


def test_json_progress_lines(tmp_path):
    path = tmp_path / "progress.jsonl"
    with path.open("w") as stream, JsonProgress(stream) as progress:
        progress.start("benchmark", 2)
        progress.advance("benchmark")
        progress.advance("other")  # never started: ignored
        progress.finish("benchmark")
        progress.start("write")
        progress.finish("write")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"task": "benchmark", "completed": 0, "total": 2, "done": False},
        {"task": "benchmark", "completed": 1, "total": 2, "done": False},
        {"task": "benchmark", "completed": 2, "total": 2, "done": True},
        {"task": "write", "completed": 0, "total": None, "done": False},
        {"task": "write", "completed": 0, "total": None, "done": True},
    ]


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_job_manager_runs_up_to_its_limit_and_reports_failures(tmp_path):
    """Small Python commands stand in for captures: two slots, a failing job, a noisy one, one that
    ignores SIGINT and is killed after the grace period."""
    gate = tmp_path / "gate"
    waits = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\nprint('{{}}')"
    failing = "import sys; print('error: no model called x', file=sys.stderr); sys.exit(2)"
    noisy = f"import sys\nfor i in range({LOG_LINES + 20}): print('line', i, file=sys.stderr)\nprint('not json')"
    stubborn = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "print('{\"task\": \"t\", \"completed\": 1, \"total\": 9}', file=sys.stderr, flush=True)\n"
                "time.sleep(60)")

    async def scenario() -> None:
        manager = JobManager(max_running=2, grace_s=0.2)
        a, b, c = (manager.submit(_python(waits), {"n": n}, cwd=tmp_path) for n in range(3))
        assert [j.status for j in (a, b, c)] == ["running", "running", "queued"]
        gate.touch()
        for job in (a, b, c):
            await job.done.wait()
        assert [(j.status, j.result) for j in (a, b, c)] == [("succeeded", {})] * 3

        bad, loud = manager.submit(_python(failing), {}), manager.submit(_python(noisy), {})
        await bad.done.wait()
        await loud.done.wait()
        assert (bad.status, bad.exit_code, bad.error) == ("failed", 2, "no model called x")
        assert loud.status == "failed" and "not JSON" in loud.error
        assert list(loud.log) == [f"line {i}" for i in range(20, LOG_LINES + 20)]

        held = manager.submit(_python(stubborn), {})
        while not held.tasks:
            await asyncio.sleep(0.02)
        assert manager.describe(held)["progress"] == {"task": "t", "completed": 1, "total": 9,
                                                      "tasks": {"t": {"completed": 1, "total": 9, "done": False}}}
        await manager.cancel(held)
        assert (held.status, held.exit_code) == ("cancelled", -9)  # SIGINT ignored: killed after the grace period

    asyncio.run(scenario())


def test_server_stop_cancels_running_jobs(tmp_path):
    async def scenario() -> None:
        manager = JobManager(max_running=1, grace_s=5)
        running = manager.submit(_python("import time; time.sleep(60)"), {})
        queued = manager.submit(_python("print(1)"), {})
        while running.process is None:
            await asyncio.sleep(0.02)
        pid = running.process.pid
        await manager.shutdown()
        assert (running.status, queued.status) == ("cancelled", "cancelled")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    asyncio.run(scenario())
