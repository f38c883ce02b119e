"""Corners of the Trace Event Format (Chrome's JSON trace format, as Perfetto's JSON importer reads it) on
tiny inline traces: each asserts the exact rows the Kineto/Chrome reader makes, and what it counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_trace
from test_kineto_parallel import assert_same_trace

from workbench.cli import main
from workbench.errors import TraceFormatError
from workbench.trace import read_trace
from workbench.trace.kineto import jsonstream
from workbench.trace.kineto.jsonstream import can_fork
from workbench.trace.kineto.reader import read_kineto
from workbench.trace.model import Trace

INT64_MAX = 2**63 - 1
LAST_US = INT64_MAX / 1000
ANCHOR = {"ph": "X", "name": "anchor", "pid": 1, "tid": 1, "ts": 0, "dur": 1}
"""A first event at ts 0, so that the others' start_ns are their ts in ns."""

BAD_TS = "records whose ts is not a number (not rows)"
FAR_TS = "records whose ts is out of range, |ts| >= 2^62 ns (not rows)"
NEGATIVE_DUR = "negative durations (set to 0, dur_as_written in args)"
FAR_DUR = "durations ending past int64 ns (set to 0, dur_as_written in args)"
NAN_DUR = "durations that are not numbers (set to 0, kept in args as dur)"
LOOSE_ARGS = "args values of an unexpected type or past int64 (kept in args only)"
MERGED = "end events (merged into their begin)"


def _read(tmp_path: Path, events: list[dict], **top) -> Trace:
    return read_trace(write_trace(tmp_path / "t.json", events, **top))


def _read_text(tmp_path: Path, events_text: str) -> Trace:
    """A trace whose events array is given as JSON text (for numbers Python's json cannot write)."""
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + json.dumps(ANCHOR) + "," + events_text + "]}")
    return read_trace(path)


def _rows(trace: Trace, *columns: str) -> list[tuple]:
    return [tuple(row[c] for c in columns) for row in trace.events.to_pylist()]


def _skipped(trace: Trace) -> dict[str, int]:
    return trace.metadata["reader"]["skipped"]


def test_times_written_as_strings_are_parsed(tmp_path):
    trace = _read(tmp_path, [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": "100", "dur": "12.5"},
                             {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 101.5, "dur": " 1 "},
                             {"ph": "i", "name": "c", "pid": 1, "tid": 1, "ts": "102.25"}])
    assert _rows(trace, "name", "start_ns", "dur_ns", "args") == [("a", 0, 12_500, None), ("b", 1_500, 1_000, None),
                                                                   ("c", 2_250, 0, None)]
    assert _skipped(trace) == {}


def test_a_duration_that_is_no_number_is_zero_counted_and_kept(tmp_path):
    trace = _read(tmp_path, [ANCHOR, {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2, "dur": "soon"}])
    assert _rows(trace, "name", "start_ns", "dur_ns", "args")[1] == ("b", 2_000, 0, '{"dur":"soon"}')
    assert _skipped(trace) == {NAN_DUR: 1}


def test_ids_that_are_names_stay_distinct(tmp_path):
    events = [{"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": 1, "dur": 1} for name, pid, tid in [
        ("a", "0xa", "MainThread"), ("b", "0xb", "MainThread"), ("c", 10, "1"), ("d", "10", 1), ("e", "0xa", 7)]]
    events.append({"ph": "M", "name": "process_name", "pid": "0xa", "args": {"name": "renderer"}})
    trace = _read(tmp_path, events)
    rows = _rows(trace, "name", "pid", "tid", "track")
    # a process that is a name is always named in the track; the one numbered process needs not be
    assert [r[3] for r in rows] == ["cpu/pid 0xa/thread MainThread", "cpu/pid 0xb/thread MainThread",
                                    "cpu/thread 1", "cpu/thread 1", "cpu/pid 0xa/thread 7"]
    named = trace.metadata["reader"]["named_ids"]
    a, b, c, d, e = rows
    assert (named[str(a[1])], named[str(b[1])], named[str(a[2])]) == ("0xa", "0xb", "MainThread")
    assert a[1] != b[1] and a[1] == e[1] and a[2] == b[2]  # one id per distinct name
    assert c[1:3] == d[1:3] == (10, 1)  # decimal strings are the numbers they write
    assert trace.metadata["processes"] == {"0xa": {"name": "renderer"}}


def test_async_spans_pair_by_id2_local_per_process_and_global_across(tmp_path):
    events = [
        {"ph": "b", "cat": "net", "name": "L", "pid": 1, "tid": 1, "ts": 0, "id2": {"local": "0x1"}},
        {"ph": "b", "cat": "net", "name": "L", "pid": 2, "tid": 1, "ts": 1, "id2": {"local": "0x1"}},
        {"ph": "e", "cat": "net", "name": "L", "pid": 1, "tid": 9, "ts": 5, "id2": {"local": "0x1"}, "args": {"r": 1}},
        {"ph": "e", "cat": "net", "name": "L", "pid": 2, "tid": 1, "ts": 7, "id2": {"local": "0x1"}},
        {"ph": "b", "cat": "net", "name": "G", "pid": 1, "tid": 1, "ts": 2, "id2": {"global": "0x2"}},
        {"ph": "e", "cat": "net", "name": "G", "pid": 3, "tid": 1, "ts": 9, "id2": {"global": "0x2"}},
    ]
    trace = _read(tmp_path, events)
    assert _rows(trace, "name", "start_ns", "dur_ns", "track") == [
        ("L", 0, 5_000, "cpu/async pid 1 net:0x1"),
        ("L", 1_000, 6_000, "cpu/async pid 2 net:0x1"),
        ("G", 2_000, 7_000, "cpu/async net:0x2"),
    ]
    assert json.loads(trace.events["args"][0].as_py()) == {"end_args": {"r": 1}, "cat": "net"}
    assert _skipped(trace)[MERGED] == 3


def test_async_ids_pair_nested_and_unpaired_ones_are_counted(tmp_path):
    events = [
        {"ph": "b", "cat": "c", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "id": "0xa"},
        {"ph": "b", "cat": "c", "name": "inner", "pid": 1, "tid": 1, "ts": 1, "id": "0xa"},
        {"ph": "n", "cat": "c", "name": "mark", "pid": 1, "tid": 1, "ts": 2, "id": "0xa"},
        {"ph": "e", "cat": "c", "pid": 1, "tid": 1, "ts": 3, "id": "0xa"},
        {"ph": "e", "cat": "c", "pid": 1, "tid": 1, "ts": 4, "id": "0xa"},
        {"ph": "b", "cat": "c", "name": "other id", "pid": 1, "tid": 1, "ts": 1, "id": "0xb"},
        {"ph": "e", "cat": "c", "pid": 1, "tid": 1, "ts": 6, "id": 11},  # 11 is not "0xb"
        {"ph": "b", "cat": "c", "name": "no id", "pid": 1, "tid": 1, "ts": 2},
    ]
    trace = _read(tmp_path, events)
    assert _rows(trace, "name", "start_ns", "dur_ns", "track", "depth") == [
        ("outer", 0, 4_000, "cpu/async c:0xa", 0),
        ("inner", 1_000, 2_000, "cpu/async c:0xa", 1),
        ("mark", 2_000, 0, "cpu/async c:0xa", 2),
        ("other id", 1_000, 0, "cpu/async c:0xb", 0),
        ("no id", 2_000, 0, "cpu/thread 1", 0),
    ]
    assert _skipped(trace) == {MERGED: 2, "end events without a begin": 1, UNKNOWN: 5,
                               "begin events without an end (kept, duration as written)": 1,
                               "async records without an id (kept, not paired)": 1}


UNKNOWN = "records of unknown category or phase (kept, kind other)"


def test_legacy_async_start_step_finish(tmp_path):
    events = [
        {"ph": "S", "cat": "load", "name": "fetch", "pid": 1, "tid": 1, "ts": 0, "id": 5},
        {"ph": "T", "cat": "load", "name": "fetch", "pid": 1, "tid": 2, "ts": 3, "id": 5, "args": {"step": "parse"}},
        {"ph": "S", "cat": "load", "name": "other", "pid": 1, "tid": 1, "ts": 1, "id": 5},
        {"ph": "F", "cat": "load", "name": "fetch", "pid": 1, "tid": 3, "ts": 8, "id": 5},
    ]
    trace = _read(tmp_path, events)
    assert _rows(trace, "name", "kind", "start_ns", "dur_ns", "track") == [
        ("fetch", "other", 0, 8_000, "cpu/async load:5 fetch"),
        ("fetch", "other", 3_000, 0, "cpu/async load:5 fetch"),
        ("other", "other", 1_000, 0, "cpu/async load:5 other"),  # another name: its own async op, unfinished
    ]
    assert json.loads(trace.events["args"][1].as_py()) == {"step": "parse", "cat": "load"}


def test_counters_are_series_per_process_and_id(tmp_path):
    events = [
        {"ph": "C", "name": "heap", "pid": 1, "ts": 0, "args": {"value": 10}},
        {"ph": "C", "name": "heap", "pid": 2, "ts": 1, "args": {"value": 20}},
        {"ph": "C", "name": "heap", "pid": 2, "id": "0x7", "ts": 2, "args": {"used": "3.5", "label": "x"}},
        {"ph": "C", "name": "heap", "pid": "gpu", "ts": 3, "args": {"value": 1, "flag": True}},
    ]
    trace = _read(tmp_path, events)
    assert [(r["ts_ns"], r["device"], r["name"], r["value"]) for r in trace.counters.to_pylist()] == [
        (0, "cpu", "pid 1/heap", 10.0), (1_000, "cpu", "pid 2/heap", 20.0),
        (2_000, "cpu", "pid 2/heap[0x7].used", 3.5), (3_000, "cpu", "pid gpu/heap", 1.0)]
    assert _skipped(trace) == {"counter values that are not numbers": 2}
    assert trace.events.num_rows == 0


def test_unknown_phases_and_records_without_ph_are_other_rows(tmp_path):
    events = [ANCHOR, {"ph": "Z", "name": "z", "pid": 1, "tid": 1, "ts": 1},
              {"name": "no ph", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
              {"ph": "P", "name": "sample", "pid": 1, "tid": 1, "ts": 3}, {"ph": 5, "pid": 1, "tid": 1, "ts": 4}]
    trace = _read(tmp_path, events)
    assert _rows(trace, "name", "kind", "start_ns", "dur_ns", "args") == [
        ("anchor", "other", 0, 1_000, None), ("z", "other", 1_000, 0, '{"ph":"Z"}'),
        ("no ph", "other", 2_000, 3_000, None), ("sample", "other", 3_000, 0, '{"ph":"P"}'),
        ("", "other", 4_000, 0, '{"ph":5}')]
    assert _skipped(trace) == {UNKNOWN: 3, "records without 'ph' (kept, kind other)": 1}


def test_nothing_but_records_without_ph_is_still_a_trace(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"foo": 1}]}')
    trace = read_trace(path)
    assert _rows(trace, "name", "kind", "args") == [("", "other", '{"foo":1}')]


@pytest.mark.parametrize(("events", "warning"), [
    ([], "no trace events: traceEvents is empty"),
    ([{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}}],
     "no trace events: its 1 records are all metadata, flows, counters or memory records"),
])
def test_an_empty_trace_imports_with_a_warning(tmp_path, events, warning):
    trace = _read(tmp_path, events)
    assert trace.events.num_rows == 0
    assert trace.metadata["reader"]["warnings"] == [warning]
    runner, root = CliRunner(), tmp_path / "traces"
    imported = runner.invoke(main, ["import", str(tmp_path / "t.json"), "--out", str(root)])
    assert imported.exit_code == 0, imported.output
    (run_id,) = imported.stdout.split()
    assert f"warning: {run_id}: {warning}" in imported.stderr
    shown = runner.invoke(main, ["show", run_id, "--out", str(root)])
    assert shown.exit_code == 0 and f"warning: {warning}" in shown.stderr
    as_json = runner.invoke(main, ["show", run_id, "--out", str(root), "--json"])
    assert json.loads(as_json.stdout)["warnings"] == [warning]


@pytest.mark.parametrize(("event", "row", "skipped"), [
    ('{"ph":"X","name":"n","pid":1,"tid":1,"ts":2,"dur":-5}', (2_000, 0, '{"dur_as_written":-5.0}'), NEGATIVE_DUR),
    ('{"ph":"X","name":"n","pid":1,"tid":1,"ts":3,"dur":1e300}',
     (3_000, 0, '{"dur_as_written":1e300}'), FAR_DUR),
    ('{"ph":"X","name":"n","pid":1,"tid":1,"ts":3,"dur":1e400}', (3_000, 0, '{"dur":1E+400}'), FAR_DUR),
    (f'{{"ph":"X","name":"n","pid":1,"tid":1,"ts":3,"dur":{LAST_US}}}', (3_000, 0, f'{{"dur_as_written":{LAST_US}}}'),
     FAR_DUR),  # would end 3 µs past int64 ns
    (f'{{"ph":"X","name":"n","pid":1,"tid":1,"ts":{INT64_MAX},"dur":1}}', None, FAR_TS),
    ('{"ph":"X","name":"n","pid":1,"tid":1,"ts":"inf","dur":1}', None, FAR_TS),
    ('{"ph":"X","name":"n","pid":1,"tid":1,"ts":"NaN","dur":1}', None, BAD_TS),
    ('{"ph":"X","name":"n","pid":1,"tid":1,"ts":"soon","dur":1}', None, BAD_TS),
    ('{"ph":"C","name":"n","pid":1,"ts":"NaN","args":{"value":1}}', None, BAD_TS),
])
def test_out_of_range_numbers_are_counted_never_silently_changed(tmp_path, event, row, skipped):
    trace = _read_text(tmp_path, event)
    rows = _rows(trace, "start_ns", "dur_ns", "args")
    assert rows[1:] == ([row] if row else [])
    assert _skipped(trace) == {skipped: 1}
    assert trace.counters.num_rows == 0


def test_ids_past_int64_neither_crash_nor_link(tmp_path):
    big = 2**63
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 0, "dur": 1,
         "args": {"correlation": big, "External id": big}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1,
         "args": {"correlation": big, "External id": big, "device": 0, "stream": 7}},
        *({"ph": "X", "name": f"p{i}", "pid": pid, "tid": tid, "ts": 2, "dur": 1}
          for i, (pid, tid) in enumerate([(big, 1), (2**64, 2**64), (-(2**63) - 1, 1), (big, 2**63 - 1)])),
    ]
    trace = _read(tmp_path, events)
    rows = _rows(trace, "name", "corr", "launcher", "track")
    assert rows[:2] == [("launch", -1, -1, "cpu/thread 1"), ("k", -1, -1, "cuda:0/stream 7")]
    assert [r[3] for r in rows[2:]] == [
        f"cpu/pid {big}/thread 1", f"cpu/pid {2**64}/thread {2**64}", f"cpu/pid {-(2**63) - 1}/thread 1",
        f"cpu/pid {big}/thread {2**63 - 1}"]
    assert f'"correlation":{big}' in trace.events["args"][1].as_py().replace(" ", "")
    assert _skipped(trace) == {LOOSE_ARGS: 4}


def test_args_nested_a_thousand_deep_are_kept(tmp_path):
    nested = "[" * 1000 + "]" * 1000
    limit = sys.getrecursionlimit()
    trace = _read_text(tmp_path, '{"ph":"X","name":"deep","pid":1,"tid":1,"ts":1,"dur":1,"args":{"a":' + nested + "}}")
    assert trace.events["args"][1].as_py() == '{"a":' + nested + "}"
    assert sys.getrecursionlimit() == limit  # the reader raised it while reading only


def test_json_nested_past_the_limit_is_a_clear_error(tmp_path):
    with pytest.raises(TraceFormatError, match="nested more than 20,000 levels deep") as info:
        _read_text(tmp_path, '{"ph":"X","name":"deep","pid":1,"tid":1,"ts":1,"args":{"a":'
                   + "[" * 30_000 + "]" * 30_000 + "}}")
    assert "t.json" in str(info.value)


@pytest.mark.parametrize(("props", "devices", "warning"), [
    ({"id": 0}, [], "deviceProperties is a dict, not a list of objects"),
    ("A100", [], "deviceProperties is a str, not a list of objects"),
    ([1, {"id": 3, "name": "X"}], ["cuda:3"], "1 deviceProperties entries are not objects"),
])
def test_device_properties_that_are_not_objects_are_kept_and_warned_about(tmp_path, props, devices, warning):
    trace = _read(tmp_path, [ANCHOR], deviceProperties=props)
    assert [d["device"] for d in trace.metadata["devices"]] == devices
    (said,) = trace.metadata["reader"]["warnings"]
    assert said.startswith(warning)
    assert trace.metadata["source"]["header"]["deviceProperties"] == props


@pytest.mark.skipif(not can_fork(), reason="worker processes are forked, on Linux only")
def test_corners_read_the_same_in_workers_and_in_chunks(tmp_path, monkeypatch):
    events = [ANCHOR]
    for i in range(40):  # every corner above, many times over, so that chunks cut between begins and ends
        events += [
            {"ph": "X", "name": f"s{i}", "pid": "Main", "tid": f"worker {i % 3}", "ts": str(10 + i), "dur": "0.5"},
            {"ph": "b", "cat": "c", "name": "a", "pid": i % 2, "tid": 1, "ts": i, "id2": {"local": i % 4}},
            {"ph": "e", "cat": "c", "name": "a", "pid": i % 2, "tid": 1, "ts": i + 3, "id2": {"local": i % 4}},
            {"ph": "S", "cat": "c", "name": "o", "pid": 1, "tid": 1, "ts": i, "id": "0xa"},
            {"ph": "F", "cat": "c", "name": "o", "pid": 1, "tid": 1, "ts": i + 1, "id": "0xa"},
            {"ph": "C", "name": "ctr", "pid": i % 3, "id": i % 2, "ts": i, "args": {"v": i, "w": "x"}},
            {"ph": "X", "name": "neg", "pid": 2**64, "tid": 1, "ts": i, "dur": -1},
            {"ph": "X", "name": "nan", "pid": 1, "tid": 1, "ts": "NaN", "dur": 1},
            {"name": "no ph", "pid": 1, "tid": 1, "ts": i},
        ]
    path = write_trace(tmp_path / "corners.json", events)
    whole = read_kineto(path, workers=1)
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 512)
    assert_same_trace(read_kineto(path, workers=2), whole)
    assert_same_trace(read_kineto(path, workers=1), whole)


def test_json_converted_from_an_xspace_is_classified_by_its_planes_and_lines(tmp_path):
    """The Chrome JSON `jax.profiler` writes beside an XSpace: processes are planes, threads are lines (the
    host plane's rows are compared with a real capture in test_xspace_reader)."""
    meta = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "XLA Ops"}},
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 2, "args": {"name": "Stream #14(Compute)"}},
            {"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 9, "tid": 3, "args": {"name": "python"}}]
    events = [{"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": 0, "dur": 1, **extra}
              for name, pid, tid, extra in [("fusion.1", 7, 1, {"args": {"hlo_op": "fusion.1", "hlo_module": "jit_f"}}),
                                            ("loop_fusion_kernel", 7, 2, {}), ("$main.py:3 f", 9, 3, {}),
                                            ("train", 9, 3, {"args": {"step_num": "0"}})]]
    trace = _read(tmp_path, meta + events)
    assert _rows(trace, "name", "kind", "device", "track") == [
        ("fusion.1", "hlo", "cuda:0", "cuda:0/XLA Ops"),
        ("loop_fusion_kernel", "kernel", "cuda:0", "cuda:0/Stream #14(Compute)"),
        ("$main.py:3 f", "python", "cpu", "cpu/python/python tracer"),
        ("train", "annotation", "cpu", "cpu/python"),
    ]
