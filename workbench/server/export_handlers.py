"""The panel's trace export route, under `<base_url>/workbench/api/`:

    GET    runs/<id>/export     `?format=perfetto|chrome` (default perfetto), `&critical_path=1` (default 0): the
                                run written as a trace file that Perfetto UI and chrome://tracing open
                                (`workbench.export.export_run`, what `workbench export [--critical-path]` writes),
                                sent as an attachment named `<run>.perfetto-trace` or `<run>.json`

The run is opened as every route opens one (`WorkbenchHandler.open_run`: 400 for an id that is no run id, 404 when
there is none, 422 when it leads outside the traces root); a format other than those of `export.FORMATS` is a 400,
a run without a trace a 422 with the export's message. The export runs in a worker thread into a temporary folder of
its own, whose file is then streamed in chunks and removed, whatever happens (the client going away included). A
run of a URL traces root has its files copied down first (`Bundle.local_files`).

The panel's "Open in Perfetto UI" fetches this route and hands the bytes to ui.perfetto.dev by Perfetto's postMessage
protocol, as the static report's button does (`views.perfetto_link`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import tornado.web

from workbench.export.run import FORMATS, SUFFIXES
from workbench.server.handlers import ApiError, WorkbenchHandler
from workbench.server.state import ServerState
from workbench.trace.store.bundle import Bundle

CHUNK_BYTES = 1 << 20
"""Bytes written to the client at a time (the file is never read whole)."""
CONTENT_TYPES = {"perfetto": "application/octet-stream", "chrome": "application/json"}
"""The media type of each format's file."""


class RunExportHandler(WorkbenchHandler):
    @tornado.web.authenticated
    async def get(self, run_id: str) -> None:
        """The run's trace file as an attachment (module docstring)."""
        fmt = self.get_query_argument("format", "perfetto")
        if fmt not in FORMATS:
            raise ApiError(400, f"format: expected {' or '.join(FORMATS)}, got {fmt!r:.100}")
        critical_path = self.get_query_argument("critical_path", "0")
        if critical_path not in ("0", "1"):
            raise ApiError(400, f"critical_path: expected 0 or 1, got {critical_path!r:.100}")
        bundle = self.open_run(run_id)
        name = f"{bundle.run_id}{SUFFIXES[fmt]}"
        with tempfile.TemporaryDirectory(prefix="workbench-export-") as folder:
            out = Path(folder) / name
            await self.in_thread(_export, bundle, fmt, out, critical_path == "1")
            self.set_header("Content-Type", CONTENT_TYPES[fmt])  # sent with the first chunk
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')
            self.set_header("Content-Length", str(out.stat().st_size))
            with out.open("rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    self.write(chunk)
                    await self.flush()
        await self.finish(set_content_type=CONTENT_TYPES[fmt])


def _export(bundle: Bundle, fmt: str, out: Path, critical_path: bool) -> dict[str, Any]:
    """`export_run` of the bundle's folder (its files copied down first when it is mirrored from a URL)."""
    from workbench.export import export_run

    return export_run(bundle.local_files(), fmt, out, critical_path=critical_path)


def export_handlers(state: ServerState) -> list[tuple[str, type, dict]]:
    """The routes of this module (relative to the server's base URL) with their handlers."""
    return [(r"workbench/api/runs/(?P<run_id>[^/]+)/export", RunExportHandler, {"state": state})]
