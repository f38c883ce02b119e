"""Bundles and their experiment record land in the traces root together, or not at all.

An experiment (or an import of several traces) writes several bundles and one record. `staged(root,
label)` gives a hidden staging folder of the root, `.staging-<label>-<owner>-<hex>/`, laid out like a
traces root: the writer puts bundles (`write_bundle(stage, ...)`) and the record (`write_experiment(stage,
...)`) there, where no listing sees them. When the block ends, an empty `COMMITTED` file makes the group
final, then its entries are renamed into the root: the bundles first, the record last, so a record never
names a run that is not there. If the block raises (Ctrl-C included), the staging folder is removed.

A process killed with SIGKILL leaves its staging folder behind. `sweep(root)`, which every writer runs
first (`staged` itself, `workbench rm`), removes one without `COMMITTED` and finishes moving the entries
of one with it (rolls it forward); it touches only scratch entries whose owner process is gone, whatever
their kind (`.tmp-`, `.profile-`, `.deleting-`, see `workbench.trace.store.scratch`).

Staging rather than a record written first as "pending": a pending record, and the runs of an
experiment that may never finish, would be listed, and every reader would need rules for them. With
staging, readers (`workbench ls`, the panel, reports) need none: whatever is in the root is complete.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workbench.errors import BundleError, DiskFullError, write_error
from workbench.trace.store.bundle import EXPERIMENTS_DIR, RUN_JSON
from workbench.trace.store.scratch import make_scratch_dir, owner_gone, remove_entry, scratch_kind

COMMITTED = "COMMITTED"
"""The file whose presence makes a staging folder's group final (to be moved into the root)."""


@contextmanager
def staged(root: str | os.PathLike[str], label: str) -> Iterator[Path]:
    """A fresh staging folder in `root` for `label` (an experiment id, or a word such as "import"), to write
    bundles and experiment records into as into a traces root; they are published into `root` when the
    block ends normally and removed when it raises (module docstring). Leftovers of dead writers are swept
    first."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        sweep(root)
        stage = make_scratch_dir(root, "staging", label)
    except OSError as exc:
        raise write_error(exc, root, f"cannot write in the traces root {root}: {exc.strerror or exc}") from exc
    try:
        yield stage
    except DiskFullError as exc:
        remove_entry(stage)
        raise DiskFullError(root) from exc  # the staging folder's name means nothing to the user
    except BaseException:
        remove_entry(stage)
        raise
    try:
        _check_new(stage, root)
        (stage / COMMITTED).touch()
    except BaseException as exc:
        remove_entry(stage)
        if isinstance(exc, OSError):
            raise write_error(exc, root, f"cannot write in the traces root {root}: {exc.strerror or exc}") from exc
        raise
    try:
        _publish(stage, root)
    except KeyboardInterrupt:
        _publish(stage, root)  # committed: finish the few renames left before stopping
        raise
    except OSError as exc:
        raise BundleError(f"cannot move the runs of {stage.name} into {root}: {exc.strerror or exc}; the first "
                          "command that writes there after this process ends completes it") from exc


def sweep(root: str | os.PathLike[str]) -> None:
    """Clear what writers that no longer run left in `root` and its experiments folder: staging folders
    are rolled forward when committed and removed when not, other scratch entries removed. Never raises
    for an entry it cannot clear (the next sweep tries again)."""
    root = Path(root)
    for folder in (root, root / EXPERIMENTS_DIR):
        try:
            stale = [entry for entry in folder.iterdir() if owner_gone(entry.name)]
        except OSError:
            continue
        for entry in stale:
            try:
                if scratch_kind(entry.name) == "staging" and (entry / COMMITTED).is_file():
                    _publish(entry, root)
                else:
                    remove_entry(entry)
            except OSError:
                pass


def _bundles(stage: Path) -> list[Path]:
    """The bundle folders staged in `stage` (scratch entries and the records folder left out)."""
    return sorted(entry for entry in stage.iterdir()
                  if not entry.name.startswith(".") and (entry / RUN_JSON).is_file())


def _check_new(stage: Path, root: Path) -> None:
    """Refuse to commit a group holding a run id that `root` already has: a run is never overwritten."""
    taken = [bundle.name for bundle in _bundles(stage) if os.path.lexists(root / bundle.name)]
    if taken:
        raise BundleError(f"run {taken[0]!r} already exists in {root}; nothing was written")


def _publish(stage: Path, root: Path) -> None:
    """Move a committed group into `root`, bundles first and records last, then remove the staging folder.
    Idempotent: what is already in place is skipped, so a publish cut short is finished by running it again."""
    for bundle in _bundles(stage):
        if not os.path.lexists(root / bundle.name):
            os.rename(bundle, root / bundle.name)
    records = stage / EXPERIMENTS_DIR
    if records.is_dir():
        (root / EXPERIMENTS_DIR).mkdir(exist_ok=True)
        for record in sorted(records.glob("*.json")):
            if not record.name.startswith("."):
                os.replace(record, root / EXPERIMENTS_DIR / record.name)
    remove_entry(stage)
