"""The workbench's Jupyter server extension (REST API under `<base_url>/workbench/api/`, capture jobs,
BokehJS); enabled on install by `jupyter-config/jupyter_server_config.d/workbench.json`. See `app`."""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """The extension's entry point for Jupyter server: `WorkbenchServerApp`, whose (inherited)
    `_load_jupyter_server_extension` adds the handlers."""
    from workbench.server.app import WorkbenchServerApp

    return [{"module": "workbench.server", "app": WorkbenchServerApp}]
