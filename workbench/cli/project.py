"""`workbench project`: a model's operator graph (from a captured run or one forward of a model) projected onto an
accelerator description (`workbench.codesign`), per operator kind, per layer and in total, with sensitivity sweeps."""

from __future__ import annotations

from typing import Any

import click

from workbench.cli.options import json_option, out_option
from workbench.cli.render import errors, out, print_json, print_table
from workbench.paths import checked_root
from workbench.views.text_tables import TextTable, cells, format_duration

TOTAL_COLUMNS = ("ops", "projected", "share", "measured")
OP_COLUMNS = ("#", "op", "kind", "layer", "unit", "util", "compute", "memory", "time", "bound", "group")
SWEEP_COLUMNS = ("factor", "projected", "speedup", "compute share", "memory share")


@click.command()
@click.argument("target", metavar="MODEL|RUN")
@click.option("--accelerator", "accelerator", required=True, metavar="FILE|NAME",
              help="An accelerator description (YAML, docs/accelerators.md), a built-in device name or cpu.")
@click.option("--sweep", "sweeps", multiple=True, metavar="FIGURE=F1,F2,...",
              help="Scale one figure by each factor and project again (repeatable): bandwidth, on_chip, rate, link; "
                   "e.g. bandwidth=0.5,1,2,4.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="A model's batch size.")
@click.option("--seq", default=None, type=click.IntRange(min=1), help="A sequence model's length (its default).")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=0), help="Operators printed.")
@out_option
@json_option
def project(target: str, accelerator: str, sweeps: tuple[str, ...], batch: int, seq: int | None, top: int,
            out_dir: str | None, as_json: bool) -> None:
    """Project MODEL (one forward of its example inputs) or RUN (a captured run's measured steps, from recorded
    shapes) onto an accelerator: per operator its unit, array utilization, compute and memory time, bound and
    fusion group; totals per step, per operator kind and per block of layers (blocks.0, lm_head, ...)."""
    from workbench.codesign.description import resolve_description
    from workbench.codesign.projection import parse_sweep, project, sweep, totals
    from workbench.codesign.sources import graph_source
    from workbench.errors import WorkbenchError

    with errors():
        description = resolve_description(accelerator)
        try:
            parsed = [parse_sweep(text) for text in sweeps]
        except ValueError as exc:
            raise WorkbenchError(str(exc)) from None
        source = graph_source(target, checked_root(out_dir, writing=False), batch=batch, seq=seq)
        projection = project(source.graph, description)
        result: dict[str, Any] = {
            "source": source.label, "accelerator": description.name, "steps": source.steps,
            "step_ns": float(projection["time_ns"].sum() / source.steps),
            "by_kind": totals(projection, "kind", source.steps).to_dict("records"),
            "by_block": totals(projection, "block", source.steps).to_dict("records"),
            "by_bound": totals(projection, "bound", source.steps).to_dict("records"),
            "sweeps": [sweep(source.graph, description, name, factors, source.steps).to_dict("records")
                       for name, factors in parsed],
        }
    if as_json:
        result["ops"] = projection.to_dict("records")
        print_json(result)
        return
    _print(result, projection, top)


def _print(result: dict[str, Any], projection: Any, top: int) -> None:
    """The text report: the step total, the breakdowns, the top operators and the sweeps."""
    out.print(f"{result['source']} on {result['accelerator']}: {format_duration(result['step_ns'])} per step "
              f"({len(projection) // result['steps']} operators per step)", markup=False, highlight=False)
    for by in ("kind", "block", "bound"):
        print_table(TextTable(f"per {by}", (by, *TOTAL_COLUMNS), tuple(
            cells(str(row[by]) or "(not recorded)", str(row["ops"]), format_duration(row["time_ns"]),
                  f"{row['share']:.1%}", format_duration(row["measured_ns"]))
            for row in result[f"by_{by}"]), left=frozenset({by})))
    if top:
        shown = projection.sort_values("time_ns", ascending=False).head(top)
        print_table(TextTable(f"operators (top {top} by projected time)", OP_COLUMNS, tuple(
            cells(str(row.order), row.name, row.kind, row.layer or "-", row.unit,
                  "-" if row.utilization != row.utilization else f"{row.utilization:.0%}",
                  format_duration(row.compute_ns), format_duration(row.memory_ns), format_duration(row.time_ns),
                  row.bound, "-" if row.group < 0 else str(row.group))
            for row in shown.itertuples()), left=frozenset({"op", "kind", "layer", "unit", "bound"})),
            no_wrap=OP_COLUMNS, max_widths={"layer": 30})
    for table in result["sweeps"]:
        print_table(TextTable(f"sweep: {table[0]['figure']}", SWEEP_COLUMNS, tuple(
            cells(f"{row['factor']:g}x", format_duration(row["time_ns"]), f"{row['speedup']:.2f}x",
                  f"{row['compute_share']:.0%}", f"{row['memory_share']:.0%}") for row in table)))
