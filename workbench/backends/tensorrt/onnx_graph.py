"""Facts about an ONNX graph, read without running it: op counts, node name → op type, initializer
dtypes, opset, I/O. The precision summary compares two of these; the fusion table maps TensorRT's
fused layer names back to ONNX op types through `node_ops`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.backends.tensorrt.deps import require
from workbench.models.onnx_file import load_onnx

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
"""The explicit-quantization ops TensorRT fuses into int8/fp8 kernels."""


@dataclass(frozen=True)
class GraphFacts:
    """What one ONNX graph holds: `ops` counts nodes by op type, `initializers` counts constant
    tensors by element type name (FLOAT, FLOAT16, INT8, FLOAT8E4M3FN, ...), `node_outputs` counts
    nodes by the element type of their first output (from ONNX shape inference; UNKNOWN where it could
    not tell), `inputs`/`outputs` map names to (element type, dims), a dynamic dim written as its name."""

    opset: int
    nodes: int
    ops: dict[str, int]
    initializers: dict[str, int]
    node_outputs: dict[str, int]
    inputs: dict[str, tuple[str, list[int | str]]]
    outputs: dict[str, tuple[str, list[int | str]]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def _type_name(elem_type: int) -> str:
    onnx = require("onnx")
    return str(onnx.TensorProto.DataType.Name(elem_type))


def _value_info(value: Any) -> tuple[str, list[int | str]]:
    tensor = value.type.tensor_type
    dims: list[int | str] = [d.dim_param or d.dim_value for d in tensor.shape.dim]
    return _type_name(tensor.elem_type), dims


def _output_types(model: Any) -> dict[str, int]:
    """Nodes counted by their first output's element type, types from ONNX shape inference."""
    onnx = require("onnx")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a graph shape inference cannot type (custom ops, > 2 GiB protos): use what is there
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
    counts = Counter(_type_name(types[node.output[0]]) if node.output and types.get(node.output[0]) else "UNKNOWN"
                     for node in graph.node)
    return dict(counts.most_common())


def graph_facts(model: Any) -> GraphFacts:
    """The facts of a ModelProto (or of the ONNX file at a path)."""
    if isinstance(model, (str, Path)):
        model = load_onnx(model)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return GraphFacts(
        opset=int(opset),
        nodes=len(graph.node),
        ops=dict(Counter(node.op_type for node in graph.node).most_common()),
        initializers=dict(Counter(_type_name(init.data_type) for init in graph.initializer).most_common()),
        node_outputs=_output_types(model),
        inputs={value.name: _value_info(value) for value in graph.input},
        outputs={value.name: _value_info(value) for value in graph.output},
    )


def node_ops(model: Any) -> dict[str, str]:
    """Node name → op type, for every named node of a ModelProto (or ONNX file). TensorRT names each
    layer after the ONNX node it came from, so this turns fused layer names into op types."""
    if isinstance(model, (str, Path)):
        model = load_onnx(model)
    return {node.name: node.op_type for node in model.graph.node if node.name}
