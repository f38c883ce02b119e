"""A prepared ONNX Runtime variant: the source graph, transformed by the variant's recipe, in an
`InferenceSession` on its execution provider, built on the first call (what the `compile` phase measures).

The session has the recipe's graph optimization level, one intra-op thread per torch thread, and saves its
optimized graph, whose node counts beside the given graph's become the compile-stage texts
`ort_optimized.onnx.txt` and `ort_graph.json`. A profiled copy (`kernel_profile`) also runs with ORT's own
profiler on (`SessionOptions.enable_profiling`): `end_profiling` then closes and returns its JSON.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from workbench.analysis.ort_fusion import GRAPH_RECORD
from workbench.backends.benchmark import WallClockTimer
from workbench.backends.onnxruntime.graph import counts_text, graph_inputs, graph_record, source_graph
from workbench.backends.onnxruntime.quantization import calibration_batches, convert_fp16, quantize_int8
from workbench.backends.onnxruntime.recipes import TENSORRT, OrtRecipe
from workbench.backends.prepared import time_first_call
from workbench.backends.variants import Variant
from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.models import LoadedModel

OPTIMIZED_GRAPH = "ort_optimized.onnx.txt"
"""Compile-stage text of an ORT run: node counts per op type, given graph and after ORT's optimizations."""

LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
"""Optimization level → `onnxruntime.GraphOptimizationLevel` member."""

ERROR_LOGS = 3
"""ORT's log severity for sessions: errors only (its optimizer warns about hardware-specific saved graphs)."""


class PreparedOrtVariant:
    """An ONNX Runtime session over the variant's graph, built on the first call."""

    def __init__(self, variant: Variant, loaded: LoadedModel, recipe: OrtRecipe, providers: list[Any],
                 notes: dict[str, Any], *, profile: bool = False) -> None:
        self.variant = variant
        self.notes = notes
        self.artifacts: dict[str, str] = {}
        self._loaded = loaded
        self._recipe = recipe
        self._providers = providers
        self._profile = profile
        self._session: Any = None
        self._names: list[str] = []
        self._work = Path(tempfile.mkdtemp(prefix=f"workbench-{variant.name}-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._work, ignore_errors=True)

    def place(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """The inputs as contiguous CPU numpy arrays (what ORT reads)."""
        return tuple(t.detach().cpu().contiguous().numpy() for t in inputs)

    def _graph(self, placed: Sequence[Any]) -> tuple[Path, str]:
        """The graph the session opens (the source graph, quantized or converted), and what it is."""
        source, facts = source_graph(self._loaded, [torch.from_numpy(a) for a in placed])
        self.notes["onnx"] = facts
        precision, quantization = self.variant.precision, self._recipe.quantization
        if quantization == "static":
            from workbench.backends.tensorrt.prepared import infer_seq

            tensors = [torch.from_numpy(a) for a in placed]
            feeds, made = calibration_batches(self._loaded, graph_inputs(source), placed,
                                              infer_seq(self._loaded, tensors))
            self.notes["calibration"] = made
            return quantize_int8(source, self._work / "int8_static.onnx", "static", feeds), "int8 static QDQ"
        if quantization == "dynamic":
            return quantize_int8(source, self._work / "int8_dynamic.onnx", "dynamic"), "int8 dynamic"
        if precision == "fp16":
            return convert_fp16(source, self._work / "fp16.onnx"), "fp16"
        return source, facts["source"]

    def _build(self, placed: Sequence[Any]) -> None:
        import onnxruntime as ort

        graph, given_as = self._graph(placed)
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self._recipe.optimization])
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = ERROR_LOGS
        optimized = None
        if self._recipe.provider != TENSORRT:  # TensorRT's compiled nodes cannot be saved as ONNX
            optimized = self._work / "optimized.onnx"
            options.optimized_model_filepath = str(optimized)
        if self._profile:
            options.enable_profiling = True
            options.profile_file_prefix = str(self._work / "ort_profile")
        try:
            self._session = ort.InferenceSession(str(graph), options, providers=self._providers)
        except Exception as exc:  # ORT's Fail / NotImplemented / InvalidGraph
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if given_as != self.notes["onnx"]["source"]:
                raise VariantUnavailable(f"variant {self.variant.name}: {self._recipe.provider} cannot run the "
                                         f"{given_as} graph: {reason}") from exc
            raise WorkbenchError(f"variant {self.variant.name}: ONNX Runtime cannot open the graph: {reason}") from exc
        self._names = [i.name for i in self._session.get_inputs()]
        self.notes["execution_providers"] = self._session.get_providers()
        record = graph_record(graph, optimized, self._recipe.optimization, given_as)
        self.artifacts[OPTIMIZED_GRAPH] = counts_text(record)
        self.artifacts[GRAPH_RECORD] = json.dumps(record, indent=1)

    def run(self, inputs: Sequence[Any]) -> torch.Tensor:
        """One inference call; the first output as a float tensor."""
        if self._session is None:
            self._build(inputs)
        outputs = self._session.run(None, dict(zip(self._names, inputs, strict=True)))
        return torch.from_numpy(outputs[0]).float()

    def sync(self) -> None:
        """Nothing: ORT's run returns its outputs on the host when done."""

    def timer(self) -> WallClockTimer:
        """The wall clock around `run`."""
        return WallClockTimer()

    def first_call(self, inputs: Sequence[Any]) -> float:
        """Build the graph and session and run once; their wall seconds, kept as notes["first_call_s"]."""
        return time_first_call(self, [torch.from_numpy(a) for a in inputs])

    def end_profiling(self) -> tuple[Path, int] | None:
        """Stop ORT's profiler: its JSON file and start time (UTC epoch ns); None when it was not on."""
        if not self._profile or self._session is None:
            return None
        start = int(self._session.get_profiling_start_time_ns())
        return Path(self._session.end_profiling()), start

    def close(self) -> None:
        """Drop the session and remove the working folder (idempotent)."""
        self._session = None
        self._cleanup()
