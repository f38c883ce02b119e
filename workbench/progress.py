"""Progress of long work, behind the small `Progress` protocol the experiment runner calls: bars for people
(`RichProgress`), JSON lines for programs (`JsonProgress`, what the Jupyter server's capture jobs read)."""

from __future__ import annotations

import json
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class RichProgress:
    """One rich progress bar per task (e.g. `compile int8`, `benchmark`, `profile bf16`); task names are
    printed as they are, never read as markup."""

    def __init__(self, console: Console, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<24}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
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


class JsonProgress:
    """Progress events as JSON lines on a text stream, one per start, advance and finish of a task:
    `{"task": "benchmark", "completed": 3, "total": 35, "done": false}` (`total` null when unknown,
    `done` true on the task's last line). Each line is flushed at once, so a reader sees it live."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tasks: dict[str, tuple[int, int | None]] = {}

    def start(self, task: str, total: int | None = None) -> None:
        self._tasks[task] = (0, total)
        self._emit(task, 0, total, done=False)

    def advance(self, task: str, n: int = 1) -> None:
        if task in self._tasks:
            completed, total = self._tasks[task]
            self._tasks[task] = (completed + n, total)
            self._emit(task, completed + n, total, done=False)

    def finish(self, task: str) -> None:
        if task in self._tasks:
            completed, total = self._tasks.pop(task)
            self._emit(task, completed if total is None else total, total, done=True)

    def _emit(self, task: str, completed: int, total: int | None, *, done: bool) -> None:
        line = json.dumps({"task": task, "completed": completed, "total": total, "done": done})
        self._stream.write(line + "\n")
        self._stream.flush()

    def __enter__(self) -> JsonProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Nothing to close: every line is already written."""
