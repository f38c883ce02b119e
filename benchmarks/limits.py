"""Limits benchmark: peak memory of the report and the dashboard on traces that name very many tracks.

A small upload can name a thread, a process or a device per event. The views draw at most
`workbench.analysis.timeline.MAX_LANES` lanes (the quietest tracks fold into "N more threads" lanes) and
the detectors look at the `MAX_DEVICES` busiest devices, so what they cost follows the event count, not
the track count. This script shows it side by side in one run: for each size N (default 2k, 20k, 200k
events) it writes four Kineto traces of N events, all alike but for where they ran:

- `one thread`: every event on one thread (the control: the same events, one track);
- `N threads`: each event on its own `tid`;
- `N processes`: each on its own `pid`;
- `N devices`: each a kernel on its own GPU (`args.device`).

Each is imported (`workbench import`), then two fresh subprocesses measure their own peak RSS
(`ru_maxrss`): `workbench report RUN` (the HTML report), and the dashboard the Jupyter panel asks for
(`dashboard(bundle)` as a Bokeh `json_item`, what `GET runs/<id>/dashboard` sends). Printed: seconds,
peak RSS, and its ratio to the control of the same size.

Bound: each trace's peak RSS <= 1.5 x its control's + 150 MB. Why: the control already holds every event
once in each view; more tracks may add the per-track tables (a few hundred bytes per track: the lane
table before folding, the per-device busy time) but no per-track drawing, so the excess is linear in the
event count with a small constant, far below the control at these sizes. Before folding, 20k threads took
`workbench report` past 8 GB (2k: 1.2 GB). Exit 1 when a trace breaks the bound.

    python benchmarks/limits.py                      # 2k, 20k and 200k events
    python benchmarks/limits.py --sizes 2000 20000 --json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYOUTS = ("one thread", "threads", "processes", "devices")
"""Where the N events of a trace ran (see the module docstring)."""
RATIO_BOUND, EXTRA_MB = 1.5, 150.0
"""A trace's peak RSS must stay within RATIO_BOUND x its control's + EXTRA_MB."""

_CHILD = """
import json, resource, sys, time
from bokeh.embed import json_item
from workbench.trace.store.bundle import open_bundle
from workbench.views.dashboard import dashboard
started = time.perf_counter()
json.dumps(json_item(dashboard(open_bundle(sys.argv[1], sys.argv[2]))))
print(json.dumps({"seconds": time.perf_counter() - started,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}))
"""
"""The dashboard child: builds the run's dashboard and its json_item, prints its seconds and peak RSS."""


def write_trace(path: Path, events: int, layout: str) -> None:
    """A gzipped Kineto trace of `events` 5 µs events, one per µs, placed as `layout` says."""
    rows = []
    for i in range(events):
        event = {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 50}", "ts": 1000 + i, "dur": 5, "pid": 1,
                 "tid": 1}
        if layout == "threads":
            event["tid"] = 100 + i
        elif layout == "processes":
            event["pid"] = 100 + i
        elif layout == "devices":
            event |= {"cat": "kernel", "pid": i, "tid": 7, "args": {"device": i, "stream": 7}}
        rows.append(event)
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": rows}, file)


def _workbench(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench", *args, "--out", str(root)], capture_output=True,
                          text=True, check=True)


def _report_child(run_id: str, root: Path, html: Path) -> dict[str, float]:
    """`workbench report` in a fresh process, its seconds and peak RSS (via a wrapper reading its own rusage)."""
    code = ("import json, resource, sys, time\nfrom workbench.cli import main\nstarted = time.perf_counter()\n"
            "try:\n    main(sys.argv[1:], standalone_mode=False)\nfinally:\n"
            "    print(json.dumps({'seconds': time.perf_counter() - started,"
            " 'rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}))")
    done = subprocess.run([sys.executable, "-c", code, "report", run_id, "-o", str(html), "--out", str(root)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _dashboard_child(run_id: str, root: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, run_id, str(root)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(sizes: list[int], folder: Path) -> list[dict[str, object]]:
    """One row per (size, layout): import seconds, report and dashboard seconds and peak RSS."""
    results = []
    for size in sizes:
        for layout in LAYOUTS:
            path = folder / f"{layout.replace(' ', '-')}-{size}.json.gz"
            write_trace(path, size, layout)
            started = time.perf_counter()
            run_id = _workbench("import", str(path), root=folder / "traces").stdout.split()[-1]
            imported = time.perf_counter() - started
            report = _report_child(run_id, folder / "traces", folder / f"{run_id}.html")
            board = _dashboard_child(run_id, folder / "traces")
            results.append({"events": size, "layout": layout, "file_kb": path.stat().st_size / 1e3,
                            "import_s": imported, "report_s": report["seconds"], "report_mb": report["rss_mb"],
                            "dashboard_s": board["seconds"], "dashboard_mb": board["rss_mb"]})
            print(f"  {size:>7,} {layout:<11} imported in {imported:.1f} s; report {report['seconds']:.1f} s "
                  f"{report['rss_mb']:.0f} MB; dashboard {board['seconds']:.1f} s {board['rss_mb']:.0f} MB",
                  file=sys.stderr)
    return results


def judged(results: list[dict[str, object]]) -> list[dict[str, object]]:
    """The results with each one's ratios to its size's control and whether it keeps within the bound."""
    control = {r["events"]: r for r in results if r["layout"] == "one thread"}
    for row in results:
        base = control[row["events"]]
        for view in ("report", "dashboard"):
            row[f"{view}_ratio"] = row[f"{view}_mb"] / base[f"{view}_mb"]
            row[f"{view}_bound_mb"] = RATIO_BOUND * base[f"{view}_mb"] + EXTRA_MB
        row["ok"] = all(row[f"{v}_mb"] <= row[f"{v}_bound_mb"] for v in ("report", "dashboard"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000, 200_000])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    with tempfile.TemporaryDirectory(prefix="workbench-limits-") as folder:
        results = judged(measure(args.sizes, Path(folder)))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'events':>8} {'where':<11} {'file':>8} {'report':>8} {'MB':>6} {'x ctl':>6} "
              f"{'board':>7} {'MB':>6} {'x ctl':>6}  bound")
        for r in results:
            print(f"{r['events']:>8,} {r['layout']:<11} {r['file_kb']:>6.0f}KB {r['report_s']:>7.1f}s "
                  f"{r['report_mb']:>6.0f} {r['report_ratio']:>6.2f} {r['dashboard_s']:>6.1f}s "
                  f"{r['dashboard_mb']:>6.0f} {r['dashboard_ratio']:>6.2f}  {'PASS' if r['ok'] else 'FAIL'}")
        print(f"bound: peak RSS <= {RATIO_BOUND} x the one-thread control's + {EXTRA_MB:.0f} MB")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
