"""`workbench xprof`: XProf's own UI on a JAX run, served on 127.0.0.1 until Ctrl-C."""

from __future__ import annotations

import os
import sys

import click

from workbench.cli.options import out_option
from workbench.cli.render import err, errors
from workbench.errors import WorkbenchError
from workbench.paths import checked_root


@click.command(name="xprof")
@click.argument("run")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: a free one).")
@click.option("--no-browser", is_flag=True,
              help="Print the URL without opening a browser (none opens where there is no display).")
@out_option
def xprof(run: str, port: int, no_browser: bool, out_dir: str | None) -> None:
    """Serve XProf's own UI on a JAX run (id or bundle path), on 127.0.0.1, until Ctrl-C."""
    import webbrowser

    from workbench.trace.store.bundle import open_bundle
    from workbench.xprof_server import serve_bundle

    with errors():
        bundle = open_bundle(run, checked_root(out_dir, writing=False))
        with err.status("starting XProf", spinner="dots"):
            server = serve_bundle(bundle, port=port)
        with server:
            click.echo(server.url)
            err.print("XProf is serving; press Ctrl-C to stop it")
            if not no_browser and _has_gui():
                webbrowser.open(server.url)
            code = server.wait()
            tail = server.log_tail()
        raise WorkbenchError(f"the XProf server stopped by itself (exit code {code}); its log ends:\n{tail}")


def _has_gui() -> bool:
    """Whether a browser window can open: without a display, Python's `webbrowser` would start a
    console browser (lynx, w3m) in this terminal instead."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
