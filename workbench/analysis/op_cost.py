"""FLOPs and bytes of framework ops from the shapes and dtypes a profiler recorded.

torch.profiler records each op's input dims (`Input Dims` -> events `shapes`), input types (`Input
type` -> `dtypes`) and, in recent versions, non-tensor arguments as strings (`Concrete Inputs`, kept in
`args`): enough to count the work of the ops that dominate inference.

- matmul (mm, bmm, matmul, addmm, baddbmm, linear, _int_mm): 2·M·K·N FLOPs per batch entry (torch's
  convention; the addmm bias add is not counted); bytes: operands + bias + output.
- convolution (conv1d/2d/3d, convolution, _convolution, cudnn/mkldnn/miopen_convolution, transposed):
  2·N·C_out·∏out·(C_in/groups)·∏kernel; bytes: input + weight + bias + output.
- attention (scaled_dot_product_attention and its flash/efficient/cudnn ops): 2·B·H·P·(D + Dv) for the
  products QKᵀ and PV, P = Tq·Tk, or with `is_causal` the unmasked pairs Σ_{i<Tq} min(i+1, Tk) (torch's
  top-left aligned mask, about half); the softmax is not counted; bytes: q + k + v + mask + output.
- elementwise (add, mul, gelu, relu, where, ...): one FLOP per output element (broadcast shape);
  bytes: tensor inputs + output.
- normalization and softmax: `PER_ELEMENT_FLOPS` per input element; bytes: tensor inputs + output.
- copy_, clone, embedding: no FLOPs; bytes: what is read and written.

Bytes are the compulsory traffic: each tensor read once and the output written once (caches can do
better on reuse, tiling worse). Convolution parameters (stride, padding, dilation, groups) and the
attention `is_causal` flag come from `Concrete Inputs`; a convolution without them (traces from torch
before ~2.1, or padding given as a string) has unknown cost, while attention without the flag is
counted as non-causal. Other ops have unknown cost (None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pandas as pd

TYPE_NAMES = {
    "float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "c10::Float8_e8m0fnu": "fp8", "signed char": "int8", "unsigned char": "uint8",
    "c10::qint8": "int8", "c10::quint8": "uint8", "c10::qint32": "int32", "short": "int16", "int": "int32",
    "long": "int64", "long int": "int64", "long long": "int64", "bool": "bool",
    "c10::complex<float>": "complex64", "c10::complex<double>": "complex128", "c10::complex<c10::Half>": "complex32",
}
"""Tensor type names as torch.profiler records them -> canonical dtype names. Anything else
("Scalar", "ScalarList", "GenericList", "Int", "") is not a tensor."""

ITEM_BYTES = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4,
              "int64": 8, "bool": 1, "complex32": 4, "complex64": 8, "complex128": 16}

MATMUL = frozenset({"mm", "_int_mm", "bmm", "matmul", "addmm", "baddbmm", "_addmm_activation", "linear"})
ATTENTION_CAUSAL_ARG = {
    "scaled_dot_product_attention": 5, "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_flash_attention_for_cpu": 4, "_scaled_dot_product_efficient_attention": 6,
    "_scaled_dot_product_cudnn_attention": 6,
}
"""Attention ops -> position of `is_causal` among their arguments."""
CONV_ARGS = {
    # op: (stride, padding, dilation, groups, output_padding, transposed) argument positions; an int
    # `transposed` position is read from the call, True/False is fixed by the op.
    "conv1d": (3, 4, 5, 6, None, False), "conv2d": (3, 4, 5, 6, None, False), "conv3d": (3, 4, 5, 6, None, False),
    "_convolution_mode": (3, 4, 5, 6, None, False),
    "convolution": (3, 4, 5, 8, 7, 6), "_convolution": (3, 4, 5, 8, 7, 6),
    "conv_transpose1d": (3, 4, 7, 6, 5, True), "conv_transpose2d": (3, 4, 7, 6, 5, True),
    "conv_transpose3d": (3, 4, 7, 6, 5, True),
    "cudnn_convolution": (3, 2, 4, 5, None, False), "mkldnn_convolution": (4, 3, 5, 6, None, False),
    "miopen_convolution": (4, 3, 5, 6, None, False), "cudnn_convolution_transpose": (4, 2, 5, 6, 3, True),
}
ELEMENTWISE = frozenset({
    "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "neg", "abs", "exp", "log", "sin", "cos",
    "tanh", "tanh_", "gelu", "gelu_", "relu", "relu_", "silu", "silu_", "sigmoid", "sigmoid_", "hardtanh",
    "hardtanh_", "hardswish", "hardswish_", "leaky_relu", "elu", "mish", "erf", "pow", "rsqrt", "sqrt",
    "reciprocal", "square", "where", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_",
    "maximum", "minimum", "masked_fill", "masked_fill_", "threshold", "lerp", "addcmul", "addcdiv",
})
PER_ELEMENT_FLOPS = {
    # mean 1 + variance 3 + normalize 2 + affine 2
    "layer_norm": 8, "native_layer_norm": 8, "group_norm": 8, "native_group_norm": 8,
    # square 1 + sum 1 + scale 1 + affine 1
    "rms_norm": 4, "_fused_rms_norm": 4,
    # inference: subtract mean, multiply by rstd, scale, shift
    "batch_norm": 4, "native_batch_norm": 4, "_batch_norm_impl_index": 4, "cudnn_batch_norm": 4,
    "_native_batch_norm_legit_no_training": 4,
    # max 1 + subtract 1 + exp 1 + sum 1 + divide 1
    "softmax": 5, "_softmax": 5, "_safe_softmax": 5, "log_softmax": 5, "_log_softmax": 5,
}
"""FLOPs per input element of normalization and softmax ops (the comments give the count)."""
COPIES = frozenset({"copy_", "clone"})
NEEDS_CONCRETE = frozenset(CONV_ARGS) | frozenset(ATTENTION_CAUSAL_ARG)
KNOWN = MATMUL | NEEDS_CONCRETE | ELEMENTWISE | frozenset(PER_ELEMENT_FLOPS) | COPIES | {"embedding"}


@dataclass(frozen=True)
class OpCost:
    """Work of one op call: FLOPs, compulsory bytes moved and the dtype it computes in."""

    flops: float
    bytes: float
    dtype: str | None


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEM_BYTES.get(self.dtype, 4)


def base_name(name: str) -> str:
    """An op name without its `aten::` namespace (other namespaces are kept)."""
    return name.removeprefix("aten::")


def compute_dtype(dtypes: Sequence[str]) -> str | None:
    """The canonical dtype of an op's first tensor input (uint8 counts as int8: same matrix units)."""
    for recorded in dtypes:
        if recorded in TYPE_NAMES:
            canonical = TYPE_NAMES[recorded]
            return "int8" if canonical == "uint8" else canonical
    return None


def op_cost(name: str, shapes: Sequence[Any], dtypes: Sequence[str],
            concrete: Sequence[str] | None = None) -> OpCost | None:
    """FLOPs and bytes of one call of op `name` (see the module table), or None when unknown.

    `shapes` and `dtypes` are the recorded input dims and type names, one entry per argument;
    `concrete` the recorded `Concrete Inputs` strings (needed for convolutions).
    """
    op = base_name(name)
    if op not in KNOWN:
        return None
    args: list[_Tensor | None] = []
    for index, recorded in enumerate(dtypes):
        shape = shapes[index] if index < len(shapes) else None
        is_tensor = recorded in TYPE_NAMES and isinstance(shape, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        args.append(_Tensor(tuple(shape), TYPE_NAMES[recorded]) if is_tensor else None)
    try:
        return _cost(op, args, list(concrete) if concrete is not None else None)
    except (IndexError, ValueError, TypeError, ZeroDivisionError):
        return None  # shapes that do not fit the op (a recording quirk): unknown, never a crash


def _cost(op: str, args: list[_Tensor | None], concrete: list[str] | None) -> OpCost | None:
    tensors = [t for t in args if t is not None]
    if not tensors:
        return None
    if op in MATMUL:
        return _matmul(op, args)
    if op in CONV_ARGS:
        return _convolution(op, args, concrete)
    if op in ATTENTION_CAUSAL_ARG:
        return _attention(op, args, concrete)
    first = tensors[0]
    if op in ELEMENTWISE:
        values = next((t for t in tensors if t.dtype != "bool"), first)  # where(cond, x, y) computes in x's dtype
        out = _Tensor(_broadcast([t.shape for t in tensors]), values.dtype)
        return OpCost(float(out.numel), float(sum(t.nbytes for t in tensors) + out.nbytes), _family(values))
    if op in PER_ELEMENT_FLOPS:
        moved = sum(t.nbytes for t in tensors) + first.nbytes
        return OpCost(float(PER_ELEMENT_FLOPS[op] * first.numel), float(moved), _family(first))
    if op in COPIES:
        moved = sum(t.nbytes for t in tensors[:2]) if op == "copy_" else 2 * first.nbytes
        return OpCost(0.0, float(moved), _family(first))
    if op == "embedding" and len(tensors) >= 2:
        weight, indices = tensors[0], tensors[1]
        gathered = indices.numel * weight.shape[-1] * ITEM_BYTES[weight.dtype]
        return OpCost(0.0, float(indices.nbytes + 2 * gathered), _family(weight))
    return None


def _family(tensor: _Tensor) -> str:
    return "int8" if tensor.dtype == "uint8" else tensor.dtype


def _matmul(op: str, args: list[_Tensor | None]) -> OpCost | None:
    """Matrix products: operands by position, output shape by torch.matmul's broadcasting rules."""
    bias: _Tensor | None = None
    if op in ("addmm", "baddbmm", "_addmm_activation"):
        bias, a, b = args[0], args[1], args[2]
    else:
        a, b = args[0], args[1]
        if op == "linear":
            bias = args[2] if len(args) > 2 else None
    if a is None or b is None:
        return None
    b_shape = (b.shape[1], b.shape[0]) if op == "linear" else b.shape  # linear's weight is [N, K]
    a_shape = a.shape if len(a.shape) > 1 else (1, *a.shape)
    b_shape = b_shape if len(b_shape) > 1 else (*b_shape, 1)
    (m, k), (k2, n) = a_shape[-2:], b_shape[-2:]
    if op == "linear":
        batch = a.shape[:-1]
        out_shape = (*batch, n)
        rows = math.prod(batch)
        flops = 2 * rows * k * n
    else:
        batch = _broadcast([a_shape[:-2], b_shape[:-2]])
        out_shape = (*batch, m, n)
        flops = 2 * math.prod(batch) * m * k * n
    if k != k2:
        raise ValueError(f"inner dims differ: {a.shape} x {b.shape}")
    out = _Tensor(out_shape, "int32" if op == "_int_mm" else a.dtype)
    moved = a.nbytes + b.nbytes + (bias.nbytes if bias is not None else 0) + out.nbytes
    return OpCost(float(flops), float(moved), _family(a))


def _convolution(op: str, args: list[_Tensor | None], concrete: list[str] | None) -> OpCost | None:
    """Convolutions: output size from stride, padding, dilation (and output padding when transposed)."""
    x, w = args[0], args[1]
    if x is None or w is None or concrete is None:
        return None
    stride_at, padding_at, dilation_at, groups_at, out_padding_at, transposed_at = CONV_ARGS[op]
    dims = len(w.shape) - 2
    stride = _int_list(concrete, stride_at, dims)
    padding = _int_list(concrete, padding_at, dims)
    dilation = _int_list(concrete, dilation_at, dims)
    groups = _scalar(concrete, groups_at)
    transposed = transposed_at if isinstance(transposed_at, bool) else _scalar(concrete, transposed_at) == "True"
    out_padding = _int_list(concrete, out_padding_at, dims) if transposed and out_padding_at is not None else [0] * dims
    if stride is None or padding is None or dilation is None or out_padding is None or not groups:
        return None
    batch = x.shape[0] if len(x.shape) == dims + 2 else 1
    spatial, kernel = x.shape[-dims:], w.shape[2:]
    if transposed:
        out = [(i - 1) * s - 2 * p + d * (k - 1) + op_ + 1
               for i, s, p, d, k, op_ in zip(spatial, stride, padding, dilation, kernel, out_padding, strict=True)]
        channels_out = w.shape[1] * int(groups)
        flops = 2 * batch * math.prod(spatial) * w.shape[0] * w.shape[1] * math.prod(kernel)
    else:
        out = [(i + 2 * p - d * (k - 1) - 1) // s + 1
               for i, s, p, d, k in zip(spatial, stride, padding, dilation, kernel, strict=True)]
        channels_out = w.shape[0]
        flops = 2 * batch * channels_out * math.prod(out) * w.shape[1] * math.prod(kernel)
    if min(out) <= 0:
        return None
    bias = args[2] if op not in ("cudnn_convolution", "cudnn_convolution_transpose") and len(args) > 2 else None
    out_bytes = batch * channels_out * math.prod(out) * ITEM_BYTES.get(x.dtype, 4)
    moved = x.nbytes + w.nbytes + (bias.nbytes if bias is not None else 0) + out_bytes
    return OpCost(float(flops), float(moved), _family(x))


def _attention(op: str, args: list[_Tensor | None], concrete: list[str] | None) -> OpCost | None:
    """Attention: the two matrix products QKᵀ and PV over the unmasked (query, key) pairs."""
    q, k, v = args[0], args[1], args[2]
    if q is None or k is None or v is None:
        return None
    causal = concrete is not None and _scalar(concrete, ATTENTION_CAUSAL_ARG[op]) == "True"
    t_q, d = q.shape[-2], q.shape[-1]
    t_k, d_v = k.shape[-2], v.shape[-1]
    heads = math.prod(q.shape[:-2])
    pairs = _causal_pairs(t_q, t_k) if causal else t_q * t_k
    flops = 2 * heads * pairs * (d + d_v)
    out_bytes = heads * t_q * d_v * ITEM_BYTES.get(q.dtype, 4)
    mask = sum(t.nbytes for t in args[3:] if t is not None)
    return OpCost(float(flops), float(q.nbytes + k.nbytes + v.nbytes + mask + out_bytes), _family(q))


def _causal_pairs(t_q: int, t_k: int) -> int:
    """Unmasked pairs of a top-left aligned causal mask: Σ_{i<t_q} min(i + 1, t_k)."""
    if t_q <= t_k:
        return t_q * (t_q + 1) // 2
    return t_k * (t_k + 1) // 2 + (t_q - t_k) * t_k


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """numpy/torch broadcasting of several shapes (ValueError when they do not broadcast)."""
    return tuple(np.broadcast_shapes(*shapes))


def _scalar(concrete: list[str], index: int | None) -> str | None:
    if index is None or index >= len(concrete):
        return None
    return str(concrete[index]).strip() or None


def _int_list(concrete: list[str], index: int | None, dims: int) -> list[int] | None:
    """A recorded int list ("[2, 2]", "[1]" or "2") expanded to `dims` entries; None if absent."""
    text = _scalar(concrete, index)
    if text is None:
        return None
    try:
        values = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    values = values if isinstance(values, list) else [values]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return None
    if len(values) == 1:
        values = values * dims
    return values if len(values) == dims else None


def event_costs(events: pd.DataFrame) -> pd.DataFrame:
    """Per event row: `flops`, `bytes` (NaN when unknown) and `dtype` (None when unknown) from shapes.

    | (index of events) | flops | bytes | dtype |

    Each distinct (name, shapes, dtypes) is costed once, so a million-event trace costs no more than
    its distinct calls; `args` is decoded only for convolutions and attention.
    """
    n = len(events)
    flops = np.full(n, np.nan)
    moved = np.full(n, np.nan)
    dtypes_out = np.full(n, None, dtype=object)
    names = events["name"].astype(str).to_numpy()
    shapes = events["shapes"].to_numpy(dtype=object)
    dtypes = events["dtypes"].to_numpy(dtype=object)
    args = events["args"].to_numpy(dtype=object)
    decoded: dict[str, list[Any]] = {}
    cache: dict[tuple[Any, ...], OpCost | None] = {}
    for row in np.flatnonzero(pd.notna(dtypes)):
        type_list = _decoded(decoded, dtypes[row])
        dtypes_out[row] = compute_dtype(type_list)
        op = base_name(names[row])
        if op not in KNOWN or not isinstance(shapes[row], str):
            continue
        concrete = _concrete(args[row]) if op in NEEDS_CONCRETE else None
        key = (names[row], shapes[row], dtypes[row], concrete)
        if key not in cache:
            shape_list = _decoded(decoded, shapes[row])
            cache[key] = op_cost(names[row], shape_list, type_list, concrete)
        cost = cache[key]
        if cost is not None:
            flops[row], moved[row] = cost.flops, cost.bytes
    dtype = pd.Series(dtypes_out, dtype=object, index=events.index)  # None stays None (no str inference)
    return pd.DataFrame({"flops": flops, "bytes": moved, "dtype": dtype}, index=events.index)


def _decoded(memo: dict[str, list[Any]], text: str) -> list[Any]:
    """A recorded JSON list (shapes or type names), decoded once per distinct text; [] if malformed."""
    if text not in memo:
        try:
            value = msgspec.json.decode(text)
        except msgspec.DecodeError:
            value = []
        memo[text] = value if isinstance(value, list) else []
    return memo[text]


def _concrete(args: object) -> tuple[str, ...] | None:
    """The `Concrete Inputs` strings of an event's args JSON, or None when not recorded."""
    if not isinstance(args, str) or "Concrete Inputs" not in args:
        return None
    try:
        values = msgspec.json.decode(args).get("Concrete Inputs")
    except (msgspec.DecodeError, AttributeError):
        return None
    return tuple(str(v) for v in values) if isinstance(values, list) else None
