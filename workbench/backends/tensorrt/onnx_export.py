"""torch → ONNX for the TensorRT variants, with a dynamic batch axis.

Uses torch's `torch.export`-based exporter (`torch.onnx.export(..., dynamo=True)`, which needs
onnxscript). The batch axis (axis 0 of every input) is exported as the symbolic dim `batch`, so one
ONNX file serves every batch size and TensorRT's optimization profile picks the range; other axes keep
the example inputs' sizes.

Opset 19 (`OPSET`), because:
- it is the lowest opset whose QuantizeLinear/DequantizeLinear take float16 scales and float8 types,
  which ModelOpt's int8/fp8 quantization needs (its minimum for both; it would upgrade a lower opset);
- below opset 23 scaled_dot_product_attention is exported as MatMul/Softmax/MatMul rather than the
  ONNX `Attention` op, the pattern TensorRT's attention fusion, ModelOpt's MHA Q/DQ placement and
  onnxruntime's CPU kernels all handle;
- TensorRT 10 and 11 both parse it (11.x documents opsets 9 to 25), so nothing newer is needed.
ModelOpt's bf16 autocast raises the opset to 22 itself (bf16 is poorly typed below 22).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.backends.tensorrt.deps import require
from workbench.backends.tensorrt.onnx_graph import graph_facts
from workbench.errors import WorkbenchError

OPSET = 19
"""The ONNX opset exported (see the module docstring for why)."""

BATCH_DIM = "batch"
"""Name of the symbolic batch dim in the exported graph."""

EXTERNAL_DATA_BYTES = 1 << 30
"""Weights above this size go to an external data file (protobuf caps one file at 2 GiB)."""


@dataclass(frozen=True)
class OnnxExport:
    """An exported ONNX file: its path, I/O names, opset, whether the batch axis is symbolic (False
    when the model would not export with it and was exported at the example batch instead), node
    count and the export's wall time."""

    path: Path
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    opset: int
    dynamic_batch: bool
    nodes: int
    export_s: float
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {**asdict(self), "path": str(self.path)}


def input_names(module: nn.Module, count: int) -> list[str]:
    """Names for `count` positional inputs: the forward's parameter names where it has that many
    plain ones (`tokens` for tiny-gpt), else `input_0`, `input_1`, ..."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[:count] if len(params) >= count else [f"input_{i}" for i in range(count)]


def _batch_of_two(inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The inputs with a batch of at least 2: torch.export specializes a dim whose example size is 1,
    so a batch-1 example would freeze the batch axis. Only the shapes matter for tracing."""
    return tuple(torch.cat([t, t]) if t.dim() and t.shape[0] == 1 else t for t in inputs)


def export_onnx(module: nn.Module, inputs: Sequence[torch.Tensor], path: str | Path, *,
                opset: int = OPSET, dynamic_batch: bool = True) -> OnnxExport:
    """Export `module` (eval mode, on CPU or its device) called on `inputs` to the ONNX file `path`.

    With `dynamic_batch`, axis 0 of every input is the symbolic dim `batch`; a model whose code fixes
    the batch (a reshape to a literal size) cannot take that, and is exported at the example batch
    instead (`dynamic_batch` False in the result, the reason in `note`).
    """
    require("onnxscript")  # the dynamo exporter's ONNX builder; fail early with the extra's name
    require("onnx")
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise WorkbenchError("ONNX export needs the model's example inputs as a non-empty tuple of tensors")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = input_names(module, len(inputs))
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    start = time.perf_counter()
    note = None
    was_training = module.training
    module.eval()
    try:
        if dynamic_batch:
            try:
                _export(module, _batch_of_two(inputs), path, names, opset, weights, dynamic=True)
            except Exception as exc:  # torch.export's constraint errors vary by version
                note = f"batch axis not exportable as dynamic ({type(exc).__name__}); exported at batch " \
                       f"{inputs[0].shape[0]}"
                dynamic_batch = False
        if not dynamic_batch:
            _export(module, tuple(inputs), path, names, opset, weights, dynamic=False)
    finally:
        module.train(was_training)
    elapsed = time.perf_counter() - start
    facts = graph_facts(path)
    return OnnxExport(path=path, input_names=tuple(facts.inputs), output_names=tuple(facts.outputs),
                      opset=facts.opset, dynamic_batch=dynamic_batch, nodes=facts.nodes, export_s=elapsed,
                      note=note)


def _export(module: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, names: list[str], opset: int,
            weights: int, *, dynamic: bool) -> None:
    dynamic_shapes = None
    if dynamic:
        batch = torch.export.Dim(BATCH_DIM)
        dynamic_shapes = tuple({0: batch} if t.dim() else {} for t in inputs)
    try:
        with torch.no_grad():
            torch.onnx.export(module, inputs, str(path), dynamo=True, opset_version=opset, verbose=False,
                              input_names=names, dynamic_shapes=dynamic_shapes,
                              external_data=weights > EXTERNAL_DATA_BYTES)
    except Exception as exc:
        if dynamic:
            raise
        raise WorkbenchError(f"ONNX export of {type(module).__name__} failed: {type(exc).__name__}: {exc}") from exc
