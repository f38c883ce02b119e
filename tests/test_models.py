"""The model zoo: seeded built-ins, example inputs, user factories and exported programs."""

from __future__ import annotations

import textwrap
import uuid

import pytest
import torch

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models import count_parameters, describe_model, list_models, load_model

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16}
TINY_MLP = {"in_features": 16, "hidden": 32, "num_classes": 10}
TINY_CONV = {"width": 4, "stages": 2, "num_classes": 10, "image_size": 16}
TINY = {"tiny-gpt": TINY_GPT, "mlp": TINY_MLP, "convnet": TINY_CONV}


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_list_models_names_the_builtins():
    assert list_models() == ["convnet", "mlp", "tiny-gpt"]


@pytest.mark.parametrize("name", sorted(TINY))
def test_builtin_weights_are_bit_identical_and_leave_global_rng_alone(name):
    before = torch.random.get_rng_state()
    first = load_model(name, **TINY[name])
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(1234)  # whatever the global RNG does must not matter
    second = load_model(name, **TINY[name])
    _assert_same_weights(first.module, second.module)
    other_seed = load_model(name, **TINY[name], seed=1)
    assert any(
        not torch.equal(p, q)
        for p, q in zip(first.module.parameters(), other_seed.module.parameters(), strict=True)
    )


@pytest.mark.parametrize("name", sorted(TINY))
def test_builtin_is_fp32_cpu_eval(name):
    loaded = load_model(name, **TINY[name])
    assert loaded.source == "builtin"
    assert not any(m.training for m in loaded.module.modules())
    for tensor in loaded.module.state_dict().values():
        assert tensor.device.type == "cpu"
        assert not tensor.is_floating_point() or tensor.dtype == torch.float32


@pytest.mark.parametrize(("kv_heads", "expected_kv"), [(None, 4), (2, 2), (1, 1)], ids=["mha", "gqa", "mqa"])
def test_tiny_gpt_attention_kinds(kv_heads, expected_kv):
    loaded = load_model("tiny-gpt", **TINY_GPT, kv_heads=kv_heads)
    attn = loaded.module.blocks[0].attn
    head_dim = TINY_GPT["d_model"] // TINY_GPT["heads"]
    assert attn.q_proj.out_features == TINY_GPT["d_model"]
    assert attn.k_proj.out_features == expected_kv * head_dim
    assert attn.v_proj.out_features == expected_kv * head_dim
    (tokens,) = loaded.make_inputs(3, 7)
    logits = loaded.module(tokens)
    assert logits.shape == (3, 7, TINY_GPT["vocab"])
    assert torch.isfinite(logits).all()


def test_tiny_gpt_weights_are_reachable_by_name():
    state = load_model("tiny-gpt", **TINY_GPT).module.state_dict()
    for key in (
        "tok_emb.weight",
        "pos_emb.weight",
        "blocks.0.ln1.weight",
        "blocks.0.attn.q_proj.weight",
        "blocks.0.attn.k_proj.bias",
        "blocks.0.attn.o_proj.weight",
        "blocks.0.mlp.fc_in.weight",
        "blocks.0.mlp.fc_out.bias",
        "ln_f.bias",
        "lm_head.weight",
    ):
        assert key in state


def test_tiny_gpt_is_causal():
    module = load_model("tiny-gpt", **TINY_GPT).module
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
    changed = tokens.clone()
    changed[0, 4] = 9
    with torch.inference_mode():
        a, b = module(tokens), module(changed)
    assert torch.equal(a[:, :4], b[:, :4])
    assert not torch.equal(a[:, 4:], b[:, 4:])


def test_gqa_query_heads_share_kv_heads_in_groups():
    from workbench.models.tiny_gpt import expand_kv

    kv = torch.arange(2.0).view(1, 2, 1, 1)  # kv head i holds the value i
    assert expand_kv(kv, 3).flatten().tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"heads": 4, "kv_heads": 3}, "not divisible by kv_heads"),
        ({"d_model": 30, "heads": 4}, "not divisible by heads"),
        ({"layers": 0}, "layers must be an integer >= 1"),
        ({"kv_heads": True}, "kv_heads must be an integer"),
        ({"depth": 3}, "valid: vocab, layers"),
    ],
)
def test_tiny_gpt_rejects_bad_config(overrides, message):
    with pytest.raises(WorkbenchError, match=message):
        load_model("tiny-gpt", **{**TINY_GPT, **overrides})


def test_tiny_gpt_inputs_and_counts():
    loaded = load_model("tiny-gpt", **TINY_GPT)
    (tokens,) = loaded.make_inputs(2, 5)
    assert tokens.shape == (2, 5)
    assert tokens.dtype == torch.int64
    assert tokens.min() >= 0 and tokens.max() < TINY_GPT["vocab"]
    assert torch.equal(tokens, loaded.make_inputs(2, 5)[0])
    assert loaded.items(2, 5) == 2
    assert loaded.tokens(2, 5) == 10
    # No seq given: the default, capped at max_seq.
    assert loaded.default_seq == 16
    assert loaded.make_inputs(3)[0].shape == (3, 16)
    assert loaded.tokens(3) == 48
    assert load_model("tiny-gpt").make_inputs(1)[0].shape == (1, 128)


def test_tiny_gpt_rejects_seq_beyond_max_seq():
    with pytest.raises(WorkbenchError, match="max_seq"):
        load_model("tiny-gpt", **TINY_GPT).make_inputs(1, 17)


@pytest.mark.parametrize("batch", [0, -1, True])
def test_make_inputs_rejects_bad_batch(batch):
    with pytest.raises(WorkbenchError, match="batch"):
        load_model("mlp", **TINY_MLP).make_inputs(batch)


def test_default_mlp_and_convnet_input_shapes_and_counts():
    mlp = load_model("mlp")
    assert mlp.make_inputs(3)[0].shape == (3, 512)
    assert mlp.module(*mlp.make_inputs(3)).shape == (3, 1000)
    convnet = load_model("convnet")
    assert convnet.make_inputs(2)[0].shape == (2, 3, 64, 64)
    assert convnet.module(*convnet.make_inputs(2)).shape == (2, 1000)
    for loaded in (mlp, convnet):
        assert loaded.default_seq is None
        assert loaded.items(4) == 4
        assert loaded.tokens(4) is None


def test_models_without_sequence_axis_reject_seq():
    with pytest.raises(WorkbenchError, match="no sequence axis"):
        load_model("mlp", **TINY_MLP).make_inputs(2, 8)


def test_convnet_batchnorm_uses_running_stats():
    loaded = load_model("convnet", **TINY_CONV)
    (images,) = loaded.make_inputs(4)
    with torch.inference_mode():
        together = loaded.module(images)
        alone = loaded.module(images[:1])
    torch.testing.assert_close(together[:1], alone)  # no batch statistics leak between samples


def test_mlp_parameter_count():
    loaded = load_model("mlp", **TINY_MLP)
    expected = (16 * 32 + 32) + (32 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10)
    assert count_parameters(loaded.module) == expected == loaded.parameter_count


def test_describe_model_returns_a_copy_of_the_defaults():
    config = describe_model("tiny-gpt")
    assert config["vocab"] == 1024 and config["kv_heads"] is None
    config["vocab"] = 1
    assert describe_model("tiny-gpt")["vocab"] == 1024
    with pytest.raises(UnknownModelError, match="tiny-gpt"):
        describe_model("gpt-5")


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UnknownModelError) as info:
        load_model("resnet50")
    message = str(info.value)
    assert "resnet50" in message
    for name in list_models():
        assert name in message


# --- user factories ---------------------------------------------------------------------------

FACTORY_SOURCE = """
import torch


class Scale(torch.nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((3,), float(factor)))

    def forward(self, x, y):
        return x * self.weight + y


def make(factor=2):
    rows = torch.arange(6.0).view(2, 3)
    return Scale(factor).train(), (rows, rows + 100)


def scalar_inputs():
    return Scale(1), (torch.tensor(1.0), torch.tensor(2.0))


def wrong_return():
    return "not a model"


def broken():
    raise RuntimeError("boom")


not_callable = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Name of a fresh importable module holding FACTORY_SOURCE."""
    name = f"wb_user_model_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_factory_ref_loads_module_and_inputs(user_module):
    loaded = load_model(f"{user_module}:make", factor=3)
    assert loaded.source == "factory"
    assert loaded.name == f"{user_module}:make"
    assert loaded.config == {"factor": 3}
    assert not loaded.module.training
    x, y = loaded.make_inputs(2)
    assert torch.equal(x, torch.arange(6.0).view(2, 3))
    assert torch.equal(loaded.module(x, y), x * 3 + y)
    assert loaded.items(2) == 2 and loaded.tokens(2) is None


def test_factory_inputs_are_sliced_or_tiled_along_dim0(user_module):
    loaded = load_model(f"{user_module}:make")
    x, _ = loaded.make_inputs(2)
    (one, one_y) = loaded.make_inputs(1)
    assert torch.equal(one, x[:1]) and one_y.shape == (1, 3)
    five, _ = loaded.make_inputs(5)
    assert torch.equal(five, torch.cat([x, x, x])[:5])


def test_factory_inputs_without_batch_dim_serve_batch_one_only(user_module):
    loaded = load_model(f"{user_module}:scalar_inputs")
    assert [t.item() for t in loaded.make_inputs(1)] == [1.0, 2.0]
    with pytest.raises(WorkbenchError, match="cannot make inputs for batch 4"):
        loaded.make_inputs(4)


@pytest.mark.parametrize(
    ("attr", "error", "message"),
    [
        ("missing", UnknownModelError, "has no attribute 'missing'"),
        ("not_callable", UnknownModelError, "not callable"),
        ("wrong_return", WorkbenchError, "must return"),
        ("broken", WorkbenchError, "factory raised RuntimeError: boom"),
    ],
)
def test_bad_factories_name_the_ref(user_module, attr, error, message):
    ref = f"{user_module}:{attr}"
    with pytest.raises(error, match=message) as info:
        load_model(ref)
    assert ref in str(info.value)


def test_factory_in_missing_module_is_unknown():
    with pytest.raises(UnknownModelError, match=r"cannot import module 'no_such_pkg\.models'"):
        load_model("no_such_pkg.models:build")


# --- exported programs ------------------------------------------------------------------------


def _export(tmp_path, dynamic: bool):
    loaded = load_model("mlp", **TINY_MLP)
    (x,) = loaded.make_inputs(2)
    shapes = ({0: torch.export.Dim("batch")},) if dynamic else None
    program = torch.export.export(loaded.module, (x,), dynamic_shapes=shapes)
    path = tmp_path / ("dynamic.pt2" if dynamic else "static.pt2")
    torch.export.save(program, path)
    return loaded, x, path


def test_exported_program_ref(tmp_path):
    original, x, path = _export(tmp_path, dynamic=True)
    loaded = load_model(str(path))
    assert loaded.source == "export"
    (inputs,) = loaded.make_inputs(2)
    assert torch.equal(inputs, x)
    torch.testing.assert_close(loaded.module(inputs), original.module(x))
    (three,) = loaded.make_inputs(3)
    assert loaded.module(three).shape == (3, TINY_MLP["num_classes"])


def test_static_exported_program_refuses_other_batches(tmp_path):
    _, _, path = _export(tmp_path, dynamic=False)
    loaded = load_model(str(path))
    assert loaded.make_inputs(2)[0].shape[0] == 2
    with pytest.raises(WorkbenchError, match="static batch of 2"):
        loaded.make_inputs(4)


def test_exported_program_refs_that_cannot_load(tmp_path):
    with pytest.raises(UnknownModelError, match="no such exported program"):
        load_model(str(tmp_path / "missing.pt2"))
    garbage = tmp_path / "garbage.pt2"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(UnknownModelError, match=r"not a loadable torch\.export program"):
        load_model(str(garbage))
    _, _, path = _export(tmp_path, dynamic=True)
    with pytest.raises(WorkbenchError, match="takes no config overrides"):
        load_model(str(path), layers=3)
