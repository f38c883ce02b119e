"""Sizes of a model in memory: parameters by group, weight bytes, KV-cache bytes per token (scales included),
prefill activation peaks, and the longest context that fits a device (`workbench.llm.perf_model`)."""

from __future__ import annotations

from collections.abc import Iterable

from workbench.analysis.op_cost import ITEM_BYTES
from workbench.hardware.device import DeviceSpec
from workbench.llm.perf_model.config import MEMORY_FRACTION, SCALED_KV, LLMConfig

ELEMENT_BYTES: dict[str, float] = {**{k: float(v) for k, v in ITEM_BYTES.items()}, "tf32": 4.0, "int4": 0.5,
                                   "fp4": 0.5}


def element_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (int4/fp4: 0.5)."""
    return ELEMENT_BYTES[dtype]


def attention_matrices(c: LLMConfig) -> list[tuple[str, int, int]]:
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


def mlp_matrices(c: LLMConfig, width: int) -> list[tuple[str, int, int]]:
    """(name, rows, columns) of one MLP (or expert) of hidden `width`."""
    if c.mlp == "swiglu":
        return [("gate", c.d_model, width), ("up", c.d_model, width), ("down", width, c.d_model)]
    return [("fc_in", c.d_model, width), ("fc_out", width, c.d_model)]


UNBIASED = frozenset({"kv_up"})
"""Matrices without a bias even when the config has biases: MLA's up projection (DeepSeek-V2 has none,
which keeps the absorbed form equal to the decompressed one; tiny-gpt's MLA follows)."""


def matrix_params(matrices: Iterable[tuple[str, int, int]], bias: bool) -> tuple[int, int]:
    """(matrix elements, bias elements) of weight matrices."""
    matrices = list(matrices)
    biases = sum(k for name, _, k in matrices if name not in UNBIASED) if bias else 0
    return sum(r * k for _, r, k in matrices), biases


def moe_layers(c: LLMConfig) -> int:
    return c.layers - c.dense_layers if c.moe_experts else 0


def _normmatrix_params(c: LLMConfig, width: int) -> int:
    return width * (2 if c.norm == "layernorm" else 1)


def parameter_counts(c: LLMConfig) -> dict[str, int]:
    """Parameters by group: `matrix` (linear layers and LM head: `weight_dtype`), `other` (embeddings,
    norms, biases, routers: `dtype`), `total`, and `active` (those one token uses: all but the routed
    experts it skips and the embedding table)."""
    attn_m, attn_b = matrix_params(attention_matrices(c), c.bias)
    latent_norms = (_normmatrix_params(c, c.kv_latent) + (_normmatrix_params(c, c.q_latent) if c.q_latent else 0)) \
        if c.attention == "mla" else 0
    per_layer_other = attn_b + 2 * _normmatrix_params(c, c.d_model) + latent_norms
    dense_m, dense_b = matrix_params(mlp_matrices(c, c.ffn_hidden), c.bias)
    expert_m, expert_b = matrix_params(mlp_matrices(c, c.moe_hidden), c.bias) if c.moe_experts else (0, 0)
    moe, dense = moe_layers(c), c.layers - moe_layers(c)
    experts = c.moe_experts + c.moe_shared
    matrix = c.layers * attn_m + dense * dense_m + moe * experts * expert_m + c.d_model * c.vocab
    embeddings = c.vocab * c.d_model * (0 if c.tie_embeddings else 1) + \
        ((c.max_seq or 0) * c.d_model if c.pos_emb == "learned" else 0)
    other = (c.layers * per_layer_other + dense * dense_b + moe * (experts * expert_b + c.d_model * c.moe_experts)
             + _normmatrix_params(c, c.d_model) + embeddings)
    skipped = moe * (c.moe_experts - c.moe_active) * (expert_m + expert_b)
    total = matrix + other
    return {"matrix": matrix, "other": other, "total": total, "active": total - skipped - embeddings}


def weight_bytes(c: LLMConfig) -> float:
    """Bytes of all weights resident in memory."""
    counts = parameter_counts(c)
    return counts["matrix"] * element_bytes(c.weight_dtype) + counts["other"] * element_bytes(c.dtype)


def kv_bytes_per_token(c: LLMConfig) -> float:
    """KV-cache bytes of one token of one sequence, all layers, scales included (`workbench.llm.perf_model`)."""
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
