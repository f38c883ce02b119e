"""`WidgetProgress`: an experiment's progress (the `workbench.experiment.Progress` protocol) drawn on
an ipywidgets progress bar and label, for the notebook app."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets


@dataclass
class _Task:
    completed: int = 0
    total: int | None = None
    done: bool = False

    @property
    def fraction(self) -> float:
        """How much of the task is done, 0 to 1 (0 until it finishes when its total is unknown)."""
        if self.done:
            return 1.0
        if not self.total:
            return 0.0
        return min(self.completed / self.total, 1.0)


class WidgetProgress:
    """Progress of an experiment's tasks as one bar (0 to 100 %) and a label naming the task that moved last.

    Every task counts for the same share of the bar: the `expected` ones (those the experiment will
    run, so the bar does not jump back when a later task starts) and any other task that starts.
    The bar never moves backwards (a restarted task keeps the bar where it was); `complete` fills it.
    """

    def __init__(self, bar: widgets.IntProgress, label: widgets.Label, expected: Sequence[str] = ()) -> None:
        self.bar = bar
        self.label = label
        self._tasks: dict[str, _Task] = {name: _Task() for name in expected}
        self.bar.min, self.bar.max, self.bar.value = 0, 100, 0
        self.bar.bar_style = "info"

    @staticmethod
    def expected_tasks(variants: Sequence[str], profile: bool) -> list[str]:
        """The tasks `run_experiment` reports for these variants (see its `Progress` protocol)."""
        profiled = [f"profile {name}" for name in variants] if profile else []
        return ["prepare", "benchmark", *profiled, "write"]

    def start(self, task: str, total: int | None = None) -> None:
        """Start (or restart) `task` with `total` steps (None: unknown)."""
        self._tasks[task] = _Task(total=total)
        self._draw(task)

    def advance(self, task: str, n: int = 1) -> None:
        """Count `n` more steps of `task`."""
        state = self._tasks.setdefault(task, _Task())
        state.completed += n
        self._draw(task)

    def finish(self, task: str) -> None:
        """Mark `task` done."""
        self._tasks.setdefault(task, _Task()).done = True
        self._draw(task)

    def complete(self, text: str) -> None:
        """Fill the bar: the work is over; `text` says how it ended."""
        self.bar.value = self.bar.max
        self.bar.bar_style = "success"
        self.label.value = text

    def fail(self, text: str) -> None:
        """Mark the bar failed where it stands; `text` says why."""
        self.bar.bar_style = "danger"
        self.label.value = text

    @property
    def fraction(self) -> float:
        """The share of all known tasks done, 0 to 1."""
        if not self._tasks:
            return 0.0
        return sum(task.fraction for task in self._tasks.values()) / len(self._tasks)

    def _draw(self, task: str) -> None:
        state = self._tasks[task]
        self.bar.value = max(self.bar.value, int(self.fraction * self.bar.max))
        if state.done:
            self.label.value = f"{task}: done"
        elif state.total:
            self.label.value = f"{task}: {state.completed}/{state.total}"
        else:
            self.label.value = f"{task}: {state.completed}"
