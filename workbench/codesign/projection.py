"""A model's operator graph (`workbench.codesign.graph`) projected onto an accelerator `Description`.

Per operator, on the unit it maps to:

- matmul, conv, attention → matrix units. Output-stationary tiles: a GEMM of `batch` x (M x K by K x N) is
  batch·⌈M/R⌉·⌈N/C⌉ tiles of the R x C array, each taking K cycles of MACs; `count` arrays take tiles in turn, so
  the compute time is ⌈tiles/count⌉·K / (MACs per PE per cycle in the dtype) / clock, and `utilization` is the
  useful MACs over the MAC slots of those cycles (a 100 x 100 product on one 128 x 128 array: 10⁴/128² = 61%).
  Attention is two products per head, Tq x D by D x Tk and Tq x Tk by Tk x Dv, taken with Dv = D. A dtype the
  matrix units have no rate for runs in the widest one they have (`Description.matrix_dtype`). A description
  without an array shape or clock (the short form, the built-in table) takes FLOPs over the peak instead.
- elementwise, softmax, norm → vector units: (FLOPs + (transcendental_cycles − 1)·transcendental elements) over
  the vector rate of the dtype (an exp costs `transcendental_cycles` simple operations).
- copy, other → data movement only.
- a kind not in `native_ops` → the host: its bytes cross the host link both ways (op_cost's bytes: inputs in,
  output back) plus the link latency twice and `host_fallback_cost.latency`; the host's own compute is not
  projected (put it in that latency).

Memory, the tiling model: a matrix operator reads its operands and writes its output once (op_cost's compulsory
bytes) when its B operand (a weight: K x N; attention's K and V of a head) fits in the largest on-chip level
beside one R x K panel of A. Otherwise B is read again for every row of tiles: (⌈M/R⌉ − 1) extra reads of B.
The on-chip level feeds the arrays each tile's A panel and B panel, tiles·(R + C)·K elements, at its bandwidth.
Vector and copy operators move op_cost's bytes. The memory time is the larger of the off-chip and on-chip times.

Fusion: an elementwise operator right after a matrix operator (or after one already fused to it), whose output
is as large as the matrix output, joins its group: the intermediate it reads and the output it writes never
leave the chip, so its bytes lose 2·output (a residual add still reads its residual). A group pays one
`op_overhead`. A description with `fusion: false` (eager execution) fuses nothing.

Several chips (`chips` = p > 1): tensor-parallel, Megatron-style (`workbench.codesign.sharding` states the rule: a
weight's matrix operator on a replicated input is column-parallel, on a sharded one row-parallel and all-reduced,
attention on sharded inputs splits its heads, other operators on sharded inputs run on 1/p of it, the rest in full
on every chip; a graph without dataflow, a captured trace's, stays replicated). Each operator's figures are its
busiest chip's; `shard` says how it splits and `comm_ns` is the all-reduce after it over the chip links, which waits
for the operator and is waited for by the next (nothing overlaps it). On one chip every operator is replicated and
`comm_ns` is 0: the projection is the one-chip projection.

Time per operator: max(compute, memory, floor) + overhead (host time for a fallback) + comm, where the floor
(`op_floor`) is the shortest an operator or fused group runs on the chip once started (a GPU kernel's ramp-up and
drain, which no roofline term sees: small eager kernels take it whatever their work); `bound` is the largest term
(compute, memory, on-chip, floor, overhead, host, chip-link).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.op_cost import ITEM_BYTES
from workbench.codesign.description import AcceleratorSpecError, Description
from workbench.codesign.graph import block_of
from workbench.codesign.sharding import all_reduce_s, chip_links, shard_graph

PROJECTION_COLUMNS = ("order", "name", "kind", "layer", "dtype", "unit", "run_dtype", "tiles", "utilization",
                      "compute_ns", "memory_ns", "on_chip_ns", "host_ns", "overhead_ns", "time_ns", "bound", "group",
                      "flops", "bytes", "off_chip_bytes", "measured_ns", "block", "comm_ns", "shard", "floor_ns")
MATRIX_KINDS = frozenset({"matmul", "conv", "attention"})
VECTOR_KINDS = frozenset({"elementwise", "softmax", "norm"})


def project(graph: pd.DataFrame, description: Description, chips: int = 1) -> pd.DataFrame:
    """Each operator of `graph` on `description` (the module docstring's model), on `chips` chips tensor-parallel;
    columns `PROJECTION_COLUMNS`, times in ns. `attrs`: "description" names the device, "chips" the count and
    "dataflow" whether the graph said which operator fed which (without it nothing shards)."""
    links = chip_links(description, chips)
    plan = shard_graph(graph, chips)
    rows: list[dict[str, Any]] = []
    group: dict[str, Any] | None = None  # the open fusion group: its leader's order and output bytes
    for op, shard, reduced in zip(plan.graph.to_dict("records"), plan.shard, plan.all_reduce_bytes, strict=True):
        native = op["kind"] in description.native_ops
        fused = (description.fusion and group is not None and native and op["kind"] == "elementwise"
                 and not _missing(op["out_bytes"]) and math.isclose(op["out_bytes"], group["out_bytes"]))
        if native and op["kind"] in MATRIX_KINDS:
            row = _matrix(op, description)
            group = {"order": op["order"], "out_bytes": op["out_bytes"]} if not _missing(op["out_bytes"]) else None
        elif not native:
            row = _host(op, description)
            group = None
        else:
            row = _vector(op, description, fused=fused)
            if not fused:
                group = None
        row["overhead_ns"] = 0.0 if fused or not native else description.op_overhead_s * 1e9
        row["floor_ns"] = 0.0 if fused or not native else description.op_floor_s * 1e9
        row["group"] = group["order"] if group is not None else -1
        if shard == "row":  # its output leaves the chip for the all-reduce: nothing fuses after it
            group = None
        row["comm_ns"] = all_reduce_s(reduced, chips, links) * 1e9 if links is not None else 0.0
        row["shard"] = shard
        rows.append({**{k: op[k] for k in ("order", "name", "kind", "layer", "dtype", "flops", "bytes",
                                           "measured_ns")}, **row})
    frame = pd.DataFrame(rows, columns=list(PROJECTION_COLUMNS))
    terms = frame[["compute_ns", "memory_ns", "on_chip_ns", "floor_ns", "host_ns"]].fillna(0.0)
    frame["time_ns"] = (np.maximum.reduce([terms[c].to_numpy() for c in terms]) + frame["overhead_ns"].fillna(0.0)
                        + frame["comm_ns"])
    bounds = pd.concat([terms, frame[["overhead_ns", "comm_ns"]].fillna(0.0)], axis=1)
    frame["bound"] = bounds.idxmax(axis=1).str.removesuffix("_ns").str.replace("_", "-").replace("comm", "chip-link")
    frame.loc[frame["time_ns"] <= 0, "bound"] = "none"
    frame["block"] = frame["layer"].fillna("").map(block_of)
    frame.attrs.update(description=description.name, chips=chips, dataflow=plan.dataflow)
    return frame


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _item(dtype: Any) -> int:
    return ITEM_BYTES.get(dtype if isinstance(dtype, str) else "fp32", 4)


def _matrix(op: Mapping[str, Any], d: Description) -> dict[str, Any]:
    """Compute (tiled or peak), tiling-model traffic and on-chip feed of one matrix operator."""
    run_dtype = d.matrix_dtype(op["dtype"])
    off_chip_bytes = float(op["bytes"])
    row: dict[str, Any] = {"unit": "matrix", "run_dtype": run_dtype, "tiles": np.nan, "utilization": np.nan,
                           "on_chip_ns": np.nan, "host_ns": np.nan}
    if not d.tiled or _missing(op["m"]):
        row["compute_ns"] = op["flops"] / d.matrix.rates[run_dtype] * 1e9
        row["memory_ns"] = off_chip_bytes / d.off_chip.bandwidth * 1e9
        row["off_chip_bytes"] = off_chip_bytes
        return row
    rows_, cols = d.matrix.rows, d.matrix.cols
    assert rows_ is not None and cols is not None and d.clock_hz is not None
    batch, m, k, n = (int(op[c]) for c in ("batch", "m", "k", "n"))
    item = _item(op["dtype"])
    # (tiles, K cycles per tile) of each product; attention: QKᵀ then PV
    products = [(batch * math.ceil(m / rows_) * math.ceil(n / cols), k)]
    weight_bytes = k * n * item  # B of one batch entry
    if op["kind"] == "attention":
        products.append((batch * math.ceil(m / rows_) * math.ceil(k / cols), n))
        weight_bytes = 2 * n * k * item  # K and V of one head
    macs = d.matrix.macs_per_cycle(run_dtype, d.clock_hz)
    slots = sum(math.ceil(tiles / d.matrix.count) * d.matrix.count * rows_ * cols * depth for tiles, depth in products)
    cycles = sum(math.ceil(tiles / d.matrix.count) * depth for tiles, depth in products) / macs
    level = d.on_chip
    fits = level is not None and level.size is not None and weight_bytes + rows_ * k * item <= level.size
    if not fits:
        off_chip_bytes += batch * weight_bytes * (math.ceil(m / rows_) - 1)
    fed = sum(tiles * (rows_ + cols) * depth for tiles, depth in products) * item
    row.update(tiles=float(sum(tiles for tiles, _ in products)), utilization=op["flops"] / (2.0 * slots),
               compute_ns=cycles / d.clock_hz * 1e9, memory_ns=off_chip_bytes / d.off_chip.bandwidth * 1e9,
               on_chip_ns=fed / level.bandwidth * 1e9 if level is not None and level.bandwidth else np.nan,
               off_chip_bytes=off_chip_bytes)
    return row


def _vector(op: Mapping[str, Any], d: Description, *, fused: bool) -> dict[str, Any]:
    """Vector-unit work (copies: data movement only); fused elementwise ops keep their data on chip."""
    moved = float(op["bytes"])
    if fused:
        moved = max(moved - 2.0 * float(op["out_bytes"]), 0.0)
    row: dict[str, Any] = {"unit": "vector" if op["kind"] in VECTOR_KINDS else "dma", "run_dtype": None,
                           "tiles": np.nan, "utilization": np.nan, "on_chip_ns": np.nan, "host_ns": np.nan,
                           "compute_ns": 0.0, "memory_ns": moved / d.off_chip.bandwidth * 1e9,
                           "off_chip_bytes": moved}
    if op["kind"] in VECTOR_KINDS:
        run_dtype = d.vector_dtype(op["dtype"])
        work = op["flops"] + (d.transcendental_cycles - 1.0) * float(op["transcendental"] or 0.0)
        row.update(run_dtype=run_dtype, compute_ns=work / d.vector_rates[run_dtype] * 1e9)
    return row


def _host(op: Mapping[str, Any], d: Description) -> dict[str, Any]:
    """A fallback to the host: the op's bytes over the host link, its latency both ways, the fallback latency."""
    if not d.host_link_bandwidth:
        raise AcceleratorSpecError(d.name, "host_link.bandwidth",
                                   f"required: operator kind '{op['kind']}' ({op['name']}) is not in native_ops "
                                   "and falls back to the host")
    seconds = float(op["bytes"]) / d.host_link_bandwidth + 2 * d.host_link_latency_s + d.host_fallback_latency_s
    return {"unit": "host", "run_dtype": None, "tiles": np.nan, "utilization": np.nan, "compute_ns": 0.0,
            "memory_ns": 0.0, "on_chip_ns": np.nan, "host_ns": seconds * 1e9, "off_chip_bytes": 0.0}


def totals(projection: pd.DataFrame, by: str, steps: int = 1) -> pd.DataFrame:
    """Projected time per `by` ("kind", "layer", "block", "bound", "unit") per step, largest first:
    | by | ops | time_ns | share | measured_ns |."""
    grouped = projection.groupby(by, sort=False, dropna=False).agg(
        ops=("order", "size"), time_ns=("time_ns", "sum"), measured_ns=("measured_ns", lambda s: s.sum(min_count=1)))
    grouped["ops"] = grouped["ops"] // steps
    grouped["time_ns"] /= steps
    grouped["measured_ns"] /= steps
    grouped["share"] = grouped["time_ns"] / max(grouped["time_ns"].sum(), 1e-30)
    return grouped.sort_values("time_ns", ascending=False).reset_index()[[by, "ops", "time_ns", "share",
                                                                         "measured_ns"]]
