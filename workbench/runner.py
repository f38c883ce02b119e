"""One skeleton for everything that writes runs: an experiment's variants, a generation sweep's points and
imported traces.

`Runner.run()` goes prepare → benchmark → for each run: profile into a scratch folder → read → enrich →
write its bundle → the experiment record. Bundles and record are written into one staging folder
(`workbench.trace.store.staging`) and land in the traces root together, so this class is the one place that owns
atomicity, scratch folders, a full disk and the record. Subclasses say what each step means for their runs:
`new_runs`, `prepare`, `workload` (for the interleaved benchmark), `profiles` (whether a run is profiled),
`profile_run`, `info` (the run's `RunInfo`), `bundle_files`, `record` (the `ExperimentRecord`, or None) and
`result`.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from workbench.errors import DiskFullError, WorkbenchError, is_disk_full
from workbench.serving.steps import engine_steps
from workbench.trace import Trace
from workbench.trace.store.bundle import write_bundle
from workbench.trace.store.experiment import write_experiment
from workbench.trace.store.records import ExperimentRecord, RunInfo
from workbench.trace.store.scratch import make_scratch_dir, remove_entry
from workbench.trace.store.staging import staged

if TYPE_CHECKING:  # the benchmark harness (torch) loads when a runner benchmarks, not with every runner: imports
    from workbench.backends.benchmark import LatencyStats, Workload


class Progress(Protocol):
    """Receives progress of a runner's tasks (the CLI draws them as progress bars).

    Tasks are named by strings such as "prepare", "benchmark", "profile bf16", "write"; `total` is
    None when unknown. `start` may be called again for a task to restart it from zero.
    """

    def start(self, task: str, total: int | None = None) -> None: ...

    def advance(self, task: str, n: int = 1) -> None: ...

    def finish(self, task: str) -> None: ...


class NullProgress:
    """A `Progress` that ignores everything (the default)."""

    def start(self, task: str, total: int | None = None) -> None:
        """Ignored."""

    def advance(self, task: str, n: int = 1) -> None:
        """Ignored."""

    def finish(self, task: str) -> None:
        """Ignored."""


class _HasStatus(Protocol):
    status: str


ResultT = TypeVar("ResultT", bound=_HasStatus)


@dataclass(frozen=True)
class ExperimentResult(Generic[ResultT]):
    """The outcome of a runner: its record's id and path, and one result per run."""

    experiment_id: str
    path: Path
    runs: tuple[ResultT, ...]

    @property
    def failed(self) -> list[ResultT]:
        """The runs that failed."""
        return [run for run in self.runs if run.status != "ok"]


@dataclass
class RunFailure:
    """A run's failure state while its runner goes on: the first failure is kept, as a message naming
    `subject` and the stage, and the traceback for run.json. A runner's runs also have a `run_id` (their
    bundle's) and a `name` (in tasks and scratch folders: "eager", "mha-bf16")."""

    error: str | None = field(default=None, kw_only=True)
    error_traceback: str | None = field(default=None, kw_only=True)

    @property
    def subject(self) -> str:
        """What the messages call this run ("variant eager")."""
        raise NotImplementedError

    @property
    def ok(self) -> bool:
        """Whether the run has not failed (so far)."""
        return self.error is None

    @property
    def status(self) -> str:
        """run.json's status."""
        return "ok" if self.ok else "failed"

    def fail(self, stage: str, exc: BaseException) -> None:
        """Record `exc` as this run's failure in `stage` (a WorkbenchError's message as it is, without a
        repeated subject; any other exception with its type)."""
        detail = str(exc).removeprefix(f"{self.subject}: ")
        if not isinstance(exc, WorkbenchError):
            detail = f"{type(exc).__name__}: {detail}"
        self.error = f"{self.subject} failed during {stage}: {detail}"
        self.error_traceback = "".join(traceback.format_exception(exc))


RunT = TypeVar("RunT", bound=RunFailure)


@dataclass(frozen=True)
class BundleFiles:
    """What a run's bundle holds beside run.json and the trace: raw files (moved in when `move_raw`), texts
    by bundle path, folders by bundle name, and optional tables."""

    raw_files: tuple[Path, ...] = ()
    move_raw: bool = True
    texts: Mapping[str, str] = field(default_factory=dict)
    folders: Mapping[str, Path] = field(default_factory=dict)
    tables: Mapping[str, Any] = field(default_factory=dict)


class Runner(Generic[RunT, ResultT]):
    """The skeleton (module docstring). `timings` collects the phases' wall milliseconds (the record's
    `phases_ms`); `profile` says whether runs are profiled (else `profile_run` is never called)."""

    prepare_phase = "prepare"
    """The phase name of `prepare` in `timings`."""

    def __init__(self, root: Path, experiment_id: str, progress: Progress, timings: dict[str, float], *,
                 profile: bool) -> None:
        self.root = root
        self.experiment_id = experiment_id
        self.progress = progress
        self.timings = timings
        self.profile = profile
        self.runs: list[RunT] = []
        """The runs, once `run` has made them."""

    # -- what subclasses say -----------------------------------------------------------------------

    def new_runs(self) -> list[RunT]:
        """The runs, in order."""
        raise NotImplementedError

    def prepare(self, runs: list[RunT]) -> None:
        """Make the runs ready (and check their numerics); a run that cannot be is failed. Nothing by default."""

    def benchmark(self, runs: list[RunT]) -> None:
        """Time the ready runs together (`benchmark_together`). Nothing by default."""

    def workload(self, run: RunT) -> Workload:
        """`run` as a contender of the interleaved benchmark (called again when the benchmark restarts)."""
        raise NotImplementedError

    def profiles(self, run: RunT) -> bool:
        """Whether `run` is profiled when the runner profiles (a sweep may profile some of its runs only)."""
        return True

    def profiles_first(self, run: RunT) -> bool:
        """Whether `run` is profiled before the others (its profiler must start before another holds a
        resource, as XLA's CUPTI tracer must before Kineto's). No run by default."""
        return False

    def profile_run(self, run: RunT, folder: Path) -> Trace | None:
        """The trace of `run`'s profiled run, its raw output in `folder`; None (and `run` failed) if it could
        not be made. Exceptions fail the run, except a full disk, which stops the runner."""
        raise NotImplementedError

    def info(self, run: RunT) -> RunInfo:
        """The run's run.json."""
        raise NotImplementedError

    def bundle_files(self, run: RunT) -> BundleFiles:
        """What the run's bundle holds beside run.json and its trace."""
        return BundleFiles()

    def record(self, runs: list[RunT]) -> ExperimentRecord | None:
        """The experiment record grouping the runs (None: the runs stand alone)."""
        return None

    def result(self, run: RunT, path: Path) -> ResultT:
        """The outcome of `run`, whose bundle is at `path`."""
        raise NotImplementedError

    # -- the skeleton ------------------------------------------------------------------------------

    def benchmark_together(self, runs: list[RunT], warmup: int, iterations: int) -> dict[str, LatencyStats]:
        """Time the runs' workloads interleaved (`benchmark_until_clean`); a run whose workload raises is
        failed and the others are timed again. Returns the statistics by run id."""
        from workbench.backends.benchmark import benchmark_until_clean

        by_id = {run.run_id: run for run in runs}

        def workloads() -> dict[str, Workload]:
            self.progress.start("benchmark", warmup + iterations)
            return {run_id: self.workload(run) for run_id, run in by_id.items() if run.ok}

        stats = benchmark_until_clean(workloads, lambda run_id, exc: by_id[run_id].fail("benchmark", exc),
                                      warmup=warmup, iterations=iterations,
                                      progress=lambda _phase, _done, _total: self.progress.advance("benchmark"))
        self.progress.finish("benchmark")
        return stats

    def run(self) -> ExperimentResult[ResultT]:
        """Run every step and publish bundles and record together; the result names their final paths."""
        runs = self.runs = self.new_runs()
        with self._phase(self.prepare_phase):
            self.prepare(runs)
        with self._phase("benchmark"):
            self.benchmark([run for run in runs if run.ok])
        self.progress.start("write", len(runs) + 1)
        with staged(self.root, self.experiment_id) as stage:
            for run in sorted(runs, key=lambda run: not self.profiles_first(run)):
                self._capture(run, stage)
            with self._phase("write"):
                record = self.record(runs)
                if record is not None:
                    write_experiment(stage, self.experiment_id, record)
        self.progress.advance("write")
        self.progress.finish("write")
        path = self.root / "experiments" / f"{self.experiment_id}.json"
        return ExperimentResult(self.experiment_id, path, tuple(self.result(run, self.root / run.run_id)
                                                                for run in runs))

    def _capture(self, run: RunT, stage: Path) -> None:
        """Profile `run` (when profiling, and it has not failed) into a scratch folder of the stage, removed
        whatever happens (so raw output is moved, not copied, into the bundle), then write its bundle."""
        if not (self.profile and run.ok and self.profiles(run)):
            self._write(run, None, stage)
            return
        folder = make_scratch_dir(stage, "profile", run.name)
        try:
            with self._phase(f"profile {run.name}"):
                try:
                    trace = self.profile_run(run, folder)
                except Exception as exc:
                    if is_disk_full(exc):
                        raise DiskFullError(folder) from exc
                    run.fail("profiling", exc)
                    trace = None
            self._write(run, trace, stage)
        finally:
            remove_entry(folder)

    def _write(self, run: RunT, trace: Trace | None, stage: Path) -> None:
        files = self.bundle_files(run)
        info = self.info(run)
        with self._phase("write"):
            tables = None if trace is None else {**files.tables, **derived_tables(trace)}
            write_bundle(stage, run.run_id, info, trace, raw_files=files.raw_files, move_raw=files.move_raw,
                         texts=files.texts, folders={k: v for k, v in files.folders.items() if Path(v).is_dir()},
                         tables=tables)
        self.progress.advance("write")

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        from workbench.profiling.phases import phase  # labels regions for torch.profiler and NVTX

        with phase(name, self.timings):
            yield


def derived_tables(trace: Trace) -> dict[str, Any]:
    """The optional tables a trace yields by itself: a serving engine's `steps` (`workbench.serving.steps`)."""
    steps = engine_steps(trace)
    return {} if steps is None else {"steps": steps}
