"""The REST API under `<base_url>/workbench/api/`: JSON in and out, errors as `{"message": ...}`.

    GET    runs                 runs and experiments of the traces root (the rows of `workbench ls --json`);
                                on a URL root, after refreshing its mirror (503 when the URL cannot be read)
    GET    runs/<id>            one run's summary (`workbench show --json`; `?top=N` rows per op table)
    GET    runs/<id>/dashboard  {"run", "item"}: Bokeh `json_item` of the run's dashboard (`?width=N` pixels),
                                after the views its kind adds (a generation run's)
    GET    runs/<id>/export     `?format=perfetto|chrome`: the run as a trace file for Perfetto UI or
                                chrome://tracing, an attachment (`export_handlers`)
    DELETE runs/<id>            delete the run (`workbench rm`); for a link to a run, the link only
    POST   compare              {"runs": [ids], "width"?: N, "baseline"?: id} -> {"runs", "baseline", "item"}:
                                json_item of their comparison (against `baseline`, one of `runs`; without it the
                                reference variant when one ran it, else the first run), after the views their kind
                                adds (generation runs, the ranks of a job)
    GET    jobs                 every capture job, oldest first
    POST   jobs                 capture options (see `capture_request`) -> 202 and the job's status; checked before
                                it is queued (400, nothing written: a device this machine lacks, a value like an
                                option; 403: a model the server's policy refuses; 429: the queue is full; 409: a
                                URL root)
    GET    jobs/<id>            a job's status: progress, log tail, exit code, the CLI's JSON result
    DELETE jobs/<id>            cancel a job; returns its final status
    GET    capture/options      the capture options a job takes (`capture_fields.capture_options`): each with its
                                type, default, bounds and choices; the variants, profilers, devices and models
    GET    config               {"traces_root", "default_traces_root"}: the folder the API reads and captures into,
                                relative to the server's root_dir (a URL root shown as its URL; see `state.shown`)
    PUT    config               {"traces_root": path} changes it for this server ("" restores the configured one)

Beside these: the timeline's span routes (`span_handlers`, docs/api-spans.md), imports, uploads, deletions and SQL
(`manage_handlers`), serving jobs (`serve_handlers`: `POST serve`), the quantization lab (`quant_handlers`:
`POST quant`, `GET quant/<job>/view`), the op replay of a run (`replay_handlers`: `POST replay`,
`GET replay/<job>/view`) and the accelerator projection of a model, a run or a model set (`project_handlers`:
`GET project/options`, `POST project`, `GET project/<job>/view`).

Everything a request carries is untrusted: run ids must pass `is_valid_run_id` (400 otherwise) and are
opened with `allow_paths=False`, so they resolve strictly inside the traces root (symlinks included);
bodies must be JSON nested at most `MAX_BODY_DEPTH` deep, numbers plain ASCII digits within bounds;
the panel's traces root is re-checked at every use (see `state`). A URL traces root is read through its
mirror and never written: capture jobs, imports and deletions there are refused (409). Every reply and
error goes out with the server's paths redacted, in one step (`WorkbenchHandler.reply`/`write_error`, see
`redact`): paths inside the traces root relative to it, any other path of the server as `<server>`; the
fields naming a traces root (`GET runs`' `root`, `config`) name it relative to the server's root_dir.
Every verb is `@tornado.web.authenticated`; analyses and views run in a worker thread, off the event loop.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import tornado.web
from jupyter_server.base.handlers import APIHandler
from tornado.ioloop import IOLoop

from workbench.analysis.summary import run_row
from workbench.errors import BundleError, WorkbenchError
from workbench.server.capture_fields import capture_options
from workbench.server.capture_request import capture_args
from workbench.server.jobs import Job, QueueFull
from workbench.server.model_policy import ModelRefused
from workbench.server.redact import Redactor
from workbench.server.state import MirrorUnavailable, RootEscaped, RootReadOnly, RootRefused, ServerState
from workbench.trace.store.bundle import (
    Bundle,
    delete_bundle,
    is_valid_run_id,
    json_safe,
    list_bundles,
    open_bundle,
    resolve_inside,
)
from workbench.trace.store.experiment import list_experiments
from workbench.trace.store.mirror_bundle import remote_bundle

T = TypeVar("T")


WIDTHS = (400, 4000)
"""Smallest and largest layout width (pixels) a client may ask for, so a view is neither unreadable nor huge."""
MAX_TOP = 10_000
"""Most rows per op table a client may ask a summary for."""
MAX_BODY_DEPTH = 32
"""Deepest nesting of arrays and objects a request body may have (the API's own bodies need 3)."""
_DIGITS = re.compile(r"[0-9]{1,9}")
"""A query number: ASCII digits only (`str.isdigit` also takes `²`, which `int` refuses)."""


class ApiError(tornado.web.HTTPError):
    """An HTTP error whose message goes to the client as `{"message": ...}` (and safely into the log)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(status_code, "%s", message)


def distinct_choices(name: str, value: Any, choices: Sequence[str], unknown: str, hint: str = "") -> list[str]:
    """`value` as a list of 1 to len(`choices`) distinct items of `choices`; otherwise a 400 naming the field
    `name` (an item not among them is said to be `unknown`, followed by the choices and `hint`)."""
    if (not isinstance(value, list) or not 1 <= len(value) <= len(choices)
            or not all(isinstance(item, str) for item in value)):
        raise ApiError(400, f"{name}: expected a list of 1 to {len(choices)} of {', '.join(choices)}, "
                            f"got {value!r:.200}")
    strangers = [item for item in value if item not in choices]
    if strangers:
        raise ApiError(400, f"{name}: {', '.join(map(repr, strangers)):.200} {unknown}; choose from "
                            f"{', '.join(choices)}{hint}")
    if len(set(value)) < len(value):
        raise ApiError(400, f"{name}: one is named more than once in {value!r:.200}")
    return list(value)


class WorkbenchHandler(APIHandler):
    """Base of the API handlers: JSON replies and errors, request bodies, run lookup, worker threads."""

    state: ServerState

    def initialize(self, state: ServerState) -> None:
        self.state = state

    def reply(self, value: Any, status: int = 200) -> None:
        """Finish with `value` as JSON (it must already be plain JSON data), its server paths redacted."""
        self.set_status(status)
        self.finish(json.dumps(self.redactor().value(value), allow_nan=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as `{"message": ...}`: the HTTPError's message, or the exception's for a bug;
        either way with the server's paths redacted."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, tornado.web.HTTPError):
            message = (exc.log_message % exc.args if exc.args else exc.log_message) or exc.reason
        elif exc is not None:
            message = f"internal error: {type(exc).__name__}: {exc}"
        else:
            message = None
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": self.redacted(message or self._reason)}))

    def redactor(self) -> Redactor:
        """The one redaction step of every reply and error (`redact`): paths relative to the traces root,
        other paths of the server as `<server>`."""
        return Redactor(self.state.root)

    def redacted(self, message: str) -> str:
        """`message` without the server's absolute paths (see `redactor`)."""
        return self.redactor().text(message)

    def json_body(self) -> Any:
        """The request body's JSON value (null when empty); 400 when it is not JSON, uses NaN or Infinity,
        or nests deeper than MAX_BODY_DEPTH."""
        too_deep = ApiError(400, f"the body nests arrays and objects more than {MAX_BODY_DEPTH} levels deep")
        try:
            value = json.loads(self.request.body or b"null", parse_constant=_refuse_constant)
        except RecursionError as exc:
            raise too_deep from exc
        except ValueError as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}") from exc
        if _nesting(value) > MAX_BODY_DEPTH:
            raise too_deep
        return value

    def body_object(self, allowed: tuple[str, ...]) -> dict[str, Any]:
        """The request body as a JSON object with only the `allowed` keys (400 otherwise)."""
        body = self.json_body()
        if not isinstance(body, dict):
            raise ApiError(400, f"the body must be a JSON object with {', '.join(allowed)}")
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise ApiError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; valid: {', '.join(allowed)}")
        return body

    def query_int(self, name: str, low: int, high: int, unit: str) -> int | None:
        """The query argument `name` as an integer from `low` to `high` (None when absent; 400 otherwise)."""
        text = self.get_query_argument(name, None)
        if text is None:
            return None
        if not _DIGITS.fullmatch(text) or not low <= int(text) <= high:
            raise ApiError(400, f"{name}: expected an integer number of {unit} from {low} to {high}, got {text!r}")
        return int(text)

    def succeeded_job(self, job_id: str, key: str, noun: str) -> Job:
        """The job `job_id` of the route whose request carries `key` (404 when there is none: jobs last as long as
        the server), once it has succeeded with a result to draw (409 before)."""
        job = self.state.jobs.get(job_id)
        if job is None or key not in job.request:
            raise ApiError(404, f"no {noun} job {job_id!r} (jobs last as long as the server)")
        if job.status != "succeeded" or not isinstance(job.result, dict):
            raise ApiError(409, f"{noun} job {job_id!r} has not succeeded ({job.status}): no view to draw")
        return job

    def traces_root(self) -> Path:
        """The traces root for this request; 409 when the panel's choice leads outside root_dir now."""
        try:
            return self.state.checked_root()
        except RootEscaped as exc:
            raise ApiError(409, str(exc)) from exc

    def writable_root(self) -> Path:
        """The traces root for a request that writes into it; 409 when it is a URL root, which the panel reads
        only, or when the panel's choice leads outside root_dir now."""
        try:
            return self.state.writable_root()
        except (RootReadOnly, RootEscaped) as exc:
            raise ApiError(409, str(exc)) from exc

    async def listed_root(self) -> Path:
        """The traces root for a listing: a URL root's mirror is refreshed first (at most every
        `state.MIRROR_REFRESH_S`); 503 naming the URL when it cannot be read."""
        root = self.traces_root()
        if self.state.root_url is not None:
            try:
                await IOLoop.current().run_in_executor(None, self.state.refresh_mirror)
            except MirrorUnavailable as exc:
                raise ApiError(503, str(exc)) from exc
        return root

    def open_run(self, run_id: str) -> Bundle:
        """The bundle `run_id` names inside the traces root: 400 for an invalid id, 404 when there is none,
        422 when the entry exists but is no readable bundle inside the root (e.g. a symlink out of it)."""
        if not is_valid_run_id(run_id):
            raise ApiError(400, f"{run_id!r} is not a run id (letters, digits, '_', '-' and '.')")
        root = self.traces_root()
        if not os.path.lexists(root / run_id):
            raise ApiError(404, f"no run {run_id!r} in the traces root")
        try:
            resolve_inside(root, root / run_id, f"run {run_id!r}")
        except BundleError as exc:  # its own message would name where the link leads
            raise ApiError(422, f"run {run_id!r} leads outside the traces root (or nowhere); refused") from exc
        try:
            return open_bundle(run_id, root, allow_paths=False)
        except BundleError as exc:
            raise ApiError(422, str(exc)) from exc

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread (analyses and Bokeh layouts take seconds on big traces);
        a WorkbenchError it raises becomes a 422 with its message."""
        try:
            return await IOLoop.current().run_in_executor(None, fn, *args)
        except WorkbenchError as exc:
            raise ApiError(422, str(exc)) from exc


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _nesting(value: Any) -> int:
    """How deep `value` nests arrays and objects (0 for a scalar), counted without recursion; the count
    stops past MAX_BODY_DEPTH."""
    deepest, pending = 0, [(value, 1)]
    while pending and deepest <= MAX_BODY_DEPTH:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


class RunsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        """Runs and experiments, oldest first; unreadable entries listed under `problems`."""
        root = await self.listed_root()
        self.reply(await self.in_thread(_listing, root, self.state.shown(root), self.redacted))


def _listing(root: Path, shown: str, redacted: Callable[[str], str]) -> dict[str, Any]:
    """The runs as the rows of `workbench ls --json` (one function, so both surfaces agree) and the experiments;
    `root` appears as `shown` (a URL root's URL), the messages of `problems` pass through `redacted` (they may
    name where a link leads)."""
    problems: list[dict[str, str]] = []

    def note(path: Path, message: str) -> None:
        problems.append({"entry": path.name, "message": redacted(message)})

    runs = [run_row(bundle.run_id, bundle.info) for bundle in list_bundles(root, on_problem=note)]
    experiments = [{"experiment": e.experiment_id, "model": e.info.get("model"), "reference": e.info.get("reference"),
                    "runs": e.run_ids, "variants": e.info.get("variants"), "failed": e.info.get("failed"),
                    "created": e.info.get("created")}
                   for e in list_experiments(root, on_problem=note)]
    return json_safe({"root": shown, "runs": runs, "experiments": experiments, "problems": problems})


class RunHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """The run's summary (`workbench show --json`)."""
        from workbench.analysis.summary import run_summary

        top = self.query_int("top", 1, MAX_TOP, "rows")
        bundle = self.open_run(run_id)
        self.reply(json_safe(await self.in_thread(run_summary, bundle, 10 if top is None else top)))

    @tornado.web.authenticated
    async def delete(self, run_id: str) -> None:
        """Delete the run (`workbench rm`). An entry that is a link (to a run inside the root) loses the link
        only: the run it leads to has its own entry and id, and stays. Refused (409) on a URL root."""
        root = self.writable_root()
        bundle = self.open_run(run_id)
        entry = root / run_id
        if entry.is_symlink():
            await self.in_thread(_unlink, entry, run_id)
        else:
            await self.in_thread(functools.partial(delete_bundle, run_id, root, allow_paths=False))
        self.reply({"deleted": bundle.run_id})


def _unlink(link: Path, run_id: str) -> None:
    try:
        link.unlink()
    except OSError as exc:
        raise BundleError(f"cannot delete the link {run_id!r}: {exc.strerror}") from exc


class DashboardHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """The run's dashboard as a Bokeh json_item (embed with `Bokeh.embed.embed_item`), after the views its
        kind adds (`views.run_kinds`)."""
        from workbench.views.dashboard import dashboard
        from workbench.views.run_kinds import with_kind_views

        sized = _sized(self.query_int("width", *WIDTHS, "pixels"))
        bundle = self.open_run(run_id)
        _check_fits([bundle])
        self.reply({"run": bundle.run_id, "item": await self.in_thread(
            lambda: _item(with_kind_views(dashboard(bundle, **sized), [bundle], "dashboard", **sized)))})


class CompareHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        """The comparison of two or more runs, `{"runs": [ids], "width": pixels, "baseline": id}`, as a Bokeh
        json_item, after the views their kind adds (`views.run_kinds`: the ranks view of a job's ranks; alone for a
        large job)."""
        from workbench.views.experiments import experiments_view
        from workbench.views.run_kinds import runs_layout

        body = self.body_object(("runs", "width", "baseline"))
        ids, baseline = body.get("runs"), body.get("baseline")
        if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(i, str) for i in ids):
            raise ApiError(400, f"runs: expected a list of two or more run ids, got {ids!r}")
        if len(set(ids)) < len(ids):
            raise ApiError(400, f"runs: a run is named more than once in {ids!r}")
        if baseline is not None and baseline not in ids:
            raise ApiError(400, f"baseline: expected one of the compared runs ({', '.join(ids)}), got {baseline!r}")
        sized = _sized(body.get("width"))
        bundles = [self.open_run(run_id) for run_id in ids]
        # a job's ranks at a URL are read where they lie (`views.run_kinds`): only local runs are read here
        _check_fits([bundle for bundle in bundles if remote_bundle(bundle.path) is None])
        self.reply({"runs": ids, "baseline": baseline, "item": await self.in_thread(lambda: _item(runs_layout(
            lambda: experiments_view(bundles, baseline=baseline, **sized), bundles, "compare", **sized)))})


def _check_fits(bundles: list[Bundle]) -> None:
    """Payload Too Large (413), in one line, when drawing the runs' dashboards would take more than half the
    memory free now: the server refuses what it cannot hold rather than growing until it is killed."""
    from workbench.machine import available_memory
    from workbench.views.dashboard import dashboard_bytes

    need, free = sum(dashboard_bytes(bundle) for bundle in bundles), available_memory()
    if need > free // 2:
        events = sum(bundle.event_count for bundle in bundles)
        runs = ("run " if len(bundles) == 1 else "runs ") + ", ".join(repr(bundle.run_id) for bundle in bundles)
        raise ApiError(413, f"{runs}: drawing needs about {_size(need)} ({events:,} events) and this server has "
                            f"{_size(free)} free: open it with `workbench report` on a larger machine, or import "
                            "a shorter window of the trace")


def _size(size: int) -> str:
    """A memory size for a message: GiB, or MiB under one GiB."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _sized(value: Any) -> dict[str, int]:
    """The view's `width` argument from a client's layout width in pixels: none when `value` is None (the view's
    default), else an integer within `WIDTHS` (Bad Request otherwise)."""
    if value is None:
        return {}
    low, high = WIDTHS
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"width: expected an integer number of pixels from {low} to {high}, got {value!r}")
    return {"width": value}


def _item(layout: Any) -> dict[str, Any]:
    from bokeh.embed import json_item

    return json_item(layout)


class JobsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        """Every job the server knows, oldest first."""
        jobs = self.state.jobs
        self.reply({"jobs": [jobs.describe(job) for job in jobs.jobs()]})

    @tornado.web.authenticated
    async def post(self) -> None:
        """Start a capture job (or queue it when the job slots are taken): 202 and its status. The request is
        checked in a worker thread (its first check imports torch). Refused (409) on a URL root."""
        body = self.json_body()
        try:
            args = await IOLoop.current().run_in_executor(None, capture_args, body, self.state.policy)
        except ModelRefused as exc:
            raise ApiError(403, str(exc)) from exc
        except WorkbenchError as exc:  # CaptureRequestError, LimitError
            raise ApiError(400, str(exc)) from exc
        root, jobs = self.writable_root(), self.state.jobs
        try:  # the job checks the panel's root again as it starts: it may wait in the queue a long time
            job = jobs.submit(self.state.capture_command(args), request=body, cwd=self.state.cwd,
                              check=functools.partial(self.state.check_root, root))
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from exc
        self.set_header("Location", self.request.path.rstrip("/") + "/" + job.job_id)
        self.reply(json_safe(jobs.describe(job)), status=202)


class JobHandler(WorkbenchHandler):
    def _job(self, job_id: str) -> Job:
        job = self.state.jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"no job {job_id!r} (jobs last as long as the server)")
        return job

    @tornado.web.authenticated
    def get(self, job_id: str) -> None:
        """The job's status, progress, log tail and, once it succeeded, the CLI's JSON result."""
        self.reply(json_safe(self.state.jobs.describe(self._job(job_id))))

    @tornado.web.authenticated
    async def delete(self, job_id: str) -> None:
        """Cancel the job (409 if it has already ended); replies once it has stopped."""
        job = self._job(job_id)
        if job.is_finished:
            raise ApiError(409, f"job {job_id!r} has already ended ({job.status})")
        self.reply(json_safe(self.state.jobs.describe(await self.state.jobs.cancel(job))))


class CaptureOptionsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        """The options a capture job takes, for a client's capture form (`capture_fields.capture_options`)."""
        self.reply(json_safe(await self.in_thread(capture_options)))


class ConfigHandler(WorkbenchHandler):
    """The traces root of the API, which the JupyterLab panel sets from its "traces folder" setting."""

    def _config(self) -> dict[str, str]:
        """The traces roots as clients see them (`ServerState.shown`: a URL root by its URL)."""
        state = self.state
        assert state.default_root is not None  # set by ServerState.__post_init__
        return {"traces_root": state.shown(state.root), "default_traces_root": state.shown(state.default_root)}

    @tornado.web.authenticated
    def get(self) -> None:
        self.reply(self._config())

    @tornado.web.authenticated
    def put(self) -> None:
        """Read and capture into `traces_root` from now on: a relative path is taken from the server's root_dir,
        an empty one restores the configured root. It must lie inside the server's root_dir (symlinks
        resolved), so the panel cannot point the API at other folders (nor at a URL); a path that exists must be a
        folder, a missing one is created by the first capture."""
        value = self.body_object(("traces_root",)).get("traces_root")
        if not isinstance(value, str):
            raise ApiError(400, f"traces_root: expected a path (a string, empty for the default), got {value!r}")
        try:
            self.state.choose_root(value)
        except RootRefused as exc:
            raise ApiError(400, str(exc)) from exc
        self.reply(self._config())


def api_handlers(state: ServerState) -> list[tuple[str, type[WorkbenchHandler], dict[str, Any]]]:
    """The API routes (relative to the server's base URL) with their handlers."""
    run = r"(?P<run_id>[^/]+)"
    routes: list[tuple[str, type[WorkbenchHandler]]] = [
        ("runs", RunsHandler),
        (f"runs/{run}", RunHandler),
        (f"runs/{run}/dashboard", DashboardHandler),
        ("compare", CompareHandler),
        ("jobs", JobsHandler),
        (r"jobs/(?P<job_id>[^/]+)", JobHandler),
        ("capture/options", CaptureOptionsHandler),
        ("config", ConfigHandler),
    ]
    return [(f"workbench/api/{path}", handler, {"state": state}) for path, handler in routes]
