"""The benchmark harness: interleaving, sample bookkeeping and statistics, with fake timers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch

from workbench.backends.benchmark import (
    CudaEventTimer,
    LatencyStats,
    WallClockTimer,
    Workload,
    WorkloadFailed,
    benchmark_until_clean,
    run_benchmark,
)
from workbench.errors import WorkbenchError


@dataclass
class ScriptedTimer:
    """Returns the next scripted duration (ns) and runs the call, like a real timer would."""

    durations_ns: list[int]
    name: str = "scripted"
    calls: int = field(default=0)

    def measure_ns(self, fn):
        fn()
        value = self.durations_ns[self.calls % len(self.durations_ns)]
        self.calls += 1
        return value


def _recording(log: list[str], name: str, timer=None, **kwargs) -> Workload:
    timer = timer or ScriptedTimer([1_000_000])
    return Workload(fn=lambda: log.append(name), timer=timer, **kwargs)


def test_rounds_interleave_every_variant_with_rotating_start():
    log: list[str] = []
    workloads = {name: _recording(log, name) for name in ("a", "b", "c")}
    stats = run_benchmark(workloads, warmup=2, iterations=4)
    rounds = [log[i : i + 3] for i in range(0, len(log), 3)]
    assert rounds == [
        ["a", "b", "c"], ["b", "c", "a"],  # warm-up
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],  # measured
    ]
    for name in workloads:
        assert stats[name].iterations == 4
        assert len(stats[name].samples_ms) == 4
        assert stats[name].warmup == 2


def test_stats_come_from_the_measured_samples_only():
    # Two huge warm-up samples, then 1..4 ms.
    timer = ScriptedTimer([900_000_000, 900_000_000, 1_000_000, 2_000_000, 3_000_000, 4_000_000])
    stats = run_benchmark({"x": Workload(fn=lambda: None, timer=timer, items=4)}, warmup=2, iterations=4)["x"]
    assert stats.samples_ms == [1.0, 2.0, 3.0, 4.0]
    assert stats.p50 == 2.5
    assert stats.p90 == pytest.approx(3.7)
    assert stats.p99 == pytest.approx(3.97)
    assert stats.mean == 2.5
    assert stats.std == pytest.approx((5.0 / 3.0) ** 0.5)  # sample std
    assert (stats.min, stats.max) == (1.0, 4.0)
    assert stats.items_per_s == pytest.approx(4 / 2.5e-3)
    assert stats.tokens_per_s is None
    assert stats.timer == "scripted"
    assert stats.torch_threads == torch.get_num_threads()


def test_tokens_throughput_and_first_call_pass_through():
    workload = Workload(
        fn=lambda: None, timer=ScriptedTimer([2_000_000]), items=2, tokens=256, first_call_ms=1234.5
    )
    stats = run_benchmark({"gpt": workload}, warmup=0, iterations=3)["gpt"]
    assert stats.tokens_per_s == pytest.approx(256 / 2e-3)
    assert stats.items_per_s == pytest.approx(2 / 2e-3)
    assert stats.first_call_ms == 1234.5
    assert stats.std == 0.0


def test_zero_duration_gives_no_throughput():
    stats = run_benchmark({"x": Workload(fn=lambda: None, timer=ScriptedTimer([0]))}, warmup=0, iterations=1)
    assert stats["x"].items_per_s is None
    assert stats["x"].std == 0.0


def test_progress_is_reported_after_each_round():
    seen = []
    workloads = {name: Workload(fn=lambda: None, timer=ScriptedTimer([1])) for name in ("a", "b")}
    run_benchmark(workloads, warmup=1, iterations=3, progress=lambda *args: seen.append(args))
    assert seen == [("warmup", 1, 1), ("measure", 1, 3), ("measure", 2, 3), ("measure", 3, 3)]


def test_to_dict_is_json_ready():
    stats = run_benchmark({"x": Workload(fn=lambda: None, timer=ScriptedTimer([1_500_000]))}, iterations=2)
    data = stats["x"].to_dict()
    assert data["p50"] == 1.5 and data["samples_ms"] == [1.5, 1.5]
    assert LatencyStats(**data) == stats["x"]
    json.dumps(data, allow_nan=False)


def test_wall_clock_timer_syncs_around_the_call():
    log: list[str] = []
    timer = WallClockTimer(sync=lambda: log.append("sync"))
    elapsed = timer.measure_ns(lambda: log.append("call"))
    assert log == ["sync", "call", "sync"]
    assert isinstance(elapsed, int) and elapsed >= 0


def test_default_timer_is_the_wall_clock():
    stats = run_benchmark({"x": Workload(fn=lambda: None)}, warmup=0, iterations=2)
    assert stats["x"].timer == "wall-clock"
    assert all(sample >= 0 for sample in stats["x"].samples_ms)


@pytest.mark.parametrize(("warmup", "iterations"), [(-1, 3), (0, 0)])
def test_bad_iteration_counts(warmup, iterations):
    with pytest.raises(WorkbenchError, match="iterations"):
        run_benchmark({"x": Workload(fn=lambda: None)}, warmup=warmup, iterations=iterations)


def test_no_workloads_is_an_error():
    with pytest.raises(WorkbenchError, match="at least one"):
        run_benchmark({})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_event_timer_measures_device_work():
    x = torch.randn(1024, 1024, device="cuda")
    assert CudaEventTimer().measure_ns(lambda: x @ x) > 0


def _failing_after(calls: int, log: list[str], name: str) -> Workload:
    """A workload that raises on its `calls + 1`-th call."""
    done = []

    def fn():
        if len(done) == calls:
            raise RuntimeError("device lost")
        done.append(1)
        log.append(name)

    return Workload(fn=fn, timer=ScriptedTimer([1_000_000]))


def test_a_raising_workload_is_named():
    with pytest.raises(WorkloadFailed) as caught:
        run_benchmark({"ok": _recording([], "ok"), "bad": _failing_after(3, [], "bad")}, warmup=1, iterations=5)
    assert caught.value.name == "bad"
    assert isinstance(caught.value.cause, RuntimeError)


def test_until_clean_drops_the_failed_workload_and_starts_the_rest_over():
    log: list[str] = []
    failed: list[tuple[str, str]] = []
    alive = {"a": True, "b": True, "c": True}
    attempts = []

    def make():
        attempts.append(sorted(n for n, ok in alive.items() if ok))
        log.clear()
        return {n: (_failing_after(4, log, n) if n == "b" else _recording(log, n)) for n, ok in alive.items() if ok}

    def on_failure(name, exc):
        failed.append((name, str(exc)))
        alive[name] = False

    stats = benchmark_until_clean(make, on_failure, warmup=1, iterations=6)
    assert failed == [("b", "device lost")]
    assert attempts == [["a", "b", "c"], ["a", "c"]]
    assert set(stats) == {"a", "c"}
    assert all(s.iterations == 6 for s in stats.values())
    assert log.count("a") == log.count("c") == 7  # the second attempt alone: 1 warm-up + 6 rounds


def test_until_clean_with_every_workload_failed_returns_nothing():
    alive = {"x": True}
    stats = benchmark_until_clean(lambda: {"x": _failing_after(0, [], "x")} if alive["x"] else {},
                                  lambda name, exc: alive.update({name: False}), warmup=0, iterations=2)
    assert stats == {} and alive == {"x": False}
