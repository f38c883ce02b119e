"""`workbench mcp`: serve the traces root to agents over the Model Context Protocol (`workbench.agents`)."""

from __future__ import annotations

import click

from workbench.cli.render import errors
from workbench.paths import checked_root


@click.command()
@click.option("--root", "--out", "out_dir", default=None, metavar="DIR|URL",
              help="Traces root (default: $WORKBENCH_TRACES or ./traces).")
@click.option("--allow-capture", is_flag=True,
              help="Also offer tools that capture built-in models and import trace files into the root (off: the "
                   "server only reads).")
@click.option("--http", "http_port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="Serve streamable HTTP on 127.0.0.1:PORT instead of stdio.")
def mcp(out_dir: str | None, allow_capture: bool, http_port: int | None) -> None:
    """Serve the traces root to agents over the Model Context Protocol (stdio by default): tools that list runs,
    summarize them, rank findings, list a window's spans, run sandboxed SQL and compare runs, each answering
    bounded JSON (docs/agents.md). Needs `pip install 'workbench[agents]'`."""
    with errors():
        root = checked_root(out_dir, writing=allow_capture)
    try:
        from workbench.agents.mcp_server import serve
    except ImportError as exc:
        raise click.UsageError(f"workbench mcp needs the MCP SDK: pip install 'workbench[agents]' ({exc})") from exc
    serve(root, allow_capture=allow_capture, http_port=http_port)
