"""The size bound of an agent's answer: every reply is at most `MAX_CHARS` characters of compact JSON, and says
where the next page starts when it was cut.

A reply that fits whole says `"page": {"unit": "whole", "next": null}`. A reply with a main list (runs,
findings, rows, spans) keeps as many of the list's items, from `offset`, as fit; `page` says `{"unit": "items",
"offset", "items", "total", "next"}` (`next` null on the last page). A reply whose other fields alone do not fit
(or whose one item does not) is sent as its JSON text cut into pieces: `{"page": {"unit": "chars", "offset",
"total", "next"}, "json_part": "..."}`, the pieces joined in order being the
whole reply's JSON. Either way the figures are the ones computed, never rounded or dropped to fit.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.errors import WorkbenchError

MAX_CHARS = 16_000
"""Most characters of one answer (compact JSON), about 4k tokens: an agent's context stays its own."""


def compact(value: Any) -> str:
    """`value` as compact JSON (no spaces, non-ASCII kept as is, NaN refused)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def page(reply: dict[str, Any], key: str | None = None, offset: int = 0, max_chars: int = MAX_CHARS) -> str:
    """`reply` as JSON of at most `max_chars` characters: the items of `reply[key]` from `offset` that fit, or
    (no `key`, or no item fits) the piece of the reply's JSON text from character `offset` (module docstring)."""
    if offset < 0:
        raise WorkbenchError(f"offset: expected 0 or more, got {offset}")
    if key is not None:
        items = reply[key]
        if offset > len(items):
            raise WorkbenchError(f"offset: the answer has {len(items)} items, got offset {offset}")
        text = _items_page(reply, key, items, offset, max_chars)
        if text is not None:
            return text
    elif offset == 0:
        whole = compact({**reply, "page": {"unit": "whole", "next": None}})
        if len(whole) <= max_chars:
            return whole
    return _text_page(compact(reply), offset, max_chars)


def _items_page(reply: dict[str, Any], key: str, items: list[Any], offset: int, max_chars: int) -> str | None:
    """The reply with the most items of `key` from `offset` that fit in `max_chars`, or None when none does
    (and some are left)."""
    sizes = [len(compact(item)) + 1 for item in items[offset:]]  # each item and its comma
    base = len(_with_items(reply, key, items, offset, 0, len(items)))
    count, used = 0, base
    while count < len(sizes) and used + sizes[count] <= max_chars:
        used += sizes[count]
        count += 1
    while True:
        nxt = offset + count if offset + count < len(items) else None
        text = _with_items(reply, key, items, offset, count, nxt)
        if len(text) <= max_chars:
            return text if count or not sizes else None
        if count == 0:
            return None
        count -= 1


def _with_items(reply: dict[str, Any], key: str, items: list[Any], offset: int, count: int,
                nxt: int | None) -> str:
    return compact({**reply, key: items[offset:offset + count],
                    "page": {"unit": "items", "offset": offset, "items": count, "total": len(items), "next": nxt}})


def _text_page(text: str, offset: int, max_chars: int) -> str:
    """The piece of `text` from `offset` whose reply fits in `max_chars` characters."""
    if offset > len(text):
        raise WorkbenchError(f"offset: the answer has {len(text)} characters, got offset {offset}")
    frame = len(_piece(text, offset, "", len(text)))
    size = max(1, max_chars - frame)
    while True:
        part = text[offset:offset + size]
        end = offset + len(part)
        reply = _piece(text, offset, part, end if end < len(text) else None)
        if len(reply) <= max_chars or size == 1:
            return reply
        size = max(1, size - (len(reply) - max_chars))  # escaped quotes and backslashes take two characters


def _piece(text: str, offset: int, part: str, nxt: int | None) -> str:
    return compact({"page": {"unit": "chars", "offset": offset, "total": len(text), "next": nxt}, "json_part": part})
