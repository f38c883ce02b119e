"""`workbench capture`: benchmark and profile a model in several variants (at one shape, or a sweep over a grid of
batch sizes and sequence lengths) into bundles and an experiment; and the end every experiment command shares
(report, table or JSON, the sweep's table and crossovers when the runs form one, exit code)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from workbench.cli.options import json_option, out_option, parse_overrides, set_option, sweep_ints
from workbench.cli.render import err, errors, out, print_blocks, print_failures, print_json, print_table, progress
from workbench.cli.traces import median_cell
from workbench.errors import EXIT_PARTIAL, WorkbenchError
from workbench.limits import check_limits
from workbench.paths import checked_output, checked_root
from workbench.views.text_tables import Cell, TextTable, cells, format_number, status_cell

DEFAULT_VARIANTS = "eager,bf16,compile,int8"
CAPTURE_COLUMNS = ("variant", "status", "p50 ms", "p99 ms", "speedup", "first call s", "SQNR dB", "top-1", "run")


@click.command()
@click.option("--model", default="tiny-gpt", show_default=True,
              help="Built-in model, package.module:factory, a saved torch.export program (.pt2), or an ONNX file "
                   "(onnx:<file> or a .onnx path; ort-* variants only).")
@click.option("--variants", default=DEFAULT_VARIANTS, show_default=True,
              help="Comma-separated variants (eager, bf16, compile, compile-bf16, int8, int8-weight-only).")
@click.option("--batch", default="4", show_default=True, callback=sweep_ints, metavar="N[,N...]",
              help="Batch size, or a comma-separated sweep (1,2,4,8): every variant runs at every shape, interleaved.")
@click.option("--seq", default=None, callback=sweep_ints, metavar="N[,N...]",
              help="Sequence length (tiny-gpt; default 128), or a comma-separated sweep (128,512).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--iterations", default=30, show_default=True, type=click.IntRange(min=1),
              help="Timed iterations per variant (interleaved).")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0))
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="torch threads during the run (default: 1 on machines with 4 cores or fewer, which gives the "
                   "steadiest timings there; torch's own setting on larger ones).")
@click.option("--profile/--no-profile", default=True, show_default=True, help="Capture a torch.profiler trace.")
@click.option("--steady-state-only", is_flag=True,
              help="Record only the profiled steps (torch.profiler schedule), not load/compile/warmup.")
@click.option("--profile-steps", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (slower).")
@set_option("Model config override, e.g. --set layers=4 kv_heads=2 (or --set layers=4 --set kv_heads=2).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the experiment's HTML report to this file.")
@out_option
@json_option
@click.option("--progress-json", is_flag=True,
              help='Progress as JSON lines on stderr ({"task", "completed", "total", "done"}) for programs.')
@click.option("--profiler", type=click.Choice(["framework", "nsys", "ncu"]), default="framework", show_default=True,
              help="framework: torch.profiler / jax.profiler; nsys: Nsight Systems timeline of the measured steps "
                   "(CUDA); ncu: Nsight Compute metrics of the measured steps' kernels, beside the framework trace.")
@click.option("--kernel-name", default=None,
              help="ncu: profile only these kernels (a name, or regex:<expression>).")
@click.option("--launch-count", default=50, show_default=True, type=click.IntRange(min=1),
              help="ncu: kernel launches to profile per variant.")
@click.option("--profile-shapes", type=click.Choice(["all", "largest"]), default="all", show_default=True,
              help="A sweep: profile every shape (memory curves need each), or only the largest (quicker).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS",
              help="An ONNX file model's input shape, e.g. --shape pixel_values=1x3x224x224 (default: from the "
                   "graph, symbolic dims from --batch / --seq).")
def capture(model: str, variants: str, batch: int | tuple[int, ...], seq: int | tuple[int, ...] | None, device: str,
            iterations: int, warmup: int, threads: int | None, profile: bool, steady_state_only: bool,
            profile_steps: int, with_stack: bool, overrides: tuple[str, ...], report_path: Path | None,
            out_dir: str | None, as_json: bool, progress_json: bool, profiler: str, kernel_name: str | None,
            launch_count: int, profile_shapes: str, shapes: tuple[str, ...] = ()) -> None:
    """Benchmark and profile a model in several variants: one bundle per variant (per variant and shape for a
    sweep) plus an experiment."""
    with errors():  # misuse fails here, before the model and its framework load
        model_overrides = parse_overrides(overrides)
        if shapes:
            from workbench.models.onnx_file import shape_overrides

            model_overrides.update(shape_overrides(shapes))
        check_limits({"batch": _largest(batch), "seq": _largest(seq), "iterations": iterations, "warmup": warmup,
                      "profile_steps": profile_steps, "threads": threads, "overrides": model_overrides})
        root = checked_root(out_dir, writing=True)
        report_path = checked_output(report_path) if report_path is not None else None
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.profiling.settings import ProfileSettings

    with errors():
        settings = ExperimentSettings(
            model=model,
            variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
            batch=batch,
            seq=seq,
            device=device,
            warmup=warmup,
            iterations=iterations,
            profile=profile,
            profile_settings=ProfileSettings(record_setup=not steady_state_only, active_steps=profile_steps,
                                             with_stack=with_stack),
            threads=threads,
            model_overrides=model_overrides,
            profiler=profiler,
            kernel_name=kernel_name,
            launch_count=launch_count,
            profile_shapes=profile_shapes,
        )
        with progress(as_json, progress_json) as bars:
            result = run_experiment(settings, root, progress=bars)
    runs = [r.to_dict() for r in result.runs]
    finish_sweep(result.experiment_id, root, runs, capture_table(result.experiment_id, runs), "variant",
                 report_path, as_json)


def _largest(value: int | tuple[int, ...] | None) -> int | None:
    """The largest of a size's values (what the limits bound)."""
    return max(value) if isinstance(value, tuple) else value


def capture_table(experiment_id: str, runs: list[dict[str, Any]]) -> TextTable:
    """The variants of a capture (`RunResult.to_dict()`s) with their headline figures; its title says when the
    weights were random (numerics then compare variants only)."""
    from workbench.analysis.summary import RANDOM_WEIGHTS_NOTE

    rows = tuple(cells(run.get("label") or run["variant"], status_cell(run["status"]),
                       median_cell(run.get("p50_ms"), _noise(run)),
                       run.get("p99_ms"),
                       Cell(format_number(run.get("speedup"), "x")), run.get("first_call_s"), run.get("sqnr_db"),
                       run.get("top1_agreement"), run.get("run_id") or "-") for run in runs)
    random = any(run.get("weights") == "random" for run in runs)
    trained = next((run["training"] for run in runs if run.get("training")), None)
    title = f"experiment {experiment_id}" + (f" · {RANDOM_WEIGHTS_NOTE}" if random else "") + \
        (f" · model {trained}" if trained else "")
    return TextTable(title, CAPTURE_COLUMNS, rows, left=frozenset({"variant", "status", "run"}))


def _noise(run: dict[str, Any]) -> str | None:
    """Why a captured run's latency samples are noisy (`workbench.analysis.noise`), read from its bundle."""
    from workbench.analysis.summary import noise_reason
    from workbench.trace.store.bundle import load_record

    try:
        return noise_reason(load_record(Path(run["path"]) / "run.json", f"run {run['run_id']!r}").get("benchmark"))
    except (KeyError, WorkbenchError):
        return None


def finish_sweep(experiment_id: str, root: Path, runs: list[dict[str, Any]], table: TextTable, noun: str,
                 report_path: Path | None, as_json: bool) -> None:
    """The end of a command that ran an experiment (capture, generate): its HTML report written to `report_path`
    when given, then its result as JSON, or its `table` and each failed `noun`'s error; exit code 1 when some
    run failed. When its runs ran at several shapes, the sweep's table and crossovers (against the experiment's
    reference variant; every pair in a generation sweep) follow the table, and are the JSON's `sweep`."""
    sweep = _sweep(experiment_id, root)
    written = None
    if report_path is not None:
        from workbench.report import write_run_report
        from workbench.trace.store.resolve import resolve_runs

        with errors(), err.status("building the report", spinner="dots"):
            written = str(write_run_report(resolve_runs([experiment_id], root), report_path,
                                           title=f"workbench: {experiment_id}"))
    if as_json:
        print_json({"experiment": experiment_id, "root": str(root), "runs": runs, "report": written,
                    **({"sweep": sweep} if sweep else {})})
    else:
        print_table(table)
        if sweep:
            print_blocks(sweep_blocks(sweep))
        print_failures(runs, noun, root)
        if written:
            out.print(f"report: {written}")
    if any(r["status"] != "ok" for r in runs):
        sys.exit(EXIT_PARTIAL)


SWEEP_COLUMNS = ("variant", "batch", "seq", "new", "p50 ms", "p99 ms", "items/s", "tokens/s", "peak MiB", "speedup",
                 "pareto")


def _sweep(experiment_id: str, root: Path) -> dict[str, Any] | None:
    """The sweep summary (`workbench.analysis.sweep.sweep_summary`) of the experiment, None when it is no sweep."""
    from workbench.analysis.sweep import is_sweep, sweep_summary
    from workbench.trace.store.experiment import read_experiment
    from workbench.trace.store.records import GENERATION, ExperimentRecord
    from workbench.trace.store.resolve import resolve_runs

    with errors():
        bundles = resolve_runs([experiment_id], root)
        if not is_sweep(bundles):
            return None
        record = ExperimentRecord.from_json(read_experiment(root, experiment_id).info, experiment_id)
        return sweep_summary(bundles, None if record.kind == GENERATION else record.reference)


def sweep_blocks(sweep: dict[str, Any]) -> list[TextTable | str]:
    """A sweep summary as text: its curves as a table (one row per run, variant then batch), then one line per
    crossover."""
    front = {row["run"] for row in sweep["pareto"]}
    values = [dict(zip(SWEEP_COLUMNS, (
        r["series"], r["batch"], r["seq"], r["new"], r["p50_ms"], r["p99_ms"], r["items_per_s"], r["tokens_per_s"],
        None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20, Cell(format_number(r["speedup"], "x")),
        "front" if r["run"] in front else ""), strict=True)) for r in sweep["table"]]
    shown = tuple(c for c in SWEEP_COLUMNS if c not in ("seq", "new") or any(v[c] is not None for v in values))
    rows = tuple(cells(*(v[c] for c in shown)) for v in values)
    blocks: list[TextTable | str] = [TextTable("sweep", shown, rows, left=frozenset({"variant", "pareto"}))]
    for c in sweep["crossovers"]:
        where = "".join(f" {key} {c[key]}" for key in ("seq", "new") if c[key] is not None)
        blocks.append(f"crossover{where}: {c['winner']} beats {c['loser']} from batch {c['batch_above']} "
                      f"(crossing at ~{c['crossover_batch']:.3g}; {c['speedup_below']:.2f}x at batch "
                      f"{c['batch_below']}, {c['speedup_above']:.2f}x at {c['batch_above']})")
    return blocks
