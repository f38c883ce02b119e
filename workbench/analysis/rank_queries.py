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
from collections.abc import Sequence

import pyarrow.parquet as pq

from workbench.analysis.ranks import RankAggregates, RankPartial, combine, rank_partial
from workbench.distributed import Engine, Failure, LocalEngine
from workbench.errors import BundleError, WorkbenchError
from workbench.storage import Location, location
from workbench.trace.model import Trace
from workbench.trace.store.bundle import EXPERIMENTS_DIR, RUN_JSON, TABLES, Bundle, is_valid_run_id, open_bundle
from workbench.trace.store.mirror_bundle import remote_root
from workbench.trace.store.records import ExperimentRecord


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
    if not is_valid_run_id(experiment_id):
        raise BundleError(f"{experiment_id!r} is not an experiment id")
    where = root.join(EXPERIMENTS_DIR, f"{experiment_id}.json")
    try:
        return ExperimentRecord.from_json(json.loads(where.read_text()), experiment_id)
    except FileNotFoundError as exc:
        raise BundleError(f"no experiment {experiment_id!r} in {root.url} (no {where.url}); the id is the one "
                          "`workbench import --ranks` printed") from exc
    except (OSError, ValueError) as exc:
        raise BundleError(f"experiment {experiment_id!r}: cannot read {where.url}: {exc}") from exc


def job_aggregates(root: str | os.PathLike[str] | Location, experiment_id: str, *, engine: Engine | None = None,
                   threshold: float = 0.10, mad_k: float = 2.0) -> RankAggregates:
    """The `RankAggregates` of the ranks the import `experiment_id` wrote, one task per rank on `engine` (the local
    pool by default). `root` may be a URL, or the local mirror of one (`workbench.trace.store.mirror`: the ranks are
    then read at the URL). A rank whose bundle cannot be read raises `BundleError` naming its run."""
    root = location(root)
    if root.is_local:
        root = remote_root(root.local_path) or root
    record = experiment_record(root, experiment_id)
    ranks = record.ranks or []
    if not ranks:
        raise BundleError(f"experiment {experiment_id!r} is no import of a job's ranks (its record has no ranks)")
    calls = [(root, entry["run"], int(entry["rank"])) for entry in ranks]
    return _aggregates(calls, engine or LocalEngine(1 if root.in_process else None), threshold, mad_k)


def bundles_aggregates(bundles: Sequence[Bundle], *, engine: Engine | None = None, threshold: float = 0.10,
                       mad_k: float = 2.0) -> RankAggregates:
    """The `RankAggregates` of the bundles of a job's ranks (each with its rank), one task per rank on `engine`
    (this process by default: the report and the panel call it), reading each bundle where it lies: its traces
    root, or the URL root a mirrored bundle comes from (`workbench.trace.store.mirror`), so no table is copied here."""
    calls = [(remote_root(bundle.path.parent) or location(bundle.path.parent), bundle.run_id, int(bundle.record.rank))
             for bundle in bundles]
    return _aggregates(calls, engine or LocalEngine(1), threshold, mad_k)


def _aggregates(calls: list[tuple[Location, str, int]], engine: Engine, threshold: float,
                mad_k: float) -> RankAggregates:
    """`bundle_partial` of every call on `engine`, combined; the first rank that failed raises `BundleError`."""
    if engine.distributed and any(root.in_process for root, _, _ in calls):
        raise WorkbenchError("memory:// lives in this process only: a cluster's workers cannot reach it")
    with engine:
        partials = engine.map(bundle_partial, calls)
    for (_, run_id, rank), partial in zip(calls, partials, strict=True):
        if isinstance(partial, Failure):
            named = partial.message if run_id in partial.message else f"run {run_id!r}: {partial.message}"
            raise BundleError(f"rank {rank}: {named}")
    return combine(partials, threshold, mad_k)
