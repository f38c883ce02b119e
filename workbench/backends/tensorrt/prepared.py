"""`PreparedTrtVariant`: a model run through TensorRT, with the surface of the torch and JAX prepared
variants (`place`, `run`, `sync`, `timer`, `first_call`, `notes`, `artifacts`).

The engine is made on the first call, for the shapes of the inputs it gets (like XLA's compile in the
JAX variants, so the `compile` phase times it): torch → ONNX (`onnx_export`), precision in the graph
with ModelOpt on CPU (`precision`), the TensorRT build (`engine`). Calibration samples for ModelOpt are
the model's own seeded example inputs: rows `batch ..` of `make_inputs(batch + samples, seq)`, past the
rows the numerics check runs on.

Kept for the bundle: `artifacts` (texts for compile/: the engine inspector's JSON, the prepared graph's
node → op type map, the precision summary) and `compile_dir` (the ONNX files and the timing cache, for
compile/ too). They live in a temporary folder removed when the variant is garbage-collected or `close`d;
`keep_compile_files` moves them out first.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.backends.benchmark import CudaEventTimer
from workbench.backends.prepared import time_first_call
from workbench.backends.tensorrt.engine import TrtEngine, build_engine
from workbench.backends.tensorrt.onnx_export import export_onnx
from workbench.backends.tensorrt.onnx_graph import node_ops
from workbench.backends.tensorrt.precision import apply_precision
from workbench.backends.variants import Variant
from workbench.errors import WorkbenchError
from workbench.models import LoadedModel
from workbench.trace.formats.trt_layers import LayerTimes

CALIBRATION_SAMPLES = 32
"""Example inputs ModelOpt calibrates on (AutoCast's value ranges, Q/DQ scales)."""

ARTIFACTS = {"engine": "tensorrt_engine.json", "nodes": "onnx_nodes.json", "precision": "precision.json"}
"""File names of the texts `artifacts` holds once the engine exists."""

TIMING_CACHE = "timing.cache"

CALIBRATION_SUFFIX = ".npz"
"""ModelOpt's calibration inputs in the compile folder: made again from the model's seeded inputs, so not
kept with the run."""


def infer_seq(loaded: LoadedModel, inputs: Sequence[torch.Tensor]) -> int | None:
    """The sequence length `inputs` were made with: None for models without a sequence axis, else the
    candidate (the model's default, then each size in the inputs' shapes) whose one-item example inputs
    have the same non-batch shapes."""
    if loaded.default_seq is None:
        return None
    wanted = [tuple(t.shape[1:]) for t in inputs]
    candidates = dict.fromkeys([loaded.default_seq, *(int(d) for t in inputs for d in t.shape[1:])])
    for seq in candidates:
        try:
            made = loaded.make_inputs(1, seq)
        except WorkbenchError:
            continue
        if [tuple(t.shape[1:]) for t in made] == wanted:
            return seq
    raise WorkbenchError(f"model {loaded.name}: cannot tell which sequence length made inputs of shapes "
                         f"{[tuple(t.shape) for t in inputs]}")


def calibration_inputs(loaded: LoadedModel, names: Sequence[str], batch: int, seq: int | None,
                       samples: int = CALIBRATION_SAMPLES) -> dict[str, np.ndarray]:
    """`samples` seeded example inputs of `loaded` per graph input `names`: rows `batch ..` of
    `make_inputs(batch + samples, seq)`, so they are not the rows a numerics check on `make_inputs(batch,
    seq)` compares."""
    if samples < 1:
        raise WorkbenchError(f"calibration samples must be positive, got {samples}")
    made = loaded.make_inputs(batch + samples, seq)
    if len(made) != len(names):
        raise WorkbenchError(f"model {loaded.name} makes {len(made)} inputs, its ONNX graph takes {len(names)}")
    arrays = {}
    for name, tensor in zip(names, made, strict=True):
        if tensor.dim() == 0 or tensor.shape[0] != batch + samples:
            raise WorkbenchError(f"model {loaded.name}: input {name} has no batch axis 0 to calibrate along")
        arrays[name] = tensor[batch:].detach().cpu().numpy()
    return arrays


def keep_compile_files(compile_dir: Path, dest: Path) -> tuple[Path, ...]:
    """Move what a TensorRT build leaves in `compile_dir` (the exported and the precision-converted ONNX
    graphs with their external weight files, and the timing cache) into the folder `dest` (created), so
    they outlive the variant's temporary folder and go into the bundle's compile/ (only there: not into
    raw/ as well); calibration inputs stay behind. Returns the moved files' new paths, sorted."""
    if not compile_dir.is_dir():
        raise WorkbenchError(f"no TensorRT compile folder {compile_dir}: the engine was never built")
    dest.mkdir(parents=True, exist_ok=True)
    moved = []
    for path in sorted(compile_dir.iterdir()):
        if path.is_file() and path.suffix != CALIBRATION_SUFFIX:
            moved.append(Path(shutil.move(path, dest / path.name)))
    return tuple(moved)


class PreparedTrtVariant:
    """A TensorRT variant ready to run: `run(inputs)` returns the first output as float32 on the GPU."""

    def __init__(self, variant: Variant, loaded: LoadedModel, device: torch.device, notes: dict[str, Any], *,
                 timing_cache: Path | None = None, calibration_samples: int = CALIBRATION_SAMPLES) -> None:
        self.variant = variant
        self.device = device
        self.notes = notes
        self.artifacts: dict[str, str] = {}
        self._loaded = loaded
        self._timing_cache = timing_cache
        self._samples = calibration_samples
        self._engine: TrtEngine | None = None
        self._work = Path(tempfile.mkdtemp(prefix=f"workbench-trt-{variant.name}-"))
        self.compile_dir = self._work / "compile"
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._work, ignore_errors=True)

    def close(self) -> None:
        """Drop the engine and remove the working folder (idempotent)."""
        self._engine = None
        self._cleanup()

    def place(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The inputs on this variant's GPU, contiguous (what `execute_async_v3` reads)."""
        return tuple(t.to(self.device).contiguous() for t in inputs)

    def _build(self, placed: Sequence[torch.Tensor]) -> TrtEngine:
        """Export, apply the precision, build and load the engine for `placed`'s shapes."""
        self.compile_dir.mkdir(parents=True, exist_ok=True)
        cpu_inputs = tuple(t.detach().cpu() for t in placed)
        exported = export_onnx(self._loaded.module, cpu_inputs, self.compile_dir / "model.onnx")
        batch = len(cpu_inputs[0])
        calibration = None
        if self.variant.precision != "fp32":
            seq = infer_seq(self._loaded, cpu_inputs)
            samples = -(-self._samples // batch) * batch  # whole batches
            calibration = calibration_inputs(self._loaded, exported.input_names, batch, seq, samples)
        prepared = apply_precision(exported.path, self.variant.precision, calibration, self.compile_dir,
                                   batch=batch)
        shapes = {name: tuple(t.shape) for name, t in zip(exported.input_names, placed, strict=True)}
        saves = [self.compile_dir / TIMING_CACHE, *([self._timing_cache] if self._timing_cache else [])]
        with torch.cuda.device(self.device):
            built = build_engine(prepared.path, shapes, timing_cache=self._timing_cache, save_timing_cache=saves)
        engine = TrtEngine(built.plan, self.device)
        self.notes["tensorrt"] = {"onnx": exported.to_dict(), "precision": prepared.summary, "build": built.notes()}
        self.artifacts[ARTIFACTS["nodes"]] = json.dumps(node_ops(prepared.path), indent=1)
        self.artifacts[ARTIFACTS["precision"]] = json.dumps(prepared.summary, indent=1, default=str)
        return engine

    def run(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """One inference call (builds the engine first if needed); the first output as float32, ready on
        the current stream."""
        placed = self.place(inputs)
        if self._engine is None:
            self._engine = self._build(placed)
            outputs = self._engine.infer(placed)
            self.artifacts[ARTIFACTS["engine"]] = self._engine.inspector_json()
            self.notes["tensorrt"]["engine"] = self._engine.notes()
        else:
            outputs = self._engine.infer(placed)
        return outputs[0].float()

    def sync(self) -> None:
        """Wait for the GPU work queued so far."""
        torch.cuda.synchronize(self.device)

    def timer(self) -> CudaEventTimer:
        """CUDA events on the current stream, which `run` orders around the engine's own stream."""
        return CudaEventTimer()

    def first_call(self, inputs: Sequence[torch.Tensor]) -> float:
        """Export, precision, build and one run; returns their wall seconds together, also kept as
        notes["first_call_s"] (the split is in notes["tensorrt"])."""
        return time_first_call(self, inputs)

    def profile_layers(self, inputs: Sequence[torch.Tensor], iterations: int = 10) -> LayerTimes:
        """Per-layer device times of `iterations` runs through TensorRT's IProfiler (builds first if
        needed); `workbench.trace.formats.trt_layers.layer_trace` turns them into `layer` events. The profiler slows
        the execution (see `TrtEngine.profile`): call it after, never inside, the measured iterations."""
        placed = self.place(inputs)
        if self._engine is None:
            self.run(placed)
        assert self._engine is not None
        return self._engine.profile(placed, iterations)
