"""Generation runs of Hugging Face models (`hf:<id or folder>`, `hf-config:<preset>`) captured into bundles:
the tiny-gpt sweep of `workbench.llm.run` with the model's own `generate()`, attention and caches.

`run_hf_generation(settings)` sweeps cache kinds (`workbench.llm.hf_cache.HF_CACHES`) × batch × prompt ×
new (and assisted generation when `speculative` > 0: the draft is the same architecture with the target's
first `draft_layers` layers, sharing its weights, `workbench.llm.hf_generate.first_layers_draft`). Every run
goes through the same steps as a tiny-gpt run (numerics, interleaved timing, one generation under
torch.profiler inside `measure`, its steps labelled `prefill` / `decode N`, with `draft` / `verify` in
assisted rounds), into the same bundles and experiment record. Numerics: each greedy run against
recomputation without a cache (`vs_recompute`), a quantized cache's logits teacher-forced against the
dynamic fp32 cache's (`vs_fp32_cache`), an assisted run's tokens against greedy decoding (`matches_greedy`).

run.json's `llm` gains `cache` (the kind), `kv_cache_predicted_from` (what the performance model counted:
K and V of the kv heads, or MLA's compressed latent, which is what transformers' DeepSeek attention caches)
and `cache_capacity`; `kv_cache_bytes` is measured from the cache object after generation and
`kv_cache_bytes_predicted` comes from `workbench.llm.perf_model` reading the model's HF config.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.backends.devices import resolve_device
from workbench.errors import WorkbenchError
from workbench.experiment import torch_threads
from workbench.llm.generate import Generation
from workbench.llm.hf_cache import CROPPABLE, HF_CACHES, cache_dtype, check_cache_kind, predicted_cache_bytes
from workbench.llm.hf_generate import (
    LogitsOf,
    first_layers_draft,
    hf_assisted_generate,
    hf_forced_logits,
    hf_generate,
)
from workbench.llm.numerics import token_agreement
from workbench.llm.perf_model import LLMConfig
from workbench.llm.perf_model.hf_config import is_hf_ref, llm_config_from_hf
from workbench.llm.run import GREEDY, SPECULATIVE, SWEPT, GenerateSettings, Point, SweepResult, _Run, _Sweep
from workbench.models import LoadedModel, load_model
from workbench.paths import checked_root
from workbench.profiling import phase
from workbench.runner import NullProgress, Progress
from workbench.trace.schema import PHASE_LOAD
from workbench.trace.store.bundle import new_run_id
from workbench.trace.store.records import RunInfo

REFERENCE_CACHE = "dynamic"
"""The cache a quantized cache's numerics are compared with."""


@dataclass(frozen=True)
class HFGenerateSettings(GenerateSettings):
    """`GenerateSettings` for an HF model, plus `cache`: the cache kinds to sweep. The model runs its own
    attention (so `attention` stays unset) and caches in its weights' dtype (so `kv` stays fp32);
    `draft_layers` may equal the model's layers (a draft identical to the target)."""

    cache: tuple[str, ...] = ("dynamic",)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "cache", tuple(self.cache))
        if not is_hf_ref(self.model):
            raise WorkbenchError(f"generate: {self.model!r} is not an hf: or hf-config: model")
        if self.attention != (None,):
            raise WorkbenchError("generate: --attention picks tiny-gpt's attention; an HF model runs its own "
                                 "(change it with --set, e.g. kv_heads=N)")
        if self.kv != ("fp32",):
            raise WorkbenchError("generate: --kv sets tiny-gpt's cache format; an HF model caches in its weights' "
                                 f"dtype: choose its cache with --cache ({', '.join(HF_CACHES)})")
        if not self.cache:
            raise WorkbenchError("generate: cache needs at least one value")
        repeated = sorted({c for c in self.cache if self.cache.count(c) > 1})
        if repeated:
            raise WorkbenchError(f"generate: cache value(s) listed more than once: {', '.join(repeated)}")
        for kind in self.cache:
            check_cache_kind(kind)
        if self.speculative and any(kind not in CROPPABLE for kind in self.cache):
            raise WorkbenchError("generate: assisted generation crops the cache back to the accepted tokens; use "
                                 f"--cache {' or '.join(sorted(CROPPABLE))} with --speculative")


@dataclass(frozen=True)
class HFPoint(Point):
    """A run's configuration with its cache kind."""

    cache: str = "dynamic"

    def name(self, attention: str, swept: frozenset[str], k: int) -> str:
        """The variant name: attention and cache kind, the swept sizes, `-specK` for assisted runs."""
        parts = [attention, self.cache]
        parts += [f"{key[0]}{getattr(self, key)}" for key in SWEPT if key in swept]
        if self.decoding == SPECULATIVE:
            parts.append(f"spec{k}")
        return "-".join(parts)


@dataclass
class _HFRun(_Run):
    """A run of an HF model; `model` and `draft` are transformers models."""

    def once(self) -> Any:
        p = self.point
        if self.draft is not None:
            return hf_assisted_generate(self.model, self.draft, self.prompt, p.new, self.k, cache=p.cache)
        return hf_generate(self.model, self.prompt, p.new, cache=p.cache)

    def same_point(self, other: _Run) -> bool:
        return super().same_point(other) and self.point.cache == other.point.cache


def hf_model_of(loaded: LoadedModel) -> Any:
    """The transformers causal LM of an `hf:` / `hf-config:` LoadedModel; WorkbenchError when it has none
    that can generate."""
    from transformers import PreTrainedModel

    for candidate in (getattr(loaded, "hf_model", None), loaded.module, getattr(loaded.module, "model", None)):
        if isinstance(candidate, PreTrainedModel) and candidate.can_generate():
            return candidate
    raise WorkbenchError(f"generate: model {loaded.name!r} has no language-model head to generate with "
                         "(a ...ForCausalLM architecture)")


def run_hf_generation(settings: HFGenerateSettings, root: str | Path | None = None,
                      progress: Progress | None = None) -> SweepResult:
    """Run the sweep `settings` describes (module docstring) like `workbench.llm.run.run_generation`: one
    bundle per run and the experiment record under `root`, together or not at all."""
    root = checked_root(root, writing=True)
    device = resolve_device(settings.device)
    with torch_threads(settings.threads):
        timings: dict[str, float] = {}
        with phase(PHASE_LOAD, timings):
            loaded = load_model(settings.model, **settings.model_overrides)
            model = hf_model_of(loaded)
            if device.type != "cpu":
                model = model.to(device)
            layers = model.config.get_text_config(decoder=True).num_hidden_layers
            if settings.speculative and settings.draft_layers > layers:
                raise WorkbenchError(f"generate: draft layers must be in 1..{layers} (the model has {layers} "
                                     f"layers), got {settings.draft_layers}")
            draft = first_layers_draft(model, settings.draft_layers) if settings.speculative else None
            llm = llm_config_from_hf(model.config, name=loaded.name)
        return _HFSweep(settings, root, progress or NullProgress(), loaded, model, draft, llm, device,
                        timings).run()


class _HFSweep(_Sweep):
    """The tiny-gpt sweep's steps for an HF model: its runs, numerics, predictions and record fields."""

    def __init__(self, settings: HFGenerateSettings, root: Path, progress: Progress, loaded: LoadedModel,
                 model: Any, draft: Any, llm: LLMConfig, device: torch.device, timings: dict[str, float]) -> None:
        super().__init__(settings, root, progress, {None: (loaded, model)}, device, timings)
        self.draft = draft
        self.llm = llm
        self.dtype = cache_dtype(model)

    def attention(self, loaded: LoadedModel) -> str:
        return self.llm.attention

    def new_runs(self) -> list[_Run]:
        s = self.settings
        decodings = (GREEDY, SPECULATIVE) if s.speculative else (GREEDY,)
        points = [HFPoint(None, "fp32", b, p, n, d, cache=c)
                  for c, b, p, n, d in itertools.product(s.cache, s.batch, s.prompt, s.new, decodings)]
        return [self._new_hf_run(point) for point in points]

    def _new_hf_run(self, point: HFPoint) -> _HFRun:
        s = self.settings
        loaded, model = self.models[None]
        swept = frozenset(key for key in SWEPT if len(getattr(s, key)) > 1)
        name = point.name(self.llm.attention, swept, s.speculative)
        prompt = loaded.make_inputs(point.batch, point.prompt)[0].to(self.device)
        run = _HFRun(point, name, new_run_id(loaded.name, name), loaded, model, prompt)
        if point.decoding == SPECULATIVE:
            run.draft, run.k = self.draft, s.speculative
        return run

    def generation(self, run: _Run, *, keep_logits: bool = False, reference: bool = False) -> Generation:
        """One greedy generation with `run`'s cache, or (`reference`) with the dynamic cache."""
        cache = REFERENCE_CACHE if reference else run.point.cache
        return hf_generate(run.model, run.prompt, run.point.new, cache=cache, keep_logits=keep_logits)

    def logits_model(self, run: _Run) -> Any:
        return LogitsOf(run.model)

    def checks_reference(self, run: _Run) -> bool:
        return run.point.cache.startswith("quantized")

    def vs_reference(self, run: _Run, own: Generation) -> dict[str, Any]:
        """A quantized cache's logits teacher-forced on the dynamic cache's tokens, and its free-run tokens."""
        from workbench.backends.numerics import compare_outputs

        reference = self._reference(run)
        assert reference.logits is not None
        forced = hf_forced_logits(run.model, run.prompt, reference.tokens, cache=run.point.cache)
        return {"reference": f"{REFERENCE_CACHE} cache ({self.dtype})",
                "logits": compare_outputs(reference.logits, forced).to_dict(),
                "tokens": token_agreement(reference.tokens, own.tokens)}

    def predicted_kv_bytes(self, run: _Run) -> int | None:
        return self._prediction(run)[0]

    def _prediction(self, run: _Run) -> tuple[int | None, str]:
        p = run.point
        return predicted_cache_bytes(self.llm, run.model.config, p.cache, batch=p.batch, context=run.context,
                                     capacity=run.context, dtype=self.dtype)

    def _llm_info(self, run: _Run) -> dict[str, Any] | None:
        info = super()._llm_info(run)
        if info is not None:
            info.update(kv=self.dtype, cache=run.point.cache, cache_capacity=run.context,
                        kv_cache_predicted_from=self._prediction(run)[1],
                        weights=getattr(run.loaded, "weights", None))
        return info

    def info(self, run: _Run) -> RunInfo:
        record = super().info(run)
        assert record.variant is not None
        record.variant.update(cache=run.point.cache, kv=self.dtype)
        return record
