"""What inference costs: measured runs priced on their own device, and projections onto other hardware.

A measured row prices a run's median latency at its device's hourly price: USD per million calls,
items and tokens (a price comes from the hardware table, `$WORKBENCH_PRICES`, or the caller; a CPU
has none unless given). A projection row puts the same run's work onto another device through the
roofline: each kernel of a profiled step (`fusion.kernel_units`: XLA ops, GPU kernels, or on a CPU
torch trace the dispatched ops and generated kernels) takes max(FLOPs / peak, bytes / bandwidth) of
the target, and the step is their sum. That is the time of perfect kernels with no launch, dispatch or
host cost, so it is optimistic, most of all for small models; `work_known` says how much of the
measured kernel time had known FLOPs or bytes (the rest counts as free). Projections are labelled
`basis = "projection"` and never mixed up with measurements.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.fusion import kernel_units
from workbench.analysis.roofline import event_work, roof_columns, run_device_spec
from workbench.hardware.device import DTYPES, DeviceSpec
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name

COLUMNS = ("run", "variant", "basis", "device", "latency_ms", "items_per_s", "tokens_per_s", "price_per_hour",
           "usd_per_million_calls", "usd_per_million_items", "usd_per_million_tokens", "work_known")


def cost_table(bundles: Sequence[Bundle], targets: Sequence[DeviceSpec] = (), *,
               price_per_hour: float | None = None) -> pd.DataFrame:
    """One measured row per run (priced at `price_per_hour` when given, else its device's price), then
    one projection row per run with a trace and per target device.

    | run | variant | basis | device | latency_ms | items_per_s | tokens_per_s | price_per_hour |
    | usd_per_million_calls | usd_per_million_items | usd_per_million_tokens | work_known |
    """
    rows = []
    for bundle in bundles:
        record = bundle.record
        items, tokens = record.items_per_call or 1, record.tokens_per_call
        own = run_device_spec(record, None)
        price = price_per_hour if price_per_hour is not None else (own.price_per_hour if own else None)
        base = {"run": bundle.run_id, "variant": display_name(record)}
        if record.p50_ms:
            rows.append({**base, "basis": "measured", "device": record.device,
                         **_priced(record.p50_ms * 1e6, items, tokens, price), "work_known": np.nan})
        if targets and bundle.has_trace:
            steps = _projected_steps(bundle, targets)
            for target in targets:
                step_ns, known = steps[target.name]
                rows.append({**base, "basis": "projection", "device": target.name,
                             **_priced(step_ns, items, tokens, target.price_per_hour), "work_known": known})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _priced(latency_ns: float, items: int, tokens: int | None, price: float | None) -> dict[str, float]:
    """Throughput and cost per million of a call taking `latency_ns`, at `price` USD per hour."""
    seconds = latency_ns / 1e9
    per_call = price / 3600 * seconds if price is not None and seconds > 0 else np.nan
    return {
        "latency_ms": latency_ns / 1e6,
        "items_per_s": items / seconds if seconds > 0 else np.nan,
        "tokens_per_s": tokens / seconds if tokens and seconds > 0 else np.nan,
        "price_per_hour": np.nan if price is None else price,
        "usd_per_million_calls": per_call * 1e6,
        "usd_per_million_items": per_call / items * 1e6,
        "usd_per_million_tokens": per_call / tokens * 1e6 if tokens else np.nan,
    }


def _projected_steps(bundle: Bundle, targets: Sequence[DeviceSpec]) -> dict[str, tuple[float, float]]:
    """Per target: (median projected ns of a profiled step, share of measured kernel time with known work)."""
    trace = bundle.trace()
    units = kernel_units(trace)
    units = units[units["step"] >= 0]
    if units.empty:
        return {target.name: (np.nan, np.nan) for target in targets}
    work = event_work(trace.df()).iloc[units["row"].to_numpy()].reset_index(drop=True)
    precision = bundle.record.variant_precision
    if precision in DTYPES:
        work["dtype"] = work["dtype"].fillna(precision)
    known = (work["flops"].notna() | work["bytes"].notna()).to_numpy()
    duration = units["dur_ns"].to_numpy(dtype=np.float64)
    known_share = float(duration[known].sum() / duration.sum()) if duration.sum() > 0 else np.nan
    result = {}
    for target in targets:
        roof = np.nan_to_num(roof_columns(work, target, latency_ns=0.0)["roof_ns"].to_numpy())
        per_step = pd.Series(roof).groupby(units["step"].to_numpy()).sum()
        result[target.name] = (float(per_step.median()), known_share)
    return result
