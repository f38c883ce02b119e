"""FLOPs and bytes of each XLA kernel, from the optimized HLO text, counted as XLA's cost analysis does.

`compiled.cost_analysis()` gives a module's totals only, and XLA:CPU profiles carry no per-op cost
stats (TPU and GPU XSpaces do), so the roofline of a JAX run on CPU needs the per-kernel split. The
rules follow XLA's `HloCostAnalysis`, so the kernels' sum matches its totals:

- `dot`: 2 × result elements × the product of the lhs contracting dimensions; `convolution`:
  2 × result elements × the kernel's elements per output feature (as if every tap hit data: XLA
  leaves out the taps that fall on padding, so padded convolutions come out a few percent higher);
- `reduce`: one op per input element that is folded (input elements − output elements);
- elementwise arithmetic: one FLOP per result element; transcendental functions (exp, log, tanh,
  erf, ...) are counted apart as `transcendentals`, as XLA does;
- data movement (broadcast, reshape, transpose, slice, concatenate, pad, gather...) and plumbing: 0;
- a fusion: the sum over the ops of the computation it calls (nested fusions expanded).

Bytes of a kernel are what it reads and writes at its boundary: every operand plus the result (for a
fusion, intermediates stay in registers, which is the point of fusing).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.trace import Trace
from workbench.trace.formats.hlo_text import PLUMBING, HloComputation, HloInstruction, HloModule, parse_hlo

ELEMENT_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8,
    "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
"""Bytes per element of each HLO primitive type."""

NO_FLOPS = PLUMBING | frozenset({
    "broadcast", "reshape", "transpose", "copy", "slice", "dynamic-slice", "dynamic-update-slice",
    "concatenate", "pad", "gather", "iota", "reverse", "bitcast-convert", "custom-call", "while",
    "conditional", "call", "rng-get-and-update-state", "infeed", "outfeed", "send", "recv",
})
"""Opcodes that move or route data without arithmetic."""

TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "sqrt", "rsqrt",
    "cbrt", "power", "sine", "cosine", "tan", "atan2", "erf",
})
"""Elementwise opcodes XLA counts as transcendentals rather than FLOPs."""

COLUMNS = ("name", "opcode", "flops", "transcendentals", "bytes")

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_DIMS = re.compile(r"\{([0-9,\s]*)\}")


def shape_arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """The arrays of an HLO shape text (`f32[8,128]{1,0}`, or a tuple of them) as (type, dims)."""
    return [(m[1], tuple(int(d) for d in m[2].split(",") if d)) for m in _ARRAY.finditer(shape)
            if m[1] in ELEMENT_BYTES]


def shape_bytes(shape: str) -> float:
    """Bytes of all arrays in an HLO shape text."""
    return sum(ELEMENT_BYTES[kind] * math.prod(dims) for kind, dims in shape_arrays(shape))


def _elements(shape: str) -> int:
    return sum(math.prod(dims) for _, dims in shape_arrays(shape))


def _dims(value: str) -> list[int]:
    match = _DIMS.search(value or "")
    return [int(d) for d in match[1].split(",") if d.strip()] if match else []


class _Costs:
    """Cost of instructions of one module, with each computation's instruction shapes by name."""

    def __init__(self, module: HloModule) -> None:
        self.module = module
        self.shapes = {c.name: {i.name: i.shape for i in c.instructions} for c in module.computations.values()}

    def operand_shape(self, computation: HloComputation, inst: HloInstruction, index: int) -> str:
        return self.shapes[computation.name].get(inst.operands[index], "") if index < len(inst.operands) else ""

    def arithmetic(self, computation: HloComputation, inst: HloInstruction, depth: int = 0) -> tuple[float, float]:
        """(FLOPs, transcendentals) of one instruction, a fusion's called ops included."""
        op = inst.opcode
        if op == "fusion":
            flops = transcendentals = 0.0
            for name in inst.references("calls"):
                called = self.module.computation(name, inst)
                if depth <= len(self.module.computations):
                    for inner in called.instructions:
                        f, t = self.arithmetic(called, inner, depth + 1)
                        flops, transcendentals = flops + f, transcendentals + t
            return flops, transcendentals
        result = _elements(inst.shape)
        if op == "dot":
            lhs = shape_arrays(self.operand_shape(computation, inst, 0))
            contracting = _dims(inst.attrs.get("lhs_contracting_dims", ""))
            size = math.prod(lhs[0][1][d] for d in contracting if d < len(lhs[0][1])) if lhs else 1
            return 2.0 * result * size, 0.0
        if op == "convolution":
            return 2.0 * result * self._kernel_elements_per_output(computation, inst), 0.0
        if op in ("reduce", "reduce-window"):
            return float(max(_elements(self.operand_shape(computation, inst, 0)) - result, 0)), 0.0
        if op in TRANSCENDENTAL:
            return 0.0, float(result)
        if op in NO_FLOPS or op.endswith(("-done", "-start", "-update")):
            return 0.0, 0.0
        return float(result), 0.0

    def _kernel_elements_per_output(self, computation: HloComputation, inst: HloInstruction) -> float:
        """Multiply-adds per output element of a convolution: the kernel's elements per output feature
        (spatial size × input features per group: the kernel's input-feature dimension is per group)."""
        rhs = shape_arrays(self.operand_shape(computation, inst, 1))
        if not rhs:
            return 0.0
        labels = inst.attrs.get("dim_labels", "")
        kernel = labels.split("_")[1].split("->")[0] if "_" in labels else ""
        dims = rhs[0][1]
        out_features = dims[kernel.index("o")] if "o" in kernel and kernel.index("o") < len(dims) else 1
        return math.prod(dims) / max(out_features, 1)

    def bytes(self, computation: HloComputation, inst: HloInstruction) -> float:
        """Bytes a kernel reads (its operands) and writes (its result)."""
        operands = sum(shape_bytes(self.operand_shape(computation, inst, i)) for i in range(len(inst.operands)))
        return operands + shape_bytes(inst.shape)


def hlo_op_costs(hlo_text: str) -> pd.DataFrame:
    """FLOPs, transcendentals and bytes of each kernel (launch unit) of the module's executed
    computations: | name | opcode | flops | transcendentals | bytes |."""
    module = parse_hlo(hlo_text)
    costs = _Costs(module)
    rows = []
    for computation in module.executed():
        for inst in computation.instructions:
            if inst.opcode in PLUMBING or inst.opcode in ("while", "conditional", "call"):
                continue
            flops, transcendentals = costs.arithmetic(computation, inst)
            rows.append((inst.name, inst.opcode, flops, transcendentals, costs.bytes(computation, inst)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def attach_hlo_costs(trace: Trace, hlo_text: str) -> Trace:
    """`trace` with the `flops` and `bytes` of its `hlo` events of this HLO's module filled in where the
    trace has none (XLA:CPU profiles carry no cost stats); events of other modules are left alone."""
    module = parse_hlo(hlo_text).name
    table = hlo_op_costs(hlo_text).drop_duplicates("name").set_index("name")
    events = trace.events
    kind = events["kind"].to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(kind == "hlo")
    if not len(rows) or table.empty:
        return trace
    names = events["name"].to_numpy(zero_copy_only=False)[rows]
    args = events["args"].to_numpy(zero_copy_only=False)[rows]
    ours = np.array([_module_of(a) == module for a in args], dtype=bool) if module else np.ones(len(rows), bool)
    flops = events["flops"].to_numpy(zero_copy_only=False).copy()
    moved = events["bytes"].to_numpy(zero_copy_only=False).copy()
    known = pd.Index(table.index)
    for row, name, mine in zip(rows, names, ours, strict=True):
        if mine and name in known:
            if np.isnan(flops[row]):
                flops[row] = table.at[name, "flops"]
            if np.isnan(moved[row]):
                moved[row] = table.at[name, "bytes"]
    columns = {"flops": pa.array(flops, pa.float64()), "bytes": pa.array(moved, pa.float64())}
    for column, values in columns.items():
        events = events.set_column(events.schema.get_field_index(column), column, values)
    return Trace(events=events, memory=trace.memory, counters=trace.counters, metadata=trace.metadata)


def _module_of(args: object) -> str | None:
    """The `hlo_module` stat of an event's args JSON."""
    if not isinstance(args, str) or "hlo_module" not in args:
        return None
    value: Mapping[str, object] = json.loads(args)
    module = value.get("hlo_module")
    return str(module) if module is not None else None
