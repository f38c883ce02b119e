"""Where traces and bundles live: a local path, or an fsspec URL (`file://`, `memory://`, `s3://`, `gs://`...).

A `Location` is what a URL or path names, small and picklable, so that the workers of a distributed import
(`workbench.distributed`) are handed locations and read inputs and write bundles themselves: the driver never
touches their bytes. A plain path and a `file://` URL are *local*: they keep the local file system's rename,
which the traces root's atomicity rests on (`workbench.trace.store.staging`). Every other protocol is an *object
store*: no rename, so a bundle written there becomes visible by its run.json, written last, and an import by
its experiment record, written after all of them (docs/ARCHITECTURE.md, "Nothing half-kept").

A protocol whose package is not installed (`s3://` without s3fs) is a one-line error naming the package.
`memory://` lives inside one process: it is for tests, and imports that use it run their tasks here.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from workbench.errors import WorkbenchError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
LOCAL_PROTOCOLS = ("file", "local")


def is_url(text: str | os.PathLike[str]) -> bool:
    """Whether `text` is a URL with a protocol (`s3://...`), not a plain path."""
    return isinstance(text, str) and _SCHEME.match(text) is not None


@dataclass(frozen=True)
class Location:
    """A folder or file named by a path or URL. `protocol` is "file" for local paths; `path` is the
    filesystem's own path (no protocol). Credentials come from the filesystem's usual configuration (the
    environment, ~/.aws...), on every host that uses the location."""

    protocol: str
    path: str

    @property
    def is_local(self) -> bool:
        """Whether this is on the local file system (where renames are atomic)."""
        return self.protocol in LOCAL_PROTOCOLS

    @property
    def in_process(self) -> bool:
        """Whether the data lives in this process's memory only (`memory://`): other processes cannot see it."""
        return self.protocol == "memory"

    @property
    def local_path(self) -> Path:
        """The local path (only for a local location)."""
        if not self.is_local:
            raise WorkbenchError(f"{self.url} is not on the local file system")
        return Path(self.path)

    @property
    def url(self) -> str:
        """How users name it: the plain path for a local location, else `protocol://path`."""
        return self.path if self.is_local else f"{self.protocol}://{self.path.lstrip('/')}"

    @property
    def name(self) -> str:
        """The last part of the path."""
        return PurePosixPath(self.path).name

    def join(self, *parts: str) -> Location:
        """The location `parts` below this one."""
        return Location(self.protocol, str(PurePosixPath(self.path, *parts)))

    def fs(self) -> Any:
        """The fsspec filesystem (made in the process that asks: filesystems are not shipped to workers)."""
        import fsspec

        try:
            return fsspec.filesystem(self.protocol)
        except ImportError as exc:
            raise WorkbenchError(f"{self.protocol}:// needs a filesystem package that is not installed: {exc} "
                                 f"(fsspec's protocols: https://filesystem-spec.readthedocs.io)") from exc
        except ValueError as exc:
            raise WorkbenchError(f"unknown storage protocol {self.protocol!r} in {self.url}: {exc}") from exc

    def exists(self) -> bool:
        return Path(self.path).exists() if self.is_local else bool(self.fs().exists(self.path))

    def is_dir(self) -> bool:
        return Path(self.path).is_dir() if self.is_local else bool(self.fs().isdir(self.path))

    def files(self) -> list[Location]:
        """The files directly in this folder, hidden ones left out, in name order."""
        if self.is_local:
            entries = [p for p in Path(self.path).iterdir() if p.is_file()]
            return [location(str(p)) for p in sorted(entries) if not p.name.startswith(".")]
        found = self.fs().ls(self.path, detail=True)
        names = sorted(str(e["name"]) for e in found if e.get("type") == "file")
        return [Location(self.protocol, n) for n in names if not PurePosixPath(n).name.startswith(".")]

    def size(self) -> int:
        """The file's size in bytes."""
        return Path(self.path).stat().st_size if self.is_local else int(self.fs().size(self.path))

    def read_text(self) -> str:
        if self.is_local:
            return Path(self.path).read_text(encoding="utf-8")
        with self.fs().open(self.path, "rt", encoding="utf-8") as f:
            return f.read()

    def write_text(self, text: str) -> None:
        """Write a small file whole (a run.json, a record): on object stores one PUT, so readers see all or none."""
        if self.is_local:
            Path(self.path).write_text(text, encoding="utf-8")
            return
        with self.fs().open(self.path, "wt", encoding="utf-8") as f:
            f.write(text)

    def copy_to_local(self, target: Path) -> Path:
        """This file as a local file: itself when local, else downloaded to `target`."""
        if self.is_local:
            return Path(self.path)
        self.fs().get(self.path, str(target))
        return target

    def upload(self, folder: Path, skip: tuple[str, ...] = ()) -> None:
        """Copy the files under local `folder` to this folder (created), but the relative paths in `skip`."""
        if self.is_local:
            raise WorkbenchError("upload is for object stores; local folders are renamed into place")
        fs = self.fs()
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            relative = path.relative_to(folder).as_posix()
            if relative not in skip:
                fs.put_file(str(path), str(PurePosixPath(self.path, relative)))

    def remove(self) -> None:
        """Remove this folder and everything under it, ignoring what is already gone."""
        if self.is_local:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        fs = self.fs()
        if fs.exists(self.path):
            fs.rm(self.path, recursive=True)


def location(where: str | os.PathLike[str] | Location) -> Location:
    """The `Location` of a path or URL (module docstring); `file://` URLs become local paths. A protocol fsspec
    does not know, or whose package is missing, raises WorkbenchError saying what to install."""
    if isinstance(where, Location):
        return where
    text = os.fspath(where)
    match = _SCHEME.match(text)
    if match is None:
        return Location("file", str(Path(text).expanduser().absolute()))
    protocol = match.group(1).lower()
    if protocol in LOCAL_PROTOCOLS:
        return Location("file", str(Path("/" + text[match.end():].lstrip("/"))))
    import fsspec
    from fsspec.registry import known_implementations

    if protocol not in fsspec.available_protocols():
        raise WorkbenchError(f"unknown storage protocol {protocol!r} in {text}")
    try:
        kind = fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        hint = known_implementations.get(protocol, {}).get("err") or str(exc)
        raise WorkbenchError(f"{text}: {hint} (pip install the filesystem package for {protocol}://)") from exc
    return Location(protocol, kind._strip_protocol(text).rstrip("/") or "/")
