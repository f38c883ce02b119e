"""What ONNX Runtime's graph optimizations did: node counts per op type of the graph given to the session and
of the optimized graph ORT saved (`SessionOptions.optimized_model_filepath`), from the record an ORT run keeps
as `compile/ort_graph.json` (`workbench.backends.onnxruntime.graph.graph_record`).

ORT's fusions replace several nodes by one node of a fused op type (FusedMatMul, Gelu, LayerNormalization,
SkipLayerNormalization, Attention ...; most in the `com.microsoft` domain): an op type whose count grows in
the optimized graph and that is such a fused op counts as `fused` (`FUSED_OPS`, or any contrib-domain op that
grew). Other changes (constant folding, redundant-node removal, layout nodes) show in the counts without
counting as fusions.

Pure functions: no onnxruntime needed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench.errors import WorkbenchError

GRAPH_RECORD = "ort_graph.json"
"""An ORT run's graph record in its bundle's compile/ folder."""

NODE_COLUMNS = ("op_type", "domain", "original", "optimized", "change", "fused")

CONTRIB_DOMAINS = frozenset({"com.microsoft", "com.microsoft.nchwc"})
FUSED_OPS = frozenset({
    "FusedMatMul", "FusedGemm", "FusedConv", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "LayerNormalization",
    "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "EmbedLayerNormalization", "Attention", "MultiHeadAttention", "GroupQueryAttention", "BiasSoftmax",
    "BiasDropout", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul", "QLinearConv", "QGemm",
    "MatMulNBits", "RotaryEmbedding", "GemmFastGelu", "BiasAdd", "BiasSplitGelu", "NhwcFusedConv",
})
"""Op types ORT's fusion passes produce (onnxruntime/core/optimizer/*_fusion.cc)."""


def read_graph_record(text: str | bytes | Mapping[str, Any], where: str = "ORT graph record") -> dict[str, Any]:
    """The graph record (JSON text or decoded); WorkbenchError naming `where` when it is malformed."""
    try:
        record = json.loads(text) if isinstance(text, (str, bytes)) else dict(text)
    except ValueError as exc:
        raise WorkbenchError(f"{where}: not JSON ({exc})") from exc
    ops = record.get("ops")
    if not isinstance(ops, list) or not all(isinstance(op, Mapping) and {"op_type", "original"} <= set(op)
                                            for op in ops):
        raise WorkbenchError(f"{where}: no \"ops\" list of {{op_type, original, optimized}} objects")
    return record


def ort_node_table(record: Mapping[str, Any]) -> pd.DataFrame:
    """One row per op type: its node count in the given graph and the optimized one, the change, and whether
    ORT's fusions made nodes of it (see the module docstring). Largest change first.

    | op_type | domain | original | optimized | change | fused |

    `optimized` is NaN when ORT could not save its optimized graph (compiled TensorRT nodes)."""
    rows = []
    for op in read_graph_record(record)["ops"]:
        optimized = op.get("optimized")
        change = None if optimized is None else optimized - op["original"]
        fusing = op["op_type"] in FUSED_OPS or op.get("domain") in CONTRIB_DOMAINS
        fused = change is not None and change > 0 and fusing
        rows.append((op["op_type"], op.get("domain", "ai.onnx"), op["original"], optimized, change, fused))
    table = pd.DataFrame(rows, columns=[*NODE_COLUMNS]).astype({"optimized": "float", "change": "float"})
    order = table["change"].abs().fillna(-1).sort_values(ascending=False, kind="stable").index
    return table.loc[order].reset_index(drop=True)


def ort_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fusion table's figures of an ORT run, per execution of the graph: `kernels` the optimized graph's
    nodes, `fusions` the fused nodes ORT made, `fused_ops` the nodes they replaced (estimated: nodes removed
    plus nodes made, as each fusion of n nodes removes n and adds one), `unfused_ops` the other nodes; plus the
    node totals and the optimization level. NaN figures when the optimized graph is unknown."""
    table = ort_node_table(record)
    nodes = record.get("nodes", {})
    original, optimized = nodes.get("original"), nodes.get("optimized")
    if optimized is None:
        nan = float("nan")
        return {"kernels": nan, "fusions": nan, "fused_ops": nan, "unfused_ops": nan, "nodes_original": original,
                "nodes_optimized": None, "optimization": record.get("optimization")}
    fusions = int(table.loc[table["fused"], "change"].sum())
    return {"kernels": optimized, "fusions": fusions, "fused_ops": max(original - optimized + fusions, 0),
            "unfused_ops": optimized - fusions, "nodes_original": original, "nodes_optimized": optimized,
            "optimization": record.get("optimization")}
