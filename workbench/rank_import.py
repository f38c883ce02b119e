"""`workbench import --ranks`: one bundle per rank of a distributed job, and an experiment grouping them, with
the per-rank work on an engine (`workbench.distributed`: this machine's process pool, or a Ray cluster).

One path whatever the engine: workers decode the rank files and send back their `RankFacts`; the driver
numbers the ranks and puts them on one time axis (`workbench.trace.ranks.multirank`); workers write each rank's
bundle straight to the destination (`workbench.trace.store.destination`); the driver writes the experiment record
last. The driver holds facts and run.json texts, never traces (with the local engine the traces come back
to this process, as they always have on one machine). A job whose files exceed `keep_budget` is decoded
twice instead: for its facts, then by each rank's write, so memory holds a trace per worker, not the job.

A rank that fails (its file unreadable, its worker lost): with `keep_going` (the default, on every engine: one
bad file of hundreds should not discard the rest) it is reported by file name in `RankImport.failed` and in
the record (`failed`, `failed_ranks`) and the others are kept; without it the import raises
`TraceFormatError` naming the file and writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.distributed import Engine, Failure, LocalEngine, engine_for
from workbench.errors import TraceFormatError, WorkbenchError
from workbench.machine import available_memory
from workbench.paths import checked_root
from workbench.runner import NullProgress, Progress
from workbench.storage import Location, location
from workbench.trace.ranks.multirank import RankFacts, assign_ranks, check_align, place_ranks, rank_sources
from workbench.trace.ranks.tasks import decode_rank, write_rank
from workbench.trace.registry import sniff_format
from workbench.trace.store.bundle import new_run_id
from workbench.trace.store.destination import publishing
from workbench.trace.store.records import ExperimentRecord

READ_TASK = "read ranks"
WRITE_TASK = "write ranks"


def keep_budget() -> int:
    """Input bytes of a job whose decoded traces are kept between the import's two steps: a quarter of this
    machine's free memory (a decoded Kineto trace takes about its file's size). A larger job is decoded twice,
    once for its facts and once by the write of each rank, so that no more than a trace per worker is held."""
    return available_memory() // 4


@dataclass(frozen=True)
class RankImport:
    """The outcome of an import of ranks: the experiment, its runs by rank, and the files that failed with why."""

    experiment_id: str
    run_ids: list[str]
    failed: dict[str, str] = field(default_factory=dict)


def import_rank_job(folder: str | os.PathLike[str] | Location, root: str | os.PathLike[str] | Location, *,
                    align: str = "clock", cluster: str = "local", workers: int | None = None,
                    keep_going: bool = True, progress: Progress | None = None,
                    engine: Engine | None = None) -> RankImport:
    """Import the folder of per-rank traces `folder` (a path or URL) into the traces root `root` (a path or URL):
    see the module docstring. `cluster` picks the engine (`engine_for`; `engine` gives one ready-made), `workers`
    sizes the local pool, `progress` gets a bar over the ranks for reading and one for writing."""
    check_align(align)
    source, target = location(folder), location(root)
    if target.is_local:
        target = location(checked_root(target.path, writing=True))
    sources = rank_sources(source)
    for src in sources:
        if src.is_local:
            sniff_format(src.path)  # fail fast, before starting workers, on a file that is no trace at all
    if engine is None:
        in_process = source.in_process or target.in_process  # memory:// is seen by this process only
        engine = LocalEngine(1) if in_process and cluster == "local" else engine_for(cluster, workers)
    if engine.distributed and (source.in_process or target.in_process):
        raise WorkbenchError("memory:// lives in this process only: a cluster's workers cannot reach it")
    with engine:
        return _Import(source, target, sources, align, engine, keep_going, progress or NullProgress()).run()


class _Import:
    """The steps of one import (module docstring)."""

    def __init__(self, folder: Location, root: Location, sources: list[Location], align: str, engine: Engine,
                 keep_going: bool, progress: Progress) -> None:
        self.folder, self.root, self.sources, self.align = folder, root, sources, align
        self.engine, self.keep_going, self.progress = engine, keep_going, progress
        self.failed: dict[str, str] = {}

    def run(self) -> RankImport:
        keep_traces = sum(src.size() for src in self.sources) <= keep_budget()
        decoded = self._tasks(READ_TASK, decode_rank, [(src, keep_traces) for src in self.sources], keep=True)
        kept = [(src, result) for src, result in zip(self.sources, decoded, strict=True)
                if self._ok(src, result[0])]
        if not kept:
            raise WorkbenchError(f"{self.folder.url}: no rank could be read ({len(self.failed)} failed)")
        facts: list[RankFacts] = [result[0] for _, result in kept]
        sources = [src for src, _ in kept]
        files = [src.url for src in sources]
        numbers = assign_ranks(facts, files)
        placements = place_ranks(facts, numbers, files, self.align)
        order = sorted(range(len(kept)), key=lambda i: numbers[i].rank)
        run_ids = {i: new_run_id("import", self.folder.name, f"rank{numbers[i].rank}") for i in order}
        experiment_id = new_run_id("ranks", self.folder.name)
        with publishing(self.root, experiment_id, list(run_ids.values())) as publisher:
            calls = [(kept[i][1][1] if keep_traces else None, placements[i], sources[i], publisher.destination,
                      run_ids[i]) for i in order]
            del kept, decoded  # the traces' handles: the engine may free each trace once its bundle is written
            written = self._tasks(WRITE_TASK, write_rank, calls)
            done = [i for i, result in zip(order, written, strict=True) if self._ok(sources[i], result)]
            if not done:
                raise WorkbenchError(f"{self.folder.url}: no rank could be written ({len(self.failed)} failed)")
            texts = {run_ids[i]: result for i, result in zip(order, written, strict=True) if i in done}
            publisher.publish(texts, experiment_id, self._record(experiment_id, facts, numbers, placements, files,
                                                                 [(i, run_ids[i]) for i in done]))
        return RankImport(experiment_id, [run_ids[i] for i in done], dict(self.failed))

    def _tasks(self, task: str, fn: Any, calls: Sequence[tuple[Any, ...]], keep: bool = False) -> list[Any]:
        self.progress.start(task, len(calls))
        results = self.engine.map(fn, calls, keep=keep, on_done=lambda: self.progress.advance(task))
        self.progress.finish(task)
        return results

    def _ok(self, source: Location, result: Any) -> bool:
        """Whether a task's result is no `Failure`; a failure is kept by file name, or raised without keep_going."""
        if not isinstance(result, Failure):
            return True
        if not self.keep_going:
            raise TraceFormatError(source.url, result.message)
        self.failed[source.name] = result.message
        return False

    def _record(self, experiment_id: str, facts: list[RankFacts], numbers: list[Any], placements: list[Any],
                files: list[str], runs: list[tuple[int, str]]) -> ExperimentRecord:
        """The experiment record of the ranks written (`runs`: index, run id, in rank order)."""
        sizes = {facts[i].world_size for i, _ in runs if facts[i].world_size is not None}
        failed = sorted(self.failed)
        record = ExperimentRecord(
            model=None, reference=f"rank{numbers[runs[0][0]].rank}", runs=[run_id for _, run_id in runs],
            variants=[f"rank{numbers[i].rank}" for i, _ in runs],
            ranks=[{"rank": numbers[i].rank, "run": run_id, "file": facts[i].name,
                    "offset_ns": placements[i].offset_ns, "rank_source": numbers[i].source,
                    "world_size": facts[i].world_size} for i, run_id in runs],
            world_size=sizes.pop() if len(sizes) == 1 else (len(runs) if not sizes else None), align=self.align,
            imported_from=str(os.path.realpath(self.folder.path)) if self.folder.is_local else self.folder.url,
            failed=failed, extra={"failed_ranks": [{"file": name, "error": self.failed[name]} for name in failed]}
            if failed else {})
        record.experiment_id = experiment_id
        return record
