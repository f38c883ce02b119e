"""What the API handlers share: the traces root (and the panel's choice of it), the jobs, the model policy.

The panel may point the API at another traces folder (`PUT config`), inside the server's root_dir only.
A folder inside at that moment can lead out later (it, or a parent, replaced by a link), so the choice is
checked again, links resolved, at every use: each request that reads it and each capture job as it starts.
The admin's configured root is trusted as is (it may lie anywhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.server.jobs import JobManager
from workbench.server.model_policy import ModelPolicy


class RootRefused(WorkbenchError):
    """A traces folder the panel may not choose (400): not a folder, not a path, or outside root_dir."""


class RootEscaped(WorkbenchError):
    """The panel's traces folder leads outside the server's root_dir now (409): it was checked when chosen."""


@dataclass
class ServerState:
    """What the handlers share: the traces root, the job manager, and how a capture job is started.

    `capture_command(args)` is the full command line of `workbench capture args` (into the current `root`);
    jobs run in `cwd`, the server's root_dir. `root` changes with `PUT config` (the JupyterLab setting);
    `default_root` is the configured one, which `PUT config` with an empty path restores. `policy` says
    which models besides the built-in ones a job may load.
    """

    root: Path
    jobs: JobManager
    capture_command: Callable[[list[str]], list[str]]
    cwd: Path | None = None
    default_root: Path | None = None
    policy: ModelPolicy = field(default_factory=ModelPolicy)

    def __post_init__(self) -> None:
        if self.default_root is None:
            self.default_root = self.root

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


def _leads_inside(path: Path, base: Path) -> bool:
    """Whether `path`, with the links of its existing part resolved, lies in `base` (or is `base`)."""
    return path.resolve().is_relative_to(base.resolve())
