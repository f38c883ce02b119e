"""Kernel launch facts for the timeline's details: how a piece of device work was launched, as named fields.

Profilers record a kernel's launch configuration in its `args` (Kineto: "grid", "block", "registers per thread",
"shared memory", "stream", "correlation"; the Nsight Systems reader writes the same names, keeping
"staticSharedMemory" and "dynamicSharedMemory" beside their sum). The trace's links add who launched it: the
host op behind the runtime launch (`launcher`, climbing from a runtime call to its op) and the Python frame
that op ran in (the nearest enclosing `python` event, or the innermost frame of the op's "Call stack" where a
trace records stacks so). `launch_facts` turns both into ordered (field, value) pairs, each a text a person
reads; the static report and the panel's `events` route show the same ones.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.analysis.timeline import dictionary_codes
from workbench.trace.schema import DEVICE_KINDS

FIELDS = ("grid", "block", "registers per thread", "shared memory", "stream", "correlation id", "launching op",
          "Python frame")
"""The fields `launch_facts` may give, in the order it gives them."""
LAUNCH_COLUMNS = ("kind", "parent", "launcher", "name", "args", "track", "corr")
"""The events columns `events_launch_facts` reads."""
MAX_CLIMB = 256
"""Parents followed at most from a launcher to its op or Python frame (nesting is far shallower)."""
HOST_KINDS = ("op", "annotation")
"""Kinds of the host event a launch is attributed to (an NVTX range plays the op under Nsight Systems)."""


@dataclass(frozen=True)
class LaunchLinks:
    """What the trace's links say about a device event: its track, correlation id (-1: none), the name of
    the host op that launched it and that op's Python frame ('' when unknown)."""

    track: str = ""
    corr: int = -1
    op: str = ""
    python_frame: str = ""


def launch_facts(args: Mapping[str, Any] | str | None, links: LaunchLinks = LaunchLinks()) -> list[tuple[str, str]]:
    """The launch facts of a device event from its `args` (a mapping, or the JSON text of the `args` column)
    and `links`, in `FIELDS` order; a fact the trace lacks is left out (a memcpy has no grid)."""
    values = _mapping(args)
    facts: list[tuple[str, str]] = []
    for dims in ("grid", "block"):
        xyz = values.get(dims)
        if xyz is None and all(f"{dims}{axis}" in values for axis in "XYZ"):
            xyz = [values[f"{dims}{axis}"] for axis in "XYZ"]
        if isinstance(xyz, list | tuple) and xyz and all(_integer(v) for v in xyz):
            facts.append((dims, " × ".join(_count(v) for v in xyz)))
    registers = values.get("registers per thread", values.get("registersPerThread"))
    if _integer(registers):
        facts.append(("registers per thread", _count(registers)))
    shared = _shared_memory(values)
    if shared:
        facts.append(("shared memory", shared))
    stream = values.get("stream", values.get("streamId"))
    if _integer(stream):
        facts.append(("stream", _count(stream)))
    elif links.track.rpartition("/")[2].startswith("stream "):
        facts.append(("stream", links.track.rpartition("/")[2].removeprefix("stream ")))
    corr = values.get("correlation", values.get("correlationId"))
    if _integer(corr):
        facts.append(("correlation id", str(int(corr))))
    elif links.corr >= 0:
        facts.append(("correlation id", str(links.corr)))
    if links.op:
        facts.append(("launching op", links.op))
    if links.python_frame:
        facts.append(("Python frame", links.python_frame))
    return facts


def launch_rows(launcher: int, parent_of: Callable[[int], int], kind_of: Callable[[int], str]) -> tuple[int, int]:
    """The rows of the launching op and of its Python frame (-1 when none), from a device event's `launcher`
    row, given each row's parent row and kind: a runtime launcher climbs to its enclosing op (or annotation),
    and the frame is the nearest enclosing `python` event above the op."""
    op = _climb(launcher, parent_of, lambda row: kind_of(row) in HOST_KINDS)
    frame = _climb(op if op >= 0 else launcher, parent_of, lambda row: kind_of(row) == "python")
    return op, frame


def events_launch_facts(events: pa.Table, rows: np.ndarray) -> list[list[tuple[str, str]]]:
    """`launch_facts` of each of `rows` of an events table (an empty list for a row that is no device work):
    reads the args of those rows and of their launching ops only, never the whole column."""
    rows = np.asarray(rows, dtype=np.int64)
    kinds = events["kind"].take(pa.array(rows)).cast(pa.string()).to_pylist()
    device = np.flatnonzero([kind in DEVICE_KINDS for kind in kinds])
    out: list[list[tuple[str, str]]] = [[] for _ in range(len(rows))]
    if not len(device):
        return out
    picked = rows[device]
    parent = events["parent"].to_numpy()
    kind_codes, kind_names = dictionary_codes(events["kind"])
    launcher = events["launcher"].take(pa.array(picked)).to_numpy()
    linked = [launch_rows(int(row), lambda r: int(parent[r]), lambda r: kind_names[kind_codes[r]])
              for row in launcher.tolist()]
    ops = np.array([op for op, _ in linked], dtype=np.int64)
    frames = np.array([frame for _, frame in linked], dtype=np.int64)
    named = np.unique(np.concatenate([ops[ops >= 0], frames[frames >= 0]]))
    names = dict(zip(named.tolist(), _texts(events["name"], named), strict=True))
    stacks = dict(zip(ops[ops >= 0].tolist(), _texts(events["args"], ops[ops >= 0]), strict=True))
    args = _texts(events["args"], picked)
    tracks = _texts(events["track"], picked)
    corr = events["corr"].take(pa.array(picked)).to_numpy()
    for k, i in enumerate(device.tolist()):
        op, frame = int(ops[k]), int(frames[k])
        python = names[frame] if frame >= 0 else call_stack_frame(stacks[op]) if op >= 0 else ""
        out[i] = launch_facts(args[k], LaunchLinks(track=tracks[k], corr=int(corr[k]),
                                                   op=names[op] if op >= 0 else "", python_frame=python))
    return out


def call_stack_frame(args: Mapping[str, Any] | str | None) -> str:
    """The innermost frame of an op's recorded "Call stack" arg (older Kineto traces), as `file(line): function`
    without the file's folders; '' when there is none."""
    stack = _mapping(args).get("Call stack")
    if not isinstance(stack, str) or not stack.strip():
        return ""
    frame = stack.split(";", 1)[0].strip()
    path, paren, rest = frame.partition("(")
    return path.rsplit("/", 1)[-1] + paren + rest


def facts_text(facts: list[tuple[str, str]]) -> str:
    """Facts packed into one text, the compact form a report embeds per span: a line per fact, `k\\tvalue` with `k`
    the field's index in `FIELDS` (the browser's `views.timeline_select_js.SELECT` unpacks it)."""
    return "\n".join(f"{FIELDS.index(field)}\t{value}" for field, value in facts)


def _texts(column: pa.ChunkedArray, rows: np.ndarray) -> list[str]:
    """The values of a string column at `rows` as texts ('' for null)."""
    values = column.take(pa.array(rows, type=pa.int64()))
    if pa.types.is_dictionary(values.type):
        values = values.cast(pa.string())
    return [value or "" for value in values.to_pylist()]


def _climb(row: int, parent_of: Callable[[int], int], wanted: Callable[[int], bool]) -> int:
    """`row` or the first of its ancestors where `wanted` holds (-1 when none within `MAX_CLIMB` steps)."""
    for _ in range(MAX_CLIMB):
        if row < 0:
            return -1
        if wanted(row):
            return row
        row = parent_of(row)
    return -1


def _mapping(args: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    """`args` as a mapping: JSON text parsed (text that is not a JSON object gives an empty mapping)."""
    if isinstance(args, Mapping):
        return args
    if not args:
        return {}
    try:
        parsed = json.loads(args)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, Mapping) else {}


def _integer(value: Any) -> bool:
    """Whether `value` is a whole number (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer()


def _count(value: float) -> str:
    """A whole number with separators ("1,024")."""
    return f"{int(value):,}"


def _shared_memory(values: Mapping[str, Any]) -> str:
    """Shared memory per block: static and dynamic where the trace tells them apart, else the total."""
    static, dynamic = values.get("staticSharedMemory"), values.get("dynamicSharedMemory")
    if _integer(static) and _integer(dynamic):
        return f"{_bytes(static + dynamic)} (static {_bytes(static)}, dynamic {_bytes(dynamic)})"
    total = values.get("shared memory")
    return _bytes(total) if _integer(total) else ""


def _bytes(value: float) -> str:
    """A byte count in B, KiB or MiB (shared memory sizes are powers of two)."""
    for size, unit in ((2**20, "MiB"), (2**10, "KiB")):
        if value >= size:
            return f"{value / size:,.3g} {unit}"
    return f"{_count(value)} B"
