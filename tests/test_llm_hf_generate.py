"""Generation of Hugging Face models through their own generate(): reduced Llama (GQA) and DeepSeek-V3 (MLA)
built from transformers configs, their caches measured against the performance model's prediction, step
timings and labels, assisted generation's acceptance, and the HF config reading of the performance model."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from workbench.errors import VariantUnavailable, WorkbenchError  # noqa: E402
from workbench.llm.generate import PREFILL, decode_label  # noqa: E402
from workbench.llm.hf_cache import cache_unavailable, make_cache, predicted_cache_bytes  # noqa: E402
from workbench.llm.hf_generate import (  # noqa: E402
    LogitsOf,
    first_layers_draft,
    hf_assisted_generate,
    hf_forced_logits,
    hf_generate,
)
from workbench.llm.numerics import recompute_logits  # noqa: E402
from workbench.llm.perf_model import parameter_counts  # noqa: E402
from workbench.llm.perf_model.hf_config import llm_config_from_hf  # noqa: E402
from workbench.profiling.torch_profiler import TorchProfilerSession  # noqa: E402
from workbench.trace import read_trace  # noqa: E402

PROMPT, NEW, VOCAB = 16, 8, 512
CONTEXT = PROMPT + NEW - 1  # positions fed: the prompt and every new token but the last
# Llama: 2 layers, hidden 128, 4 heads of 32, 2 kv heads (GQA)
LLAMA = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 256, "vocab_size": VOCAB}
# DeepSeek-V3: MLA with a latent of 32 and a RoPE key of 8; layer 0 dense, layer 1 MoE (8 experts, 2 active, 1 shared)
DEEPSEEK = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 256, "moe_intermediate_size": 64, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32, "q_lora_rank": None,
            "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "vocab_size": VOCAB, "n_group": 1,
            "topk_group": 1}
FP32 = 4


@pytest.fixture(scope="module")
def models() -> dict[str, transformers.PreTrainedModel]:
    torch.manual_seed(0)
    return {"llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval(),
            "deepseek": transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**DEEPSEEK)).eval()}


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))


# bytes by hand: Llama caches K and V of 2 kv heads of 32 per layer; DeepSeek the 32-wide latent + 8-wide RoPE key
HAND_BYTES = {"llama": 2 * 2 * 2 * 32 * CONTEXT * FP32, "deepseek": 2 * (32 + 8) * CONTEXT * FP32}


@pytest.mark.parametrize("cache", ["dynamic", "static", "quantized-fp8"])
@pytest.mark.parametrize("name", ["llama", "deepseek"])
def test_cache_bytes_measured_equal_the_prediction(models, prompt, name, cache):
    model = models[name]
    run = hf_generate(model, prompt, NEW, cache=cache)
    predicted, what = predicted_cache_bytes(llm_config_from_hf(model.config), model.config, cache, batch=1,
                                            context=CONTEXT, capacity=CONTEXT, dtype="fp32")
    assert run.kv_cache_bytes == predicted
    if cache == "quantized-fp8":  # one byte per value, and an fp32 scale for K and one for V per layer
        assert predicted == HAND_BYTES[name] // FP32 + 2 * 2 * FP32
    else:
        assert predicted == HAND_BYTES[name]
    assert ("MLA" in what) == (name == "deepseek")
    assert len(run.times.step_ns) == NEW and run.times.step_tokens == (1,) * NEW
    assert run.times.ttft_ns > 0 and run.times.tpot_ns().size == NEW - 1


@pytest.mark.parametrize("name", ["llama", "deepseek"])
def test_dynamic_and_static_caches_give_the_uncached_greedy_tokens(models, prompt, name):
    model = models[name]
    dynamic = hf_generate(model, prompt, NEW, cache="dynamic", keep_logits=True)
    static = hf_generate(model, prompt, NEW, cache="static")
    assert torch.equal(dynamic.tokens, static.tokens)
    expected = recompute_logits(LogitsOf(model), prompt, dynamic.tokens)
    assert torch.equal(dynamic.tokens, expected.argmax(dim=-1))
    torch.testing.assert_close(dynamic.logits, expected, rtol=1e-4, atol=1e-4)


def test_fp8_cache_is_lossy_but_close(models, prompt):
    model = models["llama"]
    reference = hf_generate(model, prompt, NEW, cache="dynamic", keep_logits=True)
    forced = hf_forced_logits(model, prompt, reference.tokens, cache="quantized-fp8")
    error = (forced - reference.logits).abs().max().item()
    assert 0 < error < 0.1 * reference.logits.abs().max().item()
    exact = hf_forced_logits(model, prompt, reference.tokens, cache="dynamic")
    torch.testing.assert_close(exact, reference.logits, rtol=1e-4, atol=1e-4)


def test_steps_are_labelled_in_the_profiler_trace(models, prompt, tmp_path):
    with TorchProfilerSession(tmp_path, "hf") as session:
        hf_generate(models["llama"], prompt, 5, cache="static")
    events = read_trace(session.trace_path).df()
    labels = events.loc[events["kind"] == "annotation", "name"].astype(str).tolist()
    expected = [PREFILL] + [decode_label(n) for n in range(4)]
    assert [label for label in labels if label in expected] == expected


@pytest.mark.parametrize("name", ["llama", "deepseek"])
def test_an_identical_draft_has_every_proposal_accepted(models, prompt, name):
    model = models[name]
    spec = hf_assisted_generate(model, first_layers_draft(model, 2), prompt, NEW, 3)
    assert spec.acceptance_rate == 1.0 and spec.proposed == 6  # two rounds of 3 proposals
    assert spec.times.step_tokens == (4, 4)  # each round: 3 accepted + the target's bonus token
    assert torch.equal(spec.tokens, hf_generate(model, prompt, NEW).tokens)


def test_a_first_layer_draft_gives_the_targets_greedy_output(models, prompt, tmp_path):
    model = models["llama"]
    draft = first_layers_draft(model, 1)
    with TorchProfilerSession(tmp_path, "spec") as session:
        spec = hf_assisted_generate(model, draft, prompt, NEW, 2, cache="static")
    assert torch.equal(spec.tokens, hf_generate(model, prompt, NEW).tokens)
    rounds = len(spec.times.step_tokens)
    assert spec.accepted == NEW - rounds  # every round emits its accepted proposals + one target token
    assert 0 <= spec.accepted <= spec.proposed and 0.0 <= spec.acceptance_rate <= 1.0
    assert spec.kv_cache_bytes == HAND_BYTES["llama"] and spec.draft_kv_cache_bytes > 0
    names = read_trace(session.trace_path).df().query("kind == 'annotation'")["name"].astype(str).tolist()
    assert names.count("prefill") == 1 and names.count("verify") == rounds
    assert sum(n.startswith("decode ") for n in names) == rounds - 1 and names.count("draft") >= rounds - 1


def test_first_layers_draft_shares_the_targets_weights(models):
    model = models["deepseek"]
    draft = first_layers_draft(model, 1)
    assert draft.config.num_hidden_layers == 1 and model.config.num_hidden_layers == 2
    assert draft.model.layers[0].self_attn.kv_b_proj.weight.data_ptr() == \
        model.model.layers[0].self_attn.kv_b_proj.weight.data_ptr()
    assert draft.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    with pytest.raises(WorkbenchError, match=r"draft layers must be in 1\.\.2"):
        first_layers_draft(model, 3)


def test_bad_requests(models, prompt):
    model = models["llama"]
    with pytest.raises(WorkbenchError, match="cannot be cropped"):
        hf_assisted_generate(model, first_layers_draft(model, 1), prompt, NEW, 2, cache="quantized-fp8")
    with pytest.raises(WorkbenchError, match="one sequence at a time"):
        hf_assisted_generate(model, first_layers_draft(model, 1), prompt.repeat(2, 1), NEW, 2)
    with pytest.raises(WorkbenchError, match="unknown cache 'paged'"):
        hf_generate(model, prompt, NEW, cache="paged")
    with pytest.raises(WorkbenchError, match="new tokens must be an integer >= 1"):
        hf_generate(model, prompt, 0)


def test_a_quantized_cache_without_its_backend_says_why():
    import importlib.util

    if importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.quanto") is not None:
        pytest.skip("optimum-quanto is installed here")
    assert "optimum-quanto is not installed" in cache_unavailable("quantized")
    with pytest.raises(VariantUnavailable, match="pip install optimum-quanto"):
        make_cache("quantized", transformers.LlamaConfig(**LLAMA), CONTEXT)
    assert cache_unavailable("quantized-fp8") is None and cache_unavailable("dynamic") is None


# --- the performance model reads HF configs ------------------------------------------------------------


def test_llama_config_reads_as_gqa_with_the_modules_parameter_count(models):
    llm = llm_config_from_hf(models["llama"].config)
    assert (llm.attention, llm.kv_heads, llm.head_dim, llm.ffn_hidden, llm.mlp, llm.norm) == \
        ("gqa", 2, 32, 256, "swiglu", "rmsnorm")
    assert parameter_counts(llm)["total"] == sum(p.numel() for p in models["llama"].parameters())


def test_deepseek_config_reads_as_mla_with_moe(models):
    llm = llm_config_from_hf(models["deepseek"].config)
    assert (llm.attention, llm.kv_latent, llm.rope_dim, llm.head_dim, llm.v_head_dim) == ("mla", 32, 8, 16, 16)
    assert (llm.moe_experts, llm.moe_active, llm.moe_shared, llm.moe_hidden, llm.dense_layers) == (8, 2, 1, 64, 1)


def test_gpt2_config_reads_as_learned_positions_and_gelu():
    llm = llm_config_from_hf(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100))
    assert (llm.attention, llm.mlp, llm.pos_emb, llm.norm, llm.ffn_hidden, llm.tie_embeddings) == \
        ("mha", "gelu", "learned", "layernorm", 256, True)
