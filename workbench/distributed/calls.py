"""What every engine shares (`workbench.distributed.engine` has the interface's description): the `Engine`
protocol, and the call wrapper that turns an exception into a `Failure` value."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from workbench.errors import TraceFormatError, WorkbenchError

Calls = Sequence[tuple[Any, ...]]


@dataclass(frozen=True)
class Failure:
    """A call that raised: a workbench error's message as it is (a trace error's problem without its path,
    which the caller names), anything else with its type."""

    message: str


class Engine(Protocol):
    """Runs per-rank calls (`workbench.distributed.engine`). `distributed`: whether they run on a cluster."""

    distributed: bool

    def map(self, fn: Callable[..., Any], calls: Calls, *, keep: bool = False,
            on_done: Callable[[], None] | None = None) -> list[Any]: ...

    def __enter__(self) -> Engine: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


def run_call(fn: Callable[..., Any], args: tuple[Any, ...], keep: bool) -> Any:
    """`fn(*args)`, its exception turned into a `Failure` (`(Failure, None)` with `keep`): exceptions of the
    workbench do not survive pickling, and one rank's error must not stop the others."""
    try:
        return fn(*args)
    except TraceFormatError as exc:
        failure = Failure(exc.problem)
    except WorkbenchError as exc:
        failure = Failure(str(exc))
    except Exception as exc:  # a reader's bug on one file: reported for that rank, with its type
        failure = Failure(f"{type(exc).__name__}: {exc}")
    return (failure, None) if keep else failure


