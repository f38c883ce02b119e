"""`workbench diff`: two or more runs, captured or imported, compared against a baseline: step time, device
busy/idle and copy/compute overlap, and the op-by-op and kernel-by-kernel deltas."""

from __future__ import annotations

import click

from workbench.cli.options import json_option, out_option
from workbench.cli.render import err, errors, print_blocks, print_json, print_table
from workbench.paths import checked_root
from workbench.views.text_tables import TextTable


@click.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--baseline", default=None, metavar="RUN",
              help="The run the others are compared against (a run id or its name; default: the first).")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1),
              help="Regressions and improvements listed per kind.")
@out_option
@json_option
def diff(runs: tuple[str, ...], baseline: str | None, top: int, out_dir: str | None, as_json: bool) -> None:
    """Compare runs' traces against a baseline: step time (median, spread), device busy/idle and copy/compute
    overlap, and op and kernel deltas (count, total and mean time; new and vanished names; largest regressions
    first). RUNS are run ids, bundle paths or experiment ids (an experiment stands for its runs)."""
    from workbench.analysis.diff import trace_comparison
    from workbench.trace.store.resolve import resolve_runs
    from workbench.views.diff import comparison_blocks

    with errors():
        bundles = resolve_runs(list(runs), checked_root(out_dir, writing=False))
        if as_json:
            comparison = trace_comparison(bundles, baseline)
        else:
            with err.status("comparing", spinner="dots"):
                comparison = trace_comparison(bundles, baseline)
    if as_json:
        print_json(comparison.to_json(top))
        return
    for block in comparison_blocks(comparison, top):
        if isinstance(block, TextTable) and "name" in block.columns:  # kernel names run to hundreds of characters
            print_table(block, no_wrap=("name",), max_widths={"name": 60})
        else:
            print_blocks([block])
