"""The Ray engine: one Ray task per call, payloads kept in the cluster's object store.

Connecting: `address` "auto" joins the cluster running on this machine (`ray start --head`), "ray://HOST:PORT"
a remote one through Ray Client, None starts a local one for this process (`num_cpus` of them); a process
that already called `ray.init` (a notebook, a test, a benchmark) is used as it is and left running. The
nodes need workbench installed (the same version), and the inputs and traces root must be reachable from
them: URLs (`workbench.storage`), or paths on a file system every node mounts at the same place.

A call that raises comes back as a `Failure` (`run_call` runs inside the task); a task that dies (its worker
killed, its node lost) comes back as one too, with Ray's reason. Ctrl-C cancels (`ray.cancel`, forced) every
task not yet finished.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

from workbench.distributed.calls import Calls, Failure, run_call
from workbench.errors import WorkbenchError

CANCEL_WAIT_S = 30.0
"""Seconds to wait for cancelled tasks to stop before an interrupt goes on."""


def _task(fn: Callable[..., Any], keep: bool, *args: Any) -> Any:
    """The body of every Ray task. The call's arguments come as separate task arguments because Ray resolves
    object refs only there (a ref inside a tuple would arrive as a ref), so a trace kept in the object store by
    an earlier task arrives as the trace."""
    return run_call(fn, args, keep)


class RayEngine:
    """Calls as Ray tasks (module docstring)."""

    distributed = True

    def __init__(self, address: str | None, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self._started: list[bool] = []
        """Per open `with` block, whether it started Ray (and so shuts it down)."""
        self._remote: Any = None

    def __enter__(self) -> RayEngine:
        import ray

        started = not ray.is_initialized()
        if started:
            options: dict[str, Any] = {"address": self.address, "log_to_driver": False,
                                       "logging_level": logging.WARNING}
            if self.address is None:
                options.update(num_cpus=self.num_cpus, include_dashboard=False)
            try:
                ray.init(**options)
            except ConnectionError as exc:
                raise WorkbenchError(f"cannot reach a Ray cluster at {self.address or 'this machine'}: {exc} (start "
                                     "one with `ray start --head`, or give --cluster ray://HOST:PORT)") from exc
        self._started.append(started)
        self._remote = ray.remote(max_retries=0)(_task)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        import ray

        if self._started.pop():
            ray.shutdown()
            self._remote = None

    def map(self, fn: Callable[..., Any], calls: Calls, *, keep: bool = False,
            on_done: Callable[[], None] | None = None) -> list[Any]:
        import ray

        if self._remote is None:
            raise WorkbenchError("the Ray engine is used outside its `with` block")
        task = self._remote.options(num_returns=2) if keep else self._remote
        submitted = [task.remote(fn, keep, *args) for args in calls]
        heads = [refs[0] for refs in submitted] if keep else submitted
        pending = list(heads)
        try:
            while pending:
                finished, pending = ray.wait(pending, num_returns=1)
                if on_done is not None:
                    for _ in finished:
                        on_done()
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            # wait until the cancelled tasks have stopped, so none writes after the caller cleans up
            with contextlib.suppress(Exception):
                ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_S)
            raise
        summaries = [_get(ref) for ref in heads]
        if not keep:
            return summaries
        return [(summary, refs[1]) for summary, refs in zip(summaries, submitted, strict=True)]


def _get(ref: Any) -> Any:
    """The value of a finished task, or a `Failure` saying why its task died."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        return Failure(f"the Ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
