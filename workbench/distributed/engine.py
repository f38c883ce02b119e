"""The `Engine` interface and the local engine (this machine's process pool, or this process alone).

An engine runs one function over many argument tuples (one per rank, or per file) and returns each call's
result, in call order, with `Failure` in place of a call that raised: the caller decides what a failed rank
means. With `keep`, the function returns `(summary, payload)`: the caller receives the summary and a handle
to the payload, which stays where the engine keeps it (this process for the local engine; the cluster's
object store for Ray, so the driver never holds the traces) and is resolved when the handle is passed as an
argument of a later `map`. `on_done` is called once per finished call (a progress bar). Ctrl-C cancels the
calls not yet finished and is raised again.

`engine_for(cluster)` picks the engine: "local" (the default: a process pool of this machine), "auto" (the
Ray cluster running here, `ray start --head`) or "ray://HOST:PORT" (a remote cluster through Ray Client).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from workbench.distributed.calls import Calls, Engine, run_call
from workbench.errors import MissingDependency, WorkbenchError
from workbench.machine import usable_cpus

CLUSTERS = ("local", "auto", "ray://HOST:PORT")
"""What `--cluster` takes."""

@dataclass(frozen=True)
class Held:
    """A payload the local engine keeps in this process (the handle `map(..., keep=True)` returns)."""

    value: Any


class LocalEngine:
    """Calls in a pool of `workers` forked processes of this machine (None: one per usable CPU, at most one per
    call); in this process when one worker suffices, where fork is unavailable, and for calls on payloads it
    holds (shipping those to a worker would cost more than the call)."""

    distributed = False

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Nothing to release: each `map` owns its pool."""

    def map(self, fn: Callable[..., Any], calls: Calls, *, keep: bool = False,
            on_done: Callable[[], None] | None = None) -> list[Any]:
        from workbench.trace.kineto.jsonstream import can_fork

        done = on_done or (lambda: None)
        held = any(map(_holds, calls))
        calls = [tuple(a.value if isinstance(a, Held) else a for a in args) for args in calls] if held else calls
        workers = max(1, min(usable_cpus() if self.workers is None else self.workers, len(calls)))
        if workers == 1 or not can_fork() or held:
            results = []
            for args in calls:
                results.append(run_call(fn, args, keep))
                done()
        else:
            results = self._pool(fn, calls, keep, workers, done)
        return [(summary, Held(payload)) for summary, payload in results] if keep else results

    @staticmethod
    def _pool(fn: Callable[..., Any], calls: Calls, keep: bool, workers: int, done: Callable[[], None]) -> list[Any]:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        try:
            futures = [pool.submit(run_call, fn, args, keep) for args in calls]
            for _ in concurrent.futures.as_completed(futures):
                done()
            return [future.result() for future in futures]
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            pool.shutdown()


def _holds(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, Held) for a in args)


def engine_for(cluster: str = "local", workers: int | None = None) -> Engine:
    """The engine `cluster` names (module docstring); `workers` sizes the local pool. Ray engines need the
    `ray` extra: without it, a `MissingDependency` saying how to get it."""
    if cluster == "local":
        return LocalEngine(workers)
    if cluster != "auto" and not cluster.startswith("ray://"):
        raise WorkbenchError(f"unknown cluster {cluster!r}: use {', '.join(CLUSTERS)}")
    try:
        import ray  # noqa: F401 - only checks that the extra is installed
    except ImportError as exc:
        raise MissingDependency("ray", "ray") from exc
    from workbench.distributed.ray_engine import RayEngine

    return RayEngine(cluster)
