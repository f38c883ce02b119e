"""The REST API under `<base_url>/workbench/api/`: JSON in and out, errors as `{"message": ...}`.

    GET    runs                 runs and experiments of the traces root (the rows of `workbench ls --json`)
    GET    runs/<id>            one run's summary (`workbench show --json`; `?top=N` rows per op table)
    GET    runs/<id>/dashboard  {"run", "item"}: Bokeh `json_item` of the run's dashboard (`?width=N` pixels)
    DELETE runs/<id>            delete the run (`workbench rm`)
    POST   compare              {"runs": [ids], "width"?: N} -> {"runs", "item"}: json_item of their comparison
    GET    jobs                 every capture job, oldest first
    POST   jobs                 capture options (see `capture_request`) -> 202 and the job's status
    GET    jobs/<id>            a job's status: progress, log tail, exit code, the CLI's JSON result
    DELETE jobs/<id>            cancel a job; returns its final status
    GET    config               {"traces_root", "default_traces_root"}: the folder the API reads and captures into
    PUT    config               {"traces_root": path} changes it for this server ("" restores the configured one)

Run ids come from users: each must pass `is_valid_run_id` (400 otherwise) and is opened with
`allow_paths=False`, so it resolves strictly inside the traces root (symlinks included). Every verb is
`@tornado.web.authenticated`; analyses and views run in a worker thread, off the event loop.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import tornado.web
from jupyter_server.base.handlers import APIHandler
from tornado.ioloop import IOLoop

from workbench.analysis.summary import run_row
from workbench.errors import BundleError, WorkbenchError
from workbench.server.capture_request import capture_args
from workbench.server.jobs import Job, JobManager
from workbench.trace.bundle import Bundle, delete_bundle, is_valid_run_id, json_safe, list_bundles, open_bundle
from workbench.trace.experiment import list_experiments

T = TypeVar("T")


WIDTHS = (400, 4000)
"""Smallest and largest layout width (pixels) a client may ask for, so a view is neither unreadable nor huge."""


@dataclass
class ServerState:
    """What the handlers share: the traces root, the job manager, and how a capture job is started.

    `capture_command(args)` is the full command line of `workbench capture args` (into the current `root`);
    jobs run in `cwd`. `root` changes with `PUT config` (the JupyterLab setting); `default_root` is the
    configured one, which `PUT config` with an empty path restores.
    """

    root: Path
    jobs: JobManager
    capture_command: Callable[[list[str]], list[str]]
    cwd: Path | None = None
    default_root: Path | None = None

    def __post_init__(self) -> None:
        if self.default_root is None:
            self.default_root = self.root


class ApiError(tornado.web.HTTPError):
    """An HTTP error whose message goes to the client as `{"message": ...}` (and safely into the log)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(status_code, "%s", message)


class WorkbenchHandler(APIHandler):
    """Base of the API handlers: JSON replies and errors, request bodies, run lookup, worker threads."""

    state: ServerState

    def initialize(self, state: ServerState) -> None:
        self.state = state

    def reply(self, value: Any, status: int = 200) -> None:
        """Finish with `value` as JSON (it must already be plain JSON data)."""
        self.set_status(status)
        self.finish(json.dumps(value, allow_nan=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Every error as `{"message": ...}`: the HTTPError's message, or the exception's for a bug."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, tornado.web.HTTPError):
            message = (exc.log_message % exc.args if exc.args else exc.log_message) or exc.reason
        elif exc is not None:
            message = f"internal error: {type(exc).__name__}: {exc}"
        else:
            message = None
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message or self._reason}))

    def json_body(self) -> Any:
        """The request body's JSON value (null when empty; 400 when it is not JSON)."""
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}") from exc

    def body_object(self, allowed: tuple[str, ...]) -> dict[str, Any]:
        """The request body as a JSON object with only the `allowed` keys (400 otherwise)."""
        body = self.json_body()
        if not isinstance(body, dict):
            raise ApiError(400, f"the body must be a JSON object with {', '.join(allowed)}")
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise ApiError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; valid: {', '.join(allowed)}")
        return body

    def open_run(self, run_id: str) -> Bundle:
        """The bundle `run_id` names inside the traces root: 400 for an invalid id, 404 when there is none,
        422 when the entry exists but is no readable bundle inside the root (e.g. a symlink out of it)."""
        if not is_valid_run_id(run_id):
            raise ApiError(400, f"{run_id!r} is not a run id (letters, digits, '_', '-' and '.')")
        try:
            return open_bundle(run_id, self.state.root, allow_paths=False)
        except BundleError as exc:
            raise ApiError(422 if os.path.lexists(self.state.root / run_id) else 404, str(exc)) from exc

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread (analyses and Bokeh layouts take seconds on big traces);
        a WorkbenchError it raises becomes a 422 with its message."""
        try:
            return await IOLoop.current().run_in_executor(None, fn, *args)
        except WorkbenchError as exc:
            raise ApiError(422, str(exc)) from exc


class RunsHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        """Runs and experiments, oldest first; unreadable entries listed under `problems`."""
        self.reply(await self.in_thread(_listing, self.state.root))


def _listing(root: Path) -> dict[str, Any]:
    """The runs as the rows of `workbench ls --json` (one function, so both surfaces agree) and the experiments."""
    problems: list[dict[str, str]] = []

    def note(path: Path, message: str) -> None:
        problems.append({"entry": path.name, "message": message})

    runs = [run_row(bundle.run_id, bundle.info) for bundle in list_bundles(root, on_problem=note)]
    experiments = [{"experiment": e.experiment_id, "model": e.info.get("model"), "reference": e.info.get("reference"),
                    "runs": e.run_ids, "variants": e.info.get("variants"), "failed": e.info.get("failed"),
                    "created": e.info.get("created")}
                   for e in list_experiments(root, on_problem=note)]
    return json_safe({"root": str(root), "runs": runs, "experiments": experiments, "problems": problems})


class RunHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """The run's summary (`workbench show --json`)."""
        from workbench.analysis.summary import run_summary

        top = self.get_query_argument("top", "10")
        if not top.isdigit() or int(top) < 1:
            raise ApiError(400, f"top must be a positive integer, got {top!r}")
        bundle = self.open_run(run_id)
        self.reply(json_safe(await self.in_thread(run_summary, bundle, int(top))))

    @tornado.web.authenticated
    async def delete(self, run_id: str) -> None:
        """Delete the run (`workbench rm`)."""
        bundle = self.open_run(run_id)
        await self.in_thread(lambda: delete_bundle(bundle.run_id, self.state.root, allow_paths=False))
        self.reply({"deleted": bundle.run_id})


class DashboardHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """The run's dashboard as a Bokeh json_item (embed with `Bokeh.embed.embed_item`)."""
        from workbench.views.dashboard import dashboard

        width = self.get_query_argument("width", None)
        sized = _sized(int(width) if width is not None and width.isdigit() else width)
        bundle = self.open_run(run_id)
        self.reply({"run": bundle.run_id, "item": await self.in_thread(lambda: _item(dashboard(bundle, **sized)))})


class CompareHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        """The comparison of two or more runs, `{"runs": [ids], "width": pixels}`, as a Bokeh json_item."""
        from workbench.views.compare import compare

        body = self.body_object(("runs", "width"))
        ids = body.get("runs")
        if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(i, str) for i in ids):
            raise ApiError(400, f"runs: expected a list of two or more run ids, got {ids!r}")
        if len(set(ids)) < len(ids):
            raise ApiError(400, f"runs: a run is named more than once in {ids!r}")
        sized = _sized(body.get("width"))
        bundles = [self.open_run(run_id) for run_id in ids]
        self.reply({"runs": ids, "item": await self.in_thread(lambda: _item(compare(bundles, **sized)))})


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
    def post(self) -> None:
        """Start a capture job (or queue it when the job slots are taken): 202 and its status."""
        body = self.json_body()
        try:
            args = capture_args(body)
        except WorkbenchError as exc:
            raise ApiError(400, str(exc)) from exc
        jobs = self.state.jobs
        job = jobs.submit(self.state.capture_command(args), request=body, cwd=self.state.cwd)
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


class ConfigHandler(WorkbenchHandler):
    """The traces root of the API, which the JupyterLab panel sets from its "traces folder" setting."""

    def _config(self) -> dict[str, str]:
        return {"traces_root": str(self.state.root), "default_traces_root": str(self.state.default_root)}

    @tornado.web.authenticated
    def get(self) -> None:
        self.reply(self._config())

    @tornado.web.authenticated
    def put(self) -> None:
        """Read and capture into `traces_root` from now on: a relative path is taken from the server's root_dir,
        an empty one restores the configured root. It must lie inside the server's root_dir (symlinks
        resolved), so the panel cannot point the API at other folders; a path that exists must be a folder,
        a missing one is created by the first capture."""
        value = self.body_object(("traces_root",)).get("traces_root")
        if not isinstance(value, str):
            raise ApiError(400, f"traces_root: expected a path (a string, empty for the default), got {value!r}")
        if value.strip():
            chosen = ((self.state.cwd or Path.cwd()) / Path(value.strip()).expanduser()).absolute()
        else:
            assert self.state.default_root is not None  # set by ServerState.__post_init__
            chosen = self.state.default_root
        if chosen.exists() and not chosen.is_dir():
            raise ApiError(400, f"traces_root: {chosen} exists and is not a folder")
        base = (self.state.cwd or Path.cwd()).resolve()
        if chosen != self.state.default_root and not chosen.resolve().is_relative_to(base):
            raise ApiError(400, f"traces_root: {chosen} is outside the server's root folder {base}; "
                                "the panel may only choose folders inside it")
        self.state.root = chosen
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
        ("config", ConfigHandler),
    ]
    return [(f"workbench/api/{path}", handler, {"state": state}) for path, handler in routes]
