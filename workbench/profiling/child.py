"""The child process a tool launches, from the launching side: its spec file, command, environment and result.

CUPTI serves one profiler per process: torch.profiler (Kineto) and jax.profiler (XProf) cannot trace
while Nsight does. So an Nsight run happens in a child process the tool launches:
`python -m workbench _profile-variant SPEC.json` loads the model by reference, runs the variant's
labelled lifecycle (`profile_variant`) under the profiler's in-child session (`cuda-range`), and writes
`result.json` (phase timings, preparation notes, the CUDA memory snapshot's path) into its output folder.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.profiling.tools import tail

CHILD_COMMAND = "_profile-variant"
"""The hidden CLI command a tool launches: one variant's profiled lifecycle (see `workbench.profiling.child_run`)."""
RESULT_JSON = "result.json"


def child_command(spec_path: str | Path, python: str | None = None) -> list[str]:
    """The command of the child process that runs one variant for a tool (see `workbench.profiling.child_run`)."""
    return [python or sys.executable, "-m", "workbench", CHILD_COMMAND, str(spec_path)]


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: this one, with this interpreter's import path on PYTHONPATH (so user
    models found here are found there) and JAX's GPU memory preallocation off (the parent may hold GPU
    memory already)."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


@dataclass(frozen=True)
class ChildSpec:
    """What the child process runs: a model reference and overrides, one variant on a device, batch and
    sequence length, torch threads, the profile settings (ProfileSettings fields), the tool it runs
    under (`nsys`, `ncu`), and the folder for its `result.json` and memory snapshot."""

    model: str
    variant: str
    batch: int
    device: str
    out_dir: str
    profiler: str = "nsys"
    seq: int | None = None
    threads: int | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def write(self, path: Path) -> Path:
        """Write the spec as JSON to `path` and return it."""
        path.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> ChildSpec:
        """The spec in the JSON file `path`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise WorkbenchError(f"{path}: not a profile-variant spec: {exc}") from exc


def child_result(out: Path, log: Path) -> dict[str, Any]:
    """The child's result.json (the tool ran it), or an error saying the child never finished."""
    try:
        return json.loads((out / RESULT_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"the profiled child process left no result ({out / RESULT_JSON}: {exc}); "
                             f"{tail(log)}") from exc


def free_cuda_cache() -> None:
    """Give this process's cached GPU memory back before a child needs the GPU."""
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def prepared_child(spec: ChildSpec, folder: Path, profiler: str) -> tuple[ChildSpec, Path, Path]:
    """(the spec for `profiler`, its JSON file, the log file), in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = replace(spec, profiler=profiler, out_dir=str(folder / f"{profiler}-child"))
    path = spec.write(folder / f"{spec.variant}.{profiler}-spec.json")
    return spec, path, folder / f"{spec.variant}.{profiler}.log"


