"""XProf's own tool data (trace viewer, memory viewer, graph viewer, op profile, ...) from an XSpace.

xprof's converter (`xprof.convert.raw_to_tool_data.xspace_to_tool_data`) turns an `.xplane.pb` into
the data each page of XProf's UI shows. It writes caches beside its input (`<module>.hlo_proto.pb`,
SSTables, op stats), so `export_tool_data` runs it on a copy in a temporary folder and the capture
is never touched. What each tool gave on a CPU capture (jax 0.10.2, xprof 2.24.2, a jitted function
under `StepTraceAnnotation`), which is what "empty" means below:

| tool                 | written as                               | on CPU                                      |
|----------------------|------------------------------------------|---------------------------------------------|
| `trace_viewer`       | `trace_viewer.json.gz` (Chrome trace)    | host threads, XLA ops (`ynn_fusion`, ...)   |
| `overview_page`      | `overview_page.json` (DataTables)        | step times when steps are annotated          |
| `op_profile`         | `op_profile.json`                        | empty: no `children` under `byProgram`      |
| `hlo_stats`          | `hlo_stats.json`                         | empty: no rows                              |
| `roofline_model`     | `roofline_model.json`                    | empty: no op rows                           |
| `framework_op_stats` | `framework_op_stats.json`                | empty: only the `IDLE` row                  |
| `kernel_stats`       | `kernel_stats.json`                      | empty: no rows (GPU kernels only)           |
| `memory_profile`     | `memory_profile.json`                    | empty: no allocator                         |
| `memory_viewer`      | `memory_viewer/<module>.json`            | buffers of each module (`maxHeap`, ...)     |
| `graph_viewer`       | `graph_viewer/<module>.hlo.txt` (HLO),   | the optimized HLO and its entry graph       |
|                      | `graph_viewer/<module>.dot` (Graphviz)   |                                             |

A result counts as empty when it is missing or blank, or when its tool's check recognizes the empty
shape above; a result whose shape the check does not recognize is kept, so nothing is dropped on a
device whose output differs. Module-scoped tools run once per HLO module; the module names are those
of the `.hlo_proto.pb` files the converter extracts from the XSpace's metadata (what XProf's own
server lists), which hold every module the process compiled, not only those that ran. Beyond
`max_modules`, the modules that ran longest in the capture go first (summed event time per
`program_id` stat), then the others by name; the index says which were skipped.

xprof is imported on first use; without it the functions raise `MissingDependency` (workbench[jax]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import re
import secrets
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.errors import MissingDependency, TraceFormatError, WorkbenchError
from workbench.trace.xspace.reader import SUFFIX, looks_like_xspace

DEFAULT_TOOLS: tuple[str, ...] = (
    "trace_viewer", "overview_page", "op_profile", "hlo_stats", "roofline_model", "framework_op_stats",
    "kernel_stats", "memory_profile", "memory_viewer", "graph_viewer",
)
"""The tools `export_tool_data` runs unless told otherwise: those with data on some device."""

MAX_MODULES = 8
"""Module-scoped tools run for at most this many HLO modules (a model process compiles hundreds of
tiny `jit_*` helpers; the modules that ran longest come first)."""

HLO_SUFFIX = ".hlo_proto.pb"
_PROGRAM_ID = re.compile(r"\((\d+)\)$")
_ENTRY = re.compile(r"^ENTRY %?([^\s(]+)", re.MULTILINE)
_TIMED_EVENT = re.compile(rb'"ph":\s*"[^M"]')  # any Chrome trace event that is not metadata
_UNSAFE = re.compile(r"[^A-Za-z0-9._()+=-]")
_CONTENT_SUFFIX = {"application/json": ".json", "text/html": ".html", "text/plain": ".txt"}

Convert = Callable[[str, Mapping[str, Any]], tuple[Any, str]]
"""`xspace_to_tool_data` bound to the XSpace: (tool, params) -> (data, content type)."""
Piece = tuple[str, bytes]
"""One file a tool produces: its suffix (".json", ".hlo.txt", ...) and its bytes."""


@dataclasses.dataclass(frozen=True)
class _Tool:
    """How to run one XProf tool and recognize an empty result (see the module docstring)."""

    run: Callable[[Convert, str | None], list[Piece]]
    empty: Callable[[bytes], bool]
    per_module: bool = False
    gzip: bool = False


def export_tool_data(xspace: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                     tools: Sequence[str] = DEFAULT_TOOLS, max_modules: int = MAX_MODULES) -> dict[str, dict[str, Any]]:
    """Run XProf's converter on the XSpace file `xspace` for each of `tools`
    and write each non-empty result under `out_dir` (created on the first file) as `<tool><suffix>`,
    or `<tool>/<module><suffix>` for module-scoped tools; each file is written under a temporary
    name and renamed. Returns the index `{tool: {"files": [paths relative to out_dir], "empty": bool,
    "error": str | None}}`, module-scoped tools adding `"modules"` (exported) and `"modules_skipped"`.

    A tool that raises or gives nothing is recorded (`empty` true, `error` saying why if it raised),
    never fatal. A file that is not an XSpace the converter can read raises `TraceFormatError` before
    anything is written; an unknown tool name raises `WorkbenchError`.
    """
    chosen = tuple(tools)
    unknown = [t for t in chosen if t not in _TOOLS]
    if unknown:
        raise WorkbenchError(f"unknown XProf tool(s) {', '.join(map(repr, unknown))}; known: {', '.join(_TOOLS)}")
    if max_modules < 1:
        raise WorkbenchError(f"max_modules must be at least 1, not {max_modules}")
    source = _checked_xspace(Path(xspace))
    raw_to_tool_data = _converter_module()
    out = Path(out_dir)
    index: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="workbench-xprof-") as tmp:
        copy = Path(tmp) / source.name
        shutil.copyfile(source, copy)
        # Reading the tool names makes the converter extract the modules' `.hlo_proto.pb` files; an
        # XSpace it cannot parse gives no tool at all.
        try:
            names = raw_to_tool_data.xspace_to_tool_names([str(copy)])
        except Exception as exc:  # the C API raises RuntimeError; nothing narrower is documented
            raise TraceFormatError(source, f"XProf's converter cannot read it ({exc})") from exc
        if not names:
            raise TraceFormatError(source, "not an XSpace that XProf's converter can read (no tool data in it)")

        def convert(tool: str, params: Mapping[str, Any]) -> tuple[Any, str]:
            return raw_to_tool_data.xspace_to_tool_data([str(copy)], tool, params)

        modules, skipped = [], []
        if any(_TOOLS[t].per_module for t in chosen):
            modules, skipped = _pick_modules(copy, max_modules)
        for name in chosen:
            spec = _TOOLS[name]
            if spec.per_module:
                entry = _run_per_module(name, spec, convert, modules, out)
                entry["modules_skipped"] = skipped
            else:
                entry = _run_one(name, spec, convert, None, out)
            index[name] = entry
    return index


def module_names(folder: Path) -> list[str]:
    """The HLO module names whose `.hlo_proto.pb` files the converter wrote into `folder`, sorted
    (`NO_MODULE` is the converter's placeholder for an XSpace without modules)."""
    names = (p.name.removesuffix(HLO_SUFFIX) for p in folder.glob(f"*{HLO_SUFFIX}"))
    return sorted(n for n in names if n and n != "NO_MODULE")


def _checked_xspace(path: Path) -> Path:
    """`path`, checked to be a non-empty file that starts like an XSpace."""
    if not path.is_file():
        raise TraceFormatError(path, "no such XSpace file")
    with path.open("rb") as f:
        head = f.read(64)
    if not head:
        raise TraceFormatError(path, "an empty file, not an XSpace")
    if not looks_like_xspace(head):
        raise TraceFormatError(path, f"not an XSpace ({SUFFIX} written by jax.profiler / XProf)")
    return path


def _converter_module() -> Any:
    """xprof's `raw_to_tool_data`, imported on first use."""
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as exc:
        raise MissingDependency("xprof", "jax") from exc
    return raw_to_tool_data


def _pick_modules(xspace: Path, limit: int) -> tuple[list[str], list[str]]:
    """The modules to export (at most `limit`: those that ran longest first, then by name) and the
    ones left out."""
    names = module_names(xspace.parent)
    if len(names) <= limit:
        return names, []
    busy = _program_times(xspace)

    def rank(name: str) -> tuple[float, str]:
        match = _PROGRAM_ID.search(name)
        return (-busy.get(match[1], 0.0) if match else 0.0, name)

    ranked = sorted(names, key=rank)
    return ranked[:limit], ranked[limit:]


def _program_times(xspace: Path) -> Counter[str]:
    """Summed event time (ns) per `program_id` stat: which compiled modules ran in the capture, and
    how long. Empty when the XSpace cannot be parsed here (the ranking then falls back to names)."""
    try:
        from xprof.profile_data import ProfileData
    except ImportError:  # xprof before 2.24 has no ProfileData of its own
        try:
            from jax.profiler import ProfileData
        except ImportError:
            return Counter()
    times: Counter[str] = Counter()
    try:
        data = ProfileData.from_file(str(xspace))
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    for key, value in event.stats:
                        if key == "program_id":
                            times[str(value)] += float(event.duration_ns)
    except Exception:  # a ranking hint only: any parse failure falls back to name order
        return Counter()
    return times


def _run_one(name: str, spec: _Tool, convert: Convert, module: str | None, out: Path) -> dict[str, Any]:
    """Run one tool (for one module) and write its non-empty pieces; the index entry."""
    try:
        pieces = spec.run(convert, module)
    except Exception as exc:  # the converter raises ValueError, RuntimeError, ... per tool and input
        return {"files": [], "empty": True, "error": f"{type(exc).__name__}: {exc}".strip()}
    if not pieces or _blank(pieces[0][1]) or spec.empty(pieces[0][1]):
        return {"files": [], "empty": True, "error": None}
    stem = f"{name}/{_safe(module)}" if module is not None else name
    files = []
    for suffix, data in pieces:
        if spec.gzip and not _is_gzip(data):
            data, suffix = gzip.compress(data, compresslevel=6, mtime=0), f"{suffix}.gz"
        files.append(_write_atomic(out, f"{stem}{suffix}", data))
    return {"files": files, "empty": False, "error": None}


def _run_per_module(name: str, spec: _Tool, convert: Convert, modules: Iterable[str],
                    out: Path) -> dict[str, Any]:
    """Run a module-scoped tool for each module; one index entry for all of them."""
    files: list[str] = []
    errors: list[str] = []
    exported: list[str] = []
    for module in modules:
        entry = _run_one(name, spec, convert, module, out)
        files += entry["files"]
        if entry["files"]:
            exported.append(module)
        if entry["error"]:
            errors.append(f"{module}: {entry['error']}")
    return {"files": files, "empty": not files, "error": "; ".join(errors) or None, "modules": exported}


def _write_atomic(out: Path, relative: str, data: bytes) -> str:
    """Write `data` to `out/relative` through a temporary sibling renamed into place; the relative
    path, with `/` separators, for the index."""
    target = out / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return relative


def _safe(module: str) -> str:
    """A module name as a file name (HLO names are already safe: `jit_f(24)`; anything else is `_`)."""
    return _UNSAFE.sub("_", module).lstrip(".") or "_"


def _as_bytes(data: Any) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _is_gzip(data: bytes) -> bool:
    return data[:2] == b"\x1f\x8b"


def _blank(data: bytes) -> bool:
    return not data.strip()


def _suffix(content_type: str, data: bytes) -> str:
    """The file suffix a converter result gets from its content type (gzip data gains `.gz`)."""
    suffix = _CONTENT_SUFFIX.get(content_type.split(";")[0].strip(), ".bin")
    return f"{suffix}.gz" if _is_gzip(data) else suffix


# Running the tools ---------------------------------------------------------------------------------------------


def _plain(tool: str, **params: Any) -> Callable[[Convert, str | None], list[Piece]]:
    """A tool run once with fixed `params`; its file suffix follows the content type."""

    def run(convert: Convert, module: str | None) -> list[Piece]:
        data, content_type = convert(tool, params)
        if data is None:
            return []
        data = _as_bytes(data)
        return [(_suffix(content_type, data), data)]

    return run


def _memory_viewer(convert: Convert, module: str | None) -> list[Piece]:
    """The memory viewer's buffers of one module (memory space 0, as XProf's UI asks by default)."""
    data, content_type = convert("memory_viewer", {"module_name": module, "memory_space": "0"})
    if data is None:
        return []
    data = _as_bytes(data)
    return [(_suffix(content_type, data), data)]


def _graph_viewer(convert: Convert, module: str | None) -> list[Piece]:
    """A module's optimized HLO text, and the Graphviz DOT graph of its entry computation (XProf's
    `html` rendering loads its scripts from the web, so the DOT source is kept instead)."""
    options = {"module_name": module, "type": "long_txt"}
    text, _ = convert("graph_viewer", {"graph_viewer_options": options})
    if text is None:
        return []
    text = _as_bytes(text)
    pieces = [(".hlo.txt", text)]
    entry = _ENTRY.search(text.decode("utf-8", errors="replace"))
    if entry:
        graph = {"module_name": module, "type": "graph", "format": "dot", "node_name": entry[1], "graph_width": 3}
        dot, _ = convert("graph_viewer", {"graph_viewer_options": graph})
        if dot:
            pieces.append((".dot", _as_bytes(dot)))
    return pieces


# Telling empty results ----------------------------------------------------------------------------------------


def _json(data: bytes) -> Any:
    """Parsed JSON, or None when it is not JSON (then no check can call it empty)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _no_events(data: bytes) -> bool:
    """A Chrome trace with only metadata events (process and thread names). A regex, not a parse:
    a trace viewer result can be hundreds of MB."""
    return _TIMED_EVENT.search(data) is None


def _data_tables(doc: Any) -> list[dict[str, Any]]:
    """The Google DataTables (`{"cols": [...], "rows": [...]}`) at the top of a tool's JSON."""
    items = doc if isinstance(doc, list) else [doc]
    return [t for t in items if isinstance(t, dict) and isinstance(t.get("cols"), list) and "rows" in t]


def _no_rows(*columns: str, ignore: Mapping[str, str] | None = None) -> Callable[[bytes], bool]:
    """Empty when the DataTables having one of `columns` have no row (rows whose value in a column
    of `ignore` equals the given value, e.g. the `IDLE` row, do not count); not empty when no table
    has those columns (an unknown shape is kept)."""

    def empty(data: bytes) -> bool:
        tables = [t for t in _data_tables(_json(data))
                  if any(isinstance(c, dict) and c.get("id") in columns for c in t["cols"])]
        return bool(tables) and not any(_counts(t, ignore or {}) for t in tables)

    return empty


def _counts(table: dict[str, Any], ignore: Mapping[str, str]) -> int:
    """How many rows of a DataTable count (those not matching `ignore`)."""
    ids = [c.get("id") if isinstance(c, dict) else None for c in table["cols"]]
    where = {ids.index(col): value for col, value in ignore.items() if col in ids}
    count = 0
    for row in table.get("rows") or []:
        cells = row.get("c", []) if isinstance(row, dict) else []
        values = [c.get("v") if isinstance(c, dict) else None for c in cells]
        ignored = bool(where) and all(i < len(values) and values[i] == v for i, v in where.items())
        count += not ignored
    return count


def _no_op_children(data: bytes) -> bool:
    """An op profile whose program (and category) trees have no child node."""
    doc = _json(data)
    if not isinstance(doc, dict):
        return False
    trees = [doc[k] for k in ("byProgram", "byCategory") if isinstance(doc.get(k), dict)]
    return bool(trees) and not any(tree.get("children") for tree in trees)


def _no_allocator(data: bytes) -> bool:
    """A memory profile without any allocator."""
    doc = _json(data)
    return isinstance(doc, dict) and "memoryProfilePerAllocator" in doc and not doc["memoryProfilePerAllocator"]


def _never(data: bytes) -> bool:
    return False


_TOOLS: dict[str, _Tool] = {
    "trace_viewer": _Tool(_plain("trace_viewer"), _no_events, gzip=True),
    "overview_page": _Tool(_plain("overview_page"), _no_rows("operation", "stepnum")),
    "op_profile": _Tool(_plain("op_profile", group_by="program"), _no_op_children),
    "hlo_stats": _Tool(_plain("hlo_stats"), _no_rows("hlo_op_name")),
    "roofline_model": _Tool(_plain("roofline_model"), _no_rows("operation")),
    "framework_op_stats": _Tool(_plain("framework_op_stats"), _no_rows("operation", ignore={"operation": "IDLE"})),
    "kernel_stats": _Tool(_plain("kernel_stats"), _no_rows("kernel_name")),
    "memory_profile": _Tool(_plain("memory_profile"), _no_allocator),
    "memory_viewer": _Tool(_memory_viewer, _never, per_module=True),
    "graph_viewer": _Tool(_graph_viewer, _never, per_module=True),
}
