"""What TensorRT fused: the engine inspector's JSON (`IEngineInspector.get_engine_information(
LayerInformationFormat.JSON)`, the same document as `trtexec --exportLayerInfo`) as a fusion table.

The formats read, as TensorRT writes them (see NVIDIA/TensorRT `tools/experimental/trt-engine-explorer`,
whose parser reads the same files, and the TensorRT 10→11 migration guide):

- `{"Layers": [...], "Bindings": [...]}`. With `ProfilingVerbosity.DETAILED` each layer is an object
  (`Name`, `LayerType`, `Inputs`/`Outputs` with `Name`, `Dimensions`, `Format/Datatype`, `TacticName`,
  `TacticValue`, and since TensorRT 8.6 `Metadata`); with the default LAYER_NAMES_ONLY each layer is just
  its name. TensorRT 11 replaces `Bindings` by `I/O Tensors` objects and splits a tensor's
  `Format/Datatype` into `Datatype` and `Format` (as polygraphy's engine inspector reads it).
- A layer's name joins the ONNX nodes it fused with " + " (`Conv_5 + Add_6 + Relu_7`); pointwise fusions
  nest as `PWN(a, PWN(b + c, d))`; a Myelin region is `{ForeignNode[first.../last]}` (only its ends);
  TensorRT-made layers are `Reformatting CopyNode for Input Tensor 0 to <layer>`, `(Unnamed Layer* 7)
  [Shuffle]`, `[trainStation1]`; layers of optimization profile N > 0 end in ` [profile N]`.
- `Metadata` lists the ONNX nodes exactly, `[ONNX Layer: <node>]` items separated by U+001E or U+001F
  (TensorRT 10 expands Myelin regions into `kgen` / `gemm` layers named `__myl_...` and names their ONNX
  nodes only there). When present it is preferred to the name.

A run's IProfiler `layer` events (`workbench.trace.formats.trt_layers`) add time: `layer_executions` sums them per
engine execution and `trt_layer_table` joins each layer's median time onto the fusion table.

Pure functions: no TensorRT needed, so bundles captured on a GPU machine are analysed anywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError
from workbench.trace import Trace

ENGINE_JSON = "tensorrt_engine.json"
"""The engine inspector's JSON in a TensorRT run's compile/ folder (`tensorrt.prepared.ARTIFACTS`)."""

ONNX_NODES = "onnx_nodes.json"
"""The prepared ONNX graph's node name → op type map in a TensorRT run's compile/ folder."""

EXECUTION_COLUMNS = ("execution", "start_ns", "layers", "layer_ns", "wall_ns")
TIME_COLUMNS = ("executions", "median_ns", "total_ns", "share")
"""Columns `trt_layer_table` adds to `trt_fusions`' (see there)."""

LAYER_COLUMNS = ("name", "type", "onnx_nodes", "fused_ops", "n_ops", "single_op", "source", "tactic",
                 "tactic_value", "precision", "input_dtypes", "output_dtypes", "input_dims", "inputs",
                 "outputs", "compute", "unmatched", "profile")

INSERTED_TYPES = frozenset({"Reformat", "NoOp", "signal", "wait", "TrainStation"})
"""Layer types TensorRT adds for data movement or synchronization, which compute no ONNX node."""

_REFORMAT = re.compile(r"^Reformatting CopyNode for (?:Input|Output) Tensor \d+ to ")
_TRAIN_STATION = re.compile(r"^\[trainStation\d+\]$")
_PROFILE = re.compile(r" ?\[profile (\d+)\]$")
_FOREIGN = re.compile(r"^\{ForeignNode\[(.*)\]\}$", re.DOTALL)
_ONNX_LAYER = re.compile(r"\[ONNX Layer: (.*?)\](?=[\x1e\x1f]|\[ONNX Layer: |\s*$)", re.DOTALL)
_SEPARATORS = re.compile(r"[\x1e\x1f]")
_DTYPE = re.compile(r"\b(BFloat16|BF16|FP16|Half|FP32|Float|FP8|E4M3|UInt8|Int8|INT8|Int32|INT32|Int64|INT64|"
                    r"BOOL|Bool|FP4|Int4|INT4|Double)\b")
_DTYPE_NAMES = {"BFloat16": "bf16", "BF16": "bf16", "FP16": "fp16", "Half": "fp16", "FP32": "fp32",
                "Float": "fp32", "FP8": "fp8", "E4M3": "fp8", "UInt8": "uint8", "Int8": "int8", "INT8": "int8",
                "Int32": "int32", "INT32": "int32", "Int64": "int64", "INT64": "int64", "BOOL": "bool",
                "Bool": "bool", "FP4": "fp4", "Int4": "int4", "INT4": "int4", "Double": "fp64"}


@dataclass(frozen=True)
class EngineLayers:
    """The inspector document, normalized: `layers` as objects (a names-only document gives
    `{"Name": ...}` objects), the engine's I/O tensor names, and whether it is DETAILED."""

    layers: tuple[dict[str, Any], ...]
    io_tensors: tuple[str, ...]
    detailed: bool


def read_engine_json(document: str | bytes | Mapping[str, Any]) -> EngineLayers:
    """Parse the inspector's JSON (text or already decoded); WorkbenchError saying what is wrong."""
    if isinstance(document, (str, bytes)):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise WorkbenchError(f"TensorRT engine information is not JSON: {exc}") from exc
    if not isinstance(document, Mapping) or not isinstance(document.get("Layers"), list):
        raise WorkbenchError("TensorRT engine information has no \"Layers\" list (is it the inspector's "
                             "JSON format, LayerInformationFormat.JSON?)")
    layers: list[dict[str, Any]] = []
    for position, layer in enumerate(document["Layers"]):
        if isinstance(layer, str):
            layers.append({"Name": layer})
        elif isinstance(layer, Mapping) and isinstance(layer.get("Name"), str):
            layers.append(dict(layer))
        else:
            raise WorkbenchError(f"TensorRT engine information: layer {position} is neither a name nor an "
                                 f"object with a \"Name\" ({type(layer).__name__})")
    io = document.get("I/O Tensors")
    if isinstance(io, list):  # TensorRT 11
        names = tuple(str(t.get("Name")) for t in io if isinstance(t, Mapping))
    else:
        names = tuple(str(b) for b in document.get("Bindings", []) or [])
    detailed = any(len(layer) > 1 for layer in layers)
    return EngineLayers(tuple(layers), names, detailed)


@dataclass(frozen=True)
class NameParts:
    """What a layer name says: the node names it joins, whether only a Myelin region's two ends are
    named (`endpoints`), whether TensorRT made the layer itself (`inserted`), and its profile index."""

    parts: tuple[str, ...]
    endpoints: bool
    inserted: bool
    profile: int


def _split_top(text: str, commas: bool = False) -> list[str]:
    """Split on " + " (and on ", " with `commas`, as inside PWN groups) outside parentheses and brackets."""
    parts, depth, current, i = [], 0, [], 0
    while i < len(text):
        char = text[i]
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if depth == 0 and (text.startswith(" + ", i) or (commas and text.startswith(", ", i))):
            parts.append("".join(current))
            current = []
            i += 3 if text.startswith(" + ", i) else 2
            continue
        current.append(char)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _unwrap(part: str) -> list[str]:
    """Expand `PWN(...)` groups recursively into their members."""
    if part.startswith("PWN(") and part.endswith(")"):
        return [leaf for inner in _split_top(part[4:-1], commas=True) for leaf in _unwrap(inner)]
    return [part]


def split_layer_name(name: str) -> NameParts:
    """The ONNX-side names a TensorRT layer name joins (see the module docstring for the forms)."""
    text = _SEPARATORS.sub(" + ", name).strip()
    profile = 0
    if match := _PROFILE.search(text):
        profile, text = int(match[1]), text[: match.start()]
    if _REFORMAT.match(text) or _TRAIN_STATION.match(text):
        return NameParts((), False, True, profile)
    if match := _FOREIGN.match(text):
        first, _, last = match[1].partition("...")
        ends = tuple(p for p in (first.strip(), last.strip()) if p)
        return NameParts(ends, True, False, profile)
    parts = tuple(leaf for part in _split_top(text) for leaf in _unwrap(part))
    return NameParts(parts, False, False, profile)


def metadata_nodes(metadata: str) -> list[str]:
    """The ONNX node names of a layer's `Metadata` (`[ONNX Layer: a]\\x1e[ONNX Layer: b]`), in order,
    each once."""
    seen: dict[str, None] = {}
    for node in _ONNX_LAYER.findall(metadata or ""):
        seen.setdefault(node.strip(), None)
    return [node for node in seen if node]


def tensor_dtype(tensor: Mapping[str, Any]) -> str | None:
    """A layer tensor's element type as fp32 / fp16 / bf16 / int8 / fp8 / int32 / int64 / bool / ...:
    from `Datatype` (TensorRT 11; `DataType` as its I/O tensors spell it), else from the
    `Format/Datatype` description (TensorRT 10 and older)."""
    for key in ("Datatype", "DataType", "Format/Datatype", "Format/DataType", "Format"):
        value = tensor.get(key)
        if isinstance(value, str) and (match := _DTYPE.search(value)):
            return _DTYPE_NAMES[match[1]]
    return None


def _tensors(layer: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = layer.get(key)
    return [t for t in value if isinstance(t, Mapping)] if isinstance(value, list) else []


def _format(tensor: Mapping[str, Any]) -> str:
    text = tensor.get("Format/Datatype") or tensor.get("Format/DataType")
    if text is None:
        text = " ".join(str(tensor[k]) for k in ("Datatype", "DataType", "Format") if tensor.get(k))
    return str(text)


def _layer_row(layer: Mapping[str, Any], node_ops: Mapping[str, str] | None) -> dict[str, Any]:
    name = str(layer["Name"])
    parsed = split_layer_name(name)
    from_metadata = metadata_nodes(layer["Metadata"]) if isinstance(layer.get("Metadata"), str) else []
    if from_metadata:
        candidates, source = from_metadata, "metadata"
    elif parsed.inserted:
        candidates, source = [], "inserted"
    else:
        candidates, source = list(parsed.parts), "name-endpoints" if parsed.endpoints else "name"
    if node_ops is not None:
        nodes = [n for n in candidates if n in node_ops]
        unmatched = [n for n in candidates if n not in node_ops]
    else:
        nodes, unmatched = candidates, []
    layer_type = layer.get("LayerType")
    inputs, outputs = _tensors(layer, "Inputs"), _tensors(layer, "Outputs")
    in_types = [tensor_dtype(t) for t in inputs]
    out_types = [tensor_dtype(t) for t in outputs]
    precision = layer.get("Precision")
    if isinstance(precision, str):
        precision = _DTYPE_NAMES.get(precision, precision.lower())
    else:
        precision = next((t for t in (*in_types, *out_types) if t), None)
    inserted = parsed.inserted or layer_type in INSERTED_TYPES
    n_ops: float = float("nan") if source == "name-endpoints" else len(nodes)
    return {
        "name": name,
        "type": layer_type,
        "onnx_nodes": " + ".join(nodes),
        "fused_ops": ", ".join(node_ops[n] for n in nodes) if node_ops is not None else "",
        "n_ops": n_ops,
        "single_op": bool(n_ops <= 1),
        "source": source,
        "tactic": layer.get("TacticName"),
        "tactic_value": layer.get("TacticValue"),
        "precision": precision,
        "input_dtypes": ", ".join(t or "?" for t in in_types),
        "output_dtypes": ", ".join(t or "?" for t in out_types),
        "input_dims": "; ".join(json.dumps(t.get("Dimensions"), separators=(",", ":")) for t in inputs),
        "inputs": "; ".join(_format(t) for t in inputs),
        "outputs": "; ".join(_format(t) for t in outputs),
        "compute": not inserted,
        "unmatched": " + ".join(unmatched),
        "profile": parsed.profile,
    }


def trt_fusions(document: str | bytes | Mapping[str, Any], node_ops: Mapping[str, str] | None = None,
                profile: int | None = 0) -> pd.DataFrame:
    """One row per engine layer (of optimization profile `profile`; None keeps all), in engine order.

    | name | type | onnx_nodes | fused_ops | n_ops | single_op | source | tactic | tactic_value | precision |
    | input_dtypes | output_dtypes | input_dims | inputs | outputs | compute | unmatched | profile |

    `onnx_nodes` joins the ONNX nodes the layer implements with " + " (from `Metadata`, else the name;
    `source` says which: metadata / name / name-endpoints for a Myelin region named by its ends only, whose
    `n_ops` is then unknown (NaN) / inserted for TensorRT's own reformat and sync layers). With `node_ops`
    (ONNX node name → op type, from the graph TensorRT built) only names that are ONNX nodes count, their op
    types fill `fused_ops` ("MatMul, Add, Erf") and the other names (weights, TensorRT-internal layers) go to
    `unmatched`. `precision` is the layer's `Precision` field when the inspector gives one, else its first
    input's element type (what a GEMM/convolution computes in), else its first output's. `inputs`/`outputs`
    keep the raw format strings; `compute` is False for layers TensorRT inserted (reformats, no-ops, syncs).
    """
    engine = read_engine_json(document)
    rows = [_layer_row(layer, node_ops) for layer in engine.layers]
    frame = pd.DataFrame(rows, columns=list(LAYER_COLUMNS))
    if profile is not None:
        frame = frame[frame["profile"] == profile].reset_index(drop=True)
    return frame


def trt_summary(fusions: pd.DataFrame) -> dict[str, Any]:
    """Counts over a `trt_fusions` table, keyed like `hlo_summary`: `kernels` (compute layers),
    `fusions` (compute layers of several ONNX nodes, Myelin regions included) and the `fused_ops` in them
    (known counts only), `unfused_ops` (compute layers of at most one node), `inserted` (reformat / no-op /
    sync layers), and compute layers by type and by precision."""
    compute = fusions[fusions["compute"]]
    n_ops = compute["n_ops"]
    fused = compute[n_ops.isna() | (n_ops > 1)]
    return {
        "layers": len(fusions),
        "kernels": len(compute),
        "fusions": len(fused),
        "fused_ops": int(fused["n_ops"].fillna(0).sum()),
        "unfused_ops": int((n_ops <= 1).sum()),
        "inserted": int((~fusions["compute"]).sum()),
        "by_type": {str(k): int(v) for k, v in compute["type"].fillna("?").value_counts().items()},
        "by_precision": {str(k): int(v) for k, v in compute["precision"].fillna("?").value_counts().items()},
    }


def read_node_ops(text: str | bytes | Mapping[str, Any] | None, source: str = ONNX_NODES) -> dict[str, str] | None:
    """The ONNX node name → op type map (`onnx_nodes.json`, text or decoded); None for None. WorkbenchError
    naming `source` when it is not a JSON object of strings."""
    if text is None:
        return None
    if isinstance(text, (str, bytes)):
        try:
            text = json.loads(text)
        except ValueError as exc:
            raise WorkbenchError(f"{source}: not JSON: {exc}") from exc
    if not isinstance(text, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in text.items()):
        raise WorkbenchError(f"{source}: expected a JSON object of ONNX node name → op type strings")
    return dict(text)


def artifact_fusions(texts: Mapping[str, str]) -> pd.DataFrame | None:
    """`trt_fusions` of a TensorRT run's compile texts (file name → text, as `PreparedTrtVariant.artifacts`
    holds them): the inspector's JSON (`ENGINE_JSON`) read with the node map (`ONNX_NODES`) when there is
    one; None when the texts have no inspector JSON (the engine was never built)."""
    if ENGINE_JSON not in texts:
        return None
    return trt_fusions(texts[ENGINE_JSON], read_node_ops(texts.get(ONNX_NODES)))


def layer_executions(trace: Trace | pd.DataFrame) -> pd.DataFrame:
    """Per profiled engine execution (a `module` event with `layer` children), in time order:

    | execution | start_ns | layers | layer_ns | wall_ns |

    `layer_ns` sums its layers' times (the engine's device time, TensorRT's reformats included), `wall_ns`
    is the execution's span (IProfiler runs are slowed by the per-layer timing). Empty without layers.
    """
    events = trace.df() if isinstance(trace, Trace) else trace
    layers = events[(events["kind"].astype(str) == "layer") & (events["parent"] >= 0)]
    if layers.empty:
        return pd.DataFrame(columns=list(EXECUTION_COLUMNS))
    sums = layers.groupby("parent").agg(layers=("dur_ns", "size"), layer_ns=("dur_ns", "sum"))
    modules = events.iloc[sums.index.to_numpy()]
    table = pd.DataFrame({"start_ns": modules["start_ns"].to_numpy(), "layers": sums["layers"].to_numpy(),
                          "layer_ns": sums["layer_ns"].to_numpy(), "wall_ns": modules["dur_ns"].to_numpy()})
    table = table.sort_values("start_ns", kind="stable").reset_index(drop=True)
    table.insert(0, "execution", range(len(table)))
    return table


def trt_layer_table(fusions: pd.DataFrame, trace: Trace | None = None) -> pd.DataFrame:
    """The fusion table (`trt_fusions`) with each layer's time from the trace's `layer` events, matched by
    name: `trt_fusions` columns, then

    | executions | median_ns | total_ns | share |

    `executions` is how many profiled executions reported the layer, `median_ns` its median time per
    execution, `total_ns` the sum, `share` its part of all layers' time. NaN (0 executions) for a layer the
    trace has no event of, or without a trace.
    """
    table = fusions.copy()
    events = trace.df() if trace is not None else None
    is_layer = events["kind"].astype(str) == "layer" if events is not None else None
    if is_layer is None or not is_layer.any():
        table["executions"] = 0
        for column in TIME_COLUMNS[1:]:
            table[column] = np.nan
        return table
    layers = events[is_layer].assign(name=lambda e: e["name"].astype(str))
    per_name = layers.groupby("name")["dur_ns"].agg(executions="size", median_ns="median", total_ns="sum")
    total = float(layers["dur_ns"].sum())
    joined = table["name"].map(per_name["executions"])
    table["executions"] = joined.fillna(0).astype(int)
    table["median_ns"] = table["name"].map(per_name["median_ns"]).astype(float)
    table["total_ns"] = table["name"].map(per_name["total_ns"]).astype(float)
    table["share"] = table["total_ns"] / total if total > 0 else np.nan
    return table
