"""ORT's own profile in a profiled run: closed after the framework profiler (`end_profiling`, the backend's
`after_profile`), kept beside the trace as `<variant>.ort_profile.json` (it goes to the bundle's raw/), then
read (`workbench.trace.formats.ort_profile`: ORT's session spans as host ops, every node's kernel as a `kernel` on its
execution provider's track) and merged into the run's torch.profiler trace on the clock by the backend's enricher."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.backends.registry import Enriched
from workbench.backends.variants import Variant
from workbench.trace import Trace
from workbench.trace.appended import append_trace
from workbench.trace.formats.ort_profile import read_ort_profile
from workbench.trace.ranks.multirank import absolute_origin_ns

if TYPE_CHECKING:
    from workbench.profiling.result import ProfiledRun

PROFILE_SUFFIX = ".ort_profile.json"
"""File of a run's ORT profile, beside the trace (it goes to the bundle's raw/)."""

NOTE = "ort_profile"
"""The profiled run's note naming the ORT profile file and its start time (UTC epoch ns)."""


def keep_ort_profile(prepared: Any, placed: Sequence[Any], run: ProfiledRun, out_dir: Path, iterations: int,
                     timings: dict[str, float]) -> ProfiledRun:
    """Close the variant's ORT profiler and move its JSON to `<name>.ort_profile.json` in `out_dir`; returns `run`
    with the file among its raw paths and notes["ort_profile"] = {file, start_ns, device}."""
    ended = prepared.end_profiling()
    if ended is None:
        return run
    written, start_ns = ended
    path = Path(shutil.move(written, out_dir / f"{prepared.variant.name}{PROFILE_SUFFIX}"))
    note = {"file": path.name, "start_ns": start_ns, "device": prepared.notes.get("device", "cpu")}
    return replace(run, raw_paths=(*run.raw_paths, path), notes={**run.notes, NOTE: note})


def with_ort_profile(trace: Trace, variant: Variant, profiled: ProfiledRun, folder: Path) -> Enriched:
    """The trace with the run's ORT profile merged in (unchanged when the run has none)."""
    note = profiled.notes.get(NOTE)
    if not note:
        return Enriched(trace)
    gpu = note["device"] if str(note["device"]).startswith("cuda") else "cuda:0"
    return Enriched(merge_ort_profile(trace, folder / note["file"], note["start_ns"], gpu=gpu))


def merge_ort_profile(trace: Trace, path: str | os.PathLike[str], start_ns: int, *, gpu: str = "cuda:0") -> Trace:
    """`trace` (a run's profiler trace) with the ORT profile at `path` appended, placed by clock: `start_ns`
    is the profile's start in UTC epoch ns (`get_profiling_start_time_ns`; Kineto's times are UTC epoch based).
    `metadata["ort_profile"]` says where it came from, the shift applied and how many events were added."""
    profile = read_ort_profile(path, gpu=gpu, origin_ns=start_ns)
    shift = int(start_ns) - absolute_origin_ns(trace)
    merged = append_trace(trace, profile, shift)
    merged.metadata["ort_profile"] = {"source": profile.metadata["source"], "placement": "clock", "shift_ns": shift,
                                      "events": profile.events.num_rows,
                                      "skipped": profile.metadata["reader"]["skipped"]}
    return merged
