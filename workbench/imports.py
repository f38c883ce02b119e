"""`workbench import`: bundles from traces captured elsewhere, one per file or one per rank of a job.

Every file is read before anything is written, and the bundles (and the experiment record of a job's
ranks) are written into a staging folder and appear in the traces root together (`workbench.trace.staging`),
so an import is all or nothing, even when interrupted or killed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

from workbench.errors import TraceFormatError
from workbench.paths import checked_root
from workbench.runner import BundleFiles, NullProgress, RunFailure, Runner
from workbench.trace import Trace, read_trace
from workbench.trace.bundle import new_run_id
from workbench.trace.multirank import RankTrace, read_ranks
from workbench.trace.records import ExperimentRecord, RunInfo

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
    """Read a folder of per-rank traces (`workbench.trace.multirank.read_ranks`: in worker processes,
    clocks aligned), write one bundle per rank (times on the shared axis, raw file copied in) and an
    experiment record grouping them; return (experiment id, run ids by rank)."""
    folder, root = Path(folder), checked_root(root, writing=True)
    ranks = read_ranks(folder, workers=workers, align=align)
    runs = [_Imported(rank.path, rank.trace, new_run_id("import", folder.name, f"rank{rank.rank}"), rank)
            for rank in ranks]
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    record = ExperimentRecord(
        model=None, reference=f"rank{ranks[0].rank}", runs=[run.run_id for run in runs],
        variants=[f"rank{r.rank}" for r in ranks],
        ranks=[{"rank": r.rank, "run": run.run_id, "file": r.path.name, "offset_ns": r.offset_ns,
                "rank_source": r.rank_source, "world_size": r.world_size} for r, run in zip(ranks, runs, strict=True)],
        world_size=sizes.pop() if len(sizes) == 1 else (len(ranks) if not sizes else None), align=align,
        imported_from=str(folder.resolve()))
    experiment_id = new_run_id("ranks", folder.name)
    _Importer(root, experiment_id, runs, record).run()
    return experiment_id, [run.run_id for run in runs]


@dataclass
class _Imported(RunFailure):
    """A trace already read, to become one bundle (a rank's, when `rank` is given)."""

    path: Path
    trace: Trace
    run_id: str
    rank: RankTrace | None = None

    @property
    def name(self) -> str:
        return self.run_id

    @property
    def subject(self) -> str:
        return f"trace {self.path}"


class _Importer(Runner[_Imported, _Imported]):
    """Imports on the runner's skeleton: every trace is read before it runs, so nothing is prepared or
    benchmarked and a run's "profile" is its trace; bundles (and the record of a job's ranks) land together."""

    def __init__(self, root: Path, label: str, runs: list[_Imported], record: ExperimentRecord | None = None) -> None:
        super().__init__(root, label, NullProgress(), {}, profile=True)
        self._runs, self._record = runs, record
        if record is not None:
            record.experiment_id = label

    def new_runs(self) -> list[_Imported]:
        return self._runs

    def profile_run(self, run: _Imported, folder: Path) -> Trace:
        return run.trace

    def info(self, run: _Imported) -> RunInfo:
        """Its devices, where it came from, and for a rank its rank and world size."""
        devices = sorted(str(d) for d in pc.unique(run.trace.events["device"]).to_pylist() if d)
        rank = run.rank
        return RunInfo(run_id=run.run_id, device=",".join(devices) or "cpu", source="import",
                       imported_from=str(run.path.resolve()), variant=None if rank is None else f"rank{rank.rank}",
                       rank=None if rank is None else rank.rank, world_size=None if rank is None else rank.world_size)

    def bundle_files(self, run: _Imported) -> BundleFiles:
        return BundleFiles(raw_files=(run.path,), move_raw=False)

    def record(self, runs: list[_Imported]) -> ExperimentRecord | None:
        return self._record

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
