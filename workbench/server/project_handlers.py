"""The panel's accelerator projection routes (co-design), under `<base_url>/workbench/api/`:

    GET    project/options      {"devices", "dtypes", "knobs", "model_set", "models"}: what the form offers (the
                                hardware table's devices, `--dtype`'s choices, the sweep knobs, the model set's
                                short names, the built-in models)
    POST   project              {"model" | "run" | "models", "accelerator", "sweeps"?: ["knob=v1,v2", ...],
                                "dtype"?, "batch"?, "seq"?} -> 202 and the job running `workbench project ...
                                --json` (`workbench.codesign`: the operators projected onto the accelerator, per
                                kind and block, guidance, sweeps; with `models`, the set's sweeps)
    GET    project/<job>/view   {"job", "title", "item"}: Bokeh `json_item` of the projection report
                                (`views.projection.result_view`: operator bars by bound, time per kind, the sweep
                                curves, guidance; a set's curves and tables), `?width=N` pixels; once the job
                                succeeded (409 before, 404 for no projection job)

The body is checked whole before anything is queued (400, with a one-line message naming the field and no path of
the server). Exactly one of: `model`, a model the server's policy allows (403 otherwise, as for captures and the
quantization lab: `quant_handlers.model_reference`); `run`, a run id of the traces root opened as every route opens
one (`WorkbenchHandler.open_run`: 404 when there is none, 422 when it leads outside the root); `models`, distinct
short names of the model set (`codesign.sources.MODEL_SET`), which needs a sweep. `accelerator` is a device of the
hardware table (`workbench.hardware.list_devices`), or a description file (.yaml, .yml, .json) given relative to the
traces root: never an absolute path, nor one leading out of the root (links resolved), at most `MAX_DESCRIPTION_BYTES`,
read and checked here as the CLI reads it (its one-line message naming the field of the file). Each sweep is read by
the CLI's parser (`codesign.sensitivity.parse_sweep`), at most `MAX_SWEEPS` knobs, none twice, of at most
`MAX_VALUES` values each; `dtype` one of `--dtype`'s choices; `batch` and `seq` within the CLI's bounds (`seq` for a
model only, neither for a run: its shapes are as recorded). 429 when the job queue is full.

A projection job is a sibling of the other jobs in the job list (`GET jobs`, `GET`/`DELETE jobs/<id>`): its
`request` is `{"project": the body as checked}`, its result the CLI's JSON (`{"title", "source", "accelerator",
"steps", "step_ns", "by_kind", "by_block", "by_bound", "guidance", "sweeps", "ops"}`; for a set `{"title",
"accelerator", "models", "sweeps", "buys_most"}`). It writes nothing: the view route draws the report from that
result, at whatever width the panel asks, for as long as the job list keeps the job; the CLI's `--html` draws it
from the same JSON by the same function.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop

from workbench.errors import WorkbenchError
from workbench.server.handlers import WIDTHS, ApiError, WorkbenchHandler, distinct_choices
from workbench.server.jobs import QueueFull
from workbench.server.model_policy import ModelRefused
from workbench.server.quant_handlers import MAX_BATCH, MAX_SEQ, builtin_models, is_word, model_reference
from workbench.server.state import ServerState
from workbench.trace.store.bundle import is_valid_run_id, json_safe

KEYS = ("model", "run", "models", "accelerator", "sweeps", "dtype", "batch", "seq")
"""The keys of a `POST project` body."""
MAX_SWEEPS = 8
"""Most knobs swept by one job (each value of each is one projection more, per model of a set)."""
MAX_VALUES = 16
"""Most values of one knob."""
MAX_DESCRIPTION_BYTES = 1 << 20
"""Largest accelerator description file read (a description is a few hundred bytes of YAML)."""


class ProjectOptionsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        """What the panel's form offers (module docstring)."""
        self.reply(await self.in_thread(project_options))


class ProjectHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        """Start (or queue) a projection: 202 and the job's status (module docstring). The body is checked in a worker
        thread (the description file is read and parsed, the model policy looks at the disk)."""
        body = self.body_object(KEYS)
        given = [key for key in ("model", "run", "models") if key in body]
        if len(given) != 1:
            raise ApiError(400, "model, run or models: give exactly one (a model to run one forward of, a run of the "
                                f"traces root, or model-set names), got {', '.join(given) or 'none'}")
        root = self.traces_root()
        if "run" in body:
            if not isinstance(body["run"], str):
                raise ApiError(400, f"run: expected a run id of the traces root, got {body['run']!r:.100}")
            self.open_run(body["run"])  # 400, 404 or 422 before anything else
        try:
            request, args, target = await IOLoop.current().run_in_executor(None, self._checked, body, root)
        except ModelRefused as exc:
            raise ApiError(403, str(exc)) from exc
        # a run's job checks the panel's root again as it starts: it may wait in the queue a long time
        check = functools.partial(self.state.check_root, root) if "run" in body else None
        try:
            job = self.state.jobs.submit(project_command(args, str(root), target), request={"project": request},
                                         cwd=self.state.cwd, check=check)
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from exc
        self.set_header("Location", self.request.path.rsplit("/", 1)[0] + "/jobs/" + job.job_id)
        self.reply(json_safe(self.state.jobs.describe(job)), status=202)

    def _checked(self, body: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[str], list[str]]:
        """The request as checked (what the job shows), the `workbench project` options it becomes and its target
        (`["--", model or run]`, none for a model set); 400 on the first bad field, ModelRefused for a model the
        policy refuses."""
        request: dict[str, Any] = {}
        target: list[str] = []
        if "model" in body:
            model = body["model"]
            reference = model_reference(model, self.state)
            if is_valid_run_id(model) and os.path.lexists(root / model):
                raise ApiError(400, f"model: {model!r:.200} is also a run of the traces root; to project that run, "
                                    "choose it as the run")
            request["model"], target = model, ["--", reference]
        elif "run" in body:
            request["run"], target = body["run"], ["--", body["run"]]  # opened by `post`
        else:
            request["models"] = _model_set(body["models"])
        accelerator = body.get("accelerator")
        args = [f"--accelerator={_accelerator(accelerator, root)}"]
        request["accelerator"] = accelerator
        sweeps = body.get("sweeps")
        if sweeps is not None and sweeps != []:
            request["sweeps"] = _sweeps(sweeps)
            args += [f"--sweep={text}" for text in request["sweeps"]]
        if "models" in request:
            if "sweeps" not in request:
                raise ApiError(400, "sweeps: a model set compares sweeps; give at least one, e.g. bandwidth=0.5,1,2,4")
            args.append("--models=" + ",".join(request["models"]))
        dtype = body.get("dtype")
        if dtype is not None and dtype != "":
            request["dtype"] = _dtype(dtype)
            args.append(f"--dtype={dtype}")
        for name, high in (("batch", MAX_BATCH), ("seq", MAX_SEQ)):
            value = body.get(name)
            if value is None:
                continue
            if "run" in request:
                raise ApiError(400, f"{name}: applies to a model (a run's shapes are as recorded)")
            if name == "seq" and "models" in request:
                raise ApiError(400, "seq: applies to one model (each model of the set has its own sequence length)")
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ApiError(400, f"{name}: expected a whole number from 1 to {high:,}, got {value!r:.100}")
            request[name] = value
            args.append(f"--{name}={value}")
        return request, args, target


class ProjectViewHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        """The report of a succeeded projection job as a Bokeh json_item, laid out `width` pixels wide."""
        width = self.query_int("width", *WIDTHS, "pixels")
        job = self.succeeded_job(job_id, "project", "projection")
        self.reply({"job": job_id, "title": job.result.get("title"),
                    "item": await self.in_thread(draw_projection, job.result, width)})


def project_options() -> dict[str, Any]:
    """What a projection form offers: devices, dtypes, sweep knobs, the model set, the built-in models."""
    from workbench.codesign.description import SWEEPS, TARGET_DTYPES
    from workbench.codesign.sources import MODEL_SET
    from workbench.hardware import list_devices

    return {"devices": list_devices(), "dtypes": list(TARGET_DTYPES), "knobs": list(SWEEPS),
            "model_set": list(MODEL_SET), "models": builtin_models()}


def _accelerator(value: Any, root: Path) -> str:
    """What `--accelerator` gets: a device name of the hardware table as is, or a description file relative to the
    traces root as its resolved path (after reading it as the CLI would: 400 with its message)."""
    from workbench.codesign.description import load_description
    from workbench.hardware import list_devices
    from workbench.hardware.specs import SPEC_SUFFIXES

    devices = list_devices()
    if value in devices:
        return value
    expected = (f"accelerator: expected a device of the hardware table ({', '.join(devices)}) or a description "
                f"file ({', '.join(SPEC_SUFFIXES)}) given relative to the traces root")
    if not is_word(value):
        raise ApiError(400, f"{expected}, got {value!r:.100}")
    if not value.lower().endswith(SPEC_SUFFIXES):
        raise ApiError(400, f"{expected}; {value!r:.200} is neither")
    if Path(value).is_absolute() or value.startswith("~"):
        raise ApiError(400, f"accelerator: {value!r:.200} is an absolute path; a description file is given "
                            "relative to the traces root (no absolute path, nothing outside the root)")
    outside = ApiError(400, f"accelerator: {value!r:.200} leads outside the traces root; refused (a description "
                            "file is given relative to the root, and must lie inside it)")
    if os.path.normpath(value).split(os.sep)[0] == os.pardir:
        raise outside
    try:
        base, real = root.resolve(strict=True), (root / value).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a NUL
        raise ApiError(400, f"accelerator: no file {value!r:.200} in the traces root (a description file is given "
                            "relative to it)") from None
    if not real.is_relative_to(base):  # a link out of the root
        raise outside
    if not real.is_file() or real.stat().st_size > MAX_DESCRIPTION_BYTES:
        raise ApiError(400, f"accelerator: {value!r:.200} is no file of at most {MAX_DESCRIPTION_BYTES >> 20} MiB in "
                            "the traces root")
    try:
        load_description(root / value)
    except WorkbenchError as exc:
        raise ApiError(400, f"accelerator: {exc}") from exc
    return str(real)


def _sweeps(values: Any) -> list[str]:
    """The sweeps as `--sweep` takes them (`bandwidth=0.5,1,2`), each read by the CLI's parser, spaces dropped."""
    from workbench.codesign.sensitivity import parse_sweep

    if not isinstance(values, list) or len(values) > MAX_SWEEPS:
        raise ApiError(400, f"sweeps: expected a list of at most {MAX_SWEEPS} texts KNOB=V1,V2,..., got "
                            f"{values!r:.200}")
    texts, knobs = [], []
    for value in values:
        if not is_word(value):
            raise ApiError(400, f"sweeps: expected texts KNOB=V1,V2,... (e.g. bandwidth=0.5,1,2,4), got {value!r:.100}")
        text = "".join(value.split())
        try:
            knob, points = parse_sweep(text)
        except ValueError as exc:
            raise ApiError(400, f"sweeps: {str(exc).removeprefix('--sweep ')}") from exc
        if len(points) > MAX_VALUES:
            raise ApiError(400, f"sweeps: {text!r:.100} has {len(points)} values; at most {MAX_VALUES} per knob")
        if knob in knobs:
            raise ApiError(400, f"sweeps: the knob {knob!r} is swept more than once")
        texts.append(text)
        knobs.append(knob)
    return texts


def _model_set(values: Any) -> list[str]:
    """Distinct short names of the model set (`MODEL_SET`)."""
    from workbench.codesign.sources import MODEL_SET

    return distinct_choices("models", values, list(MODEL_SET), "is not in the model set")


def _dtype(value: Any) -> str:
    """A precision of `--dtype`'s choices."""
    from workbench.codesign.description import TARGET_DTYPES

    if value not in TARGET_DTYPES:
        raise ApiError(400, f"dtype: expected one of {', '.join(TARGET_DTYPES)}, got {value!r:.100}")
    return value


def project_command(args: list[str], root: str, target: list[str]) -> list[str]:
    """The command line of a projection job: the CLI run by the server's interpreter with `args`, reading runs from
    the traces root `root`, its result as JSON on stdout; `target` is `["--", model or run]` (after `--`, so that
    nothing in it reads as an option), empty for a model set."""
    return [sys.executable, "-m", "workbench", "project", *args, f"--out={root}", "--json", *target]


def draw_projection(result: dict[str, Any], width: int | None) -> dict[str, Any]:
    """The json_item of `result_view` of a projection job's result (the CLI's JSON), `width` pixels wide (None: the
    view's default)."""
    from bokeh.embed import json_item

    from workbench.views.projection import result_view

    if "ops" not in result and "models" not in result:
        raise ApiError(500, "the projection job's result has neither operators nor models")
    sized = {} if width is None else {"width": width}
    return json_item(result_view(result, **sized))


def project_handlers(state: ServerState) -> list[tuple[str, type, dict]]:
    """The routes of this module (relative to the server's base URL) with their handlers."""
    common = {"state": state}
    return [("workbench/api/project/options", ProjectOptionsHandler, common),
            ("workbench/api/project", ProjectHandler, common),
            (r"workbench/api/project/(?P<job_id>[^/]+)/view", ProjectViewHandler, common)]
