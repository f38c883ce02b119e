"""Real Hugging Face architectures written as configs in code (`hf-config:<preset>`): nothing is downloaded.

Each preset holds the published config of one model at full size, in the fields of its own transformers
config class. `preset_config(name, overrides)` scales it with friendly keys that mean the same in every
preset (`layers`, `hidden`, `heads`, `kv_heads`, `intermediate`, `vocab`, `max_positions`, and where the
architecture has them `head_dim`, `experts`, `experts_per_token`, `shared_experts`, `moe_intermediate`,
`dense_layers`, `kv_lora_rank`, `q_lora_rank`, `rope_head_dim`, `image_size`, `patch_size`, `labels`,
`source_positions`, `mel_bins`) and keeps the model consistent: a key left unset follows the keys it
depends on in the preset's own proportions:

- `head_dim` = hidden / heads once hidden or heads is set (the preset's value otherwise);
- `kv_heads` keeps the preset's query-per-KV-head ratio when heads is set (GQA stays GQA, MQA stays MQA);
- `intermediate` scales with hidden, `moe_intermediate` with intermediate (multiples of 8);
- MLA widths (DeepSeek: kv_lora_rank, q_lora_rank, rope_head_dim) scale with the head dim, whose
  qk_nope/v widths become head_dim;
- `dense_layers` (DeepSeek's leading dense layers) is at most half the layers, so a reduced model keeps
  MoE layers; `experts_per_token` and the routing groups fit the number of experts;
- special token ids beyond a reduced vocabulary are wrapped into it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models.extra import require
from workbench.models.hf_local import hf_config_from

__all__ = ["PRESETS", "Preset", "hf_config_from", "preset_config", "preset_names"]

Fields = dict[str, Any]

# Friendly key → config field(s), per family of config classes.
_DECODER = {"layers": ("num_hidden_layers",), "hidden": ("hidden_size",), "heads": ("num_attention_heads",),
            "kv_heads": ("num_key_value_heads",), "intermediate": ("intermediate_size",),
            "vocab": ("vocab_size",), "max_positions": ("max_position_embeddings",), "head_dim": ("head_dim",)}
_MLA_MOE = {**{k: v for k, v in _DECODER.items() if k != "head_dim"},
            "head_dim": ("qk_nope_head_dim", "v_head_dim"), "rope_head_dim": ("qk_rope_head_dim",),
            "kv_lora_rank": ("kv_lora_rank",), "q_lora_rank": ("q_lora_rank",),
            "experts": ("n_routed_experts",), "experts_per_token": ("num_experts_per_tok",),
            "shared_experts": ("n_shared_experts",), "moe_intermediate": ("moe_intermediate_size",),
            "dense_layers": ("first_k_dense_replace",)}
_GPT2 = {"layers": ("n_layer",), "hidden": ("n_embd",), "heads": ("n_head",), "intermediate": ("n_inner",),
         "vocab": ("vocab_size",), "max_positions": ("n_positions",)}
_ENCODER = {"layers": ("num_hidden_layers",), "hidden": ("hidden_size",), "heads": ("num_attention_heads",),
            "intermediate": ("intermediate_size",)}
_BERT = {**_ENCODER, "vocab": ("vocab_size",), "max_positions": ("max_position_embeddings",)}
_VIT = {**_ENCODER, "image_size": ("image_size",), "patch_size": ("patch_size",), "labels": ("num_labels",)}
_WHISPER = {"layers": ("encoder_layers", "decoder_layers"), "hidden": ("d_model",),
            "heads": ("encoder_attention_heads", "decoder_attention_heads"),
            "intermediate": ("encoder_ffn_dim", "decoder_ffn_dim"), "vocab": ("vocab_size",),
            "max_positions": ("max_target_positions",), "source_positions": ("max_source_positions",),
            "mel_bins": ("num_mel_bins",)}

_MAY_BE_NONE = {"q_lora_rank", "intermediate"}
"""Friendly keys whose preset value may be None (no query compression; GPT-2's 4 × hidden)."""
_MAY_BE_ZERO = {"dense_layers", "shared_experts"}
ALIGN = 8
"""Scaled MLP widths are multiples of this (16 bytes of fp16: what grouped and tensor-core matmuls need)."""
_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
_TOKEN_LIST_FIELDS = ("suppress_tokens", "begin_suppress_tokens")


@dataclass(frozen=True)
class Preset:
    """One architecture: the transformers `model_type`, what it computes (`task`: causal-lm, masked-lm,
    image-classification, speech-seq2seq), its full-size config `fields` and its friendly `keys`."""

    name: str
    model_type: str
    task: str
    summary: str
    fields: Mapping[str, Any]
    keys: Mapping[str, tuple[str, ...]] = field(repr=False)

    def value(self, key: str) -> Any:
        """The preset's own value of friendly `key`."""
        return self.fields.get(self.keys[key][0])


def _rope(theta: float) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": theta, "rope_type": "default"}}


_LIST = [
    Preset("llama-3-8b", "llama", "causal-lm", "Meta Llama-3-8B: GQA (32 query, 8 KV heads), SwiGLU, RoPE",
           {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": False,
            **_rope(500000.0)}, _DECODER),
    Preset("qwen2-7b", "qwen2", "causal-lm", "Qwen2-7B: GQA (28 query, 4 KV heads), QKV bias",
           {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "bos_token_id": 151643, "eos_token_id": 151643, "tie_word_embeddings": False,
            **_rope(1000000.0)}, _DECODER),
    Preset("qwen3-8b", "qwen3", "causal-lm", "Qwen3-8B: GQA (32 query, 8 KV heads), QK-norm",
           {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6, "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": False,
            **_rope(1000000.0)}, _DECODER),
    Preset("mistral-7b", "mistral", "causal-lm", "Mistral-7B-v0.1: GQA (32 query, 8 KV heads), sliding window 4096",
           {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
            "sliding_window": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False, **_rope(10000.0)}, _DECODER),
    Preset("gemma-2b", "gemma", "causal-lm", "Gemma-2B: MQA (8 query heads, 1 KV head) of width 256, GeGLU",
           {"vocab_size": 256000, "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 8192,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1,
            "pad_token_id": 0, "tie_word_embeddings": True, **_rope(10000.0)}, _DECODER),
    Preset("deepseek-v2-lite", "deepseek_v2", "causal-lm",
           "DeepSeek-V2-Lite: MLA (KV latent 512, no query compression), MoE 64 routed + 2 shared experts, top-6",
           {"vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
            "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
            "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
            "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
            "v_head_dim": 128, "topk_method": "greedy", "routed_scaling_factor": 1.0, "norm_topk_prob": False,
            "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "bos_token_id": 100000,
            "eos_token_id": 100001, "tie_word_embeddings": False, **_rope(10000.0)}, _MLA_MOE),
    Preset("deepseek-v3", "deepseek_v3", "causal-lm",
           "DeepSeek-V3: MLA (KV latent 512, query latent 1536), MoE 256 routed + 1 shared experts, top-8 of 4 "
           "groups",
           {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
            "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
            "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8,
            "topk_group": 4, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "routed_scaling_factor": 2.5,
            "norm_topk_prob": True, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "bos_token_id": 0,
            "eos_token_id": 1, "tie_word_embeddings": False, **_rope(10000.0)}, _MLA_MOE),
    Preset("gpt2", "gpt2", "causal-lm", "GPT-2 (124M): MHA, learned positions, GELU MLP",
           {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
            "bos_token_id": 50256, "eos_token_id": 50256}, _GPT2),
    Preset("bert-base", "bert", "masked-lm", "BERT-base (uncased): bidirectional encoder, masked-LM head",
           {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 0},
           _BERT),
    Preset("vit-base", "vit", "image-classification", "ViT-B/16: 224×224 images in 16×16 patches, 1000 classes",
           {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
            "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True, "num_labels": 1000}, _VIT),
    Preset("whisper-tiny", "whisper", "speech-seq2seq",
           "Whisper-tiny: encoder over 80×3000 log-mel frames, decoder over text tokens",
           {"vocab_size": 51865, "num_mel_bins": 80, "encoder_layers": 4, "decoder_layers": 4, "d_model": 384,
            "encoder_attention_heads": 6, "decoder_attention_heads": 6, "encoder_ffn_dim": 1536,
            "decoder_ffn_dim": 1536, "max_source_positions": 1500, "max_target_positions": 448,
            "decoder_start_token_id": 50258, "bos_token_id": 50257, "eos_token_id": 50257, "pad_token_id": 50257,
            "begin_suppress_tokens": [220, 50257]}, _WHISPER),
]

PRESETS: dict[str, Preset] = {preset.name: preset for preset in _LIST}


def preset_names() -> list[str]:
    """Names of the presets, sorted."""
    return sorted(PRESETS)


def preset(name: str) -> Preset:
    """The preset `name`; UnknownModelError listing the presets when there is none."""
    if name not in PRESETS:
        raise UnknownModelError(f"unknown hf-config preset {name!r}; presets: {', '.join(preset_names())}")
    return PRESETS[name]


def _checked(name: str, key: str, value: Any) -> Any:
    if value is None and key in _MAY_BE_NONE:
        return None
    minimum = 0 if key in _MAY_BE_ZERO else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkbenchError(f"hf-config:{name}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def _scaled(value: int | None, new: int, old: int, multiple: int = 1) -> int | None:
    """`value` × new / old, rounded to a positive multiple of `multiple`."""
    return None if value is None else max(1, round(value * new / old / multiple)) * multiple


def _derive(p: Preset, k: dict[str, Any], given: set[str]) -> None:
    """Fill the friendly keys the caller left unset from those it set (module docstring)."""
    def unset(key: str) -> bool:
        return key in p.keys and key not in given

    if unset("kv_heads") and "heads" in given:
        k["kv_heads"] = max(1, k["heads"] * p.value("kv_heads") // p.value("heads"))
    if unset("intermediate") and "hidden" in given:
        k["intermediate"] = _scaled(p.value("intermediate"), k["hidden"], p.value("hidden"), ALIGN)
    if unset("moe_intermediate") and given & {"hidden", "intermediate"}:
        k["moe_intermediate"] = _scaled(p.value("moe_intermediate"), k["intermediate"], p.value("intermediate"),
                                        ALIGN)
    if unset("head_dim") and given & {"hidden", "heads"}:
        k["head_dim"] = k["hidden"] // k["heads"]
    if "kv_lora_rank" in p.keys and "head_dim" in k and given & {"hidden", "heads", "head_dim"}:
        for key in ("kv_lora_rank", "q_lora_rank", "rope_head_dim"):
            if unset(key):
                k[key] = _scaled(p.value(key), k["head_dim"], p.value("head_dim"))
    if unset("rope_head_dim") and "rope_head_dim" in k and k["rope_head_dim"] % 2:
        k["rope_head_dim"] += 1
    if unset("dense_layers") and "layers" in given:
        k["dense_layers"] = min(p.value("dense_layers"), k["layers"] // 2)
    if unset("experts_per_token") and "experts" in given:
        k["experts_per_token"] = min(p.value("experts_per_token"), k["experts"])


def _validate(p: Preset, k: dict[str, Any], given: set[str]) -> None:
    def fail(problem: str) -> WorkbenchError:
        return WorkbenchError(f"hf-config:{p.name}: {problem}")

    if "head_dim" not in given and k["hidden"] % k["heads"]:
        raise fail(f"hidden ({k['hidden']}) must be a multiple of heads ({k['heads']})")
    if "kv_heads" in k and (k["kv_heads"] > k["heads"] or k["heads"] % k["kv_heads"]):
        raise fail(f"kv_heads ({k['kv_heads']}) must divide heads ({k['heads']})")
    if "experts" in k and (k["hidden"] % ALIGN or k["moe_intermediate"] % ALIGN):
        raise fail(f"hidden ({k['hidden']}) and moe_intermediate ({k['moe_intermediate']}) must be multiples of "
                   f"{ALIGN} (the grouped expert matmul needs 16-byte aligned rows)")
    if "experts" in k and k["experts_per_token"] > k["experts"]:
        raise fail(f"experts_per_token ({k['experts_per_token']}) must be at most experts ({k['experts']})")
    if "dense_layers" in k and k["dense_layers"] > k["layers"]:
        raise fail(f"dense_layers ({k['dense_layers']}) must be at most layers ({k['layers']})")
    if "rope_head_dim" in k and k["rope_head_dim"] % 2:
        raise fail(f"rope_head_dim must be even, got {k['rope_head_dim']}")
    if "image_size" in k and k["image_size"] % k["patch_size"]:
        raise fail(f"image_size ({k['image_size']}) must be a multiple of patch_size ({k['patch_size']})")


def _fit_routing_groups(fields: Fields) -> None:
    """DeepSeek-V3's group-limited routing: groups divide the experts with at least 2 per group, and the
    chosen groups hold at least experts_per_token experts."""
    if "n_group" not in fields:
        return
    experts, groups = fields["n_routed_experts"], fields["n_group"]
    if experts < 2:
        raise WorkbenchError(f"hf-config: experts must be at least 2 with grouped routing, got {experts}")
    while groups > 1 and (experts % groups or experts // groups < 2):
        groups -= 1
    per_group = experts // groups
    fields["n_group"] = groups
    fields["topk_group"] = min(groups, max(min(fields["topk_group"], groups),
                                           math.ceil(fields["num_experts_per_tok"] / per_group)))


def _wrap_token_ids(fields: Fields, vocab: int) -> None:
    """Special token ids of a reduced vocabulary wrapped into it (modulo), suppression lists filtered."""
    for name in _TOKEN_FIELDS:
        value = fields.get(name)
        if isinstance(value, int):
            fields[name] = value % vocab
        elif isinstance(value, list):
            fields[name] = [token % vocab for token in value]
    for name in _TOKEN_LIST_FIELDS:
        if fields.get(name):
            fields[name] = [t for t in fields[name] if t < vocab]


def preset_fields(name: str, overrides: Mapping[str, Any]) -> Fields:
    """The config fields of preset `name` scaled by the friendly `overrides` (module docstring)."""
    p = preset(name)
    unknown = sorted(set(overrides) - set(p.keys))
    if unknown:
        raise WorkbenchError(f"hf-config:{name} has no key(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(sorted(p.keys))}")
    friendly = {key: p.value(key) for key in p.keys}
    friendly.update({key: _checked(name, key, value) for key, value in overrides.items()})
    _derive(p, friendly, set(overrides))
    _validate(p, friendly, set(overrides))
    fields = dict(p.fields)
    for key, value in friendly.items():
        for target in p.keys[key]:
            fields[target] = value
    _fit_routing_groups(fields)
    if "vocab" in overrides:
        _wrap_token_ids(fields, friendly["vocab"])
    return fields


def preset_config(name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """The transformers `PretrainedConfig` of preset `name`, full size or scaled by friendly `overrides`
    (layers, hidden, heads, kv_heads, intermediate, vocab, experts, ...); unknown keys and inconsistent values
    are a WorkbenchError listing the valid keys or saying what is wrong."""
    p = preset(name)
    fields = preset_fields(name, overrides or {})
    try:
        config = require("transformers").AutoConfig.for_model(p.model_type, **fields)
    except (ValueError, TypeError) as exc:
        raise WorkbenchError(f"hf-config:{name}: invalid config: {exc}") from exc
    config.name_or_path = f"hf-config:{name}"
    return config
