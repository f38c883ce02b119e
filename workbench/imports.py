"""`workbench import`: bundles from traces captured elsewhere, one per file or one per rank of a job.

Every file is read before anything is written, and the bundles (and the experiment record of a job's
ranks) are written into a staging folder and appear in the traces root together (`workbench.trace.staging`),
so an import is all or nothing, even when interrupted or killed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from workbench.errors import TraceFormatError
from workbench.paths import checked_root
from workbench.trace import Trace, read_trace
from workbench.trace.bundle import new_run_id, write_bundle
from workbench.trace.experiment import write_experiment
from workbench.trace.multirank import read_ranks
from workbench.trace.staging import staged

_SPECIAL_FILES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                  stat.S_IFSOCK: "a socket"}


def import_traces(paths: Sequence[str | os.PathLike[str]], root: str | os.PathLike[str]) -> list[str]:
    """Read every trace, then write one bundle per file (raw copied in); return the new run ids.

    A file that cannot be read (or is no regular file or folder: a FIFO would block the reader) raises
    `TraceFormatError` before anything is written.
    """
    root = checked_root(root, writing=True)
    traces: list[tuple[Path, Trace]] = [(path, read_trace(path)) for path in map(_regular, paths)]
    written: list[str] = []
    with staged(root, "import") as stage:
        for path, trace in traces:
            run_id = new_run_id("import", _stem(path))
            write_bundle(stage, run_id, _import_info(path, trace), trace, raw_files=[path])
            written.append(run_id)
    return written


def import_ranks(folder: str | os.PathLike[str], root: str | os.PathLike[str], workers: int | None = None,
                 align: str = "clock") -> tuple[str, list[str]]:
    """Read a folder of per-rank traces (`workbench.trace.multirank.read_ranks`: in worker processes,
    clocks aligned), write one bundle per rank (times on the shared axis, raw file copied in) and an
    experiment record grouping them; return (experiment id, run ids by rank)."""
    folder, root = Path(folder), checked_root(root, writing=True)
    ranks = read_ranks(folder, workers=workers, align=align)
    experiment_id = new_run_id("ranks", folder.name)
    written: list[str] = []
    with staged(root, experiment_id) as stage:
        for rank in ranks:
            run_id = new_run_id("import", folder.name, f"rank{rank.rank}")
            info = _import_info(rank.path, rank.trace, variant=f"rank{rank.rank}", rank=rank.rank,
                                world_size=rank.world_size)
            write_bundle(stage, run_id, info, rank.trace, raw_files=[rank.path])
            written.append(run_id)
        sizes = {r.world_size for r in ranks if r.world_size is not None}
        write_experiment(stage, experiment_id, {
            "model": None,
            "reference": f"rank{ranks[0].rank}",
            "runs": written,
            "variants": [f"rank{r.rank}" for r in ranks],
            "ranks": [{"rank": r.rank, "run": run_id, "file": r.path.name, "offset_ns": r.offset_ns,
                       "rank_source": r.rank_source, "world_size": r.world_size}
                      for r, run_id in zip(ranks, written, strict=True)],
            "world_size": sizes.pop() if len(sizes) == 1 else (len(ranks) if not sizes else None),
            "align": align,
            "imported_from": str(folder.resolve()),
        })
    return experiment_id, written


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


def _import_info(path: Path, trace: Trace, **extra: Any) -> dict[str, Any]:
    """run.json fields of a bundle imported from `path`: its devices, where it came from, and `extra`."""
    devices = sorted(str(d) for d in pc.unique(trace.events["device"]).to_pylist() if d)
    info = {"model": None, "variant": None, "device": ",".join(devices) or "cpu", "source": "import",
            "imported_from": str(path.resolve())}
    return info | extra


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".sqlite", ".nsys", ".pt.trace", ".trace"):
        name = name.removesuffix(suffix)
    return name or "trace"
