"""Model guidance: what in a model fits an accelerator badly, with the operators that show it and the time a change
would save, each gain measured by projecting the changed graph (or description) again, never estimated.

Findings (`guidance` returns those that apply, largest gain first):

- **padding**: matrix operators whose weight dimension (a matmul's or convolution's N, attention's head dim) is
  not a multiple of the array's columns leave columns of the last tile idle. Change: each such dimension rounded
  to the nearest multiple of the array (up when the remainder is at least half the array or the dimension is
  below it: same tiles, wider layer; down otherwise: one tile column fewer), FLOPs, bytes and the fused chain
  after it scaled alike. A gain of 0 says the rounding up is free.
- **host fallback**: operators of a kind the chip does not run natively cross the host link. Change: the kind
  made native (what replacing them with a native operator would buy).
- **layout**: layout copies between operators (`clone`, `contiguous`: a transpose made contiguous). Change:
  the copies removed (the consumer reads the layout the producer writes).
- **vector**: softmax and normalization on the vector units (kind softmax or norm, or any vector operator of a
  layer whose name says norm, as Hugging Face's RMSNorm is written out op by op). Change: their tensors kept on
  chip (fused into the matrix operator beside them): only their compute remains.
- **precision**: operators in a dtype their unit has no rate for (an fp32 matmul on a bf16/int8 array runs as
  bf16 but still moves fp32). Change: those operators in the dtype they run in (`graph.at_dtype`).
- **attention**: for a decoder-only language model (`GraphSource.llm`), the KV cache per token of MHA, GQA, MQA
  and MLA (`workbench.llm.perf_model.attention_variants`) and one decode step at the forward's sequence length
  on this chip (the performance model's FLOPs and bytes of the pass: max(FLOPs / matrix rate, bytes / off-chip
  bandwidth)). Change: the variant with the fastest step; its step is the one the share is of.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from workbench.codesign.description import Description
from workbench.codesign.graph import FLOAT_DTYPES, at_dtype
from workbench.codesign.projection import MATRIX_KINDS, VECTOR_KINDS, project
from workbench.codesign.sensitivity import step_ns
from workbench.views.text_tables import format_count, format_duration

if TYPE_CHECKING:
    from workbench.llm.perf_model import LLMConfig

LAYOUT_COPIES = frozenset({"clone", "contiguous"})
"""Operators that only change a tensor's layout (a transposed view made contiguous)."""
MIN_SHARE = 0.001
"""Findings whose measure (gain or time involved) is below this share of the step are left out."""


@dataclass(frozen=True)
class Finding:
    """One piece of guidance: what fits badly (`title`), the rows that show it (`evidence`), the change projected
    (`change`) and the time it saves on the step (`gain_ns` of `step_ns`; `step` names that step)."""

    kind: str
    title: str
    change: str
    evidence: pd.DataFrame
    gain_ns: float
    step_ns: float
    step: str = "step"

    @property
    def gain_share(self) -> float:
        """The gain as a share of the step."""
        return self.gain_ns / self.step_ns if self.step_ns else math.nan

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields, the share and the evidence rows."""
        return {"kind": self.kind, "title": self.title, "change": self.change, "gain_ns": self.gain_ns,
                "gain_share": self.gain_share, "step_ns": self.step_ns, "step": self.step,
                "evidence": self.evidence.replace({np.nan: None}).to_dict("records")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """A finding back from `to_dict` (the CLI's JSON of it): its evidence rows a DataFrame again, a column
        of only nulls as NaN (as the finding held it)."""
        evidence = pd.DataFrame.from_records(data["evidence"])
        evidence = evidence.apply(lambda c: c.astype("float64") if c.isna().all() else c)
        return cls(data["kind"], data["title"], data["change"], evidence, float(data["gain_ns"]),
                   float(data["step_ns"]), data.get("step", "step"))


def guidance(graph: pd.DataFrame, description: Description, *, steps: int = 1, llm: LLMConfig | None = None,
             batch: int = 1, context: int | None = None) -> list[Finding]:
    """The findings (module docstring) of `graph` (covering `steps` steps) on `description`, largest gain first;
    `llm`, `batch` and `context` (the cached tokens of the decode step) enable the attention-variant finding."""
    base = project(graph, description)
    step = float(base["time_ns"].sum() / steps)
    found = [_padding(graph, base, description, step, steps), *_host(graph, base, description, step, steps),
             _layout(graph, base, description, step, steps), _vector(graph, base, description, step, steps),
             _precision(graph, base, description, step, steps)]
    if llm is not None and context:
        found.append(_attention(llm, graph, description, batch, context))
    return sorted((f for f in found if f is not None), key=lambda f: -f.gain_ns)


def shape_text(row: Any) -> str:
    """An operator's shape as guidance shows it: "128x256 @ 256x1024" (batch "8 x " before), or "65,536
    elements"."""
    if isinstance(row.get("m"), float | int) and not math.isnan(row["m"]):
        batch = f"{int(row['batch'])} x " if row.get("batch", 1) and row["batch"] > 1 else ""
        return f"{batch}{int(row['m'])}x{int(row['k'])} @ {int(row['k'])}x{int(row['n'])}"
    if isinstance(row.get("elements"), float | int) and not math.isnan(row["elements"]):
        return f"{format_count(row['elements'])} elements"
    return f"{format_count(row['bytes'])} B"


def _evidence(graph: pd.DataFrame, base: pd.DataFrame, index: Any, **extra: Any) -> pd.DataFrame:
    """The evidence rows of the operators at `index`, slowest first: order, name, layer, shape and projected time,
    then `extra` columns (values aligned with `index`)."""
    ops = graph.loc[index]
    frame = pd.DataFrame({"order": ops["order"].astype(int), "name": ops["name"], "layer": ops["layer"],
                          "shape": [shape_text(row) for row in ops.to_dict("records")],
                          "time_ns": base.loc[index, "time_ns"]})
    for name, values in extra.items():
        frame[name] = list(values)
    return frame.sort_values("time_ns", ascending=False).reset_index(drop=True)


def _ops(count: int, noun: str = "operator", plural: str | None = None) -> str:
    """"1 operator", "3 operators"."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _nearest(dim: int, width: int) -> int:
    """`dim` rounded to the nearest multiple of `width` (half up), at least `width`."""
    return max(width, math.floor(dim / width + 0.5) * width)


def _padding(graph: pd.DataFrame, base: pd.DataFrame, d: Description, step: float, steps: int) -> Finding | None:
    if not d.tiled:
        return None
    cols = d.matrix.cols
    assert cols is not None
    matrix = graph[graph["kind"].isin(MATRIX_KINDS) & graph["m"].notna() & graph["kind"].isin(d.native_ops)]
    weight_dim = np.where(matrix["kind"] == "attention", matrix["k"], matrix["n"]).astype(int)
    padded = matrix[weight_dim % cols != 0]
    if padded.empty:
        return None
    changed = graph.copy()
    dims, rounded, used = [], [], []
    for index, op in padded.iterrows():
        attention = op["kind"] == "attention"
        dim = int(op["k"] if attention else op["n"])
        new = _nearest(dim, cols)
        m, k, n = float(op["m"]), float(op["k"]), float(op["n"])
        k2, n2 = (new, n) if attention else (k, new)
        before = (m * k + 2 * n * k + m * k) if attention else (m * k + k * n + m * n)
        after = (m * k2 + 2 * n * k2 + m * k2) if attention else (m * k2 + k2 * n2 + m * n2)
        out = k2 / k if attention else n2 / n
        changed.loc[index, ["k", "n"]] = [k2, n2]
        changed.loc[index, "flops"] = op["flops"] * k2 * n2 / (k * n)
        changed.loc[index, "bytes"] = op["bytes"] * after / before
        changed.loc[index, "out_bytes"] = op["out_bytes"] * out
        chain = base.index[(base["group"] == op["order"]) & (base.index != index)]
        for column in ("elements", "transcendental", "flops", "bytes", "out_bytes"):
            changed.loc[chain, column] = changed.loc[chain, column] * out
        dims.append(f"{'head dim' if attention else 'N'} {dim}")
        rounded.append(new)
        used.append(dim / (math.ceil(dim / cols) * cols))
    projected = project(changed, d)
    gain = step - float(projected["time_ns"].sum() / steps)
    idle = float((base.loc[padded.index, "compute_ns"] * (1 - base.loc[padded.index, "utilization"])).sum()) / steps
    if max(gain, idle) < MIN_SHARE * step:
        return None
    evidence = _evidence(graph, base, padded.index, dim=dims, rounded=rounded, columns_used=used,
                         rounded_time_ns=projected.loc[padded.index, "time_ns"])
    return Finding("padding", f"{_ops(len(padded) // steps, 'matrix operator')} per step with a weight dimension "
                   f"that is not a multiple of the {d.matrix.rows}x{cols} array: {format_duration(idle)} per step "
                   "of MAC slots idle", f"each such dimension rounded to the nearest multiple of {cols}", evidence,
                   gain, step)


def _host(graph: pd.DataFrame, base: pd.DataFrame, d: Description, step: float, steps: int) -> list[Finding]:
    found = []
    host = base[base["unit"] == "host"]
    for kind, ops in host.groupby("kind", sort=False):
        native = replace(d, native_ops=d.native_ops | {kind})
        projected = project(graph, native)
        gain = step - float(projected["time_ns"].sum() / steps)
        evidence = _evidence(graph, base, ops.index, kind=ops["kind"], bytes=graph.loc[ops.index, "bytes"],
                             native_time_ns=projected.loc[ops.index, "time_ns"])
        count, link = len(ops) // steps, format_duration(ops["time_ns"].sum() / steps)
        found.append(Finding("host fallback", f"{_ops(count, f'{kind} operator')} per step "
                             f"{'falls' if count == 1 else 'fall'} back to the host: {link} on the link",
                             f"{kind} run on the chip (a native operator in its place)", evidence, gain, step))
    return found


def _layout(graph: pd.DataFrame, base: pd.DataFrame, d: Description, step: float, steps: int) -> Finding | None:
    copies = graph.index[graph["name"].isin(LAYOUT_COPIES)]
    if copies.empty:
        return None
    gain = step - step_ns(graph.drop(index=copies), d, steps)
    if gain < MIN_SHARE * step:
        return None
    return Finding("layout", f"{_ops(len(copies) // steps, 'layout copy', 'layout copies')} per step (a transpose "
                   "made contiguous) move "
                   f"{format_count(graph.loc[copies, 'bytes'].sum() / steps)} B between operators",
                   "the copies removed (the consumer reads the producer's layout)",
                   _evidence(graph, base, copies, bytes=graph.loc[copies, "bytes"]), gain, step)


def _vector(graph: pd.DataFrame, base: pd.DataFrame, d: Description, step: float, steps: int) -> Finding | None:
    normish = graph["layer"].fillna("").str.rsplit(".", n=1).str[-1].str.contains("norm", case=False)
    chosen = graph.index[(graph["kind"].isin({"softmax", "norm"}) | (normish & graph["kind"].isin(VECTOR_KINDS)))
                         & (base["unit"] == "vector")]
    if chosen.empty:
        return None
    time = float(base.loc[chosen, "time_ns"].sum() / steps)
    if time < MIN_SHARE * step:
        return None
    changed = graph.copy()
    changed.loc[chosen, "bytes"] = 0.0
    gain = step - step_ns(changed, d, steps)
    computing = float(base.loc[chosen, "compute_ns"].sum() / steps)
    return Finding("vector", f"softmax and normalization on the vector units take {time / step:.1%} of the step "
                   f"({format_duration(time)}; {format_duration(computing)} of it computing)",
                   "their tensors kept on chip (fused into the matrix operator beside them)",
                   _evidence(graph, base, chosen, kind=graph.loc[chosen, "kind"], bound=base.loc[chosen, "bound"],
                             compute_ns=base.loc[chosen, "compute_ns"], memory_ns=base.loc[chosen, "memory_ns"]),
                   gain, step)


def _precision(graph: pd.DataFrame, base: pd.DataFrame, d: Description, step: float, steps: int) -> Finding | None:
    lacking = base.index[base["run_dtype"].notna() & (base["run_dtype"] != base["dtype"])
                         & base["dtype"].isin(FLOAT_DTYPES)]
    if lacking.empty:
        return None
    changed = graph
    for run_dtype, ops in base.loc[lacking].groupby("run_dtype"):
        changed = at_dtype(changed, str(run_dtype), ops.index)
    gain = step - step_ns(changed, d, steps)
    if gain < MIN_SHARE * step:
        return None
    pairs = sorted({f"{a} → {b}" for a, b in zip(base.loc[lacking, "dtype"], base.loc[lacking, "run_dtype"],
                                                 strict=True)})
    return Finding("precision", f"{_ops(len(lacking) // steps)} per step in a dtype their unit lacks "
                   f"({', '.join(pairs)}): they run in the narrower one but move the wider one's bytes",
                   "those operators in the dtype they run in",
                   _evidence(graph, base, lacking, dtype=base.loc[lacking, "dtype"],
                             run_dtype=base.loc[lacking, "run_dtype"],
                             bytes=graph.loc[lacking, "bytes"]), gain, step)


def decode_step_ns(config: LLMConfig, description: Description, batch: int, context: int) -> dict[str, float]:
    """One decode step (one new token after `context` cached) of `config` on `description` by the performance
    model's FLOPs and bytes: {"time_ns", "flops", "bytes", "kv_read_bytes"}; time = max(FLOPs / the matrix rate
    of the config's dtype, bytes / off-chip bandwidth)."""
    from workbench.llm.perf_model import forward_cost

    cost = forward_cost(config, batch, 1, context)
    rate = description.matrix.rates[description.matrix_dtype(config.dtype)]
    seconds = max(cost.flops / rate, cost.bytes / description.off_chip.bandwidth)
    return {"time_ns": seconds * 1e9, "flops": cost.flops, "bytes": cost.bytes, "kv_read_bytes": cost.kv_read_bytes}


def _attention(llm: LLMConfig, graph: pd.DataFrame, d: Description, batch: int, context: int) -> Finding | None:
    from workbench.llm.perf_model import attention_variants, kv_bytes_per_token

    matrix = graph[graph["kind"].isin(MATRIX_KINDS)]
    dtype = matrix["dtype"].mode().iloc[0] if not matrix.empty else llm.dtype
    config = replace(llm, dtype=dtype, weight_dtype=dtype, kv_dtype=dtype)
    variants = attention_variants(config)
    current = config.attention if config.attention in variants else "mha"
    steps: dict[str, dict[str, float]] = {name: decode_step_ns(v, d, batch, context) for name, v in variants.items()}
    per_token = {name: kv_bytes_per_token(v) for name, v in variants.items()}
    best = min(steps, key=lambda name: steps[name]["time_ns"])
    base = steps[current]["time_ns"]
    gain = base - steps[best]["time_ns"]
    if best == current or gain < MIN_SHARE * base:
        return None
    evidence = pd.DataFrame([{"variant": name, "kv_heads": v.kv_heads if v.attention != "mla" else None,
                              "kv_latent": v.kv_latent or None, "kv_bytes_per_token": per_token[name],
                              "kv_read_bytes": steps[name]["kv_read_bytes"], "step_bytes": steps[name]["bytes"],
                              "time_ns": steps[name]["time_ns"], "gain_ns": base - steps[name]["time_ns"]}
                             for name, v in variants.items()])
    return Finding("attention", f"{best.upper()} instead of {current.upper()} keeps "
                   f"{format_count(per_token[best])} B of KV cache per token instead of "
                   f"{format_count(per_token[current])} B: a decode step at context {context:,} reads "
                   f"{format_count(steps[best]['kv_read_bytes'])} B of it instead of "
                   f"{format_count(steps[current]['kv_read_bytes'])} B", f"attention as {best.upper()}", evidence,
                   gain, base, f"decode step (batch {batch}, context {context:,}, {dtype})")

