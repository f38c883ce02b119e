"""Options and value parsers shared by several commands: the traces root, `--json`, `--set KEY=VALUE` model
overrides and comma-separated sweeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from workbench.errors import WorkbenchError

out_option = click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Traces root (default: $WORKBENCH_TRACES or ./traces).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def parse_overrides(items: tuple[str, ...]) -> dict[str, Any]:
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


def comma_list(kind: type):
    """A click callback reading a comma-separated list of `kind` values (integers must be >= 1); the
    runner checks names (attention kinds, KV formats) and lists the valid ones."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Any, ...] | None:
        if value is None:
            return None
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items:
            raise click.BadParameter("give at least one value")
        try:
            values = tuple(kind(item) for item in items)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
        if kind is int and any(v < 1 for v in values):
            raise click.BadParameter("values must be >= 1")
        return values

    return parse
