"""What this machine offers the work the workbench sizes by it: CPUs it may run on, memory free now."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (psutil, else /proc/meminfo's MemAvailable)."""
    try:
        import psutil
    except ImportError:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    return int(psutil.virtual_memory().available)
