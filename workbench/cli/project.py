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
SCALING_COLUMNS = ("chips", "step", "speedup", "efficiency", "all-reduce", "comm share")
EVIDENCE_ROWS = 5


@click.command()
@click.argument("target", metavar="MODEL|RUN|FILE", required=False)
@click.option("--accelerator", "accelerator", required=True, metavar="FILE|NAME",
              help="An accelerator description (YAML, docs/accelerators.md), a built-in device name or cpu.")
@click.option("--models", default=None, metavar="M1,M2,...",
              help="Project a set of models instead of MODEL|RUN and compare the sweeps across them: tiny-gpt, "
                   "llama-reduced, resnet50, vit, bert (reduced configs built in code) or any model reference.")
@click.option("--sweep", "sweeps", multiple=True, metavar="KNOB=V1,V2,...",
              help="Project again at each value of one knob (repeatable): factors of bandwidth, on_chip, rate, "
                   "rate.<dtype>, link or chip_link (bandwidth=0.5,1,2,4), array shapes (array=64x64,128x128), or "
                   "chip counts (chips=1,2,4).")
@click.option("--chips", "chips", default=None, metavar="N1,N2,...",
              help="Also project on this many chips, tensor-parallel over the description's chip_links: the step, "
                   "speedup, efficiency and all-reduce share at each count (1,2,4,8) and how each operator shards; "
                   "the other --sweep knobs are then swept on the largest count.")
@click.option("--dtype", "dtype", type=click.Choice(TARGET_DTYPES), default=None,
              help="Project the graph at this precision (its floating-point operators' bytes and dtype).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="A model's batch size.")
@click.option("--seq", default=None, type=click.IntRange(min=1), help="A sequence model's length (its default).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS",
              help="An ONNX file's input size, e.g. --shape tokens=2x32 (repeatable; every dynamic dim needs one).")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=0), help="Operators printed.")
@click.option("--html", "html_path", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Also write the report as one HTML file: operators by bound, kinds, sweep curves, guidance.")
@out_option
@json_option
def project(target: str | None, accelerator: str, models: str | None, sweeps: tuple[str, ...], chips: str | None,
            dtype: str | None, batch: int, seq: int | None, shapes: tuple[str, ...], top: int, html_path: str | None,
            out_dir: str | None, as_json: bool) -> None:
    """Project MODEL (one forward of its example inputs), RUN (a captured run's measured steps, from recorded
    shapes) or a model FILE (ONNX, a torch.export .pt2, XLA HLO text) onto an accelerator: per operator its unit,
    array utilization, compute and memory time, bound and fusion group; totals per step, per operator kind and per
    block of layers; guidance (what fits the chip badly and what a change would save, projected again). With
    --models, the step of each model and its ratio at every --sweep value, and which knob buys the most. With
    --chips, the step on each chip count, sharded tensor-parallel (docs/accelerators.md, "Several chips")."""
    from workbench.codesign.description import resolve_description
    from workbench.codesign.sensitivity import parse_chips, parse_sweep
    from workbench.codesign.sharding import chip_links
    from workbench.errors import WorkbenchError
    from workbench.models.onnx_file import shape_overrides

    with errors():
        if (target is None) == (models is None):
            raise WorkbenchError("project: give MODEL|RUN or --models M1,M2,... (one of them)")
        description = resolve_description(accelerator)
        try:
            knobs = [parse_sweep(text) for text in sweeps]
        except ValueError as exc:
            raise WorkbenchError(str(exc)) from None
        try:
            counts = parse_chips(chips) if chips is not None else []
        except ValueError as exc:
            raise WorkbenchError(f"--chips: {exc}") from None
        if counts and models is not None:
            raise WorkbenchError("--chips projects one MODEL|RUN; across --models sweep the count: "
                                 "--sweep chips=1,2,4")
        chip_links(description, max(counts, default=1))  # no links, or more chips than the part has: say so now
        if models is not None:
            result, view = _model_set(models, description, knobs, dtype, batch)
        else:
            assert target is not None
            result, view = _one(target, description, knobs, dtype, batch, seq, out_dir, counts,
                                shape_overrides(shapes).get("shapes"))
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
         out_dir: str | None, counts: list[int], shapes: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """One model or run: its projection, totals, guidance and sweeps (the result), on several chips when `counts`
    are given (the sweeps then on the largest), and its view's builder."""
    from workbench.codesign.graph import at_dtype
    from workbench.codesign.guidance import guidance
    from workbench.codesign.projection import project, totals
    from workbench.codesign.sensitivity import sweep
    from workbench.codesign.sources import graph_source

    source = graph_source(target, checked_root(out_dir, writing=False), batch=batch, seq=seq, shapes=shapes)
    graph = at_dtype(source.graph, dtype) if dtype else source.graph
    projection = project(graph, description)
    findings = guidance(graph, description, steps=source.steps, llm=source.llm, batch=source.batch,
                        context=source.seq)
    swept = [sweep(graph, description, name, values, source.steps, max(counts, default=1))
             for name, values in knobs]
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
    if counts:
        result["chips"] = _chips(graph, description, counts, source.steps)

    def view() -> Any:  # drawn from the JSON, as the panel's projection jobs draw it
        from workbench.views.projection import result_view

        return result_view(result)

    return result, view


def _chips(graph: Any, description: Any, counts: list[int], steps: int) -> dict[str, Any]:
    """The graph on each chip count: the scaling table, and at the largest count each operator's shard and the
    totals per shard; `note` says when the graph has no dataflow to shard along."""
    from workbench.codesign.projection import project, totals
    from workbench.codesign.sensitivity import scaling

    largest = max(counts)
    projection = project(graph, description, largest)
    links = description.chip_links
    return {
        "counts": counts, "largest": largest, "dataflow": projection.attrs["dataflow"],
        "links": None if links is None else {"bandwidth": links.bandwidth, "latency_s": links.latency_s,
                                             "topology": links.topology, "chips": links.chips},
        "note": None if projection.attrs["dataflow"] else (
            "no sharding possible without dataflow: a captured run's recorded shapes do not say which operator fed "
            "which, so every operator is replicated on every chip (project the model itself to shard it)"),
        "scaling": scaling(graph, description, counts, steps).to_dict("records"),
        "by_shard": totals(projection, "shard", steps).to_dict("records"),
        "ops": projection.to_dict("records"),
    }


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
        "sweeps": table.to_dict("records"), "buys_most": best.to_dict("records"),
    }

    def view() -> Any:  # drawn from the JSON, as the panel's projection jobs draw it
        from workbench.views.projection import result_view

        return result_view(result)

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
        comm = any(row["comm_share"] > 0 for row in table)  # on several chips: the all-reduces' share too
        print_table(TextTable(f"sweep: {table[0]['figure']}", (*SWEEP_COLUMNS, *(("comm share",) if comm else ())),
                              tuple(cells(row["value"], format_duration(row["time_ns"]), f"{row['speedup']:.2f}x",
                                          f"{row['compute_share']:.0%}", f"{row['memory_share']:.0%}",
                                          *((f"{row['comm_share']:.0%}",) if comm else ())) for row in table)))
    if "chips" in result:
        _print_chips(result["chips"], result["steps"])


def _print_chips(chips: dict[str, Any], steps: int) -> None:
    """The scaling table over chip counts and, at the largest, the time per shard (or why nothing shards)."""
    from workbench.hardware.units import format_bytes

    links = chips["links"]
    if links is not None:
        out.print(f"several chips: tensor-parallel over {links['topology']} chip links of "
                  f"{format_bytes(links['bandwidth'], binary=False)}/s per chip, "
                  f"{format_duration(links['latency_s'] * 1e9)} per hop", markup=False, highlight=False)
    if chips["note"]:
        out.print(f"several chips: {chips['note']}", markup=False, highlight=False)
    print_table(TextTable("scaling over chips (speedup over one chip)", SCALING_COLUMNS, tuple(
        cells(str(row["chips"]), format_duration(row["time_ns"]), f"{row['speedup']:.2f}x",
              f"{row['efficiency']:.0%}", format_duration(row["comm_ns"]), f"{row['comm_share']:.0%}")
        for row in chips["scaling"])))
    print_table(TextTable(f"per shard on {chips['largest']} chips", ("shard", *TOTAL_COLUMNS[:3]), tuple(
        cells(row["shard"], str(row["ops"]), format_duration(row["time_ns"]), f"{row['share']:.1%}")
        for row in chips["by_shard"]), left=frozenset({"shard"})))


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


def _print_set(result: dict[str, Any]) -> None:
    """The model set's tables, after a line saying what the ratios are."""
    out.print(f"{result['title']}: step time at each value over the step as written (below 1: faster)",
              markup=False, highlight=False)
    from workbench.views.projection import set_tables

    for table in set_tables(result):
        print_table(table)
