"""`workbench replay`: a run's heaviest op signatures rebuilt from their recorded shapes and timed alone, beside
the time the trace gave them and their roofline position (`workbench.replay`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from workbench.cli.options import json_option, out_option
from workbench.cli.render import err, errors, nothing, print_blocks, print_json, print_table
from workbench.paths import checked_output, checked_root
from workbench.views.text_tables import TextTable

VARIANT_NAMES = ("eager", "bf16", "compile")
"""The variants `--variants` takes (`workbench.replay.table.VARIANTS`, named here so `--help` loads no torch)."""


def _variants(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """`--variants`: a comma-separated list of `VARIANT_NAMES`."""
    items = tuple(item.strip() for item in value.split(",") if item.strip())
    unknown = [item for item in items if item not in VARIANT_NAMES]
    if unknown or not items:
        raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}: choose from {', '.join(VARIANT_NAMES)} "
                                 "(ORT does not apply to single aten ops)")
    return items


@click.command()
@click.argument("run")
@click.option("--top", default=20, show_default=True, type=click.IntRange(min=1),
              help="Op signatures replayed: those with the most self time in the measured steps.")
@click.option("--variants", default=",".join(VARIANT_NAMES), show_default=True, callback=_variants,
              help="Comma-separated: eager (the recorded call), bf16 (its fp32/fp16 tensors in bfloat16), compile "
                   "(torch.compile of the single call; compiling is not timed).")
@click.option("--iterations", default=20, show_default=True, type=click.IntRange(min=1),
              help="Interleaved timed rounds (each calls every op under every variant once).")
@click.option("--warmup", default=3, show_default=True, type=click.IntRange(min=0), help="Warm-up rounds.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the replay's view (chart and table) to this HTML file.")
@out_option
@json_option
def replay(run: str, top: int, variants: tuple[str, ...], iterations: int, warmup: int, html_path: Path | None,
           out_dir: str | None, as_json: bool) -> None:
    """Rebuild a run's top ops from the shapes, dtypes, strides and scalars its trace recorded (capture with
    record_shapes on, the default) and time each alone: eager, bf16 and compiled, next to the trace's time and
    its roofline position. Ops that cannot be rebuilt are listed with the reason."""
    from workbench.trace.store.bundle import open_bundle

    with errors():
        html_path = checked_output(html_path) if html_path is not None else None
        bundle = open_bundle(run, checked_root(out_dir, writing=False))
    from workbench.quiet import quiet

    quiet()
    from workbench.replay.table import replay_run

    with errors(), (nothing() if as_json else err.status("replaying", spinner="dots")) as status:
        table = replay_run(bundle, top=top, variants=variants, iterations=iterations, warmup=warmup,
                           progress=None if status is None else status.update)
        if html_path is not None:
            from workbench.report import write_report
            from workbench.views.replay import replay_view

            write_report(replay_view(table, f"op replay: {bundle.run_id}"), html_path,
                         title=f"workbench replay: {bundle.run_id}")
    if as_json:
        print_json({"run": bundle.run_id, **_json_attrs(table.attrs), "html": str(html_path) if html_path else None,
                    "rows": _records(table)})
        return
    from workbench.views.replay import TEXT_LEFT, replay_text

    for block in replay_text(table):
        if isinstance(block, TextTable):
            figures = tuple(column for column in block.columns if column not in TEXT_LEFT)
            print_table(block, no_wrap=("op", "bound", "status", *figures), fold=("inputs", "reason"),
                        max_widths={"op": 36, "inputs": 44, "reason": 44})
        else:
            print_blocks([block])
    if html_path is not None:
        print_blocks([f"view: {html_path}"])


def _json_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """The replay's settings and floor, JSON-ready."""
    return {key: _plain(value) for key, value in attrs.items()}


def _plain(value: Any) -> Any:
    """A table value as JSON takes it: numpy scalars as Python numbers, NaN and infinities as null."""
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(table: Any) -> list[dict[str, Any]]:
    """The table's rows as JSON objects."""
    return [{key: _plain(value) for key, value in row.items()} for row in table.to_dict("records")]
