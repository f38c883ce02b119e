"""The panel's serving route, under `<base_url>/workbench/api/`:

    POST   serve    {"url", "tokenizer", "model"?, "rate"?: [req/s...] | "concurrency"?: [N...], "requests", "isl",
                    "osl", "slo"?: "ttft=200ms,tpot=50ms"} -> 202 and the job running `workbench serve --url URL
                    ... --json` into the traces root: NVIDIA AIPerf drives the running OpenAI-compatible server at
                    `url`, one bundle per load point (and an experiment for a sweep)

The body is checked whole before anything is queued (400, with a message naming the field and no path of the
server): `url` an http(s) URL, `tokenizer` a folder under the server's root_dir (links resolved, as `POST import`
takes files), exactly one of `rate` and `concurrency` with at most `MAX_POINTS` loads, bounded counts, an SLO as
the CLI's `--slo` reads it. The server must have AIPerf (`make serving`, where it runs; 400 otherwise). Refused
(409) while the traces root is a URL, which the panel reads only; 429 when the job queue is full.

A serving job is a sibling of capture and import jobs in the job list (`GET jobs`, `GET`/`DELETE jobs/<id>`):
its `request` is `{"serve": the body as checked}`, its result the CLI's JSON (`{"experiment", "runs": [{"load",
"run", "summary", "error", "warnings"}], "sweep"}`). It ends "failed" with exit code 1 when requests or points
failed, their bundles written all the same; cancelling it (SIGINT) keeps nothing. The profiler window is off:
the server attached to is not the workbench's to profile.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import tornado.web
from tornado.ioloop import IOLoop

from workbench.errors import WorkbenchError
from workbench.server.handlers import ApiError, WorkbenchHandler
from workbench.server.jobs import QueueFull
from workbench.server.state import ServerState
from workbench.trace.store.bundle import json_safe

KEYS = ("url", "tokenizer", "model", "rate", "concurrency", "requests", "isl", "osl", "slo")
"""The keys of a `POST serve` body."""
MAX_REQUESTS = 10_000
"""Most requests per load point a panel job may send."""
MAX_POINTS = 16
"""Most load points (rates or concurrencies) of one job."""
MAX_TOKENS = 32_768
"""Largest prompt (isl) and output (osl) length, in tokens."""
MAX_RATE = 10_000.0
"""Highest open-loop rate, requests per second."""
MAX_CONCURRENCY = 10_000
"""Most requests in flight of a closed-loop load."""
MAX_URL_CHARS = 2_048
MAX_PATH_CHARS = 4_096
MAX_SLO_CHARS = 200
_MODEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@+=-]{0,255}")
"""A served model's name, as OpenAI servers list them (`meta-llama/Llama-3.1-8B-Instruct`, `stub`)."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Files of which a tokenizer folder has at least one (Hugging Face's `save_pretrained`)."""


class ServeHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        """Start (or queue) a serving job against a running server: 202 and its status (module docstring). The
        body is checked in a worker thread (the SLO's parser and the serving settings import numpy and pyarrow)."""
        body = self.body_object(KEYS)
        loop = IOLoop.current()
        request, args = await loop.run_in_executor(None, self._checked, body)
        root = self.writable_root()
        program = await loop.run_in_executor(None, aiperf_program)
        if program is None:
            raise ApiError(400, "this server has no AIPerf to drive the load: `make serving` installs it where the "
                                "Jupyter server runs (or set $WORKBENCH_SERVING to the folder it made)")
        command = serve_command([*args, f"--aiperf={program}"], root)
        try:  # the job checks the panel's root again as it starts: it may wait in the queue a long time
            job = self.state.jobs.submit(command, request={"serve": request}, cwd=self.state.cwd,
                                         check=functools.partial(self.state.check_root, root))
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from exc
        self.set_header("Location", self.request.path.rsplit("/", 1)[0] + "/jobs/" + job.job_id)
        self.reply(json_safe(self.state.jobs.describe(job)), status=202)

    def _checked(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The request as checked (what the job shows) and the CLI arguments it becomes; 400 on the first bad
        field."""
        url = _url(body.get("url"))
        tokenizer_text, tokenizer = self._tokenizer(body.get("tokenizer"))
        request: dict[str, Any] = {"url": url, "tokenizer": tokenizer_text}
        args = [f"--url={url}", f"--tokenizer={tokenizer}"]
        model = body.get("model")
        if model is not None:
            if not isinstance(model, str) or not _MODEL.fullmatch(model):
                raise ApiError(400, "model: expected the served model's name (letters, digits and ._:/@+=-, at "
                                    f"most 256 characters; none for the first the server lists), got {model!r:.300}")
            request["model"] = model
            args.append(f"--model={model}")
        kind, loads = _loads(body.get("rate"), body.get("concurrency"))
        request[kind] = loads
        args.append(f"--{kind}=" + ",".join(repr(float(v)) if kind == "rate" else str(v) for v in loads))
        for name, high in (("requests", MAX_REQUESTS), ("isl", MAX_TOKENS), ("osl", MAX_TOKENS)):
            value = _count(name, body.get(name), high)
            request[name] = value
            args.append(f"--{name}={value}")
        slo = body.get("slo")
        if slo is not None and slo != "":
            request["slo"] = _slo(slo)
            args.append(f"--slo={request['slo']}")
        args.append("--profile-window=off")
        return request, args

    def _tokenizer(self, value: Any) -> tuple[str, Path]:
        """The tokenizer folder `value` names under the server's root_dir: as given and resolved (400 otherwise;
        the messages quote `value`, which the reply's redaction keeps from naming the server's paths)."""
        if not isinstance(value, str) or not value.strip() or "\0" in value or len(value) > MAX_PATH_CHARS:
            raise ApiError(400, "tokenizer: expected the path of a tokenizer folder (a save_pretrained folder with "
                                f"tokenizer.json or tokenizer_config.json) relative to the server's root folder, "
                                f"got {value!r:.200}")
        base = self.state.base
        try:
            folder = (base / Path(value.strip()).expanduser()).resolve(strict=True)
            inside = folder.is_relative_to(base.resolve())
            is_dir = folder.is_dir()
            has_files = is_dir and any((folder / name).is_file() for name in _TOKENIZER_FILES)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ApiError(400, f"tokenizer: {value!r:.200} is no folder under the server's root folder") from exc
        if not inside:
            raise ApiError(400, f"tokenizer: {value!r:.200} leads outside the server's root folder; refused")
        if not is_dir:
            raise ApiError(400, f"tokenizer: {value!r:.200} is not a folder")
        if not has_files:
            raise ApiError(400, f"tokenizer: {value!r:.200} holds no tokenizer (none of {', '.join(_TOKENIZER_FILES)})")
        return value.strip(), folder


def _url(value: Any) -> str:
    """The server's base URL: http or https, a host, no credentials (400 otherwise)."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_URL_CHARS:
        raise ApiError(400, f"url: expected the http(s) URL of an OpenAI-compatible server (e.g. "
                            f"http://127.0.0.1:8000), got {value!r:.200}")
    url = value.strip()
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise ApiError(400, f"url: {url!r:.200} has spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is no number in range
    except ValueError as exc:
        raise ApiError(400, f"url: {url!r:.200} is not a valid URL ({exc})") from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise ApiError(400, f"url: {url!r:.200} is not an http:// or https:// URL")
    if not parts.hostname:
        raise ApiError(400, f"url: {url!r:.200} names no host")
    if parts.username is not None or parts.password is not None:
        raise ApiError(400, "url: credentials in the URL are not supported (they would show in the job list)")
    if port == 0:
        raise ApiError(400, f"url: {url!r:.200} names port 0")
    return url


def _loads(rate: Any, concurrency: Any) -> tuple[str, list[Any]]:
    """("rate", [req/s...]) or ("concurrency", [N...]): exactly one given, 1 to MAX_POINTS distinct loads."""
    if (rate is None) == (concurrency is None):
        raise ApiError(400, "give rate (a list of requests per second: open loop) or concurrency (a list of "
                            "requests in flight: closed loop)" + (", not both" if rate is not None else ""))
    kind, values = ("rate", rate) if rate is not None else ("concurrency", concurrency)
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_POINTS:
        raise ApiError(400, f"{kind}: expected a list of 1 to {MAX_POINTS} loads (one per load point), "
                            f"got {values!r:.200}")
    for value in values:
        if kind == "rate":
            good = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and 0 < value <= MAX_RATE)
            wanted = f"numbers of requests per second above 0 and at most {MAX_RATE:,.0f}"
        else:
            good = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY
            wanted = f"whole numbers of requests in flight from 1 to {MAX_CONCURRENCY:,}"
        if not good:
            raise ApiError(400, f"{kind}: expected {wanted}, got {value!r:.100}")
    if len({float(v) for v in values}) < len(values):
        raise ApiError(400, f"{kind}: a load is named more than once in {values!r:.200}")
    return kind, list(values)


def _count(name: str, value: Any, high: int) -> int:
    """A required whole number from 1 to `high` (400 otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        what = "requests per load point" if name == "requests" else "tokens"
        label = {"isl": "isl (prompt length)", "osl": "osl (output length)"}.get(name, name)
        raise ApiError(400, f"{label}: expected a whole number of {what} from 1 to {high:,}, got {value!r:.100}")
    return value


def _slo(value: Any) -> str:
    """The SLO as the CLI's `--slo` takes it (`ttft=200ms,tpot=50ms`), checked as it reads it."""
    from workbench.serving.metrics import parse_slo

    if not isinstance(value, str) or len(value) > MAX_SLO_CHARS:
        raise ApiError(400, f"slo: expected bounds such as ttft=200ms,tpot=50ms (at most {MAX_SLO_CHARS} "
                            f"characters), got {value!r:.200}")
    text = "".join(value.split())
    try:
        parse_slo(text)
    except WorkbenchError as exc:
        raise ApiError(400, f"slo: {exc}") from exc
    return text


def aiperf_program() -> Path | None:
    """AIPerf's program as `workbench serve` finds it by default (`.serving/aiperf`, or under $WORKBENCH_SERVING),
    seen from the server's own working directory, absolute; None when it is not there. Jobs run in root_dir, so
    the server passes it on."""
    from workbench.serving.session import serving_dir

    program = (serving_dir() / "aiperf" / "bin" / "aiperf").absolute()
    return program if program.is_file() else None


def serve_command(args: list[str], root: Path) -> list[str]:
    """The command line of a serving job: the CLI run by the server's interpreter, writing into `root`, its
    result as JSON on stdout (`workbench serve` has no progress lines: the job's log is its stderr)."""
    return [sys.executable, "-m", "workbench", "serve", *args, "--json", "--out", str(root)]


def serve_handlers(state: ServerState) -> list[tuple[str, type, dict]]:
    """The routes of this module (relative to the server's base URL) with their handlers."""
    return [("workbench/api/serve", ServeHandler, {"state": state})]
