"""`workbench project`: a model's operator graph (from a captured run or one forward of a model) projected onto an
accelerator description (`workbench.codesign`), per operator kind, per layer and in total, with model guidance and
sensitivity sweeps; or a set of models swept together (`--models`) to see which knob buys the most."""

from __future__ import annotations

from typing import Any

import click

from workbench.cli.options import json_option, out_option
from workbench.cli.render import errors, out, print_json, print_table
from workbench.codesign.description import TARGET_DTYPES
from workbench.paths import checked_root
from workbench.views.text_tables import TextTable, cells, format_duration

TOTAL_COLUMNS = ("ops", "projected", "share", "measured")
OP_COLUMNS = ("#", "op", "kind", "layer", "unit", "util", "compute", "memory", "time", "bound", "group")
SWEEP_COLUMNS = ("value", "projected", "speedup", "compute share", "memory share")
EVIDENCE_ROWS = 5


@click.command()
@click.argument("target", metavar="MODEL|RUN", required=False)
@click.option("--accelerator", "accelerator", required=True, metavar="FILE|NAME",
              help="An accelerator description (YAML, docs/accelerators.md), a built-in device name or cpu.")
@click.option("--models", default=None, metavar="M1,M2,...",
              help="Project a set of models instead of MODEL|RUN and compare the sweeps across them: tiny-gpt, "
                   "llama-reduced, resnet50, vit, bert (reduced configs built in code) or any model reference.")
@click.option("--sweep", "sweeps", multiple=True, metavar="KNOB=V1,V2,...",
              help="Project again at each value of one knob (repeatable): factors of bandwidth, on_chip, rate, "
                   "rate.<dtype> or link (bandwidth=0.5,1,2,4), or array shapes (array=64x64,128x128).")
@click.option("--dtype", "dtype", type=click.Choice(TARGET_DTYPES), default=None,
              help="Project the graph at this precision (its floating-point operators' bytes and dtype).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="A model's batch size.")
@click.option("--seq", default=None, type=click.IntRange(min=1), help="A sequence model's length (its default).")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=0), help="Operators printed.")
@click.option("--html", "html_path", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Also write the report as one HTML file: operators by bound, kinds, sweep curves, guidance.")
@out_option
@json_option
def project(target: str | None, accelerator: str, models: str | None, sweeps: tuple[str, ...], dtype: str | None,
            batch: int, seq: int | None, top: int, html_path: str | None, out_dir: str | None,
            as_json: bool) -> None:
    """Project MODEL (one forward of its example inputs) or RUN (a captured run's measured steps, from recorded
    shapes) onto an accelerator: per operator its unit, array utilization, compute and memory time, bound and
    fusion group; totals per step, per operator kind and per block of layers; guidance (what fits the chip badly
    and what a change would save, projected again). With --models, the step of each model and its ratio at every
    --sweep value, and which knob buys the most."""
    from workbench.codesign.description import resolve_description
    from workbench.codesign.sensitivity import parse_sweep
    from workbench.errors import WorkbenchError

    with errors():
        if (target is None) == (models is None):
            raise WorkbenchError("project: give MODEL|RUN or --models M1,M2,... (one of them)")
        description = resolve_description(accelerator)
        try:
            knobs = [parse_sweep(text) for text in sweeps]
        except ValueError as exc:
            raise WorkbenchError(str(exc)) from None
        if models is not None:
            result, view = _model_set(models, description, knobs, dtype, batch)
        else:
            assert target is not None
            result, view = _one(target, description, knobs, dtype, batch, seq, out_dir)
        if html_path:
            from workbench.report import write_report

            result["html"] = str(write_report(view(), html_path, title=f"workbench project: {result['title']}"))
    if as_json:
        print_json({k: v for k, v in result.items() if not k.startswith("_")})
        return
    if models is not None:
        _print_set(result)
    else:
        _print(result, result["_projection"], top)
    if result.get("html"):
        out.print(f"view: {result['html']}", markup=False, highlight=False)


def _one(target: str, description: Any, knobs: list, dtype: str | None, batch: int, seq: int | None,
         out_dir: str | None) -> tuple[dict[str, Any], Any]:
    """One model or run: its projection, totals, guidance and sweeps (the result), and its view's builder."""
    from workbench.codesign.graph import at_dtype
    from workbench.codesign.guidance import guidance
    from workbench.codesign.projection import project, totals
    from workbench.codesign.sensitivity import sweep
    from workbench.codesign.sources import graph_source

    source = graph_source(target, checked_root(out_dir, writing=False), batch=batch, seq=seq)
    graph = at_dtype(source.graph, dtype) if dtype else source.graph
    projection = project(graph, description)
    findings = guidance(graph, description, steps=source.steps, llm=source.llm, batch=source.batch,
                        context=source.seq)
    swept = [sweep(graph, description, name, values, source.steps) for name, values in knobs]
    label = source.label + (f" at {dtype}" if dtype else "")
    result: dict[str, Any] = {
        "title": label, "source": label, "accelerator": description.name, "steps": source.steps, "dtype": dtype,
        "step_ns": float(projection["time_ns"].sum() / source.steps),
        "by_kind": totals(projection, "kind", source.steps).to_dict("records"),
        "by_block": totals(projection, "block", source.steps).to_dict("records"),
        "by_bound": totals(projection, "bound", source.steps).to_dict("records"),
        "guidance": [f.to_dict() for f in findings],
        "sweeps": [table.to_dict("records") for table in swept],
        "ops": projection.to_dict("records"), "_projection": projection, "_findings": findings,
    }

    def view() -> Any:
        import pandas as pd

        from workbench.views.projection import projection_view

        curves = pd.concat([t.assign(model=label, ratio=1.0 / t["speedup"]) for t in swept]) if swept else None
        return projection_view(f"{label} on {description.name}: {format_duration(result['step_ns'])} per step",
                               projection=projection, steps=source.steps, findings=findings, sweeps=curves)

    return result, view


def _model_set(models: str, description: Any, knobs: list, dtype: str | None,
               batch: int) -> tuple[dict[str, Any], Any]:
    """A set of models: each one's step, the sweep table across them and which knob buys the most."""
    from workbench.codesign.graph import at_dtype
    from workbench.codesign.sensitivity import buys_most, model_set_sweep, step_ns
    from workbench.codesign.sources import MODEL_SET, set_model_graph
    from workbench.errors import WorkbenchError
    from workbench.models.registry import model_source

    names = [name.strip() for name in models.split(",")]
    for name in names:
        if not name or (name not in MODEL_SET and model_source(name) is None):
            raise WorkbenchError(f"--models {models!r}: unknown model {name!r}; the set: {', '.join(MODEL_SET)} "
                                 "(or any model reference: tiny-gpt, hf-config:<preset>, torchvision:<name>, ...)")
    if not knobs:
        raise WorkbenchError("--models compares sweeps: give at least one --sweep, e.g. --sweep bandwidth=0.5,1,2,4")
    graphs = {}
    for name in dict.fromkeys(names):
        graph = set_model_graph(name, batch=batch).graph
        graphs[name] = at_dtype(graph, dtype) if dtype else graph
    table = model_set_sweep(graphs, description, knobs)
    best = buys_most(table)
    title = f"{len(graphs)} models on {description.name}" + (f" at {dtype}" if dtype else "")
    result: dict[str, Any] = {
        "title": title, "accelerator": description.name, "dtype": dtype, "batch": batch,
        "models": [{"model": name, "step_ns": step_ns(graph, description)} for name, graph in graphs.items()],
        "sweeps": table.to_dict("records"), "buys_most": best.to_dict("records"), "_table": table,
    }

    def view() -> Any:
        from workbench.views.projection import projection_view

        return projection_view(title, sweeps=table, tables=_set_tables(result))

    return result, view


def _print(result: dict[str, Any], projection: Any, top: int) -> None:
    """The text report: the step total, the breakdowns, the top operators, the guidance and the sweeps."""
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
    _print_guidance(result["_findings"])
    for table in result["sweeps"]:
        print_table(TextTable(f"sweep: {table[0]['figure']}", SWEEP_COLUMNS, tuple(
            cells(row["value"], format_duration(row["time_ns"]), f"{row['speedup']:.2f}x",
                  f"{row['compute_share']:.0%}", f"{row['memory_share']:.0%}") for row in table)))


def _print_guidance(findings: list) -> None:
    """Each finding: its title, the gain of the change projected, and its slowest evidence rows."""
    from workbench.views.projection import evidence_table

    if not findings:
        out.print("guidance: nothing found that fits this accelerator badly", markup=False, highlight=False)
        return
    for number, f in enumerate(findings, 1):
        out.print(f"guidance {number} ({f.kind}): {f.title}\n  change: {f.change}; gain "
                  f"{format_duration(f.gain_ns)} ({f.gain_share:.1%} of the {f.step})", markup=False,
                  highlight=False)
        shown = f.evidence.head(EVIDENCE_ROWS)
        print_table(evidence_table(f"evidence ({len(shown)} of {len(f.evidence)})", shown),
                    max_widths={"name": 28, "layer": 28})


def _set_tables(result: dict[str, Any]) -> list[TextTable]:
    """The model set's tables: per knob each model's step ratio at each value, then which knob buys the most."""
    table = result["_table"]
    steps = {row["model"]: row["step_ns"] for row in result["models"]}
    tables = []
    for name, rows in table.groupby("figure", sort=False):
        values = list(dict.fromkeys(rows["value"]))
        ratios = rows.pivot(index="model", columns="value", values="ratio")
        tables.append(TextTable(f"sweep: {name} (step / as written)", ("model", "step as written", *values), tuple(
            cells(model, format_duration(steps[model]), *(f"{ratios.loc[model, v]:.2f}" for v in values))
            for model in steps), left=frozenset({"model"})))
    tables.append(TextTable("which knob buys the most", ("model", "knob", "value", "speedup"), tuple(
        cells(row["model"], row["figure"], row["value"], f"{row['speedup']:.2f}x") for row in result["buys_most"]),
        left=frozenset({"model", "knob", "value"})))
    return tables


def _print_set(result: dict[str, Any]) -> None:
    """The model set's tables, after a line saying what the ratios are."""
    out.print(f"{result['title']}: step time at each value over the step as written (below 1: faster)",
              markup=False, highlight=False)
    for table in _set_tables(result):
        print_table(table)
