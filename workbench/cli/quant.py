"""`workbench quant`: the quantization lab on the command line (see `workbench.quant.lab`): which layers and tensors
can take which format, the recipes side by side, and a mixed-precision plan under an error budget.

`--tables FOLDER` keeps what the views draw (`workbench.quant.results`): the Jupyter server's quantization jobs
write it, and draw the panel's view from it at any width without running the lab again
(`workbench.server.quant_handlers`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from workbench.cli.options import comma_list, json_option, parse_overrides, set_option
from workbench.cli.render import errors, print_blocks, print_json, reading_status
from workbench.paths import checked_output

DEFAULT_FORMATS = "fp8-e4m3/channel,mxfp8,mxfp6,mxfp4,nvfp4,int8/channel,int4/group32"
"""`--formats`' default (the lab's `DEFAULT_FORMATS`, spelled here so `--help` imports no torch)."""


@click.command()
@click.option("--model", default="tiny-gpt", show_default=True,
              help="Any model reference: a built-in (tiny-gpt, convnet, mlp: configure with --set), hf:, "
                   "hf-config:, torchvision:, timm:, package.module:factory.")
@click.option("--weights", type=click.Choice(["trained", "random"]), default=None,
              help="A built-in's weights: trained (tiny-gpt on the Python standard library, convnet on scikit-learn's "
                   "digits; judged on held-out data: the default where they exist) or seeded random ones.")
@click.option("--formats", default=DEFAULT_FORMATS, show_default=True, callback=comma_list(str), metavar="LIST",
              help="Formats of the sensitivity scan: FORMAT[/GRANULARITY][/sym|asym] with FORMAT one of fp8-e4m3, "
                   "fp8-e5m2, mxfp8, mxfp6, mxfp4, nvfp4, int8, int4, bf16 and GRANULARITY tensor, channel, token, "
                   "head, groupN or blockN.")
@click.option("--quant", "recipes", multiple=True, metavar="RECIPE",
              help="A recipe to compare (repeatable): TARGET=FORMAT,... with TARGET PATTERN.weight, PATTERN.input "
                   "(a Linear name pattern with *, or linear for all), kv, k, v, q or p; e.g. "
                   "'linear.weight=nvfp4,kv=fp8-e4m3/head'. Default: a set of common recipes.")
@click.option("--scan/--no-scan", default=True, show_default=True,
              help="Run the sensitivity scan (every layer × format, tensor kinds, outliers).")
@click.option("--budget", default=None, metavar="SPEC",
              help="Also plan mixed precision under this error budget: sqnr=DB and/or kl=NATS.")
@click.option("--plan-format", default="int4/group32", show_default=True,
              help="The low-bit weight format the plan puts every layer it can in.")
@click.option("--device", default="b200", show_default=True, metavar="SPEC",
              help="Device the recipes' time is projected on: a built-in (b200, h100, tpu-v5e, ...) or an "
                   "accelerator YAML.")
@click.option("--batch", default=16, show_default=True, type=click.IntRange(min=1, max=256),
              help="Calibration inputs per forward (sequences, images).")
@click.option("--seq", default=None, type=click.IntRange(min=1, max=4096), help="Tokens per sequence.")
@click.option("--measure/--no-measure", default=True, show_default=True,
              help="Time the recipes that have a real CPU kernel (bf16, torchao int8) beside fp32.")
@set_option("Model config override, e.g. --set layers=4.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the lab's views (heat map, histograms, outliers, Pareto) to this HTML file.")
@click.option("--tables", "tables_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="FOLDER", help="Also write the lab's tables (Parquet, one per table) into this folder, to draw "
                                     "its views from later.")
@json_option
def quant(model: str, weights: str | None, formats: tuple[str, ...], recipes: tuple[str, ...], scan: bool,
          budget: str | None, plan_format: str, device: str, batch: int, seq: int | None, measure: bool,
          overrides: tuple[str, ...], html_path: Path | None, tables_dir: Path | None, as_json: bool) -> None:
    """Quantization lab: which layers and tensors take which low-bit format (FP8, MX, NVFP4, INT8/INT4, each
    emulated bit for bit), what each recipe costs in accuracy, memory and projected time, and a mixed-precision
    plan under an error budget."""
    from workbench.quant.results import LAB_FILE, LabResults, parse_budget, save_results

    with errors():  # misuse fails here, before torch loads
        budget_values = parse_budget(budget) if budget else None
        model_overrides = parse_overrides(overrides)
        html_path = checked_output(html_path) if html_path is not None else None
        tables_dir = checked_output(tables_dir / LAB_FILE).parent if tables_dir is not None else None
    from workbench.quiet import quiet

    quiet()  # torchao's known deprecation chatter as torch loads
    from workbench.quant import lab
    from workbench.quant.formats import parse_spec
    from workbench.quant.recipe import parse_recipe

    with errors():
        for fmt in (*formats, plan_format):
            parse_spec(fmt)
        for recipe in recipes:
            parse_recipe(recipe)
        with reading_status(f"loading {model} (a built-in's first trained load trains it: about 2 minutes)",
                            as_json):
            task = lab.quant_task(model, weights=weights, batch=batch, seq=seq, overrides=model_overrides)
        result: dict[str, Any] = {"model": task.name, "about": task.about, "metric": task.metric, "device": device}
        sensitivity = None
        if scan:
            with reading_status(f"scanning every layer × {len(formats)} formats", as_json):
                sensitivity = lab.sensitivity_scan(task, formats)
        with reading_status("comparing recipes", as_json):
            table = lab.compare_recipes(task, recipes or lab.DEFAULT_RECIPES, device=device, measure=measure,
                                        strict=bool(recipes))  # the user's own recipes must apply whole
        plan = None
        if budget_values:
            from workbench.quant.plan import mixed_precision_plan

            with reading_status(f"planning {plan_format} under {budget}", as_json):
                plan = mixed_precision_plan(task.module, task.inputs, plan_format,
                                            min_sqnr_db=budget_values.get("sqnr"), max_kl=budget_values.get("kl"),
                                            sensitivity=sensitivity.layers if sensitivity is not None else None)
    if html_path is not None:
        from workbench.report import write_report
        from workbench.views.quant import quant_view

        with errors():
            write_report(quant_view(task.about, table, sensitivity, device=device), html_path,
                         title=f"quantization lab: {task.name}")
    if tables_dir is not None:
        with errors():
            save_results(tables_dir, LabResults(task.about, device, table, sensitivity))
    if as_json:
        result["recipes"] = _records(table)
        if sensitivity is not None:
            result.update({"layers": _records(sensitivity.layers), "tensors": _records(sensitivity.tensors),
                           "outliers": _records(sensitivity.outliers), "smoothing": _records(sensitivity.smoothing)})
        if plan is not None:
            result["plan"] = {"format": plan_format, "budget": budget_values, "recipe": plan.recipe,
                              "kept": list(plan.kept), "met": plan.met, "sqnr_db": _finite(plan.sqnr_db),
                              "kl": plan.kl, "weight_bytes": plan.weight_bytes}
        print_json(result)
        return
    from workbench.views import quant_text

    blocks: list = [task.about]
    blocks.append(quant_text.recipes_text(table, device, task.metric))
    if sensitivity is not None:
        blocks += [quant_text.sensitivity_text(sensitivity.layers), quant_text.tensors_text(sensitivity.tensors),
                   quant_text.outliers_text(sensitivity.outliers, sensitivity.smoothing)]
    if plan is not None:
        blocks.append(quant_text.plan_text(plan, plan_format, budget or ""))
    print_blocks(blocks)


def _finite(value: Any) -> Any:
    """JSON has no infinity: an exact (infinite-SQNR) figure is null."""
    return None if isinstance(value, float) and (math.isinf(value) or math.isnan(value)) else value


def _records(frame) -> list[dict[str, Any]]:
    """A DataFrame as JSON-ready records (NaN and infinities as null, numpy scalars as Python numbers)."""
    return [{key: _finite(value.item() if hasattr(value, "item") else value) for key, value in row.items()}
            for row in frame.astype(object).where(frame.notna(), None).to_dict("records")]
