"""What each ONNX node computes, as the aten call whose cost op_cost knows (`onnx_call`), or how it is costed by its
bytes when there is none; the shapes of ONNX Runtime's contrib ops that onnx's shape inference does not know
(`contrib_shape`); a node's module scope (`onnx_layer`). `workbench.codesign.file_graphs.graph_from_onnx` turns them
into the graph table."""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.analysis.op_cost import ITEM_BYTES
from workbench.codesign.graph import TOP_LEVEL

ONNX_DTYPES = {1: "fp32", 2: "uint8", 3: "int8", 4: "int16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "fp16", 11: "fp64", 12: "int32", 13: "int64", 16: "bf16", 17: "fp8", 18: "fp8", 19: "fp8",
               20: "fp8"}
"""ONNX TensorProto element types -> canonical dtypes (unsigned types as the signed type of their size)."""

VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Shape", "Size", "Constant"})
"""Nodes that compute nothing and move nothing (a runtime aliases their output to their input)."""

ELEMENTWISE = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log",
    "Sin": "sin", "Cos": "cos", "Tanh": "tanh", "Relu": "relu", "Sigmoid": "sigmoid", "Erf": "erf", "Gelu": "gelu",
    "Pow": "pow", "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Where": "where", "Max": "maximum", "Min": "minimum",
    "Clip": "clamp", "LeakyRelu": "leaky_relu", "Elu": "elu", "Mish": "mish", "HardSwish": "hardswish",
    "FastGelu": "gelu", "BiasGelu": "gelu",
}
"""Elementwise ONNX ops (and ONNX Runtime's fused GELUs, their bias add included) -> aten names op_cost counts:
one FLOP per output element, every input read, the output written."""

SOFTMAX = {"Softmax": "softmax", "LogSoftmax": "log_softmax"}

NORMS = {"LayerNormalization": "layer_norm", "SkipLayerNormalization": "layer_norm",
         "SimplifiedLayerNormalization": "rms_norm", "SkipSimplifiedLayerNormalization": "rms_norm",
         "RMSNormalization": "rms_norm", "BatchNormalization": "batch_norm", "GroupNormalization": "group_norm",
         "InstanceNormalization": "group_norm"}
"""Normalizations -> the aten norm with the same per-element work (an instance norm is a group norm with one
channel per group; the skip variants' residual add is left out of their FLOPs, not of their bytes)."""

MOVES = {"Concat": "cat", "Split": "split", "Slice": "slice", "Expand": "expand", "Tile": "repeat",
         "Pad": "constant_pad_nd", "Cast": "_to_copy", "CastLike": "_to_copy", "Gather": "index_select",
         "GatherElements": "gather", "GatherND": "gather", "ScatterElements": "scatter", "ScatterND": "index_put",
         "DepthToSpace": "pixel_shuffle", "SpaceToDepth": "pixel_unshuffle", "Trilu": "triu"}
"""Data movement: no FLOPs, costed by the bytes it reads and writes (kind "other", as a torch forward records
these ops)."""

_GATHERS = frozenset({"Gather", "Slice", "GatherElements", "GatherND"})
"""Moves that read only what they write (plus their indices), not their whole data input."""

REDUCTIONS = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "amax", "ReduceMin": "amin",
              "ReduceProd": "prod", "ReduceL2": "norm", "ReduceSumSquare": "sum", "ReduceLogSumExp": "logsumexp",
              "ArgMax": "argmax", "ArgMin": "argmin", "GlobalAveragePool": "adaptive_avg_pool2d",
              "AveragePool": "avg_pool2d", "MaxPool": "max_pool2d", "GlobalMaxPool": "adaptive_max_pool2d"}
"""Reductions and pooling: aten names for rows costed by their bytes (op_cost has no FLOP rule for them)."""

SAME_SHAPE = frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
                        "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd"})
"""ONNX Runtime contrib ops whose output (and a Skip norm's residual-sum output) has their first input's shape."""


@dataclass(frozen=True)
class Value:
    """A tensor of the ONNX graph: its dims (None when shape inference left any unknown) and canonical dtype."""

    shape: tuple[int, ...] | None
    dtype: str | None
    code: int = 0
    """The ONNX element type (TensorProto.FLOAT, ...)."""

    @property
    def known(self) -> bool:
        return self.shape is not None and self.dtype in ITEM_BYTES

    @property
    def nbytes(self) -> float:
        return float(math.prod(self.shape or ()) * ITEM_BYTES.get(self.dtype or "", 0))


@dataclass(frozen=True)
class Call:
    """An ONNX node as the aten call op_cost costs: its name, tensor arguments by position and concrete values."""

    name: str
    tensors: Sequence[Value | None]
    concrete: Sequence[str] | None = None


@dataclass(frozen=True)
class ByBytes:
    """A node costed by the bytes it moves, under an aten-like name; `reason` says why its FLOPs are not counted
    (None: it has none)."""

    name: str
    moved: float
    reason: str | None


def tensor_values(graph: Any) -> dict[str, Value]:
    """Every tensor the inferred graph types: initializers, inputs, intermediates, outputs, Constant outputs."""
    values: dict[str, Value] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        shape = dims if tensor.HasField("shape") and all(d >= 0 for d in dims) else None
        values[info.name] = Value(shape, ONNX_DTYPES.get(tensor.elem_type), tensor.elem_type)
    for init in graph.initializer:
        values[init.name] = Value(tuple(int(d) for d in init.dims), ONNX_DTYPES.get(init.data_type), init.data_type)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] not in values:
            for attribute in node.attribute:
                if attribute.name == "value":
                    dims, code = tuple(attribute.t.dims), attribute.t.data_type
                    values[node.output[0]] = Value(dims, ONNX_DTYPES.get(code), code)
    return values


def onnx_call(node: Any, ins: list[Value | None], outs: list[Value], attrs: dict[str, Any],
               weights: set[str]) -> Call | ByBytes:
    """The aten call that costs `node`, or how it is costed by its bytes."""
    op, domain = node.op_type, node.domain or "ai.onnx"
    data = [v for v in ins if v is not None]
    moved = sum(v.nbytes for v in data) + sum(v.nbytes for v in outs)
    if domain not in ("ai.onnx", "com.microsoft"):
        return ByBytes(op_name(node), moved, f"no cost rule for domain {domain}: costed by its bytes")
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        a, b = (ins[0], ins[3]) if op == "QLinearMatMul" else (ins[0], ins[1])
        return Call("matmul", [_folded(a, b), b])
    if op == "FusedMatMul":
        if attrs.get("transBatchA") or attrs.get("transBatchB"):
            return ByBytes(op_name(node), moved, "FusedMatMul with transposed batch dims: costed by its bytes")
        a, b = _transposed(ins[0], attrs.get("transA")), _transposed(ins[1], attrs.get("transB"))
        return Call("matmul", [_folded(a, b), b])
    if op == "Gemm":
        a, b = _transposed(ins[0], attrs.get("transA")), _transposed(ins[1], attrs.get("transB"))
        bias = ins[2] if len(ins) > 2 else None
        return Call("addmm", [bias, a, b]) if bias is not None else Call("mm", [a, b])
    if op in ("Conv", "ConvTranspose"):
        return _convolution(op, ins, outs, attrs) or ByBytes(
            op_name(node), moved, f"{op} whose padding or output shape cannot be read: costed by its bytes")
    if op in ("Attention", "MultiHeadAttention"):
        return _attention(node, ins, attrs) or ByBytes(
            op_name(node), moved, f"{domain} {op} (packed or past-state inputs): no cost rule, costed by its bytes")
    if op in ELEMENTWISE:
        return Call(ELEMENTWISE[op], ins)
    if op in SOFTMAX:
        return Call(SOFTMAX[op], ins[:1])
    if op in NORMS:
        return Call(NORMS[op], ins)
    if op == "Transpose":
        return Call("clone", ins[:1])
    if op == "Gather" and node.input[0] in weights and attrs.get("axis", 0) == 0 and len(ins[0].shape or ()) == 2:
        return Call("embedding", ins[:2])
    if op in MOVES:
        if op in _GATHERS:  # reads what it writes, plus its indices
            indices = sum(v.nbytes for v in data[1:]) if op != "Slice" else 0.0
            moved = indices + 2 * sum(v.nbytes for v in outs)
        return ByBytes(MOVES[op], moved, None)
    if op in REDUCTIONS:
        return ByBytes(REDUCTIONS[op], moved, f"{op}: no FLOP rule for reductions and pooling, costed by its bytes")
    if op in ("If", "Loop", "Scan"):
        return ByBytes(op, moved, f"{op}: its subgraphs are not costed, only the bytes at its boundary")
    return ByBytes(op_name(node), moved, f"no cost rule for {op_name(node)}: costed by its bytes")


def contrib_shape(node: Any, ins: list[Value | None], attrs: dict[str, Any]) -> tuple[int, ...] | None:
    """The output shape of an ONNX Runtime contrib op onnx cannot infer, from its known inputs (None otherwise):
    FusedMatMul (matmul of the transposed operands), Attention (the input's rows by the value's width),
    MultiHeadAttention (the query's rows by the value's width), the ops of `SAME_SHAPE`."""
    if not ins or not all(v is not None and v.known for v in ins[:2]):
        return None
    first = ins[0].shape
    if node.op_type in SAME_SHAPE:
        return first
    second = ins[1].shape
    if node.op_type == "FusedMatMul" and len(first) >= 2 and len(second) >= 2:
        a, b = _transposed(ins[0], attrs.get("transA")).shape, _transposed(ins[1], attrs.get("transB")).shape
        try:
            batch = np.broadcast_shapes(a[:-2], b[:-2])
        except ValueError:
            return None
        return (*batch, a[-2], b[-1])
    if node.op_type == "Attention" and len(first) == 3 and len(second) == 2:  # packed QKV projection + attention
        sizes = attrs.get("qkv_hidden_sizes")
        return (*first[:-1], int(sizes[2]) if sizes else second[1] // 3)
    if node.op_type == "MultiHeadAttention" and len(ins) > 2 and ins[2] is not None and ins[2].known \
            and len(first) == 3 and len(ins[2].shape) == 3:
        return (*first[:-1], ins[2].shape[-1])
    return None


def _folded(a: Value | None, b: Value | None) -> Value | None:
    """`a` as one [rows, K] matrix when it multiplies a matrix `b` (a weight): a single GEMM of all its rows, as
    torch.matmul folds it, rather than one product per leading index."""
    if a is None or b is None or a.shape is None or b.shape is None or len(b.shape) != 2 or len(a.shape) <= 2:
        return a
    return Value((math.prod(a.shape[:-1]), a.shape[-1]), a.dtype, a.code)


def _transposed(value: Value | None, flag: Any) -> Value | None:
    """`value` with its last two dims swapped when `flag` (Gemm's transA/transB) is set."""
    if not flag or value is None or value.shape is None or len(value.shape) < 2:
        return value
    return Value((*value.shape[:-2], value.shape[-1], value.shape[-2]), value.dtype, value.code)


def _convolution(op: str, ins: list[Value | None], outs: list[Value], attrs: dict[str, Any]) -> Call | None:
    """A Conv / ConvTranspose as aten::convolution (input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups). Asymmetric padding is folded into the input's size (a Conv: its output size is exact,
    its input bytes count the odd padded row) or into the output padding (a ConvTranspose: the output read from
    shape inference)."""
    x, w = ins[0], ins[1]
    if x is None or w is None or x.shape is None or w.shape is None or not outs or outs[0].shape is None:
        return None
    dims = len(w.shape) - 2
    spatial, kernel, out = list(x.shape[-dims:]), list(w.shape[2:]), list(outs[0].shape[-dims:])
    strides = list(attrs.get("strides") or [1] * dims)
    dilations = list(attrs.get("dilations") or [1] * dims)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    transposed = op == "ConvTranspose"
    padding, output_padding = [], list(attrs.get("output_padding") or [0] * dims)
    for i in range(dims):
        reach = dilations[i] * (kernel[i] - 1) + 1
        if transposed:  # total padding from the inferred output: out = (i-1)s + reach + out_pad - total
            total = (spatial[i] - 1) * strides[i] + reach + output_padding[i] - out[i]
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = max((math.ceil(spatial[i] / strides[i]) - 1) * strides[i] + reach - spatial[i], 0)
        elif auto_pad == "VALID":
            total = 0
        else:
            pads = list(attrs.get("pads") or [0] * (2 * dims))
            total = pads[i] + pads[i + dims]
        if total < 0:
            return None
        padding.append(total // 2)
        if total % 2:
            if transposed:
                output_padding[i] -= 1  # one less padding on one side: one more output row
            else:
                spatial[i] += 1
    x = Value((*x.shape[:-dims], *spatial), x.dtype, x.code)
    bias = ins[2] if len(ins) > 2 else None
    concrete = ["", "", "", str(strides), str(padding), str(dilations), str(transposed), str(output_padding),
                str(int(attrs.get("group", 1)))]
    return Call("convolution", [x, w, bias], concrete)


def _attention(node: Any, ins: list[Value | None], attrs: dict[str, Any]) -> Call | None:
    """ONNX Attention (opset 23: q, k, v as [B, H, S, D], or [B, S, H·D] with q_num_heads/kv_num_heads) and
    com.microsoft MultiHeadAttention (separate [B, S, H·D] q, k, v with num_heads) as
    scaled_dot_product_attention; None for the packed or cached forms (com.microsoft Attention, past state)."""
    if (node.domain == "com.microsoft" and node.op_type == "Attention") or len(ins) < 3:
        return None
    q, k, v = ins[0], ins[1], ins[2]
    if q is None or k is None or v is None or q.shape is None or k.shape is None or v.shape is None:
        return None
    if node.op_type == "MultiHeadAttention":
        heads = kv_heads = int(attrs.get("num_heads", 0))
        causal = bool(attrs.get("unidirectional", 0))
    else:
        heads, kv_heads = int(attrs.get("q_num_heads", 0)), int(attrs.get("kv_num_heads", 0))
        causal = bool(attrs.get("is_causal", 0))
    if len(q.shape) == 3:
        if not heads or not kv_heads or len(k.shape) != 3 or len(v.shape) != 3:
            return None
        q, k, v = (Value((t.shape[0], h, t.shape[1], t.shape[2] // h), t.dtype, t.code)
                   for t, h in ((q, heads), (k, kv_heads), (v, kv_heads)))
    elif len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return None
    mask = ins[3] if len(ins) > 3 and node.op_type == "Attention" else None
    return Call("scaled_dot_product_attention", [q, k, v, mask], ["", "", "", "", "0.0", str(causal)])


def onnx_layer(node: Any) -> str:
    """The module that a node belongs to: the torch exporter's innermost name scope, else the path of a
    `/blocks.0/attn/MatMul` name, else "" (the file records none); an op of the top level is `TOP_LEVEL`."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            if isinstance(scopes, list) and scopes:
                return str(scopes[-2]) if len(scopes) > 1 and scopes[-2] else TOP_LEVEL
    if node.name.startswith("/"):
        return ".".join(part for part in node.name.split("/")[1:-1] if part) or TOP_LEVEL
    return ""


def op_name(node: Any) -> str:
    """An ONNX node's op type, with its domain when not the default one."""
    return f"{node.domain}::{node.op_type}" if node.domain and node.domain != "ai.onnx" else node.op_type
