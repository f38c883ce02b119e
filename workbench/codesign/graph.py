"""A model's operator graph as a table, from a captured run's recorded shapes or from one forward of a torch model.

| order | name | kind | layer | dtype | batch | m | k | n | elements | transcendental | flops | bytes | out_bytes |
  measured_ns | inputs_from | weight_input |

One row per operator call in program order. FLOPs and bytes come from `workbench.analysis.op_cost` (its rules and
its compulsory-traffic bytes); this module adds what projection needs besides: the `kind` (`OP_KINDS`), the GEMM
sizes of matrix-like operators (`batch` independent products of an M x K by K x N matrix: a Linear's rows fold into
M; a convolution is its implicit GEMM with K = C_in/groups · kernel and N = C_out; attention is per head Tq x D by
D x Tk, its second product Tq x Tk by Tk x Dv projected with the same tiles), the elements of vector work and
how many of them need a transcendental function (exp, tanh, erf, ...: one per softmax element), and the bytes of
the output (for fusion). `layer` is the module that ran the operator (from a forward) or "" (from a trace);
`block_of` groups layers into the model's blocks.

The dataflow, from a forward only (a trace records no tensor identities: there both are None): `inputs_from` is the
tuple of the orders of the earlier rows that wrote the operator's tensor inputs, found by storage identity so that
the views the graph leaves out (a reshape, a transpose, a head split) still link producer to consumer; inputs no row
wrote (the model's inputs, its weights) add nothing. `weight_input` says whether an input is a parameter or buffer of
the module: a weight. Tensor-parallel projection (`workbench.codesign.sharding`) propagates its sharding along them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.breakdown import device_time_launched_ns
from workbench.analysis.op_cost import (
    ATTENTION_CAUSAL_ARG,
    CONV_ARGS,
    COPIES,
    ELEMENTWISE,
    ITEM_BYTES,
    MATMUL,
    PER_ELEMENT_FLOPS,
    TYPE_NAMES,
    _concrete,
    _decoded,
    base_name,
    compute_dtype,
    op_cost,
)
from workbench.codesign.description import TARGET_DTYPES

GRAPH_COLUMNS = ("order", "name", "kind", "layer", "dtype", "batch", "m", "k", "n", "elements", "transcendental",
                 "flops", "bytes", "out_bytes", "measured_ns", "inputs_from", "weight_input")
TRANSCENDENTAL = frozenset({"exp", "log", "sin", "cos", "tanh", "tanh_", "gelu", "gelu_", "silu", "silu_", "sigmoid",
                            "sigmoid_", "erf", "pow", "rsqrt", "sqrt", "mish", "elu"})
"""Elementwise ops whose every output element needs a transcendental function on the vector units."""
SOFTMAX = frozenset({"softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"})
TOP_LEVEL = "(model)"
"""The layer of an op the model's own forward runs, outside any submodule."""
_RECORDED = {canonical: recorded for recorded, canonical in reversed(list(TYPE_NAMES.items()))}
"""Canonical dtype -> the type name torch.profiler records for it (the first TYPE_NAMES gives)."""


def block_of(layer: str) -> str:
    """The model block a layer belongs to: its name up to the first index ("blocks.0.attn.q_proj" -> "blocks.0"),
    else its first part ("lm_head"); "" (a trace records no modules) stays ""."""
    parts = layer.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return ".".join(parts[: index + 1]) if index is not None else parts[0]


def op_kind(name: str) -> str:
    """The `OP_KINDS` entry of an op name ("aten::addmm" -> "matmul"; an op op_cost does not know -> "other")."""
    op = base_name(name)
    if op in MATMUL:
        return "matmul"
    if op in CONV_ARGS:
        return "conv"
    if op in ATTENTION_CAUSAL_ARG:
        return "attention"
    if op in ELEMENTWISE:
        return "elementwise"
    if op in SOFTMAX:
        return "softmax"
    if op in PER_ELEMENT_FLOPS:
        return "norm"
    if op in COPIES or op == "embedding":
        return "copy"
    return "other"


def graph_row(name: str, shapes: Sequence[Any], dtypes: Sequence[str], concrete: Sequence[str] | None, *,
              layer: str = "", extra_bytes: float = 0.0, out_bytes: float | None = None) -> dict[str, Any] | None:
    """One graph row from an op's recorded shapes, type names and concrete inputs (as `op_cost` takes them);
    None when op_cost cannot cost it and no `extra_bytes` (data an unknown op moved) are given."""
    cost = op_cost(name, shapes, dtypes, concrete)
    kind = op_kind(name)
    dtype = cost.dtype if cost is not None else compute_dtype(dtypes)
    if cost is None:
        if not extra_bytes:
            return None
        flops, moved = 0.0, float(extra_bytes)
        kind = "other"
    else:
        flops, moved = cost.flops, cost.bytes
    row: dict[str, Any] = {"name": base_name(name), "kind": kind, "layer": layer, "dtype": dtype, "batch": np.nan,
                           "m": np.nan, "k": np.nan, "n": np.nan, "elements": np.nan, "transcendental": 0.0,
                           "flops": flops, "bytes": moved, "out_bytes": np.nan if out_bytes is None else out_bytes,
                           "measured_ns": np.nan, "inputs_from": None, "weight_input": None}
    item = ITEM_BYTES.get(dtype or "fp32", 4)
    op = base_name(name)
    if kind in ("matmul", "conv", "attention"):
        dims = _gemm_dims(op, kind, shapes, flops)
        if dims is not None:
            row.update(zip(("batch", "m", "k", "n"), dims, strict=True))
            if out_bytes is None and kind == "matmul":
                row["out_bytes"] = dims[0] * dims[1] * dims[3] * item
    elif kind == "elementwise":
        row["elements"] = flops
        row["transcendental"] = flops if op in TRANSCENDENTAL else 0.0
        if out_bytes is None:
            row["out_bytes"] = flops * item
    elif kind in ("softmax", "norm"):
        row["elements"] = flops / PER_ELEMENT_FLOPS[op]
        row["transcendental"] = row["elements"] if kind == "softmax" else 0.0
    return row


def _gemm_dims(op: str, kind: str, shapes: Sequence[Any], flops: float) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a matrix-like op; batch is what FLOPs leave after 2·M·K·N."""
    try:
        if kind == "attention":
            q, k = shapes[0], shapes[1]
            m, kk, n = q[-2], q[-1], k[-2]
        elif kind == "conv":
            weight = shapes[1]
            kk, n = math.prod(weight[1:]), weight[0]
            m = round(flops / (2 * kk * n))
        else:
            a, b = (shapes[1], shapes[2]) if op in ("addmm", "baddbmm", "_addmm_activation") else (shapes[0], shapes[1])
            kk = a[-1]
            n = b[0] if op == "linear" else (b[-1] if len(b) > 1 else 1)
            m = math.prod(a[:-1]) if op == "linear" else (a[-2] if len(a) > 1 else 1)
        batch = max(1, round(flops / (2 * m * kk * n))) if kind != "conv" else 1
        return int(batch), int(m), int(kk), int(n)
    except (IndexError, TypeError, ZeroDivisionError):
        return None


def graph_from_trace(events: pd.DataFrame, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """The graph of a trace's framework ops (kind "op") starting inside `window`: the outermost op of each call
    whose work op_cost knows (aten::linear, not also the addmm it calls). `measured_ns` is the device time it
    launched (a GPU run), else its own duration (a CPU run). `events` is a whole events table (`parent` and
    `launcher` are row numbers)."""
    ops = events[events["kind"].astype(str) == "op"]
    if window is not None:
        ops = ops[(ops["start_ns"] >= window[0]) & (ops["start_ns"] < window[1])]
    costed: dict[int, dict[str, Any]] = {}
    decoded: dict[str, Any] = {}
    for index, name, shapes, dtypes, args in zip(ops.index, ops["name"].astype(str), ops["shapes"], ops["dtypes"],
                                                 ops["args"], strict=True):
        if not isinstance(shapes, str) or not isinstance(dtypes, str):
            continue
        row = graph_row(name, _decoded(decoded, shapes), _decoded(decoded, dtypes), _concrete(args))
        if row is not None:
            costed[int(index)] = row
    parents = events["parent"].to_numpy()
    launched = device_time_launched_ns(events)
    durations = events["dur_ns"].to_numpy()
    rows = []
    for index, row in costed.items():
        parent = parents[index]
        while parent >= 0 and int(parent) not in costed:
            parent = parents[parent]
        if parent < 0:
            row["measured_ns"] = float(launched[index] if launched[index] > 0 else durations[index])
            rows.append((int(events.at[index, "start_ns"]), row))
    rows.sort(key=lambda item: item[0])
    return _frame([row for _, row in rows])


def graph_from_model(module: Any, inputs: Sequence[Any], *, timed: bool = False) -> pd.DataFrame:
    """The graph of one forward of a torch `module` on `inputs` (eval, no grad): every aten op that computes or
    moves data (views and ops whose output aliases an input are left out), attributed to the innermost module
    that ran it. With `timed`, `measured_ns` is each op's wall time in this eager forward (for validation). Each
    row's `inputs_from` and `weight_input` (the module docstring) come from its tensors' storages: a storage's
    writer is the last recorded row whose output lives in it, held by a weak reference so that a storage freed and
    another allocated at the same address is never taken for it."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from workbench.quant.layers import observed_forward

    stack: list[str] = []
    rows: list[dict[str, Any]] = []
    weights = [t.untyped_storage() for t in (*module.parameters(), *module.buffers()) if t.numel()]
    weight_ids = {id(storage) for storage in weights}  # `weights` keeps them alive, so the ids stay theirs
    writers: dict[int, tuple[Any, int]] = {}  # id(storage) -> (a weak reference to it, the order that wrote it)

    def storages_of(values: Any) -> list[Any]:
        return [leaf.untyped_storage() for leaf in tree_leaves(values)
                if isinstance(leaf, torch.Tensor) and leaf.numel()]

    def written_by(storage: Any) -> int | None:
        entry = writers.get(id(storage))
        return entry[1] if entry is not None and entry[0]() is storage else None

    def tensors(values: Any) -> list[torch.Tensor]:
        flat = values if isinstance(values, list | tuple) else [values]
        return [v for v in flat if isinstance(v, torch.Tensor)]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            start = time.perf_counter_ns()
            result = func(*args, **(kwargs or {}))
            elapsed = time.perf_counter_ns() - start
            if func.is_view:
                return result
            inputs_, outputs = tensors(list(args) + list((kwargs or {}).values())), tensors(result)
            storages = {t.untyped_storage().data_ptr() for t in inputs_ if t.numel()}
            if any(t.numel() and t.untyped_storage().data_ptr() in storages for t in outputs) and \
                    op_kind(func._overloadpacket.__name__) == "other":
                return result  # a reshape that aliases its input moves nothing
            read, wrote = storages_of((args, kwargs)), storages_of(result)
            shapes = [list(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
            dtypes = [_RECORDED.get(_canonical(a.dtype), "") if isinstance(a, torch.Tensor) else "Scalar"
                      for a in args]
            concrete = ["" if isinstance(a, torch.Tensor) else str(a) for a in args]
            out = sum(t.numel() * t.element_size() for t in outputs)
            moved = sum(t.numel() * t.element_size() for t in inputs_) + out
            row = graph_row(f"aten::{func._overloadpacket.__name__}", shapes, dtypes, concrete,
                            layer=stack[-1] if stack else TOP_LEVEL, extra_bytes=moved, out_bytes=float(out))
            if row is not None:
                row["measured_ns"] = float(elapsed) if timed else np.nan
                row["inputs_from"] = tuple(dict.fromkeys(o for o in map(written_by, read) if o is not None))
                row["weight_input"] = any(id(storage) in weight_ids for storage in read)
                rows.append(row)
            for storage in wrote:  # an unrecorded op's output has no writer the graph knows
                if row is None:
                    writers.pop(id(storage), None)
                else:
                    writers[id(storage)] = (weakref.ref(storage), len(rows) - 1)
            return result

    def enter(name: str):
        def hook(module: Any, args: Any) -> None:
            stack.append(name)
        return hook

    def leave(module: Any, args: Any, out: Any) -> None:
        stack.pop()

    hooks = [(m, hook, True) for name, m in module.named_modules() if name for hook in [enter(name)]]
    hooks += [(m, leave, False) for name, m in module.named_modules() if name]
    with Recorder():
        observed_forward(module, inputs, hooks)
    return _frame(rows)


FLOAT_DTYPES = frozenset({"fp64", "fp32", "bf16", "fp16", "fp8"})
"""Dtypes `at_dtype` changes (integer operators, such as index arithmetic, keep theirs)."""


def at_dtype(graph: pd.DataFrame, dtype: str, rows: Any = None) -> pd.DataFrame:
    """`graph` with its floating-point operators (those of the index `rows`, default all) in `dtype`: their bytes
    and output bytes scaled by the ratio of element sizes (op_cost counts an operator's operands in its dtype, so
    an embedding's integer indices scale with its table: a small overcount). FLOPs and shapes are unchanged."""
    if dtype not in TARGET_DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(TARGET_DTYPES)}")
    changed = graph.copy()
    floats = changed["dtype"].isin(FLOAT_DTYPES)
    if rows is not None:
        floats &= changed.index.isin(rows)
    ratio = ITEM_BYTES[dtype] / changed.loc[floats, "dtype"].map(ITEM_BYTES).astype(float)
    changed.loc[floats, "bytes"] = changed.loc[floats, "bytes"] * ratio
    changed.loc[floats, "out_bytes"] = changed.loc[floats, "out_bytes"] * ratio
    changed.loc[floats, "dtype"] = dtype
    return changed


def _canonical(dtype: Any) -> str:
    """A torch dtype's canonical name (torch.bfloat16 -> "bf16")."""
    text = str(dtype).removeprefix("torch.")
    return {"float32": "fp32", "float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8",
            "float8_e5m2": "fp8"}.get(text, text)


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=[c for c in GRAPH_COLUMNS if c != "order"])
    frame.insert(0, "order", np.arange(len(frame), dtype=np.int64))
    return frame

