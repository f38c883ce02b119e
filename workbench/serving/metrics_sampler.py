"""The engine's Prometheus `/metrics`, sampled on a fixed period while the load runs, as counter series of the
run's bundle (the `counters` table, device `server`), on the same clock as the requests and the engine trace.

A serving engine reports its state there: requests running and waiting, KV-cache usage, prefix-cache queries
and hits, preemptions, tokens in and out. Each gauge and counter family of the engine's own metrics (names
with a `vllm:` or `sglang:` prefix) becomes one series, summed over its labels (the model name, a finish
reason); histograms and the series' creation times (`_created`) are left out: the per-request table has the
latencies they bin. The number of series is bounded (`MAX_SERIES`), and samples by the period and the duration
the caller sets, so a server that exposes thousands of families cannot grow the run.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable

import httpx
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from workbench.trace.schema import COUNTERS

ENGINE_PREFIXES = ("vllm:", "sglang:")
"""The prefixes of the engines' own metric names."""
KINDS = ("gauge", "counter")
MAX_SERIES = 64
"""Series kept per run: the first this many families a server exposes."""
DEVICE = "server"
"""The `device` of the sampled series in the counters table."""


def engine_series(text: str) -> dict[str, float]:
    """Each engine gauge or counter in a Prometheus exposition `text`, summed over its labels."""
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if (family.type not in KINDS or not family.name.startswith(ENGINE_PREFIXES)
                or family.name.endswith("_created")):
            continue
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                values[sample.name] += float(sample.value)
    return dict(values)


class MetricsSampler:
    """Scrapes `url`/metrics every `period_s` in a background thread between `start()` and `stop()`.

    `samples` holds (epoch ns, name, value). A failed scrape is counted in `failures` (an engine busy past the
    timeout, or gone) and the next one tried on time."""

    def __init__(self, url: str, period_s: float = 0.5, timeout_s: float = 2.0) -> None:
        self.url = f"{url.rstrip('/')}/metrics"
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.samples: list[tuple[int, str, float]] = []
        self.failures = 0
        self._series: set[str] = set()
        self._client = httpx.Client(timeout=timeout_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-metrics", daemon=True)

    def start(self) -> MetricsSampler:
        """Take a first sample now (what later samples are compared with), then one every period in the
        background."""
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling after one last sample, so the series cover the end of the load."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self._stop.wait(max(0.0, (next_at := next_at + self.period_s) - time.monotonic())):
                self._sample()
            self._sample()
        finally:
            self._client.close()

    def _sample(self) -> None:
        at = time.time_ns()
        try:
            reply = self._client.get(self.url)
            reply.raise_for_status()
            values = engine_series(reply.text)
        except (httpx.HTTPError, ValueError):
            self.failures += 1
            return
        for name, value in values.items():
            if name not in self._series:
                if len(self._series) >= MAX_SERIES:
                    continue
                self._series.add(name)
            self.samples.append((at, name, value))


def counters_table(samples: Iterable[tuple[int, str, float]], origin_ns: int) -> pa.Table:
    """Samples (epoch ns, name, value) as rows of the Trace's counters table, times from `origin_ns`."""
    rows = list(samples)
    return pa.table({"ts_ns": pa.array([at - origin_ns for at, _, _ in rows], pa.int64()),
                     "device": pa.array([DEVICE] * len(rows)).dictionary_encode(),
                     "name": pa.array([name for _, name, _ in rows]).dictionary_encode(),
                     "value": pa.array([value for _, _, value in rows], pa.float64())}).cast(COUNTERS)
