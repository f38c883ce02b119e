"""The ONNX Runtime backend: its variants on mlp (one profiled experiment shared by the module), numerics against
the torch reference, ORT's own profile merged into each run's trace, and the unavailable GPU providers."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from workbench.backends import get_backend, get_variant, list_variants, prepare
from workbench.backends.onnxruntime import GRAPH_RECORD, OPTIMIZED_GRAPH
from workbench.errors import VariantUnavailable
from workbench.experiment import ExperimentSettings, run_experiment
from workbench.models import load_model
from workbench.profiling import ProfileSettings
from workbench.trace.store.bundle import open_bundle

ort = pytest.importorskip("onnxruntime")

CPU_VARIANTS = ("ort", "ort-extended", "ort-basic", "ort-noopt", "ort-int8", "ort-int8-static", "ort-fp16")
GPU_VARIANTS = {"ort-cuda": "CUDAExecutionProvider", "ort-trt": "TensorrtExecutionProvider"}
MIN_SQNR_DB = {"fp32": 60, "fp16": 35, "int8": 15}
"""Least agreement with the fp32 torch reference per precision (mlp, seeded weights)."""
STEPS = 2


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    settings = ExperimentSettings(model="mlp", variants=("eager", *CPU_VARIANTS, *GPU_VARIANTS), batch=2, warmup=1,
                                  iterations=3, threads=1,
                                  model_overrides={"in_features": 16, "hidden": 32, "num_classes": 10},
                                  profile_settings=ProfileSettings(warmup_steps=0, active_steps=STEPS))
    result = run_experiment(settings, root)
    return root, {run.variant: run for run in result.runs}


def test_the_backend_registers_its_variants():
    assert list_variants("onnxruntime") == [*CPU_VARIANTS, *GPU_VARIANTS]
    spec = get_backend("onnxruntime")
    assert spec.framework_profiler == "torch.profiler" and spec.after_profile is not None and spec.enrichers
    assert get_variant("ort-int8-static").precision == "int8" and get_variant("ort-fp16").precision == "fp16"
    assert not get_variant("ort-noopt").fusion and get_variant("ort").fusion


def test_ort_runs_only_on_the_cpu():
    with pytest.raises(VariantUnavailable, match="CPU execution provider"):
        prepare(get_variant("ort", device="cuda"), load_model("mlp", hidden=16))


def test_every_cpu_variant_runs_with_numerics_against_torch(experiment):
    root, runs = experiment
    for name in CPU_VARIANTS:
        run = runs[name]
        assert run.status == "ok", f"{name}: {run.error}"
        assert run.p50_ms > 0 and run.first_call_s > 0
        record = open_bundle(run.run_id, root).record
        assert record.reference == "eager"
        assert run.numerics["sqnr_db"] > MIN_SQNR_DB[record.variant["precision"]], (name, run.numerics)
        assert record.notes["graph_optimization"] == {"ort-extended": "extended", "ort-basic": "basic",
                                                      "ort-noopt": "disabled"}.get(name, "all")


def test_quantized_and_fp16_variants_transform_the_graph(experiment):
    root, runs = experiment
    static = open_bundle(runs["ort-int8-static"].run_id, root)
    assert static.record.notes["calibration"] == "8 batches of 2 generated inputs"
    graphs = {name: json.loads((open_bundle(runs[name].run_id, root).path / "compile" / GRAPH_RECORD).read_text())
              for name in ("ort", "ort-int8", "ort-int8-static", "ort-fp16")}
    ops = {name: {op["op_type"] for op in graph["ops"] if op["original"]} for name, graph in graphs.items()}
    assert graphs["ort-int8-static"]["graph"] == "int8 static QDQ" and "QuantizeLinear" in ops["ort-int8-static"]
    assert graphs["ort-int8"]["graph"] == "int8 dynamic" and "DynamicQuantizeLinear" in ops["ort-int8"]
    assert graphs["ort-fp16"]["graph"] == "fp16" and "Cast" in ops["ort-fp16"]
    assert "QuantizeLinear" not in ops["ort"] and "Cast" not in ops["ort"]
    text = (static.path / "compile" / OPTIMIZED_GRAPH).read_text()
    assert text.startswith("nodes: ") and "QuantizeLinear:" in text


def test_gpu_providers_are_unavailable_here_with_the_reason(experiment):
    _, runs = experiment
    for name, provider in GPU_VARIANTS.items():
        if provider in ort.get_available_providers():
            pytest.skip(f"{provider} is available here: see test_gpu_provider_runs")
        assert runs[name].status == "failed"
        assert f"onnxruntime has no {provider} here" in runs[name].error
        assert "onnxruntime-gpu" in runs[name].error


@pytest.mark.parametrize("name", list(GPU_VARIANTS))
def test_gpu_provider_runs(name, tmp_path):
    import torch

    if GPU_VARIANTS[name] not in ort.get_available_providers() or not torch.cuda.is_available():
        pytest.skip(f"{GPU_VARIANTS[name]} or a CUDA device is not available here (onnxruntime-gpu on an NVIDIA GPU)")
    settings = ExperimentSettings(model="mlp", variants=(name,), batch=2, warmup=1, iterations=3, device="cuda",
                                  model_overrides={"in_features": 16, "hidden": 32, "num_classes": 10}, profile=False)
    (run,) = run_experiment(settings, tmp_path).runs
    assert run.status == "ok", run.error
    assert run.numerics["sqnr_db"] > MIN_SQNR_DB["fp16"]


def test_a_profiled_run_merges_ort_profile_into_its_trace(experiment):
    root, runs = experiment
    bundle = open_bundle(runs["ort"].run_id, root)
    raw = json.loads((bundle.path / "raw" / "ort.ort_profile.json").read_text())
    nodes = [e for e in raw if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    expected = Counter((e["name"].removesuffix("_kernel_time"), e["args"]["op_name"]) for e in nodes)
    model_runs = sum(e["name"] == "model_run" for e in raw)
    assert model_runs == 1 + STEPS  # the compile phase's first call, then the measured steps

    trace = bundle.trace()
    events = trace.df()
    kernels = events[events["kind"] == "kernel"]
    ops = [json.loads(a)["op_name"] for a in kernels["args"]]
    assert Counter(zip(kernels["name"].astype(str), ops, strict=True)) == expected
    assert set(kernels["track"].astype(str)) == {"cpu/onnxruntime CPUExecutionProvider"}
    assert {"Gemm", "Erf"} <= set(ops)
    assert (events["name"] == "model_run").sum() == model_runs
    assert {"load", "compile", "measure", "step 0", "step 1"} <= set(events["name"].astype(str))
    # on the run's clock: every measured step holds one model_run and its kernels
    for n in range(STEPS):
        step = events[events["name"] == f"step {n}"].iloc[0]
        inside = events[(events["start_ns"] >= step["start_ns"])
                        & (events["start_ns"] + events["dur_ns"] <= step["start_ns"] + step["dur_ns"])]
        assert (inside["name"] == "model_run").sum() == 1
        assert (inside["kind"] == "kernel").sum() == len(nodes) // model_runs
    assert bundle.record.capture["notes"]["ort_profile"]["file"] == "ort.ort_profile.json"


def test_the_fusion_table_counts_ort_nodes_per_step(experiment):
    import workbench as wb

    root, runs = experiment
    table = wb.fusion([runs[name].run_id for name in ("eager", "ort", "ort-int8")], root=root).set_index("variant")
    assert table.loc["ort", "framework"] == "onnxruntime" and table.loc["eager", "framework"] == "torch"
    graph = json.loads((open_bundle(runs["ort"].run_id, root).path / "compile" / GRAPH_RECORD).read_text())
    assert table.loc["ort", "kernels"] == graph["nodes"]["optimized"]  # one kernel per node per step
    assert table.loc["ort", "steps"] == STEPS
    detail = wb.fusion_detail(runs["ort-int8"].run_id, root=root)
    assert list(detail.columns) == ["op_type", "domain", "original", "optimized", "change", "fused"]
    assert detail["optimized"].sum() == graph_nodes(root, runs["ort-int8"].run_id)


def graph_nodes(root, run_id):
    graph = json.loads((open_bundle(run_id, root).path / "compile" / GRAPH_RECORD).read_text())
    return graph["nodes"]["optimized"]
