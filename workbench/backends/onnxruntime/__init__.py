"""The ONNX Runtime backend: a model's ONNX graph (a torch model's export, or an ONNX file) run by onnxruntime.

Variants (`recipes.RECIPES`): `ort` (CPU execution provider, all graph optimizations), `ort-extended`,
`ort-basic`, `ort-noopt` (the other optimization levels; `ort-noopt` is an ONNX file's numerics reference),
`ort-int8` (dynamic quantization), `ort-int8-static` (static QDQ, calibrated on generated inputs), `ort-fp16`
(float16 graph), and `ort-cuda` / `ort-trt` on the CUDA and TensorRT execution providers where onnxruntime-gpu
provides them. A profiled run also records ORT's own profile, merged into the run's trace (`profile`).
onnxruntime and onnx come with `workbench[onnx]`.
"""

from __future__ import annotations

import torch

from workbench.backends.onnxruntime.prepared import GRAPH_RECORD, OPTIMIZED_GRAPH, PreparedOrtVariant
from workbench.backends.onnxruntime.profile import keep_ort_profile, with_ort_profile
from workbench.backends.onnxruntime.providers import session_providers
from workbench.backends.onnxruntime.recipes import RECIPES, VARIANTS
from workbench.backends.registry import BackendSpec, register_backend
from workbench.backends.variants import Variant
from workbench.models import LoadedModel

__all__ = ["GRAPH_RECORD", "OPTIMIZED_GRAPH", "RECIPES", "VARIANTS", "PreparedOrtVariant", "prepare_ort"]


def prepare_ort(variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False) -> PreparedOrtVariant:
    """An ONNX Runtime variant of `loaded`, built on its first call; VariantUnavailable when its execution provider
    is not available here or is not on the variant's device, MissingDependency without onnxruntime (`pip install
    'workbench[onnx]'`). `kernel_profile` (a profiled run) turns ORT's own profiler on."""
    from workbench.backends.tensorrt.deps import check_installed

    recipe = RECIPES[variant.name]
    check_installed("onnxruntime", "onnx", "onnxscript",
                    *(("onnxconverter_common",) if variant.precision == "fp16" else ()))
    import onnxruntime as ort

    providers, device = session_providers(variant, recipe, ort.get_available_providers())
    notes = {"device": device, "onnxruntime_version": ort.__version__, "execution_provider": recipe.provider,
             "graph_optimization": recipe.optimization, "quantization": recipe.quantization,
             "precision": variant.precision, "compile": "onnxruntime", "torch_threads": torch.get_num_threads(),
             "ort_profiling": kernel_profile}
    return PreparedOrtVariant(variant, loaded, recipe, providers, notes, profile=kernel_profile)


register_backend(BackendSpec("onnxruntime", VARIANTS, prepare_ort, framework_profiler="torch.profiler",
                             enrichers=(with_ort_profile,), after_profile=keep_ort_profile))
"""The ONNX Runtime backend: registered, prepared, benchmarked, profiled and bundled by the same runner as every
other variant."""
