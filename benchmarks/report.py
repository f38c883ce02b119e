"""Report benchmark: the run dashboard and its HTML report for synthetic traces of 100k, 1M and 10M events.

For each size, writes a synthetic Kineto trace (`synthetic_kineto.py`), then runs two fresh
subprocesses, so that each one's peak RSS is its own and belongs to that size alone:

- ingest: `workbench.trace.read_trace(path)` ("read"), then `write_bundle(...)` into a bundle root
  ("bundle": parquet I/O, reported but counted in neither total);
- report: `open_bundle(run_id, root)` and `workbench.views.dashboard.dashboard(bundle)` ("build",
  which reads the bundle's parquet tables, memory-mapped, on first use), then
  `workbench.report.write_report(layout, path, title)` ("write").

"report" is build + write, from a bundle on disk (what `workbench report RUN` does, and what the
issue's 10 s target is about); "end to end" adds the read of the trace file: read + build + write.
Seconds are the calls alone (no interpreter start or imports), one run each; files are freshly
written, so they are read from the page cache. Peak RSS is each child's `ru_maxrss`; the targets use
the larger of the two. MB are 10^6 bytes, GiB 2^30.

Targets: for 1M events, report <= 10 s and HTML <= 10 MB; for 10M events, peak RSS < 8 GiB and an
HTML file that does not grow with the event count (10M's within +10% of 1M's).

    python benchmarks/report.py                          # 100k, 1M and 10M events
    python benchmarks/report.py --skip-10m --json        # 100k and 1M
    python benchmarks/report.py --events 200000 --out /tmp/bench --keep
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# Only the standard library at module level: the children import this file too, and whatever it
# imports would count in their RSS. The parent's imports (rich, the generator) are in the
# functions that use them.

DEFAULT_EVENTS = (100_000, 1_000_000, 10_000_000)
ONE_M, TEN_M = 1_000_000, 10_000_000
REPORT_S = 10.0
HTML_BYTES = 10_000_000
PEAK_RSS_BYTES = 8 << 30
HTML_GROWTH = 1.10
DISK_BYTES_PER_EVENT = 1_200
"""Free disk a size needs: 12 GB for 10M events (a ~3.4 GB trace, its bundle and the report)."""
MB, GIB = 1_000_000, 1 << 30


# --- children: one phase in a fresh process ------------------------------------------------------


def _peak_rss() -> int:
    """This process's peak RSS in bytes (`ru_maxrss` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def child_ingest(trace_path: str, root: str) -> dict:
    """Read the trace file and write it as a bundle under `root`; the run id and timings."""
    from workbench.trace import read_trace
    from workbench.trace.store.bundle import new_run_id, write_bundle

    start = time.perf_counter()
    trace = read_trace(trace_path)
    read_s = time.perf_counter() - start
    run_id = new_run_id("bench")
    start = time.perf_counter()
    write_bundle(root, run_id, {"model": None, "variant": None, "device": "cuda:0"}, trace)
    bundle_s = time.perf_counter() - start
    return {"run_id": run_id, "rows": trace.events.num_rows, "read_s": read_s, "bundle_s": bundle_s,
            "peak_rss": _peak_rss()}


def child_report(root: str, run_id: str, html_path: str) -> dict:
    """Build the dashboard of bundle `run_id` and write it as an HTML report; timings and sizes."""
    from workbench.report import write_report
    from workbench.trace.store.bundle import open_bundle
    from workbench.views.dashboard import dashboard

    start = time.perf_counter()
    bundle = open_bundle(run_id, root)
    layout = dashboard(bundle)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    path = write_report(layout, html_path, f"workbench report: {run_id}")
    write_s = time.perf_counter() - start
    return {"build_s": build_s, "write_s": write_s, "html_bytes": path.stat().st_size, "peak_rss": _peak_rss()}


CHILDREN: dict[str, Callable[..., dict]] = {"ingest": child_ingest, "report": child_report}


def run_child(name: str, args: list[str], timeout: float) -> dict:
    """Run `report.py --child NAME ARGS...` and return its JSON line, or {"error": ...} if it failed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{name} timed out after {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    if proc.returncode < 0:
        why = f"killed by signal {-proc.returncode}" + (" (likely out of memory)" if proc.returncode == -9 else "")
    else:
        why = f"exit code {proc.returncode}"
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    return {"error": f"{name} failed: {why}" + (f"\n{tail}" if tail else "")}


# --- parent: sizes, results, report ----------------------------------------------------------------


def measure(events: int, out: Path, seed: int, keep: bool, timeout: float, console: Console) -> dict:
    """Generate the trace of `events`, run both children on it and return this size's figures."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from synthetic_kineto import write_synthetic_trace

    trace_path = out / f"synthetic-{events}.pt.trace.json"
    root = out / f"bundles-{events}"
    html_path = out / f"report-{events}.html"
    log = console.print
    result: dict = {"events": events}
    try:
        with Progress(TextColumn(f"generating {events:,}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task("generate", total=events)
            start = time.perf_counter()
            write_synthetic_trace(trace_path, events, seed, progress=lambda n: progress.update(task, completed=n))
        result |= {"generation_s": time.perf_counter() - start, "trace_bytes": trace_path.stat().st_size}
        log(f"{events:,}: wrote {trace_path.name}, {result['trace_bytes'] / MB:,.1f} MB, "
            f"in {result['generation_s']:.1f} s")
        ingest = run_child("ingest", [str(trace_path), str(root)], timeout)
        if "error" in ingest:
            return result | {"error": ingest["error"]}
        log(f"{events:,}: read {ingest['read_s']:.2f} s, bundle {ingest['bundle_s']:.2f} s, "
            f"peak RSS {ingest['peak_rss'] / MB:,.0f} MB")
        if not keep:
            trace_path.unlink()
        report = run_child("report", [str(root), ingest["run_id"], str(html_path)], timeout)
        result |= {"rows": ingest["rows"], "read_s": ingest["read_s"], "bundle_s": ingest["bundle_s"],
                   "ingest_peak_rss": ingest["peak_rss"]}
        if "error" in report:
            return result | {"error": report["error"]}
        log(f"{events:,}: build {report['build_s']:.2f} s, write {report['write_s']:.2f} s, "
            f"HTML {report['html_bytes'] / MB:,.2f} MB, peak RSS {report['peak_rss'] / MB:,.0f} MB")
        return result | {
            "build_s": report["build_s"], "write_s": report["write_s"], "html_bytes": report["html_bytes"],
            "report_peak_rss": report["peak_rss"], "report_s": report["build_s"] + report["write_s"],
            "end_to_end_s": ingest["read_s"] + report["build_s"] + report["write_s"],
            "peak_rss": max(ingest["peak_rss"], report["peak_rss"])}
    finally:
        if keep:
            log(f"{events:,}: kept {trace_path}, {root} and {html_path}")
        else:
            trace_path.unlink(missing_ok=True)
            shutil.rmtree(root, ignore_errors=True)
            html_path.unlink(missing_ok=True)


def targets(results: dict[int, dict]) -> list[dict]:
    """The issue's targets, PASS/FAIL, or N/A where the size was not run or failed."""
    one, ten = results.get(ONE_M, {}), results.get(TEN_M, {})

    def check(name: str, value: float | None, ok: bool, shown: str) -> dict:
        status = "N/A" if value is None else "PASS" if ok else "FAIL"
        shown = "not measured" if value is None else shown
        return {"target": name, "value": value, "status": status, "shown": shown}

    report_s, html, peak = one.get("report_s"), one.get("html_bytes"), ten.get("peak_rss")
    growth = ten["html_bytes"] / html if html and "html_bytes" in ten else None
    return [
        check(f"1M: report (build+write) <= {REPORT_S:g} s", report_s, (report_s or 0) <= REPORT_S,
              f"{report_s or 0:.2f} s; end to end {one.get('end_to_end_s', 0):.2f} s"),
        check(f"1M: HTML <= {HTML_BYTES / MB:g} MB", html, (html or 0) <= HTML_BYTES, f"{(html or 0) / MB:.2f} MB"),
        check(f"10M: peak RSS < {PEAK_RSS_BYTES / GIB:g} GiB", peak, (peak or 0) < PEAK_RSS_BYTES,
              f"{(peak or 0) / GIB:.2f} GiB"),
        check(f"10M: HTML within +{HTML_GROWTH - 1:.0%} of 1M's", growth, (growth or 0) <= HTML_GROWTH,
              f"{growth or 0:.3f}x"),
    ]


def size_ratios(results: dict[int, dict]) -> list[dict]:
    """HTML and trace-file size of each measured size over the previous one's."""
    done = [r for r in results.values() if "html_bytes" in r]
    return [{"events": (a["events"], b["events"]), "html": b["html_bytes"] / a["html_bytes"],
             "trace": b["trace_bytes"] / a["trace_bytes"]} for a, b in itertools.pairwise(done)]


def print_report(results: dict[int, dict], checks: list[dict], ratios: list[dict]) -> None:
    """The figures (one column per size), the size ratios and the targets, with rich."""
    from rich.console import Console
    from rich.table import Table

    def seconds(value: float) -> str:
        return f"{value:.2f}"

    def megabytes(value: float) -> str:
        return f"{value / MB:,.2f}"

    rows: list[tuple[str, str, Callable[[float], str]]] = [
        ("trace file MB", "trace_bytes", megabytes), ("events table rows", "rows", "{:,}".format),
        ("read s", "read_s", seconds), ("bundle write s", "bundle_s", seconds),
        ("dashboard build s", "build_s", seconds), ("HTML write s", "write_s", seconds),
        ("report s (build+write)", "report_s", seconds), ("end to end s (read+build+write)", "end_to_end_s", seconds),
        ("HTML MB", "html_bytes", megabytes), ("peak RSS MB, read+bundle", "ingest_peak_rss", megabytes),
        ("peak RSS MB, report", "report_peak_rss", megabytes),
    ]
    console = Console()
    table = Table(title="Dashboard and HTML report of synthetic Kineto traces")
    table.add_column("events")
    for events in results:
        table.add_column(f"{events:,}", justify="right")
    for label, key, shown in rows:
        table.add_row(label, *[shown(r[key]) if key in r else "-" for r in results.values()])
    console.print(table)
    for r in results.values():
        if "error" in r:
            console.print(f"[red]{r['events']:,} events not measured:[/red] {r['error']}", highlight=False)
    for ratio in ratios:
        a, b = ratio["events"]
        console.print(f"sizes {b:,} / {a:,} events: HTML {ratio['html']:.3f}x, trace file {ratio['trace']:.2f}x",
                      highlight=False)
    colors = {"PASS": "green", "FAIL": "red", "N/A": "yellow"}
    for c in checks:
        console.print(f"  [{colors[c['status']]}]{c['status']:>4}[/]  {c['target']:<34} {c['shown']}", highlight=False)


def _sizes(text: str) -> list[int]:
    """The --events list: comma-separated positive counts."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of counts: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"need at least one positive count: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=_sizes, default=list(DEFAULT_EVENTS),
                        help="comma-separated trace sizes (default 100000,1000000,10000000)")
    parser.add_argument("--skip-10m", action="store_true", help="leave out sizes of 10M events and more")
    parser.add_argument("--out", type=Path, help="directory for traces, bundles and reports (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the traces, bundles and reports afterwards")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one child may take (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](*args.child[1:])))
        return 0

    from rich.console import Console

    err = Console(stderr=True)
    sizes = sorted({n for n in args.events if not (args.skip_10m and n >= TEN_M)})
    if not sizes:
        parser.error("no sizes left to run")
    made_dir = args.out is None
    out = Path(tempfile.mkdtemp(prefix="workbench-report-")) if made_dir else args.out
    out.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict] = {}
    try:
        for events in sizes:
            free, needed = shutil.disk_usage(out).free, events * DISK_BYTES_PER_EVENT
            if free < needed:
                why = f"skipped, too little disk: {free / 1e9:,.1f} GB free in {out}, needs {needed / 1e9:,.1f} GB"
                err.print(f"[yellow]{events:,} events {why}[/yellow]", highlight=False)
                results[events] = {"events": events, "error": why}
                continue
            try:
                results[events] = measure(events, out, args.seed, args.keep, args.timeout, err)
            except ValueError as exc:  # the generator's "too few events"
                parser.error(str(exc))
    finally:
        if made_dir and not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    checks, ratios = targets(results), size_ratios(results)
    if args.json:
        print(json.dumps({"seed": args.seed, "results": list(results.values()), "ratios": ratios,
                          "targets": checks}, indent=2))
    else:
        print_report(results, checks, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
