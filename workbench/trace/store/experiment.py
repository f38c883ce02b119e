"""Experiment records: the runs of one model grouped with their reference variant.

Each is `<root>/experiments/<id>.json`:

    {"schema_version": 1, "experiment_id", "created" (ISO 8601 UTC), "model", "reference" (the
     reference variant), "runs" (run ids), plus whatever the caller adds (settings, ...)}

A record is replaced atomically (temporary file + os.replace), so readers see the old record or the
new one, never a torn file. A new experiment's record and its bundles are written into a staging folder
and moved into the root together, bundles first (`workbench.trace.store.staging`), so a killed capture never
leaves runs of an experiment whose record is missing, nor a record naming runs that are not there.
Comparisons read the bundles a record names, never live objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import BundleError, write_error
from workbench.trace.schema import SCHEMA_VERSION
from workbench.trace.store.bundle import (
    EXPERIMENTS_DIR,
    ProblemHandler,
    created_time,
    is_valid_run_id,
    json_safe,
    load_record,
    resolve_inside,
    utc_now,
    warn_problem,
)
from workbench.trace.store.records import ExperimentRecord
from workbench.trace.store.scratch import scratch_name

REQUIRED = ("model", "reference", "runs")
"""Fields every experiment record has: the model, its reference variant and the run ids."""

_FIND_IDS = "run `workbench ls` to see what the traces root holds (with --out DIR for another root)"


@dataclass
class Experiment:
    """An experiment record read from disk."""

    path: Path
    experiment_id: str
    info: dict[str, Any]

    @property
    def run_ids(self) -> list[str]:
        """The ids of the experiment's runs, in the order they were recorded."""
        return list(self.info["runs"])


def write_experiment(root: str | Path, experiment_id: str, info: ExperimentRecord | Mapping[str, Any]) -> Path:
    """Write, or atomically replace (an experiment may gain runs), the record `experiment_id` in
    `root/experiments/` and return its path. `info` needs `model`, `reference` and `runs`; `created`
    defaults to now, `schema_version` and `experiment_id` are added (an `ExperimentRecord` gives its fields
    but those two and an unset `created`, and its own schema version: 2 for a sweep)."""
    version = info.schema_version if isinstance(info, ExperimentRecord) else SCHEMA_VERSION
    if isinstance(info, ExperimentRecord):
        info = {key: value for key, value in info.to_json().items()
                if key not in ("schema_version", "experiment_id") and not (key == "created" and value is None)}
    if not is_valid_run_id(experiment_id):
        raise BundleError(f"invalid experiment id {experiment_id!r}: use letters, digits, '_', '-' and '.'")
    missing = [key for key in REQUIRED if key not in info]
    if missing:
        raise BundleError(f"experiment {experiment_id!r}: info lacks {', '.join(missing)}")
    runs = info["runs"]
    if not isinstance(runs, (list, tuple)) or not all(is_valid_run_id(r) for r in runs):
        raise BundleError(f"experiment {experiment_id!r}: runs must be a list of run ids, not {runs!r}")
    fixed = {"schema_version": version, "experiment_id": experiment_id}
    reserved = sorted(fixed.keys() & info.keys())
    if reserved:
        raise BundleError(f"experiment {experiment_id!r}: info may not set {', '.join(reserved)}")
    try:
        text = json.dumps(json_safe({**fixed, "created": utc_now(), **info}), indent=2, allow_nan=False)
    except TypeError as exc:
        raise BundleError(f"experiment {experiment_id!r}: cannot write its record: {exc}") from exc
    folder = Path(root) / EXPERIMENTS_DIR
    final = folder / f"{experiment_id}.json"
    tmp = folder / scratch_name("tmp", experiment_id, ".json")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, final)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(exc, final, f"cannot write experiment {experiment_id!r} in {folder}: {exc}") from exc
        raise
    return final


def read_experiment(root: str | Path, experiment_id: str) -> Experiment:
    """The record `experiment_id` in `root`; the id must resolve strictly inside `root/experiments`."""
    folder = Path(root) / EXPERIMENTS_DIR
    label = f"experiment {experiment_id!r}"
    if not is_valid_run_id(experiment_id):
        raise BundleError(f"{label} is not a valid experiment id; {_FIND_IDS}")
    path = folder / f"{experiment_id}.json"
    if not os.path.lexists(path):
        raise BundleError(f"no {label} in {Path(root)}; {_FIND_IDS}")
    return _load(resolve_inside(folder, path, label), experiment_id, label)


def _load(path: Path, experiment_id: str, label: str) -> Experiment:
    """The record in `path`, checked to have the required fields."""
    info = load_record(path, label)
    missing = [key for key in REQUIRED if key not in info]
    if missing:
        raise BundleError(f"{label}: malformed {path}: no {', '.join(missing)}")
    return Experiment(path, experiment_id, info)


def list_experiments(root: str | Path, on_problem: ProblemHandler | None = None) -> list[Experiment]:
    """The experiment records in `root`, oldest first. Hidden (temporary) files are skipped; a record
    that cannot be read goes to `on_problem(path, message)` (by default a BundleWarning)."""
    folder = Path(root) / EXPERIMENTS_DIR
    if not folder.is_dir():
        return []
    report = on_problem or warn_problem
    experiments = []
    for entry in folder.glob("*.json"):
        if entry.name.startswith("."):
            continue
        experiment_id = entry.name.removesuffix(".json")
        label = f"experiment {experiment_id!r}"
        try:
            if not is_valid_run_id(experiment_id):
                raise BundleError(f"{label}: {entry.name!r} is not named by a valid id; rename it")
            experiments.append(_load(resolve_inside(folder, entry, label), experiment_id, label))
        except BundleError as exc:
            report(entry, str(exc))
    return sorted(experiments, key=lambda e: (created_time(e.info), e.experiment_id))
