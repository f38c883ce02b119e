"""Lazy imports of the TensorRT path's dependencies, each failing with the line that installs it.

TensorRT itself is a VariantUnavailable (it needs an NVIDIA GPU and NVIDIA's CUDA wheels, so it is
no plain extra); onnx, onnxruntime, onnxscript (torch's ONNX exporter) and ModelOpt are the
`workbench[onnx]` extra and raise MissingDependency.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch

from workbench.errors import MissingDependency, VariantUnavailable

EXTRA = "onnx"
"""The pyproject extra that installs onnx, onnxruntime, onnxscript and nvidia-modelopt."""

PACKAGES = {"modelopt": "nvidia-modelopt"}
"""Import name → PyPI name, where they differ."""

MIN_TENSORRT = 10
"""Oldest TensorRT major version supported: 10 added INT64 I/O and made `execute_async_v3` with named
tensor addresses the only execution API; 10.12+ and 11 build strongly typed networks."""


def tensorrt_install_line() -> str:
    """The pip line that installs TensorRT for the CUDA major version torch was built for."""
    cuda = torch.version.cuda
    if cuda and cuda.split(".")[0] in ("12", "13"):
        return f"pip install tensorrt-cu{cuda.split('.')[0]}"
    return "pip install tensorrt-cu12 (CUDA 12) or pip install tensorrt-cu13 (CUDA 13)"


def require_tensorrt() -> ModuleType:
    """The `tensorrt` module; VariantUnavailable with the install line when it is missing or too old."""
    try:
        trt = importlib.import_module("tensorrt")
    except ImportError as exc:
        raise VariantUnavailable(
            f"TensorRT not installed: {tensorrt_install_line()} on a machine with an NVIDIA GPU "
            f"(plus pip install 'workbench[{EXTRA}]' for the ONNX export and ModelOpt steps)"
        ) from exc
    major = int(str(getattr(trt, "__version__", "0")).split(".")[0] or 0)
    if major < MIN_TENSORRT:
        raise VariantUnavailable(
            f"TensorRT {trt.__version__} is too old: the workbench needs TensorRT >= {MIN_TENSORRT} "
            f"({tensorrt_install_line()})"
        )
    return trt


def require(module: str, package: str | None = None) -> ModuleType:
    """Import `module` (onnx, onnxruntime, onnxscript, modelopt.onnx...); MissingDependency naming the
    missing package (`package` for `module` itself, else the dependency that failed to import) and the
    `workbench[onnx]` extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        top = module.split(".")[0]
        if missing in ("", top):
            raise MissingDependency(package or PACKAGES.get(top, top), EXTRA) from exc
        raise MissingDependency(PACKAGES.get(missing, missing), EXTRA) from exc


def check_installed(*modules: str) -> None:
    """MissingDependency for the first of `modules` that is not installed, without importing any (ModelOpt
    takes seconds to import; preparing a variant should fail fast instead)."""
    for module in modules:
        top = module.split(".")[0]
        if importlib.util.find_spec(top) is None:
            raise MissingDependency(PACKAGES.get(top, top), EXTRA)
