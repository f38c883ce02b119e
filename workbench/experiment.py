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

import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

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
from workbench.backends.benchmark import benchmark_until_clean
from workbench.backends.devices import torch_supports
from workbench.errors import DiskFullError, WorkbenchError, is_disk_full
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
from workbench.trace import Trace, read_trace
from workbench.trace.bundle import new_run_id, utc_now, write_bundle
from workbench.trace.cuda_snapshot import with_cuda_snapshot
from workbench.trace.experiment import write_experiment
from workbench.trace.scratch import make_scratch_dir, remove_entry
from workbench.trace.staging import staged

DEFAULT_VARIANTS = ("eager", "bf16", "compile", "int8")
"""The variants of the default experiment (the README's first command)."""

Status = Literal["ok", "failed"]


class Progress(Protocol):
    """Receives progress of an experiment's tasks (the CLI draws them as progress bars).

    Tasks are named by strings such as "prepare", "benchmark", "profile bf16", "write"; `total` is
    None when unknown. `start` may be called again for a task to restart it from zero.
    """

    def start(self, task: str, total: int | None = None) -> None: ...

    def advance(self, task: str, n: int = 1) -> None: ...

    def finish(self, task: str) -> None: ...


class NullProgress:
    """A `Progress` that ignores everything (the default)."""

    def start(self, task: str, total: int | None = None) -> None:
        """Ignored."""

    def advance(self, task: str, n: int = 1) -> None:
        """Ignored."""

    def finish(self, task: str) -> None:
        """Ignored."""


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


class _HasStatus(Protocol):
    status: str


ResultT = TypeVar("ResultT", bound=_HasStatus)


@dataclass(frozen=True)
class ExperimentResult(Generic[ResultT]):
    """The outcome of an experiment (or a generation sweep): its record's id and path, and one result per
    run (`RunResult` for an experiment's variants)."""

    experiment_id: str
    path: Path
    runs: tuple[ResultT, ...]

    @property
    def failed(self) -> list[ResultT]:
        """The runs that failed."""
        return [run for run in self.runs if run.status != "ok"]


@dataclass
class RunFailure:
    """The failure state of a run while its experiment or sweep goes on: the first failure is kept, as a
    message naming `subject` and the stage, and the traceback for run.json."""

    error: str | None = field(default=None, kw_only=True)
    error_traceback: str | None = field(default=None, kw_only=True)

    @property
    def subject(self) -> str:
        """What the messages call this run ("variant eager")."""
        raise NotImplementedError

    @property
    def ok(self) -> bool:
        """Whether the run has not failed (so far)."""
        return self.error is None

    def fail(self, stage: str, exc: BaseException) -> None:
        """Record `exc` as this run's failure in `stage` (a WorkbenchError's message as it is, without a
        repeated subject; any other exception with its type)."""
        detail = str(exc).removeprefix(f"{self.subject}: ")
        if not isinstance(exc, WorkbenchError):
            detail = f"{type(exc).__name__}: {detail}"
        self.error = f"{self.subject} failed during {stage}: {detail}"
        self.error_traceback = "".join(traceback.format_exception(exc))


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
        with phase("load", timings):
            loaded = load_model(settings.model, **settings.model_overrides)
            inputs = loaded.make_inputs(settings.batch, settings.seq)
        experiment = _Experiment(settings, root, progress or NullProgress(), loaded, inputs, timings)
        return experiment.run(variants, reference)


class _Experiment:
    """The steps of `run_experiment` after the model is loaded, and the state they share."""

    def __init__(self, settings: ExperimentSettings, root: Path, progress: Progress, loaded: LoadedModel,
                 inputs: tuple[torch.Tensor, ...], timings: dict[str, float]) -> None:
        self.settings = settings
        self.root = root
        self.progress = progress
        self.loaded = loaded
        self.inputs = inputs
        self.timings = timings
        self.created = utc_now()
        self.seq = loaded.default_seq if settings.seq is None else settings.seq
        self.experiment_id = new_run_id(loaded.name, "experiment")
        self.environment = environment(settings.device)
        self.reference_error: str | None = None
        self._device_properties: dict[tuple[str, Any], dict[str, Any] | None] = {}

    def run(self, variants: list[Variant], reference: Variant) -> ExperimentResult[RunResult]:
        runs = [self._new_run(variant) for variant in variants]
        with phase("prepare", self.timings):
            self._prepare(runs, reference)
        with phase("benchmark", self.timings):
            self._benchmark([run for run in runs if run.ok])
        self.progress.start("write", len(runs) + 1)
        with staged(self.root, self.experiment_id) as stage:
            for run in runs:
                self._capture(run, stage)
            with phase("write", self.timings):
                result = self._record(runs, stage)
        self.progress.advance("write")
        self.progress.finish("write")
        return result

    def _new_run(self, variant: Variant) -> _VariantRun:
        return _VariantRun(variant, new_run_id(self.loaded.name, variant.name))

    def _prepare(self, runs: list[_VariantRun], reference: Variant) -> None:
        """Prepare every variant (the reference first, listed or not) and compare each one's output
        with the reference's; an unlisted reference is dropped once its output is known."""
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

    def _benchmark(self, runs: list[_VariantRun]) -> None:
        """Time the prepared variants together; one that raises is failed and the others rerun."""
        s = self.settings
        by_name = {run.variant.name: run for run in runs}

        def workloads() -> dict[str, Workload]:
            self.progress.start("benchmark", s.warmup + s.iterations)
            return {name: self._workload(run) for name, run in by_name.items() if run.ok}

        stats = benchmark_until_clean(workloads, lambda name, exc: by_name[name].fail("benchmark", exc),
                                      warmup=s.warmup, iterations=s.iterations,
                                      progress=lambda _phase, _done, _total: self.progress.advance("benchmark"))
        for name, run_stats in stats.items():
            by_name[name].stats = run_stats
            by_name[name].prepared, by_name[name].placed = None, ()  # freed before the profiled copy is made
        self.progress.finish("benchmark")

    def _workload(self, run: _VariantRun) -> Workload:
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

    def _capture(self, run: _VariantRun, stage: Path) -> None:
        """Profile `run` (when profiling, and it has not failed) and write its bundle into `stage`.

        The profiler writes into a hidden scratch folder of the stage (so the raw trace is moved, not
        copied, into the bundle), removed whatever happens.
        """
        if not (self.settings.profile and run.ok):
            self._write(run, None, stage)
            return
        folder = make_scratch_dir(stage, "profile", run.variant.name)
        try:
            with phase(f"profile {run.variant.name}", self.timings):
                trace = self._profile(run, folder)
            self._write(run, trace, stage)
        finally:
            remove_entry(folder)

    def _profile(self, run: _VariantRun, folder: Path) -> Trace | None:
        """The trace of `run`'s profiled lifecycle under the chosen profiler, FLOPs attached, completed by
        what the profiler adds and, for a framework trace, by the backend's enrichers; None (and `run`
        failed) if it raised."""
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
        except Exception as exc:
            if is_disk_full(exc):
                raise DiskFullError(folder) from exc
            run.fail("profiling", exc)
            return None
        finally:
            self.progress.finish(task)

    def _child_spec(self, run: _VariantRun) -> ChildSpec:
        """What a child process under an Nsight tool needs to run `run`'s variant as this experiment does."""
        s = self.settings
        return ChildSpec(model=s.model, variant=run.variant.name, batch=s.batch, device=s.device, out_dir="",
                         seq=s.seq, threads=s.threads, model_overrides=dict(s.model_overrides),
                         settings=s.profile_settings.to_dict())

    def _write(self, run: _VariantRun, trace: Trace | None, stage: Path) -> None:
        """Write `run`'s bundle into `stage`; the raw profiler output, if any, is moved into its raw/."""
        raw = list(run.profiled.raw_paths) if run.profiled else []
        artifacts = run.profiled.artifacts if run.profiled and run.profiled.artifacts else run.artifacts
        texts = {f"compile/{name}": text for name, text in artifacts.items()}
        folders = {name: path for name, path in run.folders.items() if path.is_dir()}
        with phase("write", self.timings):
            write_bundle(stage, run.run_id, self._info(run), trace, raw_files=raw, move_raw=True,
                         texts=texts, folders=folders, tables=run.tables if trace is not None else None)
        self.progress.advance("write")

    def _info(self, run: _VariantRun) -> dict[str, Any]:
        """The run.json fields of one variant."""
        s, loaded, profiled = self.settings, self.loaded, run.profiled
        capture = None
        if s.profile:
            framework = get_backend(run.variant.backend).framework_profiler
            capture = {"profiler": get_profiler(s.profiler).label.format(framework=framework),
                       "settings": s.profile_settings.to_dict(),
                       "notes": profiled.notes if profiled else None}
        return {
            "status": "ok" if run.ok else "failed",
            "error": run.error,
            "traceback": run.error_traceback,
            "experiment": self.experiment_id,
            "model": model_info(s.model, loaded),
            "variant": run.variant.to_dict(),
            "device": run.notes.get("device", run.variant.device),
            "batch": s.batch,
            "seq": self.seq,
            "items_per_call": loaded.items(s.batch, self.seq),
            "tokens_per_call": loaded.tokens(s.batch, self.seq),
            "environment": self.environment,
            "reference": REFERENCE,
            "reference_error": self.reference_error,
            "benchmark": run.stats.to_dict() if run.stats else None,
            "first_call_s": run.first_call_s,
            "numerics": run.numerics.to_dict() if run.numerics else None,
            "notes": run.notes,
            "phases_ms": {"setup": run.setup_ms, "profiled": profiled.phases_ms if profiled else None},
            "capture": capture,
            "xprof": run.enriched_info.get("xprof"),
            "device_properties": self.device_properties(run),
            "op_flops": profiled.op_flops if profiled else None,
        }

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

    def _record(self, runs: list[_VariantRun], stage: Path) -> ExperimentResult[RunResult]:
        """Write the experiment record into `stage` and return the result (with the paths the record and
        the bundles have once published into the root)."""
        info = {
            "created": self.created,
            "model": self.loaded.name,
            "model_ref": self.settings.model,
            "reference": REFERENCE,
            "reference_error": self.reference_error,
            "runs": [run.run_id for run in runs],
            "variants": [run.variant.name for run in runs],
            "failed": [run.variant.name for run in runs if not run.ok],
            "settings": self.settings.to_dict(),
            "environment": self.environment,
            "phases_ms": self.timings,
        }
        path = self.root / write_experiment(stage, self.experiment_id, info).relative_to(stage)
        reference_p50 = next((run.stats.p50 for run in runs if run.variant.name == REFERENCE and run.stats), None)
        return ExperimentResult(self.experiment_id, path,
                                tuple(_result(run, self.root / run.run_id, reference_p50) for run in runs))


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
