"""Hugging Face model sources: hf-config: presets (real architectures, seeded weights) and hf: local checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import EXIT_BAD_INPUT, UnknownModelError, WorkbenchError
from workbench.models import hf_presets, load_model
from workbench.models import memory as memory_module
from workbench.models.hf import HFModule
from workbench.models.registry import model_source
from workbench.server.model_policy import ModelPolicy, ModelRefused
from workbench.trace.schema import LIFECYCLE_PHASES
from workbench.trace.store.bundle import open_bundle

transformers = pytest.importorskip("transformers")

REDUCED = {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 128}
"""Friendly keys every preset takes, scaled down; vocab and per-architecture sizes are added below."""
EXTRA = {
    "vit-base": {"image_size": 32, "patch_size": 8, "labels": 10},
    "whisper-tiny": {"vocab": 256, "source_positions": 16, "mel_bins": 16},
}
GiB = 2**30


def reduced(name: str) -> dict[str, int]:
    return {**REDUCED, **EXTRA.get(name, {"vocab": 256})}


def test_presets_cover_the_architectures_of_the_issue():
    names = hf_presets.preset_names()
    assert names == sorted(names)
    assert {"llama-3-8b", "qwen2-7b", "qwen3-8b", "mistral-7b", "gemma-2b", "deepseek-v2-lite", "deepseek-v3",
            "gpt2", "bert-base", "vit-base", "whisper-tiny"} <= set(names)


# The published parameter counts of each model (its model card / checkpoint), without MTP heads for V3.
PUBLISHED = {"gpt2": 124_439_808, "bert-base": 109_514_298, "vit-base": 86_567_656, "whisper-tiny": 37_760_640,
             "llama-3-8b": 8_030_261_248, "qwen2-7b": 7_615_616_512, "qwen3-8b": 8_190_735_360,
             "mistral-7b": 7_241_732_096, "gemma-2b": 2_506_172_416, "deepseek-v2-lite": 15_706_484_224,
             "deepseek-v3": 671_026_404_352}


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if name == "deepseek-v3" else [])
                                  for name in sorted(PUBLISHED)])
def test_full_size_presets_have_the_published_parameter_count(name, monkeypatch):
    counted = []
    monkeypatch.setattr("workbench.models.hf.check_fits", lambda what, parameters: counted.append(parameters)
                        or (_ for _ in ()).throw(memory_module.ModelTooLarge("stop before building")))
    with pytest.raises(memory_module.ModelTooLarge):
        load_model(f"hf-config:{name}")
    assert counted == [PUBLISHED[name]]


@pytest.fixture(scope="module")
def reduced_models():
    return {name: load_model(f"hf-config:{name}", **reduced(name)) for name in hf_presets.preset_names()}


@pytest.mark.parametrize("name", ["llama-3-8b", "qwen2-7b", "qwen3-8b", "mistral-7b", "gemma-2b",
                                  "deepseek-v2-lite", "deepseek-v3", "gpt2", "bert-base", "vit-base",
                                  "whisper-tiny"])
def test_each_reduced_preset_builds_and_runs_a_forward(reduced_models, name):
    loaded = reduced_models[name]
    assert (loaded.source, loaded.weights, loaded.name) == ("hf-config", "random", f"hf-config:{name}")
    assert isinstance(loaded.module, HFModule) and loaded.hf_model is loaded.module.hf_model
    assert isinstance(loaded.hf_model, transformers.PreTrainedModel)
    config = loaded.hf_model.config
    inputs = loaded.make_inputs(2, 8) if loaded.default_seq else loaded.make_inputs(2)
    with torch.no_grad():
        out = loaded.module(*inputs)
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
    if name == "vit-base":
        assert [tuple(t.shape) for t in inputs] == [(2, 3, 32, 32)]
        assert out.shape == (2, 10)
    elif name == "whisper-tiny":  # log-mel frames: twice the encoder's positions; decoder ids start the text
        assert [tuple(t.shape) for t in inputs] == [(2, 16, 32), (2, 8)]
        assert (inputs[1][:, 0] == config.decoder_start_token_id).all()
        assert out.shape == (2, 8, 256)
    else:
        assert inputs[0].shape == (2, 8) and int(inputs[0].max()) < 256
        assert out.shape == (2, 8, 256)
    assert loaded.parameter_count == sum(p.numel() for p in loaded.hf_model.parameters())


def test_seeded_weights_are_reproducible_and_leave_the_global_rng_alone():
    before = torch.random.get_rng_state()
    first = load_model("hf-config:llama-3-8b", **reduced("llama-3-8b"))
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(99)
    again = load_model("hf-config:llama-3-8b", **reduced("llama-3-8b"))
    other = load_model("hf-config:llama-3-8b", **reduced("llama-3-8b"), seed=1)
    a, b, c = (m.module.state_dict() for m in (first, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_scaling_keeps_gqa_head_dims_and_mla_moe_consistent(reduced_models):
    llama = reduced_models["llama-3-8b"].hf_model
    attention = llama.model.layers[0].self_attn
    # 32 query heads per 8 KV heads stays 4:1; head_dim = hidden / heads.
    assert (llama.config.num_key_value_heads, llama.config.head_dim) == (1, 16)
    assert attention.q_proj.out_features == 4 * 16 and attention.k_proj.out_features == 1 * 16
    assert llama.config.intermediate_size == 128

    v3 = reduced_models["deepseek-v3"].hf_model.config
    head_dim = 64 // 4  # MLA widths follow the head dim in DeepSeek-V3's proportions (512 : 1536 : 64 of 128)
    assert (v3.qk_nope_head_dim, v3.v_head_dim) == (head_dim, head_dim)
    assert (v3.kv_lora_rank, v3.q_lora_rank, v3.qk_rope_head_dim) == (4 * head_dim, 12 * head_dim, head_dim // 2)
    assert v3.moe_intermediate_size == 16  # 2048 × 128 / 18432 = 14.2, scaled like the dense one, aligned to 8
    assert v3.first_k_dense_replace == 1 and v3.num_hidden_layers == 2  # one dense layer, one MoE layer
    mlp_kinds = [type(layer.mlp).__name__ for layer in reduced_models["deepseek-v3"].hf_model.model.layers]
    assert mlp_kinds == ["DeepseekV3MLP", "DeepseekV3MoE"]


def test_fewer_experts_keep_routing_valid():
    config = hf_presets.preset_config("deepseek-v3", {**reduced("deepseek-v3"), "experts": 6})
    assert config.n_routed_experts == 6 and config.num_experts_per_tok == 6
    assert 6 % config.n_group == 0 and 6 // config.n_group >= 2 and config.topk_group <= config.n_group
    assert config.topk_group * (6 // config.n_group) >= config.num_experts_per_tok
    loaded = load_model("hf-config:deepseek-v3", **reduced("deepseek-v3"), experts=6, experts_per_token=2)
    with torch.no_grad():
        assert loaded.module(*loaded.make_inputs(1, 4)).shape == (1, 4, 256)


def test_special_token_ids_fit_a_reduced_vocabulary():
    config = hf_presets.preset_config("llama-3-8b", {"layers": 2, "vocab": 512})
    assert config.bos_token_id < 512 and config.eos_token_id < 512


@pytest.mark.parametrize(("overrides", "words"), [
    ({"experts": 4}, ["no key(s) experts", "valid:", "layers", "kv_heads"]),
    ({"hidden": 100, "heads": 3}, ["hidden (100) must be a multiple of heads (3)"]),
    ({"heads": 4, "kv_heads": 3}, ["kv_heads (3) must divide heads (4)"]),
    ({"layers": 0}, ["layers must be an integer >= 1"]),
    ({"moe_intermediate": 12}, ["must be multiples of 8"]),
])
def test_bad_overrides_are_one_line_errors(overrides, words):
    with pytest.raises(WorkbenchError) as caught:
        hf_presets.preset_config("deepseek-v3" if "moe_intermediate" in overrides else "llama-3-8b", overrides)
    message = str(caught.value)
    assert "\n" not in message and all(word in message for word in words)


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UnknownModelError) as caught:
        load_model("hf-config:llama-9")
    assert all(name in str(caught.value) for name in hf_presets.preset_names())


def test_too_large_is_refused_before_building_with_the_estimate(monkeypatch):
    monkeypatch.setattr(memory_module, "available_memory", lambda: 24 * GiB)  # this 24 GiB machine

    def built(seed):
        raise AssertionError("the model was built before its size was checked")

    monkeypatch.setattr("workbench.models.hf.seeded_global_rng", built)
    with pytest.raises(memory_module.ModelTooLarge) as caught:
        load_model("hf-config:llama-3-8b")
    parameters = 8_030_261_248
    limit = int(24 * GiB * memory_module.MEMORY_FRACTION)
    message = str(caught.value)
    assert f"{parameters / 1e9:.2f} B parameters × 4 bytes = {parameters * 4 / 1e9:.1f} GB" in message
    assert f"limit of {limit / 1e9:.1f} GB" in message and "\n" not in message


def test_a_scaled_down_llama_fits(monkeypatch):
    monkeypatch.setattr(memory_module, "available_memory", lambda: 24 * GiB)
    loaded = load_model("hf-config:llama-3-8b", layers=2, hidden=512)
    assert loaded.hf_model.config.num_hidden_layers == 2 and loaded.hf_model.config.hidden_size == 512


# --- hf: checkpoints from a local folder -----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model.save_pretrained(folder)
    return folder, model


def test_a_local_folder_loads_with_its_weights(llama_folder):
    folder, saved = llama_folder
    loaded = load_model(f"hf:{folder}")
    assert (loaded.source, loaded.weights, loaded.name) == ("hf", "real", "hf:tiny-llama")
    assert loaded.config["path"] == str(folder.resolve()) and loaded.config["architecture"] == "LlamaForCausalLM"
    (ids,) = loaded.make_inputs(2, 16)
    assert ids.shape == (2, 16) and int(ids.max()) < 128
    with torch.no_grad():
        expected = saved(input_ids=ids, use_cache=False).logits
        assert torch.equal(loaded.module(ids), expected)


def test_a_folder_without_weights_is_one_line(tmp_path):
    transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(WorkbenchError) as caught:
        load_model(f"hf:{tmp_path}")
    assert "\n" not in str(caught.value) and str(tmp_path) in str(caught.value)


def test_a_missing_model_is_one_line_exit_2_saying_how_to_get_it(tmp_path):
    result = CliRunner().invoke(main, ["capture", "--model", "hf:no-such-org/no-such-model-0", "--variants",
                                       "eager", "--out", str(tmp_path)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "not in the local Hugging Face cache" in lines[0]
    assert "huggingface-cli download no-such-org/no-such-model-0" in lines[0]
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_hf_config_from_reads_a_local_config_only(llama_folder, tmp_path, monkeypatch):
    folder, _ = llama_folder
    assert hf_presets.hf_config_from(f"hf:{folder}").num_key_value_heads == 2
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    (tmp_path / "models--some-org--some-model").mkdir()
    with pytest.raises(UnknownModelError) as caught:
        hf_presets.hf_config_from("no-such-org/no-such-model-0")
    assert "huggingface-cli download no-such-org/no-such-model-0" in str(caught.value)
    assert "cached: some-org/some-model" in str(caught.value)


def test_a_checkpoint_takes_no_config_keys(llama_folder):
    with pytest.raises(WorkbenchError, match="takes no config keys"):
        load_model(f"hf:{llama_folder[0]}", layers=1)


# --- the registry and the server's policy ------------------------------------------------------------------


def test_model_source_names_the_prefixed_kinds():
    assert [model_source(ref) for ref in ("hf:gpt2", "hf-config:gpt2", "torchvision:resnet50", "timm:resnet50")] \
        == ["hf", "hf-config", "torchvision", "timm"]


def test_the_policy_allows_presets_and_checks_hf_folders(llama_folder, tmp_path):
    folder, _ = llama_folder
    assert ModelPolicy(cwd=tmp_path).checked_model("hf-config:llama-3-8b") == "hf-config:llama-3-8b"
    assert ModelPolicy(cwd=tmp_path).checked_model("hf:some-org/some-id") == "hf:some-org/some-id"
    with pytest.raises(ModelRefused):
        ModelPolicy(cwd=tmp_path).checked_model(f"hf:{folder}")
    allowed = ModelPolicy(model_dirs=(str(folder.parent),), cwd=tmp_path)
    assert allowed.checked_model(f"hf:{folder}") == f"hf:{folder.resolve()}"


# --- end to end ----------------------------------------------------------------------------------------------


def test_capture_of_a_reduced_preset_writes_ops_numerics_and_phases(tmp_path):
    args = ["capture", "--model", "hf-config:gpt2", "--set", "layers=2", "--set", "hidden=64", "--set", "heads=4",
            "--set", "vocab=256", "--variants", "eager", "--batch", "2", "--seq", "16", "--iterations", "3",
            "--warmup", "1", "--threads", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    assert run["status"] == "ok" and run["weights"] == "random"
    bundle = open_bundle(run["run_id"], tmp_path)
    model = bundle.record.model
    assert (model["source"], model["weights"], model["config"]["preset"]) == ("hf-config", "random", "gpt2")
    assert bundle.record.numerics["top1_agreement"] == 1.0
    trace = bundle.trace()
    kinds = trace.events.column("kind").to_pylist()
    names = set(trace.events.column("name").to_pylist())
    assert kinds.count("op") > 0 and set(LIFECYCLE_PHASES) <= names
    shown = CliRunner().invoke(main, ["show", run["run_id"], "--out", str(tmp_path)])
    assert shown.exit_code == 0 and "(random weights)" in shown.stdout
