"""The `workbench` command line: capture, import, ls, show, rm.

Exit codes: 0 success; 1 a capture in which some variants failed (the others were written);
2 bad input or misuse (unknown model or variant, unreadable trace, missing run, a setting above its
limit, an unwritable traces root or output path, a full disk) with a one-line error on stderr;
130 interrupted, at any moment (`workbench.interrupts`). `--json` prints machine-readable output on
stdout and nothing else there. Text is printed as it is, never read as markup (`workbench.terminal`).
"""

from __future__ import annotations

from workbench.interrupts import QuietWhileLoading

with QuietWhileLoading():  # Ctrl-C while this module loads exits 130 quietly, like one in a command
    import json
    import os
    import sys
    from collections.abc import Iterator
    from contextlib import contextmanager
    from pathlib import Path
    from typing import Any

    import click
    from rich.table import Table
    from rich.text import Text

    from workbench.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PARTIAL, WorkbenchError
    from workbench.limits import MAX_ITERATIONS, check_limits
    from workbench.paths import checked_output, checked_root
    from workbench.terminal import CommandGroup, err, errors, labelled, out, status_text, styled

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_PARTIAL", "main"]
"""The command group, and the exit codes it ends with (defined in `workbench.errors`)."""

DEFAULT_VARIANTS = "eager,bf16,compile,int8"

_out_option = click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Traces root (default: $WORKBENCH_TRACES or ./traces).",
)
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _progress(as_json: bool, progress_json: bool) -> Any:
    """Progress of a long command: JSON lines on stderr for programs (`--progress-json`), else rich bars
    on stderr, which `--json` turns off."""
    from workbench.progress import JsonProgress, RichProgress

    return JsonProgress(sys.stderr) if progress_json else RichProgress(err, enabled=not as_json)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="workbench")
def main() -> None:
    """Profiling workbench for deep-learning inference: capture, import and compare runs."""


@main.command()
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
@_out_option
@_json_option
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
        model_overrides = _parse_overrides(overrides)
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
        with _progress(as_json, progress_json) as progress:
            result = run_experiment(settings, root, progress=progress)
    runs = [r.to_dict() for r in result.runs]
    written = None
    if report_path is not None:
        from workbench.report import report_layout, write_report
        from workbench.trace.resolve import resolve_runs

        with errors(), err.status("building the report", spinner="dots"):
            layout = report_layout(resolve_runs([result.experiment_id], root))
            written = str(write_report(layout, report_path, title=f"workbench: {result.experiment_id}"))
    if as_json:
        _print_json({"experiment": result.experiment_id, "root": str(root), "runs": runs, "report": written})
    else:
        _print_capture(result.experiment_id, root, runs)
        if written:
            out.print(f"report: {written}")
    if any(r["status"] != "ok" for r in runs):
        sys.exit(EXIT_PARTIAL)


@main.command(name="_profile-variant", hidden=True)
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
def profile_variant_child(spec: Path) -> None:
    """Internal: one variant's profiled lifecycle in a process that nsys or ncu launched (see
    workbench.profiling.child); SPEC is the JSON file describing it."""
    from workbench.profiling.child import run_child

    with errors():
        run_child(spec)


def _parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """`key=value` pairs with values read as JSON where they parse (numbers, true, null)."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise WorkbenchError(f"--set {item!r}: expected KEY=VALUE, e.g. --set layers=4")
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError:
            values[key] = text
    return values


def _print_capture(experiment_id: str, root: Path, runs: list[dict[str, Any]]) -> None:
    table = Table(title=f"experiment {experiment_id}", title_justify="left")
    for column in ("variant", "status", "p50 ms", "p99 ms", "speedup", "first call s", "SQNR dB", "top-1", "run"):
        table.add_column(column, justify="right" if column not in ("variant", "status", "run") else "left")
    for run in runs:
        table.add_row(
            run["variant"], status_text(run["status"]),
            _fmt(run.get("p50_ms")), _fmt(run.get("p99_ms")), _fmt(run.get("speedup"), "x"),
            _fmt(run.get("first_call_s")), _fmt(run.get("sqnr_db")), _fmt(run.get("top1_agreement")),
            run.get("run_id") or "-",
        )
    out.print(table)
    for run in runs:
        if run["status"] != "ok":
            err.print(labelled(f"variant {run['variant']} failed:", "red", run.get("error")))
    out.print(f"bundles in {root}; look at one with: workbench show RUN --out {root}")


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.3g}{suffix}" if abs(value) < 1000 else f"{value:,.0f}{suffix}"


@main.command(name="import")
@click.argument("files", nargs=-1, required=False, type=click.Path(path_type=Path))
@click.option("--ranks", "ranks_dir", type=click.Path(path_type=Path), default=None,
              help="A folder of per-rank traces of one job (Kineto with distributedInfo, or one nsys export per "
                   "process): one bundle per rank on a shared time axis, plus an experiment grouping them.")
@click.option("--align", type=click.Choice(["clock", "collective"]), default="clock", show_default=True,
              help="With --ranks: put ranks on one axis by their hosts' clocks, or also line up the end of each "
                   "rank's first NCCL/RCCL collective kernel (corrects clock skew between hosts).")
@_out_option
@_json_option
def import_(files: tuple[Path, ...], ranks_dir: Path | None, align: str, out_dir: Path | None,
            as_json: bool) -> None:
    """Make bundles from traces captured elsewhere (Kineto/Chrome JSON or .json.gz, XSpace .xplane.pb or a
    plugins/profile folder, Nsight Systems SQLite); prints the run ids."""
    from workbench.imports import import_traces

    if ranks_dir is not None:
        _import_ranks(files, ranks_dir, align, out_dir, as_json)
        return
    if align != "clock":
        raise click.UsageError("--align applies to --ranks FOLDER")
    if not files:
        raise click.UsageError("give trace files to import, or --ranks FOLDER")
    with errors():
        root = checked_root(out_dir, writing=True)
    with errors(), err.status("reading traces", spinner="dots") if not as_json else _nothing():
        run_ids = import_traces(files, root)
    _print_warnings(run_ids, root)
    if as_json:
        _print_json(run_ids)
    else:
        for run_id in run_ids:
            click.echo(run_id)


def _import_ranks(files: tuple[Path, ...], folder: Path, align: str, out_dir: Path | None, as_json: bool) -> None:
    """`import --ranks FOLDER`: print the experiment id and the run id of each rank."""
    from workbench.imports import import_ranks

    if files:
        raise click.UsageError("give either trace files or --ranks FOLDER, not both")
    with errors():
        root = checked_root(out_dir, writing=True)
    with errors(), err.status("reading rank traces", spinner="dots") if not as_json else _nothing():
        experiment_id, run_ids = import_ranks(folder, root, align=align)
    if as_json:
        _print_json({"experiment": experiment_id, "runs": run_ids})
    else:
        click.echo(f"experiment {experiment_id}")
        for run_id in run_ids:
            click.echo(run_id)


def _print_warnings(run_ids: list[str], root: Path) -> None:
    """The trace reader's warnings about each imported run (an empty trace...), on stderr."""
    from workbench.analysis.summary import reader_warnings
    from workbench.trace.bundle import open_bundle

    for run_id in run_ids:
        for warning in reader_warnings(open_bundle(run_id, root).info):
            err.print(labelled("warning:", "yellow", f"{run_id}: {warning}"))


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@main.command(name="ls")
@_out_option
@_json_option
def ls(out_dir: Path | None, as_json: bool) -> None:
    """List the runs under the traces root, oldest first."""
    from workbench.analysis.summary import run_row
    from workbench.trace.bundle import list_bundles

    problems: list[str] = []
    with errors():
        root = checked_root(out_dir, writing=False)
        bundles = list_bundles(root, on_problem=lambda path, message: problems.append(f"{path}: {message}"))
    rows = [run_row(b.run_id, b.info) for b in bundles]
    if as_json:
        _print_json(rows)
    else:
        table = Table(title=f"runs in {root}", title_justify="left")
        for column in ("run", "model", "variant", "device", "status", "p50 ms", "experiment", "created"):
            table.add_column(column, justify="right" if column == "p50 ms" else "left", no_wrap=column == "run")
        for row in rows:
            table.add_row(row["run"], row["model"] or "-", row["variant"] or "-", row["device"] or "-",
                          row["status"], _fmt(row["p50_ms"]), row["experiment"] or "-", row["created"][:19])
        out.print(table if rows else f"no runs in {root} (create some with `workbench capture`)")
    for problem in problems:
        err.print(labelled("skipped", "yellow", problem))


@main.command()
@click.argument("run")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the op tables.")
@_out_option
@_json_option
def show(run: str, top: int, out_dir: Path | None, as_json: bool) -> None:
    """Summary of one run (id under the traces root, or a bundle's path)."""
    from workbench.analysis.summary import run_summary
    from workbench.trace.bundle import open_bundle

    with errors():
        summary = run_summary(open_bundle(run, checked_root(out_dir, writing=False)), top=top)
    if as_json:
        _print_json(summary)
    else:
        _print_summary(summary)


def _print_summary(s: dict[str, Any]) -> None:
    out.print(Text.assemble((s["run"], "bold"), f"  model {s['model'] or '-'}  variant {s['variant'] or '-'}  "
                            f"device {s['device']}  status {s['status']}"))
    if s.get("error"):
        err.print(labelled("error:", "red", s["error"]))
    for warning in s.get("warnings") or ():
        err.print(labelled("warning:", "yellow", warning))
    if s["latency_ms"]:
        _kv_table("latency (ms)", {**s["latency_ms"], **s["throughput"], "first call s": s.get("first_call_s")})
    if s["numerics"]:
        _kv_table("numerics vs fp32 eager", s["numerics"])
    if s.get("llm"):
        _kv_table("generation", {k: v for k, v in s["llm"].items() if not isinstance(v, (dict, list))})
    if s["events"]:
        _kv_table("events", {**s["events"], **{f"kernel time {d} (ms)": ns / 1e6 for d, ns in s["kernel_ns"].items()},
                             **{f"memory peak {d} (MiB)": n / 2**20 for d, n in s["memory_peak_bytes"].items()}})
    scope = f" ({s['ops_window']})"
    for title, rows in ((f"top ops{scope}", s["top_ops"]), (f"top kernels{scope}", s["top_kernels"])):
        if not rows:
            continue
        table = Table(title=title, title_justify="left")
        for column in ("name", "calls", "total ms", "self ms", "device ms", "share"):
            table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True,
                             overflow="ellipsis", max_width=70 if column == "name" else None)
        for row in rows:
            table.add_row(row["name"], str(row["calls"]), _fmt(row["total_ns"] / 1e6), _fmt(row["self_ns"] / 1e6),
                          _fmt(row["device_ns"] / 1e6), f"{row['share']:.1%}")
        out.print(table)


def _kv_table(title: str, values: dict[str, Any]) -> None:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in values.items():
        table.add_row(str(key), _fmt(value))
    out.print(table)


@main.command()
@click.argument("refs", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write (default: report-<first ref>.html in the traces root).")
@_out_option
def report(refs: tuple[str, ...], output: Path | None, out_dir: Path | None) -> None:
    """Write a self-contained HTML report of runs or experiments (opens offline, no workbench needed)."""
    from workbench.report import report_layout, write_report
    from workbench.trace.resolve import resolve_runs

    with errors():
        root = checked_root(out_dir, writing=False)
        bundles = resolve_runs(refs, root)
        output = checked_output(output or root / f"report-{Path(refs[0]).name}.html")
        with err.status("building the report", spinner="dots"):
            path = write_report(report_layout(bundles), output, title=f"workbench: {', '.join(refs)}")
    click.echo(str(path))


@main.command()
@click.argument("runs", nargs=-1, required=True)
@_out_option
def rm(runs: tuple[str, ...], out_dir: Path | None) -> None:
    """Delete runs (ids under the traces root, or bundle paths)."""
    from workbench.trace.bundle import delete_bundle
    from workbench.trace.staging import sweep

    with errors():
        root = checked_root(out_dir, writing=True)
        sweep(root)
        for run in runs:
            delete_bundle(run, root)
            click.echo(f"deleted {run}")


@main.command(name="xprof")
@click.argument("run")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: a free one).")
@click.option("--no-browser", is_flag=True,
              help="Print the URL without opening a browser (none opens where there is no display).")
@_out_option
def xprof(run: str, port: int, no_browser: bool, out_dir: Path | None) -> None:
    """Serve XProf's own UI on a JAX run (id or bundle path), on 127.0.0.1, until Ctrl-C."""
    import webbrowser

    from workbench.trace.bundle import open_bundle
    from workbench.xprof_server import serve_bundle

    with errors():
        bundle = open_bundle(run, checked_root(out_dir, writing=False))
        with err.status("starting XProf", spinner="dots"):
            server = serve_bundle(bundle, port=port)
        with server:
            click.echo(server.url)
            err.print("XProf is serving; press Ctrl-C to stop it")
            if not no_browser and _has_gui():
                webbrowser.open(server.url)
            code = server.wait()
            tail = server.log_tail()
        raise WorkbenchError(f"the XProf server stopped by itself (exit code {code}); its log ends:\n{tail}")


def _has_gui() -> bool:
    """Whether a browser window can open: without a display, Python's `webbrowser` would start a
    console browser (lynx, w3m) in this terminal instead."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@main.command()
@click.argument("run")
@click.option("--device", "device", default=None, metavar="SPEC",
              help="Roofline against this device instead of the run's own: a built-in name (H100-SXM, "
                   "tpu-v5e...), cpu, or an accelerator YAML file.")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1), help="Roofline rows printed.")
@_out_option
@_json_option
def analyze(run: str, device: str | None, top: int, out_dir: Path | None, as_json: bool) -> None:
    """Where the time goes and what bounds it: ranked findings with evidence and next steps, device
    idle time, and the roofline of ops and kernels (the steady state of a capture)."""
    from workbench.analysis.bottlenecks import analyze_run
    from workbench.trace.bundle import open_bundle

    with errors():
        bundle = open_bundle(run, checked_root(out_dir, writing=False))
        with err.status("analyzing", spinner="dots"):
            result = analyze_run(bundle, device)
    if as_json:
        _print_json(result)
        return
    _print_analysis(result, top)


def _print_analysis(result: dict[str, Any], top: int) -> None:
    window = result.get("window")
    scope = "measure phase" if window else "whole trace"
    out.print(Text.assemble((result["run"], "bold"),
                            f"  device figures: {result['device'] or 'unknown (give --device)'}  ({scope})"))
    findings = Table(title="findings, largest share first", title_justify="left")
    for column in ("kind", "share", "what", "next step"):
        findings.add_column(column, justify="right" if column == "share" else "left", overflow="fold",
                            max_width=None if column in ("kind", "share") else 60)
    for finding in result["findings"]:
        findings.add_row(finding["kind"], f"{finding['time_share']:.1%}", finding.get("title") or "",
                         finding["suggestion"])
    out.print(findings if result["findings"] else "no findings")
    if result["idle"]:
        _kv_table("device idle (ms)", {
            f"{device} {key.removesuffix('_ns').replace('_', ' ')}": value / 1e6
            for device, idle in result["idle"].items()
            for key, value in idle.items() if key in ("busy_ns", "idle_ns", "largest_gap_ns")})
    if result["roofline"]:
        roof = Table(title=f"roofline (top {top} by time)", title_justify="left")
        for column in ("kind", "name", "calls", "ms", "FLOP/B", "achieved TFLOP/s", "GB/s", "bound", "of roof",
                       "work from"):
            roof.add_column(column, justify="left" if column in ("kind", "name", "bound", "work from") else "right",
                            no_wrap=True, overflow="ellipsis", max_width=60 if column == "name" else None)
        for row in result["roofline"][:top]:
            roof.add_row(row["kind"], row["name"], str(row["calls"]), _fmt(row["time_ns"] / 1e6),
                         _fmt(row["intensity"]), _fmt((row["achieved_flops_per_s"] or 0) / 1e12),
                         _fmt((row["achieved_bytes_per_s"] or 0) / 1e9), str(row["bound"]),
                         "-" if row["fraction_of_roof"] is None else f"{row['fraction_of_roof']:.1%}",
                         row.get("source") or "-")
        out.print(roof)


@main.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--device", "devices", multiple=True, metavar="SPEC",
              help="Also project each run onto this device (repeatable): a built-in name, cpu, or an accelerator YAML.")
@click.option("--price", "price", type=click.FloatRange(min=0), default=None,
              help="USD per hour of the runs' own device (default: the hardware table's; none for a CPU).")
@_out_option
@_json_option
def cost(runs: tuple[str, ...], devices: tuple[str, ...], price: float | None, out_dir: Path | None,
         as_json: bool) -> None:
    """What inference costs: USD per million calls, items and tokens, measured on each run's device and
    projected onto others from the roofline (projections are optimistic: perfect kernels, no overhead)."""
    from workbench.analysis.cost import cost_table
    from workbench.hardware import resolve_device_spec
    from workbench.trace.resolve import resolve_runs

    with errors():
        targets = [resolve_device_spec(device) for device in devices]
        table = cost_table(resolve_runs(list(runs), checked_root(out_dir, writing=False)), targets,
                           price_per_hour=price)
    if as_json:
        _print_json(json.loads(table.to_json(orient="records")))
        return
    view = Table(title="cost (projections: roofline time of perfect kernels, no launch or host overhead)",
                 title_justify="left")
    for column in ("variant", "basis", "device", "ms/call", "items/s", "$/h", "$/M calls", "$/M items", "$/M tokens",
                   "work known"):
        view.add_column(column, justify="left" if column in ("variant", "basis", "device") else "right")
    for row in table.itertuples():
        view.add_row(str(row.variant), row.basis, str(row.device), *(_fmt(None if _missing(v) else v) for v in (
            row.latency_ms, row.items_per_s, row.price_per_hour, row.usd_per_million_calls,
            row.usd_per_million_items, row.usd_per_million_tokens)),
            "-" if _missing(row.work_known) else f"{row.work_known:.0%}")
    out.print(view)


def _missing(value: Any) -> bool:
    """Whether a table value is missing (NaN or None)."""
    return value is None or (isinstance(value, float) and value != value)


@main.command(name="llm-model")
@click.option("--config", "config_text", required=True, metavar="CONFIG",
              help="A preset (tiny-gpt, llama-3-8b, deepseek-v2-lite), inline key=value pairs "
                   "('tiny-gpt,kv_heads=2' or 'layers=4,d_model=512,heads=8,vocab=32000'), or a JSON/YAML file.")
@click.option("--device", default="h100", show_default=True, metavar="SPEC",
              help="A built-in device (h100, a100, l4, tpu-v5e...), cpu (measured), or an accelerator YAML.")
@click.option("--batch", "batches", default="1", show_default=True,
              help="Batch sizes: 1,8,64 or a doubling range 1..256.")
@click.option("--prompt", "prompts", default="512", show_default=True, help="Prompt lengths (tokens; 4k = 4096).")
@click.option("--new", "news", default="128", show_default=True, help="Generated tokens per sequence.")
@click.option("--context", "contexts", default=None,
              help="Contexts for the KV-cache and crossover sweep (default: 128..max_seq, doubling).")
@click.option("--spec-k", default=None, type=click.IntRange(min=1),
              help="Speculative decoding: tokens drafted per target pass.")
@click.option("--acceptance", default=0.7, show_default=True, type=click.FloatRange(0, 1),
              help="Speculative decoding: probability a drafted token is accepted.")
@click.option("--draft-cost", default=0.05, show_default=True, type=click.FloatRange(min=0),
              help="Speculative decoding: draft step time over target step time.")
@click.option("--overhead-ms", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Fixed cost per forward pass (launch / dispatch), added to each pass.")
@click.option("--prefill-logits", default="last", show_default=True, type=click.Choice(["last", "all"]),
              help="Logits of the last prompt token (serving engines) or of all (a plain forward).")
@click.option("--prefill-chunk", default=None, type=click.IntRange(min=1),
              help="Prefill in chunks of this many tokens (bounds the activation memory).")
@click.option("--memory-fraction", default=0.9, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Share of device memory the model may use.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the KV-cache view to this HTML file.")
@_json_option
def llm_model(config_text: str, device: str, batches: str, prompts: str, news: str, contexts: str | None,
              spec_k: int | None, acceptance: float, draft_cost: float, overhead_ms: float, prefill_logits: str,
              prefill_chunk: int | None, memory_fraction: float, html_path: Path | None, as_json: bool) -> None:
    """Analytical LLM inference model: FLOPs, bytes, KV cache, TTFT/TPOT from the roofline, crossover
    batch, longest context and speculative speedup of a transformer config on a device (a projection)."""
    from workbench.hardware import resolve_device_spec
    from workbench.llm import perf_model as pm

    with errors():
        config = pm.parse_config(config_text)
        spec = resolve_device_spec(device)
        result = pm.llm_projection(
            config, spec, batches=pm.parse_sweep(batches, "--batch"), prompts=pm.parse_sweep(prompts, "--prompt"),
            news=pm.parse_sweep(news, "--new"), contexts=pm.parse_sweep(contexts, "--context") if contexts else None,
            spec_k=spec_k, acceptance=acceptance, draft_cost=draft_cost, overhead_s=overhead_ms / 1e3,
            prefill_logits=prefill_logits, memory_fraction=memory_fraction, prefill_chunk=prefill_chunk)
        if html_path is not None:
            import pandas as pd

            from workbench.report import write_report
            from workbench.views.llm_model import llm_model_view

            budget = (spec.memory_bytes * memory_fraction - result["weights"]["bytes"]) if spec.memory_bytes else None
            layout = llm_model_view(pd.DataFrame(result["kv_cache"]), kv_budget_bytes=budget,
                                    title=f"{config.name} on {spec.name}")
            result["html"] = str(write_report(layout, html_path, title=f"workbench llm-model: {config.name}"))
    if as_json:
        _print_json(result)
    else:
        _print_llm_model(result)


def _print_llm_model(r: dict[str, Any]) -> None:
    c, d, w = r["config"], r["device"], r["weights"]
    attention = c["attention"] + (f" (kv_latent {c['kv_latent']}, rope {c['rope_dim']})" if c["attention"] == "mla"
                                  else f" ({c['kv_heads']} kv heads of {c['heads']})")
    out.print(Text.assemble(
        (c["name"], "bold"), " on ", (d["name"], "bold"), " (a projection: roofline, no measurement)  "
        f"{w['params'] / 1e9:.3g}B params ({w['active_params'] / 1e9:.3g}B active), weights {_gb(w['bytes'])} "
        f"{c['weight_dtype']}, attention {attention}, KV {_gb(r['kv_bytes_per_token'])}/token {c['kv_dtype']}; "
        f"peak {d['peak_flops_per_s'] / 1e12:.4g} TFLOP/s {d['peak_dtype']}, "
        f"{d['memory_bw_bytes_per_s'] / 1e9:.4g} GB/s, ridge {d['ridge_point']:.3g} FLOP/B"))
    table = Table(title="scenarios", title_justify="left")
    for column in ("batch", "prompt", "new", "prefill TFLOP", "TTFT ms", "bound", "decode GB/step", "TPOT ms",
                   "bound", "tok/s", "KV", "memory", "fits", "crossover batch", "max context"):
        table.add_column(column, justify="right")
    for s in r["scenarios"]:
        dec = s["decode"]
        beyond = styled(" (> max_seq)", "red") if s["beyond_max_seq"] else ""
        table.add_row(str(s["batch"]), str(s["prompt"]), Text.assemble(str(s["new"]), beyond),
                      _fmt(s["prefill"]["flops"] / 1e12),
                      _fmt(s["ttft_ms"]), s["prefill"]["bound"], _fmt(dec.get("bytes_per_step", 0) / 1e9),
                      _fmt(s["tpot_ms"]), dec.get("bound", "-"), _fmt(s["tokens_per_s"]), _gb(s["kv_bytes"]),
                      _gb(s["memory_bytes"]), {True: "yes", False: styled("no", "red"), None: "?"}[s["fits"]],
                      _fmt(s["crossover_batch"]) if s["crossover_batch"] else "never",
                      _fmt(s["max_context"]) + (f" (model: {c['max_seq']:,})" if c["max_seq"] and
                                                s["max_context"] and s["max_context"] > c["max_seq"] else ""))
    out.print(table)
    contexts = Table(title="by context (one sequence)", title_justify="left")
    for column in ("context", "KV cache", "crossover batch"):
        contexts.add_column(column, justify="right")
    for row in r["contexts"]:
        contexts.add_row(f"{row['context']:,}", _gb(row["kv_bytes_per_sequence"]),
                         _fmt(row["crossover_batch"]) if row["crossover_batch"] else "never")
    out.print(contexts)
    if any(row["crossover_batch"] is None for row in r["contexts"]):
        out.print("crossover 'never': the KV-cache read grows with the batch as fast as the FLOPs, so the "
                  "decode step stays memory-bound at any batch at that context")
    longest = max(row["context"] for row in r["kv_cache"])
    variants = Table(title=f"KV cache per sequence at {longest:,} tokens, by attention variant", title_justify="left")
    dtypes = list(dict.fromkeys(row["kv_dtype"] for row in r["kv_cache"]))
    for column in ("variant", *dtypes, "vs mha"):
        variants.add_column(column, justify="left" if column == "variant" else "right")
    at_longest = [row for row in r["kv_cache"] if row["context"] == longest]
    for variant in dict.fromkeys(row["variant"] for row in at_longest):
        rows = {row["kv_dtype"]: row for row in at_longest if row["variant"] == variant}
        variants.add_row(variant, *(_gb(rows[t]["kv_bytes"]) for t in dtypes), f"{rows[dtypes[0]]['vs_mha']:.3g}x")
    out.print(variants)
    spec = r["speculative"]
    if spec:
        out.print(f"speculative decoding (k={spec['k']}, acceptance {spec['acceptance']:g}, draft cost "
                  f"{spec['draft_cost']:g}): {spec['expected_tokens']:.3g} tokens per target pass, speedup "
                  f"{spec['speedup']:.3g}x (Leviathan et al. 2023), {spec['speedup_roofline']:.3g}x with the modelled "
                  f"verify pass ({spec['verify_over_step']:.3g}x a decode step); best k {spec['best_k']} "
                  f"({spec['best_k_speedup']:.3g}x)")
    if r.get("html"):
        out.print(f"view: {r['html']}")


def _gb(n: float) -> str:
    """Bytes in decimal units (the hardware table's convention)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"


# --- generate (LLM generation runs) -------------------------------------------------------------


def _comma_list(kind: type):
    """A click callback reading a comma-separated list of `kind` values (integers must be >= 1); the
    runner checks names (attention kinds, KV formats) and lists the valid ones."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Any, ...] | None:
        if value is None:
            return None
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items:
            raise click.BadParameter("give at least one value")
        try:
            values = tuple(kind(item) for item in items)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
        if kind is int and any(v < 1 for v in values):
            raise click.BadParameter("values must be >= 1")
        return values

    return parse


@main.command()
@click.option("--model", default="tiny-gpt", show_default=True, help="The built-in tiny-gpt (configure it with --set).")
@click.option("--attention", default=None, callback=_comma_list(str), metavar="LIST",
              help="Attention kinds to sweep, comma-separated: mha, gqa, mqa, mla (default: the model config's); "
                   "--set kv_heads=N sets GQA's kv heads, --set kv_latent=N MLA's latent width.")
@click.option("--kv", default="fp32", show_default=True, callback=_comma_list(str), metavar="LIST",
              help="KV-cache formats to sweep: fp32, bf16, fp16, int8 (per-token scales), int8-per-head.")
@click.option("--prompt", default="128", show_default=True, callback=_comma_list(int), metavar="LIST",
              help="Prompt lengths to sweep.")
@click.option("--new", default="64", show_default=True, callback=_comma_list(int), metavar="LIST",
              help="New tokens to generate (sweepable).")
@click.option("--batch", default="1", show_default=True, callback=_comma_list(int), metavar="LIST",
              help="Batch sizes to sweep.")
@click.option("--speculative", default=0, show_default=True, type=click.IntRange(min=0), metavar="K",
              help="Also run speculative decoding with K draft tokens per round (0: off; batch 1).")
@click.option("--draft-layers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Speculative draft: the target's first N layers.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1, max=MAX_ITERATIONS),
              help="Timed generations per run (interleaved across runs).")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads during the runs.")
@click.option("--profile/--no-profile", default=True, show_default=True,
              help="Capture one generation per run with torch.profiler.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (slower).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Model config override, e.g. --set layers=4 --set kv_latent=64.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write an HTML report (generation figures, then the runs) to this file.")
@_out_option
@_json_option
@click.option("--progress-json", is_flag=True, help="Progress as JSON lines on stderr, for programs.")
def generate(model: str, attention: tuple[str, ...] | None, kv: tuple[str, ...], prompt: tuple[int, ...],
             new: tuple[int, ...], batch: tuple[int, ...], speculative: int, draft_layers: int, device: str,
             repeats: int, warmup: int, threads: int | None, profile: bool, with_stack: bool,
             overrides: tuple[str, ...], report_path: Path | None, out_dir: Path | None, as_json: bool,
             progress_json: bool) -> None:
    """Generate with a KV cache (prefill, then decode steps) and measure TTFT, TPOT, tokens/s and KV-cache
    bytes: one bundle per point of the sweep (attention × kv × batch × prompt × new) plus an experiment."""
    with errors():  # misuse fails here, before torch loads (prompt and new are bounded by the model's max_seq)
        model_overrides = _parse_overrides(overrides)
        check_limits({"batch": max(batch), "warmup": warmup, "threads": threads, "overrides": model_overrides})
        root = checked_root(out_dir, writing=True)
        report_path = checked_output(report_path) if report_path is not None else None
    from workbench.llm.run import GenerateSettings, run_generation
    from workbench.profiling.settings import ProfileSettings

    with errors():
        settings = GenerateSettings(
            model=model, attention=attention or (None,), kv=kv, batch=batch, prompt=prompt, new=new,
            speculative=speculative, draft_layers=draft_layers, device=device, warmup=warmup, repeats=repeats,
            profile=profile, profile_settings=ProfileSettings(with_stack=with_stack), threads=threads,
            model_overrides=model_overrides,
        )
        with _progress(as_json, progress_json) as progress:
            result = run_generation(settings, root, progress=progress)
    runs = [r.to_dict() for r in result.runs]
    written = None
    if report_path is not None:
        from bokeh.models import TabPanel, Tabs

        from workbench.report import report_layout, write_report
        from workbench.trace.resolve import resolve_runs
        from workbench.views.llm import generation_view

        with errors(), err.status("building the report", spinner="dots"):
            bundles = resolve_runs([result.experiment_id], root)
            layout = Tabs(tabs=[TabPanel(child=generation_view(bundles), title="generation"),
                                TabPanel(child=report_layout(bundles), title="runs")])
            written = str(write_report(layout, report_path, title=f"workbench: {result.experiment_id}"))
    if as_json:
        _print_json({"experiment": result.experiment_id, "root": str(root), "runs": runs, "report": written})
    else:
        _print_generation(result.experiment_id, root, runs)
        if written:
            out.print(f"report: {written}")
    if any(r["status"] != "ok" for r in runs):
        sys.exit(EXIT_PARTIAL)


def _print_generation(experiment_id: str, root: Path, runs: list[dict[str, Any]]) -> None:
    table = Table(title=f"generation {experiment_id}", title_justify="left")
    columns = ("run", "status", "TTFT ms", "TPOT p50 ms", "TPOT p99 ms", "tokens/s", "KV bytes", "accept", "speedup",
               "bundle")
    for column in columns:
        table.add_column(column, justify="left" if column in ("run", "status", "bundle") else "right")
    for run in runs:
        llm = run.get("llm") or {}
        spec = llm.get("speculative") or {}
        table.add_row(
            run["variant"], status_text(run["status"]),
            _fmt(llm.get("ttft_ms")), _fmt(llm.get("tpot_ms")), _fmt(llm.get("tpot_p99_ms")),
            _fmt(llm.get("tokens_per_s")), _fmt(llm.get("kv_cache_bytes")), _fmt(spec.get("acceptance_rate")),
            _fmt(spec.get("speedup_vs_greedy"), "x"), run["run_id"],
        )
    out.print(table)
    for run in runs:
        if run["status"] != "ok":
            err.print(labelled(f"run {run['variant']} failed:", "red", run.get("error")))
    out.print(f"bundles in {root}; look at one with: workbench show RUN --out {root}")
