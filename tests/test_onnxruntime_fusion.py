"""What ONNX Runtime's graph optimizations fused: node counts of tiny-gpt's export before and after, per op type."""

from __future__ import annotations

import json

import pytest

from workbench.analysis.ort_fusion import GRAPH_RECORD, ort_node_table, ort_summary, read_graph_record
from workbench.backends import get_variant
from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.profiling.lifecycle import prepare_variant

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def records():
    """The graph records of tiny-gpt (2 layers, d_model 32) on `ort` (all optimizations) and `ort-noopt`."""
    loaded = load_model("tiny-gpt", layers=2, d_model=32, heads=2, vocab=64, max_seq=16)
    inputs = loaded.make_inputs(2, 8)
    found = {}
    for name in ("ort", "ort-noopt"):
        prepared, _ = prepare_variant(get_variant(name, batch=2), loaded, inputs)
        found[name] = json.loads(prepared.artifacts[GRAPH_RECORD])
    return found


@pytest.mark.slow  # tiny-gpt's ONNX export: seconds, tens of them on a loaded machine
def test_ort_fuses_tiny_gpt_into_fewer_nodes(records):
    record = records["ort"]
    table = ort_node_table(record)
    assert table["original"].sum() == record["nodes"]["original"]
    assert table["optimized"].sum() == record["nodes"]["optimized"] < record["nodes"]["original"]
    fused = set(table.loc[table["fused"], "op_type"])
    assert fused & {"FusedMatMul", "SkipLayerNormalization", "Gelu", "Attention", "LayerNormalization"}, table
    assert all(table.loc[table["fused"], "change"] > 0)
    summary = ort_summary(record)
    assert summary["kernels"] == record["nodes"]["optimized"] and summary["fusions"] >= len(fused)
    assert summary["fusions"] + summary["unfused_ops"] == summary["kernels"]
    assert summary["optimization"] == "all"


@pytest.mark.slow
def test_without_optimizations_nothing_changes(records):
    table = ort_node_table(records["ort-noopt"])
    assert (table["change"] == 0).all() and not table["fused"].any()
    assert ort_summary(records["ort-noopt"])["fusions"] == 0


def test_node_table_from_a_written_record():
    record = {"optimization": "extended", "nodes": {"original": 6, "optimized": 3}, "ops": [
        {"domain": "ai.onnx", "op_type": "MatMul", "original": 2, "optimized": 0},
        {"domain": "ai.onnx", "op_type": "Mul", "original": 3, "optimized": 1},
        {"domain": "com.microsoft", "op_type": "FusedMatMul", "original": 0, "optimized": 2},
        {"domain": "ai.onnx", "op_type": "Gather", "original": 1, "optimized": 0}]}
    table = ort_node_table(record)
    assert list(table["op_type"]) == ["MatMul", "Mul", "FusedMatMul", "Gather"]  # largest change first, stable
    assert list(table["fused"]) == [False, False, True, False]
    assert ort_summary(record) == {"kernels": 3, "fusions": 2, "fused_ops": 5, "unfused_ops": 1, "nodes_original": 6,
                                   "nodes_optimized": 3, "optimization": "extended"}


def test_a_malformed_record_names_where_it_came_from():
    with pytest.raises(WorkbenchError, match="run 'x': no \"ops\" list"):
        read_graph_record('{"nodes": {}}', "run 'x'")
    with pytest.raises(WorkbenchError, match="not JSON"):
        read_graph_record("{", "run 'x'")


def test_fusion_map_names_the_nodes_a_fused_node_replaced(tmp_path):
    # x @ w, then * 0.5, then relu: ORT's MatMulScaleFusion makes one FusedMatMul of "mm" and "scale" (reading
    # their inputs x, w and writing "scale"'s output z); "relu" stays as it was.
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from workbench.backends.onnxruntime.graph import graph_record

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             helper.make_node("Mul", ["y", "s"], ["z"], name="scale"),
             helper.make_node("Relu", ["z"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
                               numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    given, optimized = tmp_path / "given.onnx", tmp_path / "optimized.onnx"
    given.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    ort.InferenceSession(str(given), options, providers=["CPUExecutionProvider"])
    fused = [n for n in onnx.load(str(optimized)).graph.node if n.op_type == "FusedMatMul"]
    assert len(fused) == 1
    record = graph_record(given, optimized, "all", "test")
    assert record["fused_nodes"] == {fused[0].name: ["mm", "scale"]}
    assert record["node_types"] == {"mm": "MatMul", "scale": "Mul", "relu": "Relu", fused[0].name: "FusedMatMul"}
