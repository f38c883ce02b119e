"""`workbench query RUN... "SQL"`: SQL over the runs' tables (`workbench.analysis.sql`), read-only."""

from __future__ import annotations

import click

from workbench.analysis.sql_limits import DEFAULT_LIMIT, DEFAULT_TIMEOUT_S, MAX_LIMIT
from workbench.cli.options import json_option, out_option
from workbench.cli.render import err, errors, labelled, print_json, print_table
from workbench.views.text_tables import TextTable, cells

MAX_CELL = 60
"""Widest text cell of the table (cut with an ellipsis; `--json` has the whole text)."""


@click.command()
@click.argument("runs", nargs=-1)
@click.argument("sql")
@click.option("--all", "all_runs", is_flag=True, help="Query every run of the traces root.")
@click.option("--limit", default=DEFAULT_LIMIT, show_default=True, type=click.IntRange(1, MAX_LIMIT),
              help="Most rows to return.")
@click.option("--timeout", "timeout_s", default=DEFAULT_TIMEOUT_S, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Seconds before the query is stopped.")
@out_option
@json_option
def query(runs: tuple[str, ...], sql: str, all_runs: bool, limit: int, timeout_s: float, out_dir: str | None,
          as_json: bool) -> None:
    """Run one SQL SELECT over runs (ids as `workbench ls` shows them, bundle paths or experiment ids): tables
    events, memory, counters, kernel_metrics (where present) and runs, each with a `run` column (docs/sql.md)."""
    from workbench.analysis.sql import run_query
    from workbench.paths import checked_root
    from workbench.trace.store.bundle import list_bundles
    from workbench.trace.store.resolve import resolve_runs

    if all_runs == bool(runs):
        raise click.UsageError("name the runs to query, or --all (not both)")
    with errors():
        root = checked_root(out_dir, writing=False)
        bundles = list_bundles(root) if all_runs else resolve_runs(runs, root)
        result = run_query(bundles, sql, limit=limit, timeout_s=timeout_s)
    if as_json:
        print_json(result.to_json())
    else:
        reply = result.to_json()
        texts = tuple(c for c, t in zip(reply["columns"], reply["types"], strict=True) if "string" in t)
        print_table(TextTable("", tuple(reply["columns"]), tuple(cells(*row) for row in reply["rows"]),
                              left=frozenset(texts)), no_wrap=texts, max_widths=dict.fromkeys(texts, MAX_CELL))
    if result.truncated:
        err.print(labelled("note:", "yellow", f"only the first {limit} rows are shown; raise --limit for more"))
