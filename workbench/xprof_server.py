"""XProf's own web UI on a run: the real XProf server, bound to the loopback address only.

The `xprof` console script (xprof 2.24) has no flag for the address it listens on: it binds its web
server to every interface (`xprof.server._get_wildcard_address`) and starts a gRPC worker service on
`0.0.0.0:50051`. So the server runs as a child `python -m workbench.xprof_server`, which builds
XProf's own WSGI app and plugin exactly as `xprof.server` does (`ProfilePluginLoader`,
`make_wsgi_app`) and serves it with XProf's own server (cheroot) on `127.0.0.1`, without the gRPC
worker service (the web UI's tools convert in-process without it). The child binds the port (a free
one when asked for 0) and writes it to a ready file; the parent then waits until it answers HTTP.

XProf writes caches into the run folders it serves (`.cached_tools.json`, `<module>.hlo_proto.pb`,
SSTables), so a bundle is served through a temporary logdir that links to the bundle's XSpace files:
its `raw/` stays untouched, and any layout under `raw/` works (`plugins/profile/<run>/<host>.xplane.pb`
as `jax.profiler.trace` writes it, or a bare `.xplane.pb`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, TracebackType

from workbench.errors import BundleError, MissingDependency, WorkbenchError
from workbench.trace.store.bundle import RAW_DIR, Bundle
from workbench.trace.xspace.reader import SUFFIX

LOOPBACK = "127.0.0.1"
RUNS_ROUTE = "/data/plugin/profile/runs"
"""The route XProf's frontend calls to list the runs of its logdir (a JSON list of names)."""
_PROFILE_DIR = ("plugins", "profile")
_LOG_TAIL = 2000


@dataclasses.dataclass(eq=False)
class XProfServer:
    """A running XProf server (a child process): its `url`, log file, and `stop()` (idempotent, also
    on leaving a `with` block), which removes the temporary files the server was started with."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    _cleanups: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False)

    def wait(self) -> int:
        """Block until the server exits (Ctrl-C raises KeyboardInterrupt here); its exit code."""
        return self.process.wait()

    def log_tail(self, chars: int = _LOG_TAIL) -> str:
        """The end of the server's log (stdout and stderr), for error messages."""
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text[-chars:].strip()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server: SIGINT (XProf's server shuts down on it), SIGKILL after `timeout_s`; then
        remove the temporary files. Safe to call twice."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        while self._cleanups:
            self._cleanups.pop()()

    def __enter__(self) -> XProfServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def xprof_command(logdir: Path, port: int, host: str = LOOPBACK, *, ready_file: Path | None = None) -> list[str]:
    """The command line that serves `logdir` with XProf on `host:port` (port 0: a free one, written
    to `ready_file` once bound); see the module docstring for why it is not the `xprof` script."""
    command = [sys.executable, "-m", "workbench.xprof_server", "--logdir", str(logdir), "--port", str(port),
               "--host", host]
    if ready_file is not None:
        command += ["--ready-file", str(ready_file)]
    return command


def start_xprof(logdir: str | os.PathLike[str], port: int = 0, *, host: str = LOOPBACK,
                timeout_s: float = 120.0) -> XProfServer:
    """Start XProf on `logdir` (a TensorBoard-style folder: runs in `plugins/profile/<run>/`) and wait
    until it answers HTTP; port 0 picks a free one. A server that exits or does not answer within
    `timeout_s` raises WorkbenchError with the end of its log (and is stopped)."""
    if importlib.util.find_spec("xprof") is None:
        raise MissingDependency("xprof", "jax")
    logdir = Path(logdir).absolute()
    if not logdir.is_dir():
        raise WorkbenchError(f"XProf logdir {logdir} is not a folder")
    work = tempfile.TemporaryDirectory(prefix="workbench-xprof-server-")
    ready, log = Path(work.name) / "port", Path(work.name) / "xprof.log"
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[1])  # so the child imports this workbench
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        with log.open("wb") as sink:
            process = subprocess.Popen(xprof_command(logdir, port, host, ready_file=ready), stdin=subprocess.DEVNULL,
                                       stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    except BaseException:
        work.cleanup()
        raise
    server = XProfServer(process, "", log, [work.cleanup])
    try:
        server.url = _wait_until_serving(server, ready, host, logdir, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def serve_bundle(bundle: Bundle, port: int = 0, *, host: str = LOOPBACK, timeout_s: float = 120.0) -> XProfServer:
    """Start XProf on the XSpace captures in a bundle's raw/, through a temporary logdir of links
    (XProf writes caches beside what it serves). A bundle without an XSpace raises BundleError."""
    raw = bundle.local_files() / RAW_DIR
    runs = xspace_runs(raw, root_name=bundle.run_id)
    if not runs:
        raise BundleError(f"run {bundle.run_id!r} has no XSpace ({SUFFIX}) in {raw}: it was not captured with "
                          "JAX (jax.profiler / XProf), so XProf has nothing to show")
    mirror = tempfile.TemporaryDirectory(prefix="workbench-xprof-logdir-")
    try:
        link_runs(runs, Path(mirror.name))
        server = start_xprof(mirror.name, port, host=host, timeout_s=timeout_s)
    except BaseException:
        mirror.cleanup()
        raise
    server._cleanups.append(mirror.cleanup)
    return server


def xspace_runs(raw: Path, root_name: str) -> list[tuple[str, Path]]:
    """The folders under `raw` (itself included) that hold `.xplane.pb` files, sorted, each with a
    distinct run name: its folder's name (`<run>` of `plugins/profile/<run>/`), `root_name` for `raw`
    itself."""
    if not raw.is_dir():
        return []
    runs: list[tuple[str, Path]] = []
    taken: set[str] = set()
    for folder in sorted({p.parent for p in raw.rglob(f"*{SUFFIX}") if p.is_file()}):
        base = root_name if folder == raw else folder.name
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        runs.append((name, folder))
    return runs


def link_runs(runs: Sequence[tuple[str, Path]], logdir: Path) -> None:
    """Lay out `runs` (name, folder) as XProf runs `logdir/plugins/profile/<name>/` whose files link
    to the folder's files (copies where links cannot be made); hidden files are left out."""
    profile = logdir.joinpath(*_PROFILE_DIR)
    for name, folder in runs:
        target = profile / name
        target.mkdir(parents=True)
        for file in sorted(folder.iterdir()):
            if file.is_file() and not file.name.startswith("."):
                try:
                    os.symlink(file.resolve(), target / file.name)
                except OSError:
                    shutil.copy2(file, target / file.name)


def _wait_until_serving(server: XProfServer, ready: Path, host: str, logdir: Path, timeout_s: float) -> str:
    """The server's URL once its port answers HTTP; raises WorkbenchError if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        code = server.process.poll()
        if code is not None:
            raise WorkbenchError(f"the XProf server on {logdir} exited with code {code} before serving; "
                                 f"its log ends:\n{server.log_tail()}")
        if url is None and ready.is_file():
            url = f"http://{host}:{int(ready.read_text().strip())}/"
        if url is not None and _answers(url):
            return url
        time.sleep(0.2)
    raise WorkbenchError(f"the XProf server on {logdir} did not answer within {timeout_s:.0f} s; "
                         f"its log ends:\n{server.log_tail()}")


def _answers(url: str) -> bool:
    """Whether `url` answers an HTTP GET (any status: the server is up)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


# The child process ---------------------------------------------------------------------------------------------


def _serve(logdir: str, port: int, host: str, ready_file: str | None) -> None:
    """Serve XProf's UI for `logdir` on `host:port` until SIGINT or SIGTERM (the child's body)."""
    from cheroot import wsgi
    from xprof import server as xprof_server

    context = xprof_server.TBContext(logdir, xprof_server.DataProvider(logdir), xprof_server.TBContext.Flags(False))
    context.hide_capture_profile_button = True  # capturing from the UI needs TensorFlow and a live job
    context.enable_tab_name_label = False
    context.src_prefix = None
    plugin = xprof_server.ProfilePluginLoader().load(context)
    httpd = wsgi.Server((host, port), xprof_server.make_wsgi_app(plugin))
    httpd.prepare()  # binds the socket: port 0 is now a real port
    bound = httpd.bind_addr[1]
    if ready_file:
        tmp = Path(f"{ready_file}.tmp")
        tmp.write_text(str(bound))
        os.replace(tmp, ready_file)
    print(f"XProf serving {logdir} at http://{host}:{bound}/", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    threading.Thread(target=_stop_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        httpd.serve()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.stop()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _stop_with_parent(parent: int) -> None:
    """Interrupt this server once its parent is gone (killed without stopping it): the child runs in
    its own session, so no terminal signal would reach it."""
    while os.getppid() == parent:
        time.sleep(2)
    os.kill(os.getpid(), signal.SIGINT)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `python -m workbench.xprof_server` (see `xprof_command`)."""
    parser = argparse.ArgumentParser(prog="python -m workbench.xprof_server", description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    _serve(args.logdir, args.port, args.host, args.ready_file)


if __name__ == "__main__":
    main()
