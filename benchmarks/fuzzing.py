"""Fuzz cases for `workbench import`: small valid seeds of every format it reads, mutated by a seeded RNG.

Shared by `tests/test_fuzz.py` (a bounded number of cases) and `benchmarks/fuzz.py` (a longer run).
Formats (`FORMATS`): Kineto/Chrome JSON in object form, in array form and gzipped, XSpace `.xplane.pb`,
and Nsight Systems SQLite. (Nsight Compute CSV is read only beside a capture, never imported, so it has
no cases.) A case is one seed with one to three mutations, all chosen by `make_case(number, seeds)`, so
a case is named and re-made by its number alone (given the same seeds).

- JSON, on the document: huge, negative and non-finite numbers, numbers as strings, wrong types, `null`s,
  empty containers, deleted keys, duplicate keys, 1,000+ levels of nested arrays or objects, odd strings;
  then on the text: truncation at a random offset, byte flips, bytes that are not UTF-8;
  gzipped cases can also be cut or flipped after compression.
- XSpace, on the text format (serialized by jax's own `ProfileData.text_proto_to_serialized_xspace`, so
  each case is a well-formed message holding odd values): extreme and negative ids, times and durations,
  non-finite stats, dangling metadata ids, odd plane and line names; then on the bytes: truncation, flips.
- nsys, with SQL on a copy: huge, negative, real, text, BLOB and NULL values in the tables the reader
  uses, deleted rows, dropped tables and columns, text that is not UTF-8; then on the bytes: truncation,
  flips.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz_seeds import NSYS_TABLES, Seeds

FORMATS = ("kineto-object", "kineto-array", "kineto-gz", "xspace", "nsys")
"""Case formats, in the order `make_case` takes them round-robin."""

SUFFIXES = {"kineto-object": ".json", "kineto-array": ".json", "kineto-gz": ".json.gz", "xspace": ".xplane.pb",
            "nsys": ".sqlite"}

DEPTH = (1_000, 1_500, 5_000)
"""Nesting depths of the deep-nesting mutation."""

NUMBERS = ("9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
           "18446744073709551616", "2305843009213693952", "4611686018427387903", "1e300", "-1e300", "1e-320",
           "-1", "-0", "0", "0.5", "1e999", "-1e999", "NaN", "Infinity", "-Infinity", '"NaN"', '"1e300"',
           '"-1"', '"0x10"', '"12abc"', '""', "1" * 5000)
"""JSON number texts (and numbers written as strings) that a reader must survive."""

WRONG_TYPES = ("null", "true", "false", '"text"', "[]", "{}", "[1, 2]", '{"a": 1}', '[null]', '[[]]', "12", "1.5")
"""JSON values of the wrong type for any field."""

STRINGS = ("", " ", "\u0000", "\ud800", "ProfilerStep#99999999999999999999", "step -1", "aten::mm" * 2000,
           "<script>alert(1)</script>", "\u202e\u0301", "a\nb", "cuda:99999999999", "Stream #-1(Compute)",
           "/device:GPU:18446744073709551616", "\\", '"')
"""Odd strings: empty, control characters, a lone surrogate, very long, markup, step names with huge numbers."""

NOT_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82")


@dataclass(frozen=True)
class Case:
    """One fuzz input: its format, the mutations applied (what a report names), the file's name and bytes."""

    number: int
    format: str
    mutations: tuple[str, ...]
    name: str
    data: bytes

    @property
    def label(self) -> str:
        return f"{self.format}#{self.number}: {'; '.join(self.mutations)}"


class NoSeed(LookupError):
    """The case's format has no seed here (no jax, no shared fixtures)."""


def make_case(number: int, seeds: Seeds) -> Case:
    """Case `number`: format by round-robin over `FORMATS`, everything else by an RNG seeded with the number
    (the same number makes the same case wherever the same seeds are); `NoSeed` where `seeds` has none."""
    fmt = FORMATS[number % len(FORMATS)]
    if not seeds.has(fmt):
        raise NoSeed(f"no seed of {fmt} here (it needs {'jax' if fmt == 'xspace' else 'the shared fixtures'})")
    rng = random.Random(number)
    maker = {"xspace": _xspace_case, "nsys": _nsys_case}.get(fmt, _kineto_case)
    mutations, data = maker(rng, fmt, seeds)
    return Case(number, fmt, tuple(mutations), f"fuzz-{number}{SUFFIXES[fmt]}", data)


def seed_cases(seeds: Seeds) -> list[Case]:
    """Every seed as it is, as a case (number -1): each must import cleanly, or the mutations prove little."""
    cases = [Case(-1, "kineto-object", (f"seed {name}",), f"seed{i}.json", text.encode())
             for i, (name, text) in enumerate(seeds.kineto)]
    name, text = seeds.kineto[0]
    cases.append(Case(-1, "kineto-array", (f"seed {name}",), "seed.json", dump(_events(json.loads(text))).encode()))
    cases.append(Case(-1, "kineto-gz", (f"seed {name}",), "seed.json.gz", gzip.compress(text.encode(), mtime=0)))
    if seeds.has("xspace"):
        assert seeds.serialize_xspace is not None
        cases += [Case(-1, "xspace", (f"seed {name}",), f"seed{i}.xplane.pb", seeds.serialize_xspace(text))
                  for i, (name, text) in enumerate(seeds.xspace_text)]
        cases += [Case(-1, "xspace", (f"seed {name}",), f"capture{i}.xplane.pb", data)
                  for i, (name, data) in enumerate(seeds.xspace_bytes)]
    cases += [Case(-1, "nsys", (f"seed {name}",), f"seed{i}.sqlite", data) for i, (name, data) in enumerate(seeds.nsys)]
    return cases


# --- JSON ---------------------------------------------------------------------------------------------


class Raw(str):
    """JSON text written as it is (numbers Python cannot hold, deep nesting, non-standard tokens)."""


class Pairs(list):
    """A JSON object as (key, value) pairs, so that a key can repeat."""


def dump(value: Any) -> str:
    """`value` as JSON text, with `Raw` written as is and `Pairs` as objects with their repeated keys."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, (dict, Pairs)):
        items = value.items() if isinstance(value, dict) else value
        return "{" + ", ".join(f"{json.dumps(str(k))}: {dump(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def _nested(rng: random.Random) -> Raw:
    depth, leaf = rng.choice(DEPTH), rng.choice(("1", "null", '"x"', "[]", "{}"))
    shape = rng.choice(("array", "object", "mixed"))
    if shape == "array":
        return Raw("[" * depth + leaf + "]" * depth)
    if shape == "object":
        return Raw('{"a": ' * depth + leaf + "}" * depth)
    return Raw('[{"a": ' * (depth // 2) + leaf + "}]" * (depth // 2))


def _slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in `value`, outermost first (`Pairs` and `Raw` are leaves)."""
    found: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node)) if type(node) is list else ()
        for key in keys:
            found.append((node, key))
            stack.append(node[key])
    return found


def _events(doc: Any) -> list[Any]:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return events if type(events) is list else []


def _pick_slot(rng: random.Random, doc: Any) -> tuple[Any, Any] | None:
    """A slot inside a random event (most of the time), else anywhere in the document."""
    events = [e for e in _events(doc) if isinstance(e, dict)]
    if events and rng.random() < 0.75:
        event = rng.choice(events)
        slots = [(event, key) for key in event] + _slots(event.get("args") or {})
        if slots and rng.random() < 0.8:
            return rng.choice(slots)
        return event, rng.choice(("ts", "dur", "pid", "tid", "ph", "name", "cat", "id", "args", "s", "bp"))
    slots = _slots(doc)
    return rng.choice(slots) if slots else None


def _mutate_document(rng: random.Random, doc: Any) -> tuple[str, Any]:
    """One mutation of the decoded document, in place where it can be; returns (what, document)."""
    what = rng.choice(("number", "number", "number", "type", "type", "string", "nest", "empty", "drop",
                       "duplicate key", "top level", "repeat"))
    if what == "top level" or not isinstance(doc, (dict, list)):
        return _mutate_top(rng, doc)
    if what == "repeat":
        events = _events(doc)
        if events:
            event = rng.choice(events)
            events.extend([event] * rng.choice((2, 100, 2_000)))
            return "an event repeated", doc
        what = "empty"
    if what == "duplicate key":
        events = _events(doc)
        at = [i for i, e in enumerate(events) if isinstance(e, dict) and e]
        if at:
            i = rng.choice(at)
            key = rng.choice(list(events[i]))
            value = Raw(rng.choice(NUMBERS + WRONG_TYPES))
            pairs = list(events[i].items())
            pairs.insert(rng.randrange(len(pairs) + 1), (key, value))
            events[i] = Pairs(pairs)
            return f"duplicate key {key!r} = {value[:40]}", doc
        what = "empty"
    slot = _pick_slot(rng, doc)
    if slot is None:
        return _mutate_top(rng, doc)
    container, key = slot
    if what == "drop" and isinstance(container, dict) and key in container:
        del container[key]
        return f"dropped {key!r}", doc
    value: Any = {
        "number": lambda: Raw(rng.choice(NUMBERS)),
        "type": lambda: Raw(rng.choice(WRONG_TYPES)),
        "string": lambda: rng.choice(STRINGS),
        "nest": lambda: _nested(rng),
        "empty": lambda: rng.choice(([], {}, "")),
        "drop": lambda: Raw("null"),
    }[what]()
    container[key] = value
    shown = value if isinstance(value, str) else json.dumps(value)
    return f"{what}: {key!r} = {shown[:40]!r}", doc


def _mutate_top(rng: random.Random, doc: Any) -> tuple[str, Any]:
    """Mutations of the document as a whole: the events array replaced, odd top-level keys, no events, an
    event copied onto thousands of tracks."""
    choice = rng.randrange(7)
    if choice == 0:
        return "no events", ({**doc, "traceEvents": []} if isinstance(doc, dict) else [])
    if choice == 1:
        value = Raw(rng.choice((*WRONG_TYPES, '"traceEvents"')))
        return f"traceEvents = {value}", ({**doc, "traceEvents": value} if isinstance(doc, dict) else value)
    if choice == 2:
        return "an empty document", Raw(rng.choice(("{}", "[]", '{"traceEvents": {}}', "null", "0", '""')))
    if choice == 3:
        key = rng.choice(("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "displayTimeUnit",
                          "schemaVersion", "traceName"))
        value = rng.choice((Raw(rng.choice(NUMBERS + WRONG_TYPES)), _nested(rng), [Raw(rng.choice(WRONG_TYPES))]))
        if isinstance(doc, dict):
            return f"top-level {key} = {str(value)[:40]!r}", {**doc, key: value}
        return f"events = [{key}]", [{key: value}]
    if choice == 4:
        return "events nested deeply", _nested(rng) if rng.random() < 0.5 else {"traceEvents": _nested(rng)}
    if choice == 5:
        return _many_tracks(rng, doc)
    events = _events(doc)
    events.append(Raw(rng.choice(WRONG_TYPES + NUMBERS)))
    return "an event that is no object", doc


def _many_tracks(rng: random.Random, doc: Any) -> tuple[str, Any]:
    """One complete event of the document copied 2,000 or 20,000 times, each copy on its own thread, process or
    device: a small file naming more tracks than any view can draw a lane for (issue 22)."""
    events = _events(doc)
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"] or [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]
    base, copies, where = rng.choice(complete), rng.choice((2_000, 20_000)), rng.choice(("tid", "pid", "device"))
    for i in range(copies):
        copy = {**base, "tid": 1_000 + i} if where == "tid" else {**base, "pid": 1_000 + i}
        if where == "device":
            copy |= {"cat": "kernel", "args": {"device": i, "stream": 7}}
        events.append(copy)
    return f"many tracks: an event copied {copies:,} times, each on its own {where}", doc


def _mutate_text(rng: random.Random, text: bytes) -> tuple[str, bytes]:
    """A byte-level mutation: truncation, flipped bytes, or bytes that are not UTF-8 inside a string."""
    choice = rng.randrange(3)
    if choice == 0 or not text:
        cut = rng.randrange(len(text) + 1)
        return f"truncated at {cut} of {len(text)}", text[:cut]
    if choice == 1:
        data = bytearray(text)
        spots = [rng.randrange(len(data)) for _ in range(rng.choice((1, 2, 8)))]
        for at in spots:
            data[at] ^= rng.randrange(1, 256)
        return f"bytes flipped at {spots}", bytes(data)
    quotes = [m.end() for m in re.finditer(rb'"', text)] or [0]
    at, bad = rng.choice(quotes), rng.choice(NOT_UTF8)
    return f"non-UTF-8 {bad!r} at {at}", text[:at] + bad + text[at:]


def _kineto_case(rng: random.Random, fmt: str, seeds: Seeds) -> tuple[list[str], bytes]:
    name, text = rng.choice(seeds.kineto)
    doc = json.loads(text)
    if fmt == "kineto-array":
        doc = _events(doc)
    mutations = [f"seed {name}"]
    for _ in range(rng.choice((1, 1, 2, 3))):
        what, doc = _mutate_document(rng, doc)
        mutations.append(what)
    data = dump(doc).encode("utf-8", "surrogatepass")
    if rng.random() < 0.35:
        what, data = _mutate_text(rng, data)
        mutations.append(what)
    if fmt != "kineto-gz":
        return mutations, data
    data = gzip.compress(data, mtime=0)
    if rng.random() < 0.3:
        what, data = _mutate_text(rng, data)
        mutations.append(f"gzip {what}")
    return mutations, data


# --- XSpace -------------------------------------------------------------------------------------------

_XSPACE_VALUES = {
    "int64": ("9223372036854775807", "-9223372036854775808", "-1", "0", "4611686018427387904",
              "2305843009213693952", "-4611686018427387904", "1000000000000000000"),
    "uint64": ("18446744073709551615", "9223372036854775808", "0", "1"),
    "double": ("1e308", "-1e308", "nan", "inf", "-inf", "5e-324", "0"),
}
_XSPACE_FIELDS = {
    "id": "int64", "display_id": "int64", "timestamp_ns": "int64", "offset_ps": "int64", "duration_ps": "int64",
    "metadata_id": "int64", "key": "int64", "int64_value": "int64", "num_occurrences": "int64",
    "uint64_value": "uint64", "ref_value": "uint64", "double_value": "double",
}
_XSPACE_NUMBER = re.compile(r"\b(" + "|".join(_XSPACE_FIELDS) + r"): (-?[0-9][0-9.e+-]*)")
_XSPACE_STRING = re.compile(r'\b(name|str_value|display_name): "((?:[^"\\]|\\.)*)"')
_XSPACE_NAMES = ("", "/device:GPU:99999999999999999999", "/device:TPU:-1", "/device:GPU:", "/host:CPU",
                 "Stream #99999999999999999999(Compute)", "Stream #1(", "Stream #7(MemcpyH2D)", "XLA Ops",
                 "Steps", "PjitFunction(", "$", "::", "ThunkExecutor::Execute", "regs:x grid:-1,,1 block:",
                 "regs:99999999999999999999 shm:-1 grid:0,0,0 block:1024,1,1 static_shared:1e9",
                 "ProfilerStep#99999999999999999999", "step_num", "hlo_op", "correlation_id", "x" * 20_000)
_XSPACE_REPEATS = (2, 300, 11_000)
"""How many times the repeated-lines mutation writes one event in its line (identical events nest as a chain)."""
_XSPACE_LINE_COPIES = (1, 3)
"""How many lines (same id and name) that line becomes: 3 × 11,000 identical events pass the 32,767 levels
a trace's depth holds, which the reader refuses; the largest case stays under 10 MB of text, 1 MB serialized."""
_XSPACE_REPEAT_TEXT = 100_000
"""Text longer than this (a case already repeated) gets no repeated lines again, so repeats never multiply."""


def _mutate_xspace_text(rng: random.Random, text: str) -> tuple[str, str]:
    """A mutation of the XSpace text format that keeps it a well-formed message."""

    def block_end(at: int, within: str) -> int:  # the end of the block whose "{" ends just before `at`
        depth = 1
        while depth:
            depth += {"{": 1, "}": -1}.get(within[at], 0)
            at += 1
        return at

    choice = rng.randrange(6)
    if choice <= 1:
        fields = list(_XSPACE_NUMBER.finditer(text))
        field = rng.choice(fields)
        value = rng.choice(_XSPACE_VALUES[_XSPACE_FIELDS[field[1]]])
        return f"{field[1]} {field[2]} -> {value}", text[:field.start(2)] + value + text[field.end(2):]
    if choice == 2:
        strings = list(_XSPACE_STRING.finditer(text))
        field = rng.choice(strings)
        value = rng.choice(_XSPACE_NAMES)
        return f"{field[1]} {field[2][:30]!r} -> {value[:40]!r}", text[:field.start(2)] + value + text[field.end(2):]
    if choice == 3:  # a block (event, stat, metadata entry, line) removed: dangling ids, empty lines
        blocks = [m for m in re.finditer(r"\b(events|stats|event_metadata|stat_metadata|lines) \{", text)]
        block = rng.choice(blocks)
        return f"a {block[1]} block removed", text[:block.start()] + text[block_end(block.end(), text):]
    lines = [] if choice != 5 or len(text) > _XSPACE_REPEAT_TEXT else \
        [(m.start(), block_end(m.end(), text)) for m in re.finditer(r"\blines \{", text)]
    lines = [(a, b) for a, b in lines if re.search(r"\bevents \{", text[a:b])]
    if lines:  # repeated lines: one event written many times in its line, the line copied
        a, b = rng.choice(lines)
        line = text[a:b]
        event = rng.choice(list(re.finditer(r"\bevents \{", line)))
        end = block_end(event.end(), line)
        times, copies = rng.choice(_XSPACE_REPEATS), rng.choice(_XSPACE_LINE_COPIES)
        line = line[:event.start()] + " ".join([line[event.start():end]] * times) + line[end:]
        return f"an event repeated {times} times in a line written {copies} times", \
            text[:a] + "\n".join([line] * copies) + text[b:]
    event = rng.choice(list(re.finditer(r"events \{", text)))
    extra = rng.choice(("stats { metadata_id: 424242 int64_value: 1 }", "stats { metadata_id: 1 }",
                        "stats { metadata_id: 1 ref_value: 99 }", "stats { metadata_id: 2 bytes_value: \"\\377\" }",
                        "stats { metadata_id: 1 double_value: nan } stats { metadata_id: 1 str_value: \"\" }"))
    return f"event gets {extra!r}", text[:event.end()] + " " + extra + " " + text[event.end():]


def _xspace_case(rng: random.Random, fmt: str, seeds: Seeds) -> tuple[list[str], bytes]:
    if seeds.xspace_bytes and rng.random() < 0.25:  # the captured file: bytes only
        name, data = rng.choice(seeds.xspace_bytes)
        what, data = _mutate_text(rng, data)
        return [f"seed {name}", what], data
    name, text = rng.choice(seeds.xspace_text)
    mutations = [f"seed {name}"]
    for _ in range(rng.choice((1, 2, 3))):
        what, text = _mutate_xspace_text(rng, text)
        mutations.append(what)
    try:
        data = seeds.serialize_xspace(text)
    except Exception as exc:  # a mutation the text format refuses: a bug in this generator, say so
        raise AssertionError(f"xspace case does not serialize ({exc}): {mutations}") from exc
    if rng.random() < 0.3:
        what, data = _mutate_text(rng, data)
        mutations.append(what)
    return mutations, data


# --- nsys SQLite --------------------------------------------------------------------------------------

_SQL_VALUES = ("9223372036854775807", "-9223372036854775808", "4611686018427387904", "-1", "0", "1e300", "-1e300",
               "9e999", "-9e999", "0.5", "'NaN'", "'12abc'", "''", "X'FFFE00'", "NULL", "CAST(X'C328FF' AS TEXT)",
               "'9223372036854775808'", "'" + "x" * 10_000 + "'")


def _mutate_nsys(rng: random.Random, con: sqlite3.Connection) -> str:
    """One SQL mutation of the export behind `con`."""
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    used = [t for t in tables if t in NSYS_TABLES] or tables
    table = rng.choice(used)
    info = con.execute(f'PRAGMA table_info("{table}")').fetchall()
    columns = [c[1] for c in info]
    choice = rng.randrange(10)
    integers = [c[1] for c in info if "INT" in (c[2] or "").upper()]  # INTEGER columns: times, ids, StringIds ids
    if choice >= 8 and integers:  # REAL/TEXT in integer columns (a key column refuses: IntegrityError)
        column, value = rng.choice(integers), rng.choice(("9e999", "-9e999", "1.5", "'3x'", "X'00'", "X'0102'"))
        rows = rng.choice(("every row", "the last row", "every third row"))
        where = {"every row": "", "the last row": f' WHERE rowid = (SELECT max(rowid) FROM "{table}")',
                 "every third row": " WHERE rowid % 3 = 0"}[rows]
        con.execute(f'UPDATE "{table}" SET "{column}" = {value}{where}')
        return f"REAL/TEXT in integer column {table}.{column} = {value} in {rows}"
    choice %= 8
    if choice <= 3 and columns:
        column, value = rng.choice(columns), rng.choice(_SQL_VALUES)
        rows = rng.choice(("every row", "the first row", "even rows"))
        where = {"every row": "", "the first row": f' WHERE rowid = (SELECT min(rowid) FROM "{table}")',
                 "even rows": " WHERE rowid % 2 = 0"}[rows]
        con.execute(f'UPDATE "{table}" SET "{column}" = {value}{where}')
        return f"{table}.{column} = {value[:40]} in {rows}"
    if choice == 4:
        con.execute(f'DROP TABLE "{table}"')
        return f"dropped {table}"
    if choice == 5 and len(columns) > 1:
        column = rng.choice(columns)
        try:
            con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
        except sqlite3.OperationalError:  # a key or indexed column: rebuild without it
            kept = ", ".join(f'"{c}"' for c in columns if c != column)
            con.executescript(f'CREATE TABLE fuzz_copy AS SELECT {kept} FROM "{table}"; DROP TABLE "{table}"; '
                              f'ALTER TABLE fuzz_copy RENAME TO "{table}";')
        return f"dropped column {table}.{column}"
    if choice == 6:
        con.execute(f'DELETE FROM "{table}"')
        return f"emptied {table}"
    con.execute(f'INSERT INTO "{table}" SELECT * FROM "{table}"')
    return f"rows of {table} doubled"


def _nsys_case(rng: random.Random, fmt: str, seeds: Seeds) -> tuple[list[str], bytes]:
    name, data = rng.choice(seeds.nsys)
    mutations = [f"seed {name}"]
    with tempfile.TemporaryDirectory(prefix="fuzz-nsys-") as folder:
        path = Path(folder) / "export.sqlite"
        path.write_bytes(data)
        con = sqlite3.connect(path, isolation_level=None)
        try:
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                try:
                    mutations.append(_mutate_nsys(rng, con))
                except sqlite3.IntegrityError as exc:  # a key column refused the value or the copied rows
                    mutations.append(f"a mutation SQLite refused ({exc})")
        finally:
            con.close()
        data = path.read_bytes()
    if len(mutations) == 1 or rng.random() < 0.3:
        what, data = _mutate_text(rng, data)
        mutations.append(what)
    return mutations, data

