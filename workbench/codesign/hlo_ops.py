"""What each kernel of an XLA HLO module is as a graph row (`hlo_row`): its kind from the opcodes it runs, the GEMM
sizes of a dot (its dimension numbers) or a convolution (its implicit GEMM), its dtype and its module scope from the
`op_name` metadata. `workbench.codesign.file_graphs.graph_from_hlo` adds XLA's costs (`hlo_cost`) and the dataflow."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.analysis.hlo_cost import _dims, _elements, shape_arrays, shape_bytes
from workbench.codesign.graph import TOP_LEVEL
from workbench.trace.formats.hlo_text import HloComputation, HloInstruction, HloModule

HLO_DTYPES = {"f64": "fp64", "f32": "fp32", "f16": "fp16", "bf16": "bf16", "s8": "int8", "u8": "int8",
              "s16": "int16", "u16": "int16", "s32": "int32", "u32": "int32", "s64": "int64", "u64": "int64",
              "pred": "bool", "c64": "complex64", "c128": "complex128"}
"""HLO primitive types -> canonical dtypes (the f8 types are fp8)."""

HLO_MOVES = frozenset({"broadcast", "reshape", "transpose", "copy", "slice", "dynamic-slice", "dynamic-update-slice",
                       "concatenate", "pad", "gather", "scatter", "iota", "reverse", "bitcast-convert"})
"""Opcodes that move data: a fusion of only these is a copy."""

HLO_ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2", "negate", "abs",
    "sign", "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "sqrt", "rsqrt",
    "cbrt", "sine", "cosine", "tan", "erf", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "compare",
    "select", "clamp", "convert", "and", "or", "xor", "not", "is-finite", "shift-left", "shift-right-logical",
    "shift-right-arithmetic", "popcnt", "clz", "real", "imag", "complex", "map",
})
"""Elementwise opcodes: a kernel of only these (and data movement) is elementwise."""

_OP_NAME = re.compile(r'op_name="([^"]*)"')
_WRAPPER = re.compile(r"^[\w\-]+\(.*\)$")
"""A transformation's component of an op_name (`jit(f)`, `vmap(g)`, `transpose(jvp(h))`), not a scope."""


def hlo_row(module: HloModule, shapes: dict[str, dict[str, str]], computation: HloComputation,
            inst: HloInstruction) -> dict[str, Any]:
    """A row's name, kind, dtype, GEMM sizes, elements and output bytes; the caller fills in the costs."""
    opcodes = [inst.opcode] if inst.opcode != "fusion" else module.fused_opcodes(_called(module, inst), inst)
    arrays = shape_arrays(inst.shape)
    row: dict[str, Any] = {"name": inst.name, "kind": _hlo_kind(opcodes), "layer": _hlo_layer(inst),
                           "dtype": _hlo_dtype(arrays[0][0]) if arrays else None, "batch": np.nan, "m": np.nan,
                           "k": np.nan, "n": np.nan, "elements": np.nan, "transcendental": 0.0, "flops": 0.0,
                           "bytes": 0.0, "out_bytes": shape_bytes(inst.shape), "measured_ns": np.nan,
                           "inputs_from": (), "weight_input": None}
    matrix = _matrix_op(module, computation, inst)
    if matrix is not None:
        inner, op = matrix
        operands = [shape_arrays(shapes[inner.name].get(name, "")) for name in op.operands[:2]]
        if operands and operands[0]:
            row["dtype"] = _hlo_dtype(operands[0][0][0])
        dims = _dot_dims(op, operands) if op.opcode == "dot" else _conv_dims(op, operands)
        row["kind"] = "matmul" if op.opcode == "dot" else "conv"
        if dims is not None:
            row.update(zip(("batch", "m", "k", "n"), dims, strict=True))
    elif row["kind"] == "elementwise":
        row["elements"] = float(_elements(inst.shape))
    elif row["kind"] in ("softmax", "norm"):
        touched = [math.prod(d) for name in inst.operands
                   for _, d in shape_arrays(shapes[computation.name].get(name, ""))]
        row["elements"] = float(max([_elements(inst.shape), *touched]))
    return row


def _hlo_dtype(kind: str) -> str | None:
    return HLO_DTYPES.get(kind, "fp8" if kind.startswith("f8") else None)


def _called(module: HloModule, inst: HloInstruction) -> HloComputation:
    return module.computation(inst.references("calls")[0], inst)


def _matrix_op(module: HloModule, computation: HloComputation,
               inst: HloInstruction) -> tuple[HloComputation, HloInstruction] | None:
    """The dot or convolution an instruction is or (for a fusion, nested ones included) contains, with the
    computation it lies in: the first one in text order."""
    if inst.opcode in ("dot", "convolution"):
        return computation, inst
    if inst.opcode != "fusion":
        return None
    todo = [_called(module, inst)]
    seen: set[str] = set()
    while todo:
        called = todo.pop(0)
        if called.name in seen:
            continue
        seen.add(called.name)
        for inner in called.instructions:
            if inner.opcode in ("dot", "convolution"):
                return called, inner
            if inner.opcode == "fusion":
                todo.append(_called(module, inner))
    return None


def _hlo_kind(opcodes: Sequence[str]) -> str:
    """The `OP_KINDS` entry of a kernel that is no dot or convolution, from the opcodes it runs."""
    ops = set(opcodes)
    reduces = bool(ops & {"reduce", "reduce-window"})
    if reduces and "exponential" in ops:
        return "softmax"
    if reduces and ops & {"rsqrt", "sqrt"}:
        return "norm"
    if ops and ops <= HLO_MOVES:
        return "copy" if ops & {"copy", "transpose"} else "other"
    if ops and ops <= HLO_MOVES | HLO_ELEMENTWISE:
        return "elementwise"
    return "other"  # reductions, collectives, sorts, custom calls


def _dot_dims(dot: HloInstruction, operands: list[list[tuple[str, tuple[int, ...]]]]) -> tuple[int, ...] | None:
    """(batch, M, K, N) of a dot from its dimension numbers: batch the lhs batch dims, K the contracting ones, M the
    lhs's other dims, N the rhs's non-batch, non-contracting dims."""
    if not operands[0] or len(operands) < 2 or not operands[1]:
        return None
    lhs, rhs = operands[0][0][1], operands[1][0][1]
    lhs_batch, lhs_contracting = _dims(dot.attrs.get("lhs_batch_dims", "")), _dims(
        dot.attrs.get("lhs_contracting_dims", ""))
    rhs_batch, rhs_contracting = _dims(dot.attrs.get("rhs_batch_dims", "")), _dims(
        dot.attrs.get("rhs_contracting_dims", ""))
    batch = math.prod(lhs[d] for d in lhs_batch)
    k = math.prod(lhs[d] for d in lhs_contracting)
    m = math.prod(size for d, size in enumerate(lhs) if d not in lhs_batch and d not in lhs_contracting)
    n = math.prod(size for d, size in enumerate(rhs) if d not in rhs_batch and d not in rhs_contracting)
    return batch, m, k, n


def _conv_dims(conv: HloInstruction, operands: list[list[tuple[str, tuple[int, ...]]]]) -> tuple[int, ...] | None:
    """(1, M, K, N) of a convolution's implicit GEMM: N the output features, K the kernel's elements per output
    feature (input features per group times the window), M the output elements per feature."""
    labels = conv.attrs.get("dim_labels", "")
    result = shape_arrays(conv.shape)
    if "_" not in labels or "->" not in labels or len(operands) < 2 or not operands[1] or not result:
        return None
    kernel_labels, out_labels = labels.split("_", 1)[1].split("->")
    kernel, out = operands[1][0][1], result[0][1]
    if "o" not in kernel_labels or "f" not in out_labels:
        return None
    n = out[out_labels.index("f")]
    k = math.prod(kernel) // kernel[kernel_labels.index("o")]
    return 1, math.prod(out) // n, k, n


def _hlo_layer(inst: HloInstruction) -> str:
    """The scope of an instruction's `op_name` metadata without its transformations and its primitive
    (`jit(f)/MLP/Dense_0/dot_general` -> `MLP.Dense_0`); `TOP_LEVEL` when it has none, "" without metadata."""
    match = _OP_NAME.search(inst.attrs.get("metadata", ""))
    if match is None:
        return ""
    parts = [part for part in match[1].split("/") if part and not _WRAPPER.match(part)]
    return ".".join(parts[:-1]) or TOP_LEVEL
