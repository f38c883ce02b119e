"""Upper bounds on the numbers a capture takes, shared by every surface (CLI, Jupyter server).

A typo (`--batch 40000000`, `--set d_model=10**9`) or a hostile request must fail at once with a clear
message, not after minutes of allocating memory or occupying the only capture slot. Each parser enforces
the lower bounds (click's `IntRange(min=1)`, the settings' own checks); `SETTING_MINIMUMS` lists them for
the surfaces that describe the settings (the server's capture options), `check_limits` checks the upper ones.

    check_limits({"batch": 4, "iterations": 30, "overrides": {"d_model": 256}})   # passes
    check_limits({"batch": 100_000})   # LimitError: batch: must be at most 4096, got 100000
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.errors import WorkbenchError

MAX_BATCH = 4096
"""Items per call. Inference benchmarks of the models a workbench runs peak far below this; beyond it the
example inputs alone can take gigabytes (tiny-gpt's logits are batch × seq × vocab floats)."""

MAX_SEQ = 32768
"""Tokens per item. Covers the long-context settings worth profiling; attention memory grows with its
square, so a larger value is almost always a typo that would exhaust memory."""

MAX_ITERATIONS = 1_000_000
"""Timed iterations per variant. Each keeps one latency sample; a million is hours for a real model,
enough for any steady-state measurement, and still a small list in memory."""

MAX_WARMUP = 10_000
"""Untimed warm-up iterations per variant. Caches, autotuning and compilation settle within a few
dozen; more than this only delays the measurement."""

MAX_PROFILE_STEPS = 1000
"""Profiled steps of the torch.profiler schedule. Every step adds its events to the trace; a thousand
steps of a real model already make a trace of millions of events."""

MAX_THREADS = 1024
"""torch intra-op threads. More than the cores of any current machine only oversubscribes them; the
bound stops a typo before it asks the OS for that many threads."""

MAX_MODEL_DIM = 65536
"""Any numeric model config override (`--set` / `overrides`: hidden, d_model, layers, heads, vocab, ...).
One size per key, not a memory budget: it stops typos and absurd values (and integers too large for
the tensors' shapes) before a model is built, while allowing a real vocabulary or layer width."""

UNBOUNDED_OVERRIDES = frozenset({"seed"})
"""Numeric overrides that are no size: a seed may be any non-negative integer."""

MAX_RUN_ID_LEN = 128
"""Characters of a run or experiment id: one file-system name (most file systems allow 255 bytes), with
room for the `.deleting-<id>-<hex>` name a deletion renames it to, and short enough for a table cell."""

SETTING_LIMITS: Mapping[str, int] = {
    "batch": MAX_BATCH,
    "seq": MAX_SEQ,
    "iterations": MAX_ITERATIONS,
    "warmup": MAX_WARMUP,
    "profile_steps": MAX_PROFILE_STEPS,
    "threads": MAX_THREADS,
}
"""The bounded capture settings, by the capture command's parameter names."""

SETTING_MINIMUMS: Mapping[str, int] = {
    "batch": 1,
    "seq": 1,
    "iterations": 1,
    "warmup": 0,
    "profile_steps": 1,
    "threads": 1,
    "launch_count": 1,
}
"""The smallest value of each integer capture setting, by the capture command's parameter names."""


class LimitError(WorkbenchError):
    """A setting above its limit; the message names the setting, its value and the limit."""


def check_limits(settings: Mapping[str, Any]) -> None:
    """Raise LimitError for the first setting of `settings` above its limit.

    Keys are the capture command's parameter names (`batch`, `seq`, `iterations`, `warmup`,
    `profile_steps`, `threads`) and `overrides`, a mapping of model config keys to values; other keys,
    None and non-numeric values are left to the parsers that know their types.
    """
    for name, limit in SETTING_LIMITS.items():
        _check(name, settings.get(name), limit)
    overrides = settings.get("overrides") or {}
    if isinstance(overrides, Mapping):
        for key, value in overrides.items():
            if key not in UNBOUNDED_OVERRIDES:
                _check(f"overrides: {key}", value, MAX_MODEL_DIM)


def _check(name: str, value: Any, limit: int) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not value <= limit:
        raise LimitError(f"{name}: must be at most {limit}, got {value!r}")
