"""The `workbench` command line: capture, import, ls, show, rm.

Exit codes: 0 success; 1 a capture in which some variants failed (the others were written);
2 bad input (unknown model or variant, unreadable trace, missing run) with a one-line error;
130 interrupted. `--json` prints machine-readable output on stdout and nothing else there.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from workbench.errors import WorkbenchError
from workbench.paths import traces_root

DEFAULT_VARIANTS = "eager,bf16,compile,int8"
EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130

_WIDTH = None if sys.stdout.isatty() else 160  # rich would squeeze tables into 80 columns in a pipe
out = Console(width=_WIDTH)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

_out_option = click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Traces root (default: $WORKBENCH_TRACES or ./traces).",
)
_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


@contextmanager
def _errors() -> Iterator[None]:
    """Turn the workbench's own errors into one line on stderr and exit code 2."""
    try:
        yield
    except WorkbenchError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: nothing half-written was kept")
        sys.exit(EXIT_INTERRUPTED)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
def capture(model: str, variants: str, batch: int, seq: int | None, device: str, iterations: int, warmup: int,
            threads: int | None, profile: bool, steady_state_only: bool, profile_steps: int, with_stack: bool,
            overrides: tuple[str, ...], report_path: Path | None, out_dir: Path | None, as_json: bool,
            progress_json: bool) -> None:
    """Benchmark and profile a model in several variants: one bundle per variant plus an experiment."""
    from workbench.capture.torch_profiler import ProfileSettings
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.progress import JsonProgress, RichProgress

    with _errors():
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
            model_overrides=_parse_overrides(overrides),
        )
        root = traces_root(out_dir)
        shown = JsonProgress(sys.stderr) if progress_json else RichProgress(err, enabled=not as_json)
        with shown as progress:
            result = run_experiment(settings, root, progress=progress)
    runs = [r.to_dict() for r in result.runs]
    written = None
    if report_path is not None:
        from workbench.report import report_layout, resolve_runs, write_report

        with _errors(), err.status("building the report", spinner="dots"):
            layout = report_layout(resolve_runs([result.experiment_id], root))
            written = str(write_report(layout, report_path, title=f"workbench: {result.experiment_id}"))
    if as_json:
        _print_json({"experiment": result.experiment_id, "root": str(root), "runs": runs, "report": written})
    else:
        _print_capture(result.experiment_id, root, runs)
        if written:
            out.print(f"report: {written}", highlight=False)
    if any(r["status"] != "ok" for r in runs):
        sys.exit(EXIT_PARTIAL)


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
        ok = run["status"] == "ok"
        table.add_row(
            run["variant"], "[green]ok[/]" if ok else f"[red]{run['status']}[/]",
            _fmt(run.get("p50_ms")), _fmt(run.get("p99_ms")), _fmt(run.get("speedup"), "x"),
            _fmt(run.get("first_call_s")), _fmt(run.get("sqnr_db")), _fmt(run.get("top1_agreement")),
            run.get("run_id") or "-",
        )
    out.print(table)
    for run in runs:
        if run["status"] != "ok":
            err.print(f"[red]variant {run['variant']} failed:[/] {run.get('error')}", highlight=False)
    out.print(f"bundles in {root}; look at one with: workbench show RUN --out {root}", highlight=False)


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.3g}{suffix}" if abs(value) < 1000 else f"{value:,.0f}{suffix}"


@main.command(name="import")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@_out_option
@_json_option
def import_(files: tuple[Path, ...], out_dir: Path | None, as_json: bool) -> None:
    """Make bundles from traces captured elsewhere (Kineto/Chrome JSON, .json.gz); prints the run ids."""
    from workbench.imports import import_traces

    with _errors(), err.status("reading traces", spinner="dots") if not as_json else _nothing():
        run_ids = import_traces(files, traces_root(out_dir))
    if as_json:
        _print_json(run_ids)
    else:
        for run_id in run_ids:
            click.echo(run_id)


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

    root = traces_root(out_dir)
    problems: list[str] = []
    with _errors():
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
        err.print(f"[yellow]skipped[/] {problem}", highlight=False)


@main.command()
@click.argument("run")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the op tables.")
@_out_option
@_json_option
def show(run: str, top: int, out_dir: Path | None, as_json: bool) -> None:
    """Summary of one run (id under the traces root, or a bundle's path)."""
    from workbench.analysis.summary import run_summary
    from workbench.trace.bundle import open_bundle

    with _errors():
        summary = run_summary(open_bundle(run, traces_root(out_dir)), top=top)
    if as_json:
        _print_json(summary)
    else:
        _print_summary(summary)


def _print_summary(s: dict[str, Any]) -> None:
    out.print(f"[bold]{s['run']}[/]  model {s['model'] or '-'}  variant {s['variant'] or '-'}  "
              f"device {s['device']}  status {s['status']}", highlight=False)
    if s.get("error"):
        err.print(f"[red]error:[/] {s['error']}", highlight=False)
    if s["latency_ms"]:
        _kv_table("latency (ms)", {**s["latency_ms"], **s["throughput"], "first call s": s.get("first_call_s")})
    if s["numerics"]:
        _kv_table("numerics vs fp32 eager", s["numerics"])
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
    from workbench.report import report_layout, resolve_runs, write_report

    root = traces_root(out_dir)
    with _errors():
        bundles = resolve_runs(refs, root)
        with err.status("building the report", spinner="dots"):
            path = write_report(report_layout(bundles), output or root / f"report-{Path(refs[0]).name}.html",
                                title=f"workbench: {', '.join(refs)}")
    click.echo(str(path))


@main.command()
@click.argument("runs", nargs=-1, required=True)
@_out_option
def rm(runs: tuple[str, ...], out_dir: Path | None) -> None:
    """Delete runs (ids under the traces root, or bundle paths)."""
    from workbench.trace.bundle import delete_bundle

    root = traces_root(out_dir)
    with _errors():
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

    with _errors():
        bundle = open_bundle(run, traces_root(out_dir))
        with err.status("starting XProf", spinner="dots"):
            server = serve_bundle(bundle, port=port)
        with server:
            click.echo(server.url)
            err.print("XProf is serving; press Ctrl-C to stop it", highlight=False)
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

    with _errors():
        bundle = open_bundle(run, traces_root(out_dir))
        with err.status("analyzing", spinner="dots"):
            result = analyze_run(bundle, device)
    if as_json:
        _print_json(result)
        return
    _print_analysis(result, top)


def _print_analysis(result: dict[str, Any], top: int) -> None:
    window = result.get("window")
    scope = "measure phase" if window else "whole trace"
    out.print(f"[bold]{result['run']}[/]  device figures: {result['device'] or 'unknown (give --device)'}  "
              f"({scope})", highlight=False)
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
        for column in ("kind", "name", "calls", "ms", "FLOP/B", "achieved TFLOP/s", "GB/s", "bound", "of roof"):
            roof.add_column(column, justify="left" if column in ("kind", "name", "bound") else "right",
                            no_wrap=True, overflow="ellipsis", max_width=60 if column == "name" else None)
        for row in result["roofline"][:top]:
            roof.add_row(row["kind"], row["name"], str(row["calls"]), _fmt(row["time_ns"] / 1e6),
                         _fmt(row["intensity"]), _fmt((row["achieved_flops_per_s"] or 0) / 1e12),
                         _fmt((row["achieved_bytes_per_s"] or 0) / 1e9), str(row["bound"]),
                         "-" if row["fraction_of_roof"] is None else f"{row['fraction_of_roof']:.1%}")
        out.print(roof)
