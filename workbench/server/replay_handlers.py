"""The panel's op replay routes, under `<base_url>/workbench/api/`:

    POST   replay               {"run": id, "top"?: 1..MAX_TOP (20), "variants"?: ["eager"|"bf16"|"compile", ...]}
                                -> 202 and the job running `workbench replay RUN --top N --variants V --json` on a run
                                of the traces root (`workbench.replay`: its top ops rebuilt from their recorded shapes
                                and timed alone)
    GET    replay/<job>/view    {"job", "run", "item"}: Bokeh `json_item` of the replay's view
                                (`views.replay.replay_view`: the chart of trace against replayed time and the table,
                                ops that could not be rebuilt with the reason), `?width=N` pixels; once the job
                                succeeded (409 before, 404 for no replay job)

The body is checked whole before anything is queued (400 with a one-line message naming the field): `run` a run id of
the traces root, opened as every route opens one (`WorkbenchHandler.open_run`: 404 when there is none, 422 when it
leads outside the root), `top` a whole number from 1 to `MAX_TOP`, `variants` distinct names of the replay's variants
(`workbench.replay.table.VARIANTS`). 429 when the job queue is full. A run recorded without shapes is no 400: the
replay says why it cannot rebuild it, and that line is the job's error.

A replay job is a sibling of capture, import, serving and quantization jobs in the job list (`GET jobs`, `GET`/`DELETE
jobs/<id>`): its `request` is `{"replay": the body as checked}`, its result the CLI's JSON (`{"run", "variants",
"iterations", "warmup", "threads", "device", "floor_ns", "ort", "rows"}`, one row per signature with the columns of
`workbench.replay.table`). It reads the run and writes nothing: the view route draws the table back from that result,
at whatever width the panel asks, without replaying again, for as long as the job list keeps the job.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop

from workbench.server.handlers import WIDTHS, ApiError, WorkbenchHandler, distinct_choices
from workbench.server.jobs import QueueFull
from workbench.server.state import ServerState
from workbench.trace.store.bundle import json_safe

KEYS = ("run", "top", "variants")
"""The keys of a `POST replay` body."""
DEFAULT_TOP = 20
"""Signatures replayed when the body names no `top` (the CLI's default)."""
MAX_TOP = 100
"""Most signatures of one replay from the panel (each is rebuilt, called and timed under every variant)."""


class ReplayHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def post(self) -> None:
        """Start (or queue) the replay of a run's top ops: 202 and the job's status (module docstring). The variants
        are checked in a worker thread (their list lives beside the replay, which imports torch)."""
        body = self.body_object(KEYS)
        run = body.get("run")
        if not isinstance(run, str):
            raise ApiError(400, f"run: expected a run id of the traces root, got {run!r:.100}")
        root = self.traces_root()
        bundle = self.open_run(run)
        top = body.get("top", DEFAULT_TOP)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP:
            raise ApiError(400, f"top: expected a whole number from 1 to {MAX_TOP}, got {top!r:.100}")
        variants = await IOLoop.current().run_in_executor(None, _variants, body.get("variants"))
        request = {"run": bundle.run_id, "top": top, "variants": list(variants)}
        try:  # the job checks the panel's root again as it starts: it may wait in the queue a long time
            job = self.state.jobs.submit(replay_command(bundle.run_id, top, variants, str(root)),
                                         request={"replay": request}, cwd=self.state.cwd,
                                         check=functools.partial(self.state.check_root, root))
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from exc
        self.set_header("Location", self.request.path.rsplit("/", 1)[0] + "/jobs/" + job.job_id)
        self.reply(json_safe(self.state.jobs.describe(job)), status=202)


class ReplayViewHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        """The view of a succeeded replay job as a Bokeh json_item, laid out `width` pixels wide."""
        width = self.query_int("width", *WIDTHS, "pixels")
        job = self.succeeded_job(job_id, "replay", "replay")
        run = job.request["replay"]["run"]
        self.reply({"job": job_id, "run": run, "item": await self.in_thread(draw_replay, job.result, width)})


def _variants(value: Any) -> tuple[str, ...]:
    """The variants asked for, in the replay's order (all of them when None); 400 for anything else than a list of
    distinct variant names."""
    from workbench.replay.table import VARIANTS

    if value is None:
        return VARIANTS
    chosen = distinct_choices("variants", value, VARIANTS, "is no replay variant",
                              " (ORT does not apply to single aten ops)")
    return tuple(variant for variant in VARIANTS if variant in chosen)


def replay_command(run: str, top: int, variants: tuple[str, ...], root: str) -> list[str]:
    """The command line of a replay job: the CLI run by the server's interpreter on `run` of the traces root `root`,
    its result as JSON on stdout (the run id after `--`, so that nothing in it reads as an option)."""
    return [sys.executable, "-m", "workbench", "replay", f"--top={top}", f"--variants={','.join(variants)}",
            f"--out={root}", "--json", "--", run]


def draw_replay(result: dict[str, Any], width: int | None) -> dict[str, Any]:
    """The json_item of `replay_view` of a replay job's result (the CLI's JSON), `width` pixels wide (None: the view's
    default)."""
    from bokeh.embed import json_item

    from workbench.views.replay import replay_view

    sized = {} if width is None else {"width": width}
    return json_item(replay_view(replay_table(result), f"op replay: {result.get('run')}", **sized))


def replay_table(result: dict[str, Any]) -> Any:
    """The replay DataFrame back from the CLI's JSON of it: its rows, the times, ratio and roofline figures as floats
    (JSON's null as NaN, as the replay left them), the settings in `attrs`."""
    import pandas as pd

    rows = result.get("rows")
    if not isinstance(rows, list):
        raise ApiError(500, "the replay job's result has no rows")
    table = pd.DataFrame.from_records(rows)
    for column in table.columns:
        if column.startswith("replay_") or column in ("trace_ns", "ratio", "flops", "intensity"):
            table[column] = table[column].astype("float64")
    table.attrs.update({key: value for key, value in result.items() if key not in ("rows", "run", "html")})
    return table


def replay_handlers(state: ServerState) -> list[tuple[str, type, dict]]:
    """The routes of this module (relative to the server's base URL) with their handlers."""
    common = {"state": state}
    return [("workbench/api/replay", ReplayHandler, common),
            (r"workbench/api/replay/(?P<job_id>[^/]+)/view", ReplayViewHandler, common)]
