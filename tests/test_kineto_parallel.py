"""Decoding a trace in worker processes gives what decoding it in one process gives: the same Trace,
the same chunks, the same errors at the same offsets, and no processes left behind."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
from pathlib import Path

import msgspec
import numpy as np
import psutil
import pyarrow as pa
import pytest
from conftest import fixture_path, write_trace

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace.kineto import jsonstream
from workbench.trace.kineto import reader as kineto
from workbench.trace.kineto.jsonstream import ChunkDecodeError, TraceEventStream, can_fork
from workbench.trace.kineto.reader import decode_processes, read_kineto

pytestmark = pytest.mark.skipif(not can_fork(), reason="worker processes are forked, on Linux only")

BLOCK = 1024
"""A block size that cuts the small traces below into dozens of chunks."""


def _decode_json(text: bytes) -> list:
    """A chunk decoder for jsonstream alone: the events as Python objects."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ChunkDecodeError(str(exc)) from exc


def _decode_with_pid(text: bytes) -> tuple[int, list]:
    """A chunk decoder that says which process decoded the chunk."""
    return os.getpid(), _decode_json(text)


def _decode_or_die(text: bytes) -> list:
    """A chunk decoder whose process dies on the chunk holding the marked event."""
    if b"POISON" in text:
        os._exit(3)
    return _decode_json(text)


def _events(n: int) -> list[dict]:
    """Varied Kineto records; every third has args holding an array of objects (`}, {` inside an
    event, where a cut is wrong), names hold `}, {` in strings, some have a field no struct declares."""
    events: list[dict] = []
    for i in range(n):
        ts = 10.0 * i
        match i % 9:
            case 0:
                events.append({"name": f'op "}}, {{" {i}', "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": ts,
                               "dur": 5.5, "args": {"External id": i, "Input Dims": [[i, 2]], "Input type": ["float"],
                                                    "frames": [{"f": j} for j in range(i % 5 + 2)]}})
            case 1:
                events.append({"name": "cudaLaunchKernel", "ph": "X", "cat": "cuda_runtime", "pid": 1, "tid": 1,
                               "ts": ts + 1, "dur": 2, "args": {"correlation": i, "External id": i - 1}})
            case 2:
                events.append({"name": f"kernel {i % 4}", "ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": ts + 3,
                               "dur": 1.25, "args": {"correlation": i - 1, "device": 0, "stream": 7,
                                                     "grid": [{"x": 1}, {"y": 2}]}})
            case 3:
                events.append({"name": "[memory]", "ph": "i", "cat": "cpu_instant_event", "s": "t", "pid": 1, "tid": 1,
                               "ts": ts, "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096 + i, "Bytes": 64,
                                                  "Total Allocated": 64 * i, "Total Reserved": 4096}})
            case 4:
                events.append({"name": "ac2g", "ph": "s", "id": i, "pid": 1, "tid": 1, "ts": ts, "cat": "ac2g"})
            case 5:
                events.append({"name": "queue", "ph": "C", "pid": 1, "tid": 1, "ts": ts, "args": {"depth": i % 7}})
            case 6:
                events.append({"name": "mystery", "ph": "X", "cat": "brand_new_category", "pid": 1, "tid": 2,
                               "ts": ts, "dur": 1, "tts": i, "args": {"nested": [{"a": [{"b": 1}]}, {"c": 2}]}})
            case 7:
                events.append({"name": f"range {i}", "ph": "B", "pid": 1, "tid": 3, "ts": ts})
                events.append({"ph": "E", "pid": 1, "tid": 3, "ts": ts + 4, "args": {"end": [{"e": i}]}})
            case 8:
                events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": f"t{i}"}})
    return events


@pytest.fixture
def varied(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "varied.json", _events(400), traceName="varied", baseTimeNanoseconds=7)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", BLOCK)


@pytest.fixture
def restarts(monkeypatch: pytest.MonkeyPatch) -> list[jsonstream.Span]:
    """The spans found to be wrong cuts while decoding in workers (each restarts the cutting)."""
    seen: list[jsonstream.Span] = []
    resume = TraceEventStream.resume

    def counting(self: TraceEventStream, span: jsonstream.Span):
        seen.append(span)
        return resume(self, span)

    monkeypatch.setattr(TraceEventStream, "resume", counting)
    return seen


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    assert psutil.Process().children(recursive=True) == []


def assert_same_trace(parallel, sequential) -> None:
    """Table by table, column by column (NaN equal to NaN), then the metadata."""
    for table in ("events", "memory", "counters"):
        a, b = getattr(parallel, table), getattr(sequential, table)
        assert a.schema == b.schema, table
        assert a.num_rows == b.num_rows, table
        for name in a.column_names:
            if pa.types.is_floating(a[name].type):
                np.testing.assert_array_equal(a[name].to_numpy(), b[name].to_numpy(), err_msg=f"{table}.{name}")
            else:
                assert a[name].equals(b[name]), f"{table}.{name}"
    assert parallel.metadata == sequential.metadata


def test_parallel_trace_equals_sequential(varied, small_blocks, restarts):
    sequential = read_kineto(varied, workers=1)
    assert not restarts
    parallel = read_kineto(varied, workers=2)
    assert restarts, "no cut was wrong: the trace does not test the restart"
    assert sequential.events.num_rows > 200 and sequential.memory.num_rows > 30
    assert sequential.counters.num_rows > 30
    assert_same_trace(parallel, sequential)


@pytest.mark.parametrize(("name", "block"), [
    ("amd_mi250_train.json.gz", BLOCK), ("cpu_only_rank34.pt.trace.json.gz", BLOCK),
    ("triton_example.json.gz", BLOCK), ("ns_resolution_rank0.pt.trace.json.gz", 256 << 10),
])
def test_parallel_real_fixtures_equal_sequential(tmp_path, monkeypatch, name, block):
    path = tmp_path / name.removesuffix(".gz")
    path.write_bytes(gzip.decompress(fixture_path("kineto", name).read_bytes()))
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    assert_same_trace(read_kineto(path, workers=2), read_kineto(path, workers=1))


@pytest.mark.parametrize("layout", ["object", "array"])
def test_stream_chunks_and_header_equal(tmp_path, restarts, layout):
    events = _events(200)
    if layout == "object":
        text = b"\xef\xbb\xbf" + json.dumps({"before": 1, "traceEvents": events, "after": [2]}, indent=1).encode()
    else:  # Chrome's own form: no closing bracket, a trailing comma
        text = ("[" + ",\n".join(json.dumps(e) for e in events) + ",\n").encode()
    path = tmp_path / "t.json"
    path.write_bytes(text)

    def read(parallel: bool) -> tuple[list, dict]:
        with open(path, "rb") as f:
            stream = TraceEventStream(f, path, _decode_json, block_bytes=BLOCK)
            chunks = list(stream.parallel(2) if parallel else stream)
        return chunks, stream.header

    sequential, parallel = read(False), read(True)
    assert parallel == sequential
    assert [e for chunk in parallel[0] for e in chunk] == events
    assert restarts


def test_right_cuts_are_decoded_in_the_workers(tmp_path, restarts):
    events = [{"name": f"e{i}", "ph": "X", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(500)]
    path = write_trace(tmp_path / "plain.json", events)
    with open(path, "rb") as f:
        chunks = list(TraceEventStream(f, path, _decode_with_pid, block_bytes=BLOCK).parallel(2))
    assert not restarts
    assert [e for _, chunk in chunks for e in chunk] == events
    # all but the last event (decoded here, with the end of the document) were decoded by workers
    assert len(chunks) > 10 and os.getpid() not in {pid for pid, _ in chunks[:-1]}
    assert chunks[-1] == (os.getpid(), events[-1:])


def _corrupt(path: Path, name: str, replacement: bytes) -> None:
    """Break the event named `name` in place: its name (with quotes) becomes `replacement`."""
    text = path.read_bytes()
    at = text.index(f'"{name}"'.encode())
    path.write_bytes(text[:at] + replacement + text[at + len(name) + 2:])


def _same_error_either_way(path, match: str | None = None) -> str:
    """The TraceFormatError message of reading `path` in this process, asserted equal to the one with
    two decoding workers."""
    messages = []
    for workers in (1, 2):
        with pytest.raises(TraceFormatError, match=match) as info:
            read_kineto(path, workers=workers)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    return messages[0]


@pytest.mark.parametrize(("events", "broken", "cut"), [
    (600, "e300", 0),
    # the file also ends early, after the broken event: its error, not the end's, is the one raised
    (300, "e280", 100),
])
def test_malformed_event_same_error_and_offset(tmp_path, small_blocks, events, broken, cut):
    path = write_trace(tmp_path / "bad.json", [{"name": f"e{i}", "ph": "X", "pid": 1, "tid": 1, "ts": i, "dur": 1,
                                                "args": {"k": [{"v": i}, {"w": i}]}} for i in range(events)])
    _corrupt(path, broken, f'"{broken}" "no comma"'.encode())
    path.write_bytes(path.read_bytes()[: -cut or None])
    offset = path.read_bytes().index(b'"no comma"')
    error = _same_error_either_way(path)
    assert error == f"{path}: not valid JSON at byte {offset:,}: expected ',' or '}}'"


def test_non_object_event_in_middle_block_same_error(tmp_path, small_blocks):
    path = write_trace(tmp_path / "odd.json", [{"name": f"e{i}", "ph": "X", "pid": 1, "tid": 1, "ts": i, "dur": 1}
                                               for i in range(400)])
    text = path.read_bytes()
    at = text.index(b'"e200"')
    start, end = text.rindex(b"{", 0, at), text.index(b"}", at) + 1
    path.write_bytes(text[:start] + b"12345" + text[end:])
    _same_error_either_way(path, match="is int, not an object")


def test_truncated_file_same_error(varied, small_blocks):
    text = varied.read_bytes()
    varied.write_bytes(text[: len(text) * 2 // 3])
    _same_error_either_way(varied, match="truncated")


def test_dead_worker_is_a_clear_error(tmp_path):
    events = [{"name": "POISON" if i == 150 else f"e{i}", "ph": "X", "ts": i} for i in range(300)]
    path = write_trace(tmp_path / "poison.json", events)
    with open(path, "rb") as f, pytest.raises(WorkbenchError, match="process decoding the trace died") as info:
        list(TraceEventStream(f, path, _decode_or_die, block_bytes=BLOCK).parallel(2))
    assert str(path) in str(info.value)


def test_how_many_processes_decode(tmp_path, varied, monkeypatch):
    with open(varied, "rb") as f:
        assert decode_processes(f) == 1  # small: this process alone
        assert decode_processes(f, workers=3) == 3
        monkeypatch.setattr(kineto, "PARALLEL_MIN_BYTES", 0)
        assert decode_processes(f) == min(kineto.MAX_WORKERS, len(os.sched_getaffinity(0)))
    gz = tmp_path / "varied.json.gz"
    gz.write_bytes(gzip.compress(varied.read_bytes()))
    with kineto.open_trace_file(gz) as f:
        assert decode_processes(f, workers=2) == 1  # only this process can decompress it
    read, write = os.pipe()
    os.close(write)
    with open(read, "rb") as f:
        assert decode_processes(f, workers=2) == 1  # not a regular file: workers could not read it


def test_no_workers_inside_a_daemonic_process():
    # a multiprocessing.Pool worker is daemonic and may not start processes of its own
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(can_fork) is False


def test_gzip_with_workers_requested_reads_the_same(varied, small_blocks, tmp_path):
    gz = tmp_path / "varied.json.gz"
    gz.write_bytes(gzip.compress(varied.read_bytes()))
    assert_same_trace(read_kineto(gz, workers=2), read_kineto(gz, workers=1))
