"""Generation runs captured into bundles, like `workbench.experiment` does for inference variants.

`run_generation(settings)` sweeps the product of attention kinds × KV-cache formats × batch sizes ×
prompt lengths × new-token counts (and greedy / speculative decoding when `speculative` > 0); each
point is one run and one bundle, grouped by an experiment record. For every run:

1. numerics: one greedy generation with kept logits, checked against recomputation without a cache
   (`vs_recompute`) and, for formats other than fp32, against the fp32 cache (`vs_fp32_cache`); a
   speculative run is checked to reproduce the target's greedy tokens (`matches_greedy`);
2. timing: `warmup` + `repeats` generations per run, the runs interleaved round-robin by the shared
   benchmark harness so machine drift hits all alike; each generation records its step times;
3. capture: one more generation under torch.profiler, inside a `measure` phase, its steps labelled
   `prefill` / `decode N` (with `draft` / `verify` inside for speculative rounds).

run.json then holds, besides the usual fields (model, variant, device, environment, "benchmark" = the
latency of whole generations), `"llm"`: TTFT, TPOT median/p99, the inter-token latency distribution,
tokens/s, KV-cache bytes measured from the cache tensors and predicted by `kv_cache_bytes`, peak memory
(the generation's own allocations: cache and activations, not the weights), numerics and, for
speculative runs, acceptance rate and speedup over the greedy run of the same point; and
`"generation"`: every timed generation's step times, so views can redraw them.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.analysis.breakdown import phase_window
from workbench.backends.benchmark import LatencyStats, WallClockTimer, Workload
from workbench.backends.devices import resolve_device, synchronize
from workbench.errors import WorkbenchError
from workbench.experiment import model_info, torch_threads
from workbench.llm.generate import Generation, generate
from workbench.llm.kv_cache import CACHE_FORMATS, kv_cache_bytes
from workbench.llm.metrics import StepTimes, llm_metrics, peak_allocated_bytes
from workbench.llm.numerics import cache_numerics, token_agreement, vs_recompute
from workbench.llm.speculative import SpeculativeGeneration, first_layers_draft, speculative_generate
from workbench.models import LoadedModel, load_model
from workbench.models.tiny_gpt import ATTENTION_KINDS, TinyGPT, attention_kind
from workbench.paths import checked_root
from workbench.profiling import ProfileSettings, attach_flops, environment, phase
from workbench.profiling.session import SessionContext, open_session
from workbench.runner import BundleFiles, ExperimentResult, NullProgress, Progress, RunFailure, Runner
from workbench.trace import Trace, read_trace
from workbench.trace.schema import PHASE_LOAD, PHASE_MEASURE
from workbench.trace.store.bundle import new_run_id, utc_now
from workbench.trace.store.records import GENERATION, ExperimentRecord, RunInfo

GREEDY, SPECULATIVE = "greedy", "speculative"
SWEPT = ("batch", "prompt", "new")
"""Settings that name a run's variant only when the sweep has more than one value of them."""


def _positive_ints(name: str, values: tuple[int, ...]) -> None:
    if not values:
        raise WorkbenchError(f"generate: {name} needs at least one value")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkbenchError(f"generate: {name} values must be integers >= 1, got {value!r}")


@dataclass(frozen=True)
class GenerateSettings:
    """What to generate. Each of attention, kv, batch, prompt and new is a tuple of values to sweep;
    attention None keeps the model config's own (mha unless overridden); with a kind given, a kv_heads
    override applies to gqa only. `speculative` k > 0 adds a
    speculative run (draft: the target's first `draft_layers` layers) beside each greedy one (batch 1
    only). `warmup` and `repeats` count untimed and timed generations per run; `profile_settings` gives
    the profiler's recording options (its step counts are not used: one generation is captured).
    `threads` sets torch's intra-op threads (restored after); `model_overrides` go to `load_model`."""

    model: str = "tiny-gpt"
    attention: tuple[str | None, ...] = (None,)
    kv: tuple[str, ...] = ("fp32",)
    batch: tuple[int, ...] = (1,)
    prompt: tuple[int, ...] = (128,)
    new: tuple[int, ...] = (64,)
    speculative: int = 0
    draft_layers: int = 1
    device: str = "cpu"
    warmup: int = 1
    repeats: int = 5
    profile: bool = True
    profile_settings: ProfileSettings = field(default_factory=ProfileSettings)
    threads: int | None = None
    model_overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("attention", "kv", "batch", "prompt", "new"):
            values = tuple(getattr(self, key))
            object.__setattr__(self, key, values)
            repeated = sorted({str(v) for v in values if values.count(v) > 1})
            if repeated:
                raise WorkbenchError(f"generate: {key} value(s) listed more than once: {', '.join(repeated)}")
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        if not self.attention or not self.kv:
            raise WorkbenchError("generate: attention and kv need at least one value each")
        for value in self.attention:
            if value is not None and value not in ATTENTION_KINDS:
                raise WorkbenchError(f"generate: unknown attention {value!r}; valid: {', '.join(ATTENTION_KINDS)}")
        for value in self.kv:
            if value not in CACHE_FORMATS:
                raise WorkbenchError(f"generate: unknown KV-cache dtype {value!r}; valid: {', '.join(CACHE_FORMATS)}")
        for key in ("batch", "prompt", "new"):
            _positive_ints(key, getattr(self, key))
        for key, minimum in (("speculative", 0), ("draft_layers", 1), ("warmup", 0), ("repeats", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise WorkbenchError(f"generate: {key} must be an integer >= {minimum}, got {value!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise WorkbenchError(f"generate: threads must be an integer >= 1, got {self.threads!r}")
        if self.speculative and any(b != 1 for b in self.batch):
            raise WorkbenchError("generate: speculative decoding runs one sequence at a time; use batch 1")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for run.json and the experiment record)."""
        return asdict(self)


@dataclass(frozen=True)
class Point:
    """One run's configuration: attention (None: the model config's), KV format, sizes, decoding."""

    attention: str | None
    kv: str
    batch: int
    prompt: int
    new: int
    decoding: str = GREEDY

    def name(self, attention: str, swept: frozenset[str], k: int) -> str:
        """The variant name: attention and KV format, the swept sizes, `-specK` for speculative runs."""
        parts = [attention, self.kv]
        parts += [f"{key[0]}{getattr(self, key)}" for key in SWEPT if key in swept]
        if self.decoding == SPECULATIVE:
            parts.append(f"spec{k}")
        return "-".join(parts)


def generation_points(settings: GenerateSettings) -> list[Point]:
    """The runs of a sweep, in order: the product of its values, greedy before speculative."""
    decodings = (GREEDY, SPECULATIVE) if settings.speculative else (GREEDY,)
    return [Point(a, kv, b, p, n, d) for a, kv, b, p, n, d in itertools.product(
        settings.attention, settings.kv, settings.batch, settings.prompt, settings.new, decodings)]


@dataclass(frozen=True)
class GenerationResult:
    """One run's outcome: its bundle, status and the `llm` figures of its run.json."""

    variant: str
    run_id: str
    path: Path
    status: str
    error: str | None = None
    llm: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {**asdict(self), "path": str(self.path)}


SweepResult = ExperimentResult[GenerationResult]
"""A sweep's experiment record (id and path) and one `GenerationResult` per run."""


@dataclass
class _Run(RunFailure):
    """A run's state while the sweep goes on."""

    point: Point
    name: str
    run_id: str
    loaded: LoadedModel
    model: TinyGPT
    prompt: torch.Tensor
    draft: TinyGPT | None = None
    k: int = 0
    numerics: dict[str, Any] = field(default_factory=dict)
    times: list[StepTimes] = field(default_factory=list)
    peak_bytes: int | None = None
    proposed: int = 0
    accepted: int = 0
    kv_bytes: int | None = None
    draft_kv_bytes: int | None = None
    context: int | None = None
    stats: LatencyStats | None = None
    trace: Trace | None = None
    raw: list[Path] = field(default_factory=list)
    op_flops: dict[str, float] | None = None
    phases_ms: dict[str, float] = field(default_factory=dict)
    llm: dict[str, Any] | None = None

    @property
    def subject(self) -> str:
        return f"run {self.name}"

    def once(self) -> Generation | SpeculativeGeneration:
        """One generation of this run's configuration (untimed by itself: it times its own steps)."""
        p = self.point
        if self.draft is not None:
            return speculative_generate(self.model, self.draft, self.prompt, p.new, self.k, kv_dtype=p.kv)
        return generate(self.model, self.prompt, p.new, kv_dtype=p.kv)

    def same_point(self, other: _Run) -> bool:
        """Whether `other` runs the same attention, format and sizes (whatever its decoding)."""
        a, b = self.point, other.point
        return (a.attention, a.kv, a.batch, a.prompt, a.new) == (b.attention, b.kv, b.batch, b.prompt, b.new)


def run_generation(settings: GenerateSettings | None = None, root: str | Path | None = None,
                   progress: Progress | None = None) -> SweepResult:
    """Run the sweep `settings` describes and write one bundle per run plus the experiment record under
    `root` (see `workbench.paths.traces_root`). Bad settings raise WorkbenchError before anything is
    written; a run that fails is written as a failed bundle and the others go on. Bundles and record
    appear in the root together when the sweep ends, or not at all (`workbench.trace.store.staging`)."""
    settings = settings or GenerateSettings()
    root = checked_root(root, writing=True)
    device = resolve_device(settings.device)
    with torch_threads(settings.threads):
        timings: dict[str, float] = {}
        with phase(PHASE_LOAD, timings):
            models = _load_models(settings, device)
        return _Sweep(settings, root, progress or NullProgress(), models, device, timings).run()


def _load_models(settings: GenerateSettings, device: torch.device) -> dict[str | None, tuple[LoadedModel, TinyGPT]]:
    """The model of each attention value (loaded once) and its module on `device`; checks every point fits."""
    models = {}
    for attention in settings.attention:
        overrides = dict(settings.model_overrides)
        if attention is not None:
            overrides["attention"] = attention
            if attention != "gqa":  # a kv_heads override sets GQA's kv heads; the other kinds fix their own
                overrides.pop("kv_heads", None)
        loaded = load_model(settings.model, **overrides)
        if loaded.source != "builtin" or not isinstance(loaded.module, TinyGPT):
            raise WorkbenchError(f"generate: model {settings.model!r} is not tiny-gpt; generation runs the built-in "
                                 "tiny-gpt (with --set overrides)")
        module = loaded.module if device.type == "cpu" else copy.deepcopy(loaded.module).to(device)
        longest = max(settings.prompt) + max(settings.new) - 1
        if longest > module.max_seq:
            raise WorkbenchError(f"generate: prompt {max(settings.prompt)} + new {max(settings.new)} - 1 positions "
                                 f"exceed max_seq {module.max_seq} (raise it with --set max_seq=N)")
        if settings.speculative and not 1 <= settings.draft_layers < len(module.blocks):
            raise WorkbenchError(f"generate: draft layers must be in 1..{len(module.blocks) - 1} (the model has "
                                 f"{len(module.blocks)} layers), got {settings.draft_layers}")
        models[attention] = (loaded, module)
    return models


class _Sweep(Runner[_Run, GenerationResult]):
    """The steps of `run_generation` once the models are loaded, on the runner's skeleton: its "prepare"
    step checks numerics (which also warms every run up)."""

    prepare_phase = "numerics"

    def __init__(self, settings: GenerateSettings, root: Path, progress: Progress,
                 models: dict[str | None, tuple[LoadedModel, TinyGPT]], device: torch.device,
                 timings: dict[str, float]) -> None:
        super().__init__(root, new_run_id(settings.model, "generate"), progress, timings, profile=settings.profile)
        self.settings = settings
        self.models = models
        self.device = device
        self.created = utc_now()
        self.environment = environment(str(device))
        self._references: dict[tuple[Any, ...], Generation] = {}

    def new_runs(self) -> list[_Run]:
        return [self._new_run(point) for point in generation_points(self.settings)]

    def _new_run(self, point: Point) -> _Run:
        s = self.settings
        loaded, module = self.models[point.attention]
        swept = frozenset(key for key in SWEPT if len(getattr(s, key)) > 1)
        name = point.name(self.attention(loaded), swept, s.speculative)
        (prompt,) = loaded.make_inputs(point.batch, point.prompt)
        run = _Run(point, name, new_run_id(loaded.name, name), loaded, module, prompt.to(self.device))
        if point.decoding == SPECULATIVE:
            run.draft, run.k = first_layers_draft(module, s.draft_layers), s.speculative
        return run

    def attention(self, loaded: LoadedModel) -> str:
        """The attention kind that names and labels the runs of `loaded`."""
        return attention_kind(loaded.config)

    def predicted_kv_bytes(self, run: _Run) -> int | None:
        """The KV-cache bytes the formula predicts for `run`'s cache at its context."""
        p = run.point
        return kv_cache_bytes(run.loaded.config, p.batch, run.context, p.kv)

    def _reference(self, run: _Run) -> Generation:
        """The reference generation (logits kept) of `run`'s model and sizes, computed once."""
        p = run.point
        key = (p.attention, p.batch, p.prompt, p.new)
        if key not in self._references:
            self._references[key] = self.generation(run, keep_logits=True, reference=True)
        return self._references[key]

    def generation(self, run: _Run, *, keep_logits: bool = False, reference: bool = False) -> Generation:
        """One greedy generation of `run`'s model and prompt with its cache, or (`reference`) with the fp32 cache
        the others are checked against."""
        p = run.point
        return generate(run.model, run.prompt, p.new, kv_dtype="fp32" if reference else p.kv,
                        keep_logits=keep_logits)

    def logits_model(self, run: _Run) -> Any:
        """What `vs_recompute` calls for the logits of a whole sequence."""
        return run.model

    def checks_reference(self, run: _Run) -> bool:
        """Whether `run`'s cache is checked against the reference (a cache that is not the reference's)."""
        return run.point.kv != "fp32"

    def vs_reference(self, run: _Run, own: Generation) -> dict[str, Any]:
        """`run`'s logits and tokens against the reference generation's (`cache_numerics`)."""
        return cache_numerics(run.model, run.prompt, self._reference(run), own, run.point.kv)

    def prepare(self, runs: list[_Run]) -> None:
        """Check each run's tokens and logits (see the module docstring); this also warms every run up."""
        self.progress.start("numerics", len(runs))
        for run in runs:
            try:
                if run.draft is None:
                    own = self.generation(run, keep_logits=True)
                    run.numerics["vs_recompute"] = vs_recompute(self.logits_model(run), run.prompt, own)
                    if self.checks_reference(run):
                        run.numerics["vs_fp32_cache"] = self.vs_reference(run, own)
                else:
                    spec = run.once()
                    run.numerics["matches_greedy"] = token_agreement(self.generation(run).tokens, spec.tokens)
            except Exception as exc:
                run.fail("numerics", exc)
            self.progress.advance("numerics")
        self.progress.finish("numerics")

    def benchmark(self, runs: list[_Run]) -> None:
        """Time every run's generations, interleaved; the warm-up rounds' step times are dropped."""
        stats = self.benchmark_together(runs, self.settings.warmup, self.settings.repeats)
        for run in runs:
            run.stats = stats.get(run.run_id)
            if run.stats is not None:
                run.times = run.times[self.settings.warmup:]

    def workload(self, run: _Run) -> Workload:
        """One generation of `run` as a benchmark contender that records its steps, cache size, peak
        memory (CUDA; on CPU the profiled capture measures it) and acceptance (from zero: the benchmark
        asks again when it restarts)."""
        run.times, run.peak_bytes, run.proposed, run.accepted = [], None, 0, 0
        cuda = self.device.type == "cuda"
        warmup = self.settings.warmup

        def call() -> None:
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            out = run.once()
            if cuda:
                peak = torch.cuda.max_memory_allocated(self.device) - before
                run.peak_bytes = max(run.peak_bytes or 0, peak)
            run.times.append(out.times)
            run.kv_bytes = out.kv_cache_bytes
            run.context = run.prompt.shape[1] + run.point.new - 1
            if isinstance(out, SpeculativeGeneration):
                run.draft_kv_bytes = out.draft_kv_cache_bytes
                if len(run.times) > warmup:
                    run.proposed += out.proposed
                    run.accepted += out.accepted

        p = run.point
        return Workload(fn=call, items=p.batch, tokens=p.batch * p.new,
                        timer=WallClockTimer(sync=lambda: synchronize(self.device)))

    def profile_run(self, run: _Run, folder: Path) -> Trace | None:
        """One generation of `run` under torch.profiler, its `measure` phase around it."""
        session = open_session("torch.profiler", folder, run.name, self.settings.profile_settings,
                               SessionContext(self.device.type))
        try:
            with session, phase(PHASE_MEASURE, run.phases_ms):
                run.once()
            assert session.trace_path is not None
            run.trace = attach_flops(read_trace(session.trace_path), session.op_flops)
            run.raw, run.op_flops = list(session.raw_paths), session.op_flops
        except Exception:
            run.trace, run.raw = None, []
            raise
        return run.trace

    def bundle_files(self, run: _Run) -> BundleFiles:
        return BundleFiles(raw_files=tuple(run.raw))

    def _peak_bytes(self, run: _Run) -> tuple[int | None, str | None]:
        """The generation's own peak allocation and where it was measured."""
        if run.peak_bytes is not None:
            return run.peak_bytes, "torch.cuda.max_memory_allocated"
        if run.trace is not None:
            peak = peak_allocated_bytes(run.trace, str(self.device), phase_window(run.trace, PHASE_MEASURE))
            return peak, "profiler memory events" if peak is not None else None
        return None, None

    def _llm_info(self, run: _Run) -> dict[str, Any] | None:
        """The "llm" object of run.json (None for a run that never got timed)."""
        if not run.times:
            return None
        p = run.point
        peak, peak_source = self._peak_bytes(run)
        predicted = self.predicted_kv_bytes(run) if run.context else None
        info = llm_metrics(run.times, kv_cache_bytes=run.kv_bytes, kv_cache_bytes_predicted=predicted,
                           peak_memory_bytes=peak)
        info.update(peak_memory_source=peak_source, attention=self.attention(run.loaded), kv=p.kv, context=run.context,
                    prompt=p.prompt, new=p.new, decoding=p.decoding, numerics=run.numerics)
        if run.draft is not None:
            info["speculative"] = self._speculative_info(run)
        return info

    def _speculative_info(self, run: _Run) -> dict[str, Any]:
        """Draft, k, acceptance over the timed runs, and the speedup over the same point's greedy run."""
        greedy = next((r for r in self.runs if r.draft is None and r.stats is not None and r.same_point(run)), None)
        stats = run.stats
        return {
            "k": self.settings.speculative,
            "draft": f"first {self.settings.draft_layers} layer(s) of the target",
            "draft_layers": self.settings.draft_layers,
            "proposed": run.proposed,
            "accepted": run.accepted,
            "acceptance_rate": run.accepted / run.proposed if run.proposed else None,
            "draft_kv_cache_bytes": run.draft_kv_bytes,
            "greedy_run": greedy.run_id if greedy else None,
            "speedup_vs_greedy": greedy.stats.p50 / stats.p50 if greedy and stats and stats.p50 > 0 else None,
            "matches_greedy": (run.numerics.get("matches_greedy") or {}).get("identical"),
        }

    def info(self, run: _Run) -> RunInfo:
        """The run.json of one run (its `llm` figures computed here, once its trace is known)."""
        run.llm = self._llm_info(run)
        s, p, loaded = self.settings, run.point, run.loaded
        capture = {"profiler": "torch.profiler", "settings": s.profile_settings.to_dict()} if s.profile else None
        return RunInfo(
            run_id=run.run_id, status=run.status, error=run.error, traceback=run.error_traceback,
            experiment=self.experiment_id, kind=GENERATION, model=model_info(s.model, loaded),
            variant={"name": run.name, "attention": self.attention(loaded), "kv": p.kv, "decoding": p.decoding,
                     "batch": p.batch, "prompt": p.prompt, "new": p.new, "device": str(self.device)},
            device=str(self.device), batch=p.batch, seq=p.prompt, items_per_call=p.batch,
            tokens_per_call=p.batch * p.new, environment=self.environment,
            benchmark=run.stats.to_dict() if run.stats else None, llm=run.llm,
            generation={"settings": s.to_dict(), "timed": [t.to_dict() for t in run.times]},
            phases_ms={"profiled": run.phases_ms or None}, capture=capture, op_flops=run.op_flops,
        )

    def record(self, runs: list[_Run]) -> ExperimentRecord:
        return ExperimentRecord(
            experiment_id=self.experiment_id, created=self.created, kind=GENERATION, model=runs[0].loaded.name,
            model_ref=self.settings.model, reference=runs[0].name, runs=[run.run_id for run in runs],
            variants=[run.name for run in runs], failed=[run.name for run in runs if not run.ok],
            settings=self.settings.to_dict(), environment=self.environment, phases_ms=self.timings,
        )

    def result(self, run: _Run, path: Path) -> GenerationResult:
        return GenerationResult(run.name, run.run_id, path, run.status, run.error, run.llm)
