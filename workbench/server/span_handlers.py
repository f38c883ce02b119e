"""The timeline's data routes under `<base_url>/workbench/api/` (contract: docs/api-spans.md):

    GET runs/<id>/spans?start_ns=&end_ns=&width_px=[&max_spans=][&expand=&offset=]
                                                                  real spans or per-pixel density per lane; a
                                                                  folded lane's tracks as lanes of their own
    GET runs/<id>/search?q=[&regex=0|1][&limit=][&from_ns=]       name search over the whole run
    GET runs/<id>/aggregate?start_ns=&end_ns=[&limit=]            count, total and self time per name in a range
    GET runs/<id>/events/<row>                                    one event's fields, launcher and launches, and
                                                                  a kernel's launch facts (grid, block, ...)

They send `workbench.analysis.spans.queries`'s dicts as JSON (the notebook calls the same functions) and answer from
the run's open index (`workbench.analysis.spans.index.RUNS`). Like every API route they are authenticated,
resolve run ids inside the traces root only (`WorkbenchHandler.open_run`) and run in a worker thread; a
missing or malformed parameter is a 400 naming it and its range.
"""

from __future__ import annotations

import re
from typing import Any

import tornado.web

from workbench.analysis.spans import queries as spans
from workbench.server.handlers import ApiError, WorkbenchHandler
from workbench.server.state import ServerState
from workbench.trace.schema import TIME_LIMIT_NS

MAX_WIDTH_PX = 20_000
"""Widest view (pixels) a window may be asked for."""
MAX_LANE = 10_000
"""Largest lane number `expand` takes (a run draws far fewer: `workbench.analysis.timeline.MAX_LANES`)."""
MAX_TRACKS = 1_000_000_000
"""Largest track `offset` of an expanded lane."""
MAX_QUERY_CHARS = 1_000
"""Longest search text."""
MAX_LIST = 10_000
"""Most matches or aggregate rows one reply lists."""
_INTEGER = re.compile(r"-?[0-9]{1,19}")
"""A query integer: an optional minus and ASCII digits."""


class SpanQueryHandler(WorkbenchHandler):
    """Parameter parsing shared by the timeline routes."""

    def integer(self, name: str, low: int, high: int, unit: str, default: int | None = None,
                required: bool = False) -> int | None:
        """Query argument `name` as an integer within [low, high]: `default` when absent (400 if `required`)."""
        text = self.get_query_argument(name, None)
        if text is None:
            if required:
                raise ApiError(400, f"{name}: missing; expected an integer number of {unit} from {low} to {high}")
            return default
        if not _INTEGER.fullmatch(text) or not low <= int(text) <= high:
            raise ApiError(400, f"{name}: expected an integer number of {unit} from {low} to {high}, got {text!r}")
        return int(text)

    def time_range(self) -> tuple[int, int]:
        """The `start_ns` and `end_ns` arguments (both required, end after start)."""
        start = self.integer("start_ns", -TIME_LIMIT_NS, TIME_LIMIT_NS, "ns", required=True)
        end = self.integer("end_ns", -TIME_LIMIT_NS, TIME_LIMIT_NS, "ns", required=True)
        assert start is not None and end is not None  # required
        if end <= start:
            raise ApiError(400, f"end_ns ({end}) must be greater than start_ns ({start})")
        return start, end

    async def answer(self, run_id: str, query: Any, *args: Any, **kwargs: Any) -> None:
        """Reply with `query(bundle, *args, **kwargs)` run in a worker thread (400 for a QueryError)."""
        bundle = self.open_run(run_id)
        try:
            self.reply(await self.in_thread(lambda: query(bundle, *args, **kwargs)))
        except ApiError as exc:
            cause = exc.__cause__
            if isinstance(cause, spans.QueryError):
                raise ApiError(400, str(cause)) from cause
            raise


class SpansHandler(SpanQueryHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """The spans or density of a window, per lane (`spans.window`)."""
        start, end = self.time_range()
        width = self.integer("width_px", 1, MAX_WIDTH_PX, "pixels", required=True)
        budget = self.integer("max_spans", 1, spans.MAX_SPANS_LIMIT, "spans", default=spans.MAX_SPANS)
        expand = self.integer("expand", 0, MAX_LANE, "lanes")
        offset = self.integer("offset", 0, MAX_TRACKS, "tracks", default=0)
        await self.answer(run_id, spans.window, start, end, width, max_spans=budget, expand=expand, offset=offset)


class SearchHandler(SpanQueryHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """Events whose name matches `q` (`spans.search`)."""
        text = self.get_query_argument("q", None)
        if not text or len(text) > MAX_QUERY_CHARS:
            raise ApiError(400, f"q: expected a search text of 1 to {MAX_QUERY_CHARS} characters")
        regex = self.get_query_argument("regex", "0")
        if regex not in ("0", "1"):
            raise ApiError(400, f"regex: expected 0 or 1, got {regex!r}")
        limit = self.integer("limit", 1, MAX_LIST, "matches", default=100)
        after = self.integer("from_ns", -TIME_LIMIT_NS, TIME_LIMIT_NS, "ns")
        await self.answer(run_id, spans.search, text, regex=regex == "1", limit=limit, from_ns=after)


class AggregateHandler(SpanQueryHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """Count, total and self time per name in a range (`spans.aggregate`)."""
        start, end = self.time_range()
        limit = self.integer("limit", 1, MAX_LIST, "rows", default=500)
        await self.answer(run_id, spans.aggregate, start, end, limit=limit)


class EventHandler(SpanQueryHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str, row: str) -> None:
        """One event's fields (`spans.event`); 404 for a row past the end."""
        if not re.fullmatch(r"[0-9]{1,12}", row):
            raise ApiError(400, f"row: expected an event row (a non-negative integer), got {row!r}")
        bundle = self.open_run(run_id)
        try:
            self.reply(await self.in_thread(spans.event, bundle, int(row)))
        except IndexError as exc:
            raise ApiError(404, str(exc)) from exc


def span_handlers(state: ServerState) -> list[tuple[str, type[WorkbenchHandler], dict[str, Any]]]:
    """The timeline routes (relative to the server's base URL) with their handlers."""
    run = r"(?P<run_id>[^/]+)"
    routes: list[tuple[str, type[WorkbenchHandler]]] = [
        (f"runs/{run}/spans", SpansHandler),
        (f"runs/{run}/search", SearchHandler),
        (f"runs/{run}/aggregate", AggregateHandler),
        (rf"runs/{run}/events/(?P<row>[^/]+)", EventHandler),
    ]
    return [(f"workbench/api/{path}", handler, {"state": state}) for path, handler in routes]
