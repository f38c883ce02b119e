"""Analytical performance model of decoder-only transformer inference on a device of the hardware table.

A projection, not a measurement: FLOPs and bytes of every forward pass from the config alone, turned
into time with the roofline (`workbench.analysis.roofline` conventions). Everything is per forward pass
of `batch` sequences that feed `new` tokens each on top of `past` cached tokens: prefill is
(new=prompt, past=0), a decode step (new=1, past=context), a speculative verify pass (new=k+1).

FLOPs (2 per multiply-add, torch's convention; bias adds, norms, softmax, activations, RoPE and residual
adds are not counted: they are memory-bound and their traffic is in the activation bytes):

- projections, per new token: 2·in·out per weight matrix. MHA/GQA/MQA: Q d×H·hd, K and V d×KV·hd each,
  O H·hd×d (GQA/MQA shrink only K and V). MLA (DeepSeek-V2, arXiv:2405.04434 §2.1): Q d×H·(hd+r)
  (or down d×q_latent then up q_latent×H·(hd+r)), KV down d×(c+r) (c = kv_latent, r = rope_dim, the
  decoupled RoPE key shared by all heads), KV up c×H·(hd+dv), O H·dv×d.
- attention: QKᵀ 2·H·qk·P and PV 2·H·dv·P per sequence, P = the (query, key) pairs attended:
  new·past + new·(new+1)/2 (causal; a prefill does about half of the square).
- MLA prefill (past = 0) decompresses the latents (KV up on each new token, then attention with
  qk = hd+r, dv); later passes use the absorbed form (`mla_decode="absorbed"`, the default: W_UK folded
  into the query and W_UV into the output, attention over the cached latent: qk = c+r, dv = c, the KV-up
  weights cost 2·c·H·(hd+dv) per new token) or, with `mla_decode="naive"`, decompress the whole cache on
  every pass (KV up on past+new tokens).
- MLP per token: 2·d·F·2 (GELU: in, out) or 2·d·F·3 (SwiGLU: gate, up, down); an MoE layer runs
  `moe_active` routed + `moe_shared` shared experts of width `moe_hidden`, plus the router 2·d·E.
- LM head 2·d·vocab per token whose logits are computed: all tokens of a prefill (`logits="all"`, what
  a plain model forward does) or only the last (`logits="last"`, what serving engines do).

Bytes (compulsory traffic: each tensor read once, each output written once):

- weights: every matrix, norm and bias once per forward (so once per decode step), the LM head too;
  embeddings only the rows looked up. An MoE layer reads its shared experts and the routed experts the
  pass touches: E·(1 − (1 − a/E)^tokens) expected under uniform routing. Matrices (linear layers and the
  LM head) are stored in `weight_dtype`; embeddings, norms, biases and routers in `dtype`.
- KV cache: the new tokens' entries written once, and all past+new entries read once per pass.
  Per token: 2·layers·kv_heads·hd elements for MHA/GQA/MQA, layers·(kv_latent + rope_dim) for MLA, in
  `kv_dtype`; int8/int4 caches add `kv_scale_dtype` scales: `kv_scale="token-head"` one per cached
  vector (token, layer, K/V, kv head; MLA caches one vector per token and layer), `"token"` one per
  token, layer and K/V, `"static"` scales fixed per sequence or tensor (nothing per token; fp8 caches
  are always counted so).
- activations, in `dtype`: each layer's inputs and outputs once (norms, projections, attention, MLP
  hidden, residual adds), no fusion assumed except that attention never materialises its score matrix
  (flash attention; torch's CPU SDPA too); the logits too. This is eager execution's traffic, counted
  per operator as LLM-Viewer does (Yuan et al. 2024, arXiv:2402.16363); fused kernels and on-chip
  caches move less, so decode bytes at large batch are pessimistic and the crossover batch late.

Time per pass = max(FLOPs / peak(dtype), bytes / bandwidth) + `overhead_s` (a per-forward cost for
launch or dispatch overhead; 0 by default, so small passes come out optimistic). TTFT is the prefill
pass; TPOT the mean of the `new − 1` decode steps that follow it (past = prompt … prompt+new−2). Costs
are affine in `past`, so the per-step sum is exact. The crossover batch is the smallest batch whose
decode step at a context reaches the ridge point (peak / bandwidth); the maximum context is the longest
sequence whose weights + KV cache + prefill activations (one pass, or chunks of `prefill_chunk` tokens)
fit in `memory_fraction` of the device memory. Speculative decoding: Leviathan et al., "Fast Inference
from Transformers via Speculative Decoding", ICML 2023 (arXiv:2211.17192), eq. 1 and theorem 3.8.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.op_cost import ITEM_BYTES
from workbench.errors import WorkbenchError
from workbench.hardware.device import DeviceSpec

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
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
SCALED_KV = frozenset({"int8", "int4"})
"""KV dtypes stored with scales (`kv_scale`); fp8 caches use a per-tensor scale."""
KV_PRECISIONS = ("bf16", "fp8", "int8", "int4")
"""Cache precisions the KV-cache table compares by default."""
MLA_LATENT_PER_HEAD_DIM = 4
"""MLA's latent width in head dims when a config gives none (DeepSeek-V2: 512 for 128-dim heads; tiny-gpt
uses the same default)."""
MEMORY_FRACTION = 0.9
"""Share of device memory the model may use (vLLM's default `gpu_memory_utilization`)."""
ELEMENT_BYTES: dict[str, float] = {**{k: float(v) for k, v in ITEM_BYTES.items()}, "tf32": 4.0, "int4": 0.5,
                                   "fp4": 0.5}

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
    "weight_dtype": WEIGHT_DTYPES, "kv_dtype": KV_DTYPES, "kv_scale": KV_SCALES, "kv_scale_dtype": SCALE_DTYPES,
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


# --- parameters and sizes ------------------------------------------------------------------------------


def element_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (int4/fp4: 0.5)."""
    return ELEMENT_BYTES[dtype]


def _attention_matrices(c: LLMConfig) -> list[tuple[str, int, int]]:
    """(name, rows, columns) of one layer's attention weight matrices."""
    h, hd = c.heads, c.head_dim
    if c.attention != "mla":
        return [("q", c.d_model, h * hd), ("k", c.d_model, c.kv_heads * hd), ("v", c.d_model, c.kv_heads * hd),
                ("o", h * c.v_head_dim, c.d_model)]
    q_width = h * (hd + c.rope_dim)
    q = [("q_down", c.d_model, c.q_latent), ("q_up", c.q_latent, q_width)] if c.q_latent else \
        [("q", c.d_model, q_width)]
    return [*q, ("kv_down", c.d_model, c.kv_latent + c.rope_dim), ("kv_up", c.kv_latent, h * (hd + c.v_head_dim)),
            ("o", h * c.v_head_dim, c.d_model)]


def _mlp_matrices(c: LLMConfig, width: int) -> list[tuple[str, int, int]]:
    """(name, rows, columns) of one MLP (or expert) of hidden `width`."""
    if c.mlp == "swiglu":
        return [("gate", c.d_model, width), ("up", c.d_model, width), ("down", width, c.d_model)]
    return [("fc_in", c.d_model, width), ("fc_out", width, c.d_model)]


UNBIASED = frozenset({"kv_up"})
"""Matrices without a bias even when the config has biases: MLA's up projection (DeepSeek-V2 has none,
which keeps the absorbed form equal to the decompressed one; tiny-gpt's MLA follows)."""


def _params(matrices: Iterable[tuple[str, int, int]], bias: bool) -> tuple[int, int]:
    """(matrix elements, bias elements) of weight matrices."""
    matrices = list(matrices)
    biases = sum(k for name, _, k in matrices if name not in UNBIASED) if bias else 0
    return sum(r * k for _, r, k in matrices), biases


def _moe_layers(c: LLMConfig) -> int:
    return c.layers - c.dense_layers if c.moe_experts else 0


def _norm_params(c: LLMConfig, width: int) -> int:
    return width * (2 if c.norm == "layernorm" else 1)


def parameter_counts(c: LLMConfig) -> dict[str, int]:
    """Parameters by group: `matrix` (linear layers and LM head: `weight_dtype`), `other` (embeddings,
    norms, biases, routers: `dtype`), `total`, and `active` (those one token uses: all but the routed
    experts it skips and the embedding table)."""
    attn_m, attn_b = _params(_attention_matrices(c), c.bias)
    latent_norms = (_norm_params(c, c.kv_latent) + (_norm_params(c, c.q_latent) if c.q_latent else 0)) \
        if c.attention == "mla" else 0
    per_layer_other = attn_b + 2 * _norm_params(c, c.d_model) + latent_norms
    dense_m, dense_b = _params(_mlp_matrices(c, c.ffn_hidden), c.bias)
    expert_m, expert_b = _params(_mlp_matrices(c, c.moe_hidden), c.bias) if c.moe_experts else (0, 0)
    moe, dense = _moe_layers(c), c.layers - _moe_layers(c)
    experts = c.moe_experts + c.moe_shared
    matrix = c.layers * attn_m + dense * dense_m + moe * experts * expert_m + c.d_model * c.vocab
    embeddings = c.vocab * c.d_model * (0 if c.tie_embeddings else 1) + \
        ((c.max_seq or 0) * c.d_model if c.pos_emb == "learned" else 0)
    other = (c.layers * per_layer_other + dense * dense_b + moe * (experts * expert_b + c.d_model * c.moe_experts)
             + _norm_params(c, c.d_model) + embeddings)
    skipped = moe * (c.moe_experts - c.moe_active) * (expert_m + expert_b)
    total = matrix + other
    return {"matrix": matrix, "other": other, "total": total, "active": total - skipped - embeddings}


def weight_bytes(c: LLMConfig) -> float:
    """Bytes of all weights resident in memory."""
    counts = parameter_counts(c)
    return counts["matrix"] * element_bytes(c.weight_dtype) + counts["other"] * element_bytes(c.dtype)


def kv_bytes_per_token(c: LLMConfig) -> float:
    """KV-cache bytes of one token of one sequence, all layers, scales included (module docstring)."""
    if c.attention == "mla":
        vectors, width = c.layers, c.kv_latent + c.rope_dim
    else:
        vectors, width = 2 * c.layers * c.kv_heads, c.head_dim
    scales = 0
    if c.kv_dtype in SCALED_KV and c.kv_scale != "static":
        scales = vectors if c.kv_scale == "token-head" or c.attention == "mla" else 2 * c.layers
    return vectors * width * element_bytes(c.kv_dtype) + scales * element_bytes(c.kv_scale_dtype)


def kv_bytes(c: LLMConfig, batch: int, context: int) -> float:
    """KV-cache bytes of `batch` sequences of `context` tokens:
    2·layers·kv_heads·head_dim·context·batch·bytes(kv_dtype) (MHA/GQA/MQA) or
    layers·(kv_latent + rope_dim)·context·batch·bytes (MLA), plus int8/int4 scales."""
    return kv_bytes_per_token(c) * context * batch


# --- cost of one forward pass --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """Work of one forward pass: FLOPs by part and the bytes it moves (see the module docstring)."""

    flops_by_part: Mapping[str, float] = field(default_factory=dict)
    weight_bytes: float = 0.0
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    act_bytes: float = 0.0

    @property
    def flops(self) -> float:
        return float(sum(self.flops_by_part.values()))

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.act_bytes

    @property
    def kv_bytes(self) -> float:
        return self.kv_read_bytes + self.kv_write_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"flops": self.flops, "flops_by_part": dict(self.flops_by_part), "bytes": self.bytes,
                "weight_bytes": self.weight_bytes, "kv_bytes": self.kv_bytes, "kv_read_bytes": self.kv_read_bytes,
                "kv_write_bytes": self.kv_write_bytes, "act_bytes": self.act_bytes, "intensity": self.intensity}


def attended_pairs(new: int, past: int) -> int:
    """(query, key) pairs of causal attention for `new` queries after `past` cached keys."""
    return new * past + new * (new + 1) // 2


def expected_experts(c: LLMConfig, tokens: int) -> float:
    """Distinct routed experts of one MoE layer that `tokens` tokens touch, uniform routing."""
    if not c.moe_experts:
        return 0.0
    return c.moe_experts * (1.0 - (1.0 - c.moe_active / c.moe_experts) ** tokens)


def forward_cost(c: LLMConfig, batch: int, new: int, past: int = 0, *, logits: str = "all") -> Cost:
    """FLOPs and bytes of one forward pass of `batch` sequences feeding `new` tokens each after `past`
    cached ones (module docstring). `logits`: "all" new tokens get logits, or only the "last" of each
    sequence (a decode step computes one either way)."""
    if batch < 1 or new < 1 or past < 0:
        raise WorkbenchError(f"forward pass needs batch >= 1, new >= 1, past >= 0 (got {batch}, {new}, {past})")
    if logits not in LOGITS:
        raise WorkbenchError(f"logits must be one of {', '.join(LOGITS)}, got {logits!r}")
    tokens = batch * new
    pairs = batch * attended_pairs(new, past)
    h, hd, dv = c.heads, c.head_dim, c.v_head_dim
    w_bytes, a_bytes = element_bytes(c.weight_dtype), element_bytes(c.dtype)
    flops: dict[str, float] = {}
    up_tokens = 0  # tokens whose MLA latent is decompressed (naive form)
    for name, rows, cols in _attention_matrices(c):
        part = "out_proj" if name == "o" else "qkv_proj"
        n = tokens
        if name == "kv_up":
            naive = past == 0 or c.mla_decode == "naive"
            up_tokens = batch * (new + past) if naive else 0
            n = up_tokens if naive else tokens
        flops[part] = flops.get(part, 0.0) + 2.0 * n * rows * cols
    if c.attention == "mla" and not up_tokens:
        qk, v_width = c.kv_latent + c.rope_dim, c.kv_latent  # absorbed: attention over the latent
    else:
        qk, v_width = hd + c.rope_dim, dv
    flops["attention"] = 2.0 * h * pairs * (qk + v_width)

    dense, moe = c.layers - _moe_layers(c), _moe_layers(c)
    dense_m = _params(_mlp_matrices(c, c.ffn_hidden), c.bias)[0]
    expert_m, expert_b = _params(_mlp_matrices(c, c.moe_hidden), c.bias) if c.moe_experts else (0, 0)
    per_layer_mlp_flops = [2.0 * tokens * dense_m] * dense + \
        [2.0 * tokens * ((c.moe_active + c.moe_shared) * expert_m + c.d_model * c.moe_experts)] * moe
    logit_tokens = tokens if logits == "all" else batch
    flops = {part: value * c.layers for part, value in flops.items()}
    flops["mlp"] = float(sum(per_layer_mlp_flops))
    flops["lm_head"] = 2.0 * logit_tokens * c.d_model * c.vocab

    # weights: everything once, except the embedding table (only the rows looked up) and the routed
    # experts no token of this pass was sent to
    counts = parameter_counts(c)
    skipped = moe * (c.moe_experts - expected_experts(c, tokens))
    embedding_table = c.vocab * c.d_model * (0 if c.tie_embeddings else 1) + \
        ((c.max_seq or 0) * c.d_model if c.pos_emb == "learned" else 0)
    rows_read = min(tokens, c.vocab) * c.d_model + (new * c.d_model if c.pos_emb == "learned" else 0)
    weights = ((counts["matrix"] - skipped * expert_m) * w_bytes
               + (counts["other"] - embedding_table - skipped * expert_b + rows_read) * a_bytes)

    kv_token = kv_bytes_per_token(c)
    act = _activation_elements(c, batch, new, up_tokens, logit_tokens, dense, moe) * a_bytes
    return Cost(flops_by_part=flops, weight_bytes=weights, kv_read_bytes=kv_token * batch * (past + new),
                kv_write_bytes=kv_token * tokens, act_bytes=act)


def _activation_elements(c: LLMConfig, batch: int, new: int, up_tokens: int, logit_tokens: int, dense: int,
                         moe: int) -> float:
    """Activation elements read and written by one pass (each tensor written once, read once; MLA's
    absorbed query and latent output are counted at their head widths, a small under-count)."""
    tokens, d, h = batch * new, c.d_model, c.heads
    q_width = h * (c.head_dim + c.rope_dim)
    gated = c.mlp == "swiglu"

    def mlp(width: int) -> int:  # read x, write hidden(s), activation, read hidden, write out
        return 2 * d + (6 if gated else 4) * width

    per_token_layer = (2 * d              # ln1: read, write
                       + d + q_width      # projections: read x once, write q (k, v go to the cache)
                       + q_width          # attention reads q ...
                       + 2 * h * c.v_head_dim  # ... writes its output, which the O projection reads
                       + d                # O projection writes
                       + 3 * d            # residual add: read 2, write 1
                       + 2 * d            # ln2
                       + 3 * d)           # residual add
    if c.attention == "mla" and c.q_latent:
        per_token_layer += 2 * c.q_latent
    total = tokens * per_token_layer * c.layers
    total += dense * tokens * mlp(c.ffn_hidden)
    total += moe * tokens * (mlp((c.moe_active + c.moe_shared) * c.moe_hidden) + c.moe_experts)
    # MLA decompressed K and V: written by the up projection, read by attention
    total += 2 * up_tokens * h * (c.head_dim + c.v_head_dim) * c.layers
    total += tokens * d * (3 if c.pos_emb == "learned" else 1)  # embedding lookup (+ position add)
    total += 2 * tokens * d + logit_tokens * (d + c.vocab)  # final norm, LM head
    return float(total)


# --- time on a device ----------------------------------------------------------------------------------


def pass_time(cost: Cost, device: DeviceSpec, dtype: str, overhead_s: float = 0.0) -> dict[str, Any]:
    """Roofline time of one pass: `{"time_s", "compute_s", "memory_s", "overhead_s", "bound", "peak_dtype"}`;
    bound is "compute" or "memory" (the larger term), "latency" when the overhead exceeds both."""
    peak_dtype, peak = device.peak(dtype)
    compute_s, memory_s = cost.flops / peak, cost.bytes / device.memory_bw_bytes_per_s
    roof = max(compute_s, memory_s)
    bound = "latency" if overhead_s > roof else "compute" if compute_s >= memory_s else "memory"
    return {"time_s": roof + overhead_s, "compute_s": compute_s, "memory_s": memory_s, "overhead_s": overhead_s,
            "bound": bound, "peak_dtype": peak_dtype}


def decode_steps(c: LLMConfig, device: DeviceSpec, batch: int, prompt: int, new: int, *,
                 overhead_s: float = 0.0) -> dict[str, Any]:
    """The `new − 1` decode steps after a prefill of `prompt` tokens (past = prompt … prompt+new−2):
    totals, per-step means, and the time of each step (an array in `"step_s"`)."""
    steps = new - 1
    if steps < 1:
        return {"steps": 0, "step_s": np.zeros(0)}
    first, second = forward_cost(c, batch, 1, prompt), forward_cost(c, batch, 1, prompt + 1)
    i = np.arange(steps, dtype=np.float64)

    def along(attribute: str) -> np.ndarray:  # costs are affine in past: exact per-step values
        start = getattr(first, attribute)
        return start + (getattr(second, attribute) - start) * i

    flops, moved, kv_read, act = along("flops"), along("bytes"), along("kv_read_bytes"), along("act_bytes")
    _, peak = device.peak(c.dtype)
    compute_s, memory_s = flops / peak, moved / device.memory_bw_bytes_per_s
    step_s = np.maximum(compute_s, memory_s) + overhead_s
    mid = pass_time(forward_cost(c, batch, 1, prompt + steps // 2), device, c.dtype, overhead_s)
    return {
        "steps": steps, "flops": float(flops.sum()), "bytes": float(moved.sum()),
        "flops_per_step": float(flops.mean()), "bytes_per_step": float(moved.mean()),
        "weight_bytes_per_step": first.weight_bytes, "kv_read_bytes_per_step": float(kv_read.mean()),
        "kv_write_bytes_per_step": first.kv_write_bytes, "act_bytes_per_step": float(act.mean()),
        "intensity": float(flops.sum() / moved.sum()), "time_s": float(step_s.sum()),
        "time_per_step_s": float(step_s.mean()), "bound": mid["bound"],
        "compute_bound_steps": int((compute_s >= memory_s).sum()), "step_s": step_s,
    }


def crossover_batch(c: LLMConfig, device: DeviceSpec, context: int, *, max_batch: int = 1 << 24) -> int | None:
    """The smallest batch whose decode step at `context` cached tokens is compute-bound (intensity at
    least the ridge point of the config's `dtype`); None when even `max_batch` is not (the KV-cache read
    grows with the batch as fast as the FLOPs: MHA attention stays near 1 FLOP per byte)."""
    ridge = device.ridge_point(c.dtype)

    def compute_bound(batch: int) -> bool:
        return forward_cost(c, batch, 1, context).intensity >= ridge

    if not compute_bound(max_batch):
        return None
    low, high = 0, 1  # invariant: low is memory-bound (or 0), high compute-bound
    while not compute_bound(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if compute_bound(mid) else (mid, high)
    return high


def activation_peak_bytes(c: LLMConfig, batch: int, tokens: int, *, logits: str = "last",
                          prefill_chunk: int | None = None) -> float:
    """Largest transient activation set of a prefill of `tokens` tokens in one pass (or in chunks of
    `prefill_chunk` tokens): the residual stream and its normalised copy, the widest intermediate
    (attention's q + output, MLA's decompressed K and V, or the MLP hidden and its activation), and the
    logits of `logits` tokens."""
    live = min(tokens, prefill_chunk) if prefill_chunk else tokens
    width = max(c.ffn_hidden, (c.moe_active + c.moe_shared) * c.moe_hidden)
    mlp_live = width * (3 if c.mlp == "swiglu" else 2)
    attn_live = c.heads * (c.head_dim + c.rope_dim + c.v_head_dim)
    if c.attention == "mla":
        attn_live += c.heads * (c.head_dim + c.v_head_dim)  # decompressed K, V in the prefill
    per_token = 2 * c.d_model + max(mlp_live, attn_live)
    logit_tokens = batch * live if logits == "all" else batch
    return (batch * live * per_token + logit_tokens * c.vocab) * element_bytes(c.dtype)


def memory_bytes(c: LLMConfig, batch: int, context: int, *, logits: str = "last",
                 prefill_chunk: int | None = None) -> float:
    """Weights + KV cache of `context` tokens + the prefill activation peak."""
    return weight_bytes(c) + kv_bytes(c, batch, context) + \
        activation_peak_bytes(c, batch, context, logits=logits, prefill_chunk=prefill_chunk)


def max_context(c: LLMConfig, device: DeviceSpec, batch: int, *, memory_fraction: float = MEMORY_FRACTION,
                logits: str = "last", prefill_chunk: int | None = None) -> int | None:
    """The longest context (tokens per sequence) whose `memory_bytes` fit in `memory_fraction` of the
    device memory; 0 when the weights alone do not fit, None when the device's memory size is unknown.
    Memory is affine in the context (piecewise with a `prefill_chunk`), so this is a closed form."""
    if not device.memory_bytes:
        return None
    budget = device.memory_bytes * memory_fraction

    def fit(per_token: float, fixed: float) -> int:
        return int((budget - fixed) // per_token) if budget >= fixed else 0

    one_pass = fit(memory_bytes(c, batch, 1, logits=logits) - memory_bytes(c, batch, 0, logits=logits),
                   memory_bytes(c, batch, 0, logits=logits))
    if not prefill_chunk or one_pass <= prefill_chunk:
        return one_pass
    chunked = memory_bytes(c, batch, prefill_chunk, logits=logits, prefill_chunk=prefill_chunk)
    return prefill_chunk + fit(kv_bytes(c, batch, 1), chunked)


# --- speculative decoding ------------------------------------------------------------------------------


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one target pass yields with `k` drafted tokens accepted i.i.d. with probability
    `acceptance`: (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023, eq. 1); k + 1 at α = 1."""
    _check_speculative(acceptance, k, 0.0)
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def speculative_speedup(acceptance: float, k: int, draft_cost: float) -> float:
    """Expected wall-time improvement of speculative decoding: expected tokens per target pass over
    (1 + k·c), c = one draft step's time over one target step's (Leviathan et al. 2023, theorem 3.8).
    Assumes verifying k+1 tokens costs one target step (true while decode is memory-bound)."""
    _check_speculative(acceptance, k, draft_cost)
    return expected_tokens(acceptance, k) / (1.0 + k * draft_cost)


def _check_speculative(acceptance: float, k: int, draft_cost: float) -> None:
    if not 0.0 <= acceptance <= 1.0:
        raise WorkbenchError(f"acceptance rate must be in [0, 1], got {acceptance}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise WorkbenchError(f"speculative k (drafted tokens) must be an integer >= 0, got {k!r}")
    if draft_cost < 0:
        raise WorkbenchError(f"draft cost must be >= 0 (draft step time / target step time), got {draft_cost}")


def speculative_projection(c: LLMConfig, device: DeviceSpec, *, batch: int, context: int, k: int,
                           acceptance: float, draft_cost: float, overhead_s: float = 0.0,
                           max_k: int = 16) -> dict[str, Any]:
    """Speculative decoding at `context` cached tokens: the paper's speedup, and a roofline one whose
    verify pass is this model's cost of k+1 tokens (it grows once verifying turns compute-bound):
    E / (k·c + T_verify / T_step). `best_k` maximises the paper's formula over 1..max_k."""
    step = pass_time(forward_cost(c, batch, 1, context), device, c.dtype, overhead_s)["time_s"]
    verify = pass_time(forward_cost(c, batch, k + 1, context), device, c.dtype, overhead_s)["time_s"]
    tokens = expected_tokens(acceptance, k)
    best = max(range(1, max_k + 1), key=lambda j: speculative_speedup(acceptance, j, draft_cost))
    return {"k": k, "acceptance": acceptance, "draft_cost": draft_cost, "context": context,
            "expected_tokens": tokens, "speedup": speculative_speedup(acceptance, k, draft_cost),
            "verify_over_step": verify / step, "speedup_roofline": tokens / (k * draft_cost + verify / step),
            "best_k": best, "best_k_speedup": speculative_speedup(acceptance, best, draft_cost)}


# --- projections and tables ----------------------------------------------------------------------------


def device_summary(device: DeviceSpec, dtype: str) -> dict[str, Any]:
    """The device figures a projection used."""
    peak_dtype, peak = device.peak(dtype)
    return {"name": device.name, "peak_dtype": peak_dtype, "peak_flops_per_s": peak,
            "memory_bw_bytes_per_s": device.memory_bw_bytes_per_s, "memory_bytes": device.memory_bytes,
            "ridge_point": peak / device.memory_bw_bytes_per_s, "measured": device.measured}


def project(c: LLMConfig, device: DeviceSpec, *, batch: int, prompt: int, new: int, overhead_s: float = 0.0,
            prefill_logits: str = "last", memory_fraction: float = MEMORY_FRACTION,
            prefill_chunk: int | None = None) -> dict[str, Any]:
    """One scenario: prefill and decode cost and time, TTFT, TPOT (mean step; None for new = 1),
    end-to-end time and tokens/s, the KV cache and memory of the whole sequence (prompt + new) and
    whether it fits, the crossover batch at that context and the longest context that fits at `batch`."""
    if min(batch, prompt, new) < 1:
        raise WorkbenchError(f"batch, prompt and new must be >= 1, got {batch}, {prompt}, {new}")
    prefill = forward_cost(c, batch, prompt, logits=prefill_logits)
    prefill_t = pass_time(prefill, device, c.dtype, overhead_s)
    decode = decode_steps(c, device, batch, prompt, new, overhead_s=overhead_s)
    decode.pop("step_s")
    context = prompt + new
    e2e_s = prefill_t["time_s"] + decode.get("time_s", 0.0)
    footprint = memory_bytes(c, batch, context, logits=prefill_logits, prefill_chunk=prefill_chunk)
    return {
        "batch": batch, "prompt": prompt, "new": new, "context": context,
        "prefill": {**prefill.to_dict(), **prefill_t, "time_ms": prefill_t["time_s"] * 1e3},
        "decode": decode,
        "ttft_ms": prefill_t["time_s"] * 1e3,
        "tpot_ms": decode["time_per_step_s"] * 1e3 if decode["steps"] else None,
        "e2e_ms": e2e_s * 1e3, "tokens_per_s": batch * new / e2e_s,
        "kv_bytes": kv_bytes(c, batch, context), "memory_bytes": footprint,
        "fits": None if not device.memory_bytes else footprint <= device.memory_bytes * memory_fraction,
        "beyond_max_seq": c.max_seq is not None and context > c.max_seq,
        "crossover_batch": crossover_batch(c, device, context),
        "max_context": max_context(c, device, batch, memory_fraction=memory_fraction, logits=prefill_logits,
                                   prefill_chunk=prefill_chunk),
    }


def attention_variants(c: LLMConfig) -> dict[str, LLMConfig]:
    """The config in each attention variant, for comparing KV caches: mha (kv_heads = heads), gqa (the
    config's kv_heads when it is GQA, else heads/8 as Llama 3, at least 2), mqa (1 kv head), mla (the
    config's latent when it is MLA, else DeepSeek-V2's proportions: kv_latent = 4·head_dim, rope_dim =
    head_dim/2). Variants that do not exist for the head count (GQA with fewer than 4 heads) are left out."""
    base = replace(c, kv_latent=0, q_latent=0, rope_dim=0, v_head_dim=c.head_dim)
    variants = {"mha": replace(base, attention="mha", kv_heads=c.heads)}
    groups = c.kv_heads if c.attention == "gqa" else max(2, c.heads // 8)
    if c.attention == "gqa" or (1 < groups < c.heads and c.heads % groups == 0):
        variants["gqa"] = replace(base, attention="gqa", kv_heads=groups)
    variants["mqa"] = replace(base, attention="mqa", kv_heads=1)
    variants["mla"] = c if c.attention == "mla" else \
        replace(base, attention="mla", kv_heads=c.heads, kv_latent=MLA_LATENT_PER_HEAD_DIM * c.head_dim,
                rope_dim=c.head_dim // 2)
    return variants


KV_TABLE_COLUMNS = ("variant", "kv_heads", "kv_latent", "rope_dim", "kv_dtype", "context", "batch", "kv_bytes",
                    "bytes_per_token", "vs_mha")


def kv_cache_table(c: LLMConfig, contexts: Sequence[int], *, batch: int = 1,
                   kv_dtypes: Sequence[str] = KV_PRECISIONS,
                   variants: Mapping[str, LLMConfig] | None = None) -> pd.DataFrame:
    """KV-cache size against context length per attention variant and cache precision.

    | variant | kv_heads | kv_latent | rope_dim | kv_dtype | context | batch | kv_bytes | bytes_per_token | vs_mha |

    `vs_mha` is the size over MHA's at the same precision (the reduction factor's inverse).
    """
    variants = variants or attention_variants(c)
    rows = []
    for dtype in kv_dtypes:
        mha = kv_bytes_per_token(replace(variants.get("mha", attention_variants(c)["mha"]), kv_dtype=dtype))
        for name, variant in variants.items():
            per_token = kv_bytes_per_token(replace(variant, kv_dtype=dtype))
            for context in contexts:
                rows.append({"variant": name, "kv_heads": variant.kv_heads if variant.attention != "mla" else None,
                             "kv_latent": variant.kv_latent or None, "rope_dim": variant.rope_dim or None,
                             "kv_dtype": dtype, "context": int(context), "batch": batch,
                             "kv_bytes": per_token * context * batch, "bytes_per_token": per_token,
                             "vs_mha": per_token / mha})
    return pd.DataFrame(rows, columns=list(KV_TABLE_COLUMNS))


ERROR_COLUMNS = ("metric", "predicted", "measured", "rel_error", "ratio")


def prediction_errors(rows: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured values: adds `rel_error` = (predicted − measured) / measured (negative:
    the model is optimistic) and `ratio` = measured / predicted, keeping the other columns.

    | metric | predicted | measured | … | rel_error | ratio |
    """
    missing = {"metric", "predicted", "measured"} - set(rows.columns)
    if missing:
        raise WorkbenchError(f"prediction rows need columns metric, predicted, measured; missing {sorted(missing)}")
    out = rows.copy()
    predicted, measured = out["predicted"].astype(float), out["measured"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["rel_error"] = np.where(measured != 0, (predicted - measured) / measured, np.nan)
        out["ratio"] = np.where(predicted != 0, measured / predicted, np.nan)
    return out


def parse_sweep(text: str, what: str) -> list[int]:
    """Positive integers from a sweep: comma-separated values, each an integer (a `k` suffix multiplies by
    1024: 4k = 4096) or a doubling range `low..high` (1..64 = 1, 2, 4, …, 64); in the given order."""
    values: list[int] = []
    for item in (part.strip() for part in str(text).split(",")):
        low_text, sep, high_text = item.partition("..")
        try:
            low = _sweep_int(low_text)
            high = _sweep_int(high_text) if sep else low
        except ValueError:
            raise WorkbenchError(f"{what} {text!r}: {item!r} is not a positive integer (4096, 4k) "
                                 "or a doubling range low..high") from None
        if low < 1 or high < low:
            raise WorkbenchError(f"{what} {text!r}: {item!r} must be positive, low <= high")
        while low <= high:
            values.append(low)
            low *= 2
    return values


def _sweep_int(text: str) -> int:
    text = text.strip().lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def default_contexts(c: LLMConfig, *, low: int = 128, high: int = 131072) -> list[int]:
    """Powers of two from `low` to the config's max_seq (or `high`), for context sweeps."""
    top = min(c.max_seq or high, high)
    contexts = [low]
    while contexts[-1] * 2 <= top:
        contexts.append(contexts[-1] * 2)
    return contexts if top >= low else [top]


def llm_projection(c: LLMConfig, device: DeviceSpec, *, batches: Sequence[int], prompts: Sequence[int],
                   news: Sequence[int], contexts: Sequence[int] | None = None, spec_k: int | None = None,
                   acceptance: float = 0.7, draft_cost: float = 0.05, overhead_s: float = 0.0,
                   prefill_logits: str = "last", memory_fraction: float = MEMORY_FRACTION,
                   prefill_chunk: int | None = None) -> dict[str, Any]:
    """Everything `workbench llm-model` reports, JSON-ready: the config, device figures, weights, one
    `project` per (batch, prompt, new), per context the KV bytes and crossover batch, the KV-cache table
    per attention variant and precision (the config's own and `KV_PRECISIONS`), and the speculative-decoding
    projection (when `spec_k` is given; at the first scenario's batch and context)."""
    contexts = list(contexts or default_contexts(c))
    scenarios = [project(c, device, batch=b, prompt=p, new=n, overhead_s=overhead_s, prefill_logits=prefill_logits,
                         memory_fraction=memory_fraction, prefill_chunk=prefill_chunk)
                 for b in batches for p in prompts for n in news]
    per_context = [{"context": ctx, "kv_bytes_per_sequence": kv_bytes(c, 1, ctx),
                    "crossover_batch": crossover_batch(c, device, ctx)} for ctx in contexts]
    counts = parameter_counts(c)
    result: dict[str, Any] = {
        "config": c.to_dict(), "device": device_summary(device, c.dtype),
        "weights": {"params": counts["total"], "active_params": counts["active"], "bytes": weight_bytes(c)},
        "kv_bytes_per_token": kv_bytes_per_token(c), "overhead_ms": overhead_s * 1e3,
        "prefill_logits": prefill_logits, "memory_fraction": memory_fraction, "prefill_chunk": prefill_chunk,
        "scenarios": scenarios, "contexts": per_context,
        "kv_cache": kv_cache_table(c, contexts, kv_dtypes=tuple(dict.fromkeys((c.kv_dtype, *KV_PRECISIONS))))
        .to_dict(orient="records"),
        "speculative": None,
    }
    if spec_k is not None:
        first = scenarios[0]
        result["speculative"] = speculative_projection(
            c, device, batch=first["batch"], context=first["context"], k=spec_k, acceptance=acceptance,
            draft_cost=draft_cost, overhead_s=overhead_s)
    return result
