"""What the API handlers share: the traces root (and the panel's choice of it), the jobs, the model policy.

The panel may point the API at another traces folder (`PUT config`), inside the server's root_dir only.
A folder inside at that moment can lead out later (it, or a parent, replaced by a link), so the choice is
checked again, links resolved, at every use: each request that reads it and each capture job as it starts.
The admin's configured root is trusted as is (it may lie anywhere).

The configured root may also be a URL (`s3://`, `gs://`...): the server then reads its local mirror
(`workbench.trace.store.mirror`), refreshed from the URL by the listing routes at most every `MIRROR_REFRESH_S`,
and refuses every write into it (`RootReadOnly`): runs reach a URL root through `workbench import --ranks`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.server.jobs import JobManager
from workbench.server.model_policy import ModelPolicy
from workbench.storage import Location, is_url
from workbench.trace.store.mirror import mirror_root

CONFIGURED_ROOT = "<configured traces root>"
"""How clients see a configured traces root outside the server's root_dir (its path is the server's own)."""
MIRROR_REFRESH_S = 10.0
"""Fewest seconds between two refreshes of a URL root's mirror (the panel polls every few seconds)."""


class RootRefused(WorkbenchError):
    """A traces folder the panel may not choose (400): not a folder, not a path, or outside root_dir."""


class RootEscaped(WorkbenchError):
    """The panel's traces folder leads outside the server's root_dir now (409): it was checked when chosen."""


class RootReadOnly(WorkbenchError):
    """A write (capture, import, delete) into a URL traces root, which the panel only reads (409)."""


class MirrorUnavailable(WorkbenchError):
    """The URL traces root could not be listed to refresh its mirror (503): the store is unreachable or refuses."""


@dataclass
class ServerState:
    """What the handlers share: the traces root, the job manager, and how a capture job is started.

    `capture_command(args)` is the full command line of `workbench capture args` (into the current `root`);
    jobs run in `cwd`, the server's root_dir. `root` changes with `PUT config` (the JupyterLab setting);
    `default_root` is the configured one, which `PUT config` with an empty path restores. `policy` says
    which models besides the built-in ones a job may load. `remote` is the URL the configured root mirrors
    (None for a folder): while it is the root, the panel reads it only.
    """

    root: Path
    jobs: JobManager
    capture_command: Callable[[list[str]], list[str]]
    cwd: Path | None = None
    default_root: Path | None = None
    policy: ModelPolicy = field(default_factory=ModelPolicy)
    remote: Location | None = None
    _refresh_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _refreshed_at: float = field(default_factory=time.monotonic, init=False, repr=False)
    _refresh_error: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.default_root is None:
            self.default_root = self.root

    @property
    def root_url(self) -> Location | None:
        """The URL the current traces root mirrors (read-only here), or None when it is a folder."""
        return self.remote if self.root == self.default_root else None

    def shown(self, root: Path) -> str:
        """How clients see `root`, never by its absolute path: the URL for the mirror of the configured URL root;
        else the folder relative to the server's root_dir, as the panel's setting names it (`traces`, `.` for
        root_dir itself); a configured root outside root_dir as `<configured traces root>`."""
        if self.remote is not None and root == self.default_root:
            return self.remote.url
        for folder, base in ((root, self.base), (_resolved(root), _resolved(self.base))):
            if folder.is_relative_to(base):
                return folder.relative_to(base).as_posix()
        return CONFIGURED_ROOT

    def refresh_mirror(self) -> None:
        """Bring the mirror of the URL root up to date with its listing, unless that was done (or tried: its
        failure is raised again) less than MIRROR_REFRESH_S ago, so the panel's polls do not hammer the store.
        Blocking: call it in a worker thread. Raises MirrorUnavailable naming the URL."""
        if self.remote is None:
            return
        with self._refresh_lock:  # one refresh at a time: they rename folders of the same mirror
            if time.monotonic() - self._refreshed_at >= MIRROR_REFRESH_S:
                self._refreshed_at = time.monotonic()
                self._refresh_error = None
                try:
                    mirror_root(self.remote)
                except WorkbenchError as exc:  # an OSError of the store, as mirror_root words it
                    self._refresh_error = str(exc)
                except Exception as exc:  # a store's client raises its own kinds too (botocore, google.auth...)
                    self._refresh_error = f"traces root {self.remote.url}: {type(exc).__name__}: {exc}"
            if self._refresh_error is not None:
                raise MirrorUnavailable(f"{self._refresh_error} (the panel lists it again once it can be read)")

    def writable_root(self) -> Path:
        """The traces root for a capture, an import or a deletion: `checked_root`, and RootReadOnly when it is a
        URL root's mirror (a write there would never reach the URL)."""
        url = self.root_url
        if url is not None:
            raise RootReadOnly(f"the traces root is {url.url}, read-only in the panel: capture, import or delete "
                               "runs in a folder chosen in the panel's settings, and put a job's ranks at the URL "
                               f"with `workbench import --ranks FOLDER --out {url.url}`")
        return self.checked_root()

    @property
    def base(self) -> Path:
        """The folder the panel's choices must stay in: the server's root_dir (else the working directory)."""
        return self.cwd or Path.cwd()

    def choose_root(self, value: str) -> None:
        """Make `value` (the panel's setting: relative to root_dir, or absolute; empty for the configured
        root) the traces root. A path that exists must be a folder; a missing one is created by the
        first capture. Raises RootRefused, whose message shows no path but `value`."""
        if not value.strip():
            assert self.default_root is not None  # set by __post_init__
            self.root = self.default_root
            return
        if is_url(value.strip()):
            raise RootRefused(f"traces_root: {value!r} is a URL; the panel may only choose folders inside the "
                              "server's root folder (a URL root is set by c.WorkbenchServerApp.traces_root)")
        try:
            chosen = (self.base / Path(value.strip()).expanduser()).absolute()
            is_file = chosen.exists() and not chosen.is_dir()
            inside = chosen == self.default_root or _leads_inside(chosen, self.base)
        except (OSError, RuntimeError, ValueError) as exc:  # too long, a NUL, an unknown ~user, a loop
            raise RootRefused(f"traces_root: {value!r} is not a usable folder path ({type(exc).__name__})") from exc
        if is_file:
            raise RootRefused(f"traces_root: {value!r} exists and is not a folder")
        if not inside:
            raise RootRefused(f"traces_root: {value!r} is outside the server's root folder; the panel may only "
                              "choose folders inside it")
        self.root = chosen

    def checked_root(self) -> Path:
        """The traces root for this use, checked again (see `check_root`)."""
        self.check_root(self.root)
        return self.root

    def check_root(self, root: Path) -> None:
        """Raise RootEscaped if `root`, a choice of the panel, leads outside root_dir now (links resolved
        now); the configured root passes as is."""
        if root == self.default_root:
            return
        try:
            inside = _leads_inside(root, self.base)
        except (OSError, RuntimeError):
            inside = False
        if not inside:
            raise RootEscaped("the traces folder chosen in the panel leads outside the server's root folder now "
                              "(it or a parent was replaced by a link); choose another one in the panel's "
                              "settings, or the default")


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path


def _leads_inside(path: Path, base: Path) -> bool:
    """Whether `path`, with the links of its existing part resolved, lies in `base` (or is `base`)."""
    return path.resolve().is_relative_to(base.resolve())
