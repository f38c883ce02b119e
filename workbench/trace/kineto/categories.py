"""Kineto trace categories: the event kind each maps to, and which run on a device lane."""

from __future__ import annotations

KIND_BY_CATEGORY: dict[str, str] = {
    # Kineto 2021 (PyTorch 1.8-1.10)
    "Operator": "op", "Runtime": "runtime", "Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset",
    "Trace": "annotation", "Python": "python", "Overhead": "other",
    # current Kineto
    "cpu_op": "op", "user_annotation": "annotation", "gpu_user_annotation": "annotation",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "cuda_sync": "runtime",
    "cuda_profiler_range": "annotation", "cpu_instant_event": "annotation",
    "python_function": "python", "overhead": "other", "fwdbwd": "other",
    # other vendors' activities
    "hip_runtime": "runtime", "hip_driver": "runtime",
    "mtia_runtime": "runtime", "mtia_ccp_events": "kernel", "mtia_insight": "other",
    "xpu_runtime": "runtime", "xpu_driver": "runtime",
    "privateuse1_runtime": "runtime", "privateuse1_driver": "runtime",
    "hpu_op": "op", "glow_runtime": "runtime", "collective_comm": "op",
    # the workbench's own exports (`workbench.export`) of kinds Kineto has no category for: on a device they are
    # written on the device's pid, where rows of host categories run on that device (as MTIA's runtime calls do)
    "xla_op": "hlo", "xla_module": "module", "trt_layer": "layer",
}
"""Trace categories and the event kind each maps to; others become `other` (category in args)."""

KIND_BY_NAME_PREFIX: dict[str, tuple[tuple[str, str], ...]] = {
    # MTIA command processor events: HTA counts every one as a kernel and `dma*` as memory; here the
    # stream's waits and event records are syncs on the device lane (as `cuda_sync` is), not compute.
    "mtia_ccp_events": (("dma", "memcpy"), ("event_", "runtime")),
}
"""Categories whose events differ in kind by name: (name prefix, kind) pairs, first match wins; names
matching none keep the category's kind."""

DEVICE_CATEGORIES = frozenset({"Kernel", "Memcpy", "Memset", "kernel", "gpu_memcpy", "gpu_memset",
                               "gpu_user_annotation", "cuda_sync", "mtia_ccp_events", "cuda_profiler_range"})
"""Categories recorded on a device lane (pid = device, tid = stream)."""

DEVICE_RANGE_CATEGORIES = frozenset({"cuda_profiler_range"})
"""Device categories with no stream: CUPTI range-profiler ranges (one per kernel, on the GPU's pid, its
counters in args), on a `<device>/profiler ranges` lane. Their times are not the kernels' own: the
range profiler replays each kernel and Kineto spreads the ranges evenly over the profiling window
(every range of the HTA fixture lasts 121,431 µs), so they are annotations, not kernel time; their
numeric args also go to the counters table."""

DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "rocm", 8: "maia", 9: "xla", 12: "xpu", 13: "mps", 15: "hpu",
                19: "mtia", 20: "privateuseone"}
"""c10::DeviceType codes as written in `[memory]` events' `Device Type`."""


def kind_of(category: str | None, name: str) -> str:
    """The event kind of a record of `category` named `name` (`other` for unknown categories)."""
    for prefix, kind in KIND_BY_NAME_PREFIX.get(category or "", ()):
        if name.startswith(prefix):
            return kind
    return KIND_BY_CATEGORY.get(category or "", "other")
