"""Where per-rank work runs: a local process pool or a Ray cluster, behind one small `Engine` interface, so
the multi-rank import and the multi-rank analyses have one code path whatever runs their tasks."""

from workbench.distributed.calls import Engine, Failure
from workbench.distributed.engine import CLUSTERS, LocalEngine, engine_for

__all__ = ["CLUSTERS", "Engine", "Failure", "LocalEngine", "engine_for"]
