"""The child process a tool launches, from the inside: `python -m workbench _profile-variant SPEC.json` runs one
variant's profiled lifecycle as the spec says (`workbench.profiling.child` writes the spec and reads the result).

Kept apart from the launching side, which the Nsight profilers import: this side loads the lifecycle, and so
the profiler registry that names them.
"""

from __future__ import annotations

import json
from pathlib import Path

from workbench.profiling.child import RESULT_JSON, ChildSpec
from workbench.profiling.settings import ProfileSettings


def run_child(spec_path: str | Path) -> Path:
    """In the child process: run the spec's variant through its profiled lifecycle and write
    `result.json` (phase timings, notes, the CUDA memory snapshot's path); returns that file."""
    import torch

    from workbench.backends import get_variant
    from workbench.models import load_model
    from workbench.profiling.lifecycle import profile_variant
    from workbench.profiling.registry import get_profiler
    from workbench.trace.store.bundle import json_safe

    spec = ChildSpec.read(Path(spec_path))
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_model(spec.model, **spec.model_overrides)
    inputs = loaded.make_inputs(spec.batch, spec.seq)
    variant = get_variant(spec.variant, spec.batch, spec.device)
    profiled = profile_variant(variant, loaded, inputs, out, ProfileSettings(**spec.settings),
                               tool=get_profiler(spec.profiler))
    snapshot = profiled.memory_snapshot
    result = {"variant": variant.name, "phases_ms": profiled.phases_ms, "notes": profiled.notes,
              "memory_snapshot": str(snapshot) if snapshot else None}
    path = out / RESULT_JSON
    path.write_text(json.dumps(json_safe(result), indent=2), encoding="utf-8")
    return path
