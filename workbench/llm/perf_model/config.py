"""LLM configs for the performance model: the resolved `LLMConfig`, built-in presets, and building one
from user values, a `--config` string or a JSON/YAML file (every key and value checked)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

ATTENTION = ("mha", "gqa", "mqa", "mla")
MLP_KINDS = ("gelu", "swiglu")
POS_EMBEDDINGS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
KV_SCALES = ("token-head", "token", "static")
SCALE_DTYPES = ("fp32", "bf16", "fp16")
MLA_DECODE = ("absorbed", "naive")
LOGITS = ("all", "last")
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
WEIGHT_DTYPES = (*COMPUTE_DTYPES, "int4", "fp4")
KNOWN_KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
"""KV-cache dtypes the performance model knows the element size of (a config's `kv_dtype`)."""
SCALED_KV = frozenset({"int8", "int4"})
"""KV dtypes stored with scales (`kv_scale`); fp8 caches use a per-tensor scale."""
KV_PRECISIONS = ("bf16", "fp8", "int8", "int4")
"""Cache precisions the KV-cache table compares by default."""
MLA_LATENT_PER_HEAD_DIM = 4
"""MLA's latent width in head dims when a config gives none (DeepSeek-V2: 512 for 128-dim heads; tiny-gpt
uses the same default)."""
MEMORY_FRACTION = 0.9
"""Share of device memory the model may use (vLLM's default `gpu_memory_utilization`)."""


PRESETS: dict[str, dict[str, Any]] = {
    # workbench/models/tiny_gpt.py defaults (tests check the parameter count against the real module)
    "tiny-gpt": {"layers": 2, "d_model": 256, "heads": 8, "vocab": 1024, "max_seq": 512, "mlp_ratio": 4,
                 "mlp": "gelu", "pos_emb": "learned", "norm": "layernorm", "bias": True, "tie_embeddings": False,
                 "dtype": "fp32"},
    # meta-llama/Meta-Llama-3-8B config.json: hidden_size 4096, intermediate_size 14336, 32 layers, 32 heads,
    # 8 KV heads, vocab 128256, max_position_embeddings 8192, SiLU-gated MLP, RMSNorm, no biases, untied
    # embeddings, bf16 (8.03B parameters)
    "llama-3-8b": {"layers": 32, "d_model": 4096, "heads": 32, "kv_heads": 8, "vocab": 128256, "max_seq": 8192,
                   "ffn_hidden": 14336, "mlp": "swiglu", "pos_emb": "rope", "norm": "rmsnorm", "bias": False,
                   "tie_embeddings": False, "dtype": "bf16"},
    # deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, 27 layers, 16 heads, kv_lora_rank 512,
    # q_lora_rank null, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, vocab 102400,
    # intermediate_size 10944 (first_k_dense_replace 1 dense layer), MoE: 64 routed experts, 6 per token,
    # 2 shared, moe_intermediate_size 1408; 32k context (model card); 15.7B parameters, 2.4B active
    "deepseek-v2-lite": {"layers": 27, "d_model": 2048, "heads": 16, "attention": "mla", "head_dim": 128,
                         "kv_latent": 512, "rope_dim": 64, "v_head_dim": 128, "vocab": 102400, "max_seq": 32768,
                         "ffn_hidden": 10944, "mlp": "swiglu", "moe_experts": 64, "moe_active": 6, "moe_shared": 2,
                         "moe_hidden": 1408, "dense_layers": 1, "pos_emb": "rope", "norm": "rmsnorm",
                         "bias": False, "tie_embeddings": False, "dtype": "bf16"},
}
"""Built-in configs: `--config tiny-gpt`, `--config llama-3-8b,kv_dtype=fp8`, ..."""


@dataclass(frozen=True)
class LLMConfig:
    """A decoder-only transformer as the model sees it, fully resolved (build one with `make_config`).

    `head_dim` is the query/key head size (MLA: the non-RoPE part, qk_nope_head_dim); `v_head_dim` the
    value head size; `ffn_hidden` the dense MLP width; MoE fields are 0 for a dense model.
    """

    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    attention: str
    head_dim: int
    v_head_dim: int
    vocab: int
    ffn_hidden: int
    mlp: str = "gelu"
    kv_latent: int = 0
    q_latent: int = 0
    rope_dim: int = 0
    max_seq: int | None = None
    pos_emb: str = "rope"
    norm: str = "rmsnorm"
    bias: bool = False
    tie_embeddings: bool = False
    dtype: str = "bf16"
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    kv_scale: str = "token-head"
    kv_scale_dtype: str = "fp32"
    moe_experts: int = 0
    moe_active: int = 0
    moe_shared: int = 0
    moe_hidden: int = 0
    dense_layers: int = 0
    mla_decode: str = "absorbed"

    def to_dict(self) -> dict[str, Any]:
        """The resolved config, JSON-ready."""
        return asdict(self)


# --- building a config ---------------------------------------------------------------------------------

_INT, _OPT_INT, _NUM, _BOOL, _STR = "int", "int|null", "number", "bool", "str"
CONFIG_KEYS: dict[str, str] = {
    "preset": _STR, "name": _STR, "layers": _INT, "d_model": _INT, "heads": _INT, "kv_heads": _OPT_INT,
    "head_dim": _OPT_INT, "attention": _STR, "kv_latent": _INT, "q_latent": _INT, "rope_dim": _INT,
    "v_head_dim": _OPT_INT, "mlp": _STR, "mlp_ratio": _NUM, "ffn_hidden": _OPT_INT, "vocab": _INT,
    "max_seq": _OPT_INT, "pos_emb": _STR, "norm": _STR, "bias": _BOOL, "tie_embeddings": _BOOL, "dtype": _STR,
    "weight_dtype": _STR, "kv_dtype": _STR, "kv_scale": _STR, "kv_scale_dtype": _STR, "moe_experts": _INT,
    "moe_active": _INT, "moe_shared": _INT, "moe_hidden": _INT, "dense_layers": _INT, "mla_decode": _STR,
}
"""Keys a config may give and their types; `preset` starts from a `PRESETS` entry, `mlp_ratio` sets
`ffn_hidden` = mlp_ratio · d_model (default 4)."""
_CHOICES: dict[str, Sequence[str]] = {
    "attention": ATTENTION, "mlp": MLP_KINDS, "pos_emb": POS_EMBEDDINGS, "norm": NORMS, "dtype": COMPUTE_DTYPES,
    "weight_dtype": WEIGHT_DTYPES, "kv_dtype": KNOWN_KV_DTYPES, "kv_scale": KV_SCALES, "kv_scale_dtype": SCALE_DTYPES,
    "mla_decode": MLA_DECODE, "preset": tuple(PRESETS),
}
_REQUIRED = ("layers", "d_model", "heads", "vocab")


def make_config(values: Mapping[str, Any], *, origin: str = "config") -> LLMConfig:
    """An `LLMConfig` from user values (a preset's values under them when `preset` is given); a
    `WorkbenchError` naming `origin` and the key for an unknown key, a wrong type or an inconsistency.

    Attention: `attention` may be left out (MLA when `kv_latent` is given, else MQA for kv_heads=1,
    MHA for kv_heads=heads or none, GQA otherwise); mha sets kv_heads=heads, mqa kv_heads=1, gqa needs
    1 < kv_heads < heads dividing heads; mla takes no kv_heads, and kv_latent defaults to
    `MLA_LATENT_PER_HEAD_DIM`·head_dim.
    """
    for key, value in values.items():
        _check_value(origin, key, value)
    merged = _merge_preset(PRESETS[values["preset"]], values) if "preset" in values else dict(values)
    missing = [k for k in _REQUIRED if merged.get(k) is None]
    if missing:
        raise WorkbenchError(f"{origin}: missing config key(s) {', '.join(missing)} "
                             f"(or start from a preset: {', '.join(PRESETS)})")
    name = values.get("name") or values.get("preset") or "custom"
    if "preset" in values and "name" not in values and len(values) > 1:
        name += " (modified)"
    return _resolve(merged, name, origin)


def _merge_preset(preset: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A preset's values under the user's, minus the preset's values that the user's replace in meaning:
    mlp_ratio and ffn_hidden replace each other, kv_heads or a non-MLA attention drop the preset's MLA
    fields, and kv_latent or attention=mla/mha/mqa drop its kv_heads."""
    given = {k: v for k, v in values.items() if k != "preset"}
    dropped: set[str] = set()
    if "mlp_ratio" in given:
        dropped.add("ffn_hidden")
    if "ffn_hidden" in given:
        dropped.add("mlp_ratio")
    if "kv_heads" in given or given.get("attention", "mla") != "mla":
        dropped |= {"attention", "kv_latent", "q_latent", "rope_dim", "v_head_dim"}
    if given.get("kv_latent") or given.get("attention") in ("mla", "mha", "mqa"):
        dropped |= {"kv_heads"} | ({"attention"} if "attention" not in given else set())
    return {**{k: v for k, v in preset.items() if k not in dropped}, **given}


def _check_value(origin: str, key: str, value: Any) -> None:
    """Raise unless `key` is a config key and `value` has its type (and is one of its choices)."""
    kind = CONFIG_KEYS.get(key)
    if kind is None:
        raise WorkbenchError(f"{origin}: unknown config key {key!r}; valid keys: {', '.join(CONFIG_KEYS)}")
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = {_INT: is_int and value >= 0, _OPT_INT: value is None or (is_int and value >= 1),
          _NUM: isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
          _BOOL: isinstance(value, bool), _STR: isinstance(value, str)}[kind]
    if not ok:
        expected = {_INT: "a non-negative integer", _OPT_INT: "a positive integer or null",
                    _NUM: "a positive number", _BOOL: "true or false", _STR: "a string"}[kind]
        raise WorkbenchError(f"{origin}: config key {key!r} must be {expected}, got {value!r}")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise WorkbenchError(f"{origin}: config key {key!r} must be one of {', '.join(_CHOICES[key])}, got {value!r}")


def _resolve(v: dict[str, Any], name: str, origin: str) -> LLMConfig:
    """Fill in derived fields and check that the values make one consistent model."""
    def fail(message: str) -> WorkbenchError:
        return WorkbenchError(f"{origin}: {message}")

    for key in _REQUIRED:
        if v[key] < 1:
            raise fail(f"config key {key!r} must be >= 1, got {v[key]}")
    heads, d_model = v["heads"], v["d_model"]
    head_dim = v.get("head_dim")
    if head_dim is None:
        if d_model % heads:
            raise fail(f"d_model {d_model} is not divisible by heads {heads}; give head_dim")
        head_dim = d_model // heads
    kv_heads, kv_latent = v.get("kv_heads"), v.get("kv_latent", 0)
    attention = v.get("attention") or ("mla" if kv_latent else "mha" if kv_heads in (None, heads)
                                       else "mqa" if kv_heads == 1 else "gqa")
    if attention == "mla":
        kv_latent = kv_latent or MLA_LATENT_PER_HEAD_DIM * head_dim
        if kv_heads is not None:
            raise fail("attention=mla caches a latent, not kv heads: drop kv_heads")
        kv_heads = heads
    else:
        for key in ("kv_latent", "q_latent", "rope_dim"):
            if v.get(key):
                raise fail(f"config key {key!r} applies only to attention=mla (attention is {attention})")
        wanted = {"mha": heads, "mqa": 1}.get(attention)
        if wanted is not None and kv_heads not in (None, wanted):
            raise fail(f"attention={attention} means kv_heads={wanted}, got kv_heads={kv_heads}")
        if attention == "gqa" and (kv_heads is None or not 1 < kv_heads < heads):
            raise fail(f"attention=gqa needs 1 < kv_heads < heads ({heads}), got kv_heads={kv_heads}")
        kv_heads = wanted or kv_heads
        if heads % kv_heads:
            raise fail(f"heads {heads} is not divisible by kv_heads {kv_heads}")
    if v.get("ffn_hidden") is not None and "mlp_ratio" in v:
        raise fail("give mlp_ratio or ffn_hidden, not both")
    ffn_hidden = v.get("ffn_hidden") or round(v.get("mlp_ratio", 4) * d_model)
    experts = v.get("moe_experts", 0)
    if experts:
        if not 1 <= v.get("moe_active", 0) <= experts or not v.get("moe_hidden"):
            raise fail(f"an MoE config needs 1 <= moe_active <= moe_experts ({experts}) and moe_hidden")
        if v.get("dense_layers", 0) > v["layers"]:
            raise fail(f"dense_layers {v['dense_layers']} exceeds layers {v['layers']}")
    elif any(v.get(k) for k in ("moe_active", "moe_shared", "moe_hidden", "dense_layers")):
        raise fail("moe_active, moe_shared, moe_hidden and dense_layers need moe_experts")
    dtype = v.get("dtype", "bf16")
    passed = {f.name for f in fields(LLMConfig)} & v.keys()
    return LLMConfig(**{**{k: v[k] for k in passed}, "name": name, "attention": attention, "kv_heads": kv_heads,
                        "kv_latent": kv_latent,
                        "head_dim": head_dim, "v_head_dim": v.get("v_head_dim") or head_dim, "ffn_hidden": ffn_hidden,
                        "dtype": dtype, "weight_dtype": v.get("weight_dtype") or dtype,
                        "kv_dtype": v.get("kv_dtype") or dtype})


def parse_config(text: str) -> LLMConfig:
    """A config from what `--config` takes: a JSON/YAML file (a mapping of `CONFIG_KEYS`, `preset`
    allowed), or inline `[PRESET,]key=value,...` (values read as JSON where they parse: 4, true, null)."""
    text = text.strip()
    path = Path(text).expanduser()
    if text.lower().endswith((".json", ".yaml", ".yml")) or path.is_file():
        return make_config(_read_config_file(path), origin=str(path))
    values: dict[str, Any] = {}
    for i, item in enumerate(part.strip() for part in text.split(",")):
        key, sep, raw = item.partition("=")
        if not sep:
            if i == 0 and item in PRESETS:
                values["preset"] = item
                continue
            raise WorkbenchError(f"--config {text!r}: {item!r} is neither key=value nor a preset "
                                 f"({', '.join(PRESETS)}, first) nor a .json/.yaml file")
        try:
            values[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip()] = raw.strip()
    return make_config(values, origin="--config")


def _read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a JSON or YAML config file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())  # YAML is a superset of JSON
    except (OSError, yaml.YAMLError) as exc:
        raise WorkbenchError(f"{path}: cannot read the config: {exc}") from exc
    if not isinstance(data, Mapping):
        raise WorkbenchError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return {str(k): val for k, val in data.items()}
