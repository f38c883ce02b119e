"""Per-request results of a load generator, read into a `requests` table.

A serving trace says what the engine did; a load generator's results say what each client saw: when a request
was sent, when its tokens came back, and whether it failed. Three generators are read, each from what it writes
(formats checked against their sources):

- NVIDIA AIPerf 0.13 (`aiperf profile`): `profile_export.jsonl`, one record per line: `metadata` with epoch ns
  `request_start_ns`, `request_ack_ns`, `request_end_ns` (the last response), `x_request_id`,
  `x_correlation_id`, `conversation_id`, `turn_index`, `benchmark_phase`; `metrics`, each `{value, unit}` in
  display units (`time_to_first_token` ms, `inter_chunk_latency` a list of ms, `input_sequence_length`,
  `output_sequence_length`, `error_isl`); `error` (`code`, `type`, `message`) or null. Times are exact: the
  chunk arrivals are the start plus TTFT plus the running sum of the inter-chunk gaps.
- `vllm bench serve --save-result --save-detailed` (vLLM 0.32): one JSON object (several, one a line, with
  `--append-result`) with per-request lists `input_lens`, `output_lens`, `ttfts`, `itls` (seconds),
  `latencies`, `start_times` (`time.perf_counter()` seconds: a clock without an epoch) and `errors` ("" when
  ok), beside `date` (local time, to the second, written after the run) and `duration`. Older versions have
  no `start_times`: requests are placed at `i / request_rate` (at 0 with an infinite rate). Either way the
  placement is an estimate, and `warnings` says so.
- GuideLLM (0.4 to 0.8.1, whose real report is in tests/data; 0.2 and 0.3 too): `benchmarks.json`,
  `benchmarks[].requests.{successful, errored, incomplete}` with epoch-second timings
  (`info.timings.request_start`, `first_token_iteration`, `last_token_iteration`, `request_end`; in 0.2 and 0.3
  `start_time`, `first_token_time`, `end_time`). It keeps no per-token times, so `token_ns` is null; incomplete
  requests (cut off at the benchmark's end) are left out.

One row per request, in arrival order: | request | id | session | turn | arrival_ns | ack_ns | first_token_ns |
end_ns | token_ns | prompt_tokens | output_tokens | status | error | ttft_ns | e2e_ns | tpot_ns | source |.
Times are ns from `origin_ns` (epoch ns; by default the first arrival), so they line up with a server trace of
the same run; `tpot_ns` is (end - first token) / (output tokens - 1). A failed request keeps its row (status
"error", its message in `error`). `session` is AIPerf's `x_correlation_id` (one live user session; its
`conversation_id` names the dataset entry, which several sessions may replay) or GuideLLM's `conversation_id`.

The JSON Lines file is streamed a line at a time, and a line longer than `MAX_LINE_BYTES` is refused before it
is read whole; a whole-document format is read whole up to `MAX_DOCUMENT_BYTES`, decoded (by msgspec) into the
fields used here only, so generated texts never become Python strings.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import TraceFormatError

REQUESTS_SCHEMA = pa.schema([
    ("request", pa.int64()), ("id", pa.string()), ("session", pa.string()), ("turn", pa.int64()),
    ("arrival_ns", pa.int64()), ("ack_ns", pa.int64()), ("first_token_ns", pa.int64()), ("end_ns", pa.int64()),
    ("token_ns", pa.list_(pa.int64())), ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("status", pa.string()), ("error", pa.string()), ("ttft_ns", pa.int64()), ("e2e_ns", pa.int64()),
    ("tpot_ns", pa.float64()), ("source", pa.string()),
])
"""Columns of the `requests` table."""

MAX_LINE_BYTES = 64 << 20
"""Bytes of one AIPerf record. A record of 100k output chunks is about 2 MB; a longer line is no record."""

MAX_DOCUMENT_BYTES = 1 << 30
"""Bytes of a vllm bench or GuideLLM results file, read whole. A detailed vllm result of 100k requests of 1k
tokens, generated texts included, is about 600 MB."""

FORMATS = ("an AIPerf profile_export.jsonl, a `vllm bench serve --save-result --save-detailed` JSON or a GuideLLM "
           "benchmarks.json")
"""The formats read, for error messages."""
_SNIFF_BYTES = 1 << 16
_AIPERF_START = re.compile(rb'\{\s*"metadata"\s*:\s*\{[^{}]*"request_start_ns"')
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "sec": 1_000_000_000, "s": 1_000_000_000}
_GUIDELLM_VERSIONS = (1, 2)


@dataclass(frozen=True)
class RequestResults:
    """A load generator's per-request results: the `requests` table and what was learnt reading it."""

    table: pa.Table
    origin_ns: int | None
    """Epoch ns of time zero; None where the file gives no clock to place it on (times from the first arrival)."""
    source: str
    failed: int
    errors: dict[str, int]
    """Error message → requests that failed with it."""
    warnings: list[str] = field(default_factory=list)


class _Value(msgspec.Struct):
    value: Any = None
    unit: str = "ns"


class _AiperfMetadata(msgspec.Struct):
    request_start_ns: int
    request_end_ns: int
    request_ack_ns: int | None = None
    x_request_id: str | None = None
    x_correlation_id: str | None = None
    conversation_id: str | None = None
    turn_index: int | None = None
    benchmark_phase: str = "profiling"


class _AiperfError(msgspec.Struct):
    message: str = ""
    type: str | None = None


class _AiperfRecord(msgspec.Struct):
    metadata: _AiperfMetadata
    metrics: dict[str, _Value] | None = None
    error: _AiperfError | None = None


class _VllmResult(msgspec.Struct):
    ttfts: list[float]
    itls: list[list[float]]
    input_lens: list[int]
    output_lens: list[int]
    errors: list[str | None]
    start_times: list[float] | None = None
    latencies: list[float] | None = None
    date: str | None = None
    duration: float | None = None
    request_rate: float | str | None = None


class _GuidellmTimings(msgspec.Struct):
    request_start: float | None = None
    resolve_start: float | None = None
    first_token_iteration: float | None = None
    request_end: float | None = None
    resolve_end: float | None = None


class _GuidellmInfo(msgspec.Struct):
    timings: _GuidellmTimings
    conversation_id: str | None = None
    turn_index: int | None = None
    error: str | None = None


class _GuidellmRequest(msgspec.Struct):
    request_id: str | None = None
    info: _GuidellmInfo | None = None  # 0.4 and later
    start_time: float | None = None  # 0.2 and 0.3
    first_token_time: float | None = None
    end_time: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None


class _GuidellmBreakdown(msgspec.Struct):
    successful: list[_GuidellmRequest] | None = None
    errored: list[_GuidellmRequest] | None = None
    incomplete: list[_GuidellmRequest] | None = None


class _GuidellmBenchmark(msgspec.Struct):
    requests: _GuidellmBreakdown


class _Rows:
    """The rows read so far, column by column, times in epoch ns (or in the file's own clock)."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in
                                              ("id", "session", "turn", "arrival_ns", "ack_ns", "first_token_ns",
                                               "end_ns", "prompt_tokens", "output_tokens", "error")}
        self.tokens: list[np.ndarray | None] = []

    def add(self, tokens: np.ndarray | None, **values: Any) -> None:
        """One request: its token arrival times (int64 ns, or None) and its columns by name."""
        for name, column in self.columns.items():
            column.append(values.get(name))
        self.tokens.append(tokens)


def is_requests_file(path: str | Path) -> bool:
    """Whether `path` looks like a load generator's results rather than a trace, from its first 64 KiB: an AIPerf
    record, or a JSON object with vllm bench's or GuideLLM's leading keys and no trace events."""
    try:
        with Path(path).open("rb") as file:
            head = file.read(_SNIFF_BYTES).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return False
    if _AIPERF_START.match(head):
        return True
    return head.startswith(b"{") and b'"traceEvents"' not in head and any(
        key in head for key in (b'"request_throughput"', b'"benchmarks"', b'"ttfts"'))


def read_requests(path: str | Path, origin_ns: int | None = None, *, benchmark: int | None = None
                  ) -> RequestResults:
    """The per-request results in `path` (format told from the content: see the module docstring), times from
    `origin_ns` (epoch ns; default the first arrival). `benchmark` picks one of several results in a file
    (GuideLLM's benchmarks, vllm bench's appended results); it is needed only where there are several."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            head = file.read(_SNIFF_BYTES).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open: {exc.strerror}") from exc
    if not head.startswith(b"{"):
        raise TraceFormatError(path, f"not JSON results of a load generator: give {FORMATS}")
    warnings: list[str] = []
    if _AIPERF_START.match(head):
        source, rows, clock = "aiperf", _read_aiperf(path, warnings), True
    else:
        source, rows, clock = _read_document(path, benchmark, warnings)
    if clock is None and origin_ns is not None:
        warnings.append(f"{path}: origin_ns ignored: the file gives no clock to place its requests on")
        origin_ns = None
    table, origin = _table(rows, source, origin_ns)
    failures = Counter(e for e in table["error"].to_pylist() if e is not None)
    return RequestResults(table=table, origin_ns=origin if clock is not None else None, source=source,
                          failed=sum(failures.values()), errors=dict(failures), warnings=warnings)


def _read_aiperf(path: Path, warnings: list[str]) -> _Rows:
    """The profiling-phase records of an AIPerf profile_export.jsonl, streamed a line at a time."""
    decoder = msgspec.json.Decoder(_AiperfRecord)
    rows, warmup, number = _Rows(), 0, 0
    with path.open("rb") as file:
        while line := file.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise TraceFormatError(path, f"line {number} is longer than {MAX_LINE_BYTES >> 20} MiB: not an "
                                             "AIPerf record (is this a profile_export.jsonl?)")
            if not line.strip():
                continue
            try:
                record = decoder.decode(line)
                if record.metadata.benchmark_phase != "profiling":
                    warmup += 1
                    continue
                _add_aiperf(rows, record)
            except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
                if not line.endswith(b"\n"):  # a line within the limit ends without one only at the end
                    warnings.append(f"{path}: line {number} is cut short (the file was truncated); "
                                    f"kept the {len(rows.tokens)} complete records before it")
                    break
                raise TraceFormatError(path, f"line {number}: not an AIPerf 0.13 profile_export.jsonl record "
                                             f"({exc!s}); give {FORMATS}") from exc
    if warmup:
        warnings.append(f"{path}: left out {warmup} warm-up records")
    return rows


def _add_aiperf(rows: _Rows, record: _AiperfRecord) -> None:
    """One AIPerf record's row: chunk arrivals from the start, TTFT and the inter-chunk gaps (KeyError for
    a unit of time it does not know)."""
    meta, metrics = record.metadata, record.metrics or {}
    start = meta.request_start_ns
    tokens = None
    if (ttft := metrics.get("time_to_first_token")) is not None and ttft.value is not None:
        gaps = metrics.get("inter_chunk_latency")
        steps = [ttft.value * _UNIT_NS[ttft.unit]]
        if gaps is not None and gaps.value:
            steps += [gap * _UNIT_NS[gaps.unit] for gap in gaps.value]
        tokens = start + np.rint(np.cumsum(steps)).astype(np.int64)
    prompt = metrics.get("input_sequence_length") or metrics.get("error_isl")
    output = metrics.get("output_sequence_length")
    error = record.error
    rows.add(tokens, id=meta.x_request_id, session=meta.x_correlation_id or meta.conversation_id,
             turn=meta.turn_index, arrival_ns=start, ack_ns=meta.request_ack_ns,
             first_token_ns=None if tokens is None else int(tokens[0]), end_ns=meta.request_end_ns,
             prompt_tokens=None if prompt is None else int(prompt.value),
             output_tokens=None if output is None else int(output.value),
             error=None if error is None else (f"{error.type}: {error.message}" if error.type else error.message))


def _read_document(path: Path, benchmark: int | None, warnings: list[str]) -> tuple[str, _Rows, bool | None]:
    """A vllm bench or GuideLLM results file: its source, rows, and whether its times are on the epoch (True),
    placed there by estimate (False) or on no clock at all (None)."""
    size = path.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise TraceFormatError(path, f"{size >> 20} MiB, more than the {MAX_DOCUMENT_BYTES >> 20} MiB a results "
                                     f"document may have: give {FORMATS}")
    data = path.read_bytes()
    keys = dict[str, msgspec.Raw]
    try:
        documents = [(data, msgspec.json.decode(data, type=keys))]
    except msgspec.DecodeError as exc:  # vllm bench --append-result: one result a line
        try:
            documents = [(line, msgspec.json.decode(line, type=keys)) for line in data.splitlines() if line.strip()]
        except msgspec.DecodeError:
            raise TraceFormatError(path, f"not valid JSON ({exc}): give {FORMATS}") from exc
    raw, document = documents[0] if len(documents) == 1 else documents[
        _pick(path, benchmark, len(documents), "results (vllm bench --append-result)")]
    try:
        if "benchmarks" in document:
            return "guidellm", _read_guidellm(path, document, benchmark, warnings), True
        if "ttfts" in document:
            return ("vllm-bench", *_read_vllm(path, msgspec.json.decode(raw, type=_VllmResult), warnings))
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, f"an unexpected field ({exc}): not a version this reader knows; give "
                                     f"{FORMATS}") from exc
    if "duration" in document and "completed" in document:
        raise TraceFormatError(path, "a vllm bench result without per-request lists: run `vllm bench serve` with "
                                     "--save-result --save-detailed")
    raise TraceFormatError(path, f"JSON of no known load generator (keys: {', '.join(sorted(document)[:8])}): "
                                 f"give {FORMATS}")


def _pick(path: Path, benchmark: int | None, count: int, what: str) -> int:
    """The index of the chosen one of `count` results: `benchmark`, needed only where there are several."""
    if benchmark is None:
        if count != 1:
            raise TraceFormatError(path, f"holds {count} {what}: choose one with benchmark=0..{count - 1}")
        return 0
    if not 0 <= benchmark < count:
        raise TraceFormatError(path, f"holds {count} {what}: benchmark={benchmark} is not in 0..{count - 1}")
    return benchmark


def _read_vllm(path: Path, result: _VllmResult, warnings: list[str]) -> tuple[_Rows, bool | None]:
    """The rows of a `vllm bench serve --save-detailed` result, placed on the epoch by the file's `date`."""
    count = len(result.ttfts)
    if any(len(column) != count for column in (result.itls, result.input_lens, result.output_lens, result.errors)):
        raise TraceFormatError(path, "per-request lists of different lengths: not a whole vllm bench result")
    if result.start_times is not None and len(result.start_times) == count:
        starts = np.asarray(result.start_times, dtype=np.float64)
        starts = starts - starts.min() if count else starts
        placed = "from its start_times (seconds on time.perf_counter, which has no epoch)"
    else:
        rate = _finite(result.request_rate)
        starts = np.arange(count, dtype=np.float64) / rate if rate else np.zeros(count)
        placed = (f"at i / request_rate ({rate:g}/s), having no start_times" if rate
                  else "all at time zero, having no start_times and no finite request_rate")
    epoch = _vllm_epoch(result)
    if epoch is None:
        warnings.append(f"{path}: placed requests {placed}; no parseable date, so times are from the first request")
    else:
        warnings.append(f"{path}: placed requests {placed}; the first at the file's date (local time, to the second, "
                        "written after the run) minus its duration: within a second or two of the truth")
    rows = _Rows()
    for i in range(count):
        arrival = int(epoch or 0) + round(starts[i] * 1e9)
        error = result.errors[i] or None
        tokens = None
        if error is None:
            tokens = arrival + np.rint(np.cumsum([result.ttfts[i], *result.itls[i]]) * 1e9).astype(np.int64)
        latency = result.latencies[i] if result.latencies is not None and len(result.latencies) == count else None
        end = (arrival + round(latency * 1e9) if latency else int(tokens[-1]) if tokens is not None else arrival)
        rows.add(tokens, arrival_ns=arrival, first_token_ns=None if tokens is None else int(tokens[0]), end_ns=end,
                 prompt_tokens=result.input_lens[i], output_tokens=result.output_lens[i], error=error)
    return rows, None if epoch is None else False


def _finite(value: float | str | None) -> float | None:
    """A positive finite request rate, else None ("inf", absent)."""
    try:
        rate = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return rate if math.isfinite(rate) and rate > 0 else None


def _vllm_epoch(result: _VllmResult) -> int | None:
    """Epoch ns of a vllm bench run's first request: its `date` (local time when the results were saved, right
    after the run) minus its `duration`; None without a parseable date."""
    try:
        saved = datetime.strptime(result.date or "", "%Y%m%d-%H%M%S").timestamp()
    except ValueError:
        return None
    return round((saved - (result.duration or 0.0)) * 1e9)


def _read_guidellm(path: Path, document: dict[str, msgspec.Raw], benchmark: int | None,
                   warnings: list[str]) -> _Rows:
    """The rows of one benchmark of a GuideLLM report (its successful and errored requests)."""
    if "metadata" in document:
        version = msgspec.json.decode(document["metadata"], type=dict[str, Any]).get("version")
        if version not in _GUIDELLM_VERSIONS:
            raise TraceFormatError(path, f"a GuideLLM report of schema version {version}; this reader knows "
                                         f"versions {_GUIDELLM_VERSIONS} (GuideLLM 0.4 to 0.7): convert it with "
                                         "a GuideLLM of those versions")
    benchmarks = msgspec.json.decode(document["benchmarks"], type=list[_GuidellmBenchmark])
    chosen = benchmarks[_pick(path, benchmark, len(benchmarks), "benchmarks (a GuideLLM sweep)")].requests
    if chosen.incomplete:
        warnings.append(f"{path}: left out {len(chosen.incomplete)} incomplete requests (cut off at the "
                        "benchmark's end)")
    warnings.append(f"{path}: GuideLLM keeps no per-token times: token_ns is null and ITL unknown")
    rows = _Rows()
    for request, failed in [(r, False) for r in chosen.successful or []] + [(r, True) for r in chosen.errored or []]:
        if request.info is not None:
            info, t = request.info, request.info.timings
            start, first, end = (t.request_start or t.resolve_start, t.first_token_iteration,
                                 t.request_end or t.resolve_end)
            session, turn, error = info.conversation_id, info.turn_index, info.error
        else:
            start, first, end = request.start_time, request.first_token_time, request.end_time
            session, turn, error = None, None, request.error
        if start is None or end is None:
            raise TraceFormatError(path, f"request {request.request_id} has no start or end time")
        rows.add(None, id=request.request_id, session=session, turn=turn, arrival_ns=_ns(start),
                 first_token_ns=None if first is None else _ns(first), end_ns=_ns(end),
                 prompt_tokens=request.prompt_tokens, output_tokens=request.output_tokens,
                 error=(error or "error (no message)") if failed else None)
    return rows


def _ns(seconds: float) -> int:
    """Epoch seconds as epoch ns."""
    return round(seconds * 1e9)


def _table(rows: _Rows, source: str, origin_ns: int | None) -> tuple[pa.Table, int]:
    """The `requests` table of `rows`, in arrival order, times from `origin_ns` (default the first arrival);
    and that origin."""
    columns, count = rows.columns, len(rows.tokens)
    arrival = np.asarray(columns["arrival_ns"], dtype=np.int64)
    origin = origin_ns if origin_ns is not None else int(arrival.min()) if count else 0
    order = np.argsort(arrival, kind="stable").tolist()

    def column(name: str) -> pa.Array:
        return pa.array([columns[name][i] for i in order], type=REQUESTS_SCHEMA.field(name).type)

    def shifted(name: str) -> pa.Array:
        return pc.subtract(column(name), origin)

    arrived, first, end, output = shifted("arrival_ns"), shifted("first_token_ns"), shifted("end_ns"), column(
        "output_tokens")
    tokens = [rows.tokens[i] for i in order]
    offsets = np.cumsum([0] + [0 if t is None else len(t) for t in tokens], dtype=np.int64)
    flat = np.concatenate([t for t in tokens if t is not None] or [np.zeros(0, np.int64)]) - origin
    token_ns = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.int64()),
                                        mask=pa.array([t is None for t in tokens], pa.bool_()))
    gaps = pc.cast(pc.subtract(output, 1), pa.float64())
    tpot = pc.if_else(pc.greater(gaps, 0), pc.divide(pc.cast(pc.subtract(end, first), pa.float64()), gaps),
                      pa.scalar(None, pa.float64()))
    error = column("error")
    table = pa.table({
        "request": pa.array(np.arange(count, dtype=np.int64)), "id": column("id"), "session": column("session"),
        "turn": column("turn"), "arrival_ns": arrived, "ack_ns": shifted("ack_ns"), "first_token_ns": first,
        "end_ns": end, "token_ns": token_ns, "prompt_tokens": column("prompt_tokens"), "output_tokens": output,
        "status": pc.if_else(pc.is_null(error), "ok", "error"), "error": error,
        "ttft_ns": pc.subtract(first, arrived), "e2e_ns": pc.subtract(end, arrived), "tpot_ns": tpot,
        "source": pa.array([source] * count, pa.string()),
    }, schema=REQUESTS_SCHEMA)
    return table, origin
