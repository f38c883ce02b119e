"""A serving run: load from a real generator on an engine that is already serving, with the engine's side
recorded at the same time, written as one bundle per load point (an experiment groups the points of a sweep).

For each point: the engine's Prometheus metrics are sampled on a fixed period from the start; its profiler is
opened for a window (the whole load, the first N completed requests, or S seconds) and closed; the generator
sends the load and writes its per-request results. The bundle then holds, on one clock whose origin is the
moment the point started (`origin_ns`, epoch ns): the engine worker's trace (events), the sampled metrics
(counters, device `server`), the per-request results (`requests`) and the engine steps parsed from the trace
(`steps`). Requests that completed are kept when others failed (counted, with their errors); a point whose
generator wrote no results leaves no bundle and is reported as failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from workbench.errors import WorkbenchError
from workbench.serving import load as loads
from workbench.serving.engine import (
    Endpoint,
    EngineError,
    attach,
    describe,
    engine_worker_traces,
    profiler_call,
    trace_files,
)
from workbench.serving.join import with_phases
from workbench.serving.metrics import latency_summary
from workbench.serving.metrics_sampler import MetricsSampler, counters_table, engine_series
from workbench.serving.requests import read_requests
from workbench.serving.steps import engine_steps
from workbench.trace import Trace
from workbench.trace.schema import EVENTS
from workbench.trace.store.bundle import new_run_id, write_bundle
from workbench.trace.store.experiment import write_experiment
from workbench.trace.store.records import ExperimentRecord, RunInfo
from workbench.trace.store.scratch import make_scratch_dir, remove_entry
from workbench.trace.store.staging import staged

SUCCESS_SERIES = ("vllm:request_success_total", "sglang:num_requests_total")
"""The engines' count of finished requests, which closes a `requests:N` profiling window."""
WINDOW_POLL_S = 0.05
"""How often a `requests:N` window reads the engine's count of finished requests."""


@dataclass(frozen=True)
class ProfileWindow:
    """When the engine's profiler records: the whole `load`, the first `value` completed `requests`, `value`
    `seconds` from the start, or `off`."""

    kind: str = "load"
    value: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ProfileWindow:
        """`load`, `off`, `requests:N` or `seconds:S`."""
        kind, _, value = text.strip().partition(":")
        if kind in ("load", "off") and not value:
            return cls(kind)
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if kind not in ("requests", "seconds") or number <= 0:
            raise WorkbenchError(f"--profile-window {text!r}: give load, off, requests:N or seconds:S "
                                 "(N completed requests, S seconds from the start of the load)")
        return cls(kind, number)

    def __str__(self) -> str:
        return self.kind if self.kind in ("load", "off") else f"{self.kind}:{self.value:g}"


@dataclass(frozen=True)
class ServeOptions:
    """How each point runs: the generator and its program (`aiperf` or the engine's Python for vllm-bench), the
    tokenizer it counts prompts with, the profiling window and where the engine's profiler writes, the metrics
    period (0: no sampling), the SLO for goodput, and what the run record says about the model and device."""

    tokenizer: str
    generator: str = "aiperf"
    program: str = ".serving/aiperf/bin/aiperf"
    window: ProfileWindow = field(default_factory=ProfileWindow)
    profile_dir: Path | None = None
    metrics_period_s: float = 0.5
    slo: dict[str, int] | None = None
    model: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PointResult:
    """One load point's outcome: its run id (None when it failed), its latency summary, and its failure."""

    load: loads.Load
    run_id: str | None
    summary: dict[str, Any] | None
    error: str | None = None
    warnings: tuple[str, ...] = ()
    errors: dict[str, int] = field(default_factory=dict)
    """The failed requests' errors and how many had each."""


@dataclass(frozen=True)
class ServeResult:
    """A serving run: the experiment grouping a sweep's points (None for one point) and each point's result."""

    experiment_id: str | None
    points: list[PointResult]

    @property
    def failed(self) -> list[PointResult]:
        """The points that wrote no bundle, or some of whose requests failed."""
        return [p for p in self.points if p.error or (p.summary or {}).get("failed")]


def serve(endpoint: Endpoint, points: list[loads.Load], options: ServeOptions, root: Path,
          on_progress: Callable[[str], None] = lambda message: None) -> ServeResult:
    """Run every load point in turn against `endpoint` and write their bundles into `root` together."""
    if options.window.kind != "off" and options.profile_dir is None:
        raise WorkbenchError("a profiling window needs the engine's profiler folder: launch the engine with "
                             "`workbench serve --engine vllm`, or give --profile-dir of the server's "
                             "torch_profiler_dir (or --profile-window off)")
    experiment_id = new_run_id("serve", options.model.get("name", "model")) if len(points) > 1 else None
    results: list[PointResult] = []
    with staged(root, experiment_id or "serve") as stage:
        for index, point in enumerate(points, 1):
            on_progress(f"load {index}/{len(points)}: {point.label}, {point.requests} requests")
            results.append(_run_point(endpoint, point, options, stage, experiment_id, on_progress))
        if experiment_id is not None:
            write_experiment(stage, experiment_id, ExperimentRecord(
                experiment_id=experiment_id, kind="serving", model=options.model.get("name"),
                model_ref=options.model.get("ref"), reference=points[0].label,
                runs=[r.run_id for r in results if r.run_id], variants=[p.label for p in points],
                failed=[r.load.label for r in results if r.run_id is None],
                settings={"slo": options.slo, "window": str(options.window), "generator": options.generator,
                          "endpoint": describe(endpoint)}))
    return ServeResult(experiment_id, results)


def _run_point(endpoint: Endpoint, point: loads.Load, options: ServeOptions, stage: Path,
               experiment_id: str | None, on_progress: Callable[[str], None]) -> PointResult:
    work = make_scratch_dir(stage, "profile", point.label)
    try:
        origin_ns = time.time_ns()
        started = time.time()
        sampler = MetricsSampler(endpoint.url, options.metrics_period_s).start() if options.metrics_period_s else None
        window = _Window(endpoint, options.window).start()
        generator_error = None
        try:
            loads.run_generator(_command(endpoint, point, options, work), work / "generator", point.timeout_s)
        except loads.LoadError as exc:
            generator_error = str(exc)
        finally:
            window.close()
            if sampler is not None:
                sampler.stop()
        try:
            results_path = loads.results_file(work / "generator", options.generator)
        except loads.LoadError as exc:
            return PointResult(point, None, None, error=generator_error or str(exc))
        requests = read_requests(results_path, origin_ns=origin_ns)
        trace, trace_paths = _engine_trace(options, started, origin_ns, sampler)
        summary = latency_summary(requests.table, options.slo)
        run_id = new_run_id("serve", options.model.get("name", "model"), point.label)
        said = [w.replace(str(results_path), results_path.name) for w in requests.warnings]  # not the scratch path
        warnings = tuple([*said, *([generator_error] if generator_error else []), *window.errors, *_gone(endpoint)])
        info = RunInfo(run_id=run_id, kind="serving", experiment=experiment_id, model=options.model,
                       variant={"name": point.label}, label=point.label, device=options.device,
                       source="serve", serving={
                           "endpoint": describe(endpoint), "engine": options.engine, "generator": options.generator,
                           "load": point.record(), "window": str(options.window), "slo": options.slo,
                           "origin_ns": origin_ns, "summary": summary, "errors": requests.errors,
                           "warnings": list(warnings), "metrics": {
                               "period_s": options.metrics_period_s, "samples": len(sampler.samples) if sampler else 0,
                               "failed_scrapes": sampler.failures if sampler else 0}})
        steps = engine_steps(trace)
        tables: dict[str, pa.Table] = {"requests": with_phases(requests.table, steps)}
        if steps is not None:
            tables["steps"] = steps
        logs = [log] if (log := work / "generator" / "generator.log").is_file() else []
        write_bundle(stage, run_id, info, trace, raw_files=[results_path, *trace_paths, *logs], tables=tables)
        on_progress(f"{point.label}: {summary['ok']} requests ok, {summary['failed']} failed")
        return PointResult(point, run_id, summary, warnings=warnings, errors=requests.errors)
    finally:
        remove_entry(work)


def _gone(endpoint: Endpoint) -> list[str]:
    """A warning when the server no longer answers after the load (it died, or hangs): its failed requests say
    only what the client saw."""
    try:
        attach(endpoint.url, endpoint.model, timeout_s=5.0)
    except EngineError as exc:
        return [f"the server stopped answering during the load: {exc}"]
    return []


def _command(endpoint: Endpoint, point: loads.Load, options: ServeOptions, work: Path) -> list[str]:
    out = work / "generator"
    if options.generator == "aiperf":
        return loads.aiperf_command(options.program, endpoint, point, options.tokenizer, out)
    return loads.vllm_bench_command(options.program, endpoint, point, options.tokenizer, out)


def _engine_trace(options: ServeOptions, since: float, origin_ns: int,
                  sampler: MetricsSampler | None) -> tuple[Trace, list[Path]]:
    """The engine worker's trace written since `since`, moved onto the point's clock, with the sampled metrics as
    its counters; an empty trace with the counters when no window was open."""
    from workbench.trace.ranks.multirank import absolute_origin_ns, shift_trace
    from workbench.trace.registry import read_trace

    counters = counters_table(sampler.samples if sampler else (), origin_ns)
    paths = [] if options.profile_dir is None or options.window.kind == "off" else \
        engine_worker_traces(trace_files(options.profile_dir, since))
    if not paths:
        return Trace(events=EVENTS.empty_table(), counters=counters, metadata={"origin_ns": origin_ns}), []
    worker = read_trace(paths[-1])
    placed = shift_trace(worker, absolute_origin_ns(worker) - origin_ns)
    metadata = {**placed.metadata, "origin_ns": origin_ns}
    return Trace(events=placed.events, memory=placed.memory, counters=pa.concat_tables(
        [placed.counters, counters]).unify_dictionaries(), metadata=metadata), paths[-1:]


class _Window:
    """The engine's profiler, opened at the start of a point and closed when its window ends (in a thread, for
    `requests:N`, read from the engine's metrics every WINDOW_POLL_S, and `seconds:S`) or when the load ends,
    whichever is first. Failures are kept in `errors`: the load goes on without a trace."""

    def __init__(self, endpoint: Endpoint, window: ProfileWindow) -> None:
        self.endpoint, self.window = endpoint, window
        self.errors: list[str] = []
        self._open = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="workbench-profile-window", daemon=True)

    def start(self) -> _Window:
        if self.window.kind == "off":
            return self
        try:
            profiler_call(self.endpoint, "start")
            self._open = True
        except EngineError as exc:
            self.errors.append(f"profiling window not opened: {exc}")
            return self
        if self.window.kind in ("requests", "seconds"):
            self._thread.start()
        return self

    def close(self) -> None:
        """End the window now if it is still open (the load ended first)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        self._stop()

    def _watch(self) -> None:
        if self.window.kind == "seconds":
            self._done.wait(self.window.value)
        else:
            with httpx.Client(timeout=2.0) as client:
                base = self._finished(client)
                while not self._done.wait(WINDOW_POLL_S) and self._finished(client) - base < self.window.value:
                    pass
        self._stop()

    def _finished(self, client: httpx.Client) -> float:
        """The engine's count of finished requests (0 when its metrics cannot be read)."""
        try:
            series = engine_series(client.get(f"{self.endpoint.url}/metrics").text)
        except (httpx.HTTPError, ValueError):
            return 0.0
        return sum(series.get(name, 0.0) for name in SUCCESS_SERIES)

    def _stop(self) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        try:
            profiler_call(self.endpoint, "stop")
        except EngineError as exc:
            self.errors.append(f"profiling window not closed cleanly: {exc}")
