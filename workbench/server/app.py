"""The Jupyter server extension: the workbench REST API, capture jobs and BokehJS for the JupyterLab panel.

Configuration (jupyter_server_config.py, or `--WorkbenchServerApp.max_jobs=2` on the command line):

    c.WorkbenchServerApp.traces_root = "traces"   # relative to the server's root_dir, or a URL (s3://bucket/traces)
    c.WorkbenchServerApp.max_jobs = 1             # capture jobs running at once; the others queue
    c.WorkbenchServerApp.max_queued_jobs = 8      # jobs that may wait; more are refused (429)
    c.WorkbenchServerApp.cancel_grace_s = 10.0    # after SIGINT, seconds before a cancelled job is killed
    c.WorkbenchServerApp.max_upload_mb = 2048     # largest trace file the panel may upload for import
    c.WorkbenchServerApp.allowed_factory_modules = ["mymodels"]   # their `mymodels...:factory` models may run
    c.WorkbenchServerApp.allowed_model_dirs = ["models"]          # exported programs (.pt2) in these may load

Capture jobs run only the built-in models unless the last two allow more: a factory model runs any
callable of its module with the request's overrides as keyword arguments, and an exported program is
unpickled, so either is code the admin must trust (see `model_policy`).

A URL traces root (`s3://`, `gs://`..., as the CLI takes them) is read through its local mirror
(`workbench.trace.store.mirror`), refreshed by the panel's listings; the panel cannot write there (see `state`).

BokehJS is served from the installed bokeh package under `<base_url>/workbench/static/bokeh/`
(e.g. `js/bokeh.min.js`), behind the server's authentication, so the JavaScript always matches the
Python that builds the json_items.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jupyter_server.base.handlers import AuthenticatedFileHandler
from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Int, List, Unicode, validate

from workbench.paths import TRACES_ENV
from workbench.server.export_handlers import export_handlers
from workbench.server.handlers import api_handlers
from workbench.server.jobs import JobManager
from workbench.server.manage_handlers import MAX_UPLOAD_BYTES, manage_handlers
from workbench.server.model_policy import ModelPolicy
from workbench.server.project_handlers import project_handlers
from workbench.server.quant_handlers import quant_handlers
from workbench.server.replay_handlers import replay_handlers
from workbench.server.span_handlers import span_handlers
from workbench.server.state import ServerState
from workbench.storage import is_url, location
from workbench.trace.store.mirror import mirror_folder, mirror_root
from workbench.trace.store.mirror_bundle import remote_root


class WorkbenchServerApp(ExtensionApp):
    """Adds the workbench API and BokehJS to a Jupyter server; stops its capture jobs with the server."""

    name = "workbench"

    traces_root = Unicode(
        "", config=True,
        help=f"Traces root; a relative path is taken from the server's root_dir. Empty: ${TRACES_ENV} if "
             "set, else 'traces' (the CLI's default, seen from root_dir). A URL (s3://bucket/traces) is read "
             "through a local mirror, and read only: the panel captures, imports and deletes in folders.",
    )
    max_jobs = Int(1, config=True, help="Capture jobs that run at once; the others wait in a queue.")
    max_queued_jobs = Int(8, config=True, help="Capture jobs that may wait in the queue; more are refused (429).")
    allowed_factory_modules = List(
        Unicode(), config=True,
        help="Modules whose `module:factory` models capture jobs may run (each also allows its submodules). "
             "A factory is Python code called with the request's overrides: list only trusted model modules. "
             "Empty (the default): built-in models only.",
    )
    allowed_model_dirs = List(
        Unicode(), config=True,
        help="Folders (relative ones from root_dir) whose exported programs (.pt2) capture jobs may load, "
             "links resolved. Loading one unpickles it: list only folders of trusted files. Empty (the default): "
             "none.",
    )
    cancel_grace_s = Float(10.0, config=True,
                           help="Seconds a cancelled job has to stop after SIGINT before it is killed.")
    max_upload_mb = Int(MAX_UPLOAD_BYTES >> 20, config=True,
                        help="Largest trace file (MiB) the panel may upload for import; larger ones are refused (413).")

    @validate("max_jobs")
    def _check_max_jobs(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise ValueError(f"max_jobs must be at least 1, got {proposal['value']}")
        return proposal["value"]

    @validate("max_queued_jobs")
    def _check_max_queued_jobs(self, proposal: dict) -> int:
        if proposal["value"] < 0:
            raise ValueError(f"max_queued_jobs must be at least 0, got {proposal['value']}")
        return proposal["value"]

    def initialize_settings(self) -> None:
        root_dir = Path(self.serverapp.root_dir).expanduser()
        root = resolve_traces_root(self.traces_root, root_dir)
        self.jobs = JobManager(max_running=self.max_jobs, grace_s=self.cancel_grace_s,
                               max_queued=self.max_queued_jobs)
        policy = ModelPolicy(factory_modules=tuple(self.allowed_factory_modules),
                             model_dirs=tuple(self.allowed_model_dirs), cwd=root_dir)
        remote = remote_root(root)
        self.state = ServerState(root=root, jobs=self.jobs, cwd=root_dir, policy=policy, remote=remote,
                                 capture_command=lambda args: capture_command(args, self.state.root))
        shown = root if remote is None else f"{remote.url} (read only, mirrored in {root})"
        self.log.info("workbench: traces root %s; at most %d capture job(s) at a time", shown, self.max_jobs)
        self.log.info("workbench: capture jobs may run built-in models, factories of %s, model files in %s",
                      list(policy.factory_modules) or "no module", list(policy.model_dirs) or "no folder")

    def initialize_handlers(self) -> None:
        from bokeh.util.paths import bokehjs_path

        self.handlers.extend(api_handlers(self.state))
        self.handlers.extend(span_handlers(self.state))
        self.handlers.extend(manage_handlers(self.state, max_upload_bytes=self.max_upload_mb << 20))
        self.handlers.extend(quant_handlers(self.state))
        self.handlers.extend(replay_handlers(self.state))
        self.handlers.extend(project_handlers(self.state))
        self.handlers.extend(export_handlers(self.state))
        self.handlers.append((r"workbench/static/bokeh/(.*)", AuthenticatedFileHandler, {"path": str(bokehjs_path())}))

    async def stop_extension(self) -> None:
        """Cancel the capture jobs still queued or running: their processes must not outlive the server."""
        await self.jobs.shutdown()


def resolve_traces_root(configured: str, root_dir: Path) -> Path:
    """The traces root the server reads and captures into: `configured`, else `$WORKBENCH_TRACES`, else
    `traces`, a relative one taken from `root_dir` (where the CLI takes it from the working directory). A URL
    gives its local mirror, brought up to date now if the URL can be read (else as it is: the panel's
    listings try again and say why they cannot); a `file://` URL gives its folder."""
    chosen = configured or os.environ.get(TRACES_ENV) or "traces"
    if is_url(chosen):
        where = location(chosen)
        if where.is_local:
            return where.local_path
        try:
            return mirror_root(where)
        except Exception:  # unreachable now (a store's client raises its own kinds too): listings say why
            return mirror_folder(where)
    return (root_dir / Path(chosen).expanduser()).absolute()


def capture_command(args: list[str], root: Path) -> list[str]:
    """The command line of a capture job: the CLI run by the server's own interpreter, writing into `root`,
    with its result as JSON on stdout and its progress as JSON lines on stderr."""
    return [sys.executable, "-m", "workbench", "capture", *args, "--json", "--progress-json", "--out", str(root)]
