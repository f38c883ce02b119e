"""`workbench import`: bundles from traces captured elsewhere (all files read before any is written)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow.compute as pc

from workbench.trace import Trace, read_trace
from workbench.trace.bundle import delete_bundle, new_run_id, write_bundle


def import_traces(paths: Sequence[str | os.PathLike[str]], root: Path) -> list[str]:
    """Read every trace, then write one bundle per file (raw copied in); return the new run ids.

    A file that cannot be read raises `TraceFormatError` before anything is written; a failure
    while writing removes the bundles this call already wrote, so an import is all or nothing.
    """
    traces: list[tuple[Path, Trace]] = [(Path(p), read_trace(p)) for p in paths]
    written: list[str] = []
    try:
        for path, trace in traces:
            run_id = new_run_id("import", _stem(path))
            devices = sorted(str(d) for d in pc.unique(trace.events["device"]).to_pylist() if d)
            info = {
                "model": None,
                "variant": None,
                "device": ",".join(devices) or "cpu",
                "source": "import",
                "imported_from": str(path.resolve()),
            }
            write_bundle(root, run_id, info, trace, raw_files=[path])
            written.append(run_id)
    except BaseException:
        for run_id in written:
            delete_bundle(run_id, root)
        raise
    return written


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".sqlite", ".nsys", ".pt.trace", ".trace"):
        name = name.removesuffix(suffix)
    return name or "trace"
