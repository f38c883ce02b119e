"""The notebook front door: `wb.capture`, `wb.show`, `wb.compare`, `wb.show_diff` (the CLI's functions, placed inline)
and each analysis as a function returning a DataFrame: `wb.roofline`, `wb.findings`, `wb.idle`, `wb.call_tree` (call
paths with self and total time), `wb.critical_path` (a step's critical path), `wb.diff` (and `wb.comparison`,
several runs against a baseline, as `workbench diff --json`), `wb.fusion`, `wb.fusion_detail`, `wb.provenance`
(kernels traced to the model's source ops, and two runs compared op by op), `wb.replay` (the top ops rebuilt from
the trace's shapes and timed alone), and SQL over runs, `wb.sql`. The ranks of a distributed job: `wb.ranks` (the
per-rank table), `wb.show_ranks` (its view). A sweep (`wb.capture(batch=[1, 2, 4], seq=[128, 512])`) has its curves
as DataFrames: `wb.sweep_table`, `wb.crossovers`, `wb.pareto`. Serving runs (`workbench serve`, or `wb.serve` here)
have their views in `wb.show_serving`. The quantization lab: `wb.quant_sensitivity` (which layers and tensors take
which format), `wb.quant_compare` (recipes side by side) and `wb.quant_plan` (mixed precision under an error
budget). A model or run projected onto an accelerator description: `wb.project`.

A run is named as everywhere: a run id (under `root`, default `$WORKBENCH_TRACES` or ./traces), a bundle
path, a `Bundle`, or what `wb.capture` returned (a list of bundles; a one-run function takes a list of
one). BokehJS is loaded inline once per kernel (`load_bokehjs`), so notebooks render and export offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.paths import traces_root
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle

if TYPE_CHECKING:
    import pandas as pd

    from workbench.trace import Trace

RunRef = str | Path | Bundle


def capture(root: str | Path | None = None, **settings: Any) -> list[Bundle]:
    """Run an experiment (see `workbench.experiment.ExperimentSettings` for the settings) and return its
    runs' bundles, the reference first. `batch` and `seq` may be lists: a sweep, one run per (variant, shape),
    variant by variant."""
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.trace.store.bundle import open_bundle

    result = run_experiment(ExperimentSettings(**settings), root)
    return [open_bundle(run.path, traces_root(root)) for run in result.runs]


def load_bokehjs() -> None:
    """Publish BokehJS inline into the notebook, once per kernel (unless `output_notebook` already did):
    inline, so notebooks render and export offline; once, because each copy adds megabytes to the file."""
    from bokeh.io import output_notebook
    from bokeh.io.state import curstate
    from bokeh.resources import INLINE

    if not curstate().notebook:
        output_notebook(INLINE, hide_banner=True)


def _render(layout: Any) -> None:
    """Show a Bokeh layout in the notebook, as wide as the output area (`fit_width`)."""
    from bokeh.io import show as bokeh_show

    load_bokehjs()
    bokeh_show(fit_width(layout))


def fit_width(layout: Any) -> Any:
    """`layout` with it and every part of it stretching to the width it is given, so that a view laid out for a
    fixed width (a report's, a panel's) fits a notebook's output area, however wide; parts keep their heights.
    Returns `layout`."""
    from bokeh.models import LayoutDOM

    for model in layout.select({"type": LayoutDOM}):
        model.sizing_mode = "stretch_width"
    return layout


def show(runs: RunRef | Sequence[RunRef], root: str | Path | None = None) -> None:
    """Render one run's dashboard, or the comparison and dashboards of several runs or an experiment."""
    from workbench.report import report_layout

    _render(report_layout(_bundles(runs, root)))


def compare(runs: Sequence[RunRef], root: str | Path | None = None, *, baseline: str | int | None = None) -> None:
    """Render the comparison view of several runs, captured or imported: latency and speedup where the runs
    were timed, numerics, and for runs with traces the trace comparison against the baseline (the reference
    variant of a capture, else the first run or `baseline`: a run id, its name or its position): step time,
    devices' busy/idle and copy overlap, op and kernel deltas; ops aligned; timelines."""
    from workbench.views.experiments import experiments_view

    _render(experiments_view(_bundles(runs, root), baseline=baseline))


def comparison(runs: Sequence[RunRef], baseline: str | int | None = None, *, top: int = 20,
               root: str | Path | None = None) -> dict[str, Any]:
    """The trace comparison of two or more runs against `baseline` (default the first), as `workbench diff
    --json` prints it: per run its step time and devices, per other run its op and kernel deltas (counts as
    integers, times in ns; the `top` largest regressions, improvements, new and vanished names)."""
    from workbench.analysis.diff import trace_comparison

    return trace_comparison(_bundles(runs, root), baseline).to_json(top)


def roofline(run: RunRef | Sequence[RunRef], device: str | None = None,
             root: str | Path | None = None) -> pd.DataFrame:
    """The roofline of a run's ops and kernels (its XLA ops for a JAX run) over its measured steps, as
    `workbench analyze RUN [--device]` computes it: one row per (kind, name, dtype), columns
    `workbench.analysis.roofline.ROOFLINE_COLUMNS`. `device` (a built-in name such as "h100", "cpu", or an
    accelerator YAML) overrides the device the run recorded; a `WorkbenchError` when neither names one."""
    from workbench.analysis.findings.bottlenecks import run_roofline
    from workbench.errors import WorkbenchError

    bundle = _one(run, root, "roofline")
    spec, table = run_roofline(bundle, device)
    if spec is None or table is None:
        raise WorkbenchError(f"run {bundle.run_id!r}: no device figures recorded and no known GPU in its trace; "
                             "name one: wb.roofline(run, device='a100') (a built-in name, 'cpu' or an "
                             "accelerator YAML)")
    return table.reset_index(drop=True)


def replay(run: RunRef | Sequence[RunRef], top: int = 20, *, variants: Sequence[str] = ("eager", "bf16", "compile"),
           iterations: int = 20, warmup: int = 3, root: str | Path | None = None) -> pd.DataFrame:
    """A run's `top` op signatures by self time rebuilt from their recorded inputs and timed alone, as `workbench
    replay RUN` does: columns `workbench.replay.table.REPLAY_COLUMNS`, settings and the replay's floor in `attrs`.
    Draw it with `workbench.views.replay.replay_view(table, title)`."""
    from workbench.replay.table import replay_run

    return replay_run(_one(run, root, "replay"), top=top, variants=variants, iterations=iterations, warmup=warmup)


def findings(run: RunRef | Sequence[RunRef], device: str | None = None,
             root: str | Path | None = None) -> pd.DataFrame:
    """A run's bottleneck findings, largest share of time first, as `workbench analyze RUN` ranks them:
    | kind | device | time_share | title | suggestion | evidence | (evidence: a dict). Memory-bound
    findings need device figures: the run's own, or `device`."""
    import pandas as pd

    from workbench.analysis.findings.bottlenecks import FINDING_COLUMNS, analyze_run

    result = analyze_run(_one(run, root, "findings"), device)
    return pd.DataFrame(result["findings"], columns=list(FINDING_COLUMNS))


def idle(run: RunRef | Sequence[RunRef], root: str | Path | None = None) -> pd.DataFrame:
    """Every idle gap of each device of a run (in its measured steps, the whole trace for an import), longest
    first, with what the host did meanwhile: | device | start_ns | end_ns | dur_ns | cause | sync_ns | memcpy_ns |
    runtime_ns | host_ns | untraced_ns | (`workbench.analysis.idle.idle_gaps`; empty for a CPU-only run)."""
    from workbench.analysis.breakdown import phase_window
    from workbench.analysis.idle import idle_gaps

    trace = _one(run, root, "idle").trace()
    return idle_gaps(trace, phase_window(trace, PHASE_MEASURE))


def critical_path(run: RunRef | Trace | Sequence[RunRef], step: int | None = None,
                  root: str | Path | None = None) -> pd.DataFrame:
    """The critical path of one profiled step of a run (or Trace), by default the step of median length: one row
    per segment in time order, | kind (cpu op, untraced, launch latency, kernel, memcpy, memset, wait) | name | row |
    start_ns | dur_ns | share | (`workbench.analysis.critical_path`). Its `attrs["path"]` is the `CriticalPath`,
    whose `what_if({"name": 2.0})` gives the step's length with those events twice as fast and `by_name()` sets
    each name's path share beside its share of device time."""
    from workbench.analysis.critical_path import critical_path as path_of

    path = path_of(_trace(run, root, "critical_path"), step)
    table = path.segments.copy()
    table.attrs["path"] = path
    return table


def call_tree(run: RunRef | Trace | Sequence[RunRef], *, phase: str | None = PHASE_MEASURE, threads: bool = True,
              root: str | Path | None = None) -> pd.DataFrame:
    """The call tree of a run's host spans over its `phase` (the measured steps of a capture; the whole trace without
    one), one row per call path with calls, total and self time (`workbench.analysis.call_tree.call_tree`)."""
    from workbench.analysis.breakdown import phase_window
    from workbench.analysis.call_tree import call_tree as tree

    trace = _trace(run, root, "call_tree")
    return tree(trace, phase_window(trace, phase) if phase else None, threads=threads)


def diff(a: RunRef | Trace | Sequence[RunRef], b: RunRef | Trace | Sequence[RunRef], *,
         phase: str | None = PHASE_MEASURE, per_step: bool = False, root: str | Path | None = None) -> pd.DataFrame:
    """Per (name, kind): count and time in run (or Trace) `a` and `b`, deltas and status (new, vanished,
    changed, unchanged), columns `workbench.analysis.diff.DIFF_COLUMNS`. Only each trace's `phase`
    annotation counts when it has one (a capture's measured steps); `per_step` divides by profiled steps."""
    from workbench.analysis.breakdown import phase_window
    from workbench.analysis.diff import trace_diff

    ta, tb = _trace(a, root, "diff"), _trace(b, root, "diff")
    windows = [phase_window(t, phase) if phase else None for t in (ta, tb)]
    return trace_diff(ta, tb, window_a=windows[0], window_b=windows[1], per_step=per_step)


def fusion(runs: RunRef | Sequence[RunRef], root: str | Path | None = None) -> pd.DataFrame:
    """One row per run: kernels, fusions, fused and unfused ops and time per profiled step
    (`workbench.analysis.fusion.fusion_table`)."""
    from workbench.analysis.fusion import fusion_inputs, fusion_table

    return fusion_table([fusion_inputs(bundle) for bundle in _bundles(runs, root)])


def fusion_detail(run: RunRef | Sequence[RunRef], root: str | Path | None = None) -> pd.DataFrame:
    """One run's fusions in detail: XLA's fusion instructions of a JAX run, or a TensorRT run's engine layers
    with the ONNX nodes each fused, its tactic, precision and time (`workbench.analysis.fusion.fusion_detail`)."""
    from workbench.analysis.fusion import fusion_detail as detail
    from workbench.analysis.fusion import fusion_inputs

    return detail(fusion_inputs(_one(run, root, "fusion_detail")))


def provenance(run: RunRef | Sequence[RunRef], against: RunRef | Sequence[RunRef] | None = None, *,
               by_source_op: bool = False, root: str | Path | None = None) -> pd.DataFrame:
    """One run's kernels with the source ops each computes (`workbench.analysis.provenance.provenance`); with
    `by_source_op` its time per source op instead; with `against` (a second run) both runs' kernels grouped
    by the source ops they share (`compare_by_source_op`, `run` as side a)."""
    from workbench.analysis import provenance as prov

    bundle = _one(run, root, "provenance")
    if against is not None:
        return prov.compare_by_source_op(bundle, _one(against, root, "provenance"))
    return prov.by_source_op(bundle) if by_source_op else prov.provenance(bundle)


def show_diff(a: RunRef | Sequence[RunRef], b: RunRef | Sequence[RunRef], *, phase: str | None = PHASE_MEASURE,
              per_step: bool = False, root: str | Path | None = None) -> None:
    """Render the diff view of two runs: the status-coloured table, the largest time deltas and both timelines
    aligned on their first step (`workbench.views.diff.diff_view`)."""
    from workbench.analysis.diff import run_names
    from workbench.views.diff import diff_view

    first, second = _one(a, root, "show_diff"), _one(b, root, "show_diff")
    labels = tuple(run_names([first.record, second.record]))
    if labels[0] == labels[1]:
        labels = (first.run_id, second.run_id)
    _render(diff_view(first.trace(), second.trace(), labels, phase=phase, per_step=per_step))


def sql(query: str, runs: RunRef | Sequence[RunRef] | None = None, *, limit: int | None = None,
        timeout_s: float | None = None, root: str | Path | None = None) -> pd.DataFrame:
    """The rows of one SQL SELECT over runs (every run of the traces root when `runs` is None), as `workbench
    query` runs it: tables events, memory, counters, kernel_metrics (where present) and runs, each with a `run`
    column, read-only (`workbench.analysis.sql`, docs/sql.md). At most `limit` rows (default 1,000), stopped
    after `timeout_s` (default 30 s); a `QueryError` of one line otherwise."""
    from workbench.analysis import sql as queries
    from workbench.trace.store.bundle import list_bundles

    bundles = list_bundles(traces_root(root)) if runs is None else _bundles(runs, root)
    result = queries.run_query(bundles, query, limit=limit or queries.DEFAULT_LIMIT,
                               timeout_s=timeout_s or queries.DEFAULT_TIMEOUT_S)
    if result.truncated:
        import warnings

        warnings.warn(f"only the first {len(result.table)} rows are returned; pass limit= for more", stacklevel=2)
    return result.to_pandas()


def sweep_table(runs: RunRef | Sequence[RunRef], reference: str = "eager",
                root: str | Path | None = None) -> pd.DataFrame:
    """A sweep's runs (an experiment id, or what `wb.capture` returned) as one row each: series (the variant),
    batch, seq, latency, throughput, peak memory and speedup over `reference` at the same shape
    (`workbench.analysis.sweep.sweep_table`)."""
    from workbench.analysis.sweep import sweep_table as table

    return table(_bundles(runs, root), reference)


def crossovers(runs: RunRef | Sequence[RunRef], reference: str | None = "eager", metric: str = "p50_ms",
               root: str | Path | None = None) -> pd.DataFrame:
    """Where, as batch grows, a variant starts to beat `reference` (every pair when None) on `metric` ("p50_ms",
    "p99_ms", "items_per_s", "tokens_per_s"): the batches either side and the interpolated crossing
    (`workbench.analysis.sweep.crossovers`)."""
    from workbench.analysis.sweep import crossovers as find
    from workbench.analysis.sweep import sweep_table as table

    return find(table(_bundles(runs, root), reference or ""), reference, metric)


def pareto(runs: RunRef | Sequence[RunRef], throughput: str = "items_per_s",
           root: str | Path | None = None) -> pd.DataFrame:
    """A sweep's ok runs by median latency, `on_front` marking those no other run beats on both latency and
    `throughput` (per sequence length; `workbench.analysis.sweep.pareto`)."""
    from workbench.analysis.sweep import pareto as front
    from workbench.analysis.sweep import sweep_table as table

    return front(table(_bundles(runs, root)), throughput=throughput)


def ranks(experiment: str, root: str | Path | None = None, *, cluster: str = "local",
          threshold: float = 0.10) -> pd.DataFrame:
    """The per-rank table of a job imported with `workbench import --ranks` (as `workbench ranks` prints it: busy,
    idle, compute, collective and exposed time, median step, stragglers), one query per rank where its bundle
    lies, on this machine's pool or a Ray cluster (`cluster`: "auto", "ray://HOST:PORT"). `root` may be a URL."""
    return _rank_aggregates(experiment, root, cluster, threshold).table


def show_ranks(experiment: str, root: str | Path | None = None, *, cluster: str = "local",
               threshold: float = 0.10) -> None:
    """Render the ranks view of a job imported with `workbench import --ranks` (ranks x steps heat map, step
    spread, stragglers) from its per-rank aggregates: no rank's events are loaded here."""
    from workbench.views.ranks import ranks_view

    _render(ranks_view(_rank_aggregates(experiment, root, cluster, threshold), threshold=threshold))


def serve(url: str | None = None, *, model: str | None = None, rate: float | Sequence[float] | None = None,
          concurrency: int | Sequence[int] | None = None, requests: int = 32, isl: int = 64, osl: int = 16,
          slo: str | None = None, root: str | Path | None = None, show: bool = True, **settings: Any) -> list[Bundle]:
    """Profile an inference server under load, as `workbench serve` does, and show its views: attach to `url`
    (give `tokenizer=`) or launch the engine (`model=`, default a 2-layer Llama-3; `engine_python=`), at one
    `rate` (requests/s) or `concurrency`, or a sweep of either; `slo` as "ttft=200ms,tpot=50ms". Other
    `settings` are `ServeRequest`'s (`profile_dir`, `window`, `generator`...) and `Load`'s (`arrival`,
    `isl_stddev`, `sessions`, `shared_prefix`...) fields. Returns the bundles written."""
    from dataclasses import fields

    from workbench.errors import WorkbenchError
    from workbench.serving.load import Load
    from workbench.serving.metrics import parse_slo
    from workbench.serving.run import ProfileWindow
    from workbench.serving.session import ServeRequest, run_serving
    from workbench.trace.store.bundle import open_bundle

    if rate is not None and concurrency is not None:
        raise WorkbenchError("wb.serve: give rate or concurrency, not both")
    load_keys = {f.name for f in fields(Load)} - {"rate", "concurrency", "requests", "isl", "osl"}
    shape = {"requests": requests, "isl": isl, "osl": osl, **{k: settings.pop(k) for k in list(settings)
                                                              if k in load_keys}}
    if isinstance(settings.get("window"), str):
        settings["window"] = ProfileWindow.parse(settings["window"])
    points = ([Load(concurrency=c, **shape) for c in _listed(concurrency)] if concurrency is not None else
              [Load(rate=r, **shape) for r in _listed(rate if rate is not None else 4.0)])
    request = ServeRequest(points=tuple(points), url=url, model=model, slo=parse_slo(slo) if slo else None,
                           **settings)
    where = traces_root(root)
    result = run_serving(request, where, print)
    bundles = [open_bundle(p.run_id, where) for p in result.points if p.run_id]
    if show and bundles:
        show_serving(bundles)
    return bundles


def _listed(value: Any) -> list[Any]:
    """One value or several as a list."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def show_serving(runs: RunRef | Sequence[RunRef], root: str | Path | None = None) -> None:
    """Render the serving views of serving runs (`workbench serve`): one run's request waterfall, engine steps
    and server metrics on one clock; for a sweep (an experiment id, or several runs) its throughput–latency
    curves, goodput and Pareto front first (`workbench.views.serving`)."""
    from workbench.errors import WorkbenchError
    from workbench.views.serving import serving_layout

    bundles = _bundles(runs, root)
    layout = serving_layout(bundles)
    if layout is None:
        raise WorkbenchError(f"wb.show_serving: no serving run among {', '.join(b.run_id for b in bundles)} "
                             "(record them with `workbench serve`)")
    _render(layout)


def quant_sensitivity(model: str = "tiny-gpt", formats: Sequence[str] | None = None, *, weights: str | None = None,
                      batch: int = 16, seq: int | None = None, show: bool = True, **overrides: Any) -> Any:
    """Which layers and tensor kinds of `model` take which low-bit format (`workbench.quant.lab.sensitivity_scan`:
    per layer × format, per tensor kind, outliers with SmoothQuant, error histograms); drawn unless `show` is
    False, and returned (its tables are DataFrames). A built-in with trained weights is judged on its held-out data
    (`weights` "random" for seeded ones); `overrides` configure a built-in (d_model=64, layers=2)."""
    from workbench.quant import lab
    from workbench.views.quant import sensitivity_view

    task = lab.quant_task(model, weights=weights, batch=batch, seq=seq, overrides=overrides)
    result = lab.sensitivity_scan(task, formats or lab.DEFAULT_FORMATS)
    if show:
        _render(sensitivity_view(result))
    return result


def quant_compare(model: str = "tiny-gpt", recipes: Sequence[str] | None = None, *, weights: str | None = None,
                  device: str = "b200", measure: bool = True, batch: int = 16, seq: int | None = None,
                  show: bool = True, **overrides: Any) -> pd.DataFrame:
    """`model` under each recipe (`--quant` syntax, e.g. "linear.weight=nvfp4,kv=fp8-e4m3/head") beside the fp32
    reference: accuracy, weight and KV-cache bytes, time projected on `device`, CPU time measured where a real
    kernel exists (`workbench.quant.lab.compare_recipes`); drawn unless `show` is False, and returned."""
    from workbench.quant import lab
    from workbench.views.quant import recipes_view

    task = lab.quant_task(model, weights=weights, batch=batch, seq=seq, overrides=overrides)
    table = lab.compare_recipes(task, recipes or lab.DEFAULT_RECIPES, device=device, measure=measure,
                                strict=recipes is not None)
    if show:
        _render(recipes_view(task.about, table, device=device))
    return table


def quant_plan(model: str = "tiny-gpt", fmt: str = "int4/group32", *, min_sqnr_db: float | None = None,
               max_kl: float | None = None, weights: str | None = None, batch: int = 16, seq: int | None = None,
               **overrides: Any) -> Any:
    """The fewest layers of `model` to keep in bf16 so that every other Linear weight can be stored in `fmt`
    within the budget (output SQNR at least `min_sqnr_db`, KL at most `max_kl`): a
    `workbench.quant.plan.Plan` with its recipe, the layers kept, the error reached, the weight bytes and each
    step of the search (`.steps`, a DataFrame)."""
    from workbench.quant import lab
    from workbench.quant.plan import mixed_precision_plan

    task = lab.quant_task(model, weights=weights, batch=batch, seq=seq, overrides=overrides)
    return mixed_precision_plan(task.module, task.inputs, fmt, min_sqnr_db=min_sqnr_db, max_kl=max_kl)


def project(target: str | RunRef | Sequence[RunRef], accelerator: str | Path, *, batch: int = 1,
            seq: int | None = None, chips: int = 1, dtype: str | None = None,
            shapes: dict[str, Sequence[int]] | None = None, root: str | Path | None = None) -> pd.DataFrame:
    """A model (a reference `load_model` takes: one forward of its example inputs), a model file (ONNX with its
    input `shapes`, a torch.export .pt2, XLA HLO text) or a run (its measured steps) projected onto an accelerator
    description, as `workbench project` does: one row per operator, columns
    `workbench.codesign.projection.PROJECTION_COLUMNS`; per kind or layer: `projection.totals(table, "kind")`.
    `chips` > 1 shards it tensor-parallel over the description's chip links; `dtype` projects it at another
    precision."""
    from workbench.codesign.description import resolve_description
    from workbench.codesign.projection import project as project_graph

    return project_graph(_projected_graph(target, batch, seq, dtype, shapes, root).graph,
                         resolve_description(accelerator), chips)


def project_guidance(target: str | RunRef | Sequence[RunRef], accelerator: str | Path, *, batch: int = 1,
                     seq: int | None = None, dtype: str | None = None, shapes: dict[str, Sequence[int]] | None = None,
                     root: str | Path | None = None) -> pd.DataFrame:
    """What in the model fits the accelerator badly and what a change would save (`workbench project`'s guidance):
    one row per finding, largest gain first: kind, title, change, gain_ns, gain_share, step and its `evidence`
    (a DataFrame of the operators that show it)."""
    import pandas as pd

    from workbench.codesign.description import resolve_description
    from workbench.codesign.guidance import guidance

    source = _projected_graph(target, batch, seq, dtype, shapes, root)
    found = guidance(source.graph, resolve_description(accelerator), steps=source.steps, llm=source.llm,
                     batch=source.batch, context=source.seq)
    return pd.DataFrame([{"kind": f.kind, "title": f.title, "change": f.change, "gain_ns": f.gain_ns,
                          "gain_share": f.gain_share, "step": f.step, "evidence": f.evidence} for f in found],
                        columns=["kind", "title", "change", "gain_ns", "gain_share", "step", "evidence"])


def _projected_graph(target: str | RunRef | Sequence[RunRef], batch: int, seq: int | None, dtype: str | None,
                     shapes: dict[str, Sequence[int]] | None, root: str | Path | None) -> Any:
    """The `GraphSource` of what `project` projects, at `dtype` when given."""
    from dataclasses import replace

    from workbench.codesign.graph import at_dtype
    from workbench.codesign.sources import graph_source, run_graph

    if isinstance(target, str):  # a model file, a run id or bundle path, else a model reference
        source = graph_source(target, traces_root(root), batch=batch, seq=seq, shapes=shapes)
    else:
        source = run_graph(_one(target, root, "project"))
    return replace(source, graph=at_dtype(source.graph, dtype)) if dtype else source


def _rank_aggregates(experiment: str, root: str | Path | None, cluster: str, threshold: float) -> Any:
    from workbench.analysis.rank_queries import job_aggregates
    from workbench.distributed import engine_for
    from workbench.paths import root_where_it_lies

    engine = None if cluster == "local" else engine_for(cluster)
    return job_aggregates(root_where_it_lies(root), experiment, engine=engine, threshold=threshold)


def _one(run: RunRef | Sequence[RunRef], root: str | Path | None, what: str) -> Bundle:
    """The one bundle `run` names (a list of one, as `wb.capture` returns for one variant, is fine)."""
    from workbench.errors import WorkbenchError

    bundles = _bundles(run, root)
    if len(bundles) != 1:
        raise WorkbenchError(f"wb.{what} takes one run, got {len(bundles)} "
                             f"({', '.join(b.run_id for b in bundles)}): pass one of them, e.g. runs[0]")
    return bundles[0]


def _trace(run: RunRef | Trace | Sequence[RunRef], root: str | Path | None, what: str) -> Trace:
    """A Trace as given, else the trace of the one run `run` names."""
    from workbench.trace import Trace

    return run if isinstance(run, Trace) else _one(run, root, what).trace()


def _bundles(runs: RunRef | Sequence[RunRef], root: str | Path | None) -> list[Bundle]:
    """Bundles from bundles, run ids, bundle paths or experiment ids."""
    from workbench.trace.store.resolve import resolve_runs

    items = [runs] if isinstance(runs, (str, Path, Bundle)) else list(runs)
    bundles: list[Bundle] = []
    for item in items:
        bundles.extend([item] if isinstance(item, Bundle) else resolve_runs([item], traces_root(root)))
    return bundles
