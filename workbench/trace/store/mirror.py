"""A traces root on an object store (`s3://`, `gs://`, `memory://`...), read through a local mirror.

Every reader of the workbench (`ls`, `show`, `report`, the panel, the notebook) works on a folder of bundles.
For a URL root, `mirror_root` keeps such a folder in the user's cache, one per URL: each published bundle's
run.json (a prefix without run.json is no bundle yet: `workbench.trace.store.destination`), a `.remote.json` naming
its URL and listing its files, and the experiment records. That is all a listing needs, so `ls` reads a few
small objects per run. A bundle's other files (tables, raw/, compile/...) come down whole the first time one
of them is used (`Bundle.local_files`), into a hidden folder renamed into place, so a reader never meets a
half copy. Bundles are never changed once published: a run whose listing is unchanged is not read again; one
that vanished from the root is removed from the mirror, and one whose listing changed (deleted and written
again) is copied again.

What readers meet in a mirror (its markers, the copy-down, the lock) is `workbench.trace.store.mirror_bundle`.
Analyses that can run where the bundles lie (`workbench.analysis.rank_queries`) ask its `remote_root` for the
URL and leave the tables there.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import defaultdict
from pathlib import Path, PurePosixPath

from workbench.cache import cache_dir
from workbench.errors import BundleError, WorkbenchError
from workbench.storage import Location
from workbench.trace.store.bundle import EXPERIMENTS_DIR, RUN_JSON, is_valid_run_id
from workbench.trace.store.mirror_bundle import (
    REMOTE_JSON,
    ROOT_JSON,
    locked,
    remote_bundle,
    replace_folder,
    write_atomic,
)
from workbench.trace.store.scratch import make_scratch_dir


def mirror_root(root: Location) -> Path:
    """The local mirror of the URL traces root `root`, brought up to date with its listing (module docstring)."""
    mirror = mirror_folder(root)
    try:
        with locked(mirror):
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
            write_atomic(mirror / ROOT_JSON, marker)
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
        write_atomic(stage / RUN_JSON, source.join(RUN_JSON).read_text())
        complete = set(files) == {RUN_JSON}
        write_atomic(stage / REMOTE_JSON, json.dumps({"url": source.url, "files": files, "complete": complete}))
        replace_folder(folder, stage)
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
            write_atomic(records / name, root.join(EXPERIMENTS_DIR, name).read_text())


