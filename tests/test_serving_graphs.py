"""Graph-replayed kernels (`workbench.serving.graphs`): each kernel a CUDA/HIP graph launch replays gets the op that
launched it at capture time. Expected figures come from the raw fixture files (json and gzip only)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_path, write_trace

from workbench.errors import TraceFormatError
from workbench.serving.graphs import PATH_CHARS, graph_kernels, graph_kernels_summary
from workbench.trace import read_trace

FIXTURES = ["vllm_decode_full/graph_execution.json.gz", "vllm_prefilldecode_piecewise/graph_execution.json.gz",
            "sglang_decode/sglang_Qwen3-8B_decode.json.gz"]


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as raw:
        return json.load(raw)["traceEvents"]


def _capture_file(execution: Path) -> Path:
    """The capture trace beside an execution trace: the one `.json.gz` in `capture_traces/`."""
    (capture,) = sorted((execution.parent / "capture_traces").glob("*.json.gz"))
    return capture


def _raw_join(execution: Path, capture: Path) -> list[tuple[str, str, float]]:
    """Per replayed kernel of the raw execution file: (kernel, capture-time op, dur µs). The fixtures launch their
    captured graphs once each, in capture order, so launch i pairs with capture span i; a launch call's op is the
    innermost cpu_op around it in time on its thread."""
    cap = _events(capture)
    runtime = sorted((e for e in cap if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"),
                     key=lambda e: e["ts"])
    begins = [e for e in runtime if e["name"].endswith("StreamBeginCapture")]
    ends = [e for e in runtime if e["name"].endswith("StreamEndCapture")]
    ops = [e for e in cap if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    starts = np.array([e["ts"] for e in ops])
    stops = starts + np.array([e["dur"] for e in ops])
    thread = np.array([f"{e['pid']}/{e['tid']}" for e in ops])
    graphs = []
    for begin, end in zip(begins, ends, strict=True):
        graph = []
        for call in runtime:
            if begin["ts"] < call["ts"] < end["ts"] and "kernel" in call["args"] and call["tid"] == begin["tid"]:
                around = np.flatnonzero((starts <= call["ts"]) & (call["ts"] + call["dur"] <= stops)
                                        & (thread == f"{call['pid']}/{call['tid']}"))
                innermost = around[np.lexsort((stops[around], -starts[around]))[0]]
                graph.append((call["args"]["kernel"], ops[innermost]["name"]))
        graphs.append(graph)
    ex = _events(execution)
    launches = sorted((e for e in ex if e.get("cat") == "cuda_runtime" and e["name"].endswith("GraphLaunch")),
                      key=lambda e: e["ts"])
    assert len(launches) == len(graphs)
    joined = []
    for launch, graph in zip(launches, graphs, strict=True):
        replayed = sorted((e for e in ex if e.get("cat") == "kernel"
                           and e["args"].get("correlation") == launch["args"]["correlation"]), key=lambda e: e["ts"])
        assert [e["name"] for e in replayed] == [name for name, _ in graph]
        joined += [(e["name"], op, e["dur"]) for e, (_, op) in zip(replayed, graph, strict=True)]
    return joined


@pytest.mark.parametrize("name", FIXTURES)
def test_every_replayed_kernel_of_a_fixture_gets_its_capture_time_op(name):
    execution = fixture_path("serving", name)
    capture = _capture_file(execution)
    expected = _raw_join(execution, capture)
    table = graph_kernels(read_trace(execution), read_trace(capture))
    assert table.num_rows == len(expected)
    assert table["matched"].to_pylist() == [True] * len(expected)
    assert table["op"].to_pylist() == [op for _, op, _ in expected]
    summary = graph_kernels_summary(table, top=5)
    assert summary["kernels"] == summary["matched"] == len(expected) and summary["unmatched_ns"] == 0
    counts = Counter(op for _, op, _ in expected)
    busy: Counter = Counter()
    for _, op, dur in expected:
        busy[op] += dur
    top = sorted(busy, key=lambda op: -busy[op])[:5]
    assert [o["op"] for o in summary["by_op"]] == top
    for row in summary["by_op"]:
        assert row["kernels"] == counts[row["op"]]
        assert row["kernel_ns"] == pytest.approx(busy[row["op"]] * 1000, abs=len(expected))
    assert summary["other_ops"]["kernels"] == len(expected) - sum(counts[op] for op in top)


def test_the_piecewise_fixture_pairs_each_piece_with_its_own_graph():
    execution = fixture_path("serving", FIXTURES[1])
    table = graph_kernels(read_trace(execution), read_trace(_capture_file(execution)))
    launches = table["graph_launch_row"].to_numpy()
    graph_of_launch = [int(table["graph_id"][int(np.flatnonzero(launches == row)[0])].as_py())
                       for row in dict.fromkeys(launches.tolist())]
    assert graph_of_launch == list(range(25))  # layers 1-23 have the same kernels: order tells them apart
    assert table["node"].to_pylist()[:5] == [0, 1, 2, 3, 0]


@pytest.mark.parametrize("other", [FIXTURES[2], FIXTURES[1]])  # another model; the same model's PIECEWISE graphs
def test_a_capture_of_other_graphs_is_refused_naming_the_capture_file(other):
    execution = fixture_path("serving", FIXTURES[0])
    capture = _capture_file(fixture_path("serving", other))
    with pytest.raises(TraceFormatError, match="does not capture the graphs") as err:
        graph_kernels(read_trace(execution), read_trace(capture))
    assert err.value.path == str(capture) and str(execution) in err.value.problem


def test_a_trace_without_graph_capture_is_refused(tmp_path):
    execution = fixture_path("serving", FIXTURES[0])
    with pytest.raises(TraceFormatError, match="no graph capture") as err:
        graph_kernels(read_trace(execution), read_trace(execution))
    assert err.value.path == str(execution)
    empty = write_trace(tmp_path / "empty.json", [])
    with pytest.raises(TraceFormatError, match="no graph capture"):
        graph_kernels(read_trace(execution), read_trace(empty))


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(kernel: str, ts: float, corr: int) -> dict:
    return _x("cuda_runtime", "hipLaunchKernel", ts, 1, kernel=kernel, correlation=corr)


def _kernel(name: str, ts: float, corr: int, dur: float = 2) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": 0, "stream": 7}}


def _capture(tmp_path: Path) -> Path:
    """Two captured graphs: [gemm under layer0 > aten::mm, relu_k under aten::relu] and [add_k under aten::add];
    a launch outside any capture span (stray) and one on another thread are not graph nodes."""
    events = [
        _x("cuda_runtime", "hipStreamBeginCapture", 10, 1, correlation=1),
        _x("python_function", "nn.Module: Block_0", 15, 40),
        _x("user_annotation", "layer0", 18, 15),
        _x("cpu_op", "aten::mm", 20, 10),
        _launch("gemm", 22, 2),
        _x("cpu_op", "aten::relu", 40, 10),
        _launch("relu_k", 42, 3),
        _launch("elsewhere", 45, 4) | {"tid": 2},
        _x("cuda_runtime", "hipStreamEndCapture", 60, 1, correlation=5),
        _x("cpu_op", "aten::fill_", 65, 10),
        _launch("stray", 70, 6),
        _x("cuda_runtime", "hipStreamBeginCapture", 100, 1, correlation=7),
        _x("cpu_op", "aten::add", 105, 10),
        _launch("add_k", 107, 8),
        _x("cuda_runtime", "hipStreamEndCapture", 120, 1, correlation=9),
    ]
    return write_trace(tmp_path / "capture.json", events)


def _execution(tmp_path: Path, replays: list[list[str]]) -> Path:
    """One hipGraphLaunch per entry of `replays`, replaying those kernels; an eager kernel before them."""
    events = [_x("cpu_op", "aten::copy_", 0, 5), _launch("copy_k", 1, 50), _kernel("copy_k", 3, 50)]
    for i, kernels in enumerate(replays):
        ts, corr = 100 + 100 * i, 100 + i
        events.append(_x("cuda_runtime", "hipGraphLaunch", ts, 5, correlation=corr))
        events += [_kernel(name, ts + 10 + 3 * n, corr, dur=n + 1) for n, name in enumerate(kernels)]
    return write_trace(tmp_path / "execution.json", events)


def test_a_hand_built_pair_gives_the_known_ops_paths_and_nodes(tmp_path):
    replays = [["gemm", "relu_k"], ["add_k"], ["gemm", "relu_k"], ["add_k"]]  # two steps of two graphs
    execution = read_trace(_execution(tmp_path, replays))
    table = graph_kernels(execution, read_trace(_capture(tmp_path))).to_pylist()
    names = execution.events["name"].to_pylist()
    assert [names[r["row"]] for r in table] == [k for kernels in replays for k in kernels]
    assert [names[r["graph_launch_row"]] for r in table] == ["hipGraphLaunch"] * 6
    assert [(r["graph_id"], r["node"], r["op"]) for r in table] == [
        (0, 0, "aten::mm"), (0, 1, "aten::relu"), (1, 0, "aten::add")] * 2
    assert table[0]["op_path"] == "nn.Module: Block_0 > layer0 > aten::mm"
    assert table[1]["op_path"] == "nn.Module: Block_0 > aten::relu"
    assert all(r["matched"] and r["capture_kernel"] == names[r["row"]] for r in table)
    assert [r["dur_ns"] for r in table] == [1000, 2000, 1000] * 2
    summary = graph_kernels_summary(graph_kernels(execution, read_trace(_capture(tmp_path))))
    assert summary["graph_launches"] == 4 and summary["kernels"] == summary["matched"] == 6
    assert summary["by_op"] == [{"op": "aten::relu", "kernels": 2, "kernel_ns": 4000},
                                {"op": "aten::add", "kernels": 2, "kernel_ns": 2000},
                                {"op": "aten::mm", "kernels": 2, "kernel_ns": 2000}]


def test_graphs_with_the_same_kernels_pair_in_capture_order(tmp_path):
    events = []
    for i in range(3):  # three identical layers, captured one after another
        ts = 100 * i
        events += [_x("cuda_runtime", "hipStreamBeginCapture", ts, 1), _x("cpu_op", f"layer{i}::mm", ts + 10, 10),
                   _launch("gemm", ts + 12, ts + 1), _x("cuda_runtime", "hipStreamEndCapture", ts + 50, 1)]
    capture = read_trace(write_trace(tmp_path / "layers.json", events))
    table = graph_kernels(read_trace(_execution(tmp_path, [["gemm"]] * 4)), capture)
    assert table["graph_id"].to_pylist() == [0, 1, 2, 0]
    assert table["op"].to_pylist() == ["layer0::mm", "layer1::mm", "layer2::mm", "layer0::mm"]


def test_kernels_unlike_the_captured_ones_are_counted_unmatched_not_guessed(tmp_path):
    """A minority of kernels unlike the captured ones at their place: unmatched rows, no op."""
    replays = [["gemm", "other_k"], ["add_k", "extra_k"], ["gemm", "relu_k", "elsewhere"]]
    table = graph_kernels(read_trace(_execution(tmp_path, replays)), read_trace(_capture(tmp_path))).to_pylist()
    assert [r["matched"] for r in table] == [True, False, True, False, True, True, False]
    assert [r["op"] for r in table] == ["aten::mm", None, "aten::add", None, "aten::mm", "aten::relu", None]
    assert [r["capture_kernel"] for r in table] == ["gemm", "relu_k", "add_k", None, "gemm", "relu_k", None]
    assert table[1]["op_row_in_capture"] is None and table[1]["op_path"] is None
    summary = graph_kernels_summary(graph_kernels(read_trace(_execution(tmp_path, replays)),
                                                  read_trace(_capture(tmp_path))))
    assert summary["kernels"] == 7 and summary["matched"] == 4 and summary["unmatched_ns"] == 2000 + 2000 + 3000


def test_mostly_unmatched_kernels_refuse_the_capture(tmp_path):
    with pytest.raises(TraceFormatError, match="only 1 of its 3 replayed kernels"):
        graph_kernels(read_trace(_execution(tmp_path, [["gemm", "x", "y"]])), read_trace(_capture(tmp_path)))


def test_an_execution_without_graph_launches_has_no_table(tmp_path):
    assert graph_kernels(read_trace(_execution(tmp_path, [])), read_trace(_capture(tmp_path))) is None
    assert graph_kernels_summary(None) is None


def test_a_deep_op_path_keeps_its_inner_end(tmp_path):
    events = [_x("cuda_runtime", "hipStreamBeginCapture", 0, 1)]
    events += [_x("cpu_op", f"op{i:03d}", 10 + i * 0.01, 100 - i * 0.02) for i in range(200)]
    events += [_launch("gemm", 50, 1), _x("cuda_runtime", "hipStreamEndCapture", 200, 1)]
    capture = read_trace(write_trace(tmp_path / "deep.json", events))
    (row,) = graph_kernels(read_trace(_execution(tmp_path, [["gemm"]])), capture).to_pylist()
    assert row["op"] == "op199" and len(row["op_path"]) <= PATH_CHARS
    assert row["op_path"].startswith("… > op") and row["op_path"].endswith("op198 > op199")
    assert len(row["op_path"]) > PATH_CHARS - len(" > op000")  # as many inner names as fit
