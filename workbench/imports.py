"""`workbench import`: bundles from traces captured elsewhere, one per file or one per rank of a job.

Every file is read before anything is written, and a failure while writing removes what the call
already wrote, so an import is all or nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from workbench.trace import Trace, read_trace
from workbench.trace.bundle import delete_bundle, new_run_id, write_bundle
from workbench.trace.experiment import write_experiment
from workbench.trace.multirank import read_ranks


def import_traces(paths: Sequence[str | os.PathLike[str]], root: Path) -> list[str]:
    """Read every trace, then write one bundle per file (raw copied in); return the new run ids.

    A file that cannot be read raises `TraceFormatError` before anything is written.
    """
    traces: list[tuple[Path, Trace]] = [(Path(p), read_trace(p)) for p in paths]
    with _all_or_nothing(root) as written:
        for path, trace in traces:
            run_id = new_run_id("import", _stem(path))
            write_bundle(root, run_id, _import_info(path, trace), trace, raw_files=[path])
            written.append(run_id)
    return written


def import_ranks(folder: str | os.PathLike[str], root: str | os.PathLike[str], workers: int | None = None,
                 align: str = "clock") -> tuple[str, list[str]]:
    """Read a folder of per-rank traces (`workbench.trace.multirank.read_ranks`: in worker processes,
    clocks aligned), write one bundle per rank (times on the shared axis, raw file copied in) and an
    experiment record grouping them; return (experiment id, run ids by rank)."""
    folder, root = Path(folder), Path(root)
    ranks = read_ranks(folder, workers=workers, align=align)
    with _all_or_nothing(root) as written:
        for rank in ranks:
            run_id = new_run_id("import", folder.name, f"rank{rank.rank}")
            info = _import_info(rank.path, rank.trace, variant=f"rank{rank.rank}", rank=rank.rank,
                                world_size=rank.world_size)
            write_bundle(root, run_id, info, rank.trace, raw_files=[rank.path])
            written.append(run_id)
        sizes = {r.world_size for r in ranks if r.world_size is not None}
        experiment_id = new_run_id("ranks", folder.name)
        write_experiment(root, experiment_id, {
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


@contextmanager
def _all_or_nothing(root: Path) -> Iterator[list[str]]:
    """A list to add written run ids to; if the block raises, those bundles are deleted."""
    written: list[str] = []
    try:
        yield written
    except BaseException:
        for run_id in written:
            delete_bundle(run_id, root)
        raise


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
