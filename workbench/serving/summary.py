"""The headline of a serving run (`workbench show`, `--json`): its load, its latency summary (computed again from
the `requests` table when the run record has none: an imported generator result), where the requests' time
went, and the findings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from workbench.serving.findings import serving_findings
from workbench.serving.metrics import latency_summary
from workbench.trace.columns import floats

PHASES = ("queued_ns", "prefill_ns", "delivery_ns", "decode_ns", "stalled_ns")


def serving_summary(serving: dict[str, Any] | None, requests: pa.Table | None, steps: pa.Table | None,
                    counters: pa.Table | None) -> dict[str, Any] | None:
    """`{"load", "generator", "window", "slo_ms", "metrics", "phases_ms", "findings"}`; None without requests."""
    if requests is None:
        return None
    serving = serving or {}
    metrics = serving.get("summary") or latency_summary(requests, serving.get("slo"))
    return {"load": serving.get("load"), "generator": serving.get("generator") or _source(requests),
            "window": serving.get("window"), "metrics": metrics, "phases_ms": phase_split(requests),
            "findings": [f.to_dict() for f in serving_findings(requests, steps, counters)]}


def _source(requests: pa.Table) -> str | None:
    values = requests["source"].unique().to_pylist() if "source" in requests.column_names else []
    return values[0] if len(values) == 1 else None


def phase_split(requests: pa.Table) -> dict[str, dict[str, float]] | None:
    """Median queued, prefill, delivery, decode and stalled-behind-prefill time (ms) of all requests joined to
    steps, and of the slowest 1% by TTFT; None when no request was joined."""
    if "queued_ns" not in requests.column_names:
        return None
    values = {name: floats(requests[name]) for name in PHASES}
    joined = ~np.isnan(values["queued_ns"])
    if not joined.any():
        return None
    ttft = floats(requests["ttft_ns"])
    slow = joined & (ttft >= np.nanquantile(ttft[joined], 0.99))
    return {group: {name.removesuffix("_ns"): float(np.median(values[name][rows])) / 1e6 for name in PHASES}
            for group, rows in (("all", joined), ("slowest_ttft", slow))}
