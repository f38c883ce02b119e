"""Where the workbench keeps its files on disk, resolved when asked (never at import time)."""

from __future__ import annotations

import os
from pathlib import Path

TRACES_ENV = "WORKBENCH_TRACES"
"""Environment variable that sets the traces root when no `--out` is given."""


def traces_root(out: str | Path | None = None) -> Path:
    """The traces root as an absolute path: `out` (the `--out` option) wins, then `$WORKBENCH_TRACES`,
    then `./traces` in the current directory. An empty environment variable counts as unset."""
    chosen = out if out is not None else os.environ.get(TRACES_ENV) or "traces"
    return Path(chosen).expanduser().absolute()
