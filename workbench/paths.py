"""Where the workbench keeps its files on disk, resolved when asked (never at import time)."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.storage import is_url, location

TRACES_ENV = "WORKBENCH_TRACES"
"""Environment variable that sets the traces root when no `--out` is given."""


def traces_root(out: str | Path | None = None) -> Path:
    """The traces root as an absolute path: `out` (the `--out` option) wins, then `$WORKBENCH_TRACES`,
    then `./traces` in the current directory. An empty environment variable counts as unset."""
    chosen = out if out is not None else os.environ.get(TRACES_ENV) or "traces"
    return Path(chosen).expanduser().absolute()


def checked_root(out: str | Path | None = None, *, writing: bool) -> Path:
    """`traces_root(out)`, checked before any work: a folder, or (`writing`) a place where one can be
    created and written in. Raises WorkbenchError naming the root and where it was set otherwise (a
    `$WORKBENCH_TRACES` pointing at a file, `--out` under a file, a read-only folder, a name too long)."""
    origin = "--out" if out is not None else f"${TRACES_ENV}" if os.environ.get(TRACES_ENV) else "the default"
    url = _chosen_url(out)
    if url is not None:
        return _url_root(url, origin, writing=writing)
    root = traces_root(out)
    where = f"traces root {root} (from {origin})"
    if writing:
        _check_writable(root, where)
    else:
        _check_folder(root, where)
    return root


def root_where_it_lies(out: str | Path | None = None, *, writing: bool = False) -> str | Path:
    """The traces root for work that reads or writes bundles where they lie (`workbench import --ranks`,
    `workbench.analysis.rank_queries`): a URL (`out`, else `$WORKBENCH_TRACES`) as it is, with no local mirror
    made; a folder `checked_root` checked."""
    url = _chosen_url(out)
    return url if url is not None else checked_root(out, writing=writing)


def _chosen_url(out: str | Path | None) -> str | None:
    """The URL `out` (else `$WORKBENCH_TRACES`) names as the traces root, or None for a folder."""
    chosen = out if out is not None else os.environ.get(TRACES_ENV)
    return str(chosen) if chosen is not None and is_url(str(chosen)) else None


def _url_root(url: str, origin: str, *, writing: bool) -> Path:
    """The folder to use for the URL traces root `url`: the local folder of a `file://` URL, else (reading) its
    local mirror (`workbench.trace.store.mirror`); writing goes only through `workbench import --ranks`."""
    where = location(url)
    if where.is_local:
        return checked_root(where.local_path, writing=writing)
    if writing:
        raise WorkbenchError(f"traces root {url} (from {origin}) is a URL: only `workbench import --ranks` writes "
                             "to one; give a folder here (and import its runs, or copy the bundles, afterwards)")
    from workbench.trace.store.mirror import mirror_root

    return mirror_root(where)


def checked_output(path: str | Path) -> Path:
    """`path` (a file to write, such as a report) as an absolute path, checked before any work: not a
    folder, in a folder that exists or can be created, writable, with names the file system takes."""
    path = Path(path).expanduser().absolute()
    where = f"output file {path}"
    if _nearest_existing(path, where) != path:
        _check_writable(path, where)
    elif path.is_dir():
        raise WorkbenchError(f"{where} is a folder; give a file name")
    else:
        _check_writable(path.parent, where)  # an existing file is replaced
    return path


def _check_folder(path: Path, where: str) -> Path:
    """Raise WorkbenchError unless `path` is a folder or does not exist under a folder; return the nearest
    of `path` and its ancestors that exists."""
    existing = _nearest_existing(path, where)
    if not existing.is_dir():
        what = "is not a folder" if existing == path else f"lies under {existing}, which is not a folder"
        raise WorkbenchError(f"{where} {what}")
    return existing


def _check_writable(path: Path, where: str) -> None:
    """Raise WorkbenchError unless `path` is a writable folder or can be created in one."""
    existing = _check_folder(path, where)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise WorkbenchError(f"{where}: {existing} is not writable")
    if any(len(os.fsencode(part)) > _name_max(existing) for part in path.relative_to(existing).parts):
        raise WorkbenchError(f"{where}: File name too long")


def _nearest_existing(path: Path, where: str) -> Path:
    """`path` or its nearest ancestor that exists (a folder, a file, a link)."""
    existing = path
    while not os.path.lexists(existing) and existing.parent != existing:
        try:
            existing.stat()
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:  # a name too long, a loop of links...
            raise WorkbenchError(f"{where}: {exc.strerror or exc}") from exc
        existing = existing.parent
    return existing


def _name_max(folder: Path) -> int:
    """The longest file name, in bytes, that the file system of `folder` takes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # AttributeError: no pathconf (Windows)
        return 255
