"""The Kineto / Chrome JSON reader on tiny inline traces: mapping, linking, layouts and bad input."""

from __future__ import annotations

import gzip
import json

import pandas
import pytest
from conftest import write_trace

from workbench.errors import TraceFormatError
from workbench.trace import read_trace
from workbench.trace.kineto import jsonstream


def _op(name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": args.pop("ext", 0), **args}}


def _launch(ts, corr, ext):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 1, "ts": ts,
            "dur": 2, "args": {"correlation": corr, "External id": ext}}


def _kernel(name, ts, dur, corr, ext, stream=7, device=0):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": ext, "device": device, "stream": stream,
                     "grid": [1, 2, 3]}}


@pytest.fixture
def small(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "step 0", "pid": 10, "tid": 1, "ts": 100.0, "dur": 50.0},
        _op("aten::linear", 101.0, 20.0, ext=1, **{"Input Dims": [[4, 8], [8, 8]], "Input type": ["float"]}),
        _op("aten::addmm", 102.5, 10.25, ext=2),
        _launch(103.0, corr=77, ext=2),
        _kernel("gemm_kernel", 110.0, 5.5, corr=77, ext=2),
        {"ph": "s", "id": 77, "pid": 10, "tid": 1, "ts": 103.0, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 77, "pid": 0, "tid": 7, "ts": 110.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 10, "tid": 1, "ts": 104.0,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 512, "Total Allocated": 512,
                  "Total Reserved": 2048}},
        {"ph": "C", "name": "queue", "pid": 10, "tid": 1, "ts": 105.0, "args": {"depth": 3}},
        {"ph": "M", "name": "thread_name", "pid": 10, "tid": 1, "args": {"name": "python"}},
        {"ph": "X", "cat": "brand_new_category", "name": "mystery", "pid": 10, "tid": 2, "ts": 130.0, "dur": 1.0},
    ]
    return write_trace(tmp_path / "small.json", events, traceName="x", baseTimeNanoseconds=5_000_000)


def test_rows_kinds_and_times(small):
    trace = read_trace(small)
    df = trace.df().set_index("name")
    assert trace.events.num_rows == 6
    assert df.loc["step 0", "kind"] == "annotation"
    assert df.loc["aten::addmm", "kind"] == "op"
    assert df.loc["cudaLaunchKernel", "kind"] == "runtime"
    assert df.loc["gemm_kernel", "kind"] == "kernel"
    assert df.loc["mystery", "kind"] == "other"
    assert json.loads(df.loc["mystery", "args"])["cat"] == "brand_new_category"
    # integer nanoseconds from the earliest record
    assert df.loc["step 0", "start_ns"] == 0
    assert df.loc["aten::addmm", "start_ns"] == 2500
    assert df.loc["aten::addmm", "dur_ns"] == 10250
    assert df.loc["gemm_kernel", "dur_ns"] == 5500
    assert trace.metadata["origin_ns"] == 5_000_000 + 100_000


def test_tracks_devices_and_nesting(small):
    df = read_trace(small).df()
    by = df.set_index("name")
    assert by.loc["gemm_kernel", "track"] == "cuda:0/stream 7"
    assert by.loc["gemm_kernel", "device"] == "cuda:0"
    assert by.loc["aten::addmm", "track"] == "cpu/thread 1"
    assert by.loc["aten::addmm", "device"] == "cpu"
    names = df["name"].tolist()
    assert by.loc["aten::linear", "depth"] == 1
    assert names[by.loc["aten::linear", "parent"]] == "step 0"
    assert names[by.loc["cudaLaunchKernel", "parent"]] == "aten::addmm"
    assert by.loc["cudaLaunchKernel", "depth"] == 3


def test_kernel_linked_through_correlation_to_innermost_op(small):
    df = read_trace(small).df()
    by = df.set_index("name")
    assert by.loc["gemm_kernel", "corr"] == 77
    assert df["name"].iat[by.loc["gemm_kernel", "launcher"]] == "aten::addmm"
    assert by.loc["aten::addmm", "launcher"] == -1


def test_shapes_types_args_kept(small):
    by = read_trace(small).df().set_index("name")
    assert json.loads(by.loc["aten::linear", "shapes"]) == [[4, 8], [8, 8]]
    assert json.loads(by.loc["aten::linear", "dtypes"]) == ["float"]
    assert json.loads(by.loc["gemm_kernel", "args"])["grid"] == [1, 2, 3]


def test_memory_counters_metadata(small):
    trace = read_trace(small)
    mem = trace.df("memory").iloc[0]
    assert (mem["device"], mem["addr"], mem["delta_bytes"], mem["allocated_bytes"], mem["reserved_bytes"]) == (
        "cuda:0", 4096, 512, 512, 2048)
    assert trace.df()["name"].iat[mem["event"]] == "aten::addmm"
    counters = trace.df("counters")
    assert counters[["name", "value"]].values.tolist() == [["queue.depth", 3.0]]
    assert trace.metadata["threads"] == {"10/1": {"name": "python"}}
    assert trace.metadata["source"]["header"]["traceName"] == "x"


def test_external_id_fallback_when_runtime_missing(tmp_path):
    events = [_op("aten::mm", 1.0, 10.0, ext=5), _kernel("k", 20.0, 1.0, corr=999, ext=5)]
    df = read_trace(write_trace(tmp_path / "t.json", events)).df()
    assert df["name"].iat[df.set_index("name").loc["k", "launcher"]] == "aten::mm"


def test_begin_end_pairs_become_spans(tmp_path):
    events = [
        {"ph": "B", "name": "outer", "pid": 1, "tid": 1, "ts": 0},
        {"ph": "B", "name": "inner", "pid": 1, "tid": 1, "ts": 2, "args": {"a": 1}},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 5, "args": {"b": 2}},
        {"ph": "E", "pid": 1, "tid": 1, "ts": 9},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 9},
    ]
    trace = read_trace(write_trace(tmp_path / "be.json", events))
    by = trace.df().set_index("name")
    assert by.loc["outer", "dur_ns"] == 9000
    assert by.loc["inner", "dur_ns"] == 3000
    assert json.loads(by.loc["inner", "args"]) == {"a": 1, "end_args": {"b": 2}}
    assert trace.metadata["reader"]["skipped"]["end events without a begin"] == 1


def test_array_form_without_closing_bracket_and_trailing_comma(tmp_path):
    path = tmp_path / "chrome.json"
    path.write_text('[{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2},\n'
                    '{"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 4, "dur": 1},\n')
    assert read_trace(path).df()["name"].tolist() == ["a", "b"]


def test_unknown_fields_and_odd_types_are_kept_in_args(tmp_path):
    events = [{"ph": "X", "name": "a", "pid": "Spans", "tid": "stream 7", "ts": 1, "dur": 2, "tts": 5,
               "args": {"External id": "not-a-number"}},
              {"ph": "Q", "name": "weird", "pid": 1, "tid": 1, "ts": 3}]
    df = read_trace(write_trace(tmp_path / "odd.json", events)).df().set_index("name")
    # names are no numbers: the row keeps them in its track (its pid and tid are ids standing for them)
    assert df.loc["a", "track"] == "cpu/pid Spans/thread stream 7"
    assert df.loc["a", "tid"] not in (7, -1)
    assert json.loads(df.loc["a", "args"]) == {"External id": "not-a-number", "tts": 5}
    assert df.loc["weird", "kind"] == "other"
    assert json.loads(df.loc["weird", "args"]) == {"ph": "Q"}


def test_many_chunks_equal_one_chunk(tmp_path, monkeypatch):
    # Strings that look like event boundaries must not fool the cutter.
    events = [_op(f'op "}}, {{" {i}', float(i), 0.5, ext=i) for i in range(300)]
    path = write_trace(tmp_path / "many.json", events)
    whole = read_trace(path).df()
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 512)
    chunked = read_trace(path).df()
    assert len(chunked) == 300
    assert chunked["name"].iat[299] == 'op "}, {" 299'
    pandas.testing.assert_frame_equal(chunked, whole)


def test_wrong_cut_in_a_chunk_with_unknown_fields_is_retried(tmp_path, monkeypatch):
    # `tts` sends a chunk to the loose decoder; `}, {` inside args makes cuts that must be retried
    events = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1, "tts": i,
               "args": {"frames": [{"f": 1}, {"f": 2}]}} for i in range(100)]
    path = write_trace(tmp_path / "loose.json", events)
    whole = read_trace(path).df()
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 512)
    pandas.testing.assert_frame_equal(read_trace(path).df(), whole)


def test_gzip_and_plain_read_the_same(small, tmp_path):
    gz = tmp_path / "small.json.gz"
    gz.write_bytes(gzip.compress(small.read_bytes()))
    pandas.testing.assert_frame_equal(read_trace(gz).df(), read_trace(small).df())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"   \n", "empty file"),
        (b"hello world", "unrecognized trace format"),
        (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "X", "na', "truncated"),
        (b'{"foo": 1}', "no 'traceEvents' array"),
        (b'{"foo": ', "not valid JSON"),
        (b'{"traceEvents": [1, 2, 3]}', "not an object"),
        (b'{"traceEvents": []} trailing', "data after the end of the JSON document"),
    ],
)
def test_bad_input_names_file_and_problem(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_gz_name_without_gzip_content(tmp_path):
    path = tmp_path / "trace.json.gz"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match="not gzip-compressed"):
        read_trace(path)


def test_truncated_gzip(tmp_path, small):
    data = gzip.compress(small.read_bytes())
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"truncated|corrupt"):
        read_trace(path)


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "nope.json")


def test_empty_events_array(tmp_path):
    trace = read_trace(write_trace(tmp_path / "empty.json", []))
    assert trace.events.num_rows == 0
    assert trace.memory.num_rows == 0


def test_event_at_time_zero_is_the_origin(tmp_path):
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "p"}},
              {"ph": "X", "name": "first", "pid": 1, "tid": 1, "ts": 0, "dur": 2},
              {"ph": "X", "name": "second", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]
    df = read_trace(write_trace(tmp_path / "zero.json", events)).df().set_index("name")
    assert df.loc["first", "start_ns"] == 0
    assert df.loc["second", "start_ns"] == 5000


def test_empty_records_are_counted_not_rows(tmp_path):
    events = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 10, "dur": 2}, {}]
    trace = read_trace(write_trace(tmp_path / "jax-like.json", events))
    assert trace.df()["name"].tolist() == ["a"]
    assert trace.df()["start_ns"].tolist() == [0]
    assert trace.metadata["reader"]["skipped"]["empty records ({})"] == 1
    assert trace.metadata["reader"]["records"] == 2
