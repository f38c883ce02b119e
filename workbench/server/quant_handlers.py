"""The panel's quantization lab routes, under `<base_url>/workbench/api/`:

    POST   quant                {"model", "weights"?: "trained"|"random", "formats"?: [specs], "recipes"?: [recipes],
                                "budget"?: "sqnr=30", "device"?: name, "batch"?, "seq"?, "measure"?: bool} -> 202 and
                                the job running `workbench quant ... --json --tables FOLDER` (`workbench.quant.lab`)
    GET    quant/<job>/view     {"job", "item"}: Bokeh `json_item` of the lab's views (`views.quant.quant_view`:
                                recipes, their Pareto, the layers × formats heat map, outliers, error histograms),
                                `?width=N` pixels; once the job succeeded (409 before, 404 for no quantization job)

The body is checked whole before anything is queued (400, with a message naming the field and no path of the
server): `model` a model the server's policy allows (403 otherwise, as for captures: `model_policy`), `weights`
for a built-in only, each format and recipe as the CLI's `--formats`/`--quant` read them (`parse_spec`,
`parse_recipe`: their one-line message), at most `MAX_FORMATS` formats and `MAX_RECIPES` recipes, none twice, the
budget as `--budget` reads it, `device` a name of the hardware table (`workbench.hardware.list_devices`: what the
recipes' time is projected on; no accelerator file of the server), `batch` and `seq` within the CLI's bounds.
429 when the job queue is full.

A quantization job is a sibling of capture, import and serving jobs in the job list (`GET jobs`, `GET`/`DELETE
jobs/<id>`): its `request` is `{"quant": the body as checked}`, its result the CLI's JSON (`{"model", "about",
"metric", "device", "recipes", "layers", "tensors", "outliers", "smoothing", "plan"?}`). It writes nothing into the
traces root: the lab's results are no run. Its tables go to a folder of its own in a temporary folder this server
owns (`QuantFolders`), from which the view route draws at whatever width the panel asks, without running the lab
again; a job's folder goes when the job list forgets the job, or when it ended without success, and the whole
folder with the server.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop

from workbench.errors import WorkbenchError
from workbench.server.handlers import WIDTHS, ApiError, WorkbenchHandler
from workbench.server.jobs import QueueFull
from workbench.server.model_policy import ModelRefused
from workbench.server.state import ServerState
from workbench.trace.store.bundle import json_safe

KEYS = ("model", "weights", "formats", "recipes", "budget", "device", "batch", "seq", "measure")
"""The keys of a `POST quant` body."""
MAX_FORMATS = 16
"""Most formats of one sensitivity scan (each is one forward per layer)."""
MAX_RECIPES = 16
"""Most recipes of one comparison."""
MAX_BATCH = 256
"""Largest calibration batch (the CLI's `--batch` bound)."""
MAX_SEQ = 4096
"""Longest calibration sequence (the CLI's `--seq` bound)."""
MAX_TEXT = 1_000
"""Longest model reference, format, recipe or budget."""
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")


class QuantFolders:
    """The job folders of quantization jobs, in one temporary folder of this server (removed with it): `new()`
    makes one for a job about to be submitted, `adopt` ties it to the job, `of` finds a job's; `prune` removes
    those of jobs the job list forgot or that ended without success."""

    def __init__(self) -> None:
        self._root: tempfile.TemporaryDirectory[str] | None = None
        self._folders: dict[str, Path] = {}

    def new(self) -> Path:
        """A fresh folder for the next job (the temporary folder is made on first use)."""
        if self._root is None:
            self._root = tempfile.TemporaryDirectory(prefix="workbench-quant-")
        return Path(tempfile.mkdtemp(prefix="job-", dir=self._root.name))

    def adopt(self, job_id: str, folder: Path) -> None:
        self._folders[job_id] = folder

    def of(self, job_id: str) -> Path | None:
        return self._folders.get(job_id)

    def prune(self, state: ServerState) -> None:
        """Remove the folders of jobs the job list no longer knows, or that failed or were cancelled."""
        for job_id, folder in list(self._folders.items()):
            job = state.jobs.get(job_id)
            if job is None or job.status in ("failed", "cancelled"):
                shutil.rmtree(folder, ignore_errors=True)
                del self._folders[job_id]


class QuantRoute(WorkbenchHandler):
    """Base of this module's handlers: the server's state and the quantization jobs' folders."""

    folders: QuantFolders

    def initialize(self, state: ServerState, folders: QuantFolders) -> None:  # type: ignore[override]
        super().initialize(state)
        self.folders = folders


class QuantHandler(QuantRoute):
    @tornado.web.authenticated
    async def post(self) -> None:
        """Start (or queue) the lab on a model: 202 and the job's status (module docstring). The body is checked in
        a worker thread (the formats' parser imports torch)."""
        body = self.body_object(KEYS)
        try:
            request, args = await IOLoop.current().run_in_executor(None, self._checked, body)
        except ModelRefused as exc:
            raise ApiError(403, str(exc)) from exc
        self.folders.prune(self.state)
        folder = self.folders.new()
        try:
            job = self.state.jobs.submit(quant_command(args, folder), request={"quant": request}, cwd=self.state.cwd)
        except QueueFull as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ApiError(429, str(exc)) from exc
        self.folders.adopt(job.job_id, folder)
        self.set_header("Location", self.request.path.rsplit("/", 1)[0] + "/jobs/" + job.job_id)
        self.reply(json_safe(self.state.jobs.describe(job)), status=202)

    def _checked(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The request as checked (what the job shows) and the `workbench quant` arguments it becomes; 400 on the
        first bad field, ModelRefused for a model the policy refuses."""
        model = body.get("model")
        reference = model_reference(model, self.state)
        request: dict[str, Any] = {"model": model}
        args = [f"--model={reference}"]
        weights = body.get("weights")
        if weights is not None:
            if weights not in ("trained", "random"):
                raise ApiError(400, f"weights: expected \"trained\" or \"random\", got {weights!r:.100}")
            if model not in builtin_models():
                raise ApiError(400, f"weights: applies to the built-in models ({', '.join(builtin_models())}); "
                                    f"{model!r:.200} brings its own")
            request["weights"] = weights
            args.append(f"--weights={weights}")
        formats = body.get("formats")
        if formats is not None:
            request["formats"] = _specs("formats", formats, 1, MAX_FORMATS, _format)
            args.append("--formats=" + ",".join(request["formats"]))
        recipes = body.get("recipes")
        if recipes is not None:
            request["recipes"] = _specs("recipes", recipes, 0, MAX_RECIPES, _recipe)
            args += [f"--quant={recipe}" for recipe in request["recipes"]]
        budget = body.get("budget")
        if budget is not None and budget != "":
            request["budget"] = _budget(budget)
            args.append(f"--budget={request['budget']}")
        device = body.get("device")
        if device is not None:
            request["device"] = _device(device)
            args.append(f"--device={device}")
        for name, high in (("batch", MAX_BATCH), ("seq", MAX_SEQ)):
            value = body.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                    raise ApiError(400, f"{name}: expected a whole number from 1 to {high:,}, got {value!r:.100}")
                request[name] = value
                args.append(f"--{name}={value}")
        measure = body.get("measure")
        if measure is not None:
            if not isinstance(measure, bool):
                raise ApiError(400, f"measure: expected true or false, got {measure!r:.100}")
            request["measure"] = measure
            args.append("--measure" if measure else "--no-measure")
        return request, args


class QuantViewHandler(QuantRoute):
    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        """The lab's views of a succeeded quantization job as a Bokeh json_item, laid out `width` pixels wide."""
        width = self.query_int("width", *WIDTHS, "pixels")
        self.folders.prune(self.state)
        job, folder = self.state.jobs.get(job_id), self.folders.of(job_id)
        if job is None or "quant" not in job.request:
            raise ApiError(404, f"no quantization job {job_id!r} (jobs last as long as the server)")
        if job.status != "succeeded" or folder is None:
            raise ApiError(409, f"quantization job {job_id!r} has not succeeded ({job.status}): no views to draw")
        self.reply({"job": job_id, "item": await self.in_thread(draw_lab, folder, width)})


def draw_lab(folder: Path, width: int | None) -> dict[str, Any]:
    """The json_item of `quant_view` of the lab's tables kept in `folder` (`workbench quant --tables`), `width`
    pixels wide (None: the view's default)."""
    from bokeh.embed import json_item

    from workbench.quant.results import load_results
    from workbench.views.quant import quant_view

    lab = load_results(folder)
    sized = {} if width is None else {"width": width}
    return json_item(quant_view(lab.about, lab.recipes, lab.sensitivity, device=lab.device, **sized))


def builtin_models() -> list[str]:
    """The names of the built-in models (what a job may always load)."""
    from workbench.models.registry import BUILTINS

    return list(BUILTINS)


def model_reference(model: Any, state: ServerState) -> str:
    """The model reference a job gets for the body's `model`: a name `load_model` knows, as the server's policy
    allows it (400 naming the field otherwise; ModelRefused for one the policy refuses)."""
    from workbench.models.registry import model_source

    if not is_word(model) or model.startswith("-"):
        raise ApiError(400, f"model: expected a model name (a built-in: {', '.join(builtin_models())}), "
                            f"got {model!r:.200}")
    if model_source(model, state.base) is None:
        raise ApiError(400, f"model: {model!r:.200} names no model (a built-in: {', '.join(builtin_models())}; "
                            "or hf:, hf-config:, torchvision:, timm:, a factory or a model file the server allows)")
    return state.policy.checked_model(model)


def _specs(name: str, values: Any, fewest: int, most: int, check: Any) -> list[str]:
    """A list of `fewest` to `most` distinct texts, each stripped and passed through `check` (400 otherwise)."""
    if not isinstance(values, list) or not fewest <= len(values) <= most:
        raise ApiError(400, f"{name}: expected a list of {fewest} to {most}, got {values!r:.200}")
    texts = []
    for value in values:
        if not is_word(value):
            raise ApiError(400, f"{name}: expected texts (at most {MAX_TEXT} characters), got {value!r:.100}")
        texts.append(check(value.strip()))
    if len(set(texts)) < len(texts):
        raise ApiError(400, f"{name}: one is named more than once in {texts!r:.200}")
    return texts


def _format(text: str) -> str:
    """A format spec as `--formats` takes it (`fp8-e4m3/channel`), checked by `parse_spec`."""
    from workbench.quant.formats import parse_spec

    if "," in text or _SPACE_OR_CONTROL.search(text):
        raise ApiError(400, f"formats: {text!r:.100} is one format per item (no commas or spaces)")
    try:
        parse_spec(text)
    except WorkbenchError as exc:
        raise ApiError(400, f"formats: {exc}") from exc
    return text


def _recipe(text: str) -> str:
    """A recipe as `--quant` takes it (`linear.weight=nvfp4,kv=fp8-e4m3/head`), checked by `parse_recipe`."""
    from workbench.quant.recipe import parse_recipe

    compact = "".join(text.split())
    if _SPACE_OR_CONTROL.search(compact):
        raise ApiError(400, f"recipes: {text!r:.100} has control characters")
    try:
        parse_recipe(compact)
    except WorkbenchError as exc:
        raise ApiError(400, f"recipes: {exc}") from exc
    return compact


def _budget(value: Any) -> str:
    """An error budget as `--budget` reads it (`sqnr=30`, `kl=0.01`, or both)."""
    from workbench.quant.results import parse_budget

    if not is_word(value):
        raise ApiError(400, f"budget: expected sqnr=DB and/or kl=NATS, e.g. sqnr=30, got {value!r:.100}")
    text = "".join(value.split())
    try:
        parse_budget(text)
    except WorkbenchError as exc:
        raise ApiError(400, f"budget: {str(exc).removeprefix('--budget ')}") from exc
    return text


def _device(value: Any) -> str:
    """A device of the hardware table (the recipes' projected time is for it)."""
    from workbench.hardware import list_devices

    names = list_devices()
    if value not in names:
        raise ApiError(400, f"device: expected a device of the hardware table ({', '.join(names)}), got {value!r:.100}")
    return value


def is_word(value: Any) -> bool:
    """Whether `value` is a non-empty text of at most MAX_TEXT printable characters (one command-line word)."""
    return isinstance(value, str) and bool(value.strip()) and len(value) <= MAX_TEXT and value.isprintable()


def quant_command(args: list[str], folder: Path) -> list[str]:
    """The command line of a quantization job: the CLI run by the server's interpreter, its tables into `folder`,
    its result as JSON on stdout."""
    return [sys.executable, "-m", "workbench", "quant", *args, "--json", f"--tables={folder}"]


def quant_handlers(state: ServerState) -> list[tuple[str, type, dict]]:
    """The routes of this module (relative to the server's base URL) with their handlers, sharing one
    `QuantFolders`."""
    common = {"state": state, "folders": QuantFolders()}
    return [("workbench/api/quant", QuantHandler, common),
            (r"workbench/api/quant/(?P<job_id>[^/]+)/view", QuantViewHandler, common)]
