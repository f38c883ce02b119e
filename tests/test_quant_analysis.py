"""Sensitivity, outliers, SmoothQuant, cost and mixed-precision plans of `workbench.quant`, on tiny-gpt and on
hand-built layers whose figures are worked out directly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from workbench.backends.numerics import compare_outputs  # noqa: E402
from workbench.hardware.specs import device_spec  # noqa: E402
from workbench.quant.cost import kv_cache_bytes, measured_kv_bytes, projected_time, weight_footprint  # noqa: E402
from workbench.quant.formats import fake_quantize, parse_spec, storage_bytes  # noqa: E402
from workbench.quant.layers import layer_work  # noqa: E402
from workbench.quant.outliers import activation_outliers, smoothing, smoothing_scales  # noqa: E402
from workbench.quant.plan import mixed_precision_plan  # noqa: E402
from workbench.quant.recipe import quantized  # noqa: E402
from workbench.quant.sensitivity import kl_divergence, layer_sensitivity, tensor_sensitivity  # noqa: E402


@pytest.fixture(scope="module")
def gpt():
    from workbench.models.registry import load_model

    loaded = load_model("tiny-gpt", d_model=64, layers=2, heads=4, kv_heads=2)
    (tokens,) = loaded.make_inputs(batch=2, seq=32)
    return loaded.module, tokens


def test_layer_sensitivity_measures_each_layer_alone(gpt):
    model, tokens = gpt
    before = {k: v.clone() for k, v in model.state_dict().items()}
    table = layer_sensitivity(model, (tokens,), ["int4/group32", "fp8-e4m3/channel"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # every layer restored
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert len(table) == 2 * len(names) and set(table["layer"]) == set(names)
    row = table[(table["layer"] == "blocks.1.mlp.fc_in") & (table["format"] == "int4/group32")].iloc[0]
    reference = model(tokens)
    expected = quantized(model, "blocks.1.mlp.fc_in.weight=int4/group32")(tokens)
    assert row["sqnr_db"] == pytest.approx(compare_outputs(reference, expected).sqnr_db)
    assert row["kl"] == pytest.approx(kl_divergence(reference, expected))
    for _, rows in table.groupby("format"):
        assert sorted(rows["rank"]) == list(range(1, len(names) + 1))
        assert rows.sort_values("rank")["sqnr_db"].is_monotonic_increasing
    # 4 bits hurt more than 8 on every layer
    pivot = table.pivot(index="layer", columns="format", values="sqnr_db")
    assert (pivot["fp8-e4m3/channel"] > pivot["int4/group32"]).all()


def test_kl_is_zero_for_equal_logits_and_known_for_two_classes():
    logits = torch.tensor([[0.0, 0.0]])
    assert kl_divergence(logits, logits) == 0
    # KL([.5,.5] || [p, 1-p]) with p = sigmoid(1)
    p = torch.sigmoid(torch.tensor(1.0)).item()
    expected = 0.5 * torch.log(torch.tensor(0.5 / p)) + 0.5 * torch.log(torch.tensor(0.5 / (1 - p)))
    assert kl_divergence(logits, torch.tensor([[1.0, 0.0]])) == pytest.approx(expected.item())


def test_tensor_kinds_cover_weights_inputs_kv_and_attention(gpt):
    model, tokens = gpt
    table = tensor_sensitivity(model, (tokens,), ["fp8-e4m3/token", "mxfp4"]).set_index(["tensor", "format"])
    assert (table["reached"] > 0).all()
    assert table.loc[("kv", "fp8-e4m3/token"), "sqnr_db"] > table.loc[("kv", "mxfp4"), "sqnr_db"]


def test_outliers_and_smoothquant_on_a_layer_with_a_hot_channel():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=False)
    model = nn.Sequential(layer)
    x = torch.randn(512, 64)
    x[:, 5] *= 100  # one hot input channel
    table = activation_outliers(model, (x,))
    row = table.iloc[0]
    absmax = x.abs().amax(0)
    assert row["ratio"] == pytest.approx(float(absmax.max() / absmax.median()))
    assert row["top_channels"][0] == 5
    scales = smoothing_scales(absmax, layer.weight)
    w_absmax = layer.weight.abs().amax(0)
    assert torch.allclose(scales, (absmax.sqrt() / w_absmax.sqrt()))
    smooth = smoothing(model, (x,)).iloc[0]
    assert smooth["ratio_after"] < smooth["ratio_before"] / 5
    assert smooth["gain_db"] > 3  # migration gives INT8 per tensor its bits back
    exact = x @ layer.weight.T
    before = fake_quantize(x, "int8/tensor") @ fake_quantize(layer.weight.detach(), "int8/channel").T
    assert smooth["sqnr_before_db"] == pytest.approx(compare_outputs(exact, before).sqnr_db, rel=1e-5)


@pytest.mark.parametrize("fmt", ["bf16", "fp8-e4m3/token", "int8/head", "int4/group8/asym", "mxfp6", "nvfp4",
                                 "fp8-e5m2/block8"])
def test_kv_cache_bytes_equal_the_stored_k_and_v(gpt, fmt):
    model, tokens = gpt
    predicted = kv_cache_bytes(model, fmt, batch=tokens.shape[0], context=tokens.shape[1])
    assert predicted == measured_kv_bytes(model, (tokens,), fmt)
    if fmt == "bf16":  # 2 layers × K and V × batch 2 × 2 kv heads × 32 tokens × 16 dims × 2 bytes
        assert predicted == 2 * 2 * 2 * 2 * 32 * 16 * 2


def test_weight_footprint_and_projected_time(gpt):
    model, _ = gpt
    footprint = weight_footprint(model, "linear.weight=nvfp4").set_index("tensor")
    fc = model.blocks[0].mlp.fc_in.weight
    assert footprint.loc["blocks.0.mlp.fc_in.weight", "bytes"] == storage_bytes(parse_spec("nvfp4"), tuple(fc.shape))
    assert footprint.loc["tok_emb.weight", "format"] == "bf16"
    assert footprint["params"].sum() == sum(p.numel() for p in model.parameters())
    b200, h100 = device_spec("b200"), device_spec("h100")
    tokens = torch.zeros(8, 512, dtype=torch.long)  # 4096 rows into every Linear
    work = layer_work(model, (tokens,))
    fp4 = projected_time(model, "linear.weight=nvfp4,linear.input=nvfp4", b200, work).set_index("layer")
    row = fp4.loc["blocks.0.mlp.fc_in"]
    assert row["compute_dtype"] == "fp4" and row["flops"] == 2 * 4096 * fc.shape[1] * fc.shape[0]
    assert row["bytes"] == (storage_bytes(parse_spec("nvfp4"), tuple(fc.shape))
                            + storage_bytes(parse_spec("nvfp4"), (4096, fc.shape[1])) + 2 * 4096 * fc.shape[0])
    assert row["compute_s"] == pytest.approx(row["flops"] / b200.peak_flops["fp4"])
    assert row["time_s"] == max(row["compute_s"], row["memory_s"])
    on_h100 = projected_time(model, "linear.weight=nvfp4,linear.input=nvfp4", h100, work)
    assert (on_h100["compute_dtype"] == "bf16").all() and on_h100["note"].str.contains("no fp4 units").all()
    weight_only = projected_time(model, "linear.weight=int4/group32", b200, work)
    assert (weight_only["compute_dtype"] == "bf16").all()


def test_a_plan_keeps_the_fewest_sensitive_layers_that_meet_the_budget(gpt):
    model, tokens = gpt
    sensitivity = layer_sensitivity(model, (tokens,), ["int4/group32"])
    everything = quantized(model, "linear.weight=int4/group32")(tokens)
    floor = compare_outputs(model(tokens), everything).sqnr_db + 3  # 3 dB better than all in int4
    plan = mixed_precision_plan(model, (tokens,), "int4/group32", min_sqnr_db=floor, sensitivity=sensitivity)
    assert plan.met and plan.sqnr_db >= floor and plan.kept
    most_sensitive = sensitivity.sort_values("sqnr_db")["layer"].tolist()
    assert list(plan.kept) == most_sensitive[:len(plan.kept)]
    assert plan.steps["met"].tolist() == [False] * len(plan.kept) + [True]
    assert plan.steps["weight_bytes"].is_monotonic_increasing
    all_bf16 = int(weight_footprint(model, None)["bytes"].sum())
    assert plan.weight_bytes < all_bf16
