"""The hidden `_profile-variant` command: the child process that nsys or ncu launches to run one variant's
profiled lifecycle (`workbench.profiling.child_run`)."""

from __future__ import annotations

from pathlib import Path

import click

from workbench.cli.render import errors


@click.command(name="_profile-variant", hidden=True)
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
def profile_variant_child(spec: Path) -> None:
    """Internal: one variant's profiled lifecycle in a process that nsys or ncu launched (see
    workbench.profiling.child_run); SPEC is the JSON file describing it."""
    from workbench.profiling.child_run import run_child

    with errors():
        run_child(spec)
