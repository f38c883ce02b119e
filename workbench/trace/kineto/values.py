"""Field values of Chrome-trace records that the typed decoders cannot take as they are.

The Trace Event Format allows, and real traces hold: pids, tids and ids that are names
(`"pid": "Spans"`, `"tid": "MainThread"`, `"id": "0xa"`), numbers written as strings (`"ts": "100"`),
integers past int64 (`"pid": 18446744073709551615`), JSON numbers past float64 (`1e400`, which
msgspec refuses) and deep nesting. These helpers turn each into something a column can hold
without losing it: a name keeps a stable int64 of its own (and its text for labels), a string
number is parsed, an out-of-range number is flagged for the reader to count.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

import msgspec
import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MISSING = INT64_MIN
"""Integer columns use this for "absent" (JSON has no integer NaN); no decoded value takes it."""

Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN + 1, le=INT64_MAX)]
"""An integer args field that becomes an int64 column; one past int64 fails validation and stays in args."""

TS_LIMIT_US = 2.0**62 / 1000
"""Timestamps (µs) of this magnitude or more are out of range: two of them (or one and a duration) no
longer fit int64 nanoseconds apart. Epoch microseconds reach it in the year 2116."""

JSON_DEPTH_LIMIT = 20_000
"""Nesting (of `args`, say) the decoders accept: msgspec recurses per level and stops at Python's
recursion limit (1,000 by default), which real traces with deep stacks in args come close to."""

METADATA_DEPTH = 64
"""Nesting kept as it is in metadata; deeper values are kept as their JSON text, since Python's `json` and
the bundle writer recurse once per level and stop near 1,000."""

_NAMED_BASE = -(2**62)
_DECIMAL_INT = re.compile(r"[+-]?[0-9]+")


def named_id(text: str) -> int:
    """A stable int64 standing for an id that is not an int64 number (`"MainThread"`, `"0xa"`, 2**64).

    Derived from the text alone, so every chunk and process gives the same value; it lies in
    [-2**63 + 1, -2**62], far from the pids, tids and counters real traces write.
    """
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return _NAMED_BASE - int.from_bytes(digest, "little") % 2**62


def id_text(value: Any) -> str:
    """The text of an id as written: `0xa` stays `0xa`, 10 becomes `10`."""
    return value if isinstance(value, str) else str(value)


def coerce_ids(values: tuple[Any, ...]) -> tuple[np.ndarray, dict[int, str]]:
    """int64 column of pid/tid values and the text of those that are names.

    Integers in int64 stay as they are, decimal strings (`"25738"`, as Kineto 2021 writes tids) become
    their number, anything else (`"Spans"`, `"stream 7"`, an integer past int64) its `named_id`.
    """
    n = len(values)
    try:
        column = np.fromiter(values, dtype=np.int64, count=n)
        if not (column == MISSING).any():
            return column, {}
    except (TypeError, ValueError, OverflowError):
        pass
    names: dict[int, str] = {}
    is_int = np.fromiter(map(isinstance, values, itertools.repeat(int)), dtype=bool, count=n)
    column = np.empty(n, dtype=np.int64)
    try:
        column[is_int] = np.fromiter(itertools.compress(values, is_int), dtype=np.int64, count=int(is_int.sum()))
        loose = np.flatnonzero(~is_int | (column == MISSING))
    except OverflowError:
        loose = np.arange(n)
    for i in loose.tolist():
        column[i] = _coerce_id(values[i], names)
    return column, names


def _coerce_id(value: Any, names: dict[int, str]) -> int:
    text = id_text(value)
    if _DECIMAL_INT.fullmatch(text):
        number = int(text)
        if INT64_MIN < number <= INT64_MAX:
            return number
    code = named_id(text)
    names[code] = text
    return code


def parse_number(value: Any) -> float | None:
    """A JSON number, or a string holding one (`"12.5"`, `" 100 "`), as a float: inf past float64's
    range, NaN for `"NaN"`; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, Decimal)):
        try:
            return float(value)
        except OverflowError:  # an int past float64
            return math.copysign(math.inf, value)
    if isinstance(value, str):
        try:
            return float(Decimal(value.strip()))
        except (InvalidOperation, ValueError):
            return None
    return None


def _float_or_decimal(text: str) -> float | Decimal:
    """msgspec float hook: a JSON number past float64 (`1e400`) as a Decimal rather than an error."""
    value = float(text)
    return value if math.isfinite(value) else Decimal(text)


_ANY = msgspec.json.Decoder()
_ANY_WIDE = msgspec.json.Decoder(float_hook=_float_or_decimal)
_ENCODER = msgspec.json.Encoder(decimal_format="number")


def _int_or_decimal(text: str) -> int | Decimal:
    """json int hook: an integer past 64 bits as a Decimal, as msgspec's float hook gives numbers past float64."""
    value = int(text) if len(text) < 22 else None  # int() refuses 4,300 digits or more
    return value if value is not None and -(2**63) <= value < 2**64 else Decimal(text)


def decode_json(text: bytes | str | memoryview) -> Any:
    """Decode JSON of any shape; numbers past float64 and integers past 64 bits come back as Decimals
    (msgspec refuses them: the first are decoded again with its float hook, the second by Python's json)."""
    try:
        return _ANY.decode(text)
    except msgspec.ValidationError:  # "Number out of range"
        try:
            return _ANY_WIDE.decode(text)
        except msgspec.ValidationError as exc:  # "Integer value out of range"
            try:  # as strict as msgspec, which stopped at the integer: UTF-8 only (no surrogates), no NaN
                source = text if isinstance(text, str) else bytes(text).decode("utf-8")
                return json.loads(source, parse_float=_float_or_decimal, parse_int=_int_or_decimal,
                                  parse_constant=_no_constant)
            except UnicodeDecodeError as later:  # past the integer (its position is the chunk's, not the file's)
                raise msgspec.DecodeError(f"invalid UTF-8 ({later.reason})") from exc
            except ValueError as later:  # json.JSONDecodeError or a constant: likewise
                raise msgspec.DecodeError(getattr(later, "msg", str(later))) from exc


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def encode_json(value: Any) -> bytes:
    """Encode what `decode_json` gave, Decimals back as the numbers they were."""
    return _ENCODER.encode(value)


def plain(value: Any, levels: int = METADATA_DEPTH) -> Any:
    """`value` with the Decimals `decode_json` gives for numbers past float64 as their text, and what is
    nested more than `levels` deep as its JSON text, so that it can go where any JSON encoder or decoder
    may write or read it (metadata, in run.json)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (dict, list)) and levels <= 0:
        with deep_json():
            return encode_json(value).decode()
    if isinstance(value, dict):
        return {k: plain(v, levels - 1) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v, levels - 1) for v in value]
    return value


def json_object(raw: bytes) -> dict[str, Any]:
    """A record's args as a dict (`{}` when absent, `{"args": value}` when not an object)."""
    value = decode_json(raw) if len(raw) else {}
    return value if isinstance(value, dict) else {"args": value}


def merge_json(text: str | None, extra: dict[str, Any]) -> str:
    """Args JSON `text` with the keys of `extra` added (a non-object becomes `{"args": ...}`)."""
    base = decode_json(text) if text else {}
    if not isinstance(base, dict):
        base = {"args": base}
    return encode_json({**base, **extra}).decode()


@contextmanager
def deep_json() -> Iterator[None]:
    """Let the decoders descend `JSON_DEPTH_LIMIT` levels (Python's recursion limit, restored after;
    forked decoding workers inherit it)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, JSON_DEPTH_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


EXACT_TS_LIMIT_US = 2.0**43
"""Timestamps (µs) at or past this lose nanoseconds as float64 (its spacing passes 1/1024 µs there):
traces that write absolute epoch µs with three decimals (1.7e15 µs, spacing 0.25 µs) have their
`ts` decoded once more as decimals, relative to a whole-µs base, to keep every nanosecond."""


class _ExactTs(msgspec.Struct, gc=False):
    """A record's timestamp as written (the other fields are skipped)."""

    ts: Decimal = Decimal(0)


_exact_ts_decoder = msgspec.json.Decoder(list[_ExactTs])


def exact_timestamps(text: bytes, rows: np.ndarray, ts: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, int] | None:
    """`ts` (float µs of records `rows` of the JSON array `text`) with the `valid` ones re-read as
    written, relative to a whole-µs base, and that base; None when the float ones can stand (they
    keep every ns, or a record holds no number there)."""
    if not valid.any() or np.abs(ts[valid]).max() < EXACT_TS_LIMIT_US or (ts[valid] == np.trunc(ts[valid])).all():
        return None
    try:
        records = _exact_ts_decoder.decode(text)
        exact = [records[i].ts for i in rows[valid].tolist()]
    except (msgspec.DecodeError, IndexError):  # ValidationError included: a ts that is no number
        return None
    base = int(min(exact))
    out = ts.copy()
    out[valid] = np.fromiter((float(t - base) for t in exact), dtype=np.float64, count=len(exact))
    return out, base
