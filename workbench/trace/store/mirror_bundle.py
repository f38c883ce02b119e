"""A bundle of a URL traces root as a reader meets it in the root's local mirror (`workbench.trace.store.mirror` keeps
the mirror): the markers that say a folder is a mirror (`ROOT_JSON`) or a mirrored bundle (`REMOTE_JSON`), the
copy-down of a bundle's files on first use (`Bundle.local_files`), and the lock every change of a mirror takes.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.errors import BundleError
from workbench.storage import Location, location
from workbench.trace.store.scratch import make_scratch_dir, scratch_name

REMOTE_JSON = ".remote.json"
"""In each mirrored bundle: `{"url": the bundle's URL, "files": {relative path: size}, "complete": bool}`."""
ROOT_JSON = ".remote-root.json"
"""In each mirror: `{"url": the traces root's URL}`."""
LOCK_FILE = ".lock"
"""In each mirror: the lock its refreshes and copy-downs take."""


@contextmanager
def locked(mirror: Path) -> Iterator[None]:
    """Hold the mirror's lock: a refresh and a bundle's copy-down (of any process) never interleave."""
    with open(mirror / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def remote_root(folder: Path) -> Location | None:
    """The URL root `folder` mirrors, or None when it is an ordinary folder."""
    marker = folder / ROOT_JSON
    if not marker.is_file():
        return None
    return location(json.loads(marker.read_text(encoding="utf-8"))["url"])


def shown_root(folder: Path) -> str:
    """How messages name the traces root `folder`: the URL it mirrors, else the folder."""
    remote = remote_root(folder)
    return remote.url if remote is not None else str(folder)


def remote_bundle(folder: Path) -> dict[str, Any] | None:
    """The `.remote.json` of a mirrored bundle folder, or None for a bundle that is local."""
    marker = folder / REMOTE_JSON
    if not marker.is_file():
        return None
    try:
        found = json.loads(marker.read_text(encoding="utf-8"))
        if not isinstance(found, dict) or not isinstance(found.get("files"), dict) or "url" not in found:
            raise ValueError("not a mirror marker")
    except (OSError, ValueError) as exc:
        raise BundleError(f"run {folder.name!r}: its mirror's {marker} is unreadable ({exc}); list the traces root "
                          "again to copy it anew") from exc
    return found


def download_bundle(folder: Path) -> None:
    """Copy down every file of the mirrored bundle `folder` not yet here, all at once (module docstring)."""
    if remote_bundle(folder) is None:
        return
    with locked(folder.parent):
        marker = remote_bundle(folder)
        if marker is not None and not marker["complete"]:
            _download(folder, marker)


def _download(folder: Path, marker: dict[str, Any]) -> None:
    """`download_bundle` of the bundle `marker` describes (the caller holds the mirror's lock)."""
    source = location(marker["url"])
    fs = source.fs()
    stage = make_scratch_dir(folder.parent, "tmp", folder.name)
    try:
        for relative in marker["files"]:
            target, here = stage / relative, folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if here.is_file():  # run.json: kept as listed (its time too), as bundles never change once published
                shutil.copy2(here, target)
            else:
                fs.get_file(source.join(relative).path, str(target))
        write_atomic(stage / REMOTE_JSON, json.dumps({**marker, "complete": True}))
        replace_folder(folder, stage)
    except (OSError, ValueError) as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise BundleError(f"run {folder.name!r}: cannot copy it down from {source.url}: {exc}") from exc


def replace_folder(folder: Path, stage: Path) -> None:
    """Put the finished folder `stage` in the place of `folder` (if there is one): the old one is renamed away
    first and removed after, so a reader meets the old folder or the new one, never a half of either."""
    doomed = folder.with_name(scratch_name("deleting", folder.name)) if folder.exists() else None
    if doomed is not None:
        os.rename(folder, doomed)
    os.rename(stage, folder)
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a hidden sibling renamed into place (removed if the write fails), with the
    permissions a plain write would give (the umask's)."""
    partial = path.with_name(scratch_name("tmp", path.name))
    try:
        partial.write_text(text, encoding="utf-8")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)

