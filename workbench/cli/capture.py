"""`workbench capture`: benchmark and profile a model in several variants into bundles and an experiment; and
the end every experiment command shares (report, table or JSON, exit code)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from workbench.cli.options import json_option, out_option, parse_overrides
from workbench.cli.render import err, errors, out, print_failures, print_json, print_table, progress
from workbench.errors import EXIT_PARTIAL
from workbench.limits import check_limits
from workbench.paths import checked_output, checked_root
from workbench.views.text_tables import Cell, TextTable, cells, format_number, status_cell

DEFAULT_VARIANTS = "eager,bf16,compile,int8"
CAPTURE_COLUMNS = ("variant", "status", "p50 ms", "p99 ms", "speedup", "first call s", "SQNR dB", "top-1", "run")


@click.command()
@click.option("--model", default="tiny-gpt", show_default=True,
              help="Built-in model, package.module:factory, or a saved torch.export program (.pt2).")
@click.option("--variants", default=DEFAULT_VARIANTS, show_default=True,
              help="Comma-separated variants (eager, bf16, compile, compile-bf16, int8, int8-weight-only).")
@click.option("--batch", default=4, show_default=True, type=click.IntRange(min=1))
@click.option("--seq", default=None, type=click.IntRange(min=1), help="Sequence length (tiny-gpt; default 128).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--iterations", default=30, show_default=True, type=click.IntRange(min=1),
              help="Timed iterations per variant (interleaved).")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0))
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="torch threads during the run (1 gives the steadiest timings on small machines).")
@click.option("--profile/--no-profile", default=True, show_default=True, help="Capture a torch.profiler trace.")
@click.option("--steady-state-only", is_flag=True,
              help="Record only the profiled steps (torch.profiler schedule), not load/compile/warmup.")
@click.option("--profile-steps", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (slower).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Model config override, e.g. --set layers=4 --set kv_heads=2.")
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
def capture(model: str, variants: str, batch: int, seq: int | None, device: str, iterations: int, warmup: int,
            threads: int | None, profile: bool, steady_state_only: bool, profile_steps: int, with_stack: bool,
            overrides: tuple[str, ...], report_path: Path | None, out_dir: Path | None, as_json: bool,
            progress_json: bool, profiler: str, kernel_name: str | None, launch_count: int) -> None:
    """Benchmark and profile a model in several variants: one bundle per variant plus an experiment."""
    with errors():  # misuse fails here, before the model and its framework load
        model_overrides = parse_overrides(overrides)
        check_limits({"batch": batch, "seq": seq, "iterations": iterations, "warmup": warmup,
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
        )
        with progress(as_json, progress_json) as bars:
            result = run_experiment(settings, root, progress=bars)
    runs = [r.to_dict() for r in result.runs]
    finish_sweep(result.experiment_id, root, runs, capture_table(result.experiment_id, runs), "variant",
                 report_path, as_json)


def capture_table(experiment_id: str, runs: list[dict[str, Any]]) -> TextTable:
    """The variants of a capture (`RunResult.to_dict()`s) with their headline figures."""
    rows = tuple(cells(run["variant"], status_cell(run["status"]), run.get("p50_ms"), run.get("p99_ms"),
                       Cell(format_number(run.get("speedup"), "x")), run.get("first_call_s"), run.get("sqnr_db"),
                       run.get("top1_agreement"), run.get("run_id") or "-") for run in runs)
    return TextTable(f"experiment {experiment_id}", CAPTURE_COLUMNS, rows, left=frozenset({"variant", "status", "run"}))


def finish_sweep(experiment_id: str, root: Path, runs: list[dict[str, Any]], table: TextTable, noun: str,
                 report_path: Path | None, as_json: bool) -> None:
    """The end of a command that ran an experiment (capture, generate): its HTML report written to `report_path`
    when given, then its result as JSON, or its `table` and each failed `noun`'s error; exit code 1 when some
    run failed."""
    written = None
    if report_path is not None:
        from workbench.report import report_layout, write_report
        from workbench.trace.resolve import resolve_runs

        with errors(), err.status("building the report", spinner="dots"):
            layout = report_layout(resolve_runs([experiment_id], root))
            written = str(write_report(layout, report_path, title=f"workbench: {experiment_id}"))
    if as_json:
        print_json({"experiment": experiment_id, "root": str(root), "runs": runs, "report": written})
    else:
        print_table(table)
        print_failures(runs, noun, root)
        if written:
            out.print(f"report: {written}")
    if any(r["status"] != "ok" for r in runs):
        sys.exit(EXIT_PARTIAL)
