"""Variants, preparation and devices: every variant runs here and stays close to fp32 eager."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import workbench.backends.quantize as quantize
from workbench.backends import (
    REFERENCE,
    Workload,
    available_devices,
    get_variant,
    list_variants,
    prepare,
    quantize_int8_dynamic,
    run_benchmark,
)
from workbench.backends import compare_outputs as compare
from workbench.backends.benchmark import WallClockTimer
from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.models import load_model

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "kv_heads": 2, "max_seq": 16}
TINY_MLP = {"in_features": 16, "hidden": 32, "num_classes": 10}

# Lowest acceptable SQNR (dB) against fp32 eager, by precision; compiled fp32 may reorder sums.
MIN_SQNR_DB = {"fp32": 60.0, "bf16": 30.0, "fp16": 40.0, "int8": 25.0, "int8-weight-only": 30.0}
CUDA_ONLY = ("fp8", "compile-reduce-overhead")

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.fixture(scope="module")
def gpt():
    return load_model("tiny-gpt", **TINY_GPT)


@pytest.fixture(scope="module")
def mlp():
    return load_model("mlp", **TINY_MLP)


def _reference(loaded, inputs):
    return prepare(get_variant(REFERENCE, batch=inputs[0].shape[0]), loaded).run(inputs)


def _assert_close_to_reference(variant, loaded, prepared, inputs):
    result = compare(_reference(loaded, inputs), prepared.run(inputs))
    assert result.sqnr_db >= MIN_SQNR_DB[variant.precision], result
    assert result.top1_agreement >= 0.9, result


def test_registry_has_the_cpu_variants_reference_first():
    names = list_variants()
    assert names[0] == REFERENCE == "eager"
    assert {"eager", "bf16", "compile", "compile-bf16", "int8", "int8-weight-only"} <= set(names)


@pytest.mark.parametrize(
    ("name", "precision", "compile_backend"),
    [
        ("eager", "fp32", None),
        ("bf16", "bf16", None),
        ("compile", "fp32", "inductor"),
        ("compile-bf16", "bf16", "inductor"),
        ("int8", "int8", "inductor"),
        ("int8-weight-only", "int8-weight-only", "inductor"),
    ],
)
def test_get_variant_fields(name, precision, compile_backend):
    variant = get_variant(name, batch=8)
    assert (variant.name, variant.backend, variant.precision, variant.compile) == (
        name, "torch", precision, compile_backend,
    )
    assert (variant.batch, variant.device) == (8, "cpu")
    assert variant.to_dict()["batch"] == 8


def test_get_variant_rejects_bad_values():
    with pytest.raises(WorkbenchError) as info:
        get_variant("fp4")
    for name in list_variants():
        assert name in str(info.value)
    with pytest.raises(WorkbenchError, match="batch"):
        get_variant("eager", batch=0)
    with pytest.raises(WorkbenchError, match="invalid device"):
        get_variant("eager", device="gpu:zero")


@no_cuda
def test_devices_here_are_cpu_only():
    assert available_devices() == ["cpu"]


@no_cuda
@pytest.mark.parametrize("name", ["eager", "compile", "int8"])
def test_cuda_variant_is_unavailable_here(mlp, name):
    with pytest.raises(VariantUnavailable, match="CUDA is not available"):
        prepare(get_variant(name, device="cuda"), mlp)


@pytest.mark.parametrize("name", [name for name in list_variants("torch") if name not in CUDA_ONLY])
def test_every_variant_runs_close_to_eager_without_compiling(gpt, name):
    # The same preparation path (copy, quantize, autocast) minus torch.compile; compiled runs
    # are covered by the slow tests below.
    variant = dataclasses.replace(get_variant(name, batch=2), compile=None)
    inputs = gpt.make_inputs(2, 8)
    prepared = prepare(variant, gpt)
    out = prepared.run(inputs)
    assert out.dtype == torch.float32
    assert out.shape == (2, 8, TINY_GPT["vocab"])
    _assert_close_to_reference(variant, gpt, prepared, inputs)
    assert prepared.notes["torch_threads"] == torch.get_num_threads()
    assert prepared.notes["autocast"] == {"bf16": "bfloat16", "fp16": "float16"}.get(variant.precision)


def test_eager_matches_the_module_exactly(gpt):
    inputs = gpt.make_inputs(2, 8)
    with torch.inference_mode():
        expected = gpt.module(*inputs)
    assert torch.equal(prepare(get_variant("eager", batch=2), gpt).run(inputs), expected)


def test_prepare_leaves_the_loaded_model_untouched(mlp):
    before = {k: v.clone() for k, v in mlp.module.state_dict().items()}
    prepare(dataclasses.replace(get_variant("int8"), compile=None), mlp)
    after = mlp.module.state_dict()
    assert before.keys() == after.keys()
    assert all(type(after[k]) is torch.Tensor and torch.equal(before[k], after[k]) for k in before)


def test_int8_records_the_torchao_path(mlp):
    prepared = prepare(dataclasses.replace(get_variant("int8"), compile=None), mlp)
    assert prepared.notes["quantization"] == "torchao.quantize_(Int8DynamicActivationInt8WeightConfig)"


def test_int8_falls_back_to_torch_ao_without_torchao(mlp, monkeypatch):
    monkeypatch.setattr(quantize, "torchao_available", lambda: False)
    variant = dataclasses.replace(get_variant("int8", batch=3), compile=None)
    prepared = prepare(variant, mlp)
    assert prepared.notes["quantization"] == "torch.ao.quantize_dynamic(qint8 Linear)"
    _assert_close_to_reference(variant, mlp, prepared, mlp.make_inputs(3))
    with pytest.raises(VariantUnavailable, match="needs torchao"):
        prepare(get_variant("int8-weight-only"), mlp)


def test_quantize_dynamic_fallback_replaces_every_linear():
    fresh = load_model("mlp", **TINY_MLP).module
    module, path = quantize_int8_dynamic(fresh, torch.device("cpu"), use_torchao=False)
    assert path.startswith("torch.ao.quantize_dynamic")
    assert not any(type(m) is nn.Linear for m in module.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in module.modules()) == 4


def test_first_call_is_timed_and_noted(mlp):
    prepared = prepare(get_variant("eager"), mlp)
    seconds = prepared.first_call(mlp.make_inputs(1))
    assert seconds > 0
    assert prepared.notes["first_call_s"] == seconds


def test_unknown_backend_is_unavailable(mlp):
    with pytest.raises(VariantUnavailable, match="backend 'openvino'"):
        prepare(dataclasses.replace(get_variant("eager"), backend="openvino"), mlp)



def test_compiler_failure_is_reported_as_unavailable(mlp):
    from torch._dynamo import register_backend

    @register_backend(name="wb_test_broken_compiler")
    def broken(graph_module, example_inputs):
        raise RuntimeError("no C++ compiler found")

    prepared = prepare(dataclasses.replace(get_variant("eager"), compile="wb_test_broken_compiler"), mlp)
    with pytest.raises(VariantUnavailable, match=r"RuntimeError: no C\+\+ compiler found"):
        prepared.first_call(mlp.make_inputs(1))


def test_prepared_variants_drive_the_benchmark(gpt):
    inputs = gpt.make_inputs(2, 4)
    workloads = {}
    for name in ("eager", "bf16"):
        prepared = prepare(get_variant(name, batch=2), gpt)
        placed = prepared.place(inputs)
        workloads[name] = Workload(
            fn=lambda p=prepared, x=placed: p.run(x), items=gpt.items(2, 4), tokens=gpt.tokens(2, 4)
        )
    stats = run_benchmark(workloads, warmup=1, iterations=3)
    assert stats.keys() == {"eager", "bf16"}
    assert all(s.iterations == 3 and s.tokens_per_s == pytest.approx(8 * 1e3 / s.p50) for s in stats.values())


# --- compiled variants: a few tiny compilations -----------------------------------------------


@pytest.mark.slow
def test_compile_with_kernel_profile_names_fused_kernels(mlp):
    inputs = mlp.make_inputs(2)
    variant = get_variant("compile", batch=2)
    prepared = prepare(variant, mlp, kernel_profile=True)
    assert prepared.first_call(inputs) > 0
    assert prepared.notes["kernel_profile"] is True
    _assert_close_to_reference(variant, mlp, prepared, inputs)
    with torch.profiler.profile() as prof:
        prepared.run(inputs)
    assert any("cpp_fused" in event.name for event in prof.events())
    assert torch._inductor.config.cpp.enable_kernel_profile is False  # set per compilation only


@pytest.mark.slow
@pytest.mark.parametrize("name", ["compile-bf16", "int8"])
def test_compiled_low_precision_variants(mlp, name):
    inputs = mlp.make_inputs(2)
    variant = get_variant(name, batch=2)
    prepared = prepare(variant, mlp)
    prepared.first_call(inputs)
    _assert_close_to_reference(variant, mlp, prepared, inputs)


@no_cuda
@pytest.mark.parametrize("name, reason", [
    ("fp8", "compute capability >= 8.9"),
    ("compile-reduce-overhead", "CUDA graphs"),
])
def test_cuda_only_variants_say_why_on_cpu(mlp, name, reason):
    with pytest.raises(VariantUnavailable, match=reason):
        prepare(get_variant(name), mlp)


def test_fp16_autocast_and_compile_modes_are_recorded(mlp):
    fp16 = prepare(get_variant("fp16", batch=2), mlp)
    assert fp16.notes["autocast"] == "float16"
    _assert_close_to_reference(get_variant("fp16"), mlp, fp16, mlp.make_inputs(2))
    autotune = prepare(dataclasses.replace(get_variant("compile-max-autotune"), compile=None), mlp)
    assert autotune.notes["compile_mode"] == "max-autotune"
    assert isinstance(fp16.timer(), WallClockTimer)


@no_cuda
def test_tensorrt_variants_say_what_is_missing(mlp):
    assert {"trt-fp16", "trt-bf16", "trt-int8", "trt-fp8"} <= set(list_variants("tensorrt"))
    with pytest.raises(VariantUnavailable, match="TensorRT not installed: pip install tensorrt-cu1"):
        prepare(get_variant("trt-fp16"), mlp)
