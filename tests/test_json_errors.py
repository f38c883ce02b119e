"""A JSON file that is not a readable trace fails fast, in one line naming the file, the real cause and
the byte where it is, the same whether the file is decoded in one process or by workers; so does input
that is no file at all (a named pipe, a folder). Offsets are found in the raw bytes by the tests."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fixture_path

from workbench.errors import TraceFormatError
from workbench.trace import read_trace
from workbench.trace.kineto import jsonstream
from workbench.trace.kineto.jsonstream import can_fork
from workbench.trace.kineto.reader import read_kineto

NOT_A_TRACE = "not a Chrome trace (expected an object with traceEvents, or an array of event objects)"


def _event(i: int) -> dict:
    """An event whose args hold an array of objects (`}, {` inside an event, where a cut is wrong)."""
    return {"name": f"e{i}", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": i, "dur": 1,
            "args": {"k": [{"v": i}, {"w": i}]}}


GOOD = json.dumps({"schemaVersion": 1, "traceEvents": [_event(i) for i in range(400)], "traceName": "t",
                   "after": [{"a": 1}, {"b": 2}]}, indent=1).encode()
"""An object-form trace of ~80 KB with keys after the events array."""


def _replace(old: bytes, new: bytes) -> tuple[bytes, int]:
    """`GOOD` with the first `old` in its last quarter replaced by `new`; and that offset."""
    at = GOOD.index(old, len(GOOD) * 3 // 4)
    return GOOD[:at] + new + GOOD[at + len(old):], at


def _write(tmp_path: Path, content: bytes, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def _error(path: Path, **kwargs) -> str:
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def _broken(case: str) -> tuple[bytes, str]:
    """A malformed trace and the error it must raise (without the leading path)."""
    if case == "trailing comma in object":
        text, at = _replace(b'"v": 350\n', b'"v": 350,\n')
        return text, f"not valid JSON at byte {at + 8:,}: trailing comma in object"
    if case == "trailing comma in array":
        text, at = _replace(b'"w": 350\n     }\n', b'"w": 350\n     },\n')
        return text, f"not valid JSON at byte {text.index(b'},', at) + 1:,}: trailing comma in array"
    if case in ("NaN", "Infinity", "-Infinity"):
        text, at = _replace(b'"ts": 350', b'"ts": ' + case.encode())
        return text, f"not valid JSON at byte {at + 6:,}: {case} is not a JSON number (JSON has no NaN or infinities)"
    if case == "invalid UTF-8":
        text, at = _replace(b'"e350"', b'"e\xff350"')
        return text, f"not valid JSON at byte {at + 2:,}: invalid UTF-8 (byte 0xff: invalid start byte)"
    if case == "control character":
        text, at = _replace(b'"e350"', b'"e\n350"')
        return text, (f"not valid JSON at byte {at + 2:,}: control character 0x0a (in a string it must be "
                      "written as an escape)")
    if case == "missing comma between events":
        text, at = _replace(b'},\n  {\n   "name": "e351"', b'}\n  {\n   "name": "e351"')
        return text, f"not valid JSON at byte {text.index(b'{', at + 1):,}: expected ',' or ']'"
    if case == "unterminated string":
        at = GOOD.index(b'"e390"')
        return GOOD[: at + 3], (f"not valid JSON at byte {at:,}: unterminated string (the file ends inside the "
                                "string that starts here: truncated?)")
    if case == "truncated inside an event":
        at = GOOD.rindex(b"{", 0, GOOD.index(b'"e390"'))
        return GOOD[: GOOD.index(b'"ts": 390,') + 10], (f"not valid JSON at byte {at:,}: truncated (the file ends "
                                                         "inside the event that starts here, or a bracket in it "
                                                         "never closes)")
    if case == "truncated after the array":
        text = GOOD[: GOOD.index(b'"traceName"')]
        return text, (f"not valid JSON at byte {len(text):,}: truncated (the file ends before the document closes, "
                      "after the traceEvents array)")
    if case == "truncated before the array closes":
        text = GOOD[: GOOD.index(b"\n ],\n")] + b","
        return text, (f"not valid JSON at byte {len(text):,}: truncated (the file ends before the traceEvents "
                      "array closes)")
    if case == "data after the document":
        return GOOD + b"\n}", f"not valid JSON at byte {len(GOOD) + 1:,}: data after the end of the JSON document"
    raise AssertionError(case)


CASES = ["trailing comma in object", "trailing comma in array", "NaN", "Infinity", "-Infinity", "invalid UTF-8",
         "control character", "missing comma between events", "unterminated string", "truncated inside an event",
         "truncated after the array", "truncated before the array closes", "data after the document"]


def test_the_unbroken_trace_reads(tmp_path):
    assert read_trace(_write(tmp_path, GOOD, "good.json")).events.num_rows == 400


@pytest.mark.parametrize("case", CASES)
def test_json_error_names_cause_and_byte(tmp_path, case):
    content, problem = _broken(case)
    path = _write(tmp_path, content)
    assert _error(path) == f"{path}: {problem}"


@pytest.mark.skipif(not can_fork(), reason="worker processes are forked, on Linux only")
@pytest.mark.parametrize("block", [1024, 300, 1 << 20])
@pytest.mark.parametrize("case", CASES)
def test_same_error_in_one_process_and_in_workers(tmp_path, monkeypatch, case, block):
    content, problem = _broken(case)
    path = _write(tmp_path, content)
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", block)
    for workers in (1, 2):
        with pytest.raises(TraceFormatError) as info:
            read_kineto(path, workers=workers)
        assert str(info.value) == f"{path}: {problem}", f"{workers} worker(s)"


def test_gzip_offsets_are_in_the_decompressed_data(tmp_path):
    content, problem = _broken("NaN")
    path = _write(tmp_path, gzip.compress(content), "bad.json.gz")
    at = problem.index(":")
    assert _error(path) == f"{path}: {problem[:at]} of the decompressed data{problem[at:]}"


@pytest.mark.parametrize(("document", "problem"), [
    (b'{"foo": 1, "bar": [1, 2]}', f"a JSON object with no 'traceEvents' array (keys: foo, bar), {NOT_A_TRACE}"),
    (b'{"traceEvents": {"ph": "X"}}', "'traceEvents' is an object, not an array: not a Chrome trace"),
    (b'{"traceEvents": [1, 2, 3]}', "traceEvents[0] is a number, not an object (traceEvents must hold event objects)"),
    (b'[["a", 1], ["b", 2]]', f"a JSON array of arrays, {NOT_A_TRACE}"),
    (b'  ["a", "b"]', f"a JSON array of strings, {NOT_A_TRACE}"),
    (b'{"a": [1, "traceEvents": [{"ph": "X"}]}',
     'not valid JSON at byte 10: "traceEvents" is not a key of the top-level object (a value before it does not '
     'close)'),
    (b'{"a": 1 "traceEvents": [{"ph": "X"}]}', "not valid JSON at byte 8: expected ',' or '}'"),
    (b'{"a": 1,, "traceEvents": [{"ph": "X"}]}', "not valid JSON at byte 8: object keys must be strings"),
    (b'{"foo": ', "not valid JSON at byte 0: truncated (the file ends inside the JSON object that starts here, "
                  "or a bracket in it never closes)"),
    (b'{"traceEvents": [{"ph": "X"}], "x": [1,]}', "not valid JSON at byte 38: trailing comma in array"),
    (b'{"traceEvents": [{"ph": "X"}] "x": 1}',
     "not valid JSON at byte 30: expected ',' or '}' after the traceEvents array"),
    (b'[{"ph": "X"}] x', "not valid JSON at byte 14: data after the events array"),
])
def test_document_that_is_not_a_trace_says_what_it_is(tmp_path, document, problem):
    path = _write(tmp_path, document)
    assert _error(path) == f"{path}: {problem}"


@pytest.mark.timeout(60)
def test_memory_timeline_export_is_refused_as_an_array_of_arrays():
    path = fixture_path("bad", "torch_memory_timeline.raw.json.gz")
    with gzip.open(path) as f:
        first = json.load(f)[0]
    assert isinstance(first, list)  # what the message must say, from the raw file
    assert _error(path) == f"{path}: a JSON array of arrays, {NOT_A_TRACE}"


# The files below are sized so that the reader before issue 13 (which decoded the text again at every
# candidate cut) took more than 90 s on each, and this one less than a second: the timeout guards
# catch time that grows with the square of the size, not slowness.


def _big_trace(events: int, args: dict) -> bytes:
    return json.dumps({"traceEvents": [{"name": f"e{i}", "ph": "X", "ts": i, "dur": 1, "args": args}
                                       for i in range(events)]}).encode()


@pytest.mark.timeout(60)
def test_syntax_error_in_a_big_file_fails_fast(tmp_path):
    text = _big_trace(100_000, {"k": [{"v": 1}, {"w": 2}]})  # 9 MB: the error is in the second block
    at = text.index(b'"ts": 60000,')
    path = _write(tmp_path, text[:at] + b'"ts": NaN,' + text[at + 12:])
    assert _error(path) == (f"{path}: not valid JSON at byte {at + 6:,}: NaN is not a JSON number (JSON has no NaN "
                            "or infinities)")


@pytest.mark.timeout(60)
def test_event_made_of_nested_objects_reads_fast(tmp_path, monkeypatch):
    # every `}, {` in the one big event is a wrong cut: they must not be tried one after another
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 320 << 10)
    frames = [{"f": i} for i in range(80_000)]  # 1.1 MB: less than the 4 blocks an event may span
    events = [{"name": "big", "ph": "X", "ts": 0, "dur": 1, "args": {"frames": frames}},
              {"name": "next", "ph": "i", "ts": 1}]
    path = _write(tmp_path, json.dumps({"traceEvents": events}).encode(), "ok.json")
    assert read_trace(path).events.num_rows == 2


@pytest.mark.timeout(60)
def test_unclosed_bracket_early_in_a_big_file_fails_fast(tmp_path, monkeypatch):
    # the broken event swallows every later one as an array item: the error shows only where the text ends
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 256 << 10)
    text = _big_trace(40_000, {"k": [{"v": 1}]})
    at = text.index(b'{"v": 1}]}}', len(text) // 10)
    event = text.rindex(b'{"name"', 0, at)
    path = _write(tmp_path, text[:at] + b'{"v": 1}' + text[at + 11:])
    assert _error(path) == (f"{path}: not valid JSON at byte {event:,}: an event that does not end within "
                            f"{4 * (256 << 10):,} bytes (a bracket or string in it never closes)")


@pytest.mark.timeout(60)
def test_big_array_of_arrays_is_refused_at_once(tmp_path):
    path = _write(tmp_path, json.dumps([[i, 1, 512 * i, 7] for i in range(150_000)]).encode())  # 3.8 MB
    assert _error(path) == f"{path}: a JSON array of arrays, {NOT_A_TRACE}"


@pytest.mark.timeout(60)
def test_arrays_after_a_first_event_fail_fast(tmp_path):
    # no `}, {` to cut at: the values are stepped over one by one, each once
    rows = [[i, 1, 512 * i, 7] for i in range(150_000)]
    path = _write(tmp_path, json.dumps([{"name": "a", "ph": "X", "ts": 0, "dur": 1}, *rows]).encode())
    message = _error(path)
    assert message.startswith(f"{path}: traceEvents[1] is list, not an object")


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "empty file"),
    (b" \n\t\r\n", "empty file (only whitespace)"),
    (b" " * 10_000, "empty file (only whitespace)"),
])
def test_empty_files(tmp_path, content, problem):
    path = _write(tmp_path, content)
    assert _error(path) == f"{path}: {problem}"
    gz = _write(tmp_path, gzip.compress(content), "bad.json.gz")
    assert _error(gz) == f"{gz}: {problem}"


def test_leading_whitespace_longer_than_the_sniffed_head_is_no_empty_file(tmp_path):
    path = _write(tmp_path, b" " * 10_000 + json.dumps({"traceEvents": [_event(1)]}).encode(), "ok.json")
    assert read_trace(path).events.num_rows == 1


def test_truncated_gzip(tmp_path):
    data = gzip.compress(GOOD)
    path = _write(tmp_path, data[: len(data) // 2], "cut.json.gz")
    assert _error(path) == (f"{path}: truncated gzip file: the compressed data ends early (Compressed file ended "
                            "before the end-of-stream marker was reached)")


def test_corrupt_gzip(tmp_path):
    data = gzip.compress(GOOD)
    crc = int.from_bytes(data[-8:-4], "little")
    path = _write(tmp_path, data[:-8] + (crc ^ 1).to_bytes(4, "little") + data[-4:], "crc.json.gz")
    assert _error(path) == f"{path}: corrupt gzip data (CRC check failed {crc ^ 1:#x} != {crc:#x})"


@pytest.mark.timeout(60)
def test_named_pipe_is_refused_before_it_is_opened(tmp_path):
    path = tmp_path / "pipe.json"
    os.mkfifo(path)  # opening it to read would wait for a writer: the timeout catches that
    problem = "is not a regular file (a FIFO): give a trace file or a profile folder"
    assert _error(path) == f"{path}: {problem}"
    assert _error(path, format="kineto") == f"{path}: {problem}"


def test_folder(tmp_path):
    assert _error(tmp_path, format="kineto") == f"{tmp_path}: is a folder, not a kineto trace file"
    assert "a folder holding no trace" in _error(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file(tmp_path):
    path = _write(tmp_path, GOOD, "locked.json")
    path.chmod(0)
    assert _error(path) == f"{path}: cannot open: Permission denied"


# --- through the CLI ------------------------------------------------------------------------------------------


def _cli_import(path: Path, root: Path) -> subprocess.CompletedProcess:
    """`python -m workbench import PATH` in a fresh process, with `root` as the traces root."""
    env = {**os.environ, "WORKBENCH_TRACES": str(root)}
    return subprocess.run([sys.executable, "-m", "workbench", "import", str(path)], env=env, capture_output=True,
                          text=True, timeout=120)


def _bad_input(kind: str, folder: Path) -> tuple[Path, str, bool]:
    """A bad input of this kind made in `folder`, the problem its one line must give, and whether that
    is the whole message (else a part of it)."""
    if kind == "memory timeline":
        return fixture_path("bad", "torch_memory_timeline.raw.json.gz"), f"a JSON array of arrays, {NOT_A_TRACE}", True
    if kind == "NaN":
        content, problem = _broken("NaN")
        return _write(folder, content, "nan.json"), problem, True
    if kind == "truncated gzip":
        data = gzip.compress(GOOD)
        return _write(folder, data[: len(data) // 2], "cut.json.gz"), "truncated gzip file", False
    if kind == "empty":
        return _write(folder, b"", "empty.json"), "empty file", True
    if kind == "named pipe":
        os.mkfifo(folder / "pipe.json")
        return folder / "pipe.json", "FIFO", False  # refused by the import command or by the reader
    if kind == "folder":
        return folder, "a folder holding no trace", False
    raise AssertionError(kind)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["memory timeline", "NaN", "truncated gzip", "empty", "named pipe", "folder"])
def test_cli_import_of_bad_input_is_one_line_and_exit_2(tmp_path, kind):
    inputs = tmp_path / "in"
    inputs.mkdir()
    path, problem, whole = _bad_input(kind, inputs)
    root = tmp_path / "traces"
    done = _cli_import(path, root)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    if whole:
        assert lines[0] == f"error: {path}: {problem}"
    else:
        assert lines[0].startswith(f"error: {path}: ") and problem in lines[0]
    assert done.stdout == ""
    assert not root.exists() or list(root.iterdir()) == []
