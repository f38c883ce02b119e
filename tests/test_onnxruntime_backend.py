"""The ONNX Runtime backend, a backend added as one module: registered, prepared, benchmarked, profiled and
bundled by the same runner as every other variant."""

from __future__ import annotations

import pytest

from workbench.backends import get_backend, get_variant, list_variants, prepare
from workbench.backends.onnxruntime_backend import OPTIMIZED_GRAPH
from workbench.errors import VariantUnavailable
from workbench.experiment import ExperimentSettings, run_experiment
from workbench.models import load_model
from workbench.profiling import ProfileSettings
from workbench.trace.bundle import open_bundle

pytest.importorskip("onnxruntime")


def test_the_backend_registers_its_variant():
    assert list_variants("onnxruntime") == ["ort"]
    assert get_backend("onnxruntime").framework_profiler == "torch.profiler"
    assert get_variant("ort").backend == "onnxruntime"


def test_ort_runs_only_on_the_cpu():
    with pytest.raises(VariantUnavailable, match="CPU execution provider"):
        prepare(get_variant("ort", device="cuda"), load_model("mlp", hidden=16))


def test_an_experiment_with_ort_writes_its_bundle_with_numerics_and_the_optimized_graph(tmp_path):
    settings = ExperimentSettings(model="mlp", variants=("eager", "ort"), batch=2, warmup=1, iterations=3,
                                  model_overrides={"hidden": 16}, threads=1,
                                  profile_settings=ProfileSettings(warmup_steps=0, active_steps=1))
    eager, ort = run_experiment(settings, tmp_path).runs
    assert eager.status == ort.status == "ok", ort.error
    assert ort.numerics["sqnr_db"] > 60 and ort.p50_ms > 0
    bundle = open_bundle(ort.run_id, tmp_path)
    assert bundle.record.variant_backend == "onnxruntime"
    assert bundle.record.notes["onnx"]["opset"] == 19
    text = (bundle.path / "compile" / OPTIMIZED_GRAPH).read_text()
    assert text.startswith("nodes: ") and "Gemm:" in text
    names = set(bundle.trace().df()["name"].astype(str))
    assert {"load", "compile", "measure", "step 0"} <= names
