"""The commands over the traces root: `import` traces captured elsewhere, `ls`, `show` and `rm` runs, and write
an HTML `report` of runs or experiments."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from workbench.cli.options import json_option, out_option
from workbench.cli.render import (
    err,
    errors,
    labelled,
    out,
    print_json,
    print_kv,
    print_table,
    progress,
    reading_status,
)
from workbench.errors import EXIT_PARTIAL
from workbench.paths import checked_output, checked_root, root_where_it_lies
from workbench.views.text_tables import Cell, TextTable, cells, format_count, format_duration, format_number

RUN_COLUMNS = ("run", "model", "variant", "device", "status", "p50 ms", "experiment", "created")
OP_COLUMNS = ("name", "calls", "total", "self", "device", "share")
NAME_WIDTH = 70
"""Characters of an op or kernel name `show` prints before cutting it (`--wide` prints names whole)."""
ID_COLUMNS = ("run", "experiment")
"""Columns of `ls` that hold ids: never cut, whatever the width."""
GRAPH_COLUMNS = ("op", "kernels", "kernel ms")
SERVING_COLUMNS = ("metric", "mean", "p50", "p90", "p99")
PHASE_COLUMNS = ("requests", "queued", "prefill", "delivery", "decode", "stalled")
STEP_COLUMNS = ("mode", "steps", "median ms", "p90 ms", "mean batch", "median kernels")


@click.command(name="import")
@click.argument("files", nargs=-1, required=False, type=click.Path(path_type=Path))
@click.option("--ranks", "ranks_dir", default=None, metavar="DIR|URL",
              help="A folder of per-rank traces of one job (Kineto with distributedInfo, or one nsys export per "
                   "process), a path or an fsspec URL (s3://, gs://...): one bundle per rank on a shared time "
                   "axis, plus an experiment grouping them.")
@click.option("--align", type=click.Choice(["clock", "collective"]), default="clock", show_default=True,
              help="With --ranks: put ranks on one axis by their hosts' clocks, or also line up the end of each "
                   "rank's first NCCL/RCCL collective kernel (corrects clock skew between hosts).")
@click.option("--cluster", default="local", show_default=True, metavar="local|auto|ray://HOST:PORT",
              help="With --ranks: where the per-rank work runs: this machine's process pool, the Ray cluster "
                   "running here, or a remote Ray cluster (needs `pip install 'workbench[ray]'`). A rank that fails "
                   "is reported and the others kept (exit code 1).")
@click.option("--strict", is_flag=True,
              help="With --ranks: stop at the first rank that fails, naming its file, and write nothing (exit 2).")
@click.option("--requests", "requests_file", default=None, type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE",
              help="A load generator's per-request results (AIPerf profile_export.jsonl, vllm bench serve "
                   "--save-detailed JSON, GuideLLM benchmarks.json) of the load the one engine trace given recorded: "
                   "joined to its steps, on its clock.")
@click.option("--graph-capture", default=None, type=click.Path(path_type=Path), metavar="FILE|DIR",
              help="The engine's CUDA/HIP graph-capture trace (or its capture_traces/ folder): kernels replayed by "
                   "graph launches are attributed to the ops that launched them at capture time.")
@click.option("--force", is_flag=True,
              help="Import a file again though it was imported before (by default its existing run is given).")
@click.option("--out", "out_dir", default=None, metavar="DIR|URL",
              help="Traces root (default: $WORKBENCH_TRACES or ./traces); with --ranks also an fsspec URL.")
@json_option
def import_(files: tuple[Path, ...], ranks_dir: str | None, align: str, cluster: str, strict: bool,
            requests_file: Path | None, graph_capture: Path | None, force: bool, out_dir: str | None,
            as_json: bool) -> None:
    """Make bundles from traces captured elsewhere (Kineto/Chrome JSON or .json.gz, XSpace .xplane.pb or a
    plugins/profile folder, Nsight Systems SQLite) or from a load generator's per-request results (AIPerf,
    vllm bench serve, GuideLLM); prints the run ids."""
    from workbench.imports import already_imported, import_traces
    from workbench.storage import is_url

    if ranks_dir is not None and (requests_file or graph_capture):
        raise click.UsageError("--requests and --graph-capture apply to trace files, not to --ranks")
    if ranks_dir is not None:
        _import_ranks(files, ranks_dir, align, cluster, strict, out_dir, as_json)
        return
    misplaced = [name for name, given in (("--align", align != "clock"), ("--cluster", cluster != "local"),
                                          ("--strict", strict)) if given]
    if misplaced:
        raise click.UsageError(f"{misplaced[0]} applies to --ranks FOLDER")
    if out_dir is not None and is_url(out_dir):
        raise click.UsageError("only `workbench import --ranks` writes to a URL traces root; give a folder for "
                               "trace files")
    if not files:
        raise click.UsageError("give trace files to import, or --ranks FOLDER")
    with errors():
        root = checked_root(out_dir, writing=True)
    with errors():
        known = {} if force or requests_file or graph_capture else already_imported(files, root)
    for path, run_id in known.items():
        err.print(labelled("imported already:", "yellow", f"{path} is run {run_id} (same file, same size); "
                                                             "`workbench show` it, or --force to import it again"))
    fresh = [path for path in files if Path(path) not in known]
    with errors(), reading_status("reading traces", as_json):
        new_ids = iter(import_traces(fresh, root, requests=requests_file, graph_capture=graph_capture)
                       if fresh else [])
    run_ids = [known[Path(path)] if Path(path) in known else next(new_ids) for path in files]
    _print_warnings([run_id for run_id in run_ids if run_id not in known.values()], root)
    if as_json:
        print_json(run_ids)
    else:
        for run_id in run_ids:
            click.echo(run_id)


def _import_ranks(files: tuple[Path, ...], folder: str, align: str, cluster: str, strict: bool, out_dir: str | None,
                  as_json: bool) -> None:
    """`import --ranks FOLDER`: print the experiment id and the run id of each rank; the files that failed on
    stderr, with exit code 1 (`EXIT_PARTIAL`); with `strict`, the first failure is the error (exit code 2)."""
    from workbench.rank_import import import_rank_job

    if files:
        raise click.UsageError("give either trace files or --ranks FOLDER, not both")
    with errors():
        root = root_where_it_lies(out_dir, writing=True)
    with errors(), progress(as_json, False) as bars:
        imported = import_rank_job(folder, root, align=align, cluster=cluster, keep_going=not strict,
                                   progress=bars)
    if as_json:
        print_json({"experiment": imported.experiment_id, "runs": imported.run_ids, "failed": imported.failed})
    else:
        click.echo(f"experiment {imported.experiment_id}")
        for run_id in imported.run_ids:
            click.echo(run_id)
    for name, message in imported.failed.items():
        err.print(labelled("failed:", "red", f"{name}: {message}"))
    if imported.failed:
        sys.exit(EXIT_PARTIAL)


def _print_warnings(run_ids: list[str], root: Path) -> None:
    """The trace reader's warnings about each imported run (an empty trace...), on stderr."""
    from workbench.analysis.summary import reader_warnings
    from workbench.trace.store.bundle import open_bundle

    for run_id in run_ids:
        for warning in reader_warnings(open_bundle(run_id, root).info):
            err.print(labelled("warning:", "yellow", f"{run_id}: {warning}"))


@click.command(name="ls")
@out_option
@json_option
def ls(out_dir: str | None, as_json: bool) -> None:
    """List the runs under the traces root, oldest first."""
    from workbench.analysis.summary import run_row
    from workbench.trace.store.bundle import list_bundles
    from workbench.trace.store.mirror_bundle import shown_root

    problems: list[str] = []
    with errors():
        root = checked_root(out_dir, writing=False)
        where = shown_root(root)
        bundles = list_bundles(root, on_problem=lambda path, message: problems.append(f"{path}: {message}"))
    rows = [run_row(b.run_id, b.info) for b in bundles]
    if as_json:
        print_json(rows)
    elif rows:
        _print_runs(where, rows)
    else:
        out.print(f"no runs in {where} (create some with `workbench capture`)")
    for problem in problems:
        err.print(labelled("skipped", "yellow", problem))


@click.command()
@click.argument("run")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows in the op tables.")
@click.option("--wide", is_flag=True, help=f"Print op and kernel names whole (folded over lines) instead of cutting "
                                          f"them at {NAME_WIDTH} characters.")
@click.option("--all-ops", is_flag=True, help="Rank profiler wrappers among the top ops too (ProfilerStep#N, "
                                             "`## forward ##` markers...), which span whole steps.")
@out_option
@json_option
def show(run: str, top: int, wide: bool, all_ops: bool, out_dir: str | None, as_json: bool) -> None:
    """Summary of one run (id under the traces root, or a bundle's path)."""
    from workbench.analysis.summary import run_summary
    from workbench.trace.store.bundle import open_bundle

    with errors():
        summary = run_summary(open_bundle(run, checked_root(out_dir, writing=False)), top=top, all_ops=all_ops)
    if as_json:
        print_json(summary)
    else:
        _print_summary(summary, wide=wide, all_ops=all_ops)


def runs_table(where: str, rows: list[dict[str, Any]]) -> TextTable:
    """The runs of the traces root `where` (`run_row`s), as `ls` lists them."""
    return TextTable(f"runs in {where}", RUN_COLUMNS, tuple(
        cells(row["run"], row["model"] or "-", row["variant"] or "-", row["device"] or "-", row["status"],
              median_cell(row["p50_ms"], row["noise"]), row["experiment"] or "-",
              _created(row["created"])) for row in rows),
        left=frozenset(RUN_COLUMNS) - {"p50 ms"})


ID_ROOM = 60
"""Columns `ls`'s table needs beside its id columns (the other columns folded narrow, and the borders): on a
console narrower than the ids and this, runs are listed one per line instead."""


def _print_runs(where: str, rows: list[dict[str, Any]]) -> None:
    """`ls`'s text: a table whose id columns are never cut (the others fold), or, on a console too narrow for
    whole ids beside the other columns, one line per run that the terminal wraps (ids whole either way)."""
    ids = sum(max(len(str(row[column] or "-")) for row in rows) for column in ID_COLUMNS)
    if ids + ID_ROOM <= out.width:
        print_table(runs_table(where, rows), no_wrap=ID_COLUMNS,
                    fold=(*ID_COLUMNS, "model", "variant", "device", "created"))
        return
    out.print(f"runs in {where}", soft_wrap=True)
    for row in rows:
        noisy = " (noisy)" if row["noise"] else ""
        out.print(Text.assemble((row["run"], "bold"), f"  model {row['model'] or '-'}  variant {row['variant'] or '-'}"
                                f"  device {row['device'] or '-'}  status {row['status']}"
                                f"  p50 ms {format_number(row['p50_ms'])}{noisy}"
                                f"  experiment {row['experiment'] or '-'}  created {_created(row['created'])}"),
                  soft_wrap=True)


def _created(created: str) -> str:
    """A run's creation time to the minute: "2026-12-04 22:11"."""
    return created[:16].replace("T", " ")


def median_cell(p50_ms: float | None, noise: str | None) -> Any:
    """A run's median latency for a table, flagged when its samples are noisy (`noise`: why, or None)."""
    if not noise:
        return p50_ms
    return (Cell(format_number(p50_ms)), Cell(" noisy", "bad"))


def op_rows_table(title: str, rows: list[dict[str, Any]]) -> TextTable:
    """Top ops or kernels (`op_table` records) as `show` prints them: counts as integers, times in the unit that
    suits each ("80.8 ms", "12.3 µs"), device time a kernel's own and an op's kernels' ("-" for none)."""
    return TextTable(title, OP_COLUMNS, tuple(
        cells(row["name"], format_count(row["calls"]), format_duration(row["total_ns"]),
              format_duration(row["self_ns"]), format_duration(row["device_ns"]) if row["device_ns"] else "-",
              f"{row['share']:.1%}")
        for row in rows), left=frozenset({"name"}))


def _print_summary(s: dict[str, Any], *, wide: bool = False, all_ops: bool = False) -> None:
    """`show`'s text: the run's headline, then its figures, and its top ops and kernels as tables (names cut at
    `NAME_WIDTH` characters unless `wide`; the top ops' title says when profiler wrappers were left out)."""
    from workbench.analysis.summary import model_label

    out.print(Text.assemble((s["run"], "bold"), f"  model {model_label(s['model'], s.get('weights')) or '-'}  "
                            f"variant {s['variant'] or '-'}  "
                            f"device {s['device']}  status {s['status']}"))
    if s.get("training"):
        out.print(f"  {s['model']} {s['training']}")
    if s.get("error"):
        err.print(labelled("error:", "red", s["error"]))
    for warning in s.get("warnings") or ():
        err.print(labelled("warning:", "yellow", warning))
    if s["latency_ms"]:
        print_kv("latency (ms)", {**s["latency_ms"], **s["throughput"], "first call s": s.get("first_call_s")})
    if s.get("noise"):
        err.print(labelled("noisy:", "yellow", f"{s['noise']}: the median may not hold; try --threads 1, fewer "
                                                "other jobs or more --iterations"))
    if s["numerics"]:
        print_kv("numerics vs fp32 eager" + (" (random weights)" if s.get("weights") == "random" else ""),
                 s["numerics"])
    if s.get("llm"):
        print_kv("generation", {k: v for k, v in s["llm"].items() if not isinstance(v, (dict, list))})
    if s.get("steps"):
        print_table(TextTable(f"engine steps ({s['steps']['steps']:,}; prefill tokens "
                              f"{s['steps']['prefill_tokens']:,}, decode tokens {s['steps']['decode_tokens']:,})",
                              STEP_COLUMNS, tuple(cells(mode, row["steps"], row["median_ms"], row["p90_ms"],
                                                        row["mean_batch"], row["median_kernels"])
                                                  for mode, row in s["steps"]["by_mode"].items()),
                              left=frozenset({"mode"})))
    if s.get("serving"):
        _print_serving(s["serving"])
    if s.get("graph_kernels"):
        g = s["graph_kernels"]
        print_table(TextTable(f"graph-replayed kernels by capture-time op ({g['matched']:,} of {g['kernels']:,} "
                              f"matched, {g['graph_launches']:,} graph launches)", GRAPH_COLUMNS, tuple(
                                  cells(row["op"], row["kernels"], row["kernel_ns"] / 1e6) for row in g["by_op"]),
                              left=frozenset({"op"})), max_widths={"op": 70})
    if s["events"]:
        print_kv("events", {**s["events"],
                            **{f"kernel time {d}": format_duration(ns) for d, ns in s["kernel_ns"].items()},
                            **{f"memory peak {d} (MiB)": n / 2**20 for d, n in s["memory_peak_bytes"].items()}})
    scope = f" ({s['ops_window']})"
    cut = False
    wrappers = "" if all_ops else " without profiler wrappers such as ProfilerStep#N (--all-ops ranks them)"
    for title, rows in ((f"top ops{scope}{wrappers}", s["top_ops"]), (f"top kernels{scope}", s["top_kernels"])):
        if not rows:
            continue
        if wide:
            print_table(op_rows_table(title, rows), no_wrap=OP_COLUMNS[1:], fold=("name",))
        else:
            print_table(op_rows_table(title, rows), no_wrap=OP_COLUMNS, max_widths={"name": NAME_WIDTH})
            cut = cut or any(len(row["name"]) > NAME_WIDTH for row in rows)
    if cut:
        out.print(f"names longer than {NAME_WIDTH} characters are cut: `--wide` prints them whole")


def _print_serving(serving: dict[str, Any]) -> None:
    """A serving run's latencies (ms), throughput and goodput, where its requests' time went, and its findings."""
    m = serving["metrics"]
    print_table(TextTable(f"latency ms ({m['ok']:,}/{m['requests']:,} ok)", SERVING_COLUMNS,
                          tuple(cells(name.upper(), *(m[name].get(k) for k in ("mean", "p50", "p90", "p99")))
                                for name in ("ttft", "tpot", "itl", "e2e") if m.get(name)),
                          left=frozenset({"metric"})))
    print_kv("throughput", {"requests/s": m.get("request_throughput"), "output tokens/s":
                            m.get("output_token_throughput"), "goodput requests/s": m.get("goodput"),
                            "goodput share": m.get("goodput_fraction")})
    if serving.get("phases_ms"):
        print_table(TextTable("time split, median ms", PHASE_COLUMNS, tuple(
            cells(group.replace("_", " "), *phases.values()) for group, phases in serving["phases_ms"].items()),
            left=frozenset({"requests"})))
    for finding in serving["findings"]:
        out.print(labelled("finding:", "cyan", f"{finding['title']} — {finding['suggestion']}"))


@click.command()
@click.argument("refs", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write (default: report-<first ref>.html in the traces root).")
@click.option("--baseline", default=None, metavar="RUN",
              help="With several runs: the run the comparison measures the others against (a run id or name; "
                   "default the reference variant where one ran it, else the first run).")
@out_option
def report(refs: tuple[str, ...], output: Path | None, baseline: str | None, out_dir: str | None) -> None:
    """Write a self-contained HTML report of runs or experiments (opens offline, no workbench needed), with each
    run's Perfetto trace beside it (`<report>.<run>.perfetto-trace`) and an "Open in Perfetto" button."""
    from workbench.report import write_run_report
    from workbench.trace.store.resolve import resolve_runs

    with errors():
        root = checked_root(out_dir, writing=False)
        bundles = resolve_runs(refs, root)
        output = checked_output(output or root / f"report-{Path(refs[0]).name}.html")
        with err.status("building the report", spinner="dots"):
            path = write_run_report(bundles, output, title=f"workbench: {', '.join(refs)}", baseline=baseline)
    click.echo(str(path))


@click.command()
@click.argument("runs", nargs=-1, required=True)
@out_option
def rm(runs: tuple[str, ...], out_dir: str | None) -> None:
    """Delete runs (ids under the traces root, or bundle paths)."""
    from workbench.trace.store.bundle import delete_bundle
    from workbench.trace.store.staging import sweep

    with errors():
        root = checked_root(out_dir, writing=True)
        sweep(root)
        for run in runs:
            delete_bundle(run, root)
            click.echo(f"deleted {run}")
