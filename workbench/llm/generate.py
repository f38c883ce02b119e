"""Greedy autoregressive generation with a KV cache: one prefill over the prompt, then decode steps.

`generate(model, prompt, new_tokens)` runs tiny-gpt (`TinyGPT.forward(tokens, cache=...)`): the
prefill feeds the whole prompt, fills the cache and emits the first token; each decode step feeds the
previous token alone and emits the next. Every step is labelled with `phase` (`prefill`, `decode N`)
so torch.profiler, NVTX (Nsight) and JAX timelines show it, and timed on the host after a device sync
(the time at which the token could be streamed to a user), into `StepTimes`.

Greedy decoding takes the argmax of the logits (the lowest index on ties), so a run is deterministic.
With `force`, the given tokens are fed instead of the model's choices (teacher forcing): the logits
of two cache formats can then be compared position by position on the same inputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from workbench.backends.devices import synchronize
from workbench.errors import WorkbenchError
from workbench.llm.kv_cache import KVCache
from workbench.llm.metrics import StepTimes
from workbench.models.tiny_gpt import TinyGPT
from workbench.profiling.phases import phase

PREFILL = "prefill"
"""Label of the prefill step."""


def decode_label(n: int) -> str:
    """Label of the n-th (0-based) decode step, which emits output token n + 1 (the prefill emits token 0)."""
    return f"decode {n}"


@dataclass(frozen=True)
class Generation:
    """The outcome of one generation of `batch` sequences.

    `tokens` [batch, new] are the greedy choices (int64, CPU); `logits` [batch, new, vocab] (float32,
    CPU) the logits each was chosen from, when kept; `times` the step timings; `kv_cache_bytes` the
    bytes allocated for the cache (measured from its tensors), which held `context` positions at most;
    `kv_saturated` the values clipped by static int8 scales.
    """

    tokens: torch.Tensor
    logits: torch.Tensor | None
    times: StepTimes
    kv_cache_bytes: int
    context: int
    kv_saturated: int


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's weights."""
    return next(model.parameters()).device


def check_prompt(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> tuple[int, int]:
    """(batch, prompt length) of a request whose prompt and token count are valid for any model (an int64
    [batch, length] tensor on the model's device, new tokens >= 1), else WorkbenchError saying what is wrong."""
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.dtype != torch.int64:
        raise WorkbenchError("generate: the prompt must be an int64 tensor [batch, prompt length] of token ids")
    batch, length = prompt.shape
    if batch < 1 or length < 1:
        raise WorkbenchError(f"generate: empty prompt of shape {tuple(prompt.shape)}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise WorkbenchError(f"generate: new tokens must be an integer >= 1, got {new_tokens!r}")
    if prompt.device != model_device(model):
        raise WorkbenchError(f"generate: the prompt is on {prompt.device}, the model on {model_device(model)}")
    return batch, length


def check_request(model: TinyGPT, prompt: torch.Tensor, new_tokens: int) -> tuple[int, int]:
    """(batch, prompt length) of a valid request, else WorkbenchError saying what is wrong."""
    batch, length = check_prompt(model, prompt, new_tokens)
    if length + new_tokens - 1 > model.max_seq:
        raise WorkbenchError(f"generate: prompt {length} + new {new_tokens} - 1 positions exceed the model's "
                             f"max_seq {model.max_seq}")
    return batch, length


def generate(model: TinyGPT, prompt: torch.Tensor, new_tokens: int, *, kv_dtype: str = "fp32",
             force: torch.Tensor | None = None, keep_logits: bool = False) -> Generation:
    """Generate `new_tokens` tokens after `prompt` [batch, T] greedily, with a KV cache in `kv_dtype`
    (see `workbench.llm.kv_cache.CACHE_FORMATS`); with `force` [batch, new_tokens], feed those tokens instead
    of the choices (the last one is never fed). The prompt must be on the model's device."""
    batch, length = check_request(model, prompt, new_tokens)
    device = model_device(model)
    if force is not None and tuple(force.shape) != (batch, new_tokens):
        raise WorkbenchError(f"generate: forced tokens must be [{batch}, {new_tokens}], got {tuple(force.shape)}")
    with torch.inference_mode():
        cache = KVCache.for_model(model, batch, length + new_tokens - 1, kv_dtype)
        tokens = torch.empty(batch, new_tokens, dtype=torch.int64, device=device)
        vocab = model.lm_head.out_features
        logits_out = torch.empty(batch, new_tokens, vocab, dtype=torch.float32, device=device) if keep_logits else None
        fed = force.to(device) if force is not None else tokens
        synchronize(device)
        boundaries = [time.perf_counter_ns()]
        for step in range(new_tokens):
            with phase(PREFILL if step == 0 else decode_label(step - 1)):
                inputs = prompt if step == 0 else fed[:, step - 1:step]
                logits = model(inputs, cache=cache)[:, -1]
                tokens[:, step] = logits.argmax(dim=-1)
                if logits_out is not None:
                    logits_out[:, step] = logits.float()
                synchronize(device)
            boundaries.append(time.perf_counter_ns())
    return Generation(
        tokens=tokens.cpu(),
        logits=None if logits_out is None else logits_out.cpu(),
        times=StepTimes.from_boundaries(boundaries, [1] * new_tokens, batch),
        kv_cache_bytes=cache.nbytes(),
        context=cache.capacity,
        kv_saturated=cache.saturated(),
    )
