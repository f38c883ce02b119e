"""The Jupyter server extension against hostile or broken requests: models that would run code, numbers
past the limits, a full queue, links in the traces root, malformed numbers and bodies. Every 4xx reply
here is also checked to name no absolute path of the server's disk."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workbench.limits import (
    MAX_BATCH,
    MAX_ITERATIONS,
    MAX_MODEL_DIM,
    MAX_PROFILE_STEPS,
    MAX_SEQ,
    MAX_THREADS,
    MAX_WARMUP,
    LimitError,
    check_limits,
)
from workbench.server.capture_request import capture_args
from workbench.server.model_policy import ModelPolicy, ModelRefused
from workbench.trace.store.bundle import list_bundles

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

# pytest-jupyter's fixtures, for this module only (see test_server.py).
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import TINY_JOB, Api, is_finished, jp_server_config, make_run  # noqa: F401 (jp_server_config: a fixture)

ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/>-])/[\w.-]")
"""An absolute POSIX path in a message (`/x...` starting a word)."""


class CheckedApi(Api):
    """Api whose every 4xx reply must hold a message naming none of the server's absolute paths."""

    def __init__(self, *args: Any, secret_paths: list[Path]) -> None:
        super().__init__(*args)
        self.secrets = sorted({str(p) for path in secret_paths for p in (path, path.resolve())}, key=len)

    def call(self, method: str, path: str, body: Any = None, *, token: bool = True) -> tuple[int, Any]:
        code, reply = super().call(method, path, body, token=token)
        assert code < 500, reply
        if code >= 400:
            message = reply["message"]
            assert isinstance(message, str) and message
            assert not ABSOLUTE_PATH.search(message), message
            assert not any(secret in message for secret in self.secrets), message
        return code, reply


def settings(**workbench: Any):
    """Parametrize the test server with these WorkbenchServerApp settings."""
    return pytest.mark.parametrize("jp_server_config", [workbench], indirect=True, ids=["settings"])


@pytest.fixture
def api(jp_serverapp, http_server_client, jp_base_url, jp_auth_header, jp_asyncio_loop, jp_root_dir,
        tmp_path) -> CheckedApi:
    return CheckedApi(http_server_client, jp_base_url, jp_auth_header, jp_asyncio_loop,
                      secret_paths=[jp_root_dir, tmp_path])


@pytest.fixture
def traces(jp_root_dir) -> Path:
    return jp_root_dir / "traces"


@pytest.fixture
def state(jp_serverapp):
    """The extension's shared state (its capture command can be swapped for a stand-in)."""
    (extension,) = jp_serverapp.extension_manager.extension_apps["workbench.server"]
    return extension.state


def stand_in(state, code: str) -> list[list[str]]:
    """Make capture jobs run `python -c code` instead of a capture; returns the capture args they got."""
    seen: list[list[str]] = []

    def command(args: list[str]) -> list[str]:
        seen.append(args)
        return [sys.executable, "-c", code]

    state.capture_command = command
    return seen


def refused(api: Api, body: Any, status: int, *words: str) -> str:
    """POST jobs `body`: refused with `status` and a message holding `words`; no job was started."""
    code, reply = api.call("POST", "jobs", body)
    assert code == status, reply
    for word in words:
        assert word in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}
    return reply["message"]


# --- models that would run code ------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "argument"), [("os:system", "command"), ("posix:system", "command"),
                                                 ("subprocess:getoutput", "cmd")])
def test_factory_models_are_refused_by_default_and_run_nothing(api, tmp_path, model, argument):
    marker = tmp_path / "marker"  # what the call would create: `os.system(command="touch ...")` works
    message = refused(api, {"model": model, "overrides": {argument: f"touch {marker}"}},
                      403, "c.WorkbenchServerApp.allowed_factory_modules", repr(model.partition(":")[0]))
    assert "built-in models" in message
    assert not marker.exists()


FACTORIES = '''
import torch

def tiny(width=8):
    torch.manual_seed(0)
    return torch.nn.Linear(width, 4), (torch.randn(2, width),)
'''


@settings(allowed_factory_modules=["wb_test_factories"])
def test_an_allowed_factory_module_runs(api, jp_root_dir, traces, tmp_path):
    (jp_root_dir / "wb_test_factories.py").write_text(FACTORIES)  # importable: jobs run in root_dir
    job = api.ok("POST", "jobs", {**TINY_JOB, "model": "wb_test_factories:tiny", "overrides": {"width": 8}},
                 status=202)
    done = api.wait_job(job["id"], is_finished, "finished")
    assert done["status"] == "succeeded", done
    (run,) = done["result"]["runs"]
    assert run["status"] == "ok"
    assert [b.info["model"]["name"] for b in list_bundles(traces)] == ["wb_test_factories:tiny"]

    marker = tmp_path / "marker"
    for model, words in [("os:system", "allowed_factory_modules"),
                         ("wb_test_factories_evil:tiny", "allowed_factory_modules"),  # a prefix is no module
                         ("wb_test_factories:torch.ones", "public name"),
                         ("wb_test_factories:_private", "public name")]:
        code, reply = api.call("POST", "jobs", {"model": model, "overrides": {"command": f"touch {marker}"}})
        assert code == 403 and words in reply["message"], (model, reply)
    assert len(api.ok("GET", "jobs")["jobs"]) == 1
    assert not marker.exists()


def test_the_policy_allows_submodules_and_refuses_look_alikes():
    policy = ModelPolicy(factory_modules=("mymodels",))
    for ref in ("mymodels:make", "mymodels.vision:make", "mlp", "no-such-model"):
        assert policy.checked_model(ref) == ref
    for ref in ("mymodelsx:make", "my:make", "os:system", "mymodels:os.system"):
        with pytest.raises(ModelRefused):
            policy.checked_model(ref)


@settings(allowed_model_dirs=["models"])
def test_model_files_load_only_from_allowed_folders(api, state, jp_root_dir, tmp_path):
    models, outside = jp_root_dir / "models", tmp_path / "outside"
    for folder in (models / "sub", outside, jp_root_dir / "other"):
        folder.mkdir(parents=True)
    for path in (models / "ok.pt2", models / "sub" / "deep.pt2", outside / "secret.pt2",
                 jp_root_dir / "other" / "x.pt2", jp_root_dir / "other" / "m.onnx"):
        path.write_bytes(b"stand-in")
    (models / "escape.pt2").symlink_to(outside / "secret.pt2")
    (models / "up").symlink_to(jp_root_dir / "other", target_is_directory=True)
    seen = stand_in(state, "print('{}')")

    for ref in ("models/ok.pt2", "models/sub/deep.pt2", str(models / "ok.pt2"), "other/../models/ok.pt2"):
        job = api.ok("POST", "jobs", {"model": ref}, status=202)
        assert job["request"] == {"model": "<server>" if ref.startswith("/") else ref}  # no server path goes out
        api.wait_job(job["id"], is_finished, "finished")
    # the job loads the file that was checked, by its real path
    assert [args[args.index("--model") + 1] for args in seen] == [
        str(models.resolve() / "ok.pt2"), str(models.resolve() / "sub" / "deep.pt2"),
        str(models.resolve() / "ok.pt2"), str(models.resolve() / "ok.pt2")]

    jobs_before = len(api.ok("GET", "jobs")["jobs"])
    for ref in ("models/escape.pt2", "models/up/x.pt2", "other/x.pt2", "other/m.onnx", "../outside/secret.pt2",
                str(outside / "secret.pt2"), "models/missing.pt2", str(Path(sys.executable))):
        code, reply = api.call("POST", "jobs", {"model": ref})
        assert code == 403, (ref, reply)
        assert "c.WorkbenchServerApp.allowed_model_dirs" in reply["message"]
    assert len(api.ok("GET", "jobs")["jobs"]) == jobs_before
    assert len(seen) == 4


def test_model_files_are_refused_by_default(tmp_path):
    (tmp_path / "model.pt2").write_bytes(b"stand-in")
    with pytest.raises(ModelRefused, match="allowed_model_dirs"):
        ModelPolicy(cwd=tmp_path).checked_model("model.pt2")
    with pytest.raises(ModelRefused, match="allowed_model_dirs"):
        capture_args({"model": str(tmp_path / "model.pt2")})


# --- limits ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "limit"), [("batch", MAX_BATCH), ("seq", MAX_SEQ), ("iterations", MAX_ITERATIONS),
                                            ("warmup", MAX_WARMUP), ("threads", MAX_THREADS),
                                            ("profile_steps", MAX_PROFILE_STEPS)])
def test_capture_numbers_are_bounded(api, key, limit):
    refused(api, {**TINY_JOB, key: limit + 1}, 400, f"{key}: must be at most {limit}, got {limit + 1}")
    refused(api, {**TINY_JOB, key: 10**400}, 400, f"{key}: must be at most {limit}")
    assert capture_args({"model": "tiny-gpt", key: limit})  # the limit itself is allowed


@pytest.mark.parametrize("overrides", [{"hidden": MAX_MODEL_DIM + 1}, {"d_model": 10**12}, {"layers": 1e300},
                                       {"hidden": 32, "heads": 2**63}])
def test_model_sizes_are_bounded(api, overrides):
    (key,) = [k for k, v in overrides.items() if v > MAX_MODEL_DIM]
    refused(api, {**TINY_JOB, "overrides": overrides}, 400, f"overrides: {key}: must be at most {MAX_MODEL_DIM}")


def test_check_limits_leaves_seeds_and_unknown_settings_alone():
    check_limits({"batch": MAX_BATCH, "overrides": {"seed": 2**40, "d_model": MAX_MODEL_DIM, "act": "relu"},
                  "device": "cuda", "seq": None})
    with pytest.raises(LimitError, match=r"overrides: x: must be at most 65536, got nan"):
        check_limits({"overrides": {"x": float("nan")}})


@pytest.mark.parametrize(("body", "words"), [
    ({}, "model: required"),
    ({"variants": ["eager"], "batch": 2}, "model: required"),
    ({"model": None}, "model: required"),
    ({"model": ""}, "model: expected a model name"),
    ({"model": "mlp\u0000"}, "model: expected a model name"),
    ({"model": "m" * 5000}, "model: expected a model name"),
    ({"model": "mlp", "device": "cpu\n--out"}, "device: expected a non-empty string"),
    ({"model": "mlp", "overrides": {"a\u0000b": 1}}, "is not a model config key"),
])
def test_job_bodies_name_what_is_missing_or_wrong(api, body, words):
    refused(api, body, 400, words)


@settings(max_jobs=1, max_queued_jobs=1)
def test_a_full_queue_refuses_more_jobs(api, state):
    stand_in(state, "import time; time.sleep(120)")
    running = api.ok("POST", "jobs", TINY_JOB, status=202)
    queued = api.ok("POST", "jobs", TINY_JOB, status=202)
    assert (running["status"], queued["status"]) == ("running", "queued")
    code, reply = api.call("POST", "jobs", TINY_JOB)
    assert code == 429
    assert "queue is full" in reply["message"]
    assert len(api.ok("GET", "jobs")["jobs"]) == 2

    api.ok("DELETE", f"jobs/{queued['id']}")  # a place in the queue frees up
    requeued = api.ok("POST", "jobs", TINY_JOB, status=202)
    assert requeued["status"] == "queued"
    for job in (requeued, running):
        assert api.ok("DELETE", f"jobs/{job['id']}")["status"] == "cancelled"


# --- links in the traces root ------------------------------------------------------------------------------

def test_deleting_a_link_to_a_run_deletes_the_link_only(api, traces, tmp_path):
    make_run(traces, "a", tmp_path)
    (traces / "alias").symlink_to(traces / "a", target_is_directory=True)
    (traces / "alias-abs").symlink_to((traces / "a").resolve(), target_is_directory=True)
    assert sorted(row["run"] for row in api.ok("GET", "runs")["runs"]) == ["a", "alias", "alias-abs"]

    assert api.ok("DELETE", "runs/alias") == {"deleted": "alias"}
    assert api.ok("DELETE", "runs/alias-abs") == {"deleted": "alias-abs"}
    assert not os_lexists(traces / "alias") and not os_lexists(traces / "alias-abs")
    assert (traces / "a" / "run.json").is_file()
    assert [row["run"] for row in api.ok("GET", "runs")["runs"]] == ["a"]
    assert api.call("DELETE", "runs/alias")[0] == 404


def os_lexists(path: Path) -> bool:
    return path.is_symlink() or path.exists()


def test_a_link_out_of_the_root_is_refused_without_naming_its_target(api, traces, tmp_path):
    make_run(tmp_path / "elsewhere", "victim", tmp_path)
    make_run(traces, "a", tmp_path)
    (traces / "escape").symlink_to(tmp_path / "elsewhere" / "victim", target_is_directory=True)
    (traces / "dangling").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    for method, path in (("GET", "runs/escape"), ("DELETE", "runs/escape"), ("GET", "runs/escape/dashboard"),
                         ("DELETE", "runs/dangling")):
        code, reply = api.call(method, path)
        assert code == 422 and "leads outside the traces root" in reply["message"], (method, path, reply)
    assert (tmp_path / "elsewhere" / "victim" / "run.json").is_file()
    for problem in api.ok("GET", "runs")["problems"]:  # the listing's messages name no target either
        assert not ABSOLUTE_PATH.search(problem["message"]) and str(tmp_path) not in problem["message"], problem


def _replace_with_link(folder: Path, target: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.symlink_to(target, target_is_directory=True)


SWAPS: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    "the folder becomes a link": ("mine", lambda root, out: _replace_with_link(root / "mine", out)),
    "a missing folder appears as a link": ("later", lambda root, out: _replace_with_link(root / "later", out)),
    "a parent becomes a link": ("sub/mine", lambda root, out: _replace_with_link(root / "sub", out.parent)),
}


@pytest.mark.parametrize("swap", SWAPS, ids=list(SWAPS))
def test_the_panels_traces_root_is_checked_again_at_every_use(api, state, jp_root_dir, tmp_path, swap):
    chosen, replace = SWAPS[swap]
    outside = tmp_path / "out" / "mine"
    make_run(outside, "victim", tmp_path)
    (jp_root_dir / "mine").mkdir()
    (jp_root_dir / "sub" / "mine").mkdir(parents=True)
    make_run(jp_root_dir / "mine", "here", tmp_path)
    assert api.ok("PUT", "config", {"traces_root": chosen})["traces_root"] == chosen
    api.ok("GET", "runs")

    replace(jp_root_dir, outside)
    for method, path, body in (("GET", "runs", None), ("GET", "runs/victim", None),
                               ("GET", "runs/victim/dashboard", None), ("DELETE", "runs/victim", None),
                               ("POST", "compare", {"runs": ["victim", "here"]}), ("POST", "jobs", TINY_JOB)):
        code, reply = api.call(method, path, body)
        assert code == 409, (method, path, reply)
        assert "leads outside the server's root folder now" in reply["message"]
    assert (outside / "victim" / "run.json").is_file()
    assert api.ok("GET", "jobs") == {"jobs": []}
    assert api.ok("PUT", "config", {"traces_root": ""})["traces_root"] == "traces"
    api.ok("GET", "runs")  # the configured root is usable again


@settings(max_jobs=1)
def test_a_queued_job_checks_the_panels_root_again_as_it_starts(api, state, jp_root_dir, tmp_path):
    gate = tmp_path / "gate"
    stand_in(state, f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\nprint('{{}}')")
    (jp_root_dir / "mine").mkdir()
    api.ok("PUT", "config", {"traces_root": "mine"})
    first = api.ok("POST", "jobs", TINY_JOB, status=202)
    second = api.ok("POST", "jobs", TINY_JOB, status=202)
    assert second["status"] == "queued"

    _replace_with_link(jp_root_dir / "mine", tmp_path)
    gate.touch()
    assert api.wait_job(first["id"], is_finished, "finished")["status"] == "succeeded"
    ended = api.wait_job(second["id"], is_finished, "finished")
    assert (ended["status"], ended["started"], ended["exit_code"]) == ("failed", None, None)
    assert "leads outside the server's root folder now" in ended["error"]
    assert str(tmp_path) not in ended["error"]


@pytest.mark.parametrize("value", ["a\u0000b", "x" * 5000, "~no-such-user-4f2a/traces", "/", "..", "../..",
                                   "~", "//etc"])
def test_put_config_refuses_bad_and_outside_paths(api, traces, value):
    code, reply = api.call("PUT", "config", {"traces_root": value})
    assert code == 400, reply
    assert "traces_root" in reply["message"]
    assert api.ok("GET", "config")["traces_root"] == "traces"


# --- malformed numbers and bodies ---------------------------------------------------------------------------

@pytest.mark.parametrize("query", ["top=%C2%B2", "top=1e999", "top=-1", "top=0", "top=", "top=99999999999999999999",
                                   "top=%EF%BC%91", "top=10001", "top=1.5", "top=0x10"])
def test_malformed_numbers_in_queries_are_400(api, traces, tmp_path, query):
    make_run(traces, "a", tmp_path)
    code, reply = api.call("GET", f"runs/a?{query}")
    assert code == 400
    assert "top: expected an integer number of rows from 1 to 10000" in reply["message"]
    code, reply = api.call("GET", f"runs/a/dashboard?{query.replace('top', 'width')}")
    assert code == 400
    assert "width: expected an integer number of pixels from 400 to 4000" in reply["message"]


ROUTES_WITH_BODIES = [("POST", "jobs"), ("POST", "compare"), ("PUT", "config")]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("method", "path"), ROUTES_WITH_BODIES)
@pytest.mark.parametrize(("body", "words"), [
    (nested(1000), "more than 32 levels deep"),
    (nested(200_000), "more than 32 levels deep"),
    ('{"model": "mlp", "overrides": {"x": ' + nested(40) + "}}", "more than 32 levels deep"),
    ('{"model": "mlp", "batch": NaN}', "not valid JSON"),
    ('{"model": "mlp", "batch": Infinity}', "not valid JSON"),
    (b'{"model": "\xff\xfe"}', "not valid JSON"),
    ("[]", "JSON object"),
    ('"mlp"', "JSON object"),
    ("3", "JSON object"),
    ("null", "JSON object"),
    ("", "JSON object"),
])
def test_malformed_bodies_are_400(api, method, path, body, words):
    code, reply = api.call(method, path, body)
    assert code == 400, reply
    assert words in reply["message"]
    assert api.ok("GET", "jobs") == {"jobs": []}
