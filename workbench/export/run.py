"""`export_run`: one bundle written as a trace file, atomically, with a summary of what went in."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError, write_error

FORMATS = ("perfetto", "chrome")
"""Export formats: Perfetto's protobuf TrackEvent trace (compact, for large runs) and Chrome Trace Event JSON
(chrome://tracing, and any tool reading PyTorch profiler traces)."""
SUFFIXES = {"perfetto": ".perfetto-trace", "chrome": ".json"}
"""The file name ending each format's default output takes (`<run>.perfetto-trace`, `<run>.json`)."""


def default_output(run_id: str, fmt: str, folder: Path) -> Path:
    """Where an export of `run_id` goes when no file is named: `<run id><suffix>` in `folder`."""
    return folder / f"{run_id}{SUFFIXES[fmt]}"


def export_run(run_dir: Path, fmt: str, out: Path, progress: Callable[[int, int], None] | None = None, *,
               critical_path: bool = False) -> dict[str, Any]:
    """Write the run in the bundle folder `run_dir` to `out` as `fmt` ("perfetto" or "chrome") and return the
    summary `workbench export --json` prints: path, format, bytes, events per kind, flows, counters, memory; with
    `critical_path`, the typical step's critical path as a track of its own (`workbench.export.critical_path`) and
    "critical_path": {"track", "segments"} (or {"error"} when the step has no path).

    The file is written beside `out` under a hidden temporary name and renamed into place, so an error or Ctrl-C
    leaves no half-written file (and an existing `out` untouched). `progress(done, total)` hears of the events
    written. WorkbenchError (BundleError) for a folder that is no bundle or a run without a trace, an unknown
    format, or an output that cannot be written."""
    from workbench.export.chrome import write_chrome
    from workbench.export.perfetto import write_perfetto
    from workbench.export.source import open_run_dir, plan

    if fmt not in FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    bundle = open_run_dir(run_dir)
    extra, path = None, None
    if critical_path:
        from workbench.export.critical_path import path_track

        extra, path = path_track(bundle.trace())
    source = plan(bundle, extra)
    out = Path(out)
    total = source.events.num_rows
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    writer = write_perfetto if fmt == "perfetto" else write_chrome
    tmp = out.parent / f".{out.name}.{secrets.token_hex(4)}.tmp"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        handle = open(tmp, "xb")  # noqa: SIM115 - closed below, before the rename
    except OSError as exc:
        raise write_error(exc, out, f"cannot write {out}: {exc.strerror or exc}") from exc
    try:
        with handle:
            written = writer(source, handle, advance)
        os.replace(tmp, out)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(exc, out, f"cannot write {out}: {exc.strerror or exc}") from exc
        raise
    return {"run": source.run_id, "path": str(out), "format": fmt, "bytes": out.stat().st_size,
            "events": written["events"], "kinds": source.kind_counts(), "flows": written["flows"],
            "counters": written["counters"], "memory": written["memory"],
            **({"critical_path": path} if path is not None else {})}
