"""`workbench import`: bundles from traces captured elsewhere, one per file or one per rank of a job.

Every file is read before anything is written, and the bundles (and the experiment record of a job's
ranks) are written into a staging folder and appear in the traces root together (`workbench.trace.store.staging`),
so an import is all or nothing, even when interrupted or killed. The ranks of a job go through
`workbench.rank_import`, whose workers (a local pool or a Ray cluster) write the bundles themselves.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import TraceFormatError
from workbench.paths import checked_root
from workbench.rank_import import import_rank_job
from workbench.runner import BundleFiles, NullProgress, RunFailure, Runner
from workbench.storage import location
from workbench.trace import Trace, read_trace
from workbench.trace.ranks.tasks import import_info
from workbench.trace.store.bundle import new_run_id
from workbench.trace.store.records import RunInfo

_SPECIAL_FILES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                  stat.S_IFSOCK: "a socket"}


def import_traces(paths: Sequence[str | os.PathLike[str]], root: str | os.PathLike[str]) -> list[str]:
    """Read every trace, then write one bundle per file (raw copied in); return the new run ids.

    A file that cannot be read (or is no regular file or folder: a FIFO would block the reader) raises
    `TraceFormatError` before anything is written.
    """
    root = checked_root(root, writing=True)
    runs = [_Imported(path, read_trace(path), new_run_id("import", _stem(path))) for path in map(_regular, paths)]
    _Importer(root, "import", runs).run()
    return [run.run_id for run in runs]


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
        return BundleFiles(raw_files=(run.path,), move_raw=False)

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
