"""Tensor parallelism over p chips, Megatron-style: how each operator of a graph shards, propagated along its dataflow
(`graph.inputs_from`, `graph.weight_input`), the work each chip then does, and the all-reduces over the chip links
(`Description.chip_links`). `projection.project(graph, description, chips=p)` projects the result.

Each tensor is either replicated (every chip holds all of it) or sharded (each chip holds a slice of its features
or heads). In program order:

- a matrix operator (matmul, conv) with a weight input (a parameter of the module) whose activation input is
  replicated is **column**-parallel: its N (output features, output channels) split over the chips, ⌈N/p⌉ on each;
  each chip reads the whole activation and its columns of the weight and writes its slice of the output, which is
  sharded.
- one whose activation input is sharded is **row**-parallel: its K split, ⌈K/p⌉ on each; each chip reads its slice of
  the activation and its rows of the weight and writes a partial output of full size, summed over the chips by an
  all-reduce of the whole output, which is then replicated. The all-reduce takes the output off the chip, so a
  row-parallel operator ends its fusion group.
- attention, or a product of two activations (no weight), on sharded inputs splits its **heads**: its batch of
  per-head products, ⌈batch/p⌉ on each chip; its output is sharded.
- any other operator with a sharded input is **sharded**: 1/p of its elements, FLOPs and bytes on each chip (its
  slice of the tensor the column-parallel operator before it split); its output is sharded. A norm over features
  that are split would need its row statistics all-reduced, a few values per row: not counted.
- an operator whose inputs are all replicated is **replicated**: it runs in full on every chip.
- an operator without dataflow is replicated, and so is all that follows from it: a captured trace records shapes
  but not which tensor fed which operator, so its graph cannot be sharded and p chips take as long as one.

A sharded operator's figures are those of its busiest chip (the one with ⌈N/p⌉). A sharded tensor at the end of the
graph (the vocabulary-split logits of a column-parallel head) stays on its chips: no gather is counted. A matrix
operator's weight is K·N elements (a linear's weight; a convolution's C_out · C_in/groups · kernel) and its
activation the rest of op_cost's bytes less the output (a bias, small beside them, counted with it).

An all-reduce of B bytes over p chips (each chip holds B and ends with the sum), at the links' `bandwidth` per chip
per direction and `latency` per hop:

- ring: a reduce-scatter then an all-gather, each p − 1 steps that pass B/p to the next chip:
  2·(p−1)/p · B / bandwidth + 2·(p−1) · latency.
- all-to-all (a switch, or direct links between every pair): each chip still sends 2·(p−1)/p · B in all, the least
  any all-reduce moves per chip, at its bandwidth; but each phase sends its p − 1 slices at once, each straight to
  the chip that owns it, in one hop: 2·(p−1)/p · B / bandwidth + 2 · latency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from workbench.analysis.op_cost import ITEM_BYTES
from workbench.codesign.description import AcceleratorSpecError, ChipLinks, Description

SHARDS = ("column", "row", "heads", "sharded", "replicated")
"""How an operator runs on several chips (the module docstring)."""
_PRODUCTS = frozenset({"matmul", "conv", "attention"})


@dataclass(frozen=True)
class ShardPlan:
    """A graph on `chips` chips: `graph` with each operator's figures those of its busiest chip, its `shard`
    (`SHARDS`) and the bytes it all-reduces (`all_reduce_bytes`: a row-parallel operator's output, else 0), and
    whether the graph had dataflow to shard along (`dataflow`)."""

    graph: pd.DataFrame
    shard: list[str]
    all_reduce_bytes: list[float]
    dataflow: bool


def has_dataflow(graph: pd.DataFrame) -> bool:
    """Whether any operator of `graph` says which rows fed it (a forward's graph does; a trace's does not)."""
    return "inputs_from" in graph and bool(graph["inputs_from"].map(lambda v: isinstance(v, tuple)).any())


def chip_links(description: Description, chips: int) -> ChipLinks | None:
    """The links `chips` chips of `description` all-reduce over (None on one chip); `AcceleratorSpecError` naming
    the field when the description has none or the part does not scale that far."""
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips must be a whole number >= 1, got {chips!r}")
    if chips == 1:
        return None
    links = description.chip_links
    if links is None:
        raise AcceleratorSpecError(description.name, "chip_links", f"required to project on {chips} chips: the links "
                                   "their all-reduces cross, e.g. {bandwidth: 100 GB/s, latency: 1 us}")
    if links.chips is not None and chips > links.chips:
        raise AcceleratorSpecError(description.name, "chip_links.chips", f"the part scales to {links.chips} chips, "
                                   f"not {chips}")
    return links


def all_reduce_s(nbytes: float, chips: int, links: ChipLinks) -> float:
    """Seconds to all-reduce `nbytes` (held by every chip) over `chips` chips on `links` (the module docstring)."""
    if chips <= 1 or nbytes <= 0:
        return 0.0
    hops = 2 * (chips - 1) if links.topology == "ring" else 2
    return 2.0 * (chips - 1) / chips * nbytes / links.bandwidth + hops * links.latency_s


def shard_graph(graph: pd.DataFrame, chips: int) -> ShardPlan:
    """`graph` sharded over `chips` chips by the module docstring's rule (on one chip: as it is, all replicated)."""
    dataflow = has_dataflow(graph)
    if chips == 1:
        return ShardPlan(graph, ["replicated"] * len(graph), [0.0] * len(graph), dataflow)
    per_chip = graph.copy()
    shards: list[str] = []
    reduced: list[float] = []
    held: dict[int, float] = {}  # order -> the share of its output each chip holds (absent: all of it)
    for index, op in zip(graph.index, graph.to_dict("records"), strict=True):
        shard, changes, share, nbytes = _shard(op, held, chips)
        for column, value in changes.items():
            per_chip.at[index, column] = value
        if share < 1.0:
            held[int(op["order"])] = share
        shards.append(shard)
        reduced.append(nbytes)
    return ShardPlan(per_chip, shards, reduced, dataflow)


def _shard(op: Mapping[str, Any], held: Mapping[int, float], chips: int) -> tuple[str, dict[str, float], float,
                                                                                   float]:
    """One operator: (its shard, the figures that change on the busiest chip, the share of its output each chip
    holds, the bytes all-reduced after it)."""
    inputs = op.get("inputs_from")
    if not isinstance(inputs, tuple):
        return "replicated", {}, 1.0, 0.0
    share_in = max((share for share in (held.get(order, 1.0) for order in inputs) if share < 1.0), default=1.0)
    flops, moved = float(op["flops"]), float(op["bytes"])
    dims = op["kind"] in _PRODUCTS and not pd.isna(op["m"])
    if dims and op["kind"] != "attention" and op.get("weight_input"):
        batch, m, k, n = (int(op[c]) for c in ("batch", "m", "k", "n"))
        item = ITEM_BYTES.get(op["dtype"] if isinstance(op["dtype"], str) else "fp32", 4)
        out = float(op["out_bytes"]) if not pd.isna(op["out_bytes"]) else float(batch * m * n * item)
        weight = float(k * n * item)
        activation = max(moved - weight - out, 0.0)
        if share_in == 1.0:
            split = math.ceil(n / chips) / n
            return "column", {"n": math.ceil(n / chips), "flops": flops * split,
                              "bytes": activation + (weight + out) * split, "out_bytes": out * split}, split, 0.0
        split = math.ceil(k / chips) / k
        return "row", {"k": math.ceil(k / chips), "flops": flops * split,
                       "bytes": (activation + weight) * split + out}, 1.0, out
    if share_in == 1.0:
        return "replicated", {}, 1.0, 0.0
    if dims:
        batch = int(op["batch"])
        split = math.ceil(batch / chips) / batch
        return "heads", {"batch": math.ceil(batch / chips), "flops": flops * split, "bytes": moved * split,
                         "out_bytes": float(op["out_bytes"]) * split}, split, 0.0
    return "sharded", {column: float(op[column]) * share_in
                       for column in ("elements", "transcendental", "flops", "bytes", "out_bytes")}, share_in, 0.0
