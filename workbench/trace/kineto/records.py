"""What a Chrome-trace record decodes into: one msgspec struct class per phase (`ph`).

Two tagged unions decode a chunk of records: the fast one, whose `cat` is one of the categories Kineto
is known to write (an enum member, not a string per record), and the general one. Records that neither
takes (fields, types or phases the structs do not declare) take the slow path, `records_loose`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any, Union

import msgspec

from workbench.trace.kineto.categories import DEVICE_CATEGORIES, KIND_BY_CATEGORY
from workbench.trace.kineto.jsonstream import ChunkDecodeError
from workbench.trace.kineto.values import decode_json, encode_json, parse_number

EMPTY = msgspec.Raw(b"")


class EventSchemaError(Exception):
    """A chunk that is valid JSON but whose events are not trace events."""


class Phase(enum.Enum):
    """The `ph` values of the Trace Event Format; decoding to members avoids a string per event."""

    UNKNOWN = ""  # a `ph` the format does not define (kept in args)
    ABSENT = "\x00"  # no `ph` at all
    SPAN = "X"
    BEGIN = "B"
    END = "E"
    INSTANT = "i"
    INSTANT_LEGACY = "I"
    COUNTER = "C"
    METADATA = "M"
    FLOW_START = "s"
    FLOW_STEP = "t"
    FLOW_END = "f"
    ASYNC_BEGIN = "b"
    ASYNC_END = "e"
    ASYNC_INSTANT = "n"
    LEGACY_ASYNC_START = "S"
    LEGACY_ASYNC_STEP_INTO = "T"
    LEGACY_ASYNC_STEP_PAST = "p"
    LEGACY_ASYNC_FINISH = "F"
    SAMPLE = "P"
    OBJECT_NEW = "N"
    OBJECT_SNAPSHOT = "O"
    OBJECT_DELETE = "D"
    MARK = "R"
    CLOCK_SYNC = "c"
    CONTEXT_ENTER = "("
    CONTEXT_EXIT = ")"


PHASES = list(Phase)
PHASE_VALUES = [p.value for p in PHASES]
ASYNC_PHASES = ("b", "e", "n", "S", "T", "p", "F")
"""Phases paired or placed by an async id (`id`, `id2.global`, `id2.local`) rather than by thread."""
LEGACY_ASYNC_PHASES = ("S", "T", "p", "F")


class _Record(msgspec.Struct, tag_field="ph", forbid_unknown_fields=True, gc=False):
    """A Trace Event Format record with the fields Kineto writes (`s`, an instant's scope, and `bp`,
    a flow's binding point, are read and dropped). Its phase (`ph`) is its class, one per value.

    Other fields of the format (tts, cname, sf, ...) are rare: the slow path keeps them in args.
    """

    name: str = ""
    cat: str | None = None
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    id: int | str | None = None
    id2: dict[str, int | str] | None = None
    bp: str | None = None
    s: str | None = None
    args: msgspec.Raw = EMPTY


class _Flow(msgspec.Struct, tag_field="ph", gc=False):
    """A flow record (`s`, `t`, `f`): nothing of it is kept, so nothing of it is decoded."""


Category = enum.Enum("Category", {c: c for c in sorted({*KIND_BY_CATEGORY, *DEVICE_CATEGORIES})})
"""The categories Kineto is known to write; decoding to members avoids a string per record."""

CATEGORY_VALUES = [c.value for c in Category]
CATEGORY_CODE = {id(c): i for i, c in enumerate(Category)} | {id(None): -1}


class _KnownCategoryRecord(_Record):
    """A record whose category is a known one: the fast path (others take `_Record`)."""

    cat: Category | None = None


_UNTAGGED = (Phase.UNKNOWN, Phase.ABSENT)
"""Phases no record names: records the slow path gives them (`records_loose`)."""
FLOWS = (Phase.FLOW_START, Phase.FLOW_STEP, Phase.FLOW_END)


def _record_classes(base: type) -> dict[Phase, type]:
    """One struct class per phase (the tagged union's members), each knowing its phase's code."""
    return {p: msgspec.defstruct(f"{base.__name__}_{p.name}", [], bases=(_Flow if p in FLOWS else base,),
                                 tag=p.value, namespace={"phase_code": i})
            for i, p in enumerate(PHASES) if p not in _UNTAGGED}


_CLASSES = _record_classes(_Record)
_CLASSES.update({p: msgspec.defstruct(f"_Record_{p.name}", [], bases=(_Record,),
                                      namespace={"phase_code": PHASES.index(p)}) for p in _UNTAGGED})
_FAST_CLASSES = _record_classes(_KnownCategoryRecord)
ROW_FIELDS = ("name", "cat", "pid", "tid", "ts", "dur", "args")
_KNOWN_KEYS = frozenset((*ROW_FIELDS, "ph", "id", "id2", "bp", "s"))


def phase_codes(phases: Sequence[str]) -> list[int]:
    """The codes (`phase_code`, index into `PHASE_VALUES`) of these `ph` values."""
    return [PHASE_VALUES.index(p) for p in phases]


FLOW_CODES = phase_codes([p.value for p in FLOWS])
ASYNC_CODES = phase_codes(ASYNC_PHASES)
LEGACY_CODES = phase_codes(LEGACY_ASYNC_PHASES)


record_decoders = [msgspec.json.Decoder(list[Union[tuple(classes[p] for p in PHASES if p not in _UNTAGGED)]])  # noqa: UP007
                   for classes in (_FAST_CLASSES, _CLASSES)]
"""The fast decoder (known categories), then the general one."""


_NUMBERS = ("ts", "dur")


def records_loose(text: bytes) -> tuple[list[Any], int]:
    """Slow path for records with fields, types or phases the typed structs do not declare.

    Unknown top-level fields, values of unexpected types and unknown phases are kept in args; a `ts`
    or `dur` written as a string is parsed (kept in args too when it holds no number). Empty records
    (`{}`, which JAX writes to close its trace) are not rows: they are counted and returned.
    """
    try:
        items = decode_json(text)
    except msgspec.DecodeError as exc:  # the typed decoders stopped at a field before a wrong cut
        raise ChunkDecodeError(str(exc)) from exc
    records = []
    empty = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise EventSchemaError(f"traceEvents[{i}] is {type(item).__name__}, not an object")
        if not item:
            empty += 1
            continue
        args = item.get("args")
        kept = {k: v for k, v in item.items() if k not in _KNOWN_KEYS}
        if args is not None and not isinstance(args, dict):
            kept["args"], args = args, None
        phase = item.get("ph", Phase.ABSENT.value)
        if phase not in PHASE_VALUES or ("ph" in item and Phase(phase) in _UNTAGGED):
            kept["ph"], phase = phase, Phase.UNKNOWN.value
        cls = _CLASSES[Phase(phase)]
        if issubclass(cls, _Flow):
            records.append(cls())
            continue
        fields: dict[str, Any] = {}
        for key in _NUMBERS:
            if item.get(key) is not None:
                number = parse_number(item[key])
                fields[key] = float("nan") if number is None else number
                if number is None or not math.isfinite(number):  # the reader counts it; args keep it
                    kept[key] = item[key]
        for key, types in (("name", str), ("cat", str), ("pid", (int, str)), ("tid", (int, str)),
                           ("id", (int, str)), ("id2", dict)):
            value = item.get(key)
            if value is None:
                continue
            if isinstance(value, types) and not isinstance(value, bool):
                fields[key] = value
            elif key in ("name", "cat"):
                fields[key] = str(value)
            else:
                kept[key] = value
        if "id2" in fields and not all(isinstance(v, (int, str)) for v in fields["id2"].values()):
            kept["id2"] = fields.pop("id2")
        merged = {**(args or {}), **kept}
        raw = encode_json(merged) if merged or args is not None else b""
        records.append(cls(**fields, args=msgspec.Raw(raw)))
    return records, empty
