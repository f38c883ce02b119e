"""Run references as users give them (run ids, bundle paths, experiment ids) turned into run bundles, for
every surface that takes a list of runs (report, cost, the notebook, the panel)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workbench.errors import BundleError, WorkbenchError
from workbench.trace.store.bundle import Bundle, open_bundle
from workbench.trace.store.experiment import read_experiment


def resolve_runs(refs: Sequence[str | Path], root: Path) -> list[Bundle]:
    """The bundles named by run ids, bundle paths or experiment ids (which expand to their runs)."""
    bundles: list[Bundle] = []
    for ref in refs:
        try:
            bundles.append(open_bundle(ref, root))
            continue
        except BundleError as run_error:
            try:
                experiment = read_experiment(root, str(ref))
            except BundleError:
                raise run_error from None
        bundles.extend(open_bundle(run_id, root) for run_id in experiment.run_ids)
    if not bundles:
        raise WorkbenchError("nothing to report: name at least one run or experiment")
    return bundles
