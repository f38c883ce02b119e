"""Viewer benchmark: the timeline's server-side windows against the static report, on synthetic bundles.

For each size (default 1M and 10M events) a synthetic bundle is written straight from numpy (a GPU-like
trace: per step a `ProfilerStep#N` annotation over ops on the main thread, each op holding a launch and
launching a kernel on stream 7, a memcpy on stream 20 every tenth op; tracks in the order readers write
them). Then, through the real HTTP routes of a running `jupyter server` with the workbench extension
(docs/api-spans.md; client-side wall time, JSON included):

- first view: the first `spans` request of the whole trace on a server that has not opened the run
  (opening the run, which maps the bundle's events.index, then the window): target <= 3 s for 10M events;
  the server's CPU seconds for it are reported too (wall time depends on the machine's other load).
  `--no-index` removes events.index first, as in a bundle of an earlier version: the first view then
  builds the index from events.parquet and keeps it in the bundle;
- windows: 200 `spans` requests of random windows (width 10^-6 .. 1 of the trace, log-uniform, random
  place, 800..2400 px), p50/p95/max: target p95 <= 150 ms;
- memory: the server's RSS after the first view minus before it: target <= 1 GiB per open 10M run;
- a `search` and an `aggregate` of the whole trace, for scale;

and, in a fresh subprocess, the static report of the same bundle (`report_layout` + `write_report`, what
`workbench report RUN` does): seconds, HTML size, peak RSS. The 10M report loads the whole trace and takes
minutes: it runs only with --report-10m. MB are 10^6 bytes, GiB 2^30.

    python benchmarks/viewer.py                    # 1M and 10M (report of 1M only)
    python benchmarks/viewer.py --events 1000000   # quick
    python benchmarks/viewer.py --report-10m --json
    python benchmarks/viewer.py --out /tmp/viewer  # keeps the bundles there; a later run reuses them
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_EVENTS = (1_000_000, 10_000_000)
TEN_M = 10_000_000
WINDOWS = 200
FIRST_VIEW_S, WINDOW_P95_S, RUN_RSS_BYTES = 3.0, 0.150, 1 << 30
MB, GIB = 1_000_000, 1 << 30
RUN_ID = "viewer-{events}"


# --- synthetic bundles ---------------------------------------------------------------------------------


def write_synthetic_bundle(root: Path, run_id: str, events: int, seed: int = 0) -> int:
    """Write a GPU-like bundle of about `events` events under `root`; returns the exact count."""
    import numpy as np
    import pyarrow as pa

    from workbench.trace import Trace
    from workbench.trace.schema import EVENTS
    from workbench.trace.store.bundle import write_bundle

    rng = np.random.default_rng(seed)
    ops = max(events * 10 // 31, 10)  # per op: op, launch, kernel, and a memcpy every tenth op
    per_step = 2_000
    steps = -(-ops // per_step)
    op_dur = rng.integers(3_000, 40_000, ops)
    gaps = rng.integers(500, 5_000, ops) + np.where(np.arange(ops) % per_step == 0, 50_000, 0)
    op_start = np.cumsum(op_dur + gaps) - op_dur
    step_of = np.arange(ops) // per_step
    step_first, step_last = np.searchsorted(step_of, np.arange(steps)), np.searchsorted(step_of, np.arange(steps),
                                                                                         side="right") - 1
    step_start = op_start[step_first] - 1_000
    step_dur = op_start[step_last] + op_dur[step_last] + 1_000 - step_start
    copies = np.arange(0, ops, 10)
    n_step, n_op, n_copy = steps, ops, len(copies)
    # rows: main thread (steps, ops, launches), stream 7 (kernels), stream 20 (memcpys)
    step_rows = np.arange(n_step)
    op_rows = n_step + np.arange(n_op)
    launch_rows = n_step + n_op + np.arange(n_op)
    total = n_step + 3 * n_op + n_copy
    start = np.concatenate([step_start, op_start, op_start + 300, op_start + 2_000, op_start[copies] + 500])
    kernel_dur = (op_dur * rng.uniform(0.2, 0.9, ops)).astype(np.int64)
    dur = np.concatenate([step_dur, op_dur, np.full(n_op, 1_200), kernel_dur, np.full(n_copy, 4_000)])
    op_names = [f"aten::op_{i}" for i in range(60)]
    kernel_names = [f"void kernel_{i}<float, 128>(float const*, float*, int)" for i in range(300)]
    names = [f"ProfilerStep#{i}" for i in range(n_step)] + op_names + ["cudaLaunchKernel"] + kernel_names + [
        "Memcpy HtoD (Pageable -> Device)"]
    op_code = n_step + rng.integers(0, 60, ops)
    name = np.concatenate([step_rows, op_code, np.full(n_op, n_step + 60), n_step + 61 + (op_code - n_step) * 5 % 300,
                           np.full(n_copy, len(names) - 1)]).astype(np.int32)
    kinds = ["annotation", "op", "runtime", "kernel", "memcpy"]
    kind = np.repeat(np.arange(5, dtype=np.int32), [n_step, n_op, n_op, n_op, n_copy])
    tracks = ["cpu/thread 1", "cuda:0/stream 7", "cuda:0/stream 20"]
    track = np.repeat(np.array([0, 0, 0, 1, 2], dtype=np.int32), [n_step, n_op, n_op, n_op, n_copy])
    device = np.where(track == 0, 0, 1).astype(np.int32)
    parent = np.concatenate([np.full(n_step, -1), step_of, op_rows, np.full(n_op + n_copy, -1)])
    depth = np.concatenate([np.zeros(n_step), np.ones(n_op), np.full(n_op, 2), np.zeros(n_op + n_copy)])
    launcher = np.concatenate([np.full(n_step + 2 * n_op, -1), op_rows, op_rows[copies]])
    corr = np.concatenate([np.full(n_step + n_op, -1), launch_rows, launch_rows, launch_rows[copies]])
    shapes = pa.array(np.where(kind == 1, "[[32, 1024], [1024, 1024]]", None).tolist(), pa.string())
    nan = np.full(total, np.nan)

    def dictionary(codes, values):
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values, pa.string()))

    table = pa.table({
        "start_ns": start, "dur_ns": dur, "name": dictionary(name, names), "kind": dictionary(kind, kinds),
        "device": dictionary(device, ["cpu", "cuda:0"]), "track": dictionary(track, tracks),
        "pid": np.ones(total, np.int64), "tid": np.ones(total, np.int64), "corr": corr.astype(np.int64),
        "parent": parent.astype(np.int64), "depth": depth.astype(np.int16), "launcher": launcher.astype(np.int64),
        "flops": np.where(kind == 3, 2.0e9, np.nan), "bytes": nan, "shapes": shapes,
        "dtypes": pa.nulls(total, pa.string()), "args": pa.nulls(total, pa.string()),
    }, schema=EVENTS)
    write_bundle(root, run_id, {"device": "cuda:0", "model": {"name": "synthetic"}}, Trace(events=table))
    return total


def prepare_bundle(folder: Path, events: int, seed: int, no_index: bool) -> dict:
    """The synthetic bundle `folder` of about `events` events, written with `seed` unless one is there already
    (a bundle is complete once it exists; it is then reused as it is); without its index file when
    `no_index`, else with one. Its event count and file sizes (and the write time when written)."""
    import pyarrow.parquet as pq

    from workbench.analysis.spans.index import INDEX_FILE, write_index

    result = {}
    if not (folder / "run.json").is_file():
        start = time.perf_counter()
        write_synthetic_bundle(folder.parent, folder.name, events, seed)
        result["write_s"] = time.perf_counter() - start
        print(f"wrote {folder.name} in {result['write_s']:.1f} s", file=sys.stderr)
    elif not (folder / INDEX_FILE).is_file() and not no_index:
        write_index(folder / "events.parquet")
    if no_index:
        (folder / INDEX_FILE).unlink(missing_ok=True)
    rows = pq.ParquetFile(folder / "events.parquet").metadata.num_rows
    return {"events": rows, "parquet_bytes": (folder / "events.parquet").stat().st_size,
            **({} if no_index else {"index_bytes": (folder / INDEX_FILE).stat().st_size}), **result}


# --- the server and its routes ---------------------------------------------------------------------------


class Server:
    """A `jupyter server` with the workbench extension in a child process, serving `root_dir/traces`."""

    def __init__(self, root_dir: Path) -> None:
        self.token = secrets.token_hex(16)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = root_dir / "jupyter-config"
        config.mkdir(exist_ok=True)
        (config / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {
            "jpserver_extensions": {"workbench.server": True}, "token": self.token, "open_browser": False,
            "port": self.port, "ip": "127.0.0.1", "root_dir": str(root_dir), "allow_root": True}}))
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "WORKBENCH_TRACES": str(root_dir / "traces")}
        self.log = open(root_dir / "server.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen([sys.executable, "-m", "jupyter_server"], env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                self.get("/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                if self.process.poll() is not None:
                    raise RuntimeError(f"jupyter server exited; see {root_dir / 'server.log'}") from None
                time.sleep(0.1)
        raise RuntimeError("jupyter server did not start within 60 s")

    def get(self, path: str) -> tuple[float, bytes]:
        """GET `path` with the token: (seconds, body)."""
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"token {self.token}"})
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            body = response.read()
        return time.perf_counter() - start, body

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def cpu_s(self) -> float:
        """CPU seconds the server has used (user + system, all threads)."""
        import psutil

        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def measure_routes(server: Server, run_id: str, seed: int) -> dict:
    """First view, random windows, memory, search and aggregate of one run through the HTTP routes."""
    import numpy as np

    api = f"/workbench/api/runs/{run_id}"
    before, cpu_before = server.rss(), server.cpu_s()
    probe_s, body = server.get(f"{api}/spans?start_ns=0&end_ns=1&width_px=1600")  # opens the run
    first, last = json.loads(body)["extent_ns"]
    view_s, body = server.get(f"{api}/spans?start_ns={first}&end_ns={last}&width_px=1600")
    after, view_cpu_s = server.rss(), server.cpu_s() - cpu_before
    rng = np.random.default_rng(seed)
    times, spans, dense = [], 0, 0
    for _ in range(WINDOWS):
        width = max(int((last - first) * 10 ** rng.uniform(-6, 0)), 1)
        start = first + int(rng.uniform(0, 1) * max(last - first - width, 0))
        seconds, reply = server.get(f"{api}/spans?start_ns={start}&end_ns={start + width}"
                                    f"&width_px={int(rng.integers(800, 2401))}")
        times.append(seconds)
        parsed = json.loads(reply)
        spans += parsed["spans"]
        dense += any(lane["mode"] == "density" for lane in parsed["lanes"])
    search_s, _ = server.get(f"{api}/search?q=kernel_1&limit=100")
    aggregate_s, _ = server.get(f"{api}/aggregate?start_ns={first}&end_ns={last}&limit=50")
    return {"first_view_s": probe_s + view_s, "first_view_cpu_s": view_cpu_s, "open_s": probe_s,
            "full_window_s": view_s,
            "full_window_bytes": len(body), "rss_delta": after - before,
            "window_p50_s": float(np.percentile(times, 50)), "window_p95_s": float(np.percentile(times, 95)),
            "window_max_s": max(times),
            "mean_spans": spans / WINDOWS, "density_windows": dense, "search_s": search_s, "aggregate_s": aggregate_s}


# --- the static report, in a fresh process ---------------------------------------------------------------


def child_report(root: str, run_id: str, html: str) -> dict:
    from workbench.report import report_layout, write_report
    from workbench.trace.store.bundle import open_bundle

    start = time.perf_counter()
    path = write_report(report_layout([open_bundle(run_id, root)]), html, run_id)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"report_s": time.perf_counter() - start, "html_bytes": path.stat().st_size, "report_peak_rss": peak}


def measure_report(root: Path, run_id: str, out: Path, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-report", str(root), run_id,
           str(out / f"{run_id}.html")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"report_error": f"timed out after {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"report_error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}


# --- main ------------------------------------------------------------------------------------------------


def print_table(results: list[dict]) -> None:
    rows = [("events", "events", "{:,}"), ("bundle write s", "write_s", "{:.1f}"),
            ("first view s (open + whole-trace window)", "first_view_s", "{:.2f}"),
            ("  of which open + index s", "open_s", "{:.2f}"),
            ("  server CPU s of the first view", "first_view_cpu_s", "{:.2f}"),
            ("whole-trace reply KB", "full_window_bytes", "kb"), ("events.parquet MB", "parquet_bytes", "mb"),
            ("events.index MB", "index_bytes", "mb"),
            ("server RSS per open run MiB", "rss_delta", "mib"), ("window p50 ms", "window_p50_s", "ms"),
            ("window p95 ms", "window_p95_s", "ms"), ("window max ms", "window_max_s", "ms"),
            ("windows with density lanes", "density_windows", "{:,}"),
            ("mean spans per window", "mean_spans", "{:,.0f}"),
            ("search (whole trace) ms", "search_s", "ms"), ("aggregate (whole trace) ms", "aggregate_s", "ms"),
            ("static report s", "report_s", "{:.1f}"), ("static report HTML MB", "html_bytes", "mb"),
            ("static report peak RSS MiB", "report_peak_rss", "mib")]
    shown = {"ms": lambda v: f"{v * 1e3:,.1f}", "kb": lambda v: f"{v / 1e3:,.0f}", "mb": lambda v: f"{v / MB:,.2f}",
             "mib": lambda v: f"{v / (1 << 20):,.0f}"}
    print(f"{'':44}" + "".join(f"{r['events']:>16,}" for r in results))
    for label, key, fmt in rows[1:]:
        cells = [(shown[fmt](r[key]) if fmt in shown else fmt.format(r[key])) if key in r else "-" for r in results]
        print(f"{label:44}" + "".join(f"{c:>16}" for c in cells))
    for r in results:
        if "report_s" in r and "first_view_s" in r:
            print(f"{r['events']:,}: static report / first view = {r['report_s'] / r['first_view_s']:,.1f}x; "
                  f"static report / window p95 = {r['report_s'] / r['window_p95_s']:,.0f}x")
        if "report_error" in r:
            print(f"{r['events']:,}: static report not measured: {r['report_error']}")
    ten = next((r for r in results if r["events"] >= TEN_M), None)
    if ten:
        for name, value, limit, unit in (("first view", ten["first_view_s"], FIRST_VIEW_S, "s"),
                                         ("window p95", ten["window_p95_s"], WINDOW_P95_S, "s"),
                                         ("RSS per open run", ten["rss_delta"] / GIB, RUN_RSS_BYTES / GIB, "GiB")):
            print(f"  {'PASS' if value <= limit else 'FAIL'}  10M {name}: {value:.3f} {unit} (target <= {limit:g})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default=",".join(map(str, DEFAULT_EVENTS)), help="comma-separated sizes")
    parser.add_argument("--report-10m", action="store_true", help="also build the static report of sizes >= 10M")
    parser.add_argument("--no-report", action="store_true", help="skip the static reports")
    parser.add_argument("--out", type=Path, help="working folder, kept: bundles already there are reused "
                        "(default: a temporary one, removed)")
    parser.add_argument("--no-index", action="store_true", help="remove each bundle's events.index before "
                        "serving (a bundle of an earlier version: the first view builds it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a static report may take")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child-report", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_report:
        print(json.dumps(child_report(*args.child_report)))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sizes = sorted(int(part) for part in args.events.split(",") if part.strip())
    out = args.out or Path(tempfile.mkdtemp(prefix="workbench-viewer-"))
    root = out / "traces"
    results = []
    server = None
    try:
        for events in sizes:
            results.append(prepare_bundle(root / RUN_ID.format(events=events), events, args.seed, args.no_index))
        server = Server(out)
        for size, result in zip(sizes, results, strict=True):
            result |= measure_routes(server, RUN_ID.format(events=size), args.seed)
            print(f"{size:,}: routes measured", file=sys.stderr)
        server.stop()
        server = None
        for size, result in zip(sizes, results, strict=True):
            if not args.no_report and (size < TEN_M or args.report_10m):
                result |= measure_report(root, RUN_ID.format(events=size), out, args.timeout)
                print(f"{size:,}: static report measured", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
