"""Per-rank traces of one distributed job, read in parallel and put on one time axis.

A job traced on N ranks leaves one file per process: a Kineto trace per rank (its header's
`distributedInfo` holds `rank`, `world_size` and `backend`) or one Nsight Systems export per process.
`read_ranks(folder)` reads every trace file of a folder (`.json`, `.json.gz`, `.sqlite`; others are
left alone) in worker processes and returns one `RankTrace` per file, sorted by rank.

Rank: Kineto `distributedInfo.rank`, else a `rank<N>` in the file name (`rank3.nsys.sqlite`,
`trace_rank_3.json`), else the file's position in name order. Two files with the same rank are an
error naming both.

Clock alignment (`align="clock"`, the default): every reader gives its times as ns from the trace's
origin, and the origin's absolute time: Kineto `baseTimeNanoseconds` (0 in traces older than it,
whose timestamps are already µs since the epoch) plus the earliest timestamp; nsys the session's
`utcEpochNs` plus the earliest start, which nsys gives from the session start. Both are UTC epoch
ns, so each rank is shifted by its absolute origin minus the earliest one of all ranks: on the shared
axis 0 is the first event of the job and events that happened at the same wall-clock time line up.
Limit: this trusts the hosts' clocks. Ranks on one host share a clock and line up exactly (to the
ns: the Kineto reader keeps epoch-sized timestamps exact); ranks on several hosts are off
by their clock skew (NTP: typically 0.1-10 ms, more than a kernel). `align="collective"` corrects
that skew: it then shifts each rank further so that the end of its first collective kernel (NCCL/RCCL,
see `COLLECTIVE_KERNEL`) coincides with the lowest rank's, since a collective completes on all ranks
at nearly the same time (the last rank to arrive releases all). That needs a collective kernel on
every rank, and an error says which rank has none. The correction applied is in each rank's
`clock_correction_ns`.

A read trace keeps its metadata, plus `metadata["rank"]` (rank, world size, backend, offset, file)
and `origin_ns` set to the shared axis's origin (absolute epoch ns, before any collective correction).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.storage import Location, location
from workbench.trace.kineto.jsonstream import can_fork
from workbench.trace.model import Trace
from workbench.trace.registry import read_trace, sniff_format

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")
"""File names `read_ranks` takes from a folder (Kineto JSON and nsys SQLite exports)."""

COLLECTIVE_KERNEL = re.compile(r"^(?:nccl|rccl)", re.IGNORECASE)
"""Names of collective kernels: NCCL's `ncclKernel_AllReduce_...`, `ncclDevKernel_AllReduce_...`
(RCCL on ROCm keeps the nccl names; `rccl...` covers its own)."""

COLLECTIVE_OP = re.compile(r"^(?:(?:nccl|rccl|gloo):|c10d::)", re.IGNORECASE)
"""Names of host-side collective calls: record_function ranges `nccl:all_reduce`, `gloo:broadcast`,
and the `c10d::allreduce_` ops."""

ALIGN_METHODS = ("clock", "collective")

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace, its times on the job's shared axis.

    `offset_ns`: what was added to the trace's own times (absolute origin minus the job's, plus
    `clock_correction_ns`). `rank_source`: "distributedInfo", "file name" or "order".
    """

    rank: int
    path: Path
    trace: Trace
    offset_ns: int
    origin_ns: int
    """Absolute time (UTC epoch ns) of this rank's own origin, from its source clock."""
    world_size: int | None = None
    backend: str | None = None
    rank_source: str = "distributedInfo"
    clock_correction_ns: int = 0


def trace_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The trace files of `folder` (`TRACE_SUFFIXES`, hidden files left out), in name order."""
    return [Path(source.path) for source in rank_sources(location(folder))]


def rank_sources(folder: Location) -> list[Location]:
    """The trace files of `folder`, a local folder or a URL (`TRACE_SUFFIXES`, hidden files left out), in
    name order; a `TraceFormatError` when it is no folder or holds none."""
    if not folder.is_dir():
        raise TraceFormatError(folder.url, "not a folder (give the folder holding one trace file per rank)")
    files = [source for source in folder.files() if source.name.endswith(TRACE_SUFFIXES)]
    if not files:
        raise TraceFormatError(folder.url, f"holds no trace file ({', '.join(TRACE_SUFFIXES)})")
    return files


def read_ranks(folder: str | os.PathLike[str], workers: int | None = None, align: str = "clock") -> list[RankTrace]:
    """Read every trace file of `folder` (one per rank) and put them on one time axis; sorted by rank.

    `workers`: processes reading files at once; None is min(usable CPUs, files), 1 reads here in
    turn. The result is the same either way. `align`: "clock" or "collective" (module docstring).
    A file that cannot be read raises `TraceFormatError` naming it.
    """
    check_align(align)
    files = trace_files(folder)
    for path in files:
        sniff_format(path)  # fail fast, before starting workers, on a file that is no trace at all
    traces = _read_all(files, workers)
    facts = [rank_facts(trace, path.name) for path, trace in zip(files, traces, strict=True)]
    numbers = assign_ranks(facts, files)
    placements = place_ranks(facts, numbers, files, align)
    ranks = [RankTrace(rank=n.rank, path=path, trace=place_trace(trace, p, str(path)), offset_ns=p.offset_ns,
                       origin_ns=f.origin_ns, world_size=f.world_size, backend=f.backend, rank_source=n.source,
                       clock_correction_ns=p.correction_ns)
             for path, trace, f, n, p in zip(files, traces, facts, numbers, placements, strict=True)]
    return sorted(ranks, key=lambda r: r.rank)


def check_align(align: str) -> None:
    """Refuse an alignment method that is not one of `ALIGN_METHODS`."""
    if align not in ALIGN_METHODS:
        raise WorkbenchError(f"unknown alignment {align!r}: use one of {', '.join(ALIGN_METHODS)}")


@dataclass(frozen=True)
class RankFacts:
    """What putting a rank on the job's axis needs from its trace: small, so a worker that read the trace
    sends only this to the driver. `name`: the file's name; `info`: its `distributed_info`."""

    name: str
    info: dict[str, Any]
    origin_ns: int
    collective_end_ns: int | None
    """End (ns, the rank's own times) of its first collective kernel; None when it has none."""

    @property
    def world_size(self) -> int | None:
        size = self.info.get("world_size")
        return size if isinstance(size, int) else None

    @property
    def backend(self) -> str | None:
        return self.info.get("backend")


@dataclass(frozen=True)
class RankNumber:
    """A rank's number and where it came from: "distributedInfo", "file name" or "order"."""

    rank: int
    source: str


@dataclass(frozen=True)
class Placement:
    """Where a rank goes on the job's axis: `offset_ns` added to its times (`correction_ns` of it from
    collective alignment), `axis_origin_ns` the axis's absolute origin, and the rank's metadata entry."""

    offset_ns: int
    correction_ns: int
    axis_origin_ns: int
    rank: dict[str, Any]


def rank_facts(trace: Trace, name: str) -> RankFacts:
    """The `RankFacts` of one rank's trace (its file called `name`)."""
    return RankFacts(name=name, info=distributed_info(trace), origin_ns=absolute_origin_ns(trace),
                     collective_end_ns=first_collective_end(trace))


def assign_ranks(facts: Sequence[RankFacts], files: Sequence[object]) -> list[RankNumber]:
    """Each file's rank (module docstring), in the files' order; `files` name them in errors. Two files with
    the same rank are a `TraceFormatError` naming both."""
    numbers: list[RankNumber] = []
    by_rank: dict[int, object] = {}
    for order, (fact, path) in enumerate(zip(facts, files, strict=True)):
        match = _RANK_IN_NAME.search(fact.name)
        if isinstance(fact.info.get("rank"), int):
            number = RankNumber(fact.info["rank"], "distributedInfo")
        elif match:
            number = RankNumber(int(match.group(1)), "file name")
        else:
            number = RankNumber(order, "order")
        if number.rank in by_rank:
            raise TraceFormatError(path, f"rank {number.rank} (from its {number.source}) is also the rank of "
                                         f"{by_rank[number.rank]}: a folder holds one trace per rank of one job")
        by_rank[number.rank] = path
        numbers.append(number)
    return numbers


def place_ranks(facts: Sequence[RankFacts], numbers: Sequence[RankNumber], files: Sequence[object],
                align: str) -> list[Placement]:
    """Each rank's `Placement` on the shared axis (module docstring), in the files' order. Collective
    alignment without a collective kernel on some rank is a `TraceFormatError` naming its file."""
    check_align(align)
    axis_origin = min(f.origin_ns for f in facts)
    offsets = [f.origin_ns - axis_origin for f in facts]
    corrections = [0] * len(facts)
    if align == "collective":
        for fact, number, path in zip(facts, numbers, files, strict=True):
            if fact.collective_end_ns is None:
                raise TraceFormatError(path, f"rank {number.rank} has no collective (NCCL/RCCL) kernel to align "
                                             "on; use clock alignment for it")
        lowest = min(range(len(facts)), key=lambda i: numbers[i].rank)
        reference = int(facts[lowest].collective_end_ns) + offsets[lowest]  # type: ignore[arg-type]
        corrections = [reference - (int(f.collective_end_ns) + offset)  # type: ignore[arg-type]
                       for f, offset in zip(facts, offsets, strict=True)]
    return [Placement(offset + correction, correction, axis_origin,
                      {"rank": n.rank, "world_size": f.world_size, "backend": f.backend, "rank_source": n.source,
                       "offset_ns": offset + correction, "source_origin_ns": f.origin_ns, "align": align,
                       "clock_correction_ns": correction})
            for f, n, offset, correction in zip(facts, numbers, offsets, corrections, strict=True)]


def place_trace(trace: Trace, placement: Placement, file: str) -> Trace:
    """`trace` moved onto the job's axis, with `metadata["rank"]` (naming `file`) and the axis's `origin_ns`."""
    placed = shift_trace(trace, placement.offset_ns)
    if placed is trace:
        placed = Trace(events=trace.events, memory=trace.memory, counters=trace.counters,
                       metadata=dict(trace.metadata))
    placed.metadata["origin_ns"] = placement.axis_origin_ns
    head = {key: placement.rank[key] for key in ("rank", "world_size", "backend", "rank_source")}
    placed.metadata["rank"] = {**head, "file": file, **placement.rank}
    return placed


def shift_trace(trace: Trace, offset_ns: int) -> Trace:
    """`trace` with every time (events, memory, counters) moved by `offset_ns`."""
    if offset_ns == 0:
        return trace
    offset = pa.scalar(offset_ns, pa.int64())
    events = trace.events.set_column(0, "start_ns", pc.add(trace.events["start_ns"], offset))
    memory = trace.memory.set_column(0, "ts_ns", pc.add(trace.memory["ts_ns"], offset))
    counters = trace.counters.set_column(0, "ts_ns", pc.add(trace.counters["ts_ns"], offset))
    return Trace(events=events, memory=memory, counters=counters, metadata=dict(trace.metadata))


def absolute_origin_ns(trace: Trace) -> int:
    """The trace origin in UTC epoch ns (see the module docstring for each format)."""
    metadata = trace.metadata
    origin = int(metadata.get("origin_ns") or 0)
    if metadata.get("source", {}).get("format") == "nsys":
        session = metadata.get("session") or {}
        if not isinstance(session.get("utcEpochNs"), int):
            raise TraceFormatError(metadata["source"].get("file"), "nsys export without a session start time "
                                   "(TARGET_INFO_SESSION_START_TIME): cannot put it on the job's clock")
        origin += session["utcEpochNs"]
    return origin


def distributed_info(trace: Trace) -> dict[str, Any]:
    """Kineto's `distributedInfo` {rank, world_size, backend} of the trace ({} when it has none)."""
    header = trace.metadata.get("source", {}).get("header") or {}
    info = header.get("distributedInfo")
    if not isinstance(info, dict):
        return {}
    return {k: info[k] for k in ("rank", "world_size", "backend") if k in info}


# -- pieces -------------------------------------------------------------------------------------------


def _read_one(path: Path) -> tuple[Trace | None, str | None]:
    """Read one file (in a worker): the trace, or the problem of a workbench error as text (those
    exceptions do not survive pickling). Other errors travel as they are, with a note naming the file."""
    try:
        return read_trace(path), None
    except TraceFormatError as exc:
        return None, exc.problem
    except WorkbenchError as exc:
        return None, str(exc)
    except Exception as exc:
        exc.add_note(f"while reading {path}")
        raise


def _read_all(files: list[Path], workers: int | None) -> list[Trace]:
    """The traces of `files`, in order; in a process pool unless one worker (or one file)."""
    if workers is None:
        workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                      len(files))
    workers = max(1, min(workers, len(files)))
    if workers == 1:
        results = [_read_one(path) for path in files]
    else:
        context = multiprocessing.get_context("fork") if can_fork() else None
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            results = list(pool.map(_read_one, files))
    traces = []
    for path, (trace, problem) in zip(files, results, strict=True):
        if trace is None:
            raise TraceFormatError(path, problem or "cannot be read")
        traces.append(trace)
    return traces


def first_collective_end(trace: Trace) -> int | None:
    """End (ns, the trace's own times) of its first collective kernel; None when it has none."""
    events = trace.events
    kernels = events.filter(pc.equal(events["kind"].cast(pa.string()), "kernel"))
    names = kernels["name"].cast(pa.string()).to_numpy(zero_copy_only=False)
    hit = np.fromiter((bool(COLLECTIVE_KERNEL.match(n or "")) for n in names), dtype=bool, count=len(names))
    if not hit.any():
        return None
    start = kernels["start_ns"].to_numpy()[hit]
    first = int(np.argmin(start))
    return int(start[first] + kernels["dur_ns"].to_numpy()[hit][first])
