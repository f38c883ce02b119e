"""ONNX Runtime's profile JSON as a Trace: sniffed apart from Kineto, node kernels with op types on the provider's
track, session spans on the thread's, bad records counted, merged onto a run's trace by clock, and imported by
the CLI. The profile is recorded here from a three-node graph; expected figures come from its raw JSON."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import write_trace

from workbench.backends.onnxruntime.profile import merge_ort_profile
from workbench.cli import main
from workbench.errors import TraceFormatError
from workbench.trace import read_trace
from workbench.trace.formats.ort_profile import read_ort_profile
from workbench.trace.registry import sniff_format

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

RUNS = 3


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """(profile path, profiling start ns) of RUNS runs of MatMul → Add → Relu on ORT's CPU provider."""
    from onnx import TensorProto, helper, numpy_helper

    folder = tmp_path_factory.mktemp("ort")
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Add", ["h", "b"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [weight, bias])
    path = folder / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), path)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "prof")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(RUNS):
        session.run(None, {"x": np.ones((2, 4), np.float32)})
    start = session.get_profiling_start_time_ns()
    return folder / session.end_profiling(), start


def test_the_profile_is_sniffed_as_ort_not_kineto(profile, tmp_path):
    path, _ = profile
    assert sniff_format(path) == "ort_profile"
    kineto = write_trace(tmp_path / "k.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                                "ts": 1, "dur": 2}])
    assert sniff_format(kineto) == "kineto"


def test_node_kernels_and_session_spans(profile):
    path, _ = profile
    raw = json.loads(path.read_text())
    nodes = [e for e in raw if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    session = [e for e in raw if e["cat"] == "Session"]

    trace = read_trace(path)
    events = trace.df()
    assert trace.metadata["source"]["format"] == "ort_profile"
    assert trace.metadata["reader"]["skipped"] == {}
    assert len(events) == len(raw)
    kernels = events[events["kind"] == "kernel"].sort_values("start_ns")
    args = [json.loads(a) for a in kernels["args"]]
    nodes.sort(key=lambda e: e["ts"])
    assert list(kernels["name"].astype(str)) == [e["name"].removesuffix("_kernel_time") for e in nodes]
    assert [a["op_name"] for a in args] == [e["args"]["op_name"] for e in nodes]
    assert Counter(a["op_name"] for a in args) == {"MatMul": RUNS, "Add": RUNS, "Relu": RUNS}
    assert {a["provider"] for a in args} == {"CPUExecutionProvider"}
    assert [a["thread"] for a in args] == [e["tid"] for e in nodes]
    assert list(kernels["start_ns"]) == [round(e["ts"] * 1000) for e in nodes]
    assert list(kernels["dur_ns"]) == [round(e["dur"] * 1000) for e in nodes]
    assert set(kernels["track"].astype(str)) == {"cpu/onnxruntime CPUExecutionProvider"}
    assert set(kernels["device"].astype(str)) == {"cpu"}
    matmul = kernels[kernels["name"] == "mm"].iloc[0]
    assert json.loads(matmul["shapes"])[0] == [2, 4] and json.loads(matmul["dtypes"])[0] == "float"

    spans = events[events["kind"].isin(["op", "annotation"])]
    assert Counter(spans["name"].astype(str)) == Counter(e["name"] for e in session)
    assert (events["name"] == "model_run").sum() == RUNS
    assert set(events.loc[events["name"] == "session_initialization", "kind"]) == {"annotation"}
    assert set(events.loc[events["name"] == "model_run", "kind"]) == {"op"}
    # each kernel's launcher is the executor span of its run, which encloses it
    for _, kernel in kernels.iterrows():
        launcher = events.iloc[kernel["launcher"]]
        assert launcher["kind"] == "op"
        assert launcher["start_ns"] <= kernel["start_ns"] <= launcher["start_ns"] + launcher["dur_ns"]


def test_bad_records_are_counted_and_bad_json_is_one_line(tmp_path):
    good = {"cat": "Session", "pid": 1, "tid": 1, "dur": 5, "ts": 1, "ph": "X", "name": "model_run", "args": {}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps([good, {**good, "ts": "late"}, 7, {**good, "dur": -1}]))
    trace = read_ort_profile(path)
    assert trace.events.num_rows == 1
    assert sum(trace.metadata["reader"]["skipped"].values()) == 3
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([good, good])[:-20])
    with pytest.raises(TraceFormatError, match=r"broken\.json") as caught:
        read_trace(broken)
    assert "\n" not in str(caught.value)


def test_merge_places_the_profile_on_the_run_clock(profile, tmp_path):
    path, start_ns = profile
    base = read_trace(write_trace(tmp_path / "run.json", [
        {"ph": "X", "cat": "user_annotation", "name": "step 0", "pid": 1, "tid": 1, "ts": 10, "dur": 5}],
        baseTimeNanoseconds=start_ns - 2_000_000))
    merged = merge_ort_profile(base, path, start_ns)
    raw = json.loads(path.read_text())
    events = merged.df()
    assert len(events) == base.events.num_rows + len(raw)
    first = min(raw, key=lambda e: e["ts"])
    shift = start_ns - base.metadata["origin_ns"]
    row = events[events["name"] == first["name"]].sort_values("start_ns").iloc[0]
    assert row["start_ns"] == round(first["ts"] * 1000) + shift
    kernels = events[events["kind"] == "kernel"]
    assert (kernels["launcher"] >= base.events.num_rows).all()  # launchers renumbered past the base rows
    assert merged.metadata["ort_profile"]["events"] == len(raw) and merged.metadata["ort_profile"]["shift_ns"] == shift


def test_workbench_import_reads_an_ort_profile(profile, tmp_path):
    path, _ = profile
    result = CliRunner().invoke(main, ["import", str(path), "--out", str(tmp_path / "root"), "--json"])
    assert result.exit_code == 0, result.output
    from workbench.trace.store.bundle import open_bundle

    (run_id,) = json.loads(result.output)
    assert open_bundle(run_id, tmp_path / "root").trace().kind_counts()["kernel"] == 3 * RUNS
