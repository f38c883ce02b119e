"""Debug annotations (`DebugAnnotation`) of Perfetto track events as the workbench's `args`, and the columns our
own exports carry in them.

An event's annotations become one JSON object, each under its name: numbers, booleans and strings as they are,
`legacy_json_value` decoded, dictionaries and arrays as objects and lists. Our exports (`workbench.export`) put the
events' `flops`, `bytes`, `shapes`, `dtypes` and correlation id in one dictionary annotation named `workbench`,
which is returned apart so they go back to their columns.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.trace.perfetto.fields import LEN, VARINT, Annotation
from workbench.trace.perfetto.wire import as_double, fields, signed

WORKBENCH_ANNOTATION = "workbench"
"""Name of the dictionary annotation holding the workbench's columns in its exports."""

MAX_DEPTH = 64
"""Nesting of dictionaries and arrays decoded; deeper values are kept as a note (a malformed or hostile trace)."""


def annotations(notes: list[bytes], names: dict[int, str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(args, the `workbench` columns or None) of an event's encoded annotations; `names`: the sequence's interned
    annotation names."""
    args: dict[str, Any] = {}
    columns = None
    for note in notes:
        name, value = _annotation(note, names, 0)
        if name == WORKBENCH_ANNOTATION and isinstance(value, dict):
            columns = value
        else:
            args[name] = value
    return args, columns


def _annotation(data: bytes, names: dict[int, str], depth: int) -> tuple[str, Any]:
    name, value = "", None
    entries: list[tuple[str, Any]] | None = None
    items: list[Any] | None = None
    for number, wire, raw in fields(data):
        if number == Annotation.NAME and wire == LEN:
            name = raw.decode("utf-8", errors="replace")  # type: ignore[union-attr]
        elif number == Annotation.NAME_IID and wire == VARINT:
            name = names.get(int(raw), f"annotation {raw}")  # type: ignore[arg-type]
        elif number == Annotation.BOOL and wire == VARINT:
            value = bool(raw)
        elif number in (Annotation.UINT, Annotation.POINTER) and wire == VARINT:
            value = int(raw)  # type: ignore[arg-type]
        elif number == Annotation.INT and wire == VARINT:
            value = signed(int(raw))  # type: ignore[arg-type]
        elif number == Annotation.DOUBLE and wire == 1:
            value = as_double(int(raw))  # type: ignore[arg-type]
        elif number == Annotation.STRING and wire == LEN:
            value = raw.decode("utf-8", errors="replace")  # type: ignore[union-attr]
        elif number == Annotation.LEGACY_JSON and wire == LEN:
            text = raw.decode("utf-8", errors="replace")  # type: ignore[union-attr]
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                value = text
        elif number in (Annotation.DICT_ENTRIES, Annotation.ARRAY_VALUES) and wire == LEN:
            if depth >= MAX_DEPTH:
                value = f"(nested past {MAX_DEPTH} levels)"
                continue
            key, item = _annotation(raw, names, depth + 1)  # type: ignore[arg-type]
            if number == Annotation.DICT_ENTRIES:
                entries = (entries or []) + [(key, item)]
            else:
                items = (items or []) + [item]
    if entries is not None:
        value = dict(entries)
    elif items is not None:
        value = items
    return name, value
