"""The software and machine a run happened on, recorded in every run.json."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

PACKAGES = ("torch", "torchao", "numpy", "pyarrow", "nvtx")


def _version(package: str) -> str | None:
    """The installed version of `package` (from its metadata, without importing it), or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def environment(device: str = "cpu") -> dict[str, Any]:
    """Versions, platform, torch's thread count and CPU capability; the GPU and CUDA version when
    `device` is a CUDA device that exists here."""
    import torch  # loaded by the run being recorded; not by whoever imports the profiling package

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        # torch's own string keeps the build tag (+cpu, +cu130) that the package metadata drops
        "versions": {**{package: _version(package) for package in PACKAGES}, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    target = torch.device(device)
    if target.type == "cuda" and torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(target)
    return env
