"""The multi-rank analyses of an imported job as distributed queries over its per-rank Parquet.

Each rank's task reads that rank's bundle where it lies (a local traces root or a URL, `workbench.storage`)
and returns its `RankPartial`; the driver combines them (`workbench.analysis.ranks.combine`), so it never
loads the job's events: what it holds grows with the number of ranks and steps, not of events. The engine
is any of `workbench.distributed` (the local pool, or Ray); the figures are the same as `rank_aggregates` over
the ranks' traces.
"""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq

from workbench.analysis.ranks import RankAggregates, RankPartial, combine, rank_partial
from workbench.distributed import Engine, Failure, LocalEngine
from workbench.errors import BundleError
from workbench.storage import Location, location
from workbench.trace.bundle import EXPERIMENTS_DIR, RUN_JSON, TABLES, open_bundle
from workbench.trace.model import Trace
from workbench.trace.records import ExperimentRecord


def bundle_trace(root: Location, run_id: str) -> Trace:
    """The trace of bundle `run_id` in `root` (memory-mapped on a local root, read through fsspec otherwise)."""
    if root.is_local:
        return open_bundle(run_id, root.local_path, allow_paths=False).trace()
    folder = root.join(run_id)
    fs = folder.fs()
    info = json.loads(folder.join(RUN_JSON).read_text())
    tables = {name: pq.read_table(folder.join(f"{name}.parquet").path, filesystem=fs) for name in TABLES}
    return Trace(**tables, metadata=dict(info.get("trace") or {}))


def bundle_partial(root: Location, run_id: str, rank: int) -> RankPartial:
    """The task of one rank: its bundle's `RankPartial`."""
    return rank_partial(rank, bundle_trace(root, run_id))


def experiment_record(root: Location, experiment_id: str) -> ExperimentRecord:
    """The experiment record `experiment_id` of `root` (a path or URL)."""
    where = root.join(EXPERIMENTS_DIR, f"{experiment_id}.json")
    try:
        return ExperimentRecord.from_json(json.loads(where.read_text()), experiment_id)
    except (OSError, ValueError) as exc:
        raise BundleError(f"experiment {experiment_id!r}: cannot read {where.url}: {exc}") from exc


def job_aggregates(root: str | os.PathLike[str] | Location, experiment_id: str, *, engine: Engine | None = None,
                   threshold: float = 0.10, mad_k: float = 2.0) -> RankAggregates:
    """The `RankAggregates` of the ranks the import `experiment_id` wrote, one task per rank on `engine` (the local
    pool by default). A rank whose bundle cannot be read raises `BundleError` naming its run."""
    root = location(root)
    record = experiment_record(root, experiment_id)
    ranks = record.ranks or []
    if not ranks:
        raise BundleError(f"experiment {experiment_id!r} is no import of a job's ranks (its record has no ranks)")
    calls = [(root, entry["run"], int(entry["rank"])) for entry in ranks]
    engine = engine or LocalEngine(1 if root.in_process else None)
    with engine:
        partials = engine.map(bundle_partial, calls)
    for (_, run_id, rank), partial in zip(calls, partials, strict=True):
        if isinstance(partial, Failure):
            raise BundleError(f"run {run_id!r} (rank {rank}): {partial.message}")
    return combine(partials, threshold, mad_k)
