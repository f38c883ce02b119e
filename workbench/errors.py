"""Exceptions shared by every layer and the exit codes they map to, so every surface (the CLI, the server's
capture jobs) reads a command's outcome the same way."""

from __future__ import annotations

import errno

EXIT_PARTIAL = 1
"""Exit code of a capture or generation sweep in which some variants failed; the others were written."""

EXIT_BAD_INPUT = 2
"""Exit code of bad input (unknown model or variant, unreadable trace, missing run): a WorkbenchError,
reported as one line."""

EXIT_INTERRUPTED = 130
"""Exit code of an interrupted command (Ctrl-C, or SIGINT from a cancelled job): nothing half-written kept."""


class WorkbenchError(Exception):
    """Base of every error the workbench raises on purpose (exit code 2 in the CLI)."""


class TraceFormatError(WorkbenchError):
    """A trace file that cannot be read: names the file and what is wrong with it."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UnknownModelError(WorkbenchError):
    """A model reference that names no built-in model, factory or exported program."""


class VariantUnavailable(WorkbenchError):
    """A variant that cannot run on this machine (no CUDA, missing package, ...); says why."""


class MissingDependency(WorkbenchError):
    """An optional dependency is not installed; the message gives the pip line."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(f"{package} is not installed: pip install 'workbench[{extra}]'")
        self.package = package
        self.extra = extra


class BundleError(WorkbenchError):
    """A run bundle that is missing, malformed or cannot be written."""


class DiskFullError(BundleError):
    """The disk (or the user's quota) filled up while writing `path`; nothing half-written was kept."""

    def __init__(self, path: object) -> None:
        super().__init__(f"no space left on device writing {path}")
        self.path = path


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk (or the user's quota) is full: errno ENOSPC or EDQUOT, or Arrow's text of
    it (Arrow's errors carry no errno)."""
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(exc)


def write_error(exc: BaseException, path: object, message: str) -> BundleError:
    """The error to raise for `exc` met while writing `path`: DiskFullError when the disk is full, else a
    BundleError with `message`."""
    return DiskFullError(path) if is_disk_full(exc) else BundleError(message)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
