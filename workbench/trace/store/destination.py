"""Where the workers of a multi-rank import write its bundles, and how the driver makes them visible.

A local traces root (a path, or `file://`) keeps the staging of `workbench.trace.store.staging`: workers write each
bundle (`write_bundle`, atomic rename) into the import's staging folder, the driver writes the experiment
record there, and the group moves into the root together. An object store (`s3://`, `gs://`, `memory://`) has
no rename: workers write each bundle's tables and raw file under its final prefix, `<root>/<run-id>/`, but not
its run.json, which they return as text; such a prefix is no bundle for any reader (a bundle is a folder
with a run.json). The driver commits by writing every run.json, then the record last; until the record
exists the import has no experiment. If the import fails or is interrupted, the driver removes every prefix
it planned. A driver killed outright leaves prefixes without run.json, which no listing shows.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workbench.storage import Location
from workbench.trace.model import Trace
from workbench.trace.store.bundle import EXPERIMENTS_DIR, RUN_JSON, write_bundle
from workbench.trace.store.experiment import write_experiment
from workbench.trace.store.records import ExperimentRecord, RunInfo
from workbench.trace.store.staging import staged


@dataclass(frozen=True)
class Destination:
    """What a worker needs to write one bundle of an import (small and picklable): the traces root and, for a
    local root, the staging folder."""

    root: Location
    stage: str | None

    def write(self, run_id: str, info: RunInfo, trace: Trace, raw: Location) -> str | None:
        """Write the bundle of `run_id` with `raw` (the input file) in raw/. Returns None when the bundle is
        complete (in the staging folder), else its run.json's text for the driver to commit."""
        with tempfile.TemporaryDirectory(prefix="workbench-bundle-") as tmp:
            raw_file = raw.copy_to_local(Path(tmp) / raw.name)
            moved = not raw.is_local  # a downloaded copy moves in; a local input is copied, as before
            if self.stage is not None:
                write_bundle(Path(self.stage), run_id, info, trace, raw_files=(raw_file,), move_raw=moved)
                return None
            bundle = write_bundle(Path(tmp) / "root", run_id, info, trace, raw_files=(raw_file,), move_raw=moved)
            target = self.root.join(run_id)
            try:
                target.upload(bundle, skip=(RUN_JSON,))
            except BaseException:
                target.remove()
                raise
            return (bundle / RUN_JSON).read_text(encoding="utf-8")


class Publisher:
    """The driver's side of a `Destination`: `publish` makes the written bundles and their record visible."""

    def __init__(self, destination: Destination) -> None:
        self.destination = destination

    def publish(self, run_jsons: Mapping[str, str | None], experiment_id: str, record: ExperimentRecord) -> None:
        """Write the run.json texts the workers returned (object stores), then the record, last."""
        root, stage = self.destination.root, self.destination.stage
        if stage is not None:
            write_experiment(stage, experiment_id, record)
            return
        for run_id, text in run_jsons.items():
            if text is not None:
                root.join(run_id, RUN_JSON).write_text(text)
        with tempfile.TemporaryDirectory(prefix="workbench-record-") as tmp:
            written = write_experiment(tmp, experiment_id, record)
            root.join(EXPERIMENTS_DIR, written.name).write_text(written.read_text(encoding="utf-8"))


@contextmanager
def publishing(root: Location, label: str, run_ids: Sequence[str]) -> Iterator[Publisher]:
    """A `Publisher` for the bundles `run_ids` of one import (module docstring): on a local root, inside the
    import's staging folder, published when the block ends; on an object store, the planned prefixes are
    removed if the block raises (Ctrl-C included)."""
    if root.is_local:
        with staged(root.local_path, label) as stage:
            yield Publisher(Destination(root, str(stage)))
        return
    try:
        yield Publisher(Destination(root, None))
    except BaseException:
        for run_id in run_ids:
            root.join(run_id).remove()
        raise
