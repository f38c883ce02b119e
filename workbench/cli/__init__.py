"""The `workbench` command line: one module per group of commands (`capture`; `traces`: import, ls, show, rm,
report; `analysis`: analyze, cost; `llm`: generate, llm-model; `serve`: a server under load; `quant`: the
quantization lab; `replay`: ops rebuilt from a trace and timed alone; `provenance`: kernels traced to source ops;
`mcp`: the Model Context Protocol server for agents; `project`: a model projected onto an accelerator description;
`export`: a run as a Perfetto or Chrome trace file;
`xprof`; `child`:
the hidden child of Nsight runs), all printing through `render`.

Exit codes (`workbench.errors`): 0 success; 1 a capture in which some variants failed (the others were
written); 2 bad input or misuse (unknown model or variant, unreadable trace, missing run, a setting above its
limit, an unwritable traces root or output path, a full disk) with a one-line error on stderr; 130
interrupted, at any moment (`workbench.interrupts`). `--json` prints machine-readable output on stdout and
nothing else there. Text is printed as it is, never read as markup (`render`).
"""

from __future__ import annotations

from workbench.interrupts import QuietWhileLoading

with QuietWhileLoading():  # Ctrl-C while the command line loads exits 130 quietly, like one in a command
    import click

    from workbench.cli.analysis import analyze, cost
    from workbench.cli.capture import capture
    from workbench.cli.child import profile_variant_child
    from workbench.cli.diff import diff
    from workbench.cli.export import export
    from workbench.cli.llm import generate, llm_model
    from workbench.cli.mcp import mcp
    from workbench.cli.project import project
    from workbench.cli.provenance import provenance
    from workbench.cli.quant import quant
    from workbench.cli.query import query
    from workbench.cli.ranks import ranks
    from workbench.cli.render import CommandGroup
    from workbench.cli.replay import replay
    from workbench.cli.serve import serve
    from workbench.cli.traces import import_, ls, report, rm, show
    from workbench.cli.xprof import xprof
    from workbench.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_PARTIAL

__all__ = ["EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "EXIT_PARTIAL", "main"]
"""The command group, and the exit codes it ends with (defined in `workbench.errors`)."""

COMMANDS = (capture, profile_variant_child, import_, ls, show, report, rm, xprof, analyze, cost, generate, llm_model,
            query, ranks, serve, diff, quant, replay, provenance, mcp, project, export)
"""Every command, by module: capture, the child, the traces commands, xprof, analysis, llm, query, ranks."""


STORE_LOGGERS = ("fsspec", "s3fs", "gcsfs", "adlfs", "aiobotocore", "botocore")
"""Loggers of the object stores' clients, which log their failed retries with tracebacks: the error reaches the
command as an exception, which it words once."""


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="workbench")
def main() -> None:
    """Profiling workbench for deep-learning inference: capture, import and compare runs."""
    import logging

    for name in STORE_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


for _command in COMMANDS:
    main.add_command(_command)
