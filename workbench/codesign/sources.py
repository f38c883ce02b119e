"""What `workbench project` and `wb.project` project: a captured run (its measured steps' ops) or a model (one
forward of its example inputs), as an operator graph and the number of steps it covers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import pandas as pd

    from workbench.trace.store.bundle import Bundle


@dataclass(frozen=True)
class GraphSource:
    """An operator graph, what it came from ("run <id>" or "model <name> batch x seq") and the steps it covers."""

    graph: pd.DataFrame
    label: str
    steps: int


def run_graph(bundle: Bundle) -> GraphSource:
    """The graph of a run's measured steps (the whole trace without a measure phase), from recorded shapes."""
    from workbench.analysis.breakdown import phase_window
    from workbench.analysis.steps import steps_in
    from workbench.codesign.graph import graph_from_trace
    from workbench.trace.schema import PHASE_MEASURE

    trace = bundle.trace()
    graph = graph_from_trace(trace.df(), phase_window(trace, PHASE_MEASURE))
    if graph.empty:
        raise WorkbenchError(f"run {bundle.run_id!r}: no operator with recorded shapes to project (capture with "
                             "shapes recorded: torch.profiler record_shapes, which `workbench capture` sets)")
    return GraphSource(graph, f"run {bundle.run_id}", steps_in(trace))


def model_graph(model: str, *, batch: int = 1, seq: int | None = None, timed: bool = False,
                overrides: dict[str, Any] | None = None) -> GraphSource:
    """The graph of one forward of `model` (any reference `load_model` takes) on its seeded example inputs."""
    from workbench.codesign.graph import graph_from_model
    from workbench.models.registry import load_model

    loaded = load_model(model, **(overrides or {}))
    inputs = loaded.make_inputs(batch=batch, seq=seq) if loaded.default_seq is not None \
        else loaded.make_inputs(batch=batch)
    shape = f"batch {batch}" + (f", seq {seq or loaded.default_seq}" if loaded.default_seq is not None else "")
    return GraphSource(graph_from_model(loaded.module, tuple(inputs), timed=timed), f"model {loaded.name} ({shape})",
                       1)


def graph_source(ref: str, root: str | Path, *, batch: int = 1, seq: int | None = None) -> GraphSource:
    """A run when `ref` names one under `root` (or a bundle folder), else a model reference."""
    from workbench.trace.store.bundle import open_bundle

    try:
        bundle = open_bundle(ref, root)
    except WorkbenchError:
        return model_graph(ref, batch=batch, seq=seq)
    return run_graph(bundle)
