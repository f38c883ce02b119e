"""A traces root on an object store (`s3://`, `gs://`, `memory://`...), read through a local mirror.

Every reader of the workbench (`ls`, `show`, `report`, the panel, the notebook) works on a folder of bundles.
For a URL root, `mirror_root` keeps such a folder in the user's cache, one per URL: each published bundle's
run.json (a prefix without run.json is no bundle yet: `workbench.trace.destination`), a `.remote.json` naming
its URL and listing its files, and the experiment records. That is all a listing needs, so `ls` reads a few
small objects per run. A bundle's other files (tables, raw/, compile/...) come down whole the first time one
of them is used (`Bundle.local_files`), into a hidden folder renamed into place, so a reader never meets a
half copy. Bundles are never changed once published: a run whose listing is unchanged is not read again; one
that vanished from the root is removed from the mirror, and one whose listing changed (deleted and written
again) is copied again.

Analyses that can run where the bundles lie (`workbench.analysis.rank_queries`) ask `remote_root` for the
URL and leave the tables there.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from workbench.errors import BundleError, WorkbenchError
from workbench.storage import Location, location
from workbench.trace.bundle import EXPERIMENTS_DIR, RUN_JSON, is_valid_run_id
from workbench.trace.scratch import make_scratch_dir, scratch_name

CACHE_ENV = "WORKBENCH_CACHE"
"""Environment variable naming the folder of the mirrors (default: ~/.cache/workbench)."""
REMOTE_JSON = ".remote.json"
"""In each mirrored bundle: `{"url": the bundle's URL, "files": {relative path: size}, "complete": bool}`."""
ROOT_JSON = ".remote-root.json"
"""In each mirror: `{"url": the traces root's URL}`."""
LOCK_FILE = ".lock"
"""In each mirror: the lock its refreshes and copy-downs take."""


def cache_dir() -> Path:
    """Where mirrors live: `$WORKBENCH_CACHE`, else ~/.cache/workbench (honouring $XDG_CACHE_HOME)."""
    chosen = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "workbench"
    return Path(chosen).expanduser().absolute()


def mirror_root(root: Location) -> Path:
    """The local mirror of the URL traces root `root`, brought up to date with its listing (module docstring)."""
    mirror = mirror_folder(root)
    try:
        with _locked(mirror):
            _sync(root, mirror)
    except OSError as exc:
        raise WorkbenchError(f"traces root {root.url}: cannot list or copy it: {exc} (its local mirror: {mirror})") \
            from exc
    return mirror


def mirror_folder(root: Location) -> Path:
    """The folder (created) of the mirror of the URL traces root `root`, as it is: not brought up to date."""
    if root.is_local:
        raise WorkbenchError(f"{root.url} is a local folder: read it in place")
    mirror = cache_dir() / "roots" / f"{root.protocol}-{hashlib.sha256(root.url.encode()).hexdigest()[:16]}"
    marker = json.dumps({"url": root.url})
    try:
        mirror.mkdir(parents=True, exist_ok=True)
        if not (mirror / ROOT_JSON).is_file() or (mirror / ROOT_JSON).read_text(encoding="utf-8") != marker:
            _write_atomic(mirror / ROOT_JSON, marker)
    except OSError as exc:
        raise WorkbenchError(f"traces root {root.url}: cannot make its mirror {mirror}: {exc}") from exc
    return mirror


def _sync(root: Location, mirror: Path) -> None:
    """Bring `mirror` up to date with the listing of `root` (the caller holds the mirror's lock)."""
    listing = _listing(root)
    _sync_records(root, mirror, listing.pop(EXPERIMENTS_DIR, {}))
    here = {p.name for p in mirror.iterdir() if p.is_dir() and not p.name.startswith(".")} - {EXPERIMENTS_DIR}
    for name in here - set(listing):
        shutil.rmtree(mirror / name, ignore_errors=True)  # gone from the root
    for run_id, files in listing.items():
        if RUN_JSON in files and is_valid_run_id(run_id):
            _sync_bundle(root.join(run_id), mirror / run_id, files)


@contextmanager
def _locked(mirror: Path) -> Iterator[None]:
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
    with _locked(folder.parent):
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
            if relative == RUN_JSON:
                continue
            target = stage / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(source.join(relative).path, str(target))
        shutil.copy2(folder / RUN_JSON, stage / RUN_JSON)
        _write_atomic(stage / REMOTE_JSON, json.dumps({**marker, "complete": True}))
        doomed = folder.with_name(scratch_name("deleting", folder.name))
        os.rename(folder, doomed)
        os.rename(stage, folder)
        shutil.rmtree(doomed, ignore_errors=True)
    except (OSError, ValueError) as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise BundleError(f"run {folder.name!r}: cannot copy it down from {source.url}: {exc}") from exc


def _listing(root: Location) -> dict[str, dict[str, int]]:
    """Top-level folder of `root` → {path below it: size}, for every file under `root`."""
    fs = root.fs()
    found = fs.find(root.path, detail=True) if fs.exists(root.path) else {}
    base = PurePosixPath(root.path)
    listing: dict[str, dict[str, int]] = defaultdict(dict)
    for name, info in found.items():
        parts = PurePosixPath(name).relative_to(base).parts
        if len(parts) >= 2 and not any(part.startswith(".") for part in parts):
            listing[parts[0]][str(PurePosixPath(*parts[1:]))] = int(info.get("size") or 0)
    return dict(listing)


def _sync_bundle(source: Location, folder: Path, files: dict[str, int]) -> None:
    """Make `folder` the mirror of bundle `source` (its run.json and marker) unless it already is."""
    try:
        known = remote_bundle(folder) if folder.is_dir() else None
    except BundleError:
        known = None  # a damaged copy: made anew
    if known is not None and known["files"] == files:
        return
    stage = make_scratch_dir(folder.parent, "tmp", folder.name)
    try:
        _write_atomic(stage / RUN_JSON, source.join(RUN_JSON).read_text())
        complete = set(files) == {RUN_JSON}
        _write_atomic(stage / REMOTE_JSON, json.dumps({"url": source.url, "files": files, "complete": complete}))
        if folder.exists():
            doomed = folder.with_name(scratch_name("deleting", folder.name))
            os.rename(folder, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        os.rename(stage, folder)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _sync_records(root: Location, mirror: Path, files: dict[str, int]) -> None:
    """The experiment records of `root` in the mirror's experiments folder, and only those."""
    records = mirror / EXPERIMENTS_DIR
    records.mkdir(exist_ok=True)
    wanted = {name for name in files if name.endswith(".json") and "/" not in name}
    for stale in {p.name for p in records.glob("*.json")} - wanted:
        (records / stale).unlink(missing_ok=True)
    for name in sorted(wanted):
        if not (records / name).is_file():  # a record, like a bundle, never changes once written
            _write_atomic(records / name, root.join(EXPERIMENTS_DIR, name).read_text())


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a hidden sibling renamed into place."""
    partial = path.with_name(scratch_name("tmp", path.name))
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)

