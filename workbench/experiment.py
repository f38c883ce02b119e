"""Experiments: one model, several variants, the same inputs, one bundle per variant.

`run_experiment` loads the model once, prepares every variant (a variant that cannot run, or whose
model raises, is recorded as failed and the others go on), checks each one's numerics against the
fp32 `eager` reference, times them together with the interleaved benchmark, then profiles each in
its own labelled lifecycle and writes its run bundle; last comes the experiment record that groups
the bundles. Bundles and record are written into a staging folder of the traces root and appear there
together when the experiment ends; an interrupted or killed experiment leaves nothing listed
(`workbench.trace.store.staging`). The CLI, the notebook API and the Jupyter server all run experiments
through here.

`profiler` picks the profiled run's tool: the framework's own profiler (default), Nsight Systems (the
run happens in a child process under `nsys`, whose SQLite export is the trace), or Nsight Compute (the
framework's trace, plus per-kernel metrics from a child process under `ncu` in a `kernel_metrics`
table); see `workbench.profiling.registry`. A torch variant profiled on CUDA with memory profiling also
gets the caching allocator's snapshot merged into its memory table (`workbench.trace.formats.cuda_snapshot`).
A TensorRT variant's IProfiler layer timings (taken after its measured iterations) are merged into its trace
as `layer` events carrying the engine inspector's fusion facts, and its ONNX graphs and timing cache go to
the bundle's compile/ beside the inspector's JSON.

A sweep (`batch` and/or `seq` given as several values, `workbench.shapes`) runs every variant at every
shape of the grid in the same experiment: one bundle per (variant, shape), labelled "eager-b4-s128". Each
(variant, shape) is prepared on its own (as the variant would be for that shape alone: its first call,
compile time and numerics against the reference at the same shape), and all of them are timed together by
the one interleaved benchmark, each round visiting every (variant, shape), so drift hits every point alike.
All stay prepared until the benchmark ends, so a sweep holds variants × shapes prepared copies of the model.
`profile_shapes` "all" profiles every point (memory curves need each), "largest" only each variant's
largest shape. The record gains the `grid` and is written at schema version 2.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from workbench.backends.devices import parse_device, torch_supports
from workbench.errors import WorkbenchError
from workbench.models import LoadedModel, load_model
from workbench.paths import checked_root
from workbench.profiling import ProfiledRun, ProfileSettings, attach_flops, environment, phase, progress_units
from workbench.profiling.child import ChildSpec
from workbench.profiling.lifecycle import prepare_variant
from workbench.profiling.registry import (
    DEFAULT_LAUNCH_COUNT,
    FRAMEWORK,
    ProfileRequest,
    check_profiler,
    get_profiler,
    profilers,
)
from workbench.runner import BundleFiles, ExperimentResult, NullProgress, Progress, RunFailure, Runner
from workbench.shapes import PROFILE_SHAPES, Shape, as_values, shape_grid, sweep_value, swept
from workbench.threads import default_threads, torch_threads
from workbench.trace import Trace, read_trace
from workbench.trace.formats.cuda_snapshot import with_cuda_snapshot
from workbench.trace.schema import PHASE_LOAD
from workbench.trace.store.bundle import new_run_id, utc_now
from workbench.trace.store.records import SWEEP_SCHEMA_VERSION, ExperimentRecord, RunInfo

DEFAULT_VARIANTS = ("eager", "bf16", "compile", "int8")
"""The variants of the default experiment (the README's first command)."""

Status = Literal["ok", "failed"]


@dataclass(frozen=True)
class ExperimentSettings:
    """What to run. The defaults are the default experiment: tiny-gpt, batch 4, its default sequence
    length (128), variants eager, bf16, compile and int8, each profiled.

    `warmup` and `iterations` are rounds of the interleaved benchmark; `profile_settings` shapes the
    separate profiled run of each variant. `threads` sets torch's intra-op threads for the
    experiment (restored after); None means one on machines with 4 cores or fewer, else torch's setting
    (`default_threads`). `model_overrides` go to `load_model`.
    `profiler` is a registered profiler (`workbench.profiling.profilers()`, see the module docstring);
    `kernel_name` (ncu's filter: a name or `regex:<expression>`) and `launch_count` choose the kernel
    launches Nsight Compute profiles. `batch` and `seq` each take one value or several (a list or tuple: a
    sweep over their grid, module docstring); `profile_shapes` ("all" or "largest") says which shapes of a
    sweep are profiled.
    """

    model: str = "tiny-gpt"
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    batch: int | tuple[int, ...] = 4
    seq: int | tuple[int, ...] | None = None
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
    profile_shapes: str = "all"

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", tuple(self.variants))
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        object.__setattr__(self, "batch", sweep_value("batch", self.batch))
        object.__setattr__(self, "seq", sweep_value("seq", self.seq, optional=True))
        if self.profile_shapes not in PROFILE_SHAPES:
            raise WorkbenchError(f"profile_shapes must be one of {', '.join(PROFILE_SHAPES)}, "
                                 f"got {self.profile_shapes!r}")
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

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """The shapes the variants run at (one unless this is a sweep), batch-major."""
        return shape_grid(self.batch, self.seq)

    @property
    def swept(self) -> frozenset[str]:
        """The sizes this experiment sweeps ("batch", "seq"); empty for a single shape."""
        return swept(self.batch, self.seq)

    def grid(self) -> dict[str, Any] | None:
        """The experiment record's `grid` of a sweep; None for a single shape."""
        if not self.swept:
            return None
        return {"batch": list(as_values(self.batch)), "seq": list(as_values(self.seq)),
                "profile_shapes": self.profile_shapes}


@dataclass(frozen=True)
class RunResult:
    """The outcome of one variant: its bundle, status, and the headline numbers when it ran.

    `speedup` is the reference's median latency over this variant's (at the same shape), when the reference
    was listed and benchmarked; `numerics` is `Numerics.to_dict()` (against the reference). `batch` and `seq`
    are the shape it ran at; `label` names it in a sweep ("eager-b4"; None otherwise). `weights` says whether
    the model's weights were "real", "trained" or "random" (numerics on random weights compare variants, not
    accuracy); `training` is a trained built-in's description ("trained on ..., held-out perplexity X").
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
    batch: int | None = None
    seq: int | None = None
    label: str | None = None
    weights: str | None = None
    training: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, with the numerics' SQNR and top-1 agreement also at the top level."""
        numerics = self.numerics or {}
        return {**asdict(self), "path": str(self.path), "sqnr_db": numerics.get("sqnr_db"),
                "top1_agreement": numerics.get("top1_agreement")}


@dataclass
class _VariantRun(RunFailure):
    """A (variant, shape)'s state while the experiment runs; `prepared` is dropped once benchmarked. `label`
    names it: the variant's name, with the swept sizes in a sweep."""

    variant: Variant
    run_id: str
    shape: Shape
    label: str
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
        return self.label

    @property
    def subject(self) -> str:
        return f"variant {self.label}"

    def fail(self, stage: str, exc: BaseException) -> None:
        """Record the failure (`RunFailure.fail`) and drop the prepared module."""
        super().fail(stage, exc)
        self.prepared, self.placed = None, ()


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
    for name in settings.variants:  # unknown names fail before the model loads
        get_variant(name, as_values(settings.batch)[0], settings.device)
    with torch_threads(settings.threads):
        timings: dict[str, float] = {}
        with phase(PHASE_LOAD, timings):
            loaded = load_model(settings.model, **settings.model_overrides)
            inputs = {shape: loaded.make_inputs(shape.batch, shape.seq) for shape in settings.shapes}
        return _Experiment(settings, root, progress or NullProgress(), loaded, inputs, timings).run()


def profiled_first(variant: Variant) -> bool:
    """Whether `variant` is profiled before the others: a JAX variant on a GPU. CUPTI takes one subscriber per
    process, and once torch.profiler (Kineto) has subscribed, XLA's GPU tracer fails to
    (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) and its trace holds the host alone; XLA's tracer lets go
    when it stops, so Kineto can follow it (both seen on an H200)."""
    jax = get_backend(variant.backend).framework_profiler == "jax.profiler"
    return jax and parse_device(variant.device).type == "cuda"


class _Experiment(Runner[_VariantRun, "RunResult"]):
    """The steps of `run_experiment` after the model is loaded, on the runner's skeleton."""

    def __init__(self, settings: ExperimentSettings, root: Path, progress: Progress, loaded: LoadedModel,
                 inputs: dict[Shape, tuple[torch.Tensor, ...]], timings: dict[str, float]) -> None:
        super().__init__(root, new_run_id(loaded.name, "experiment"), progress, timings, profile=settings.profile)
        self.settings = settings
        self.loaded = loaded
        self.inputs = inputs
        self.created = utc_now()
        self.environment = environment(settings.device)
        self.reference_errors: dict[Shape, str | None] = {}
        self.reference = loaded.reference or REFERENCE
        """The variant whose output is the numerics reference: eager, or the model's own (an ONNX file's)."""
        self._device_properties: dict[tuple[str, Any], dict[str, Any] | None] = {}
        largest = max(settings.shapes, key=lambda shape: shape.size)
        self._profiled_shapes = set(settings.shapes) if settings.profile_shapes == "all" else {largest}

    def new_runs(self) -> list[_VariantRun]:
        """Every (variant, shape), variant-major."""
        return [self._new_run(name, shape) for name in self.settings.variants for shape in self.settings.shapes]

    def _new_run(self, name: str, shape: Shape) -> _VariantRun:
        # torch has no TPU backend: there the fp32 reference runs on the host CPU, as a model's own reference does
        device = self.settings.device
        if name == self.reference and name not in self.settings.variants and \
                (name != REFERENCE or not torch_supports(device)):
            device = "cpu"
        label = shape.label(name, self.settings.swept)
        return _VariantRun(get_variant(name, shape.batch, device), new_run_id(self.loaded.name, label), shape, label)

    def seq(self, shape: Shape) -> int | None:
        """The sequence length a run at `shape` processes (the model's default when none was given)."""
        return self.loaded.default_seq if shape.seq is None else shape.seq

    def prepare(self, runs: list[_VariantRun]) -> None:
        """Prepare every (variant, shape), shape by shape, the reference first (listed or not), and compare
        each one's output with the reference's at the same shape; an unlisted reference is dropped once its
        output is known."""
        groups = [[run for run in runs if run.shape == shape] for shape in self.settings.shapes]
        self.progress.start("prepare", len(runs) + (0 if self.reference in self.settings.variants else len(groups)))
        for shape, group in zip(self.settings.shapes, groups, strict=True):
            self._prepare_shape(shape, group)
        self.progress.finish("prepare")

    def _prepare_shape(self, shape: Shape, runs: list[_VariantRun]) -> None:
        """`prepare` for the runs of one shape."""
        listed = next((run for run in runs if run.variant.name == self.reference), None)
        ref_run = listed or self._new_run(self.reference, shape)
        order = [ref_run, *(run for run in runs if run is not ref_run)]
        expected: torch.Tensor | None = None
        for run in order:
            task = f"prepare {run.label}"  # names the variant being prepared (compiling may take minutes)
            self.progress.start(task, 1)
            try:
                run.prepared, run.placed = prepare_variant(
                    run.variant, self.loaded, self.inputs[shape], timings=run.setup_ms
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
            self.progress.advance(task)
            self.progress.finish(task)
            self.progress.advance("prepare")
        if listed is None:
            ref_run.prepared, ref_run.placed = None, ()  # only its output was needed
        self.reference_errors[shape] = ref_run.error

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
        batch, seq = run.shape.batch, self.seq(run.shape)
        return Workload(
            fn=lambda: prepared.run(placed),
            items=self.loaded.items(batch, seq),
            tokens=self.loaded.tokens(batch, seq),
            timer=prepared.timer(),
            first_call_ms=None if run.first_call_s is None else run.first_call_s * 1e3,
        )

    def profiles(self, run: _VariantRun) -> bool:
        """Whether `run`'s shape is one this experiment profiles (`profile_shapes`)."""
        return run.shape in self._profiled_shapes

    def profiles_first(self, run: _VariantRun) -> bool:
        return profiled_first(run.variant)

    def profile_run(self, run: _VariantRun, folder: Path) -> Trace | None:
        """The trace of `run`'s profiled lifecycle under the chosen profiler, FLOPs attached, completed by
        what the profiler adds and, for a framework trace, by the backend's enrichers."""
        task = f"profile {run.label}"
        s = self.settings
        self.progress.start(task, progress_units(s.profile_settings))
        tool = get_profiler(s.profiler)
        request = ProfileRequest(run.variant, self.loaded, self.inputs[run.shape], folder, s.profile_settings,
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
        return ChildSpec(model=s.model, variant=run.variant.name, batch=run.shape.batch, device=s.device, out_dir="",
                         seq=run.shape.seq, threads=default_threads(s.threads),
                         model_overrides=dict(s.model_overrides),
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
        batch, seq = run.shape.batch, self.seq(run.shape)
        if s.profile and self.profiles(run):
            framework = get_backend(run.variant.backend).framework_profiler
            capture = {"profiler": get_profiler(s.profiler).label.format(framework=framework),
                       "settings": s.profile_settings.to_dict(),
                       "notes": profiled.notes if profiled else None}
        return RunInfo(
            run_id=run.run_id, status=run.status, error=run.error, traceback=run.error_traceback,
            experiment=self.experiment_id, model=model_info(s.model, loaded), variant=run.variant.to_dict(),
            device=run.notes.get("device", run.variant.device), batch=batch, seq=seq,
            items_per_call=loaded.items(batch, seq), tokens_per_call=loaded.tokens(batch, seq),
            environment=self.environment, reference=self.reference,
            reference_error=self.reference_errors.get(run.shape),
            benchmark=run.stats.to_dict() if run.stats else None, first_call_s=run.first_call_s,
            numerics=run.numerics.to_dict() if run.numerics else None, notes=run.notes,
            phases_ms={"setup": run.setup_ms, "profiled": profiled.phases_ms if profiled else None},
            capture=capture, xprof=run.enriched_info.get("xprof"), device_properties=self.device_properties(run),
            op_flops=profiled.op_flops if profiled else None, label=run.label if s.swept else None,
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
        grid = self.settings.grid()
        return ExperimentRecord(
            experiment_id=self.experiment_id, created=self.created, model=self.loaded.name,
            model_ref=self.settings.model, reference=self.reference,
            reference_error=next((e for e in self.reference_errors.values() if e), None),
            runs=[run.run_id for run in runs], variants=[run.label for run in runs],
            failed=[run.label for run in runs if not run.ok], settings=self.settings.to_dict(),
            environment=self.environment, phases_ms=self.timings, grid=grid,
            **({"schema_version": SWEEP_SCHEMA_VERSION} if grid else {}),
        )

    def result(self, run: _VariantRun, path: Path) -> RunResult:
        reference_p50 = next((r.stats.p50 for r in self.runs
                              if r.variant.name == self.reference and r.shape == run.shape and r.stats), None)
        return _result(run, path, reference_p50, self.seq(run.shape), self.settings.swept, self.loaded)


def model_info(ref: str, loaded: LoadedModel) -> dict[str, Any]:
    """The model fields of run.json."""
    info = {"ref": ref, "name": loaded.name, "config": loaded.config, "parameters": loaded.parameter_count,
            "source": loaded.source, "weights": loaded.weights}
    if loaded.training:  # what the trained weights learned and how well: every surface quotes `description`
        info["training"] = loaded.training
    return info


def _result(run: _VariantRun, path: Path, reference_p50: float | None, seq: int | None,
            swept_sizes: frozenset[str], loaded: LoadedModel) -> RunResult:
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
        batch=run.shape.batch,
        seq=seq,
        label=run.label if swept_sizes else None,
        weights=loaded.weights,
        training=(loaded.training or {}).get("description"),
    )
