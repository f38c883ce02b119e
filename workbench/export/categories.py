"""The Kineto category each event kind is written under, so our Kineto reader (and chrome://tracing, Perfetto,
HTA) read an export as they read a PyTorch profiler trace, kinds unchanged (`trace.kineto.categories` maps back)."""

from __future__ import annotations

HOST_CATEGORY = {"op": "cpu_op", "runtime": "cuda_runtime", "annotation": "user_annotation",
                 "python": "python_function", "other": "overhead", "kernel": "kernel", "memcpy": "gpu_memcpy",
                 "memset": "gpu_memset", "hlo": "xla_op", "module": "xla_module", "layer": "trt_layer"}
"""Category of each kind on a host lane."""

DEVICE_CATEGORY = {**HOST_CATEGORY, "annotation": "gpu_user_annotation", "runtime": "cuda_sync"}
"""Category of each kind on a device lane (where Kineto records device annotations and syncs)."""

VENDOR_RUNTIME = {"rocm": "hip_runtime", "xpu": "xpu_runtime", "mtia": "mtia_runtime"}
"""Runtime categories of other vendors: the reader names a trace's devices by them (`cuda` otherwise)."""


def category(kind: str, on_device: bool, vendor: str) -> str:
    """The category of an event of `kind` on a device lane or a host lane of a trace whose devices are `vendor`'s."""
    if kind == "runtime" and not on_device and vendor in VENDOR_RUNTIME:
        return VENDOR_RUNTIME[vendor]
    return (DEVICE_CATEGORY if on_device else HOST_CATEGORY)[kind]
