"""Whether a run's latency samples are too noisy for its median to be trusted.

A run is **noisy** when either holds (the thresholds are the module's constants):

- a long tail: p99 / p50 above `TAIL_RATIO` (1.5): one call in a hundred took half again the median or more;
- a bimodal spread: sorted, the samples have a gap wider than `GAP_SHARE` (20%) of the median with at least
  `MODE_SHARE` (10%) of the samples on each side of it: the calls ran at two speeds (another process took
  cores part of the time, a frequency change, a cache that sometimes misses), so the median stands for neither.

Both need `MIN_SAMPLES` (10) samples; with fewer there is no verdict. Pinning threads (`--threads 1`),
closing other work and more iterations usually help.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

TAIL_RATIO = 1.5
GAP_SHARE = 0.2
MODE_SHARE = 0.1
MIN_SAMPLES = 10


@dataclass(frozen=True)
class Noise:
    """The verdict on one run's samples: `tail_ratio` (p99/p50), whether they split in two (`bimodal`),
    and `reason`, a short phrase for the surfaces ("p99 is 2.1× p50"; "" when not noisy)."""

    tail_ratio: float
    bimodal: bool
    reason: str

    @property
    def noisy(self) -> bool:
        return bool(self.reason)


def latency_noise(benchmark: Mapping[str, Any] | None) -> Noise | None:
    """The noise verdict of a run's benchmark statistics (run.json `benchmark`: p50, p99, samples_ms); None when
    there are too few samples (or no benchmark) to judge."""
    bench = benchmark or {}
    samples = np.asarray([s for s in bench.get("samples_ms") or () if isinstance(s, (int, float))], dtype=float)
    p50, p99 = bench.get("p50"), bench.get("p99")
    if len(samples) >= MIN_SAMPLES:
        p50, p99 = (float(v) for v in np.percentile(samples, [50, 99]))
    elif samples.size or not (isinstance(bench.get("iterations"), int) and bench["iterations"] >= MIN_SAMPLES):
        return None  # too few samples (a bundle with statistics only is judged by its p99/p50)
    if not isinstance(p50, (int, float)) or not isinstance(p99, (int, float)) or p50 <= 0:
        return None
    tail = float(p99) / float(p50)
    bimodal = _bimodal(samples, float(p50))
    reasons = []
    if tail > TAIL_RATIO:
        reasons.append(f"p99 is {tail:.1f}× p50")
    if bimodal:
        reasons.append("samples split in two clusters")
    return Noise(tail, bimodal, "; ".join(reasons))


def _bimodal(samples: np.ndarray, p50: float) -> bool:
    """Whether the sorted samples have a gap wider than GAP_SHARE × p50 with MODE_SHARE of them on each side."""
    if len(samples) < MIN_SAMPLES:
        return False
    ordered = np.sort(samples)
    gaps = np.diff(ordered)
    least = max(int(np.ceil(MODE_SHARE * len(ordered))), 1)
    inner = gaps[least - 1:len(gaps) - least + 1]  # gaps with at least `least` samples on each side
    return bool(inner.size and inner.max() > GAP_SHARE * p50)
