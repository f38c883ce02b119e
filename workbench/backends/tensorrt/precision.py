"""Precision applied in the ONNX graph, as strongly typed TensorRT networks need it (TensorRT 11 has
no FP16/BF16/INT8/FP8 builder flags and no INT8 calibrator; 10.12+ deprecates them).

- fp16 / bf16: ModelOpt AutoCast (`modelopt.onnx.autocast.convert_to_mixed_precision`) casts the
  graph to the low type, keeping in fp32 the nodes whose values (measured by running the graph in
  onnxruntime on the calibration inputs) exceed the low type's safe range; I/O types are kept, so the
  engine takes and returns what the fp32 model does.
- int8 / fp8: ModelOpt's ONNX PTQ (`modelopt.onnx.quantization.quantize`) inserts
  QuantizeLinear/DequantizeLinear pairs with scales calibrated on the calibration inputs; the rest of
  the graph is converted to fp16 (`HIGH_PRECISION`, ModelOpt's default and TensorRT's usual pairing).
- fp32: the graph as exported.

Both ModelOpt steps run on CPU through onnxruntime (`calibration_eps=["cpu"]`), so they give the same
graph on a laptop and on the GPU machine. `CALIBRATION_METHOD` is "max" (absolute-max ranges, the
algorithm of ModelOpt's torch INT8/FP8 default configs): entropy calibration needs histograms over
many more samples than the few example inputs used here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.backends.tensorrt.deps import require
from workbench.backends.tensorrt.onnx_graph import QDQ_OPS, GraphFacts, graph_facts
from workbench.errors import WorkbenchError
from workbench.models.onnx_file import load_onnx

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
"""Precisions the TensorRT variants take."""

AUTOCAST = {"fp16": "fp16", "bf16": "bf16"}
"""Precision → ModelOpt AutoCast `low_precision_type`."""

QUANTIZE = {"int8": "int8", "fp8": "fp8"}
"""Precision → ModelOpt `quantize_mode`."""

CALIBRATION_METHOD = "max"
HIGH_PRECISION = "fp16"
"""Type of the unquantized part of an int8/fp8 graph."""

_PROTOBUF_LIMIT = 1 << 31


@dataclass(frozen=True)
class PreparedOnnx:
    """The ONNX file TensorRT builds from, its precision, and `summary` (see `precision_summary`)."""

    path: Path
    precision: str
    summary: dict[str, Any]


def precision_summary(before: GraphFacts, after: GraphFacts) -> dict[str, Any]:
    """What the precision step changed: node counts by op type before and after, the ops it added
    (`inserted`, e.g. Cast, QuantizeLinear) and removed, the Q/DQ nodes it inserted, initializers and
    node outputs by element type before and after, and the opset before and after."""
    ops = sorted(set(before.ops) | set(after.ops))
    delta = {op: after.ops.get(op, 0) - before.ops.get(op, 0) for op in ops}
    return {
        "opset": {"before": before.opset, "after": after.opset},
        "nodes": {"before": before.nodes, "after": after.nodes},
        "ops_before": before.ops,
        "ops_after": after.ops,
        "inserted": {op: n for op, n in delta.items() if n > 0},
        "removed": {op: -n for op, n in delta.items() if n < 0},
        "qdq_inserted": {op: max(delta.get(op, 0), 0) for op in QDQ_OPS},
        "initializers": {"before": before.initializers, "after": after.initializers},
        "node_outputs": {"before": before.node_outputs, "after": after.node_outputs},
    }


def _check_calibration(calibration: Mapping[str, np.ndarray], facts: GraphFacts) -> None:
    missing = sorted(set(facts.inputs) - set(calibration))
    extra = sorted(set(calibration) - set(facts.inputs))
    if missing or extra:
        raise WorkbenchError(f"calibration data must name the graph's inputs {sorted(facts.inputs)}: "
                             f"missing {missing}, unknown {extra}")
    rows = {len(array) for array in calibration.values()}
    if len(rows) != 1 or 0 in rows:
        raise WorkbenchError(f"calibration arrays need one equal, non-zero number of samples; got {sorted(rows)}")


def apply_precision(onnx_path: str | Path, precision: str, calibration: Mapping[str, np.ndarray] | None,
                    out_dir: str | Path, *, batch: int = 1,
                    calibration_method: str = CALIBRATION_METHOD) -> PreparedOnnx:
    """Write the `precision` version of the fp32 graph `onnx_path` into `out_dir` (as
    `model.<precision>.onnx`; fp32 returns the input file) and say what changed.

    `calibration` maps every graph input to an array of samples along axis 0 (one graph call per
    sample); ModelOpt runs the graph on them in onnxruntime: AutoCast to find the nodes whose values
    overflow fp16/bf16, quantization to set the Q/DQ scales. fp32 needs none.

    `batch` is the batch the engine is built for. Quantization calibrates in steps of that many samples
    (a whole number of steps: extra samples are left out), and ModelOpt decides from those shapes which
    matmuls to quantize: it leaves out GEMVs (an M or N of 1, e.g. a batch-1 MLP) and GEMMs with K or N
    under 16, where Q/DQ makes TensorRT slower.
    """
    if precision not in PRECISIONS:
        raise WorkbenchError(f"TensorRT precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    before = graph_facts(onnx_path)
    if precision == "fp32":
        summary = precision_summary(before, before)
        summary.update(precision=precision, tool=None, modelopt_version=None, seconds=0.0, calibration=None,
                       high_precision=None)
        return PreparedOnnx(path=onnx_path, precision=precision, summary=summary)
    if calibration is None:
        raise WorkbenchError(f"{precision} needs calibration inputs (ModelOpt runs the graph on them)")
    _check_calibration(calibration, before)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkbenchError(f"batch must be a positive integer, got {batch!r}")
    samples = len(next(iter(calibration.values())))
    if precision in QUANTIZE:
        samples -= samples % batch
        if samples == 0:
            raise WorkbenchError(f"{precision} calibration needs at least one batch of {batch} samples")
        calibration = {name: array[:samples] for name, array in calibration.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if precision in AUTOCAST:
        tool = "modelopt.onnx.autocast.convert_to_mixed_precision"
        path = _autocast(onnx_path, AUTOCAST[precision], calibration, out_dir)
    else:
        tool = "modelopt.onnx.quantization.quantize"
        path = _quantize(onnx_path, QUANTIZE[precision], calibration, out_dir, calibration_method, batch)
    elapsed = time.perf_counter() - start
    summary = precision_summary(before, graph_facts(path))
    summary.update({
        "precision": precision,
        "tool": tool,
        "modelopt_version": _modelopt_version(),
        "seconds": elapsed,
        "calibration": {
            "samples": samples,
            "inputs": {name: [samples, *array.shape[1:]] for name, array in calibration.items()},
            "method": calibration_method if precision in QUANTIZE else "reference run (value ranges)",
            "batch": batch if precision in QUANTIZE else 1,
            "execution_providers": ["cpu"],
        },
        "high_precision": HIGH_PRECISION if precision in QUANTIZE else None,
    })
    return PreparedOnnx(path=path, precision=precision, summary=summary)


def _modelopt_version() -> str:
    return str(getattr(require("modelopt", "nvidia-modelopt"), "__version__", "unknown"))


def _autocast(onnx_path: Path, low: str, calibration: Mapping[str, np.ndarray], out_dir: Path) -> Path:
    """ModelOpt AutoCast to `low`; the calibration inputs go through an .npz, the form it reads."""
    onnx = require("onnx")
    autocast = require("modelopt.onnx.autocast", "nvidia-modelopt")
    npz = out_dir / "autocast_calibration.npz"
    np.savez(npz, **{name: np.asarray(array) for name, array in calibration.items()})
    try:
        model = autocast.convert_to_mixed_precision(
            onnx_path=str(onnx_path), low_precision_type=low, keep_io_types=True,
            calibration_data=str(npz), providers=["cpu"],
        )
    except ImportError as exc:
        raise WorkbenchError(f"ModelOpt AutoCast needs a package that is missing: {exc}") from exc
    finally:
        npz.unlink(missing_ok=True)
    path = out_dir / f"model.{low}.onnx"
    large = model.ByteSize() > _PROTOBUF_LIMIT // 2
    onnx.save(model, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None)
    return path


def _quantize(onnx_path: Path, mode: str, calibration: Mapping[str, np.ndarray], out_dir: Path,
              method: str, batch: int) -> Path:
    """ModelOpt ONNX PTQ in `mode` (int8 / fp8) with Q/DQ scales from `method` calibration, in steps of
    `batch` samples."""
    quantization = require("modelopt.onnx.quantization", "nvidia-modelopt")
    path = out_dir / f"model.{mode}.onnx"
    shapes = ",".join(f"{name}:{'x'.join(str(d) for d in (batch, *array.shape[1:]))}"
                      for name, array in calibration.items())
    with _ort_quantization_kept():
        try:
            quantization.quantize(
                str(onnx_path), quantize_mode=mode,
                calibration_data={name: np.ascontiguousarray(array) for name, array in calibration.items()},
                calibration_method=method, calibration_shapes=shapes, calibration_eps=["cpu"], output_path=str(path),
                high_precision_dtype=HIGH_PRECISION, log_level="WARNING",
                use_external_data_format=os.path.getsize(onnx_path) > _PROTOBUF_LIMIT // 2,
            )
        except ImportError as exc:
            raise WorkbenchError(f"ModelOpt quantization needs a package that is missing: {exc}") from exc
    if not path.is_file():
        raise WorkbenchError(f"ModelOpt {mode} quantization of {onnx_path} wrote no model (expected {path})")
    load_onnx(path)  # a readable result, or a WorkbenchError naming it
    return path


@contextmanager
def _ort_quantization_kept() -> Iterator[None]:
    """ONNX Runtime's quantization modules and classes as they are, put back after the block. ModelOpt patches
    ORT's calibrators and quantizers for its own PTQ (`modelopt.onnx.quantization.ort_patching`) and leaves them
    so, which made a later `ort-int8-static` in the same process fail ("Quantization parameters are not
    specified")."""
    owners: list[Any] = [module for name, module in list(sys.modules.items())
                         if name.startswith("onnxruntime.quantization") and module is not None]
    owners += [value for module in list(owners) for value in vars(module).values()
               if isinstance(value, type) and value.__module__.startswith("onnxruntime.quantization")]
    saved = [(owner, dict(vars(owner))) for owner in owners]
    try:
        yield
    finally:
        for owner, before in saved:
            now = vars(owner)
            for name in [name for name in now if name not in before]:
                with suppress(AttributeError, TypeError):
                    delattr(owner, name)
            for name, value in before.items():
                if now.get(name) is not value:
                    with suppress(AttributeError, TypeError):
                        setattr(owner, name, value)
