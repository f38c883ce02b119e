"""The local CPU, measured rather than guessed: matmul FLOP/s per dtype and copy bandwidth.

A CPU's datasheet peak says little about what torch reaches on it (ISA paths, threads, a VM's share of
a host), so the roofline's CPU ceilings come from a short microbenchmark:

- matmul: square `torch.mm` (fp32, bf16, fp16) and `torch._int_mm` (int8 -> int32, where this torch
  has it on CPU). The size doubles from 256 until one call takes `target_s` (or `max_n` is reached),
  then the median of `repeats` timed calls gives 2·n³ / t.
- bandwidth: `dst.copy_(src)` of `copy_bytes`, counted as read + write (2 × bytes / t, the STREAM
  "copy" convention), sized well beyond the last-level cache of common CPUs.

Results depend on the thread count, so they are kept per count. They are cached as JSON in
`$WORKBENCH_CACHE` (default `$XDG_CACHE_HOME/workbench`, else `~/.cache/workbench`) under a name
hashed from the CPU model, core count, machine, torch version and torch's CPU capability: a new torch
or another machine measures afresh; `force=True` re-measures. Nothing here runs at import.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench.cache import cache_dir
from workbench.hardware.device import DeviceSpec

CACHE_VERSION = 1
MATMUL_DTYPES = ("fp32", "bf16", "fp16", "int8")


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else the platform module)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def fingerprint() -> dict[str, Any]:
    """What the measurement depends on; its hash names the cache file."""
    import torch

    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def cache_path(print_: dict[str, Any] | None = None) -> Path:
    """The cache file of this machine (or of the given fingerprint)."""
    digest = hashlib.sha256(json.dumps(print_ or fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"cpu-{digest}.json"


def measure_cpu(threads: int, *, target_s: float = 0.03, max_n: int = 2048, copy_bytes: int = 256 * 2**20,
                repeats: int = 5) -> dict[str, Any]:
    """Measure matmul FLOP/s per dtype and copy bandwidth with `threads` torch threads (see the module
    docstring). Returns `{"threads", "peak_flops": {dtype: FLOP/s}, "matmul_n": {dtype: n},
    "memory_bw_bytes_per_s", "copy_bytes", "repeats", "measured_at"}`."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        peaks: dict[str, float] = {}
        sizes: dict[str, int] = {}
        for dtype in MATMUL_DTYPES:
            call = _matmul_call(dtype)
            if call is None:
                continue
            n, seconds = _fit_size(call, target_s, max_n, repeats)
            peaks[dtype], sizes[dtype] = 2.0 * n**3 / seconds, n
        bandwidth = _copy_bandwidth(copy_bytes, repeats)
    finally:
        torch.set_num_threads(previous)
    return {
        "threads": threads, "peak_flops": peaks, "matmul_n": sizes, "memory_bw_bytes_per_s": bandwidth,
        "copy_bytes": copy_bytes, "repeats": repeats, "measured_at": datetime.now(timezone.utc).isoformat(),
    }


def local_cpu_spec(threads: int | None = None, *, force: bool = False) -> DeviceSpec:
    """This machine's CPU as a `DeviceSpec` for `threads` torch threads (default: torch's current
    count), from the cache when it holds that count, else measured now (a few seconds) and cached."""
    import torch

    threads = threads or torch.get_num_threads()
    machine = fingerprint()
    path = cache_path(machine)
    cached = _read_cache(path, machine)
    entry = None if force else cached.get(str(threads))
    if entry is None:
        entry = measure_cpu(threads)
        cached[str(threads)] = entry
        _write_cache(path, machine, cached)
    return cpu_spec(entry, machine, path)


def cpu_spec(entry: dict[str, Any], machine: dict[str, Any], path: Path | None = None) -> DeviceSpec:
    """A measurement (`measure_cpu`'s dict) as a `DeviceSpec`; sources point at the cache file."""
    source = f"measured by workbench.hardware.cpu_probe on {entry['measured_at']}" + (f" ({path})" if path else "")
    peaks = {dtype: float(v) for dtype, v in entry["peak_flops"].items()}
    return DeviceSpec(
        name="cpu", kind="cpu", peak_flops=peaks, memory_bw_bytes_per_s=float(entry["memory_bw_bytes_per_s"]),
        memory_bytes=_physical_memory(),
        description=f"{machine['cpu']}, {entry['threads']} torch thread(s), torch {machine['torch']} (measured)",
        sources={**{f"peak_flops.{d}": source for d in peaks}, "memory_bw_bytes_per_s": source},
        measured=True,
    )


def _matmul_call(dtype: str) -> Callable[[int], Callable[[], object]] | None:
    """For a dtype, a function from size n to a zero-argument matmul call; None where torch lacks it."""
    import torch

    if dtype == "int8":
        if not hasattr(torch, "_int_mm"):
            return None

        def make_int(n: int) -> Callable[[], object]:
            a = torch.randint(-128, 128, (n, n), dtype=torch.int8)
            b = torch.randint(-128, 128, (n, n), dtype=torch.int8)
            return lambda: torch._int_mm(a, b)

        try:
            make_int(64)()
        except (RuntimeError, NotImplementedError):
            return None
        return make_int
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

    def make(n: int) -> Callable[[], object]:
        a, b = torch.randn(n, n).to(torch_dtype), torch.randn(n, n).to(torch_dtype)
        return lambda: torch.mm(a, b)

    return make


def _fit_size(make: Callable[[int], Callable[[], object]], target_s: float, max_n: int,
              repeats: int) -> tuple[int, float]:
    """(n, median seconds per call) at the first n (doubling from 256) whose call takes target_s."""
    n = min(256, max_n)
    while True:
        call = make(n)
        call()  # warm-up: first-touch, kernel selection
        start = time.perf_counter()
        call()
        if time.perf_counter() - start >= target_s or n * 2 > max_n:
            return n, _median_time(call, repeats)
        n *= 2


def _copy_bandwidth(copy_bytes: int, repeats: int) -> float:
    """Bytes/s of a float32 tensor copy, read + write counted (buffers freed on return)."""
    import torch

    src = torch.ones(max(copy_bytes // 4, 1), dtype=torch.float32)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / _median_time(lambda: dst.copy_(src), repeats)


def _median_time(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls after one warm-up call."""
    call()
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return max(statistics.median(times), 1e-9)


def _read_cache(path: Path, machine: dict[str, Any]) -> dict[str, Any]:
    """Cached measurements by thread count; empty when missing, stale or unreadable (with a warning)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if data.get("version") == CACHE_VERSION and data.get("fingerprint") == machine:
            return dict(data["results"])
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        warnings.warn(f"{path}: ignoring an unreadable CPU measurement cache ({exc})", stacklevel=3)
    return {}


def _write_cache(path: Path, machine: dict[str, Any], results: dict[str, Any]) -> None:
    """Write the cache atomically (temp file renamed into place); a read-only cache dir only warns."""
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".cpu-", suffix=".tmp", delete=False) as tmp:
            tmp_name = tmp.name
            json.dump({"version": CACHE_VERSION, "fingerprint": machine, "results": results}, tmp, indent=1)
        os.replace(tmp_name, path)
    except OSError as exc:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
        warnings.warn(f"{path}: cannot cache the CPU measurement ({exc}); it will be measured again", stacklevel=3)


def _physical_memory() -> float | None:
    """Installed RAM in bytes where the OS reports it (POSIX sysconf), else None."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None
