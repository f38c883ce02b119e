"""FLOPs and bytes of one forward pass (`Cost`, `forward_cost`), counted as `workbench.llm.perf_model` says."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import WorkbenchError
from workbench.llm.perf_model.config import LOGITS, LLMConfig
from workbench.llm.perf_model.sizes import (
    attention_matrices,
    element_bytes,
    kv_bytes_per_token,
    matrix_params,
    mlp_matrices,
    moe_layers,
    parameter_counts,
)


@dataclass(frozen=True)
class Cost:
    """Work of one forward pass: FLOPs by part and the bytes it moves (see `workbench.llm.perf_model`)."""

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
    cached ones (`workbench.llm.perf_model`). `logits`: "all" new tokens get logits, or only the "last" of each
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
    for name, rows, cols in attention_matrices(c):
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

    dense, moe = c.layers - moe_layers(c), moe_layers(c)
    dense_m = matrix_params(mlp_matrices(c, c.ffn_hidden), c.bias)[0]
    expert_m, expert_b = matrix_params(mlp_matrices(c, c.moe_hidden), c.bias) if c.moe_experts else (0, 0)
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
