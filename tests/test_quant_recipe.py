"""Quantization recipes (`workbench.quant.recipe`): parsing, which tensors each rule reaches, and that the emulated
model computes what the formats say, checked against direct computations with `fake_quantize` and SDPA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from workbench.backends.numerics import compare_outputs  # noqa: E402
from workbench.models.registry import load_model  # noqa: E402
from workbench.quant.formats import FormatError, fake_quantize, parse_spec  # noqa: E402
from workbench.quant.recipe import parse_recipe, quantized  # noqa: E402


@pytest.fixture(scope="module")
def gpt():
    loaded = load_model("tiny-gpt", d_model=64, layers=2, heads=4)
    (tokens,) = loaded.make_inputs(batch=2, seq=32)
    return loaded.module, tokens


def test_recipes_parse_and_the_last_rule_naming_a_tensor_wins():
    recipe = parse_recipe("linear.weight=int8/channel, blocks.1.*.weight=nvfp4,kv=fp8-e4m3/head,p=fp8-e5m2")
    assert str(recipe) == "linear.weight=int8/channel,blocks.1.*.weight=nvfp4,kv=fp8-e4m3/head,p=fp8-e5m2/tensor"
    linear, conv = torch.nn.Linear(2, 2), torch.nn.Conv2d(2, 2, 3)
    assert str(recipe.layer("blocks.0.mlp.fc_in", linear, "weight")) == "int8/channel"
    assert str(recipe.layer("blocks.1.mlp.fc_in", linear, "weight")) == "nvfp4"
    assert recipe.layer("blocks.1.mlp.fc_in", linear, "input") is None
    assert recipe.layer("features.0", conv, "weight") is None  # `linear` names Linears only
    assert str(parse_recipe("conv.weight=int8").layer("features.0", conv, "weight")) == "int8/tensor"
    assert str(recipe.attention("k")) == str(recipe.attention("v")) == "fp8-e4m3/head"
    assert recipe.attention("q") is None
    for bad, words in [("linear=int8", "names no tensor"), ("kv", "not TARGET=FORMAT"), ("", "empty recipe"),
                       ("q=fp9", "unknown format 'fp9'"), ("linear.bias=int8", "names no tensor")]:
        with pytest.raises(FormatError, match=words):
            parse_recipe(bad)


def test_weights_are_stored_in_their_formats_and_the_original_is_untouched(gpt):
    model, _ = gpt
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantized(model, "blocks.0.mlp.*.weight=int4/group32/asym,lm_head.weight=mxfp4")
    state = q.model.state_dict()
    for name, value in state.items():
        if name.startswith("blocks.0.mlp.") and name.endswith(".weight"):
            expected = fake_quantize(before[name], "int4/group32/asym")
        elif name == "lm_head.weight":
            expected = fake_quantize(before[name], "mxfp4")
        else:
            expected = before[name]
        assert torch.equal(value, expected), name
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert q.reached == {"blocks.0.mlp.*.weight=int4/group32/asym": 2, "lm_head.weight=mxfp4": 1}


def test_input_rules_round_what_the_linear_receives(gpt):
    model, tokens = gpt
    q = quantized(model, "blocks.*.mlp.fc_out.input=fp8-e4m3/token")
    seen = {}
    layer = q.model.blocks[1].mlp.fc_out
    layer.register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0]))  # runs after the rule's hook
    q(tokens)
    assert torch.equal(seen["x"], fake_quantize(seen["x"], "fp8-e4m3/token"))  # already on the format's grid
    assert q.reached["blocks.*.mlp.fc_out.input=fp8-e4m3/token"] == 2


def test_attention_operands_are_rounded_inside_sdpa():
    torch.manual_seed(0)
    q_, k_, v_ = (torch.randn(2, 4, 16, 8) for _ in range(3))
    spec = parse_spec("fp8-e4m3/head")
    model = torch.nn.Linear(1, 1)  # any model: the attention rules act on the SDPA calls made inside
    for recipe, expected in [
        ("q=fp8-e4m3/head", F.scaled_dot_product_attention(fake_quantize(q_, spec), k_, v_, is_causal=True)),
        ("kv=fp8-e4m3/head", F.scaled_dot_product_attention(q_, fake_quantize(k_, spec), fake_quantize(v_, spec),
                                                             is_causal=True)),
    ]:
        wrapped = quantized(model, recipe)
        with wrapped.attention():
            got = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        assert not wrapped.unreached()
    # p: the softmax output rounded before P·V, worked out directly
    scores = (q_ @ k_.transpose(-2, -1)) / 8 ** 0.5
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    expected = fake_quantize(torch.softmax(scores, -1), "mxfp8") @ v_
    wrapped = quantized(model, "p=mxfp8")
    with wrapped.attention():
        got = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_fewer_bits_cost_more_accuracy_on_the_model(gpt):
    model, tokens = gpt
    reference = model(tokens)
    sqnr = {}
    for fmt in ("fp8-e4m3/channel", "mxfp6", "mxfp4"):
        q = quantized(model, f"linear.weight={fmt},kv={'fp8-e4m3/head' if fmt.startswith('fp8') else fmt}")
        sqnr[fmt] = compare_outputs(reference, q(tokens)).sqnr_db
        assert not q.unreached()
    assert sqnr["fp8-e4m3/channel"] > sqnr["mxfp6"] > sqnr["mxfp4"] > 0


def test_a_rule_that_matches_nothing_is_an_error(gpt):
    model, _ = gpt
    with pytest.raises(FormatError, match=r"attn\.qkv\.weight=int8/tensor match no layer .* blocks\.0\.attn\.q_proj"):
        quantized(model, "blocks.*.attn.qkv.weight=int8")


def test_convolutions_are_scaled_as_their_implicit_gemm():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1))
    images = torch.randn(2, 4, 10, 10)
    q = quantized(model, "conv.weight=int4/channel,0.weight=int4/group36,conv.input=fp8-e4m3/token")
    first = model[0].weight
    # the [8, 4·3·3] GEMM matrix in groups of 36: one scale per output channel here
    assert torch.equal(q.model[0].weight, fake_quantize(first.reshape(8, 36), "int4/group36").reshape(first.shape))
    seen = {}
    q.model[2].register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0]))
    q(images)
    # the second conv's input: one FP8 scale per pixel's channel vector (channels-last tokens)
    pixels = seen["x"].movedim(1, -1)
    assert torch.equal(pixels, fake_quantize(pixels, "fp8-e4m3/token"))
    second = model[2].weight  # a 1×1 conv: [8, 8]
    assert torch.equal(q.model[2].weight, fake_quantize(second.reshape(8, 8), "int4/channel").reshape(second.shape))
    assert q.reached == {"conv.weight=int4/channel": 2, "0.weight=int4/group36": 1, "conv.input=fp8-e4m3/token": 2}
