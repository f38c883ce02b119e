"""Numerics of generation: a cached run against recomputation without a cache, and a KV-cache format
against the fp32 cache.

- `recompute_logits`: the logits each generated token was chosen from, recomputed by one forward pass
  over the whole sequence without a cache: what a KV cache must reproduce.
- `cache_numerics`: a format's logits and tokens against the fp32 cache's greedy run. Logits are
  compared on the same inputs (the format's run is teacher-forced on the fp32 run's tokens), so the
  error measured is the cache's own and does not snowball once the two runs pick different tokens;
  tokens are compared as each run chose them freely.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.backends.numerics import compare_outputs
from workbench.errors import WorkbenchError
from workbench.llm.generate import Generation, generate
from workbench.models.tiny_gpt import TinyGPT


def recompute_logits(model: TinyGPT, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, new, vocab] (float32, CPU) that chose `tokens` [B, new] after `prompt` [B, T], from one
    uncached forward pass over prompt + tokens[:, :-1]."""
    device = next(model.parameters()).device
    sequence = torch.cat([prompt.to(device), tokens[:, :-1].to(device)], dim=1)
    with torch.inference_mode():
        logits = model(sequence)
    return logits[:, prompt.shape[1] - 1:].float().cpu()


def token_agreement(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, Any]:
    """How two runs' tokens [B, new] agree: `token_match` (fraction of equal tokens), `identical`, and
    `first_divergence` (the first step at which some sequence differs; None when identical)."""
    if reference.shape != candidate.shape:
        raise WorkbenchError(f"cannot compare tokens of shapes {tuple(reference.shape)} and {tuple(candidate.shape)}")
    equal = reference.cpu() == candidate.cpu()
    steps_equal = equal.all(dim=0)
    diverged = torch.nonzero(~steps_equal)
    return {
        "token_match": float(equal.double().mean()),
        "identical": bool(steps_equal.all()),
        "first_divergence": int(diverged[0, 0]) if len(diverged) else None,
    }


def vs_recompute(model: TinyGPT, prompt: torch.Tensor, run: Generation) -> dict[str, Any]:
    """A cached run (with kept logits) against recomputation without a cache on its own tokens: the
    logit errors (`workbench.backends.numerics.Numerics`) and whether every token is the recomputed argmax."""
    if run.logits is None:
        raise WorkbenchError("vs_recompute needs a generation run with keep_logits=True")
    expected = recompute_logits(model, prompt, run.tokens)
    return {**compare_outputs(expected, run.logits).to_dict(),
            "tokens": token_agreement(expected.argmax(dim=-1), run.tokens)}


def cache_numerics(model: TinyGPT, prompt: torch.Tensor, reference: Generation, candidate: Generation,
                   kv_dtype: str) -> dict[str, Any]:
    """A `kv_dtype` cache's run (`candidate`, greedy) against the fp32 cache's (`reference`, with kept
    logits) on the same prompt: logits teacher-forced on the reference tokens, and the free-run tokens."""
    if reference.logits is None:
        raise WorkbenchError("cache_numerics needs the reference run's logits (keep_logits=True)")
    forced = generate(model, prompt, reference.tokens.shape[1], kv_dtype=kv_dtype, force=reference.tokens,
                      keep_logits=True)
    assert forced.logits is not None
    return {"reference": "fp32 KV cache", "logits": compare_outputs(reference.logits, forced.logits).to_dict(),
            "tokens": token_agreement(reference.tokens, candidate.tokens)}
