"""A recorded op call rebuilt as a standalone call: its overload resolved, its tensors made, under a variant.

- Resolution: `ns::name` is looked up in `torch.ops`; an overload is taken when its schema has exactly the
  recorded number of arguments (the profiler records every argument, defaults included) and each recorded input
  fits its type (a tensor a `Tensor`, a tensor list a `Tensor[]`, a "Scalar" an int, float, bool or number of the
  right kind, a "ScalarList" a list of them, an unrecorded input an optional or defaulted argument). ScalarType,
  Layout and MemoryFormat are ints in schemas, recorded as their codes, and passed as such.
- Tensors: the recorded shape, strides (`as_strided` over a storage just large enough), dtype and device. Floats
  are standard normal; integers are uniform below the smallest dimension of the call's floating tensors (else
  of all its tensors), so an index-like argument (embedding indices, index_select's index) is valid along any
  axis; bools are fair coins. Seeded, so a replay is repeatable.
- Not recorded, so not reproduced: values the profiler never writes (strings, devices, generators; their default
  or None is used and the row says so), the dtypes inside a tensor list (the call's first tensor dtype, else
  fp32), and which device an op that launched no device work had its tensors on (the CPU here).
- Variants: `eager` calls the overload; `bf16` rebuilds the call with its fp32/fp16/fp64 tensors in bfloat16;
  `compile` wraps the call in `torch.compile(fullgraph=True)` with the tensors as inputs. Each compiled call gets
  its own code object, since dynamo caches graphs per code object and would otherwise fall back to eager after
  its recompile limit (8 ops) without saying so.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.analysis.op_cost import TYPE_NAMES
from workbench.replay.calls import (
    UNRECORDED_DTYPE,
    Arg,
    MissingArg,
    NotRebuilt,
    OtherArg,
    TensorArg,
    TensorListArg,
    ValueArg,
    contiguous_strides,
    storage_elements,
)

MAX_REPLAY_BYTES = 4 * 2**30
"""Tensor bytes one rebuilt call may allocate; a larger call is skipped rather than risk the machine's memory."""

TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8",
                "uint8": "uint8", "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool",
                "complex32": "complex32", "complex64": "complex64", "complex128": "complex128"}
"""Canonical dtype names (`op_cost.TYPE_NAMES` values) -> torch dtype attribute names."""

BF16_FROM = (torch.float32, torch.float16, torch.float64)
"""Tensor dtypes the bf16 variant casts to bfloat16."""

NOT_RECORDED_KINDS = frozenset({"StringType", "DeviceObjType", "GeneratorType", "StorageType", "StreamObjType"})
"""Argument kinds torch.profiler records as "" whatever their value: their default (or None) stands in."""

_INT_KINDS = frozenset({"IntType", "SymIntType"})
_FLOAT_KINDS = frozenset({"FloatType", "SymFloatType"})
_BOOL_KINDS = frozenset({"BoolType", "SymBoolType"})


@dataclass(frozen=True)
class Slot:
    """Where the i-th tensor of a call goes in its argument template."""

    index: int


@dataclass(frozen=True)
class Rebuilt:
    """A resolved call: the overload, the recorded arguments in schema order, which go by keyword, the values
    of the non-tensor arguments, and notes on what was assumed."""

    op: torch._ops.OpOverload
    args: tuple[Arg, ...]
    keywords: tuple[str | None, ...]
    values: tuple[Any, ...]
    device: str
    notes: tuple[str, ...]


def resolve(name: str, args: tuple[Arg, ...], device: str) -> Rebuilt:
    """The overload of op `name` that takes the recorded `args`, with the values to pass; NotRebuilt (with the
    reason) when the op is unknown here, no overload fits, the device is missing or the call is too large."""
    namespace, sep, op_name = name.partition("::")
    if not sep or not namespace.isidentifier() or not op_name.isidentifier():
        raise NotRebuilt(f"not a dispatcher op ({name!r} is no namespace::name)")
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
    except (AttributeError, RuntimeError):
        if namespace == "aten":
            raise NotRebuilt(f"{name} is not an op of this torch ({torch.__version__})") from None
        raise NotRebuilt(f"custom op: {name} is not registered in this process (load its library first)") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise NotRebuilt("recorded on a GPU (it launched device work); this machine has no CUDA device")
    problems: list[str] = []
    counts: set[int] = set()
    for overload_name in packet.overloads():
        overload = getattr(packet, overload_name)
        if len(overload._schema.arguments) != len(args):
            counts.add(len(overload._schema.arguments))
            continue
        try:
            keywords, values, notes = _bind(overload._schema, args)
        except NotRebuilt as problem:
            problems.append(f"{overload_name}: {problem}")
            continue
        _check_size(args)
        return Rebuilt(overload, args, keywords, values, device, notes)
    if problems:
        raise NotRebuilt(f"no overload of {name} takes the recorded inputs (closest, {problems[0]})")
    raise NotRebuilt(f"{len(args)} inputs recorded; the overloads of {name} take "
                     f"{', '.join(map(str, sorted(counts)))}")


def _bind(schema: Any, args: tuple[Arg, ...]) -> tuple[tuple[str | None, ...], tuple[Any, ...], tuple[str, ...]]:
    """Per argument (as many as the schema has): its keyword (None when positional) and its value (None for
    tensors), and notes."""
    arguments = schema.arguments
    keywords, values, notes = [], [], []
    for argument, arg in zip(arguments, args, strict=True):
        value, note = _value(argument, arg)
        keywords.append(argument.name if argument.kwarg_only else None)
        values.append(value)
        if note:
            notes.append(note)
    return tuple(keywords), tuple(values), tuple(notes)


def _value(argument: Any, arg: Arg) -> tuple[Any, str | None]:
    """The value to pass for `arg` as `argument` of a schema (None for tensors), and a note when assumed."""
    kind = argument.type.kind()
    element = argument.type.getElementType() if kind == "OptionalType" else argument.type
    if isinstance(arg, MissingArg):
        if element.kind() in NOT_RECORDED_KINDS:
            default = argument.default_value
            return default, f"{argument.name} not recorded: {default!r} used"
        if kind == "OptionalType":
            return None, None
        raise NotRebuilt(f"argument {argument.name!r} ({argument.type}) was not recorded")
    if isinstance(arg, OtherArg):
        raise NotRebuilt(f"argument {argument.name!r} recorded as {arg.recorded!r}, which is not rebuilt")
    if isinstance(arg, TensorArg):
        if element.kind() != "TensorType":
            raise NotRebuilt(f"argument {argument.name!r} ({argument.type}) recorded as a tensor")
        return None, None
    if isinstance(arg, ValueArg) and arg.value is None:
        raise NotRebuilt(f"argument {argument.name!r}: its value was not recorded (no Concrete Inputs)")
    if element.kind() == "ListType":
        item = element.getElementType()
        item = item.getElementType() if item.kind() == "OptionalType" else item
        if isinstance(arg, TensorListArg) and item.kind() == "TensorType":
            return None, None
        if isinstance(arg, ValueArg) and arg.recorded == "ScalarList" and isinstance(arg.value, list | tuple) \
                and all(_fits(item.kind(), v) for v in arg.value):
            return list(arg.value), None
        raise NotRebuilt(f"argument {argument.name!r} ({argument.type}) recorded as {_recorded(arg)}")
    if isinstance(arg, ValueArg) and arg.recorded == "Scalar" and _fits(element.kind(), arg.value):
        return arg.value, None
    raise NotRebuilt(f"argument {argument.name!r} ({argument.type}) recorded as {_recorded(arg)}")


def _fits(kind: str, value: Any) -> bool:
    """Whether a recorded scalar `value` is one of an argument of JIT type `kind` (Scalar is "NumberType")."""
    is_bool = isinstance(value, bool)
    is_int = isinstance(value, int) and not is_bool
    if kind in _INT_KINDS:
        return is_int
    if kind in _FLOAT_KINDS:
        return is_int or isinstance(value, float)
    if kind in _BOOL_KINDS:
        return is_bool
    return kind == "NumberType" and (is_bool or is_int or isinstance(value, float))


def _recorded(arg: Arg) -> str:
    if isinstance(arg, ValueArg):
        return f"{arg.recorded} {arg.text!r}"
    return "a tensor list" if isinstance(arg, TensorListArg) else type(arg).__name__


def torch_dtype(recorded: str) -> torch.dtype:
    """The torch dtype of a recorded tensor type name; NotRebuilt for types not rebuilt (quantized, unknown)."""
    if recorded.startswith("c10::q") or recorded.startswith("c10::Q"):
        raise NotRebuilt(f"quantized tensors ({recorded}) are not rebuilt")
    if recorded.startswith("c10::Float8_"):
        name = "float8_" + recorded.removeprefix("c10::Float8_")
    else:
        name = TORCH_DTYPES.get(TYPE_NAMES.get(recorded, ""), "")
    dtype = getattr(torch, name, None) if name else None
    if not isinstance(dtype, torch.dtype):
        raise NotRebuilt(f"tensor type {recorded!r} is not rebuilt")
    return dtype


def _tensors(args: Sequence[Arg]) -> list[TensorArg]:
    """Every tensor of a call in argument order, tensor lists flattened."""
    out: list[TensorArg] = []
    for arg in args:
        out.extend([arg] if isinstance(arg, TensorArg) else arg.tensors if isinstance(arg, TensorListArg) else [])
    return out


def _check_size(args: tuple[Arg, ...]) -> None:
    specs = _tensors(args)
    default = next((s.dtype for s in specs if s.dtype != UNRECORDED_DTYPE), "float")
    total = 0
    for spec in specs:
        itemsize = torch_dtype(spec.dtype if spec.dtype != UNRECORDED_DTYPE else default).itemsize
        total += storage_elements(spec.shape, spec.strides or contiguous_strides(spec.shape)) * itemsize
    if total > MAX_REPLAY_BYTES:
        raise NotRebuilt(f"its tensors need {total / 2**30:.1f} GiB, above the replay limit of "
                         f"{MAX_REPLAY_BYTES / 2**30:.0f} GiB")


def _list_dtype_note(rebuilt: Rebuilt) -> str | None:
    """A note when a tensor list's dtypes had to be assumed."""
    if not any(isinstance(a, TensorListArg) and a.tensors for a in rebuilt.args):
        return None
    recorded = next((s.dtype for s in _tensors(rebuilt.args) if s.dtype != UNRECORDED_DTYPE), None)
    return f"tensor list dtypes not recorded: {TYPE_NAMES.get(recorded or 'float', recorded)} assumed"


def notes(rebuilt: Rebuilt) -> tuple[str, ...]:
    """What the rebuilt call assumes that the trace did not say."""
    note = _list_dtype_note(rebuilt)
    return (*rebuilt.notes, *([note] if note else []))


def make_tensors(rebuilt: Rebuilt, *, bf16: bool = False, seed: int = 0) -> list[torch.Tensor]:
    """The call's tensors in argument order (lists flattened), on its device; with `bf16`, its fp32/fp16/fp64
    tensors in bfloat16 instead. Raises NotRebuilt for a bf16 rebuild of a call without such tensors."""
    specs = _tensors(rebuilt.args)
    fallback = next((s.dtype for s in specs if s.dtype != UNRECORDED_DTYPE), "float")
    dtypes = [torch_dtype(s.dtype if s.dtype != UNRECORDED_DTYPE else fallback) for s in specs]
    if bf16:
        if not any(d in BF16_FROM for d in dtypes):
            raise NotRebuilt("no fp32/fp16/fp64 tensor to cast")
        dtypes = [torch.bfloat16 if d in BF16_FROM else d for d in dtypes]
    floating = [size for s, d in zip(specs, dtypes, strict=True) if d.is_floating_point or d.is_complex
                for size in s.shape if size > 0]
    sizes = floating or [size for s in specs for size in s.shape if size > 0]
    bound = min(sizes) if sizes else 1
    generator = torch.Generator().manual_seed(seed)
    return [_tensor(s, d, rebuilt.device, bound, generator) for s, d in zip(specs, dtypes, strict=True)]


def _tensor(spec: TensorArg, dtype: torch.dtype, device: str, bound: int, generator: torch.Generator) -> torch.Tensor:
    strides = spec.strides or contiguous_strides(spec.shape)
    count = storage_elements(spec.shape, strides)
    if dtype.is_complex:
        base = torch.randn(count, dtype=dtype, generator=generator)
    elif dtype.is_floating_point:
        base = torch.randn(count, generator=generator).to(dtype)  # fp8 has no randn of its own
    elif dtype == torch.bool:
        base = torch.randint(0, 2, (count,), generator=generator).bool()
    else:
        base = torch.randint(0, bound, (count,), generator=generator, dtype=dtype)
    return base.to(device).as_strided(spec.shape, strides)


def _template(rebuilt: Rebuilt) -> tuple[list[Any], dict[str, Any]]:
    """The call's positional and keyword arguments with a `Slot` where each tensor goes."""
    positional: list[Any] = []
    keyword: dict[str, Any] = {}
    index = 0
    for arg, name, value in zip(rebuilt.args, rebuilt.keywords, rebuilt.values, strict=True):
        if isinstance(arg, TensorArg):
            value, index = Slot(index), index + 1
        elif isinstance(arg, TensorListArg):
            value, index = [Slot(i) for i in range(index, index + len(arg.tensors))], index + len(arg.tensors)
        if name is None:
            positional.append(value)
        else:
            keyword[name] = value
    return positional, keyword


def _fill(value: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """`value` with each `Slot` replaced by its tensor."""
    if isinstance(value, Slot):
        return tensors[value.index]
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    return value


def eager_call(rebuilt: Rebuilt, tensors: Sequence[torch.Tensor]) -> Callable[[], object]:
    """A zero-argument callable making the call on `tensors`, its arguments bound once."""
    positional, keyword = _template(rebuilt)
    args = [_fill(v, tensors) for v in positional]
    kwargs = {k: _fill(v, tensors) for k, v in keyword.items()}
    op = rebuilt.op
    return lambda: op(*args, **kwargs)


def compiled_call(rebuilt: Rebuilt, tensors: Sequence[torch.Tensor], tag: str) -> Callable[[], object]:
    """A zero-argument callable making the call through `torch.compile(fullgraph=True)`, the tensors its inputs
    (`tag` names its own code object: see the module docstring). Compiles on its first call."""
    positional, keyword = _template(rebuilt)
    op = rebuilt.op

    def call(*inputs: torch.Tensor) -> object:
        return op(*[_fill(v, inputs) for v in positional], **{k: _fill(v, inputs) for k, v in keyword.items()})

    code = call.__code__.replace(co_name=f"replay_{tag}")
    own = types.FunctionType(code, call.__globals__, code.co_name, call.__defaults__, call.__closure__)
    compiled = torch.compile(own, fullgraph=True, dynamic=False)
    inputs = tuple(tensors)
    return lambda: compiled(*inputs)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"

