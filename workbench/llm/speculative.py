"""Greedy speculative decoding: a draft model proposes k tokens, the target verifies them in one pass.

Each round (labelled `decode N`, with `draft` and `verify` inside) the draft extends the sequence by
up to k greedy tokens from its own KV cache; the target then feeds the last accepted token and the k
proposals in one forward pass over its cache, which gives its own greedy choice after each of them.
The longest prefix of proposals equal to the target's choices is accepted, and the target's choice
after it (a correction, or a bonus token when all k were accepted) is appended: 1 to k + 1 tokens per
round. Both caches are then truncated to the accepted tokens. Every emitted token is the target's
greedy choice given the tokens before it, so the output is that of greedy decoding of the target
(`generate`), up to the floating-point differences between scoring one position and several at once,
which only matter at a near-tie of the top two logits.

The default draft is the target's own first layers (`first_layers_draft`: early exit into the
target's final norm and head, sharing its weights). With the built-in models' seeded random weights,
a separately seeded smaller model agrees with the target only at chance (about 1 / vocab), while the
target's first layers, which feed the same residual stream, agree far more often; and a layer-subset
draft costs no extra weights. Any TinyGPT with the same vocabulary can be the draft.

One sequence at a time (batch 1): sequences of a batch accept different numbers of tokens, and these
caches are not ragged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from workbench.backends.devices import synchronize
from workbench.errors import WorkbenchError
from workbench.llm.generate import PREFILL, check_request, decode_label, model_device
from workbench.llm.kv_cache import KVCache
from workbench.llm.metrics import StepTimes
from workbench.models.tiny_gpt import TinyGPT
from workbench.profiling.phases import phase

DRAFT, VERIFY = "draft", "verify"
"""Labels of a round's two parts, nested in its `decode N`."""


@dataclass(frozen=True)
class SpeculativeGeneration:
    """The outcome of a speculative generation: `tokens` [1, new] (int64, CPU), the round timings (step 0
    the prefill, then one step per round, emitting 1..k+1 tokens), the draft tokens proposed and accepted,
    and the bytes allocated for the target's and the draft's KV caches."""

    tokens: torch.Tensor
    times: StepTimes
    proposed: int
    accepted: int
    kv_cache_bytes: int
    draft_kv_cache_bytes: int

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens; None when no round proposed any."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def rounds(self) -> int:
        """Draft-and-verify rounds after the prefill."""
        return len(self.times.step_ns) - 1


def first_layers_draft(target: TinyGPT, layers: int) -> TinyGPT:
    """A draft made of the target's embeddings, its first `layers` blocks, its final norm and its head:
    the same modules (no copy), run with an early exit."""
    total = len(target.blocks)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers < total:
        raise WorkbenchError(f"speculative: draft layers must be in 1..{total - 1} (the target has {total}), "
                             f"got {layers!r}")
    draft = TinyGPT.__new__(TinyGPT)
    nn.Module.__init__(draft)
    draft.max_seq = target.max_seq
    draft.tok_emb, draft.pos_emb = target.tok_emb, target.pos_emb
    draft.blocks = nn.ModuleList(list(target.blocks[:layers]))
    draft.ln_f, draft.lm_head = target.ln_f, target.lm_head
    return draft.eval()


def speculative_generate(target: TinyGPT, draft: TinyGPT, prompt: torch.Tensor, new_tokens: int, k: int, *,
                         kv_dtype: str = "fp32", draft_kv_dtype: str | None = None) -> SpeculativeGeneration:
    """Generate `new_tokens` tokens after `prompt` [1, T] with `draft` proposing up to `k` tokens a round
    (see the module docstring). The caches use `kv_dtype` (the draft's `draft_kv_dtype`, default the same)."""
    batch, length = check_request(target, prompt, new_tokens)
    if batch != 1:
        raise WorkbenchError(f"speculative decoding runs one sequence at a time; the prompt has batch {batch}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise WorkbenchError(f"speculative: k (draft tokens per round) must be an integer >= 1, got {k!r}")
    if draft.lm_head.out_features != target.lm_head.out_features:
        raise WorkbenchError(f"speculative: the draft's vocabulary ({draft.lm_head.out_features}) differs from "
                             f"the target's ({target.lm_head.out_features})")
    device = model_device(target)
    end = length + new_tokens  # the sequence's final length
    with torch.inference_mode():
        target_cache = KVCache.for_model(target, 1, end - 1, kv_dtype)
        draft_cache = KVCache.for_model(draft, 1, end - 1, draft_kv_dtype or kv_dtype)
        seq = torch.empty(1, end, dtype=torch.int64, device=device)
        seq[:, :length] = prompt
        synchronize(device)
        boundaries, emitted = [time.perf_counter_ns()], [1]
        with phase(PREFILL):
            seq[:, length] = target(prompt, cache=target_cache)[:, -1].argmax(dim=-1)
            draft(prompt, cache=draft_cache)
            synchronize(device)
        boundaries.append(time.perf_counter_ns())
        filled, proposed, accepted, round_ = length + 1, 0, 0, 0
        while filled < end:
            kk = min(k, end - filled - 1)  # never propose past the last token
            with phase(decode_label(round_)):
                if kk:
                    with phase(DRAFT):
                        _propose(draft, draft_cache, seq, filled, kk)
                with phase(VERIFY):
                    n_accepted = _verify(target, target_cache, seq, filled, kk)
                    draft_cache.truncate(min(draft_cache.length, filled + n_accepted))
                synchronize(device)
            boundaries.append(time.perf_counter_ns())
            emitted.append(n_accepted + 1)
            filled += n_accepted + 1
            proposed += kk
            accepted += n_accepted
            round_ += 1
    return SpeculativeGeneration(
        tokens=seq[:, length:].cpu(),
        times=StepTimes.from_boundaries(boundaries, emitted, 1),
        proposed=proposed,
        accepted=accepted,
        kv_cache_bytes=target_cache.nbytes(),
        draft_kv_cache_bytes=draft_cache.nbytes(),
    )


def _propose(draft: TinyGPT, cache: KVCache, seq: torch.Tensor, filled: int, k: int) -> None:
    """Write k greedy draft tokens into seq[filled:filled + k], first feeding the draft what it has not
    seen of seq[:filled] (one token, or two after a round that accepted everything)."""
    pending = seq[:, cache.length:filled]
    for j in range(k):
        seq[:, filled + j] = draft(pending, cache=cache)[:, -1].argmax(dim=-1)
        pending = seq[:, filled + j:filled + j + 1]


def _verify(target: TinyGPT, cache: KVCache, seq: torch.Tensor, filled: int, k: int) -> int:
    """Score the last accepted token and the k proposals in one target pass; keep the accepted prefix,
    write the target's next choice after it, truncate the cache to the accepted tokens; return how many
    proposals were accepted."""
    choices = target(seq[:, filled - 1:filled + k], cache=cache).argmax(dim=-1)  # [1, k + 1]
    matches = (seq[0, filled:filled + k] == choices[0, :k]).to(torch.int64)
    n_accepted = int(matches.cumprod(dim=0).sum())  # a host sync: the round's length depends on it
    seq[:, filled + n_accepted] = choices[:, n_accepted]
    cache.truncate(filled + n_accepted)
    return n_accepted
