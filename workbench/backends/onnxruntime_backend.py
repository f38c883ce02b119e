"""The ONNX Runtime backend: a model's ONNX export run by onnxruntime's CPU execution provider.

`ort` exports the model with the TensorRT path's exporter (`workbench.backends.tensorrt.onnx_export`: opset
19, dynamic batch) into a temporary folder, opens an `InferenceSession` with every graph optimization on
(`ORT_ENABLE_ALL`: constant folding, node fusions, layout changes) and one intra-op thread per torch thread,
and runs it on numpy copies of the inputs. The first call exports and builds the session, which is what the
`compile` phase measures. The optimized graph is kept as the compile-stage text `ort_optimized.onnx.txt`
(its node count per op type beside the export's, so the fusion ORT did shows). onnxruntime and onnx come with
`workbench[onnx]`.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from workbench.backends.benchmark import WallClockTimer
from workbench.backends.devices import parse_device
from workbench.backends.prepared import time_first_call
from workbench.backends.registry import BackendSpec, register_backend
from workbench.backends.variants import Variant
from workbench.errors import VariantUnavailable
from workbench.models import LoadedModel

OPTIMIZED_GRAPH = "ort_optimized.onnx.txt"
"""Compile-stage text of an `ort` run: node counts per op type, exported and after ORT's optimizations."""


class PreparedOrtVariant:
    """An ONNX Runtime session over the model's export, built on the first call."""

    def __init__(self, variant: Variant, loaded: LoadedModel, notes: dict[str, Any]) -> None:
        self.variant = variant
        self.notes = notes
        self.artifacts: dict[str, str] = {}
        self._loaded = loaded
        self._session: Any = None
        self._folder = tempfile.TemporaryDirectory(prefix="workbench-ort-")

    def place(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """The inputs as contiguous CPU numpy arrays (what ORT reads)."""
        return tuple(t.detach().cpu().contiguous().numpy() for t in inputs)

    def _build(self, placed: Sequence[Any]) -> None:
        import onnxruntime as ort

        from workbench.backends.tensorrt.onnx_export import export_onnx

        folder = Path(self._folder.name)
        exported = export_onnx(self._loaded.module, [torch.from_numpy(a) for a in placed], folder / "model.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = torch.get_num_threads()
        options.optimized_model_filepath = str(folder / "optimized.onnx")
        self._session = ort.InferenceSession(str(exported.path), options, providers=["CPUExecutionProvider"])
        self._names = [i.name for i in self._session.get_inputs()]
        self.notes["onnx"] = exported.to_dict() | {"path": exported.path.name}
        self.artifacts[OPTIMIZED_GRAPH] = _op_counts(exported.path, folder / "optimized.onnx")

    def run(self, inputs: Sequence[Any]) -> torch.Tensor:
        """One inference call; the first output as a float tensor."""
        if self._session is None:
            self._build(inputs)
        outputs = self._session.run(None, dict(zip(self._names, inputs, strict=True)))
        return torch.from_numpy(outputs[0]).float()

    def sync(self) -> None:
        """Nothing: ORT's CPU run returns when done."""

    def timer(self) -> WallClockTimer:
        """The wall clock around `run`."""
        return WallClockTimer()

    def first_call(self, inputs: Sequence[Any]) -> float:
        """Export, build the session and run once; their wall seconds, kept as notes["first_call_s"]."""
        return time_first_call(self, [torch.from_numpy(a) for a in inputs])


def _op_counts(exported: Path, optimized: Path) -> str:
    """`op type: exported -> optimized` node counts, one line each (ops ORT fused away drop, fused ops appear)."""
    import onnx

    before = Counter(node.op_type for node in onnx.load(str(exported), load_external_data=False).graph.node)
    after = Counter(node.op_type for node in onnx.load(str(optimized), load_external_data=False).graph.node)
    lines = [f"{op}: {before.get(op, 0)} -> {after.get(op, 0)}" for op in sorted(before | after)]
    return "\n".join([f"nodes: {sum(before.values())} -> {sum(after.values())}", *lines]) + "\n"


def prepare_ort(variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False) -> PreparedOrtVariant:
    """An ONNX Runtime variant of `loaded`, built on its first call; VariantUnavailable off the CPU or without
    onnxruntime (`pip install 'workbench[onnx]'`). `kernel_profile` changes nothing."""
    from workbench.backends.tensorrt.deps import check_installed

    if parse_device(variant.device).type != "cpu":
        raise VariantUnavailable(f"variant {variant.name}: ONNX Runtime runs here on its CPU execution provider "
                                 f"(device cpu), not {variant.device}")
    check_installed("onnxruntime", "onnx", "onnxscript")
    import onnxruntime as ort

    notes = {"device": "cpu", "onnxruntime_version": ort.__version__, "execution_provider": "CPUExecutionProvider",
             "graph_optimization": "all", "compile": "onnxruntime", "torch_threads": torch.get_num_threads()}
    return PreparedOrtVariant(variant, loaded, notes)


VARIANTS = (Variant("ort", backend="onnxruntime", compile="onnxruntime",
                    description="the model's ONNX export on ONNX Runtime (CPU provider, all graph optimizations)"),)
"""The ONNX Runtime variants."""

register_backend(BackendSpec("onnxruntime", VARIANTS, prepare_ort, framework_profiler="torch.profiler"))
