"""`workbench ranks EXPERIMENT`: the per-rank analyses of a job imported with `import --ranks`, computed as
distributed queries (`workbench.analysis.rank_queries.job_aggregates`: each rank's task reads its own bundle
where it lies, the driver only combines their partial aggregates, so it never loads the job's events)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from workbench.cli.options import json_option
from workbench.cli.render import err, errors, nothing, out, print_json, print_table, styled
from workbench.views.text_tables import Cell, TextTable, cells

if TYPE_CHECKING:  # the analysis (pandas) loads when the command runs, not with the command line
    from workbench.analysis.ranks import RankAggregates

RANK_TABLE_COLUMNS = ("rank", "steps", "median step ms", "vs median", "straggler", "busy ms", "idle ms", "compute ms",
                      "collective ms", "exposed collective ms", "overlap %")
SPREAD_TABLE_COLUMNS = ("step", "ranks", "min ms", "median ms", "max ms", "spread ms", "slowest rank")
TOP_STEPS = 10
"""Steps the text output lists without `--steps`: those whose duration differs most over the ranks."""


@click.command()
@click.argument("experiment")
@click.option("--out", "out_dir", default=None, metavar="DIR|URL",
              help="Traces root (default: $WORKBENCH_TRACES or ./traces), a folder or an fsspec URL (s3://, gs://...).")
@click.option("--cluster", default="local", show_default=True, metavar="local|auto|ray://HOST:PORT",
              help="Where each rank's query runs: this machine's process pool, the Ray cluster running here, or a "
                   "remote Ray cluster (needs `pip install 'workbench[ray]'`).")
@click.option("--threshold", default=0.10, show_default=True, type=click.FloatRange(min=0),
              help="Straggler threshold: how far (relative) a rank's median step may exceed the ranks' median.")
@click.option("--steps", "all_steps", is_flag=True,
              help=f"List every step's spread over the ranks (default: the {TOP_STEPS} of largest spread).")
@json_option
def ranks(experiment: str, out_dir: str | None, cluster: str, threshold: float, all_steps: bool,
          as_json: bool) -> None:
    """Per-rank device, compute and collective time, step times and stragglers of a job imported with
    `workbench import --ranks` (EXPERIMENT is the id that import printed)."""
    from workbench.analysis.rank_queries import job_aggregates
    from workbench.distributed import engine_for
    from workbench.paths import root_where_it_lies

    with errors():
        root = root_where_it_lies(out_dir)
        engine = None if cluster == "local" else engine_for(cluster)  # None: job_aggregates sizes the local pool
    with errors(), err.status("querying the ranks", spinner="dots") if not as_json else nothing():
        aggregates = job_aggregates(root, experiment, engine=engine, threshold=threshold)
    if as_json:
        print_json(aggregates_json(experiment, aggregates))
    else:
        _print_aggregates(experiment, aggregates, all_steps)


def aggregates_json(experiment: str, aggregates: RankAggregates) -> dict[str, Any]:
    """What `--json` prints: the experiment id, one object per rank (`RANK_COLUMNS`), the spread of every step
    over the ranks (`SPREAD_COLUMNS`) and the straggler ranks; plain JSON values, NaN as null."""
    from workbench.analysis.ranks import RANK_COLUMNS, SPREAD_COLUMNS
    from workbench.trace.store.bundle import json_safe

    table = aggregates.table
    return json_safe({"experiment": experiment,
                      "ranks": table[list(RANK_COLUMNS)].to_dict(orient="records"),
                      "steps": aggregates.spread[list(SPREAD_COLUMNS)].to_dict(orient="records"),
                      "stragglers": _stragglers(aggregates)})


def _stragglers(aggregates: RankAggregates) -> list[int]:
    table = aggregates.table
    return [int(rank) for rank in table.loc[table["straggler"].astype(bool), "rank"]]


def _ms(ns: Any) -> float | None:
    """A duration in ns as ms for a table; None (shown "-") when unknown."""
    from workbench.analysis.findings.finding import number_or_none

    value = number_or_none(ns)
    return None if value is None else value / 1e6


def _percent(fraction: Any, sign: str = "") -> str:
    """A fraction as a percentage for a table (`sign` "+" to show it); "-" when unknown."""
    from workbench.analysis.findings.finding import number_or_none

    value = number_or_none(fraction)
    return "-" if value is None else f"{value:{sign}.1%}"


def _print_aggregates(experiment: str, aggregates: RankAggregates, all_steps: bool) -> None:
    """The text output: a headline, the table of ranks, then the steps' spread over the ranks."""
    flagged = _stragglers(aggregates)
    verdict = (styled(f"stragglers: {', '.join(f'rank {r}' for r in flagged)}", "red") if flagged
               else styled("no straggler", "green"))
    out.print(Text.assemble((experiment, "bold"), f"  {len(aggregates.table)} ranks  ", verdict))
    print_table(TextTable("ranks", RANK_TABLE_COLUMNS, tuple(
        cells(str(int(row["rank"])), str(int(row["steps"])), _ms(row["median_step_ns"]),
              _percent(row["step_excess"], "+"), Cell("yes", "bad") if row["straggler"] else "", _ms(row["busy_ns"]),
              _ms(row["idle_ns"]),
              _ms(row["compute_ns"]), _ms(row["collective_ns"]), _ms(row["exposed_collective_ns"]),
              _percent(row["overlap_frac"]))
        for row in aggregates.table.to_dict(orient="records"))), no_wrap=RANK_TABLE_COLUMNS)
    spread = aggregates.spread
    title = "step spread over the ranks"
    if not all_steps and len(spread) > TOP_STEPS:
        spread = spread.sort_values("spread_ns", ascending=False, kind="stable").head(TOP_STEPS)
        title += f" (the {TOP_STEPS} of largest spread of {len(aggregates.spread)}; --steps for all)"
    print_table(TextTable(title, SPREAD_TABLE_COLUMNS, tuple(
        cells(str(int(row["step"])), str(int(row["ranks"])), _ms(row["min_ns"]), _ms(row["median_ns"]),
              _ms(row["max_ns"]), _ms(row["spread_ns"]), str(int(row["slowest_rank"])))
        for row in spread.to_dict(orient="records"))), no_wrap=SPREAD_TABLE_COLUMNS)
