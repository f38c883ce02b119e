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

Modules: `config` (the `LLMConfig`, presets, parsing), `sizes` (parameters, weights, KV cache, memory
footprint), `cost` (FLOPs and bytes of one pass), `timing` (roofline time, decode steps, crossover batch),
`speculative` (speculative decoding), `projection` (scenarios, tables, what `workbench llm-model` reports).
The names below are the model's public API.
"""

from workbench.llm.perf_model.config import (
    CONFIG_KEYS,
    KV_PRECISIONS,
    MEMORY_FRACTION,
    PRESETS,
    LLMConfig,
    make_config,
    parse_config,
)
from workbench.llm.perf_model.cost import Cost, attended_pairs, expected_experts, forward_cost
from workbench.llm.perf_model.projection import (
    attention_variants,
    default_contexts,
    device_summary,
    kv_cache_table,
    llm_projection,
    parse_sweep,
    prediction_errors,
    project,
)
from workbench.llm.perf_model.sizes import (
    activation_peak_bytes,
    element_bytes,
    kv_bytes,
    kv_bytes_per_token,
    max_context,
    memory_bytes,
    parameter_counts,
    weight_bytes,
)
from workbench.llm.perf_model.speculative import expected_tokens, speculative_projection, speculative_speedup
from workbench.llm.perf_model.timing import crossover_batch, pass_time, predicted_decode_steps

__all__ = [
    "CONFIG_KEYS", "KV_PRECISIONS", "MEMORY_FRACTION", "PRESETS", "Cost", "LLMConfig", "activation_peak_bytes",
    "attended_pairs", "attention_variants", "crossover_batch", "default_contexts", "device_summary",
    "element_bytes", "expected_experts", "expected_tokens", "forward_cost", "kv_bytes", "kv_bytes_per_token",
    "kv_cache_table", "llm_projection", "make_config", "max_context", "memory_bytes", "parameter_counts",
    "parse_config", "parse_sweep", "pass_time", "predicted_decode_steps", "prediction_errors", "project",
    "speculative_projection", "speculative_speedup", "weight_bytes",
]
