"""The recorded inputs of one op call as argument specs, from its Kineto args (no torch).

torch.profiler records one entry per argument of the op's schema, defaults included, in four parallel lists:

| Input type | Input Dims | Input Strides | Concrete Inputs | read as |
|---|---|---|---|---|
| a tensor type ("float", "long int", "c10::BFloat16") | [2, 16] | [16, 1] | "" | `TensorArg` |
| "TensorList" | [[4, 8], [4, 8]] | [[8, 1], [8, 1]] | "" | `TensorListArg` |
| "Scalar" | [] | [] | "1", "0.", "True" | `ValueArg` (int, float or bool) |
| "ScalarList" | [] | [] | "[1, 1]" | `ValueArg` (a list) |
| "" | [] | [] | "" | `MissingArg`: None, or a value the profiler does not record (a string, a device) |

Anything else (older traces' "GenericList") is an `OtherArg`, which the rebuild reports as unsupported. Strides
are absent from traces of torch before ~2.0: tensors are then taken as contiguous.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import msgspec

from workbench.analysis.op_cost import TYPE_NAMES


class NotRebuilt(Exception):
    """An op call that cannot be rebuilt; the message is the one-line reason a replay table shows."""


NON_TENSOR_TYPES = frozenset({"Scalar", "ScalarList", "TensorList", "GenericList", ""})
"""Input types that are not a tensor's dtype."""

UNRECORDED_DTYPE = ""
"""The dtype of a tensor in a tensor list: the profiler records the list's shapes and strides, not its dtypes."""


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument: its shape, recorded type name (`UNRECORDED_DTYPE` in a tensor list) and strides (None
    when not recorded: contiguous)."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...] | None


@dataclass(frozen=True)
class TensorListArg:
    """A list of tensors (`Tensor[]`: cat, stack)."""

    tensors: tuple[TensorArg, ...]


@dataclass(frozen=True)
class ValueArg:
    """A scalar or a list of scalars, as recorded (`text`) and parsed (`value`: bool, int, float or a list of
    them; None when the text is not a literal)."""

    recorded: str
    text: str
    value: Any


@dataclass(frozen=True)
class MissingArg:
    """An argument recorded with no type: None, or a value of a kind the profiler does not record."""


@dataclass(frozen=True)
class OtherArg:
    """An argument of a type this replay does not rebuild (`recorded` names it)."""

    recorded: str


Arg = TensorArg | TensorListArg | ValueArg | MissingArg | OtherArg


def recorded_inputs(args_text: object) -> dict[str, Any] | None:
    """The four recorded input lists of an event's args JSON (keys as Kineto writes them), or None when the event
    has no `Input type` (recorded without shapes)."""
    if not isinstance(args_text, str) or "Input type" not in args_text:
        return None
    try:
        args = msgspec.json.decode(args_text)
    except msgspec.DecodeError:
        return None
    if not isinstance(args, dict) or not isinstance(args.get("Input type"), list):
        return None
    return {key: args.get(key) for key in ("Input type", "Input Dims", "Input Strides", "Concrete Inputs")}


def parse_inputs(inputs: dict[str, Any]) -> tuple[Arg, ...]:
    """The argument specs of one call from its `recorded_inputs`; NotRebuilt when the lists disagree."""
    types = inputs["Input type"]
    dims = inputs.get("Input Dims")
    strides = inputs.get("Input Strides")
    concrete = inputs.get("Concrete Inputs")
    if not isinstance(dims, list) or len(dims) != len(types):
        raise NotRebuilt("input dims not recorded for every argument")
    if not isinstance(strides, list) or len(strides) != len(types):
        strides = [None] * len(types)
    if not isinstance(concrete, list) or len(concrete) != len(types):
        concrete = [""] * len(types)
    return tuple(_arg(str(t), d, s, str(c)) for t, d, s, c in zip(types, dims, strides, concrete, strict=True))


def _arg(recorded: str, dims: Any, strides: Any, concrete: str) -> Arg:
    if recorded == "TensorList":
        if not isinstance(dims, list) or not all(isinstance(d, list) for d in dims):
            raise NotRebuilt("a tensor list recorded without its shapes")
        each = strides if isinstance(strides, list) and len(strides) == len(dims) else [None] * len(dims)
        return TensorListArg(tuple(_tensor(UNRECORDED_DTYPE, d, s) for d, s in zip(dims, each, strict=True)))
    if recorded in ("Scalar", "ScalarList"):
        return ValueArg(recorded, concrete, literal(concrete))
    if recorded == "":
        return MissingArg()
    if recorded in NON_TENSOR_TYPES:
        return OtherArg(recorded)
    return _tensor(recorded, dims, strides)


def _tensor(dtype: str, dims: Any, strides: Any) -> TensorArg:
    if not _ints(dims):
        raise NotRebuilt(f"a {dtype} tensor recorded without a shape")
    shape = tuple(dims)
    kept = tuple(strides) if _ints(strides) and len(strides) == len(shape) else None
    return TensorArg(shape, dtype, kept)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def literal(text: str) -> Any:
    """A recorded scalar or list as a Python value ("1" -> 1, "0." -> 0.0, "True" -> True, "[1, 1]" -> [1, 1],
    "inf" -> inf); None when it is none of these."""
    text = text.strip()
    if not text:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return float(text)
    except ValueError:
        return None


def signature_text(args: tuple[Arg, ...]) -> str:
    """A short readable form of a call's arguments: `f32[2,16,32], f32[32,32]ᵀ(1,32), 1` (tensors as dtype and
    shape, with their strides when not contiguous; values as recorded; `-` for a missing one)."""
    return ", ".join(_arg_text(arg) for arg in args)


def _arg_text(arg: Arg) -> str:
    if isinstance(arg, TensorArg):
        text = f"{TYPE_NAMES.get(arg.dtype, arg.dtype)}[{','.join(map(str, arg.shape))}]"
        if arg.strides is not None and not is_contiguous(arg.shape, arg.strides):
            text += f"({','.join(map(str, arg.strides))})"
        return text
    if isinstance(arg, TensorListArg):
        return "[" + ", ".join(map(_arg_text, arg.tensors)) + "]"
    if isinstance(arg, ValueArg):
        return arg.text or "-"
    if isinstance(arg, OtherArg):
        return f"<{arg.recorded}>"
    return "-"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `shape`."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether `strides` lay `shape` out row-major (dimensions of size 1 may have any stride)."""
    return all(size == 1 or stride == expected
               for size, stride, expected in zip(shape, strides, contiguous_strides(shape), strict=True))


def storage_elements(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements of storage a strided view of `shape` reaches (0 for an empty tensor)."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True))

