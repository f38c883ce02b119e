"""The performance model's `LLMConfig` of a Hugging Face `transformers` config: what `llm-model --config
hf:<id or folder>` / `hf-config:<preset>` reads, and what generation runs of HF models predict their KV cache from.

Read from the config object's attributes only (no transformers import here):

- sizes: `num_hidden_layers`, `hidden_size`, `num_attention_heads`, `num_key_value_heads` (GQA / MQA; absent:
  MHA), `head_dim` (absent: hidden / heads), `vocab_size`, `intermediate_size` (absent: 4·hidden, GPT-2's
  `n_inner`), `max_position_embeddings`, `tie_word_embeddings`, the dtype (`dtype` / `torch_dtype`);
- MLA (DeepSeek-V2/V3: `kv_lora_rank`): the latent `kv_lora_rank`, `q_lora_rank`, the decoupled RoPE key
  `qk_rope_head_dim`, `qk_nope_head_dim` as the head dim and `v_head_dim`. transformers' DeepseekV2Attention and
  DeepseekV3Attention call `cache.update(kv_nope, k_rot)` on the *compressed* latent (the normalised
  `kv_lora_rank` part and the RoPE'd shared key, one "head" each) and expand K and V with `kv_b_proj` after
  reading the cache, so the cache holds layers·(kv_lora_rank + qk_rope_head_dim) values per token: what this
  model's MLA size formula counts;
- MoE: routed experts `n_routed_experts` / `num_local_experts` / `num_experts`, `num_experts_per_tok`,
  `n_shared_experts`, `moe_intermediate_size` (Mixtral: its `intermediate_size`), `first_k_dense_replace`;
- the architecture family by `model_type`: GPT-2-like models (learned positions, LayerNorm, biases, an
  ungated GELU MLP) against the Llama family (RoPE, RMSNorm, a gated MLP, counted as `swiglu`: three matrices,
  as GeGLU has too).

Approximations, which move parameter and byte counts slightly but never the KV cache: per-projection biases
(Qwen2's q/k/v biases) count as `bias` when the attention has any; sliding-window layers (Mistral, Gemma 2/3)
are counted as full attention (`sliding_window` is reported by `sliding_window_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.errors import WorkbenchError
from workbench.llm.perf_model.config import LLMConfig, make_config

UNGATED_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2",
                                 "gpt_bigcode"})
"""Model types whose MLP is one GELU between two matrices (the rest gate it: SwiGLU / GeGLU)."""
LEARNED_POSITION_TYPES = frozenset({"gpt2", "opt", "gpt_bigcode"})
"""Model types with a learned position table instead of RoPE."""
HF_PREFIXES = ("hf:", "hf-config:")
"""Model and config references of Hugging Face models."""
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def is_hf_ref(ref: str) -> bool:
    """Whether `ref` names a Hugging Face model or config (`hf:<id or folder>`, `hf-config:<preset>`)."""
    return ref.startswith(HF_PREFIXES)


def dtype_name(dtype: Any) -> str | None:
    """The perf model's name of a torch dtype or its string ("torch.bfloat16", "bfloat16"); None if unknown."""
    if dtype is None:
        return None
    return _TORCH_DTYPES.get(str(dtype).removeprefix("torch."))


def _first(config: Any, *names: str) -> Any:
    """The first of `names` the config has with a value other than None."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def hf_config_values(config: Any) -> dict[str, Any]:
    """The `make_config` values of a transformers config (see the module docstring); a decoder-only text
    config is expected (a multimodal config's text part is read through `get_text_config`)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    model_type = str(getattr(config, "model_type", "") or "")
    layers, hidden = _first(config, "num_hidden_layers", "n_layer"), _first(config, "hidden_size", "n_embd")
    heads, vocab = _first(config, "num_attention_heads", "n_head"), getattr(config, "vocab_size", None)
    missing = [name for name, value in (("num_hidden_layers", layers), ("hidden_size", hidden),
                                        ("num_attention_heads", heads), ("vocab_size", vocab)) if value is None]
    if missing:
        raise WorkbenchError(f"HF config ({model_type or 'unknown model type'}) has no {', '.join(missing)}: "
                             "not a decoder-only transformer the LLM model can read")
    gated = model_type not in UNGATED_MODEL_TYPES
    values: dict[str, Any] = {
        "name": _first(config, "name_or_path", "_name_or_path") or model_type or "hf",
        "layers": layers, "d_model": hidden, "heads": heads, "vocab": vocab,
        "ffn_hidden": _first(config, "intermediate_size", "n_inner") or 4 * hidden,
        "max_seq": _first(config, "max_position_embeddings", "n_positions"),
        "mlp": "swiglu" if gated else "gelu",
        "pos_emb": "learned" if model_type in LEARNED_POSITION_TYPES else "rope",
        "norm": "layernorm" if not gated else "rmsnorm",
        "bias": bool(_first(config, "attention_bias", "bias") or model_type in UNGATED_MODEL_TYPES
                     or model_type == "qwen2"),
        "tie_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }
    dtype = dtype_name(getattr(config, "dtype", None))
    if dtype:
        values["dtype"] = dtype
    if getattr(config, "kv_lora_rank", None):  # MLA (DeepSeek-V2/V3)
        values.update(attention="mla", kv_latent=config.kv_lora_rank,
                      q_latent=getattr(config, "q_lora_rank", None) or 0, rope_dim=config.qk_rope_head_dim,
                      head_dim=config.qk_nope_head_dim,
                      v_head_dim=config.v_head_dim)
    else:
        kv_heads = _first(config, "num_key_value_heads", "multi_query_group_num")
        if getattr(config, "multi_query", False):
            kv_heads = 1
        values["kv_heads"] = kv_heads if kv_heads not in (None, heads) else None
        head_dim = getattr(config, "head_dim", None)
        if head_dim is not None or hidden % heads:
            values["head_dim"] = head_dim or hidden // heads
    experts = _first(config, "n_routed_experts", "num_local_experts", "num_experts")
    if experts:
        values.update(moe_experts=experts, moe_active=config.num_experts_per_tok,
                      moe_shared=getattr(config, "n_shared_experts", None) or 0,
                      moe_hidden=_first(config, "moe_intermediate_size", "intermediate_size"),
                      dense_layers=min(getattr(config, "first_k_dense_replace", None) or 0, layers))
    return values


def llm_config_from_hf(config: Any, *, name: str | None = None,
                       overrides: Mapping[str, Any] | None = None) -> LLMConfig:
    """The `LLMConfig` of a transformers config (see the module docstring); `overrides` are perf-model keys
    set on top (e.g. `dtype`, `kv_dtype`)."""
    values = hf_config_values(config)
    if name:
        values["name"] = name
    values.update(overrides or {})
    return make_config(values, origin=f"HF config {values['name']}")


def sliding_window_of(config: Any) -> int | None:
    """The sliding window of a config whose layers (some or all) attend within one; None for full attention."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def hf_llm_config(ref: str, overrides: Mapping[str, Any] | None = None) -> LLMConfig:
    """The `LLMConfig` of `hf:<id or folder>` (a local config, never downloaded) or `hf-config:<preset>`, with
    `overrides` (the preset's friendly keys: layers, hidden, heads, kv_heads, ...; `workbench.models.hf_presets`)."""
    kind, _, name = ref.partition(":")
    if kind == "hf-config":
        from workbench.models.hf_presets import preset_config

        return llm_config_from_hf(preset_config(name, dict(overrides or {})), name=name)
    if kind == "hf":
        from workbench.models.hf_local import hf_config_from

        if overrides:
            raise WorkbenchError(f"--set applies to hf-config: presets; {ref} is read as it is")
        return llm_config_from_hf(hf_config_from(ref), name=name)
    raise WorkbenchError(f"{ref!r} is not an hf:<id or folder> or hf-config:<preset> reference")
