"""The panel's routes for managing runs and querying them, under `<base_url>/workbench/api/`:

    POST   query               {"sql", "runs"?: [ids], "limit"?: N} -> {"columns", "types", "rows", "truncated",
                               "runs"}: one read-only SELECT over the runs (all of the traces root without `runs`;
                               the reply's `runs` are the rows of `GET runs` of those it covered), as
                               `workbench query` runs it (`workbench.analysis.sql`: its own process, the same time
                               and memory limits, DuckDB's settings and catalog functions refused); 400 with the
                               one-line error
    POST   upload?name=FILE    the body is a trace file: streamed into a hidden folder of the traces root (413 over
                               `max_upload_bytes`), then imported by a `workbench import` job -> 202 and the job
    POST   import              {"path": file under the server's root_dir} -> 202 and the `workbench import` job;
                               a path outside root_dir (links resolved) or not a file is refused (400)
    GET    traces/version      {"version"}: changes whenever runs or experiments appear in or vanish from the
                               traces root (a stat of two folders), so the panel polls it instead of the listing;
                               a URL root's mirror is refreshed first, as for `GET runs` (503 when unreadable)
    POST   serve               {"url", "tokenizer", "rate" | "concurrency", "requests", "isl", "osl", ...} -> 202
                               and the `workbench serve --url` job (`serve_handlers`)

Upload and import are refused (409) while the traces root is a URL, which the panel reads only.

Import jobs are capture jobs' siblings in the job list (`GET jobs`): their `request` is `{"import": [names]}` and
their result the run ids. An uploaded file is removed once its job ends; the hidden folder it waits in carries
the server's process in its name, so the next writer clears it if the server is killed (`trace.scratch`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import sys
from pathlib import Path
from typing import IO, Any

import tornado.web

from workbench.analysis.sql import DEFAULT_LIMIT, DEFAULT_TIMEOUT_S, MAX_LIMIT, QueryError, run_query
from workbench.analysis.summary import run_row
from workbench.errors import is_disk_full
from workbench.server.handlers import ApiError, WorkbenchHandler
from workbench.server.jobs import QueueFull
from workbench.server.serve_handlers import serve_handlers
from workbench.server.state import ServerState
from workbench.trace.store.bundle import EXPERIMENTS_DIR, RUN_JSON, json_safe, list_bundles
from workbench.trace.store.scratch import make_scratch_dir, remove_entry

MAX_UPLOAD_BYTES = 2 << 30
"""Default limit on one uploaded trace (2 GiB); the server's `max_upload_mb` setting changes it."""
MAX_SQL_CHARS = 100_000
"""Longest query text."""
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9 ._+()\[\]-]{0,254}")
"""An uploaded file's name: a plain name (no folders, not hidden), kept in the run as the file it came from."""


class QueryHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        """Run one SELECT over the named runs (every run without `runs`); see the module docstring."""
        body = self.body_object(("sql", "runs", "limit"))
        sql, ids, limit = body.get("sql"), body.get("runs"), body.get("limit", DEFAULT_LIMIT)
        if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_SQL_CHARS:
            raise ApiError(400, f"sql: expected one SELECT statement (at most {MAX_SQL_CHARS} characters)")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ApiError(400, f"limit: expected an integer number of rows from 1 to {MAX_LIMIT}, got {limit!r}")
        if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids)):
            raise ApiError(400, f"runs: expected a list of run ids (or no key for every run), got {ids!r}")
        bundles = [self.open_run(run_id) for run_id in ids] if ids is not None else None
        root = self.traces_root()
        try:
            result = await self.in_thread(_query, root, bundles, sql, limit)
        except ApiError as exc:
            if isinstance(exc.__cause__, QueryError):
                raise ApiError(400, str(exc.__cause__)) from exc.__cause__
            raise
        self.reply(result)


def _query(root: Path, bundles: list[Any] | None, sql: str, limit: int) -> dict[str, Any]:
    """The query's rows, and the runs it covered as `GET runs` lists them (the panel names them above the rows)."""
    covered = list_bundles(root) if bundles is None else bundles
    result = run_query(covered, sql, limit=limit, timeout_s=DEFAULT_TIMEOUT_S)
    return {**result.to_json(), "runs": json_safe([run_row(bundle.run_id, bundle.info) for bundle in covered])}


class ImportJobs(WorkbenchHandler):
    """What the import routes share: starting a `workbench import` job into the traces root."""

    def start_import(self, files: list[Path], names: list[str], cleanup: Path | None = None) -> None:
        """Submit the job importing `files` (shown by `names`), reply 202 with it; `cleanup` is removed when it
        ends (or now, if it cannot start)."""
        root = self.writable_root()
        try:
            job = self.state.jobs.submit(import_command(files, root), request={"import": names}, cwd=self.state.cwd,
                                         check=functools.partial(self.state.check_root, root))
        except QueueFull as exc:
            if cleanup is not None:
                remove_entry(cleanup)
            raise ApiError(429, str(exc)) from exc
        if cleanup is not None:
            _remove_when_done(job, cleanup)
        self.set_header("Location", self.reverse_job_url(job.job_id))
        self.reply(json_safe(self.state.jobs.describe(job)), status=202)

    def reverse_job_url(self, job_id: str) -> str:
        return self.request.path.rsplit("/", 1)[0] + "/jobs/" + job_id


def import_command(files: list[Path], root: Path) -> list[str]:
    """The command line of an import job: the CLI run by the server's interpreter, its run ids as JSON."""
    return [sys.executable, "-m", "workbench", "import", *map(str, files), "--json", "--out", str(root)]


_CLEANUPS: set[asyncio.Task[None]] = set()
"""Tasks removing uploads once their jobs end (held so they are not garbage-collected)."""


def _remove_when_done(job: Any, path: Path) -> None:
    async def wait_and_remove() -> None:
        await job.done.wait()
        remove_entry(path)

    task = asyncio.ensure_future(wait_and_remove())
    _CLEANUPS.add(task)
    task.add_done_callback(_CLEANUPS.discard)


@tornado.web.stream_request_body
class UploadHandler(ImportJobs):
    """A trace file streamed into the traces root and imported (module docstring)."""

    max_upload_bytes: int

    def initialize(self, state: ServerState, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> None:
        super().initialize(state)
        self.max_upload_bytes = max_upload_bytes
        self._folder: Path | None = None
        self._file: IO[bytes] | None = None
        self._received = 0
        self._problem: ApiError | None = None

    async def prepare(self) -> None:
        """Before the body arrives: authentication (as `@authenticated` does for other verbs), the name, the
        declared size, and the file to stream into."""
        await super().prepare()
        if not self.current_user:
            raise ApiError(403, "authentication required")
        if self.request.method != "POST":
            return
        name = self.get_query_argument("name", "")
        if not _FILE_NAME.fullmatch(name) or name.endswith((".", " ")):
            raise ApiError(400, f"name: expected the trace's file name (letters, digits, spaces and ._-+()[]), "
                                f"got {name!r:.100}")
        declared = self.request.headers.get("Content-Length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_upload_bytes):
            raise ApiError(413, f"{name}: larger than this server's upload limit "
                                f"({self.max_upload_bytes / 2**20:,.0f} MiB); import it with `workbench import`")
        self.request.connection.set_max_body_size(self.max_upload_bytes)
        root = self.writable_root()
        try:
            root.mkdir(parents=True, exist_ok=True)
            self._folder = make_scratch_dir(root, "tmp", "upload")
            self._file = (self._folder / name).open("wb")
        except OSError as exc:
            self._discard()
            raise _store_error(exc) from exc

    def data_received(self, chunk: bytes) -> None:
        """Append a piece of the body to the file; a problem is kept for `post` to answer (the connection's own
        body limit stops an upload past `max_upload_bytes`)."""
        if self._file is None:
            return
        self._received += len(chunk)
        try:
            self._file.write(chunk)
        except OSError as exc:
            self._discard()
            self._problem = _store_error(exc)

    @tornado.web.authenticated
    def post(self) -> None:
        """Import the uploaded file as a job: 202 and the job."""
        if self._problem is not None:
            raise self._problem
        assert self._file is not None and self._folder is not None  # prepare opened them
        path = Path(self._file.name)
        self._file.close()
        self._file = None
        if self._received == 0:
            self._discard()
            raise ApiError(400, f"{path.name}: the upload is empty")
        folder, self._folder = self._folder, None
        self.start_import([path], [path.name], cleanup=folder)

    def on_finish(self) -> None:
        self._discard()

    def on_connection_close(self) -> None:
        self._discard()  # the client went away mid-upload

    def _discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._folder is not None:
            remove_entry(self._folder)
            self._folder = None


def _store_error(exc: OSError) -> ApiError:
    """The reply to an upload that could not be stored: 507 when the disk is full."""
    return ApiError(507 if is_disk_full(exc) else 500, f"cannot store the upload: {exc.strerror or exc}")


class PathImportHandler(ImportJobs):
    @tornado.web.authenticated
    def post(self) -> None:
        """Import a file of the server's root_dir (Lab's file browser): `{"path": relative path}`."""
        value = self.body_object(("path",)).get("path")
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise ApiError(400, f"path: expected a file path relative to the server's root folder, got {value!r:.200}")
        base = self.state.base
        try:
            path = (base / value).resolve(strict=True)
            inside = path.is_relative_to(base.resolve())
            is_file = path.is_file()
        except (OSError, RuntimeError, ValueError) as exc:
            raise ApiError(400, f"path: {value!r:.200} is no readable file under the server's root folder") from exc
        if not inside:
            raise ApiError(400, f"path: {value!r:.200} leads outside the server's root folder; refused")
        if not is_file:
            raise ApiError(400, f"path: {value!r:.200} is not a file")
        self.start_import([path], [path.name])


class TracesVersionHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        """A token that changes when runs or experiments appear or vanish (module docstring)."""
        root = await self.listed_root()
        url = self.state.root_url
        self.reply({"version": traces_version(root) if url is None else mirror_version(root, url.url)})


def traces_version(root: Path) -> str:
    """The traces root and the modification times of it and its experiments folder: bundles and records are
    renamed into (and out of) these folders as a whole, which changes their times."""
    return ":".join([str(root), _mtime_ns(root), _mtime_ns(root / EXPERIMENTS_DIR)])


def mirror_version(mirror: Path, url: str) -> str:
    """`traces_version` for the mirror of the URL root `url`: a digest of its run ids with the times of their
    run.json, and of its record names. The folders' own times will not do: opening a run replaces its folder
    by the copied-down one (its run.json's time kept), which is no change of the runs."""
    runs = [f"{run.name}@{_mtime_ns(run / RUN_JSON)}" for run in _visible(mirror) if run.name != EXPERIMENTS_DIR]
    records = [record.name for record in _visible(mirror / EXPERIMENTS_DIR)]
    return f"{url}:{hashlib.sha256(chr(10).join(runs + records).encode()).hexdigest()[:16]}"


def _mtime_ns(path: Path) -> str:
    """The modification time of `path` in ns, "-" when it cannot be read."""
    try:
        return str(os.stat(path).st_mtime_ns)
    except OSError:
        return "-"


def _visible(folder: Path) -> list[Path]:
    """The entries of `folder` that are not hidden, sorted; none when it cannot be read."""
    try:
        return sorted(entry for entry in folder.iterdir() if not entry.name.startswith("."))
    except OSError:
        return []


def manage_handlers(state: ServerState, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> list[tuple[str, type, dict]]:
    """The routes of this module (relative to the server's base URL) with their handlers."""
    common = {"state": state}
    return [
        ("workbench/api/query", QueryHandler, common),
        ("workbench/api/upload", UploadHandler, {**common, "max_upload_bytes": max_upload_bytes}),
        ("workbench/api/import", PathImportHandler, common),
        ("workbench/api/traces/version", TracesVersionHandler, common),
        *serve_handlers(state),
    ]
