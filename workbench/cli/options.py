"""Options and value parsers shared by several commands: the traces root, `--json`, `--set KEY=VALUE` model
overrides and comma-separated sweeps (`comma_list`, and `sweep_ints` for a size that is one value or several)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

from workbench.errors import WorkbenchError

out_option = click.option(
    "--out", "out_dir", default=None, metavar="DIR|URL",
    help="Traces root (default: $WORKBENCH_TRACES or ./traces); an fsspec URL (s3://...) is read through a local "
         "mirror (`import --ranks` also writes to one).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def set_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--set KEY=VALUE`, repeatable, and also `--set layers=2 hidden=512`: the pairs that follow a `--set` are
    taken as more overrides (click reads them as arguments; the command itself takes none). The command gets
    them all in its `overrides` parameter."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def with_pairs(*args: Any, overrides: tuple[str, ...] = (), set_pairs: tuple[str, ...] = (),
                       **kwargs: Any) -> Any:
            if set_pairs and not overrides:
                raise click.UsageError(f"unexpected argument {set_pairs[0]!r}: KEY=VALUE pairs go after --set")
            stray = [item for item in set_pairs if "=" not in item]
            if stray:
                raise click.UsageError(f"unexpected argument {stray[0]!r}: after --set, give KEY=VALUE pairs")
            return command(*args, overrides=(*overrides, *set_pairs), **kwargs)

        with_pairs = click.argument("set_pairs", nargs=-1, metavar="[KEY=VALUE]...")(with_pairs)
        return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help_text)(with_pairs)

    return decorate


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
            raise click.BadParameter(f"values must be >= 1 (the range x>=1), got {min(values)}")
        return values

    return parse


def sweep_ints(ctx: click.Context, param: click.Parameter, value: str | None) -> int | tuple[int, ...] | None:
    """A click callback reading one integer >= 1, or a comma-separated list of them (a sweep): one value as the
    integer, several as a tuple, as `ExperimentSettings` takes them."""
    values = comma_list(int)(ctx, param, value)
    if values is None:
        return None
    return values[0] if len(values) == 1 else values
