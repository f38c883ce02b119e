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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import TraceFormatError, WorkbenchError
from workbench.trace.jsonstream import can_fork
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
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceFormatError(folder, "not a folder (give the folder holding one trace file per rank)")
    files = sorted(p for p in folder.iterdir()
                   if p.is_file() and not p.name.startswith(".") and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceFormatError(folder, f"holds no trace file ({', '.join(TRACE_SUFFIXES)})")
    return files


def read_ranks(folder: str | os.PathLike[str], workers: int | None = None, align: str = "clock") -> list[RankTrace]:
    """Read every trace file of `folder` (one per rank) and put them on one time axis; sorted by rank.

    `workers`: processes reading files at once; None is min(usable CPUs, files), 1 reads here in
    turn. The result is the same either way. `align`: "clock" or "collective" (module docstring).
    A file that cannot be read raises `TraceFormatError` naming it.
    """
    if align not in ALIGN_METHODS:
        raise WorkbenchError(f"unknown alignment {align!r}: use one of {', '.join(ALIGN_METHODS)}")
    files = trace_files(folder)
    for path in files:
        sniff_format(path)  # fail fast, before starting workers, on a file that is no trace at all
    traces = _read_all(files, workers)
    ranks = _assign_ranks(files, traces)
    return _align(ranks, align)


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


def _assign_ranks(files: list[Path], traces: list[Trace]) -> list[RankTrace]:
    """A `RankTrace` per file with its rank (not yet aligned); duplicate ranks are an error."""
    ranks: list[RankTrace] = []
    by_rank: dict[int, Path] = {}
    for order, (path, trace) in enumerate(zip(files, traces, strict=True)):
        info = distributed_info(trace)
        match = _RANK_IN_NAME.search(path.name)
        if isinstance(info.get("rank"), int):
            rank, source = info["rank"], "distributedInfo"
        elif match:
            rank, source = int(match.group(1)), "file name"
        else:
            rank, source = order, "order"
        if rank in by_rank:
            raise TraceFormatError(path, f"rank {rank} (from its {source}) is also the rank of {by_rank[rank]}: "
                                         "a folder holds one trace per rank of one job")
        by_rank[rank] = path
        world_size = info.get("world_size")
        ranks.append(RankTrace(rank=rank, path=path, trace=trace, offset_ns=0, origin_ns=absolute_origin_ns(trace),
                               world_size=world_size if isinstance(world_size, int) else None,
                               backend=info.get("backend"), rank_source=source))
    return sorted(ranks, key=lambda r: r.rank)


def _align(ranks: list[RankTrace], align: str) -> list[RankTrace]:
    """Shift each rank onto the shared axis (module docstring)."""
    axis_origin = min(r.origin_ns for r in ranks)
    offsets = [r.origin_ns - axis_origin for r in ranks]
    corrections = [0] * len(ranks)
    if align == "collective":
        ends = [_first_collective_end(r) for r in ranks]
        reference = ends[0] + offsets[0]
        corrections = [reference - (end + offset) for end, offset in zip(ends, offsets, strict=True)]
    aligned = []
    for r, offset, correction in zip(ranks, offsets, corrections, strict=True):
        total = offset + correction
        trace = shift_trace(r.trace, total)
        trace.metadata["origin_ns"] = axis_origin
        trace.metadata["rank"] = {"rank": r.rank, "world_size": r.world_size, "backend": r.backend,
                                  "rank_source": r.rank_source, "file": str(r.path), "offset_ns": total,
                                  "source_origin_ns": r.origin_ns, "align": align,
                                  "clock_correction_ns": correction}
        aligned.append(replace(r, trace=trace, offset_ns=total, clock_correction_ns=correction))
    return aligned


def _first_collective_end(rank: RankTrace) -> int:
    """End (ns, the rank's own times) of its first collective kernel; an error if it has none."""
    events = rank.trace.events
    kernels = events.filter(pc.equal(events["kind"].cast(pa.string()), "kernel"))
    names = kernels["name"].cast(pa.string()).to_numpy(zero_copy_only=False)
    hit = np.fromiter((bool(COLLECTIVE_KERNEL.match(n or "")) for n in names), dtype=bool, count=len(names))
    if not hit.any():
        raise TraceFormatError(rank.path, f"rank {rank.rank} has no collective (NCCL/RCCL) kernel to align on; "
                                          "use clock alignment for it")
    start = kernels["start_ns"].to_numpy()[hit]
    first = int(np.argmin(start))
    return int(start[first] + kernels["dur_ns"].to_numpy()[hit][first])
