"""The commands over the traces root: `import` traces captured elsewhere, `ls`, `show` and `rm` runs, and write
an HTML `report` of runs or experiments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.text import Text

from workbench.cli.options import json_option, out_option
from workbench.cli.render import err, errors, labelled, nothing, out, print_json, print_kv, print_table
from workbench.paths import checked_output, checked_root
from workbench.views.text_tables import TextTable, cells

RUN_COLUMNS = ("run", "model", "variant", "device", "status", "p50 ms", "experiment", "created")
OP_COLUMNS = ("name", "calls", "total ms", "self ms", "device ms", "share")


@click.command(name="import")
@click.argument("files", nargs=-1, required=False, type=click.Path(path_type=Path))
@click.option("--ranks", "ranks_dir", type=click.Path(path_type=Path), default=None,
              help="A folder of per-rank traces of one job (Kineto with distributedInfo, or one nsys export per "
                   "process): one bundle per rank on a shared time axis, plus an experiment grouping them.")
@click.option("--align", type=click.Choice(["clock", "collective"]), default="clock", show_default=True,
              help="With --ranks: put ranks on one axis by their hosts' clocks, or also line up the end of each "
                   "rank's first NCCL/RCCL collective kernel (corrects clock skew between hosts).")
@out_option
@json_option
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
    with errors(), err.status("reading traces", spinner="dots") if not as_json else nothing():
        run_ids = import_traces(files, root)
    _print_warnings(run_ids, root)
    if as_json:
        print_json(run_ids)
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
    with errors(), err.status("reading rank traces", spinner="dots") if not as_json else nothing():
        experiment_id, run_ids = import_ranks(folder, root, align=align)
    if as_json:
        print_json({"experiment": experiment_id, "runs": run_ids})
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


@click.command(name="ls")
@out_option
@json_option
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
        print_json(rows)
    elif rows:
        print_table(runs_table(root, rows), no_wrap=("run",))
    else:
        out.print(f"no runs in {root} (create some with `workbench capture`)")
    for problem in problems:
        err.print(labelled("skipped", "yellow", problem))


@click.command()
@click.argument("run")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the op tables.")
@out_option
@json_option
def show(run: str, top: int, out_dir: Path | None, as_json: bool) -> None:
    """Summary of one run (id under the traces root, or a bundle's path)."""
    from workbench.analysis.summary import run_summary
    from workbench.trace.bundle import open_bundle

    with errors():
        summary = run_summary(open_bundle(run, checked_root(out_dir, writing=False)), top=top)
    if as_json:
        print_json(summary)
    else:
        _print_summary(summary)


def runs_table(root: Path, rows: list[dict[str, Any]]) -> TextTable:
    """The runs of the traces root (`run_row`s), as `ls` lists them."""
    return TextTable(f"runs in {root}", RUN_COLUMNS, tuple(
        cells(row["run"], row["model"] or "-", row["variant"] or "-", row["device"] or "-", row["status"],
              row["p50_ms"], row["experiment"] or "-", row["created"][:19]) for row in rows),
        left=frozenset(RUN_COLUMNS) - {"p50 ms"})


def _print_summary(s: dict[str, Any]) -> None:
    """`show`'s text: the run's headline, then its figures, and its top ops and kernels as tables."""
    out.print(Text.assemble((s["run"], "bold"), f"  model {s['model'] or '-'}  variant {s['variant'] or '-'}  "
                            f"device {s['device']}  status {s['status']}"))
    if s.get("error"):
        err.print(labelled("error:", "red", s["error"]))
    for warning in s.get("warnings") or ():
        err.print(labelled("warning:", "yellow", warning))
    if s["latency_ms"]:
        print_kv("latency (ms)", {**s["latency_ms"], **s["throughput"], "first call s": s.get("first_call_s")})
    if s["numerics"]:
        print_kv("numerics vs fp32 eager", s["numerics"])
    if s.get("llm"):
        print_kv("generation", {k: v for k, v in s["llm"].items() if not isinstance(v, (dict, list))})
    if s["events"]:
        print_kv("events", {**s["events"], **{f"kernel time {d} (ms)": ns / 1e6 for d, ns in s["kernel_ns"].items()},
                            **{f"memory peak {d} (MiB)": n / 2**20 for d, n in s["memory_peak_bytes"].items()}})
    scope = f" ({s['ops_window']})"
    for title, rows in ((f"top ops{scope}", s["top_ops"]), (f"top kernels{scope}", s["top_kernels"])):
        if rows:
            print_table(TextTable(title, OP_COLUMNS, tuple(
                cells(row["name"], str(row["calls"]), row["total_ns"] / 1e6, row["self_ns"] / 1e6,
                      row["device_ns"] / 1e6, f"{row['share']:.1%}") for row in rows), left=frozenset({"name"})),
                no_wrap=OP_COLUMNS, max_widths={"name": 70})


@click.command()
@click.argument("refs", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write (default: report-<first ref>.html in the traces root).")
@out_option
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


@click.command()
@click.argument("runs", nargs=-1, required=True)
@out_option
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
