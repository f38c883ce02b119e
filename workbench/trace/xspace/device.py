"""Device planes of an XSpace (`/device:GPU:N`, `/device:TPU:N`): device names, event kinds, device properties.

A device plane holds one line per kind of work:

| line                                                   | kind                                          |
|--------------------------------------------------------|-----------------------------------------------|
| `Stream #N(...)`: what CUPTI (roctracer) recorded on a | per event: stat `kernel_details` or a         |
| stream, its event types in the parentheses (`Compute`  | `Compute`/`Kernel`-only stream → `kernel`;    |
| in TensorFlow's profiler, `Kernel`, `MemcpyH2D`,       | `memcpy_details` or name `Memcpy*` → `memcpy`;|
| `Memset`... in XLA's)                                  | `Memset_details` or `Memset*` → `memset`;     |
|                                                        | anything else (`CudaGraph`...) → `other`      |
| `XLA Modules`, `Sparse Core Modules`                   | `module`                                      |
| `XLA Ops`, `Async XLA Ops`, `Sparse Core Ops`          | `hlo`                                         |
| `TensorFlow Ops` / `Framework Ops`                     | `op`                                          |
| `TensorFlow Name Scope` / `Framework Name Scope`,      | `annotation`                                  |
| `Steps`, `Sparse Core Steps`                           |                                               |
| any other (`Launch Stats`, `CUPTI overhead`,           | `other`                                       |
| `_counters_`, `Tensor Core Sync Flag`...)              |                                               |

On a GPU only the stream lines are work the tracer saw; the other lines are views XProf derives from
them (an `XLA Ops` or `Framework Ops` event spans the kernels of one op), so they get other kinds and
kernel time is the stream lines' alone. A kernel's `kernel_details` (`regs:38 shm:0 grid:160,1,1
block:1024,1,1`, newer XLA: `static_shared:`, `dynamic_shared:`, `occ_pct:`) is also given under
Kineto's arg names (`grid`, `block`, `registers per thread`, `shared memory`); a copy's or memset's size
goes to `bytes`. The raw stats stay in args.
"""

from __future__ import annotations

import math
import re
from typing import Any

_DEVICE_PLANE = re.compile(r"^/device:(TPU|GPU):(\d+)")
_STREAM_LINE = re.compile(r"^Stream #\d+(?:\((?P<types>[^)]*)\))?$")
_LINE_KINDS = {
    "XLA Modules": "module", "Sparse Core Modules": "module",
    "XLA Ops": "hlo", "Async XLA Ops": "hlo", "Sparse Core Ops": "hlo",
    "TensorFlow Ops": "op", "Framework Ops": "op",
    "TensorFlow Name Scope": "annotation", "Framework Name Scope": "annotation",
    "Steps": "annotation", "Sparse Core Steps": "annotation",
}
_KERNEL_STREAM_TYPES = frozenset({"Compute", "Kernel"})
_KERNEL_STAT = "kernel_details"
_MEMCPY_STAT = "memcpy_details"
_MEMSET_STATS = ("Memset_details", "memset_details")
_AMD = "AMD"


def plane_device(plane_name: str, stats: dict[str, Any], host: str | None) -> str | None:
    """The device column of a device plane's events (`cuda:N`, `rocm:N` for AMD, `tpu:N`; `<host>/cuda:N`
    when `host` is given, as in a run with several hosts), or None for a plane that is no device."""
    match = _DEVICE_PLANE.match(plane_name)
    if not match:
        return None
    prefix = "tpu" if match[1] == "TPU" else "rocm" if stats.get("device_vendor") == _AMD else "cuda"
    device = f"{prefix}:{match[2]}"
    return f"{host}/{device}" if host else device


def sub_plane(plane_name: str) -> list[str]:
    """What a device plane's name adds after `/device:TPU:N` (`SparseCore 0`), as a track part, so the
    lines of a TPU's SparseCore planes do not share tracks with its TensorCore's."""
    match = _DEVICE_PLANE.match(plane_name)
    rest = plane_name[match.end():].strip() if match else ""
    return [rest] if rest else []


def line_kind(line_name: str) -> str | None:
    """The kind of every event on a device line, or None for a stream line (see `stream_event_kind`)."""
    if _STREAM_LINE.match(line_name):
        return None
    return _LINE_KINDS.get(line_name, "other")


def stream_types(line_name: str) -> frozenset[str]:
    """The event types a stream line's name lists (`Stream #7(Kernel,MemcpyD2D)` → Kernel, MemcpyD2D)."""
    match = _STREAM_LINE.match(line_name)
    types = match["types"] if match else None
    return frozenset(t.strip() for t in types.split(",")) if types else frozenset()


def stream_event_kind(name: str, stats: dict[str, Any], types: frozenset[str]) -> str:
    """`kernel`, `memcpy`, `memset` or `other` for an event on a stream line with these event types."""
    if _KERNEL_STAT in stats:
        return "kernel"
    if _MEMCPY_STAT in stats or name.startswith("Memcpy"):
        return "memcpy"
    if any(s in stats for s in _MEMSET_STATS) or name.startswith("Memset"):
        return "memset"
    return "kernel" if types and types <= _KERNEL_STREAM_TYPES else "other"


def stream_event_details(kind: str, stats: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The event's stats with its launch configuration under Kineto's names first (kernels), and the
    bytes a copy or memset moved (NaN if not given)."""
    if kind == "kernel" and isinstance(stats.get(_KERNEL_STAT), str):
        details = _details(stats[_KERNEL_STAT])
        launch = {key: details[key] for key in ("grid", "block") if isinstance(details.get(key), list)}
        if "regs" in details:
            launch["registers per thread"] = details["regs"]
        shared = [details[k] for k in ("shm", "static_shared", "dynamic_shared") if k in details]
        if shared and all(isinstance(s, int) for s in shared):
            launch["shared memory"] = sum(shared)
        return {**launch, **stats}, math.nan
    if kind in ("memcpy", "memset"):
        text = next((stats[k] for k in (_MEMCPY_STAT, *_MEMSET_STATS) if isinstance(stats.get(k), str)), "")
        details = _details(text)
        size = details.get("size", details.get("num_bytes"))
        return stats, float(size) if isinstance(size, int) else math.nan
    return stats, math.nan


def device_properties(device: str, stats: dict[str, Any]) -> dict[str, Any]:
    """A device plane's capability stats in the workbench's device-metadata shape (as the Kineto and nsys
    readers give it): name, memory, bandwidth, SM count, clock, compute capability; the stats under `source`."""
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    clock_khz = stats.get("clock_rate")
    return {
        "device": device,
        "name": stats.get("gpu_device_name"),
        "vendor": stats.get("device_vendor"),
        "memory_bytes": stats.get("memory_size"),
        "memory_bandwidth_bytes_per_s": stats.get("memory_bandwidth"),
        "sm_count": stats.get("core_count"),
        "clock_hz": clock_khz * 1000 if isinstance(clock_khz, int | float) else None,
        "compute_capability": None if major is None else f"{major}.{minor}",
        "source": stats,
    }


def _details(text: str) -> dict[str, Any]:
    """The `key:value` pairs of a CUPTI details stat; `a,b,c` values as lists, numbers as numbers."""
    pairs: dict[str, Any] = {}
    for token in text.split():
        key, colon, value = token.partition(":")
        if colon:
            parts = [_number(p) for p in value.split(",")]
            pairs[key] = parts if len(parts) > 1 else parts[0]
    return pairs


def _number(text: str) -> int | float | str:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text
