"""The analysis commands: `analyze` (findings, device idle time and the roofline of a run) and `cost` (what
inference costs, measured and projected onto other devices)."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.text import Text

from workbench.cli.options import json_option, out_option
from workbench.cli.render import err, errors, out, print_json, print_kv, print_table
from workbench.paths import checked_root
from workbench.views.text_tables import TextTable, cells, format_duration

FINDING_COLUMNS = ("kind", "share", "of path", "what", "next step")
PATH_COLUMNS = ("kind", "name", "on path", "share", "device share")
ROOFLINE_COLUMNS = ("kind", "name", "calls", "ms", "FLOP/B", "achieved TFLOP/s", "GB/s", "bound", "of roof",
                    "work from")
COST_COLUMNS = ("variant", "basis", "device", "ms/call", "items/s", "$/h", "$/M calls", "$/M items", "$/M tokens",
                "work known")


@click.command()
@click.argument("run")
@click.option("--device", "device", default=None, metavar="SPEC",
              help="Roofline against this device instead of the run's own: a built-in name (H100-SXM, "
                   "tpu-v5e...), cpu, or an accelerator YAML file.")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1), help="Roofline rows printed.")
@out_option
@json_option
def analyze(run: str, device: str | None, top: int, out_dir: str | None, as_json: bool) -> None:
    """Where the time goes and what bounds it: ranked findings with evidence and next steps (first those on a
    typical step's critical path), that path with a what-if speedup, device idle time, and the roofline of ops and
    kernels (the steady state of a capture)."""
    from workbench.analysis.findings.bottlenecks import analyze_run
    from workbench.trace.store.bundle import open_bundle

    with errors():
        bundle = open_bundle(run, checked_root(out_dir, writing=False))
        with err.status("analyzing", spinner="dots"):
            result = analyze_run(bundle, device)
    if as_json:
        print_json(result)
        return
    _print_analysis(result, top)


def _print_analysis(result: dict[str, Any], top: int) -> None:
    """`analyze`'s text: the findings, the device idle time and the top of the roofline."""
    scope = "measure phase" if result.get("window") else "whole trace"
    out.print(Text.assemble((result["run"], "bold"),
                            f"  device figures: {result['device'] or 'unknown (give --device)'}  ({scope})"))
    if result["findings"]:
        print_table(TextTable("findings, largest share first", FINDING_COLUMNS, tuple(
            cells(f["kind"], f"{f['time_share']:.1%}", "-" if f.get("path_share") is None else f"{f['path_share']:.1%}",
                  f.get("title") or "", f["suggestion"])
            for f in result["findings"]), left=frozenset(FINDING_COLUMNS) - {"share", "of path"}),
            fold=FINDING_COLUMNS, max_widths={"what": 60, "next step": 60})
    else:
        out.print("no findings")
    _print_path(result.get("critical_path"))
    if result["idle"]:
        print_kv("device idle (ms)", {
            f"{device} {key.removesuffix('_ns').replace('_', ' ')}": value / 1e6
            for device, idle in result["idle"].items()
            for key, value in idle.items() if key in ("busy_ns", "idle_ns", "largest_gap_ns")})
    if result["roofline"]:
        print_table(TextTable(f"roofline (top {top} by time)", ROOFLINE_COLUMNS, tuple(
            cells(row["kind"], row["name"], str(row["calls"]), row["time_ns"] / 1e6, row["intensity"],
                  (row["achieved_flops_per_s"] or 0) / 1e12, (row["achieved_bytes_per_s"] or 0) / 1e9,
                  str(row["bound"]), "-" if row["fraction_of_roof"] is None else f"{row['fraction_of_roof']:.1%}",
                  row.get("source") or "-") for row in result["roofline"][:top]),
            left=frozenset({"kind", "name", "bound", "work from"})), no_wrap=ROOFLINE_COLUMNS, max_widths={"name": 60})


def _print_path(path: dict[str, Any] | None) -> None:
    """The critical path's summary: the step, its length, time per segment kind, the top names and the what-if."""
    if not path:
        return
    if "error" in path:
        out.print(f"critical path: {path['error']}")
        return
    kinds = ", ".join(f"{kind} {format_duration(ns)} ({ns / max(path['length_ns'], 1):.1%})"
                      for kind, ns in path["by_kind"].items())
    out.print(Text.assemble(("critical path", "bold"), f"  step {path['step']}: {format_duration(path['length_ns'])} "
                            f"(step span {format_duration(path['step_ns'])}); {kinds}"))
    print_table(TextTable("on the critical path, largest share first", PATH_COLUMNS, tuple(
        cells(row["kind"], row["name"], format_duration(row["path_ns"]), f"{row['share']:.1%}",
              "-" if row["device_share"] is None else f"{row['device_share']:.1%}") for row in path["top"]),
        left=frozenset({"kind", "name"})), no_wrap=PATH_COLUMNS, max_widths={"name": 60})
    for hint in path["what_if"]:
        device = "" if hint["device_share"] is None else f"{hint['device_share']:.0%} of device time, "
        out.print(f"what if {hint['name'][:80]} ({device}{hint['path_share']:.0%} of the path) ran "
                  f"{hint['speedup']:g}x faster: the step saves {format_duration(hint['saves_ns'])} "
                  f"({hint['saves_share']:.1%})", markup=False, highlight=False)


@click.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--device", "devices", multiple=True, metavar="SPEC",
              help="Also project each run onto this device (repeatable): a built-in name, cpu, or an accelerator YAML.")
@click.option("--price", "price", type=click.FloatRange(min=0), default=None,
              help="USD per hour of the runs' own device (default: the hardware table's; none for a CPU).")
@out_option
@json_option
def cost(runs: tuple[str, ...], devices: tuple[str, ...], price: float | None, out_dir: str | None,
         as_json: bool) -> None:
    """What inference costs: USD per million calls, items and tokens, measured on each run's device and
    projected onto others from the roofline (projections are optimistic: perfect kernels, no overhead)."""
    from workbench.analysis.cost import cost_table
    from workbench.hardware import resolve_device_spec
    from workbench.trace.store.resolve import resolve_runs

    with errors():
        targets = [resolve_device_spec(device) for device in devices]
        table = cost_table(resolve_runs(list(runs), checked_root(out_dir, writing=False)), targets,
                           price_per_hour=price)
    if as_json:
        print_json(json.loads(table.to_json(orient="records")))
        return
    print_table(TextTable("cost (projections: roofline time of perfect kernels, no launch or host overhead)",
                          COST_COLUMNS, tuple(
        cells(str(row.variant), row.basis, str(row.device), *(None if _missing(v) else v for v in (
            row.latency_ms, row.items_per_s, row.price_per_hour, row.usd_per_million_calls,
            row.usd_per_million_items, row.usd_per_million_tokens)),
            "-" if _missing(row.work_known) else f"{row.work_known:.0%}") for row in table.itertuples()),
        left=frozenset({"variant", "basis", "device"})))


def _missing(value: Any) -> bool:
    """Whether a table value is missing (NaN or None)."""
    return value is None or (isinstance(value, float) and value != value)
