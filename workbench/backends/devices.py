"""Device discovery and synchronization; everything is queried lazily, never at import."""

from __future__ import annotations

import re

import torch

from workbench.errors import VariantUnavailable, WorkbenchError


def available_devices() -> list[str]:
    """Devices torch can run on here: always "cpu", then "cuda:N" for each visible GPU."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return devices


def parse_device(device: str) -> torch.device:
    """`device` as a torch.device; a malformed name is a WorkbenchError."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise WorkbenchError(f"invalid device {device!r} (expected e.g. cpu, cuda, cuda:1)") from exc


_JAX_ONLY_DEVICE = re.compile(r"^tpu(:\d+)?$")
"""Device names only JAX variants run on (torch has no TPU backend)."""


def check_device_name(device: str) -> None:
    """Raise WorkbenchError unless `device` is a device name some backend knows (cpu, cuda[:N], tpu[:N])."""
    if isinstance(device, str) and _JAX_ONLY_DEVICE.match(device):
        return
    try:
        parse_device(device)
    except WorkbenchError as exc:
        raise WorkbenchError(f"invalid device {device!r} (expected cpu, cuda[:N] or tpu[:N])") from exc


def torch_supports(device: str) -> bool:
    """Whether torch can name `device` (False for tpu, which only JAX variants use)."""
    return not _JAX_ONLY_DEVICE.match(device)


def resolve_device(device: str) -> torch.device:
    """The torch.device to run on, or VariantUnavailable saying why this machine has no such device."""
    if not torch_supports(device):
        raise VariantUnavailable(f"device {device}: torch has no TPU backend; only the jax-* variants run there")
    parsed = parse_device(device)
    if parsed.type == "cpu":
        return parsed
    if parsed.type != "cuda":
        raise VariantUnavailable(f"device {device}: unsupported device type '{parsed.type}' (cpu or cuda)")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise VariantUnavailable(
            f"device {device}: CUDA is not available here (torch {torch.__version__}, {build})"
        )
    index = 0 if parsed.index is None else parsed.index
    if index >= torch.cuda.device_count():
        raise VariantUnavailable(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on `device` (a no-op on CPU, where calls are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
