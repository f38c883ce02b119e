"""The run bundle: one folder per run under the traces root, written atomically.

    <root>/<run-id>/
      run.json        schema_version, run_id, created (ISO 8601 UTC), status ("ok" | "failed"), error,
                      model, variant, device, experiment, whatever the caller adds (versions, benchmark
                      stats, numerics, capture settings) and the Trace metadata under "trace"
      events.parquet  memory.parquet  counters.parquet   (zstd; only when the run has a trace)
      events.index    the timeline's index of events.parquet (`workbench.analysis.spans.index`): derived,
                      built again on first open when missing or stale (bundles of earlier versions)
      kernel_metrics.parquet  cuda_allocator.parquet  cuda_segments.parquet  steps.parquet
                      optional tables of some runs (Nsight Compute metrics; the CUDA allocator's
                      history and segments; a serving engine's steps), read with `Bundle.table`
      raw/            the original profiler output, untouched
      compile/        compile-stage texts (JAX variants: lowered StableHLO, optimized HLO)
      xprof/          XProf's tool data for the capture (JAX variants)

A bundle is assembled in a hidden sibling folder (`.tmp-<run-id>-<owner>-<hex>`) and renamed into place,
and deletion renames it away (`.deleting-...`) before removing it, so a reader never sees a half bundle.
Hidden folders are never bundles; the owner in their names lets the next writer clear those of a killed
process (`workbench.trace.store.scratch`). The runs of an experiment are written together with its record
(`workbench.trace.store.staging`). This module also holds the conventions the experiment records share (ids,
`created` stamps, JSON-safe values, record loading).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timezone
from enum import Enum
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workbench.errors import BundleError, write_error
from workbench.limits import MAX_RUN_ID_LEN
from workbench.trace.model import Trace
from workbench.trace.schema import SCHEMA_VERSION
from workbench.trace.store.mirror_bundle import download_bundle, remote_bundle, shown_root
from workbench.trace.store.records import READABLE_VERSIONS, RunInfo
from workbench.trace.store.scratch import scratch_name

RUN_JSON = "run.json"
RAW_DIR = "raw"
EXTRA_DIRS = ("compile", "xprof")
"""Optional folders of a bundle besides raw/, filled through `write_bundle`'s `texts` and `folders`."""
TABLES = ("events", "memory", "counters")
OPTIONAL_TABLES = ("kernel_metrics", "cuda_allocator", "cuda_segments", "steps", "requests", "graph_kernels")
"""Tables a bundle may have besides the Trace's (see `workbench.trace.formats.ncu`,
`workbench.trace.formats.cuda_snapshot` and `workbench.serving`)."""
STATUSES = ("ok", "failed")
EXPERIMENTS_DIR = "experiments"
"""Folder of experiment records inside the traces root; reserved, so never a run id."""

_ID_RE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9._-]{{0,{MAX_RUN_ID_LEN - 1}}}")
_FIND_IDS = "run `workbench ls` to list run ids (with --out DIR for another traces root)"

ProblemHandler = Callable[[Path, str], None]
"""Called by the listings with the path of an unreadable entry and what is wrong with it."""


class BundleWarning(UserWarning):
    """An entry of the traces root that should be readable but is not; the listing goes on."""


def is_valid_run_id(text: object) -> bool:
    """Whether `text` is a valid run or experiment id: 1 to MAX_RUN_ID_LEN (128) letters, digits, `_`, `-`
    and `.`, starting with a letter, digit or `_` (so never `.`, `..` or an option-like `-x`), and not
    `experiments`. Such an id is a single path component that cannot leave the traces root."""
    return isinstance(text, str) and _ID_RE.fullmatch(text) is not None and text != EXPERIMENTS_DIR


def new_run_id(*parts: str) -> str:
    """A fresh id that sorts by creation time: UTC time, slugified `parts`, 4 random hex digits,
    e.g. `20261202-174512-tiny-gpt-eager-3f9a`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    slugs = (re.sub(r"[^a-z0-9.]+", "-", part.lower()).strip("-.") for part in parts)
    slug = "-".join(s for s in slugs if s)[:96].strip("-.")
    return "-".join(x for x in (stamp, slug, secrets.token_hex(2)) if x)


def utc_now() -> str:
    """The current time in ISO 8601 UTC with milliseconds: the format of every `created` field."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def created_time(info: Mapping[str, Any]) -> datetime:
    """The `created` time of a record as an aware datetime (the epoch of time if it is missing or bad),
    so that listings sort by it whatever offset the writer used."""
    try:
        created = datetime.fromisoformat(str(info.get("created")))
    except ValueError:
        created = datetime.min
    return created if created.tzinfo else created.replace(tzinfo=timezone.utc)


def json_safe(value: Any, where: str = "$") -> Any:
    """`value` as plain JSON data: NaN becomes null and ±inf "inf"/"-inf" (JSON has neither), numpy
    scalars and arrays become Python values, paths and dates strings, enums their value, dataclasses
    dicts. Anything else raises TypeError naming where it sits (`where` is its JSONPath)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(value)
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): json_safe(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (np.generic, np.ndarray)):
        return json_safe(value.tolist(), where)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Enum):
        return json_safe(value.value, where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value), where)
    raise TypeError(f"{where}: a {type(value).__name__} is not JSON-serializable")


def load_record(path: Path, label: str) -> dict[str, Any]:
    """The JSON object in `path` (a run.json or an experiment record), checked to be an object of the
    supported schema_version; `label` names the thing in errors."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{label}: malformed {path}: {exc}") from exc
    if not isinstance(record, dict):
        raise BundleError(f"{label}: malformed {path}: a JSON {type(record).__name__}, not an object")
    version = record.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BundleError(f"{label}: {path} has schema_version {version!r}; this workbench reads "
                          f"version {', '.join(map(str, sorted(READABLE_VERSIONS)))} (a newer one needs a newer "
                          "workbench)")
    return record


def resolve_inside(root: Path, candidate: Path, label: str) -> Path:
    """`candidate` (an entry of `root`) with links resolved, refusing one that leads out of `root`:
    ids come from users (CLI, Jupyter server) and must not reach other files."""
    try:
        base, real = root.resolve(strict=True), candidate.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop before Python 3.13
        raise BundleError(f"{label}: cannot resolve {candidate}: {exc}") from exc
    if real == base or not real.is_relative_to(base):
        raise BundleError(f"{label}: {candidate} leads outside {root} (to {real}); refused")
    return real


@dataclasses.dataclass(eq=False)
class Bundle:
    """A run bundle on disk: its run.json, read eagerly (it is small), and its tables, read on demand.

    `run_id` is the name the bundle is opened and listed by (its folder name); `path` is resolved. `info` is
    run.json as written; `record` is the same as a typed `RunInfo`, which readers use.
    """

    path: Path
    run_id: str
    info: dict[str, Any]
    _trace: Trace | None = dataclasses.field(default=None, init=False, repr=False)

    @functools.cached_property
    def record(self) -> RunInfo:
        """run.json as a typed record (any readable schema version)."""
        return RunInfo.from_json(self.info, self.run_id)

    @property
    def has_trace(self) -> bool:
        """Whether the run has trace tables (a run without profiling or a failed one may not)."""
        return self._has(f"{TABLES[0]}.parquet")

    @property
    def event_count(self) -> int:
        """Rows of the events table, read from its Parquet footer alone (0 for a run without a trace): what
        sizes the work of drawing it before any of it is read."""
        if not self.has_trace:
            return 0
        path = self.local_files() / f"{TABLES[0]}.parquet"
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except (OSError, pa.ArrowException) as exc:
            raise BundleError(f"run {self.run_id!r}: unreadable table {path}: {exc}") from exc

    def local_files(self) -> Path:
        """The bundle's folder with all its files on this disk: a bundle of a URL traces root, mirrored
        (`workbench.trace.store.mirror`), copies its files down on first use."""
        download_bundle(self.path)
        return self.path

    def _has(self, relative: str) -> bool:
        """Whether the bundle has the file `relative`, here or (mirrored) at its URL."""
        remote = remote_bundle(self.path)
        return relative in remote["files"] if remote is not None else (self.path / relative).is_file()

    def trace(self) -> Trace:
        """The run's Trace, read memory-mapped from its parquet files on first call, then cached."""
        if self._trace is None:
            if not self.has_trace:
                raise BundleError(f"run {self.run_id!r} (status {self.info.get('status')!r}) has no trace: "
                                  "it ran without profiling or failed before capture")
            self.local_files()
            try:
                tables = {name: pq.read_table(self.path / f"{name}.parquet", memory_map=True)
                          for name in TABLES}
                self._trace = Trace(**tables, metadata=dict(self.info.get("trace") or {}))
            except (OSError, KeyError, pa.ArrowException) as exc:
                raise BundleError(f"run {self.run_id!r}: unreadable tables in {self.path}: {exc}") from exc
        return self._trace

    def table(self, name: str) -> pa.Table | None:
        """One of the OPTIONAL_TABLES, read memory-mapped; None when the run has none."""
        if name not in OPTIONAL_TABLES:
            raise BundleError(f"{name!r} is not an optional bundle table ({', '.join(OPTIONAL_TABLES)})")
        if not self._has(f"{name}.parquet"):
            return None
        path = self.local_files() / f"{name}.parquet"
        try:
            return pq.read_table(path, memory_map=True)
        except (OSError, pa.ArrowException) as exc:
            raise BundleError(f"run {self.run_id!r}: unreadable table {path}: {exc}") from exc

    def raw_files(self) -> list[Path]:
        """The files of raw/ (recursively: some profilers write folders), sorted."""
        return sorted(p for p in (self.local_files() / RAW_DIR).rglob("*") if p.is_file())


def write_bundle(root: str | Path, run_id: str, info: RunInfo | Mapping[str, Any], trace: Trace | None = None,
                 raw_files: Sequence[str | Path] = (), move_raw: bool = False, *,
                 texts: Mapping[str, str] | None = None, folders: Mapping[str, str | Path] | None = None,
                 tables: Mapping[str, pa.Table] | None = None) -> Path:
    """Write the bundle `root/run_id` atomically and return its path.

    run.json gets the fixed fields, defaults for status ("ok"), error, model, variant, device,
    experiment and created (now), then `info` (which may override those defaults) and `trace.metadata`
    under "trace". `raw_files` (files or folders) are copied into raw/, or moved when `move_raw`.
    `texts` maps paths such as "compile/optimized.hlo.txt" to file contents and `folders` maps one of
    EXTRA_DIRS to a folder whose files are copied there; both only into EXTRA_DIRS. `tables` maps
    names of OPTIONAL_TABLES to Arrow tables written beside the trace's (only with a trace).
    On any failure, KeyboardInterrupt included, nothing is left in `root` and moved raw files are put
    back. An existing run is never overwritten.
    """
    root = Path(root)
    if not is_valid_run_id(run_id):
        raise BundleError(f"invalid run id {run_id!r}: use letters, digits, '_', '-' and '.'")
    text = _run_json(run_id, info, trace)
    sources = _checked_sources(raw_files)
    texts = {_extra_path(name, run_id): content for name, content in (texts or {}).items()}
    folders = {_extra_path(name, run_id, folder=True): Path(src) for name, src in (folders or {}).items()}
    tables = dict(tables or {})
    unknown = sorted(set(tables) - set(OPTIONAL_TABLES))
    if unknown or (tables and trace is None):
        problem = f"unknown tables {', '.join(unknown)}" if unknown else "optional tables need a trace"
        raise BundleError(f"run {run_id!r}: {problem} (optional tables: {', '.join(OPTIONAL_TABLES)})")
    final = root / run_id
    if os.path.lexists(final):
        raise BundleError(f"run {run_id!r} already exists in {root}; delete it first or pick a new id")
    tmp = root / scratch_name("tmp", run_id)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise write_error(exc, final, f"cannot write run {run_id!r} in {root}: {exc}") from exc
    moved: list[tuple[Path, Path]] = []
    try:
        (tmp / RUN_JSON).write_text(text, encoding="utf-8")
        if trace is not None:
            for name in TABLES:
                pq.write_table(getattr(trace, name), tmp / f"{name}.parquet", compression="zstd")
            from workbench.analysis.spans.index import write_index  # the index is the timeline's, derived here

            write_index(tmp / f"{TABLES[0]}.parquet")
        for name, table in tables.items():
            pq.write_table(table, tmp / f"{name}.parquet", compression="zstd")
        raw = tmp / RAW_DIR
        raw.mkdir()
        for src in sources:
            if move_raw:
                shutil.move(src, raw / src.name)
                moved.append((src, raw / src.name))
            elif src.is_dir():
                shutil.copytree(src, raw / src.name)
            else:
                shutil.copy2(src, raw / src.name)
        for name, src in folders.items():
            shutil.copytree(src, tmp / name, dirs_exist_ok=True)
        for name, content in texts.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(content, encoding="utf-8")
        os.rename(tmp, final)
    except BaseException as exc:
        _discard(tmp, moved)
        if isinstance(exc, (OSError, pa.ArrowException)):
            raise write_error(exc, final, f"cannot write run {run_id!r} in {root}: {exc}") from exc
        raise
    return final


def _run_json(run_id: str, info: RunInfo | Mapping[str, Any], trace: Trace | None) -> str:
    """The text of run.json, after checking the fields the readers rely on. A `RunInfo` gives its fields but
    those the bundle writes (schema version, run id, trace metadata) and an unset `created`."""
    if isinstance(info, RunInfo):
        info = {key: value for key, value in info.to_json().items()
                if key not in ("schema_version", "run_id", "trace") and not (key == "created" and value is None)}
    fixed = {"schema_version": SCHEMA_VERSION, "run_id": run_id}
    taken = fixed.keys() | ({"trace"} if trace is not None else set())
    reserved = sorted(taken & info.keys())
    if reserved:
        raise BundleError(f"run {run_id!r}: info may not set {', '.join(reserved)} (the bundle writes them)")
    defaults = {"created": utc_now(), "status": "ok", "error": None, "model": None, "variant": None,
                "device": None, "experiment": None}
    record = {**fixed, **defaults, **info}
    if trace is not None:
        record["trace"] = trace.metadata
    if record["status"] not in STATUSES:
        raise BundleError(f"run {run_id!r}: status {record['status']!r} is not one of {', '.join(STATUSES)}")
    if record["status"] == "failed" and not isinstance(record["error"], str):
        raise BundleError(f"run {run_id!r}: a failed run needs an error message")
    if record["experiment"] is not None and not is_valid_run_id(record["experiment"]):
        raise BundleError(f"run {run_id!r}: experiment {record['experiment']!r} is not a valid id")
    try:
        return json.dumps(json_safe(record), indent=2, allow_nan=False)
    except TypeError as exc:
        raise BundleError(f"run {run_id!r}: cannot write run.json: {exc}") from exc


def _extra_path(name: str, run_id: str, *, folder: bool = False) -> PurePath:
    """`name` as a relative path inside one of EXTRA_DIRS (the folder itself when `folder`)."""
    path = PurePath(name)
    parts = path.parts
    inside = len(parts) == 1 if folder else len(parts) >= 2
    if path.is_absolute() or ".." in parts or not parts or parts[0] not in EXTRA_DIRS or not inside:
        what = "a folder" if folder else "a file inside one"
        raise BundleError(f"run {run_id!r}: {name!r} is not {what} of the bundle's {', '.join(EXTRA_DIRS)} folders")
    return path


def _checked_sources(raw_files: Sequence[str | Path]) -> list[Path]:
    """The raw files as paths, checked to exist and to have distinct names (they share raw/)."""
    sources = [Path(p) for p in raw_files]
    names: set[str] = set()
    for src in sources:
        if not src.exists():
            raise BundleError(f"raw file {src} does not exist")
        if src.name in names:
            raise BundleError(f"two raw files are named {src.name!r}; they would collide in raw/")
        names.add(src.name)
    return sources


def _discard(tmp: Path, moved: Sequence[tuple[Path, Path]]) -> None:
    """Remove a half-written bundle, first putting moved raw files back; if one cannot go back, the
    folder is kept (with a warning) rather than lose the user's data."""
    stranded = []
    for src, dst in moved:
        try:
            shutil.move(dst, src)
        except OSError:
            stranded.append(src)
    if stranded:
        warnings.warn(f"could not put back {', '.join(map(str, stranded))}; they are in {tmp / RAW_DIR}",
                      BundleWarning, stacklevel=3)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def open_bundle(ref: str | Path, root: str | Path, *, allow_paths: bool = True) -> Bundle:
    """The bundle `ref` names: a run id under `root`, or (when `allow_paths`) the path of a bundle
    folder or of its run.json. An id is tried first and must resolve strictly inside `root`, links
    included; callers passing untrusted input (the Jupyter server) set `allow_paths=False`."""
    root = Path(root)
    try:
        if isinstance(ref, str) and is_valid_run_id(ref):
            if os.path.lexists(root / ref):
                return _read_bundle(resolve_inside(root, root / ref, f"run {ref!r}"), ref, ref)
            if not allow_paths or not os.path.lexists(ref):
                raise BundleError(f"no run {ref!r} in {shown_root(root)}")
        elif not allow_paths:
            raise BundleError(f"{str(ref)!r} is not a run id")
        path = Path(ref).expanduser()
        if path.name == RUN_JSON and path.is_file():
            path = path.parent
        if not path.exists():
            raise BundleError(f"no run {str(ref)!r}: neither a run id in {shown_root(root)} nor an existing path")
        path = path.resolve()
        return _read_bundle(path, path.name, ref)
    except BundleError as exc:
        raise BundleError(f"{exc}; {_FIND_IDS}") from exc.__cause__
    except OSError as exc:  # a name too long for the file system, a path through a file...
        raise BundleError(f"no run {str(ref)!r}: {exc.strerror or exc}; {_FIND_IDS}") from exc


def _read_bundle(path: Path, run_id: str, ref: str | Path) -> Bundle:
    """The bundle in folder `path`; `ref` is what the user asked for, for the errors."""
    if not (path / RUN_JSON).is_file():
        raise BundleError(f"{str(ref)!r}: {path} is not a run bundle (no {RUN_JSON})")
    return Bundle(path, run_id, load_record(path / RUN_JSON, f"run {str(ref)!r}"))


def list_bundles(root: str | Path, on_problem: ProblemHandler | None = None) -> list[Bundle]:
    """The bundles in `root`, oldest first. Hidden folders (temporary ones), the experiments folder and
    folders without run.json are skipped; a bundle that cannot be read is passed to `on_problem(path,
    message)` (by default a BundleWarning) and the listing goes on."""
    root = Path(root)
    if not root.is_dir():
        return []
    report = on_problem or warn_problem
    bundles = []
    for entry in root.iterdir():
        name = entry.name
        if name.startswith(".") or name == EXPERIMENTS_DIR or not (entry / RUN_JSON).is_file():
            continue
        try:
            if not is_valid_run_id(name):
                raise BundleError(f"folder {name!r} is not named by a valid run id; rename it")
            bundles.append(_read_bundle(resolve_inside(root, entry, f"run {name!r}"), name, name))
        except BundleError as exc:
            report(entry, str(exc))
    return sorted(bundles, key=lambda b: (created_time(b.info), b.run_id))


def warn_problem(path: Path, message: str) -> None:
    """The default problem handler of the listings: a BundleWarning."""
    warnings.warn(message, BundleWarning, stacklevel=3)


def delete_bundle(ref: str | Path, root: str | Path, *, allow_paths: bool = True) -> None:
    """Delete the bundle `ref` names (see `open_bundle`). It is first renamed to a hidden name, so a
    crash during removal leaves hidden debris, never a half bundle that still lists as valid."""
    bundle = open_bundle(ref, root, allow_paths=allow_paths)
    doomed = bundle.path.with_name(scratch_name("deleting", bundle.path.name))
    try:
        os.rename(bundle.path, doomed)
        shutil.rmtree(doomed)
    except OSError as exc:
        raise BundleError(f"cannot delete run {bundle.run_id!r} ({bundle.path}): {exc}") from exc
