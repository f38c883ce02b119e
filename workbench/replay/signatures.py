"""A trace's framework op calls grouped by signature and ranked by self time: what an op replay rebuilds.

A signature is an op name with everything torch.profiler recorded about its inputs (dims, types, strides and
concrete values), so two calls of one signature are the same call and one rebuild stands for all of them. Calls
recorded without inputs (`record_shapes=False`, or an op the profiler gives no inputs) group by name alone.

Ranking is by self time (the call's duration less its nested ops'), summed over the signature's calls: where the
time is spent, without counting a wrapper (aten::linear) and the op it calls (aten::addmm) twice. The time a
replay is compared against is the inclusive time of one call, since a standalone call runs its nested ops too:
on a GPU the device time the call launched (when it launched any), else its host duration.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd

from workbench.analysis.breakdown import device_time_launched_ns, is_wrapper, phase_window, self_time_ns
from workbench.analysis.op_cost import compute_dtype, op_cost
from workbench.replay.calls import recorded_inputs
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE

SIGNATURE_COLUMNS = ("name", "inputs", "calls", "trace_ns", "self_ns", "device", "flops", "bytes", "dtype")
"""Columns of `op_signatures`."""


def op_signatures(trace: Trace, phase: str | None = PHASE_MEASURE) -> pd.DataFrame:
    """One row per distinct op call signature in the `phase` annotation (the whole trace without it), most self
    time first.

    | name | inputs | calls | trace_ns | self_ns | device | flops | bytes | dtype |

    `inputs` is the recorded input lists of the signature (`calls.recorded_inputs`; None when not recorded),
    `calls` an int, `trace_ns` the median inclusive time of one call (device time launched where the call
    launched any, else host duration), `self_ns` the summed self time, `device` "cuda" where the calls launched
    device work, else "cpu"; `flops` and `bytes` of one call from its shapes (`op_cost`; NaN when unknown).
    Profiler wrappers (`ProfilerStep#N`) are left out.
    """
    events = trace.df()
    if events.empty:
        return pd.DataFrame(columns=[*SIGNATURE_COLUMNS])
    self_ns = self_time_ns(events)
    launched = device_time_launched_ns(events)
    rows = (events["kind"] == "op").to_numpy() & ~is_wrapper(events["name"])
    window = phase_window(trace, phase) if phase else None
    if window is not None:
        start = events["start_ns"].to_numpy()
        rows &= (start >= window[0]) & (start < window[1])
    picked = np.flatnonzero(rows)
    if not len(picked):
        return pd.DataFrame(columns=[*SIGNATURE_COLUMNS])
    names = events["name"].astype(str).to_numpy()[picked]
    args = events["args"].to_numpy(dtype=object)[picked]
    keys: list[str] = []
    inputs_of: dict[str, dict | None] = {}
    for name, text in zip(names, args, strict=True):
        inputs = recorded_inputs(text)
        key = name if inputs is None else f"{name}\x00{msgspec.json.encode(inputs).decode()}"
        inputs_of.setdefault(key, inputs)
        keys.append(key)
    on_device = launched[picked] > 0
    frame = pd.DataFrame({
        "key": keys, "name": names, "self_ns": self_ns[picked],
        "time_ns": np.where(on_device, launched[picked], events["dur_ns"].to_numpy()[picked]),
        "on_device": on_device,
    })
    grouped = frame.groupby("key", sort=False)
    table = pd.DataFrame({
        "name": grouped["name"].first(),
        "calls": grouped.size().astype(np.int64),
        "trace_ns": grouped["time_ns"].median(),
        "self_ns": grouped["self_ns"].sum().astype(np.int64),
        "device": np.where(grouped["on_device"].any(), "cuda", "cpu"),
    })
    table["inputs"] = [inputs_of[key] for key in table.index]
    costs = [_cost(name, inputs) for name, inputs in zip(table["name"], table["inputs"], strict=True)]
    table["flops"] = [c[0] for c in costs]
    table["bytes"] = [c[1] for c in costs]
    table["dtype"] = [c[2] for c in costs]
    table = table.sort_values("self_ns", ascending=False, kind="stable", ignore_index=True)
    return table[[*SIGNATURE_COLUMNS]]


def _cost(name: str, inputs: dict | None) -> tuple[float, float, str | None]:
    """FLOPs, bytes and compute dtype of one call from its recorded inputs (NaN, NaN, None when unknown)."""
    if inputs is None:
        return np.nan, np.nan, None
    types = [str(t) for t in inputs["Input type"]]
    dims = inputs.get("Input Dims") if isinstance(inputs.get("Input Dims"), list) else []
    concrete = inputs.get("Concrete Inputs") if isinstance(inputs.get("Concrete Inputs"), list) else None
    cost = op_cost(name, dims, types, [str(c) for c in concrete] if concrete is not None else None)
    if cost is None:
        return np.nan, np.nan, compute_dtype(types)
    return cost.flops, cost.bytes, cost.dtype
