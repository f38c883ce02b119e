"""Greedy and assisted generation of Hugging Face models through their own `generate()`, timed per token and
labelled per step.

`hf_generate(model, prompt, new_tokens, cache=...)` runs `model.generate()` (greedy: no sampling, one beam,
exactly `new_tokens` tokens: end-of-sequence tokens do not stop it) with a transformers cache of the given kind
(`workbench.llm.hf_cache`), so the model's own attention and cache code run. A streamer (`_StepClock`) sees
every step's tokens as they reach the host (`generate` copies them with `.cpu()`, a device sync): the clock
reading at each arrival closes a step, the prefill being the first (TTFT), so the timings are `StepTimes`
like tiny-gpt's. The same streamer labels the steps `prefill` / `decode N` (`workbench.profiling.phase`:
record_function, NVTX, JAX annotations) for every profiler.

`hf_assisted_generate(model, draft, prompt, new_tokens, k)` is transformers' assisted generation: the draft
proposes up to k tokens a round (constant schedule, no confidence cut-off), the target verifies them in one
pass and keeps the longest greedy-equal prefix plus its own next token. Proposed and accepted tokens come
from the candidate generator itself (the length of each proposal, and the `num_matches` transformers
reports to it). Rounds are labelled like `workbench.llm.speculative`'s, with `draft` and `verify` inside;
transformers' first round verifies the first proposal in the prefill pass, so that round is `prefill`.
`first_layers_draft` makes the draft of `workbench.llm.speculative` for an HF model: the same architecture
with the target's first layers, sharing its weights (embeddings, those layers, final norm, head).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from workbench.backends.devices import synchronize
from workbench.errors import WorkbenchError
from workbench.llm.generate import PREFILL, Generation, check_prompt, decode_label, model_device
from workbench.llm.hf_cache import CROPPABLE, make_cache, measured_cache_bytes
from workbench.llm.metrics import StepTimes
from workbench.llm.speculative import DRAFT, VERIFY, SpeculativeGeneration
from workbench.profiling.phases import phase


class _StepClock(BaseStreamer):
    """A streamer that times each step's tokens on arrival and keeps the current step's phase label open
    (see the module docstring). `generate` first puts the prompt, which starts nothing."""

    def __init__(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        self.boundaries: list[int] = []
        self.emitted: list[int] = []
        self._prompt_seen = False
        self._open: list[AbstractContextManager[Any]] = []

    def start(self) -> None:
        """Read the clock (the call starts) and open the prefill's label."""
        self.boundaries = [time.perf_counter_ns()]
        self.enter(PREFILL)

    def enter(self, label: str) -> None:
        """Open a nested label."""
        context = phase(label)
        context.__enter__()
        self._open.append(context)

    def exit(self) -> None:
        """Close the innermost open label."""
        self._open.pop().__exit__(None, None, None)

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        now = time.perf_counter_ns()
        self.exit()
        self.boundaries.append(now)
        self.emitted.append(int(value.shape[-1]) if value.dim() == 2 else 1)
        if sum(self.emitted) < self.new_tokens:
            self.enter(decode_label(len(self.emitted) - 1))

    def end(self) -> None:
        """Nothing: the last step closed with its tokens."""

    def close(self) -> None:
        """Close whatever is still open (a generation that raised)."""
        while self._open:
            self.exit()

    def times(self, batch: int) -> StepTimes:
        """The step timings of the finished generation."""
        return StepTimes.from_boundaries(self.boundaries, self.emitted, batch)


def check_hf_request(model: PreTrainedModel, prompt: torch.Tensor, new_tokens: int) -> tuple[int, int]:
    """(batch, prompt length) of a valid request, else WorkbenchError saying what is wrong."""
    batch, length = check_prompt(model, prompt, new_tokens)
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    if limit is not None and length + new_tokens > limit:
        raise WorkbenchError(f"generate: prompt {length} + new {new_tokens} tokens exceed the model's "
                             f"max_position_embeddings {limit}")
    return batch, length


@contextmanager
def _without_eos(*models: PreTrainedModel) -> Iterator[None]:
    """The models' generation configs without end-of-sequence tokens for the block (generate() fills what a
    call leaves unset from them), so every generation emits exactly the tokens asked for."""
    saved = [m.generation_config for m in models]
    try:
        for m in models:
            m.generation_config = copy.deepcopy(m.generation_config)
            m.generation_config.eos_token_id = None
        yield
    finally:
        for m, config in zip(models, saved, strict=True):
            m.generation_config = config


def _greedy_config(new_tokens: int, **options: Any) -> GenerationConfig:
    return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=None,
                            pad_token_id=0, use_cache=True, **options)


def hf_generate(model: PreTrainedModel, prompt: torch.Tensor, new_tokens: int, *, cache: str = "dynamic",
                keep_logits: bool = False) -> Generation:
    """Generate `new_tokens` tokens after `prompt` [batch, T] greedily with `model.generate()` and a `cache`
    kind (`workbench.llm.hf_cache.HF_CACHES`); with `keep_logits`, the raw logits each token was chosen from."""
    batch, length = check_hf_request(model, prompt, new_tokens)
    capacity = length + new_tokens - 1
    kv = make_cache(cache, model.config, capacity)
    clock = _StepClock(new_tokens)
    config = _greedy_config(new_tokens, return_dict_in_generate=keep_logits, output_logits=keep_logits)
    with torch.inference_mode(), _without_eos(model):
        synchronize(model_device(model))
        clock.start()
        try:
            out = model.generate(prompt, generation_config=config, cache=kv, streamer=clock)
        finally:
            clock.close()
    sequences = out.sequences if keep_logits else out
    tokens = sequences[:, length:]
    if tokens.shape[1] != new_tokens:
        raise WorkbenchError(f"generate: the model produced {tokens.shape[1]} tokens, not {new_tokens}")
    return Generation(
        tokens=tokens.cpu(),
        logits=torch.stack(out.logits, dim=1).float().cpu() if keep_logits else None,
        times=clock.times(batch),
        kv_cache_bytes=measured_cache_bytes(kv),
        context=capacity,
        kv_saturated=0,
    )


class _DraftCounter:
    """Wraps the candidate generator `generate()` makes for an assisted call: labels its proposals `draft`,
    counts the tokens proposed and the `num_matches` transformers reports as accepted, keeps it for its cache."""

    def __init__(self) -> None:
        self.proposed = 0
        self.accepted = 0
        self.generator: Any = None

    def attach(self, generator: Any) -> Any:
        self.generator = generator
        propose, update = generator.get_candidates, generator.update_candidate_strategy

        def get_candidates(input_ids: torch.Tensor, **kwargs: Any) -> Any:
            with phase(DRAFT):
                candidates, logits = propose(input_ids, **kwargs)
            self.proposed += candidates.shape[1] - input_ids.shape[1]
            return candidates, logits

        def update_candidate_strategy(input_ids: torch.Tensor, scores: torch.Tensor, num_matches: Any) -> None:
            self.accepted += int(num_matches)
            update(input_ids, scores, num_matches)

        generator.get_candidates, generator.update_candidate_strategy = get_candidates, update_candidate_strategy
        return generator

    def draft_cache_bytes(self) -> int:
        """Bytes of the draft's own cache (0 if it made none)."""
        cache = getattr(self.generator, "assistant_kwargs", {}).get("cache")
        return measured_cache_bytes(cache) if cache is not None else 0


@contextmanager
def _counted_candidates(model: PreTrainedModel, counter: _DraftCounter) -> Iterator[None]:
    """Within the block, `model.generate()` hands its candidate generator to `counter` (an instance
    attribute shadowing the method, removed after) and labels each target pass `verify`."""
    make = model._get_candidate_generator

    def counted(*args: Any, **kwargs: Any) -> Any:
        return counter.attach(make(*args, **kwargs))

    model._get_candidate_generator = counted
    passes: list[AbstractContextManager[Any]] = []

    def enter(module: Any, args: Any) -> None:
        passes.append(phase(VERIFY))
        passes[-1].__enter__()

    def exit_(module: Any, args: Any, output: Any) -> None:
        passes.pop().__exit__(None, None, None)

    hooks = [model.register_forward_pre_hook(enter), model.register_forward_hook(exit_)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        del model._get_candidate_generator


def hf_assisted_generate(model: PreTrainedModel, draft: PreTrainedModel, prompt: torch.Tensor, new_tokens: int,
                         k: int, *, cache: str = "dynamic") -> SpeculativeGeneration:
    """Generate `new_tokens` tokens after `prompt` [1, T] with transformers' assisted generation, `draft`
    proposing up to `k` tokens a round (see the module docstring); `cache` is the target's cache kind."""
    batch, length = check_hf_request(model, prompt, new_tokens)
    if batch != 1:
        raise WorkbenchError(f"speculative decoding runs one sequence at a time; the prompt has batch {batch}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise WorkbenchError(f"speculative: k (draft tokens per round) must be an integer >= 1, got {k!r}")
    if cache not in CROPPABLE:
        raise WorkbenchError(f"speculative: assisted generation crops the cache back to the accepted tokens; "
                             f"cache {cache!r} cannot be cropped (use {' or '.join(sorted(CROPPABLE))})")
    target_vocab = model.config.get_text_config(decoder=True).vocab_size
    draft_vocab = draft.config.get_text_config(decoder=True).vocab_size
    if draft_vocab != target_vocab:
        raise WorkbenchError(f"speculative: the draft's vocabulary ({draft_vocab}) differs from the target's "
                             f"({target_vocab})")
    kv = make_cache(cache, model.config, length + new_tokens - 1)
    clock, counter = _StepClock(new_tokens), _DraftCounter()
    config = _greedy_config(new_tokens)
    with torch.inference_mode(), _without_eos(model, draft), _assistant_settings(draft, k), \
            _counted_candidates(model, counter):
        synchronize(model_device(model))
        clock.start()
        try:
            out = model.generate(prompt, generation_config=config, cache=kv, streamer=clock, assistant_model=draft)
        finally:
            clock.close()
    tokens = out[:, length:]
    if tokens.shape[1] != new_tokens:
        raise WorkbenchError(f"generate: the model produced {tokens.shape[1]} tokens, not {new_tokens}")
    return SpeculativeGeneration(tokens=tokens.cpu(), times=clock.times(1), proposed=counter.proposed,
                                 accepted=counter.accepted, kv_cache_bytes=measured_cache_bytes(kv),
                                 draft_kv_cache_bytes=counter.draft_cache_bytes())


@contextmanager
def _assistant_settings(draft: PreTrainedModel, k: int) -> Iterator[None]:
    """The draft proposes exactly up to `k` tokens a round for the block: a constant schedule and no
    confidence cut-off (the candidate generator reads them from the draft's generation config)."""
    saved = draft.generation_config
    draft.generation_config = copy.deepcopy(saved)
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        draft.generation_config = saved


def first_layers_draft(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A draft of `model`'s architecture with its first `layers` layers (1..all; all gives a draft equal to
    the target, which accepts every proposal), sharing the target's weights: same embeddings, those layers,
    the final norm and the head. Per-layer config lists (layer types) are cut to the first `layers`."""
    config = copy.deepcopy(model.config)
    text = config.get_text_config(decoder=True)
    total = text.num_hidden_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= total:
        raise WorkbenchError(f"speculative: draft layers must be in 1..{total} (the target has {total}), "
                             f"got {layers!r}")
    for name, value in list(vars(text).items()):
        if isinstance(value, list | tuple) and len(value) == total:
            setattr(text, name, type(value)(value[:layers]))
    text.num_hidden_layers = layers
    draft = type(model)(config).to(model_device(model)).eval()
    missing, _ = draft.load_state_dict(model.state_dict(), strict=False, assign=True)
    if missing:
        raise WorkbenchError(f"speculative: a {layers}-layer draft of {type(model).__name__} does not map onto "
                             f"the target's weights (missing {', '.join(missing[:3])})")
    return draft


def hf_forced_logits(model: PreTrainedModel, prompt: torch.Tensor, tokens: torch.Tensor, *,
                     cache: str) -> torch.Tensor:
    """Logits [B, new, vocab] (float32, CPU) of a `cache` kind's run teacher-forced on `tokens` [B, new] after
    `prompt`: the prompt in one pass, then each of tokens[:, :-1] alone, as `generate()` feeds them. Two
    cache kinds' logits then compare position by position on the same inputs."""
    device = model_device(model)
    kv = make_cache(cache, model.config, prompt.shape[1] + tokens.shape[1] - 1)
    with torch.inference_mode():
        steps = [model(prompt, cache=kv, use_cache=True).logits[:, -1]]
        for step in range(tokens.shape[1] - 1):
            steps.append(model(tokens[:, step:step + 1].to(device), cache=kv, use_cache=True).logits[:, -1])
    return torch.stack(steps, dim=1).float().cpu()


class LogitsOf(torch.nn.Module):
    """An HF causal LM as a module whose forward(token ids) returns the logits tensor, for the generation
    numerics (`workbench.llm.numerics.recompute_logits`) written for modules that return logits."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, use_cache=False).logits
