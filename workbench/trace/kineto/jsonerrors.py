"""What is wrong with a JSON document that is not a readable Chrome trace, and where; and the checks
of the document's top level around its events array.

msgspec stops at the first syntax error and says what it is in a message ending in `(byte N)`;
`syntax_problem` turns that into the offending byte's index and a cause a person can act on (the
comma of a trailing comma, `NaN` or `Infinity` by name, where invalid UTF-8 is, which msgspec does
not say), or says that the text ended before the value did. A document that is valid JSON but holds
no trace events is named for what it holds instead (the memory-timeline export of torch is an array
of arrays, say).

Problems are `JsonProblem`s with offsets into the text checked; the stream that read the text turns
them into one-line `TraceFormatError`s with file offsets.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

EXPECTED = "expected an object with traceEvents, or an array of event objects"
"""What a Chrome trace is, for messages about documents that are not one."""

TRAILING_CHARACTERS = "trailing characters"
"""msgspec's cause for text after a complete value: where a value was expected to end, this says where."""

_MALFORMED = re.compile(r"JSON is malformed: (.*) \(byte (\d+)\)$")
_TRAILING = f"JSON is malformed: {TRAILING_CHARACTERS} (byte "
_TRUNCATED = "Input data was truncated"
_BAD_UTF8 = "Invalid UTF-8 encoded string"
_NOT_NUMBERS = (b"-Infinity", b"Infinity", b"NaN")  # -Infinity first: msgspec points at its I
_OPEN_STRING = re.compile(rb'(?:[^"]++|"(?:[^"\\]++|\\.)*+")*+', re.DOTALL)
"""Everything up to a string that does not close (possessive: linear, no backtracking)."""
NOT_SPACE = re.compile(rb"[^ \t\r\n]")
"""The next byte that is not JSON whitespace."""
_NOT_SPACE_OR_COMMA = re.compile(rb"[^ \t\r\n,]")
_KINDS = {ord("["): "array", ord("{"): "object", ord('"'): "string", ord("t"): "boolean",
          ord("f"): "boolean", ord("n"): "null", **{c: "number" for c in b"-0123456789"}}
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])


class JsonProblem(Exception):
    """What is wrong with a JSON text: `cause`, found at index `offset` of the text (None: nowhere in
    particular). `ended`: the text ended before the value did (it may be cut short rather than bad).
    `syntax`: the text is not valid JSON (else it is, but not a trace)."""

    def __init__(self, cause: str, offset: int | None = None, ended: bool = False, syntax: bool = True) -> None:
        super().__init__(cause)
        self.cause, self.offset, self.ended, self.syntax = cause, offset, ended, syntax


def syntax_problem(message: str, text: bytes | bytearray | memoryview) -> JsonProblem:
    """The problem that msgspec's DecodeError `message` reports for `text`.

    An error found past the last byte (a number cut short: `1.`) counts as the text ending.
    """
    if message == _TRUNCATED:
        return JsonProblem("truncated", ended=True)
    if message == _BAD_UTF8:
        try:
            str(text, "utf-8")
        except UnicodeDecodeError as exc:
            return JsonProblem(f"invalid UTF-8 (byte 0x{text[exc.start]:02x}: {exc.reason})", exc.start)
        return JsonProblem("invalid UTF-8")
    match = _MALFORMED.match(message)
    if match is None:
        return JsonProblem(message)
    cause, at = match.group(1), int(match.group(2))
    if cause == TRAILING_CHARACTERS:
        return JsonProblem(cause, trailing_at(message))
    if at >= len(text):
        return JsonProblem("truncated", ended=True)
    if cause.startswith("trailing comma"):  # msgspec points at the bracket after the comma
        return JsonProblem(cause, bytes(text[:at]).rindex(b","))
    if cause == "invalid character":
        return _invalid_character(text, at)
    return JsonProblem(cause, at)


def trailing_at(message: str) -> int | None:
    """Where msgspec's DecodeError `message` says text follows a whole value: the index of that text's
    first byte (msgspec counts it as read). None for any other error."""
    return int(message[len(_TRAILING): -1]) - 1 if message.startswith(_TRAILING) else None


def _invalid_character(text: bytes | bytearray | memoryview, at: int) -> JsonProblem:
    for word in _NOT_NUMBERS:
        start = at - 1 if word[:1] == b"-" else at
        if start >= 0 and bytes(text[start: start + len(word)]) == word:
            return JsonProblem(f"{word.decode()} is not a JSON number (JSON has no NaN or infinities)", start)
    byte = text[at]
    if byte < 0x20:
        return JsonProblem(f"control character 0x{byte:02x} (in a string it must be written as an escape)", at)
    if byte >= 0x80:
        return JsonProblem(f"unexpected byte 0x{byte:02x}", at)
    return JsonProblem(f"unexpected character {chr(byte)!r}", at)


def truncated_value(text: bytes | bytearray | memoryview, what: str) -> JsonProblem:
    """The problem of a `text` that ends inside a value (the `what`) that starts at its first byte."""
    end = _OPEN_STRING.match(text).end()  # type: ignore[union-attr] - a star pattern always matches
    if end < len(text):
        return JsonProblem("unterminated string (the file ends inside the string that starts here: truncated?)", end)
    return JsonProblem(f"truncated (the file ends inside the {what} that starts here, or a bracket in it never closes)",
                       0)


def kind_of(first_byte: int) -> str | None:
    """The kind of JSON value that starts with this byte (None: no JSON value starts so)."""
    return _KINDS.get(first_byte)


def article(kind: str) -> str:
    """`kind` with its indefinite article: 'an array', 'a number'."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def first_item_problem(first_byte: int, array_form: bool) -> JsonProblem | None:
    """The problem of an events array whose first item starts with `first_byte`, if that is no object
    (an event): not a trace at all. None for an object, the array's end or a syntax error (left to
    the decoding)."""
    kind = kind_of(first_byte)
    if kind is None or kind == "object":
        return None
    if array_form:
        return JsonProblem(f"a JSON array of {kind}s, not a Chrome trace ({EXPECTED})", syntax=False)
    return JsonProblem(f"traceEvents[0] is {article(kind)}, not an object (traceEvents must hold event objects)",
                       syntax=False)


def header_keys(prefix: bytes) -> dict[str, Any]:
    """The top-level keys before the events array; `prefix` runs from the document's `{` to the
    traceEvents key, which is at `len(prefix)`."""
    text = prefix + b'"traceEvents": 0}'  # the document as written up to the key, closed after it
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        problem = syntax_problem(str(exc), text)
        if problem.ended or problem.offset is None or problem.offset > len(prefix):
            raise JsonProblem("\"traceEvents\" is not a key of the top-level object (a value before it does "
                              "not close)", len(prefix)) from exc
        raise problem from exc
    del value["traceEvents"]
    return value


def trailer_keys(text: bytes | bytearray, array_form: bool) -> dict[str, Any]:
    """The top-level keys after the events array; `text` is all of the file after its `]`."""
    if array_form:  # nothing may follow but the trailing commas Chrome's traces may have
        extra = _NOT_SPACE_OR_COMMA.search(text)
        if extra:
            raise JsonProblem("data after the events array", extra.start())
        return {}
    rest = NOT_SPACE.search(text)
    if rest is None:
        raise JsonProblem("truncated (the file ends after the traceEvents array, before the document closes)",
                          len(text))
    at = rest.start()
    if text[at] == ord("}"):
        extra = NOT_SPACE.search(text, at + 1)
        if extra:
            raise JsonProblem("data after the end of the JSON document", extra.start())
        return {}
    if text[at] != ord(","):
        raise JsonProblem("expected ',' or '}' after the traceEvents array", at)
    keys = b" " * at + b"{" + bytes(text[at + 1:])  # same offsets as `text`
    try:
        return msgspec.json.decode(keys)
    except msgspec.DecodeError as exc:
        problem = syntax_problem(str(exc), keys)
        if problem.ended:
            raise JsonProblem("truncated (the file ends before the document closes, after the traceEvents array)",
                              len(text)) from exc
        raise problem from exc


def not_a_trace(document: bytes | bytearray) -> JsonProblem:
    """The problem of a whole JSON object `document` in which no traceEvents array was found."""
    try:
        value = _TOP_LEVEL.decode(document)
    except msgspec.DecodeError as exc:
        problem = syntax_problem(str(exc), document)
        return truncated_value(document, "JSON object") if problem.ended else problem
    if "traceEvents" in value:
        kind = kind_of(bytes(value["traceEvents"])[0]) or "value"
        return JsonProblem(f"'traceEvents' is {article(kind)}, not an array: not a Chrome trace", syntax=False)
    keys = ", ".join(list(value)[:6]) + (", ..." if len(value) > 6 else "") if value else "none"
    return JsonProblem(f"a JSON object with no 'traceEvents' array (keys: {keys}), not a Chrome trace ({EXPECTED})",
                       syntax=False)
