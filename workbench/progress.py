"""Progress bars for long work, behind the small `Progress` protocol the experiment runner calls."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class RichProgress:
    """One rich progress bar per task (e.g. `compile int8`, `benchmark`, `profile bf16`)."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, disable=not enabled, transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def start(self, task: str, total: int | None = None) -> None:
        self._tasks[task] = self._progress.add_task(task, total=total)

    def advance(self, task: str, n: int = 1) -> None:
        if task in self._tasks:
            self._progress.advance(self._tasks[task], n)

    def finish(self, task: str) -> None:
        task_id = self._tasks.pop(task, None)
        if task_id is not None:
            total = self._progress.tasks[task_id].total
            self._progress.update(task_id, completed=total if total is not None else 1, total=total or 1)

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()
