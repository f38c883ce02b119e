"""The two tasks of a multi-rank import, run where the engine puts them (`workbench.distributed`): a worker
decodes one rank's file and sends the driver its small `RankFacts` (the trace stays with the engine, or, for a
job too large to hold, is dropped and decoded again by the write), then, once the driver has put every rank on
the job's axis, a worker writes that rank's bundle straight to the destination. Neither sends a trace through
the driver.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.compute as pc

from workbench.storage import Location
from workbench.trace.model import Trace
from workbench.trace.ranks.multirank import Placement, RankFacts, place_trace, rank_facts
from workbench.trace.registry import read_trace
from workbench.trace.store.destination import Destination
from workbench.trace.store.records import RunInfo


def decode_rank(source: Location, keep_trace: bool = True) -> tuple[RankFacts, Trace | None]:
    """Read one rank's trace file (downloaded to a temporary file first when it is not local); its facts and
    its trace (None without `keep_trace`: the write decodes the file again). A file that cannot be read raises
    `TraceFormatError`."""
    trace = _read(source)
    return rank_facts(trace, source.name), trace if keep_trace else None


def write_rank(trace: Trace | None, placement: Placement, source: Location, destination: Destination,
               run_id: str) -> str | None:
    """Put `trace` (None: `source` decoded again) on the job's axis and write its bundle (`Destination.write`:
    None, or the run.json text to commit)."""
    placed = place_trace(trace if trace is not None else _read(source), placement, source.url)
    rank = placement.rank
    info = import_info(run_id, placed, source, rank=rank["rank"], world_size=rank["world_size"])
    return destination.write(run_id, info, placed, source)


def _read(source: Location) -> Trace:
    """The trace of rank file `source`, wherever it lies."""
    with tempfile.TemporaryDirectory(prefix="workbench-rank-") as tmp:
        trace = read_trace(source.copy_to_local(Path(tmp) / source.name))
    if not source.is_local and isinstance(trace.metadata.get("source"), dict):
        trace.metadata["source"]["file"] = source.url  # not the temporary copy's path
    return trace


def import_info(run_id: str, trace: Trace, source: Location, *, rank: int | None = None,
                world_size: int | None = None) -> RunInfo:
    """The run.json of an imported trace: its devices, where it came from, and for a rank its rank and world size."""
    devices = sorted(str(d) for d in pc.unique(trace.events["device"]).to_pylist() if d)
    imported_from = str(Path(source.path).resolve()) if source.is_local else source.url
    return RunInfo(run_id=run_id, device=",".join(devices) or "cpu", source="import", imported_from=imported_from,
                   variant=None if rank is None else f"rank{rank}", rank=rank, world_size=world_size)
