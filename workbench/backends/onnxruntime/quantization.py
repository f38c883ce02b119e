"""The graph transformations of the int8 and fp16 ORT variants, on CPU, into the variant's working folder.

- int8 dynamic (`onnxruntime.quantization.quantize_dynamic`): int8 weights; activations are quantized on each
  call from their observed range (MatMulInteger / DynamicQuantizeLinear);
- int8 static (`quantize_static`, QDQ format): QuantizeLinear/DequantizeLinear pairs with scales calibrated
  (MinMax) on generated inputs: `CALIBRATION_BATCHES` batches of the model's seeded example inputs that are
  not the rows the numerics check compares (`workbench.backends.tensorrt.prepared.calibration_inputs`); a
  graph whose batch is fixed calibrates on the example inputs themselves;
- fp16 (`onnxconverter_common.float16`): weights and ops in float16, inputs and outputs kept float32 (Casts
  at the edges); whether the execution provider has fp16 kernels for every op shows when the session opens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from workbench.backends.tensorrt.deps import require
from workbench.errors import WorkbenchError
from workbench.models import LoadedModel

CALIBRATION_BATCHES = 8
"""Batches of generated inputs static quantization calibrates on."""


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime.quantization logs advice (run pre-processing) through the root logger: keep it off stderr."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def calibration_batches(loaded: LoadedModel, names: Sequence[str], example: Sequence[np.ndarray],
                        seq: int | None) -> tuple[list[dict[str, np.ndarray]], str]:
    """The input feeds to calibrate on, and how they were made (for run.json)."""
    from workbench.backends.tensorrt.prepared import calibration_inputs

    batch = int(example[0].shape[0]) if example and example[0].ndim else 1
    try:
        arrays = calibration_inputs(loaded, names, batch, seq, samples=batch * CALIBRATION_BATCHES)
    except WorkbenchError:  # no batch axis to draw further rows along: the example inputs alone
        return [dict(zip(names, example, strict=True))], "the example inputs (the graph has a fixed batch)"
    feeds = [{name: array[i * batch:(i + 1) * batch] for name, array in arrays.items()}
             for i in range(CALIBRATION_BATCHES)]
    return feeds, f"{CALIBRATION_BATCHES} batches of {batch} generated inputs"


def quantize_int8(source: Path, target: Path, mode: str, feeds: list[dict[str, np.ndarray]] | None = None) -> Path:
    """`source` quantized to int8 into `target`: `mode` "dynamic", or "static" (QDQ, calibrated on `feeds`)."""
    quantization = require("onnxruntime.quantization", "onnxruntime")
    with _quiet_root_logger():
        if mode == "dynamic":
            quantization.quantize_dynamic(str(source), str(target), weight_type=quantization.QuantType.QInt8)
        else:
            quantization.quantize_static(str(source), str(target), calibration_reader(feeds or [], quantization),
                                         quant_format=quantization.QuantFormat.QDQ,
                                         activation_type=quantization.QuantType.QInt8,
                                         weight_type=quantization.QuantType.QInt8)
    return target


def calibration_reader(feeds: list[dict[str, np.ndarray]], quantization: Any) -> Any:
    """A `CalibrationDataReader` over `feeds` (the class is onnxruntime's, imported lazily)."""

    class Feeds(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self._items = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._items, None)

    return Feeds()


def convert_fp16(source: Path, target: Path) -> Path:
    """`source` with its float32 weights and ops in float16 (inputs and outputs kept float32) into `target`."""
    onnx = require("onnx")
    float16 = require("onnxconverter_common.float16", "onnxconverter-common")
    model = onnx.load(str(source))
    converted = float16.convert_float_to_float16(model, keep_io_types=True)
    onnx.save(converted, str(target))
    return target
