"""Exceptions shared by every layer, so the CLI can map them to exit codes in one place."""

from __future__ import annotations


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
