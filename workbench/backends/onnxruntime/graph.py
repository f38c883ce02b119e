"""The ONNX graph an ORT variant starts from, and what ORT's optimizations did to it.

`source_graph`: an ONNX file model's own file, else the torch model's export by the TensorRT path's exporter
(`workbench.backends.tensorrt.onnx_export`: opset 19, dynamic batch). Exports are cached per module and input
shapes for the module's lifetime, so the variants of one experiment (and their profiled copies) export once.

`graph_record`: node counts per (domain, op type) of the graph the session was given and of the optimized
graph ORT saved (`SessionOptions.optimized_model_filepath`), and which given nodes each new node of the optimized
graph replaced (`fused_nodes`, see `fusion_map`): the record `workbench.analysis.ort_fusion` and
`workbench.analysis.provenance` read; `counts_text` the same as the compile-stage text `ort_optimized.onnx.txt`.
"""

from __future__ import annotations

import re
import tempfile
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.models import LoadedModel
from workbench.models.onnx_file import OnnxFileModule, load_onnx

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUMMARY = "## Exception summary"
_CLASS = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>")
_FAILED = re.compile(r"^ONNX export of \w+ failed: ")

_EXPORTS: weakref.WeakKeyDictionary[Any, dict[tuple, tuple[Any, tempfile.TemporaryDirectory]]] = \
    weakref.WeakKeyDictionary()


def source_graph(loaded: LoadedModel, inputs: Sequence[torch.Tensor]) -> tuple[Path, dict[str, Any]]:
    """The ONNX file to run `loaded` from, and its facts for run.json notes["onnx"]. An export that fails
    (an op the exporter cannot convert) raises WorkbenchError with the exporter's reason."""
    from workbench.backends.tensorrt.onnx_export import export_onnx
    from workbench.backends.tensorrt.onnx_graph import graph_facts

    module = loaded.module
    if isinstance(module, OnnxFileModule):
        facts = graph_facts(module.onnx_path)
        return module.onnx_path, {"source": "onnx file", "path": str(module.onnx_path), "opset": facts.opset,
                                  "nodes": facts.nodes}
    key = tuple((tuple(t.shape), str(t.dtype)) for t in inputs)
    cached = _EXPORTS.setdefault(module, {})
    if key not in cached:
        folder = tempfile.TemporaryDirectory(prefix="workbench-ort-export-")
        try:
            exported = export_onnx(module, inputs, Path(folder.name) / "model.onnx")
        except WorkbenchError as exc:
            folder.cleanup()
            raise WorkbenchError(f"ONNX export of {type(module).__name__} failed: {export_reason(str(exc))}") from exc
        except BaseException:
            folder.cleanup()
            raise
        cached[key] = (exported, folder)
    exported = cached[key][0]
    return exported.path, {"source": "export", **exported.to_dict(), "path": exported.path.name}


def export_reason(message: str) -> str:
    """One line of torch's ONNX exporter's error: the first line of its exception summary (which names the op
    that has no ONNX function), its terminal colours removed."""
    text = _ANSI.sub("", message)
    body = text.split(_SUMMARY, 1)[-1]
    line = next((part.strip() for part in body.splitlines() if part.strip()), text.strip())
    return _CLASS.sub(r"\1", _FAILED.sub("", line))


def graph_inputs(path: Path) -> list[str]:
    """The names of the graph's inputs (initializers some graphs list as inputs left out)."""

    graph = load_onnx(path).graph
    initializers = {init.name for init in graph.initializer}
    return [value.name for value in graph.input if value.name not in initializers]


def _nodes(path: Path) -> Any:
    """The nodes of the ONNX graph at `path` (its weights' external data is not read)."""
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.node


def _counts(nodes: Any) -> Counter[tuple[str, str]]:
    return Counter((node.domain or "ai.onnx", node.op_type) for node in nodes)


def fusion_map(before: Any, after: Any) -> dict[str, list[str]]:
    """Per node of the optimized graph (`after`'s nodes) that the given graph (`before`'s) lacks (by name and op
    type), the given nodes it replaced: those on the given graph's paths from the new node's input tensors to its
    output tensors that the optimized graph no longer has. ORT's fusions keep the replaced subgraph's boundary
    tensors (a FusedMatMul reads the MatMul's inputs and writes what the scaling Mul wrote), so the walk back from
    its outputs, stopping at its inputs, finds exactly the nodes it computes; a node with no such path (a layout node
    ORT inserted) is left out."""
    given_nodes = {n.name: n for n in before}
    kept = {n.name for n in after}
    producer = {tensor: n.name for n in before for tensor in n.output}
    fused: dict[str, list[str]] = {}
    for node in after:
        same = given_nodes.get(node.name)
        if same is not None and same.op_type == node.op_type:
            continue
        stop, seen = set(node.input), set()
        todo = [producer[t] for t in node.output if t in producer]
        while todo:
            name = todo.pop()
            if name in seen or name in kept:
                continue
            seen.add(name)
            todo.extend(producer[t] for t in given_nodes[name].input if t not in stop and t in producer)
        if seen:
            fused[node.name] = [n.name for n in before if n.name in seen]  # in the given graph's order
    return fused


def graph_record(given: Path, optimized: Path | None, optimization: str, given_as: str) -> dict[str, Any]:
    """Node counts of the graph given to the session (`given_as` says what it is: the export, a quantized or
    fp16 copy) and of ORT's optimized graph (None when ORT could not save it, e.g. compiled TensorRT nodes), and
    the optimized graph's new nodes with the given nodes they replaced (`fused_nodes`, `fusion_map`) and every
    named node's op type in either graph (`node_types`). Each graph is read once."""
    before_nodes = _nodes(given)
    after_nodes = _nodes(optimized) if optimized is not None and optimized.is_file() else None
    before = _counts(before_nodes)
    after = _counts(after_nodes) if after_nodes is not None else None
    ops = [{"domain": domain, "op_type": op, "original": before.get((domain, op), 0),
            "optimized": None if after is None else after.get((domain, op), 0)}
           for domain, op in sorted(before | (after or Counter()))]
    return {"optimization": optimization, "graph": given_as, "ops": ops,
            "nodes": {"original": sum(before.values()), "optimized": None if after is None else sum(after.values())},
            "fused_nodes": fusion_map(before_nodes, after_nodes) if after_nodes is not None else {},
            "node_types": {n.name: n.op_type for n in [*before_nodes, *(after_nodes or [])] if n.name}}


def counts_text(record: dict[str, Any]) -> str:
    """`op type: original -> optimized` node counts, one line each, after a `nodes:` total line."""
    nodes = record["nodes"]
    lines = [f"{op['op_type']}: {op['original']} -> {op['optimized']}" for op in record["ops"]]
    return "\n".join([f"nodes: {nodes['original']} -> {nodes['optimized']}", *lines]) + "\n"
