"""Experiments: one model, several variants, the same inputs, one bundle per variant.

`run_experiment` loads the model once, prepares every variant (a variant that cannot run, or whose
model raises, is recorded as failed and the others go on), checks each one's numerics against the
fp32 `eager` reference, times them together with the interleaved benchmark, then profiles each in
its own labelled lifecycle and writes its run bundle; last comes the experiment record that groups
the bundles. Bundles and record are written into a staging folder of the traces root and appear there
together when the experiment ends; an interrupted or killed experiment leaves nothing listed
(`workbench.trace.staging`). The CLI, the notebook API and the Jupyter server all run experiments
through here.

`profiler` picks the profiled run's tool: the framework's own profiler (default), Nsight Systems (the
run happens in a child process under `nsys`, whose SQLite export is the trace), or Nsight Compute (the
framework's trace, plus per-kernel metrics from a child process under `ncu` in a `kernel_metrics`
table); see `workbench.profiling.registry`. A torch variant profiled on CUDA with memory profiling also
gets the caching allocator's snapshot merged into its memory table (`workbench.trace.cuda_snapshot`).
A TensorRT variant's IProfiler layer timings (taken after its measured iterations) are merged into its trace
as `layer` events carrying the engine inspector's fusion facts, and its ONNX graphs and timing cache go to
the bundle's compile/ beside the inspector's JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import torch

from workbench.backends import (
    REFERENCE,
    LatencyStats,
    Numerics,
    Prepared,
    Variant,
    Workload,
    compare_outputs,
    get_backend,
    get_variant,
)
from workbench.backends.devices import torch_supports
from workbench.errors import WorkbenchError
from workbench.models import LoadedModel, load_model
from workbench.paths import checked_root
from workbench.profiling import (
    FRAMEWORK,
    ProfiledRun,
    ProfileSettings,
    attach_flops,
    check_profiler,
    environment,
    get_profiler,
    phase,
    prepare_variant,
    profilers,
    progress_units,
)
from workbench.profiling.child import ChildSpec
from workbench.profiling.registry import DEFAULT_LAUNCH_COUNT, ProfileRequest
from workbench.runner import BundleFiles, ExperimentResult, NullProgress, Progress, RunFailure, Runner
from workbench.trace import Trace, read_trace
from workbench.trace.bundle import new_run_id, utc_now
from workbench.trace.cuda_snapshot import with_cuda_snapshot
from workbench.trace.records import ExperimentRecord, RunInfo
from workbench.trace.schema import PHASE_LOAD

DEFAULT_VARIANTS = ("eager", "bf16", "compile", "int8")
"""The variants of the default experiment (the README's first command)."""

Status = Literal["ok", "failed"]


@dataclass(frozen=True)
class ExperimentSettings:
    """What to run. The defaults are the default experiment: tiny-gpt, batch 4, its default sequence
    length (128), variants eager, bf16, compile and int8, each profiled.

    `warmup` and `iterations` are rounds of the interleaved benchmark; `profile_settings` shapes the
    separate profiled run of each variant. `threads` sets torch's intra-op threads for the
    experiment (restored after); None leaves torch's setting. `model_overrides` go to `load_model`.
    `profiler` is a registered profiler (`workbench.profiling.profilers()`, see the module docstring);
    `kernel_name` (ncu's filter: a name or `regex:<expression>`) and `launch_count` choose the kernel
    launches Nsight Compute profiles.
    """

    model: str = "tiny-gpt"
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    batch: int = 4
    seq: int | None = None
    device: str = "cpu"
    warmup: int = 5
    iterations: int = 30
    profile: bool = True
    profile_settings: ProfileSettings = field(default_factory=ProfileSettings)
    threads: int | None = None
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    profiler: str = FRAMEWORK
    kernel_name: str | None = None
    launch_count: int = DEFAULT_LAUNCH_COUNT

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        if not self.variants:
            raise WorkbenchError("an experiment needs at least one variant")
        repeated = sorted({name for name in self.variants if self.variants.count(name) > 1})
        if repeated:
            raise WorkbenchError(f"variant(s) listed more than once: {', '.join(repeated)}")
        if self.profiler not in profilers():
            raise WorkbenchError(f"unknown profiler {self.profiler!r}; choose one of {', '.join(profilers())}")
        for key, minimum, optional in (("warmup", 0, False), ("iterations", 1, False), ("threads", 1, True),
                                       ("launch_count", 1, False)):
            value = getattr(self, key)
            if optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise WorkbenchError(f"{key} must be an integer >= {minimum}, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for the experiment record)."""
        return asdict(self)


@dataclass(frozen=True)
class RunResult:
    """The outcome of one variant: its bundle, status, and the headline numbers when it ran.

    `speedup` is the reference's median latency over this variant's, when the reference was listed
    and benchmarked; `numerics` is `Numerics.to_dict()` (against the reference).
    """

    variant: str
    run_id: str
    path: Path
    status: Status
    error: str | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    items_per_s: float | None = None
    speedup: float | None = None
    first_call_s: float | None = None
    numerics: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, with the numerics' SQNR and top-1 agreement also at the top level."""
        numerics = self.numerics or {}
        return {**asdict(self), "path": str(self.path), "sqnr_db": numerics.get("sqnr_db"),
                "top1_agreement": numerics.get("top1_agreement")}


@dataclass
class _VariantRun(RunFailure):
    """A variant's state while the experiment runs; `prepared` is dropped once benchmarked."""

    variant: Variant
    run_id: str
    prepared: Prepared | None = None
    placed: tuple[Any, ...] = ()
    setup_ms: dict[str, float] = field(default_factory=dict)
    first_call_s: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    numerics: Numerics | None = None
    stats: LatencyStats | None = None
    profiled: ProfiledRun | None = None
    tables: dict[str, pa.Table] = field(default_factory=dict)
    folders: dict[str, Path] = field(default_factory=dict)
    """Bundle folders the backend's enrichers made (bundle name → folder in the profile folder)."""
    enriched_info: dict[str, Any] = field(default_factory=dict)
    """run.json fields the backend's enrichers added."""

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def subject(self) -> str:
        return f"variant {self.variant.name}"

    def fail(self, stage: str, exc: BaseException) -> None:
        """Record the failure (`RunFailure.fail`) and drop the prepared module."""
        super().fail(stage, exc)
        self.prepared, self.placed = None, ()


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `threads` intra-op threads (None: unchanged), restoring the count after."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_experiment(
    settings: ExperimentSettings | None = None,
    root: str | Path | None = None,
    progress: Progress | None = None,
) -> ExperimentResult[RunResult]:
    """Run the experiment `settings` describes and write its bundles and record under `root` (the
    traces root; see `workbench.paths.traces_root`).

    Bad settings (an unknown variant or model, a bad batch, an Nsight profiler that is not installed or
    not on a CUDA device, a traces root that cannot be written) raise WorkbenchError before anything is
    written. A variant that fails is recorded as a failed bundle and the others go on; a full disk stops
    the experiment (DiskFullError) with nothing written.
    """
    settings = settings or ExperimentSettings()
    root = checked_root(root, writing=True)
    check_profiler(settings.profiler, settings.device, settings.profile)
    variants = [get_variant(name, settings.batch, settings.device) for name in settings.variants]
    # torch has no TPU backend: there the fp32 reference runs on the host CPU
    reference = get_variant(REFERENCE, settings.batch, settings.device if torch_supports(settings.device) else "cpu")
    with torch_threads(settings.threads):
        timings: dict[str, float] = {}
        with phase(PHASE_LOAD, timings):
            loaded = load_model(settings.model, **settings.model_overrides)
            inputs = loaded.make_inputs(settings.batch, settings.seq)
        return _Experiment(settings, root, progress or NullProgress(), loaded, inputs, timings, variants,
                           reference).run()


class _Experiment(Runner[_VariantRun, "RunResult"]):
    """The steps of `run_experiment` after the model is loaded, on the runner's skeleton."""

    def __init__(self, settings: ExperimentSettings, root: Path, progress: Progress, loaded: LoadedModel,
                 inputs: tuple[torch.Tensor, ...], timings: dict[str, float], variants: list[Variant],
                 reference: Variant) -> None:
        super().__init__(root, new_run_id(loaded.name, "experiment"), progress, timings, profile=settings.profile)
        self.settings = settings
        self.loaded = loaded
        self.inputs = inputs
        self.variants = variants
        self.reference = reference
        self.created = utc_now()
        self.seq = loaded.default_seq if settings.seq is None else settings.seq
        self.environment = environment(settings.device)
        self.reference_error: str | None = None
        self._device_properties: dict[tuple[str, Any], dict[str, Any] | None] = {}

    def new_runs(self) -> list[_VariantRun]:
        return [self._new_run(variant) for variant in self.variants]

    def _new_run(self, variant: Variant) -> _VariantRun:
        return _VariantRun(variant, new_run_id(self.loaded.name, variant.name))

    def prepare(self, runs: list[_VariantRun]) -> None:
        """Prepare every variant (the reference first, listed or not) and compare each one's output
        with the reference's; an unlisted reference is dropped once its output is known."""
        reference = self.reference
        listed = next((run for run in runs if run.variant.name == reference.name), None)
        ref_run = listed or self._new_run(reference)
        order = [ref_run, *(run for run in runs if run is not ref_run)]
        self.progress.start("prepare", len(order))
        expected: torch.Tensor | None = None
        for run in order:
            try:
                run.prepared, run.placed = prepare_variant(
                    run.variant, self.loaded, self.inputs, timings=run.setup_ms
                )
                run.notes = dict(run.prepared.notes)
                run.artifacts = dict(getattr(run.prepared, "artifacts", {}))
                run.first_call_s = run.notes.get("first_call_s")
                output = run.prepared.run(run.placed)
                if run is ref_run:
                    expected = output
                if expected is not None:
                    run.numerics = compare_outputs(expected, output)
            except Exception as exc:
                run.fail("prepare", exc)
            self.progress.advance("prepare")
        if listed is None:
            ref_run.prepared, ref_run.placed = None, ()  # only its output was needed
        self.reference_error = ref_run.error
        self.progress.finish("prepare")

    def benchmark(self, runs: list[_VariantRun]) -> None:
        """Time the prepared variants together; each is freed once timed, before its profiled copy is made."""
        stats = self.benchmark_together(runs, self.settings.warmup, self.settings.iterations)
        for run in runs:
            run.stats = stats.get(run.run_id)
            run.prepared, run.placed = None, ()

    def workload(self, run: _VariantRun) -> Workload:
        """`run`'s prepared variant as a benchmark contender."""
        prepared, placed = run.prepared, run.placed
        assert prepared is not None  # only prepared variants are benchmarked
        return Workload(
            fn=lambda: prepared.run(placed),
            items=self.loaded.items(self.settings.batch, self.seq),
            tokens=self.loaded.tokens(self.settings.batch, self.seq),
            timer=prepared.timer(),
            first_call_ms=None if run.first_call_s is None else run.first_call_s * 1e3,
        )

    def profile_run(self, run: _VariantRun, folder: Path) -> Trace | None:
        """The trace of `run`'s profiled lifecycle under the chosen profiler, FLOPs attached, completed by
        what the profiler adds and, for a framework trace, by the backend's enrichers."""
        task = f"profile {run.variant.name}"
        s = self.settings
        self.progress.start(task, progress_units(s.profile_settings))
        tool = get_profiler(s.profiler)
        request = ProfileRequest(run.variant, self.loaded, self.inputs, folder, s.profile_settings,
                                 self._child_spec(run), lambda n: self.progress.advance(task, n),
                                 kernel_name=s.kernel_name, launch_count=s.launch_count)
        try:
            run.profiled = tool.profile(request)
            trace = attach_flops(read_trace(run.profiled.trace_path), run.profiled.op_flops)
            trace, run.tables = with_cuda_snapshot(trace, run.profiled.memory_snapshot)
            if tool.adds is not None:
                added = tool.adds(request)
                run.tables.update(added.tables)
                run.profiled = replace(run.profiled, raw_paths=(*run.profiled.raw_paths, *added.raw_paths),
                                       notes={**run.profiled.notes, tool.name: dict(added.notes)})
            if tool.framework_trace:
                for enrich in get_backend(run.variant.backend).enrichers:
                    enriched = enrich(trace, run.variant, run.profiled, folder)
                    trace = enriched.trace
                    run.folders.update(enriched.folders)
                    run.enriched_info.update(enriched.info)
            return trace
        finally:
            self.progress.finish(task)

    def _child_spec(self, run: _VariantRun) -> ChildSpec:
        """What a child process under an Nsight tool needs to run `run`'s variant as this experiment does."""
        s = self.settings
        return ChildSpec(model=s.model, variant=run.variant.name, batch=s.batch, device=s.device, out_dir="",
                         seq=s.seq, threads=s.threads, model_overrides=dict(s.model_overrides),
                         settings=s.profile_settings.to_dict())

    def bundle_files(self, run: _VariantRun) -> BundleFiles:
        """The raw profiler output (moved in), the compile-stage texts, the enrichers' folders and tables."""
        raw = run.profiled.raw_paths if run.profiled else ()
        artifacts = run.profiled.artifacts if run.profiled and run.profiled.artifacts else run.artifacts
        return BundleFiles(raw_files=tuple(raw), texts={f"compile/{name}": text for name, text in artifacts.items()},
                           folders=run.folders, tables=run.tables)

    def info(self, run: _VariantRun) -> RunInfo:
        """The run.json of one variant."""
        s, loaded, profiled = self.settings, self.loaded, run.profiled
        capture = None
        if s.profile:
            framework = get_backend(run.variant.backend).framework_profiler
            capture = {"profiler": get_profiler(s.profiler).label.format(framework=framework),
                       "settings": s.profile_settings.to_dict(),
                       "notes": profiled.notes if profiled else None}
        return RunInfo(
            run_id=run.run_id, status=run.status, error=run.error, traceback=run.error_traceback,
            experiment=self.experiment_id, model=model_info(s.model, loaded), variant=run.variant.to_dict(),
            device=run.notes.get("device", run.variant.device), batch=s.batch, seq=self.seq,
            items_per_call=loaded.items(s.batch, self.seq), tokens_per_call=loaded.tokens(s.batch, self.seq),
            environment=self.environment, reference=REFERENCE, reference_error=self.reference_error,
            benchmark=run.stats.to_dict() if run.stats else None, first_call_s=run.first_call_s,
            numerics=run.numerics.to_dict() if run.numerics else None, notes=run.notes,
            phases_ms={"setup": run.setup_ms, "profiled": profiled.phases_ms if profiled else None},
            capture=capture, xprof=run.enriched_info.get("xprof"), device_properties=self.device_properties(run),
            op_flops=profiled.op_flops if profiled else None,
        )

    def device_properties(self, run: _VariantRun) -> dict[str, Any] | None:
        """The figures of the device `run` ran on (peak FLOP/s per dtype, memory bandwidth and size, with
        sources): a GPU or TPU from the hardware table, the CPU as measured here (cached per machine and
        thread count). None when the device is unknown to the table or the run never got a device."""
        from workbench.hardware import local_cpu_spec, match_device

        device = run.notes.get("device")
        if device is None:
            return None
        key = (device, run.notes.get("device_name") or run.notes.get("torch_threads"))
        if key not in self._device_properties:
            spec = local_cpu_spec(run.notes.get("torch_threads")) if device == "cpu" else \
                match_device(str(run.notes.get("device_name") or ""))
            self._device_properties[key] = spec.to_dict() if spec else None
        return self._device_properties[key]

    def record(self, runs: list[_VariantRun]) -> ExperimentRecord:
        return ExperimentRecord(
            experiment_id=self.experiment_id, created=self.created, model=self.loaded.name,
            model_ref=self.settings.model, reference=REFERENCE, reference_error=self.reference_error,
            runs=[run.run_id for run in runs], variants=[run.variant.name for run in runs],
            failed=[run.variant.name for run in runs if not run.ok], settings=self.settings.to_dict(),
            environment=self.environment, phases_ms=self.timings,
        )

    def result(self, run: _VariantRun, path: Path) -> RunResult:
        reference_p50 = next((r.stats.p50 for r in self.runs if r.variant.name == REFERENCE and r.stats), None)
        return _result(run, path, reference_p50)


def model_info(ref: str, loaded: LoadedModel) -> dict[str, Any]:
    """The model fields of run.json."""
    return {"ref": ref, "name": loaded.name, "config": loaded.config, "parameters": loaded.parameter_count,
            "source": loaded.source}


def _result(run: _VariantRun, path: Path, reference_p50: float | None) -> RunResult:
    stats = run.stats
    return RunResult(
        variant=run.variant.name,
        run_id=run.run_id,
        path=path,
        status="ok" if run.ok else "failed",
        error=run.error,
        p50_ms=stats.p50 if stats else None,
        p99_ms=stats.p99 if stats else None,
        items_per_s=stats.items_per_s if stats else None,
        speedup=reference_p50 / stats.p50 if stats and reference_p50 and stats.p50 > 0 else None,
        first_call_s=run.first_call_s,
        numerics=run.numerics.to_dict() if run.numerics else None,
    )
