"""The workbench's cache folder: what it keeps between commands that can be made again (URL mirrors, CPU
measurements, models saved for a serving engine). It imports nothing of the workbench, so every layer may use it."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "WORKBENCH_CACHE"
"""Environment variable naming the workbench's cache folder (URL mirrors, CPU measurements, served models)."""


def cache_dir() -> Path:
    """The cache folder: `$WORKBENCH_CACHE`, else ~/.cache/workbench (honouring $XDG_CACHE_HOME)."""
    chosen = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "workbench"
    return Path(chosen).expanduser().absolute()
