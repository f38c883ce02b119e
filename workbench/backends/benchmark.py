"""Latency harness: warm-up, then timed iterations with the contenders interleaved round-robin.

Interleaving means machine drift (thermal, noisy neighbours, frequency changes) hits every
contender alike, so their medians stay comparable. Round r calls the contenders in registration
order rotated by r, so none is always first after the previous round's last one. Every sample is
kept. Timing is a small strategy object (`Timer`): host wall clock around a device sync by
default, CUDA events as an alternative on GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from workbench.errors import WorkbenchError

ProgressCallback = Callable[[str, int, int], None]
"""Called after each round with (phase: "warmup" | "measure", rounds done, rounds in the phase)."""


class Timer(Protocol):
    """Times one call of a zero-argument callable, in nanoseconds."""

    name: str

    def measure_ns(self, fn: Callable[[], object]) -> int: ...


def _no_sync() -> None:
    """Default sync for devices that run synchronously (CPU)."""


@dataclass(frozen=True)
class WallClockTimer:
    """Host wall time (`time.perf_counter_ns`) between two device syncs: the latency a caller sees."""

    sync: Callable[[], None] = _no_sync
    name: str = "wall-clock"

    def measure_ns(self, fn: Callable[[], object]) -> int:
        self.sync()
        start = time.perf_counter_ns()
        fn()
        self.sync()
        return time.perf_counter_ns() - start


@dataclass(frozen=True)
class CudaEventTimer:
    """Device time between CUDA events recorded on the current stream before and after the call."""

    name: str = "cuda-event"

    def measure_ns(self, fn: Callable[[], object]) -> int:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return round(start.elapsed_time(end) * 1e6)


@dataclass
class Workload:
    """One contender: a zero-argument callable, what one call processes, and how to time it.

    `first_call_ms` (the compile / first-call time measured by the caller) is passed through to
    the stats so they report it beside the steady state.
    """

    fn: Callable[[], object]
    items: int = 1
    tokens: int | None = None
    timer: Timer = field(default_factory=WallClockTimer)
    first_call_ms: float | None = None


@dataclass
class LatencyStats:
    """Latency of one contender; every time is in milliseconds, std is the sample std (ddof=1).

    Throughput is computed at the median: items (tokens) per call / p50; None when p50 is 0 (a
    timer too coarse to see the call) or, for tokens, when the model has no sequence axis.
    """

    samples_ms: list[float]
    p50: float
    p90: float
    p99: float
    mean: float
    std: float
    min: float
    max: float
    iterations: int
    warmup: int
    items_per_s: float | None
    tokens_per_s: float | None
    torch_threads: int
    timer: str
    first_call_ms: float | None = None

    @classmethod
    def from_samples(
        cls, samples_ns: Sequence[int], workload: Workload, *, warmup: int, torch_threads: int
    ) -> LatencyStats:
        """Summary statistics of raw samples (ns) for `workload`."""
        ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
        p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
        per_s = 1e3 / p50 if p50 > 0 else None
        return cls(
            samples_ms=ms.tolist(),
            p50=p50,
            p90=p90,
            p99=p99,
            mean=float(ms.mean()),
            std=float(ms.std(ddof=1)) if len(ms) > 1 else 0.0,
            min=float(ms.min()),
            max=float(ms.max()),
            iterations=len(ms),
            warmup=warmup,
            items_per_s=None if per_s is None else workload.items * per_s,
            tokens_per_s=None if per_s is None or workload.tokens is None else workload.tokens * per_s,
            torch_threads=torch_threads,
            timer=workload.timer.name,
            first_call_ms=workload.first_call_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for run.json)."""
        return asdict(self)


class WorkloadFailed(Exception):
    """A workload's call raised during `run_benchmark`: `name` says which, `cause` is what it raised."""

    def __init__(self, name: str, cause: Exception) -> None:
        super().__init__(f"{name}: {cause}")
        self.name, self.cause = name, cause


def benchmark_until_clean(
    make_workloads: Callable[[], Mapping[str, Workload]],
    on_failure: Callable[[str, Exception], None],
    *,
    warmup: int = 5,
    iterations: int = 30,
    progress: ProgressCallback | None = None,
) -> dict[str, LatencyStats]:
    """`run_benchmark` over the workloads `make_workloads()` returns; when one raises, `on_failure(name,
    exception)` is told and the benchmark starts over (warm-up included) on what `make_workloads()`
    returns next, so the survivors' samples all come from rounds in which every contender ran. Returns
    {} once `make_workloads()` returns none."""
    while workloads := make_workloads():
        try:
            return run_benchmark(workloads, warmup=warmup, iterations=iterations, progress=progress)
        except WorkloadFailed as failure:
            on_failure(failure.name, failure.cause)
    return {}


def _rounds(
    workloads: Mapping[str, Workload], rounds: int, phase: str, progress: ProgressCallback | None
) -> dict[str, list[int]]:
    names = list(workloads)
    samples: dict[str, list[int]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            workload = workloads[name]
            try:
                samples[name].append(workload.timer.measure_ns(workload.fn))
            except Exception as exc:
                raise WorkloadFailed(name, exc) from exc
        if progress is not None:
            progress(phase, r + 1, rounds)
    return samples


def run_benchmark(
    workloads: Mapping[str, Workload],
    *,
    warmup: int = 5,
    iterations: int = 30,
    progress: ProgressCallback | None = None,
) -> dict[str, LatencyStats]:
    """Warm up every workload, then time `iterations` interleaved rounds; stats per workload name.
    A workload whose call raises stops the benchmark with `WorkloadFailed` naming it."""
    if not workloads:
        raise WorkbenchError("benchmark needs at least one workload")
    if warmup < 0 or iterations < 1:
        raise WorkbenchError(f"benchmark needs warmup >= 0 and iterations >= 1 (got {warmup}, {iterations})")
    _rounds(workloads, warmup, "warmup", progress)
    samples = _rounds(workloads, iterations, "measure", progress)
    threads = torch.get_num_threads()
    return {
        name: LatencyStats.from_samples(samples[name], workloads[name], warmup=warmup, torch_threads=threads)
        for name in workloads
    }
