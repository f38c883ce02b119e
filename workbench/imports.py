"""`workbench import`: bundles from traces captured elsewhere, one per file or one per rank of a job.

Every file is read before anything is written, and the bundles (and the experiment record of a job's
ranks) are written into a staging folder and appear in the traces root together (`workbench.trace.store.staging`),
so an import is all or nothing, even when interrupted or killed. The ranks of a job go through
`workbench.rank_import`, whose workers (a local pool or a Ray cluster) write the bundles themselves.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import TraceFormatError
from workbench.paths import checked_root
from workbench.rank_import import import_rank_job
from workbench.runner import BundleFiles, NullProgress, RunFailure, Runner
from workbench.storage import location
from workbench.trace import Trace, read_trace
from workbench.trace.ranks.tasks import import_info
from workbench.trace.schema import EVENTS
from workbench.trace.store.bundle import list_bundles, new_run_id
from workbench.trace.store.records import RunInfo

_SPECIAL_FILES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                  stat.S_IFSOCK: "a socket"}


def import_traces(paths: Sequence[str | os.PathLike[str]], root: str | os.PathLike[str], *,
                  requests: str | os.PathLike[str] | None = None,
                  graph_capture: str | os.PathLike[str] | None = None) -> list[str]:
    """Read every trace, then write one bundle per file (raw copied in); return the new run ids.

    A load generator's per-request results (AIPerf, vllm bench, GuideLLM; `workbench.serving.requests`) given as
    a file become a bundle of their `requests` alone; given as `requests` beside one engine trace, they join it,
    on its clock, and to its steps. `graph_capture` (a capture trace, or a folder holding one) attributes the
    kernels the traces' CUDA/HIP graph launches replay to the ops that launched them at capture time.

    A file that cannot be read (or is no regular file or folder: a FIFO would block the reader) raises
    `TraceFormatError` before anything is written.
    """
    root = checked_root(root, writing=True)
    capture = None if graph_capture is None else read_trace(_capture_file(Path(graph_capture)))
    runs = [_read(path, capture) for path in map(_regular, paths)]
    if requests is not None:
        traces = [run for run in runs if "requests" not in run.tables]
        if len(traces) != 1:
            raise TraceFormatError(requests, "--requests joins one engine trace: give exactly one trace file")
        _join_requests(traces[0], _regular(requests))
    _Importer(root, "import", runs).run()
    return [run.run_id for run in runs]


def already_imported(paths: Sequence[str | os.PathLike[str]], root: str | os.PathLike[str]) -> dict[Path, str]:
    """Of `paths`, those imported into `root` before, with the run each became: a run imported from the same
    path whose raw copy has the file's name and size (a file changed since, or another file of that name,
    imports anew)."""
    wanted = {}
    for path in map(Path, paths):
        with contextlib.suppress(OSError):
            if path.is_file():
                wanted[str(path.resolve())] = (path, path.stat().st_size)
    found: dict[Path, str] = {}
    if not wanted or not Path(root).is_dir():
        return found
    for bundle in list_bundles(root, on_problem=lambda where, message: None):
        match = wanted.get(bundle.record.imported_from or "")
        if match is None or match[0] in found:
            continue
        path, size = match
        if any(raw.name == path.name and raw.stat().st_size == size for raw in bundle.raw_files()):
            found[path] = bundle.run_id
    return found


def _read(path: Path, capture: Trace | None) -> _Imported:
    """One file as a run: a generator's results as a bundle of requests, else a trace (with its graph kernels)."""
    from workbench.serving.requests import is_requests_file, read_requests

    if is_requests_file(path):
        results = read_requests(path)
        trace = Trace(events=EVENTS.empty_table(), metadata={"origin_ns": results.origin_ns or 0, "source": {
            "format": results.source, "file": str(path)}, "reader": {"warnings": results.warnings}})
        return _Imported(path, trace, new_run_id("import", _stem(path)), {"requests": results.table})
    trace = read_trace(path)
    tables = {}
    if capture is not None:
        from workbench.serving.graphs import graph_kernels

        if (table := graph_kernels(trace, capture)) is not None:
            tables["graph_kernels"] = table
    return _Imported(path, trace, new_run_id("import", _stem(path)), tables)


def _join_requests(run: _Imported, path: Path) -> None:
    """Put a generator's results on `run`'s trace clock and join them to its engine steps."""
    from workbench.serving.join import with_phases
    from workbench.serving.requests import read_requests
    from workbench.serving.steps import engine_steps
    from workbench.trace.ranks.multirank import absolute_origin_ns

    results = read_requests(path, origin_ns=absolute_origin_ns(run.trace))
    run.tables["requests"] = with_phases(results.table, engine_steps(run.trace))
    run.extra_raw = (path,)


def _capture_file(path: Path) -> Path:
    """A graph-capture trace: the file given, or the one trace in the folder given (vLLM writes them into
    `capture_traces/`)."""
    if not path.is_dir():
        return path
    found = sorted(p for p in path.rglob("*") if p.name.endswith((".trace.json", ".json.gz")) and p.is_file())
    if len(found) != 1:
        raise TraceFormatError(path, f"--graph-capture folder holds {len(found)} traces; give the capture trace file")
    return found[0]


def import_ranks(folder: str | os.PathLike[str], root: str | os.PathLike[str], workers: int | None = None,
                 align: str = "clock") -> tuple[str, list[str]]:
    """Read a folder of per-rank traces in this machine's worker processes, clocks aligned, write one bundle per
    rank (times on the shared axis, raw file copied in) and an experiment record grouping them; return
    (experiment id, run ids by rank). All or nothing: a file that cannot be read raises `TraceFormatError`
    naming it. `workbench.rank_import.import_rank_job` does the same on a Ray cluster or with URLs."""
    imported = import_rank_job(folder, root, align=align, workers=workers, keep_going=False)
    return imported.experiment_id, imported.run_ids


@dataclass
class _Imported(RunFailure):
    """A trace already read, to become one bundle."""

    path: Path
    trace: Trace
    run_id: str
    tables: dict[str, Any] = field(default_factory=dict)
    extra_raw: tuple[Path, ...] = ()

    @property
    def name(self) -> str:
        return self.run_id

    @property
    def subject(self) -> str:
        return f"trace {self.path}"


class _Importer(Runner[_Imported, _Imported]):
    """Imports on the runner's skeleton: every trace is read before it runs, so nothing is prepared or
    benchmarked and a run's "profile" is its trace; the bundles land together."""

    def __init__(self, root: Path, label: str, runs: list[_Imported]) -> None:
        super().__init__(root, label, NullProgress(), {}, profile=True)
        self._runs = runs

    def new_runs(self) -> list[_Imported]:
        return self._runs

    def profile_run(self, run: _Imported, folder: Path) -> Trace:
        return run.trace

    def info(self, run: _Imported) -> RunInfo:
        """Its devices and where it came from."""
        return import_info(run.run_id, run.trace, location(run.path))

    def bundle_files(self, run: _Imported) -> BundleFiles:
        return BundleFiles(raw_files=(run.path, *run.extra_raw), move_raw=False, tables=run.tables)

    def result(self, run: _Imported, path: Path) -> _Imported:
        return run


def _regular(path: str | os.PathLike[str]) -> Path:
    """`path`, refused when it is a FIFO, device or socket (reading one blocks or never ends); a missing
    path is left for the reader to report."""
    path = Path(path)
    try:
        kind = _SPECIAL_FILES.get(stat.S_IFMT(path.stat().st_mode))
    except OSError:
        return path
    if kind:
        raise TraceFormatError(path, f"{kind}, not a trace file: give a file or a profile folder")
    return path


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".sqlite", ".nsys", ".pt.trace", ".trace"):
        name = name.removesuffix(suffix)
    return name or "trace"
