"""`workbench export RUN --format perfetto|chrome -o FILE`: a run written as a trace file for Perfetto UI or
chrome://tracing (`workbench.export`)."""

from __future__ import annotations

from pathlib import Path

import click

from workbench.cli.options import json_option, out_option
from workbench.cli.render import err, errors, print_json, progress


@click.command(name="export")
@click.argument("run")
@click.option("--format", "fmt", type=click.Choice(["perfetto", "chrome"]), default="perfetto", show_default=True,
              help="perfetto: Perfetto's protobuf trace (compact: large runs; opens in ui.perfetto.dev); chrome: "
                   "Trace Event JSON (chrome://tracing, small runs).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="File to write (default: <run id>.perfetto-trace or <run id>.json in the current folder); written "
                   "under a temporary name and renamed, so it is never left half-written.")
@click.option("--critical-path", "critical_path", is_flag=True,
              help="Add the typical step's critical path as a track of its own under the lanes: one slice per "
                   "segment (cpu op, launch latency, kernel, wait, thread handoff), as `workbench analyze` finds it.")
@out_option
@json_option
def export(run: str, fmt: str, output: Path | None, critical_path: bool, out_dir: str | None, as_json: bool) -> None:
    """Write RUN (a run id under the traces root, or a bundle's path) as a trace file that Perfetto UI opens with
    the run's lanes, names, launch → kernel flows, counters and step markers; `workbench import` reads it back."""
    from workbench.export.run import default_output, export_run
    from workbench.paths import checked_output, checked_root
    from workbench.trace.store.bundle import open_bundle

    with errors():
        bundle = open_bundle(run, checked_root(out_dir, writing=False))
        target = checked_output(output or default_output(bundle.run_id, fmt, Path.cwd()))
        bundle.local_files()
        with progress(as_json, False) as bars:
            task = f"export {fmt}"
            bars.start(task, total=bundle.event_count)
            shown = 0

            def advance(done: int, total: int) -> None:
                nonlocal shown
                bars.advance(task, done - shown)
                shown = done

            summary = export_run(bundle.path, fmt, target, progress=advance, critical_path=critical_path)
            bars.finish(task)
    if as_json:
        print_json(summary)
        return
    click.echo(summary["path"])
    kinds = ", ".join(f"{count:,} {kind}" for kind, count in summary["kinds"].items())
    err.print(f"{summary['events']:,} events ({kinds}), {summary['flows']:,} flows, {summary['counters']:,} counter "
              f"values, {summary['memory']:,} memory records; {summary['bytes']:,} bytes", soft_wrap=True)
    path = summary.get("critical_path")
    if path is not None:
        err.print(f"critical path: {path['segments']:,} segments on the track {path['track']!r}" if "track" in path
                  else f"critical path: none ({path['error']})", soft_wrap=True, markup=False)
