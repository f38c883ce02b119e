"""`workbench provenance`: a run's kernels traced to the model's source ops (`workbench.analysis.provenance`),
its time per source op, and with a second run both runs' kernels grouped by the source ops they compute."""

from __future__ import annotations

import json

import click

from workbench.cli.options import json_option, out_option
from workbench.cli.render import errors, print_json, print_table
from workbench.paths import checked_root


@click.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--top", default=30, show_default=True, type=click.IntRange(min=1), help="Rows listed per table.")
@out_option
@json_option
def provenance(runs: tuple[str, ...], top: int, out_dir: str | None, as_json: bool) -> None:
    """Trace each kernel of RUN to the source ops it computes (inductor's provenance, XLA's op metadata, TensorRT's
    layers, eager ops), with the time per source op. With two RUNS (e.g. eager and compile) group both runs'
    kernels by the source ops they share: "7 eager ops took 410 µs; in compile they are one fused kernel of
    120 µs". RUNS are run ids or bundle paths."""
    from workbench.analysis.provenance import by_source_op, compare_by_source_op
    from workbench.analysis.provenance import provenance as kernel_table
    from workbench.errors import WorkbenchError
    from workbench.trace.store.resolve import resolve_runs
    from workbench.views.provenance import comparison_table, provenance_table, source_op_table

    with errors():
        if len(runs) > 2:
            raise WorkbenchError(f"workbench provenance takes one or two runs, got {len(runs)}")
        bundles = resolve_runs(list(runs), checked_root(out_dir, writing=False))
        if len(bundles) > 2:
            raise WorkbenchError(f"{' '.join(runs)} name {len(bundles)} runs; pass one or two run ids")
        if len(bundles) == 2:
            compare = compare_by_source_op(*bundles)
        else:
            kernels, sources = kernel_table(bundles[0]), by_source_op(bundles[0])
    if len(bundles) == 2:
        if as_json:
            print_json({"a": compare.attrs["a"], "b": compare.attrs["b"],
                        "groups": json.loads(compare.to_json(orient="records"))})
        else:
            print_table(comparison_table(compare, top), no_wrap=("what",), max_widths={"source ops": 60})
        return
    if as_json:
        print_json({"kernels": json.loads(kernels.to_json(orient="records")),
                    "by_source_op": json.loads(sources.to_json(orient="records"))})
        return
    print_table(provenance_table(bundles[0], kernels, top), max_widths={"kernel": 60, "source ops": 60})
    print_table(source_op_table(bundles[0], sources, top), max_widths={"code": 60})
