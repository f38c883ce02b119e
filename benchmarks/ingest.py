"""Ingest benchmark: workbench's trace reader and its `workbench import` vs Holistic Trace Analysis vs `json.load`.

Writes a synthetic PyTorch-profiler (Kineto) trace of N events (`synthetic_kineto.py`), then parses
that one file with each parser, every run in a fresh subprocess so its memory is its own:

- workbench: `workbench.trace.read_trace(path)`, as a user calls it (a file this large is decoded
  by worker processes, one per usable CPU); rows are `trace.events.num_rows`;
- workbench-seq: `read_kineto(path, workers=1)`, the same reader decoding in its own process only;
- workbench-par: `read_kineto(path, workers=N)` with N as `read_trace` would pick for a large file,
  whatever the file's size (to find the size from which workers pay);
- workbench-import: the whole `python -m workbench import PATH --out ROOT --json` process, as a user runs it:
  interpreter start, the command line's imports, reading, and writing the bundle (raw file copied in) into a
  temporary traces root; rows are the bundle's events (its run.json);
- HTA: `hta.trace_analysis.TraceAnalysis(trace_dir=...)` with HTA's defaults, on a directory holding
  a link to the trace as rank 0 (HTA loads traces by directory); rows are HTA's rank-0 dataframe,
  after HTA's own filtering;
- json.load: the file as a Python dict, no conversion; rows are `len(traceEvents)`.

The parsers run round-robin (one run of each per round), so the machine's drift, which is large on a
shared two-core box, hits them alike; the load average before and after is printed with the results.
Seconds are the parse call alone (no interpreter start or imports: pandas, which pyarrow imports on
its first array and HTA at its import, is imported before the clock starts), the median of the runs;
events/s divide the file's N events by them, and "workbench vs X" is X's seconds over workbench's.
workbench-import's seconds are instead the wall clock of its whole process, start to exit, so "workbench
import (whole process) vs HTA" is HTA's load (its parse call alone) over everything a user of the command
line waits for; its peak memory is that process's own (`ru_maxrss` of the children), and its "workers" are
that process and its own workers.

Peak memory covers the parsing process and every process it starts (workbench's decoding workers):
every 50 ms this process adds the parser's RSS and its descendants' USS (unique set size: the pages
only that process holds), and the peak is the most of that and of the parser's own `ru_maxrss` (its
exact RSS peak, which a sample can miss). Forked workers share the parser's pages, so summing RSS
would count those pages once per process; USS counts each worker's own pages, and the shared ones
once, in the parser's RSS. (Pages the workers still share after the parser changed its copy are in
no one's USS; they exist only while the workers run, which ends before the parser's own peak, the
assembly of the Trace.) The figure is the most of its runs; baseline is the parser's RSS after
imports; MB are 10^6 bytes. The file is freshly written, so every parser reads it from the page cache.

    python benchmarks/ingest.py                      # 1,000,000 events, HTA included
    python benchmarks/ingest.py --events 200000 --skip-hta --json
    python benchmarks/ingest.py --parsers workbench,workbench-seq --repeat 7   # workers vs none
    python benchmarks/ingest.py --events 50000 --parsers workbench-seq,workbench-par
    python benchmarks/ingest.py --events 10000 --parsers workbench-import,hta --repeat 1   # the CLI vs HTA
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Only the standard library at module level: the children import this file too, and whatever it
# imports would count in their RSS. The parent's imports (rich, the generator) are in `main`.

PARSERS = ("workbench", "workbench-seq", "workbench-par", "workbench-import", "hta", "json")
DEFAULT_PARSERS = ("workbench", "workbench-seq", "workbench-import", "hta", "json")
LABELS = {"workbench": "workbench", "workbench-seq": "workbench, 1 process",
          "workbench-par": "workbench, workers", "workbench-import": "workbench import",
          "hta": "HTA", "json": "json.load"}
SPEEDUP_VS_HTA = 20.0
SPEEDUP_IMPORT_VS_HTA = 15.0
"""How much faster than HTA's load the whole `workbench import` process should be (interpreter and imports
included)."""
EVENTS_PER_S = 400_000
RSS_OVER_FILE = 1.5
MB = 1_000_000
SAMPLE_S = 0.05
"""Seconds between two samples of a run's memory (a sample costs about 1 ms of a CPU)."""


# --- child: one parse in a fresh process ---------------------------------------------------------


def _load_workbench(workers: int | str | None = "auto") -> Callable[[str], int]:
    """`read_trace` ("auto"), or `read_kineto` with that many decoding processes (None: as for a
    large file)."""
    import pandas  # noqa: F401 - pyarrow imports it on its first array: an import, not parsing

    from workbench.trace import read_trace
    from workbench.trace.kineto.reader import MAX_WORKERS, read_kineto

    if workers == "auto":
        return lambda path: read_trace(path).events.num_rows
    count = min(MAX_WORKERS, len(os.sched_getaffinity(0))) if workers is None else workers
    return lambda path: read_kineto(path, workers=count).events.num_rows


def _load_workbench_import() -> Callable[[str], int]:
    """The whole `workbench import` process on the file, into a traces root removed afterwards; its rows are
    the events of the bundle it wrote (read from its run.json, a small file)."""

    def parse(path: str) -> int:
        with tempfile.TemporaryDirectory(prefix="workbench-ingest-root-") as root:
            done = subprocess.run([sys.executable, "-m", "workbench", "import", path, "--out", root, "--json"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"workbench import exited {done.returncode}: {done.stderr.strip()[-2000:]}")
            (run_id,) = json.loads(done.stdout)
            info = json.loads((Path(root) / run_id / "run.json").read_text())
            return info["trace"]["reader"]["events"]

    return parse


def _load_hta() -> Callable[[str], int]:
    from hta.trace_analysis import TraceAnalysis

    def parse(path: str) -> int:
        analysis = TraceAnalysis(trace_dir=str(Path(path).parent))
        return len(analysis.t.get_trace(analysis.t.get_ranks()[0]))

    return parse


def _load_json() -> Callable[[str], int]:
    def parse(path: str) -> int:
        with open(path) as f:
            return len(json.load(f)["traceEvents"])

    return parse


LOADERS: dict[str, Callable[[], Callable[[str], int]]] = {
    "workbench": _load_workbench, "workbench-seq": lambda: _load_workbench(1),
    "workbench-par": lambda: _load_workbench(None), "workbench-import": _load_workbench_import, "hta": _load_hta,
    "json": _load_json}


def _peak_rss(who: int = resource.RUSAGE_SELF) -> int:
    """The peak RSS in bytes of this process (or, with `RUSAGE_CHILDREN`, of the largest child it waited for;
    `ru_maxrss` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(who).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def child(parser: str, path: str) -> int:
    """Import `parser`, parse `path` once, print one JSON line of measurements; return the exit code."""
    import psutil

    try:
        parse = LOADERS[parser]()
    except Exception as exc:  # a missing or half-written package fails in many ways at import
        print(json.dumps({"error": f"import failed: {type(exc).__name__}: {exc}"}))
        return 3
    baseline = psutil.Process().memory_info().rss
    start = time.perf_counter()
    rows = parse(path)
    seconds = time.perf_counter() - start
    peak = max(_peak_rss(), _peak_rss(resource.RUSAGE_CHILDREN) if parser == "workbench-import" else 0)
    print(json.dumps({"seconds": seconds, "rows": rows, "baseline_rss": baseline, "own_peak_rss": peak}))
    return 0


def _tree_memory(parser: Any, workers: list[Any]) -> tuple[int, int]:
    """(the parser's RSS + its workers' USS, that USS) now; processes that have gone count 0."""
    import psutil

    rss = parser.memory_info().rss
    uss = 0
    for worker in workers:
        try:
            uss += worker.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return rss + uss, uss


def watch(proc: subprocess.Popen, timeout: float | None) -> dict[str, int] | None:
    """Sample the memory of `proc` and its descendants until it exits (see the module docstring):
    {"tree_peak": bytes, "workers_peak_uss": bytes}; None if it ran past `timeout` (then killed)."""
    import psutil

    parser = psutil.Process(proc.pid)
    deadline = None if timeout is None else time.monotonic() + timeout
    tree_peak = workers_peak = 0
    workers: list[Any] = []
    for sample in itertools.count():
        if proc.poll() is not None:
            break
        try:
            if sample < 10 or sample % 4 == 0:  # listing them scans /proc (a few ms): after the
                workers = parser.children(recursive=True)  # first 0.5 s, when workers start, less often
            tree, uss = _tree_memory(parser, workers)
        except psutil.Error:  # the parser is exiting
            continue
        tree_peak, workers_peak = max(tree_peak, tree), max(workers_peak, uss)
        if deadline is not None and time.monotonic() > deadline:
            for p in [*parser.children(recursive=True), parser]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            proc.wait()
            return None
        time.sleep(SAMPLE_S)
    return {"tree_peak": tree_peak, "workers_peak_uss": workers_peak}


# --- parent: runs, results, report -----------------------------------------------------------------


@dataclass
class Result:
    """All runs of one parser on the trace."""

    parser: str
    runs: list[dict] = field(default_factory=list)
    error: str | None = None

    def median(self, key: str) -> float:
        return statistics.median(run[key] for run in self.runs)

    @property
    def ok(self) -> bool:
        return bool(self.runs) and self.error is None


def run_once(result: Result, path: Path, timeout: float | None) -> None:
    """Parse `path` once more with `result.parser` in a fresh `python ingest.py --child` process,
    watching the memory of it and its workers."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", result.parser, str(path)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # no pipe to fill
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        memory = watch(proc, timeout)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if memory is None:
        result.error = f"timed out after {timeout:g} s"
        return
    lines = stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if proc.returncode != 0 or "error" in report:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        result.error = report.get("error") or f"exit code {proc.returncode}:\n{tail}"
        return
    report["workers_peak_uss"] = memory["workers_peak_uss"]
    report["peak_rss"] = max(report["own_peak_rss"], memory["tree_peak"])
    result.runs.append(report)


def run_interleaved(plan: dict[str, tuple[Path, int]], timeout: float | None,
                    log: Callable[[str], None]) -> list[Result]:
    """Run the parsers round-robin (one run of each per round, up to each one's repeat count), so that
    the machine's drift over the benchmark hits them alike; a parser that fails is not run again."""
    results = {name: Result(name) for name in plan}
    for round_ in range(max(repeat for _, repeat in plan.values())):
        for name, (path, repeat) in plan.items():
            result = results[name]
            if round_ >= repeat or result.error:
                continue
            run_once(result, path, timeout)
            if result.error:
                log(f"{LABELS[name]} FAILED: {result.error}")
                continue
            report = result.runs[-1]
            workers = f" (workers' USS {report['workers_peak_uss'] / MB:,.0f} MB)" if report["workers_peak_uss"] else ""
            log(f"{LABELS[name]} run {round_ + 1}/{repeat}: {report['seconds']:.2f} s, "
                f"peak memory {report['peak_rss'] / MB:,.0f} MB{workers}")
    return list(results.values())


def summarize(results: list[Result], events: int, file_bytes: int) -> dict:
    """Per-parser medians, workbench's speed ratios and the target checks, as plain data."""
    parsers = {}
    for r in results:
        entry: dict = {"label": LABELS[r.parser], "error": r.error, "runs": r.runs}
        if r.ok:
            seconds = r.median("seconds")
            peak = max(run["peak_rss"] for run in r.runs)
            entry |= {"seconds": seconds, "events_per_s": events / seconds, "rows": r.runs[-1]["rows"],
                      "peak_rss_mb": peak / MB, "baseline_rss_mb": r.median("baseline_rss") / MB,
                      "peak_rss_over_file": peak / file_bytes,
                      "workers_peak_uss_mb": max(run["workers_peak_uss"] for run in r.runs) / MB}
        parsers[r.parser] = entry
    wb = parsers.get("workbench", {})

    def speedup(other: str) -> float | None:
        theirs = parsers.get(other, {}).get("seconds")
        return theirs / wb["seconds"] if theirs and "seconds" in wb else None

    import_s, hta_s = parsers.get("workbench-import", {}).get("seconds"), parsers.get("hta", {}).get("seconds")
    ratios = {"workbench_vs_hta": speedup("hta"), "workbench_vs_json": speedup("json"),
              "workbench_vs_workbench_seq": speedup("workbench-seq"),
              "workbench_import_vs_hta": hta_s / import_s if hta_s and import_s else None}

    def check(name: str, value: float | None, ok: Callable[[float], bool], shown: str) -> dict:
        status = "N/A" if value is None else "PASS" if ok(value) else "FAIL"
        return {"target": name, "value": value, "shown": "-" if value is None else shown, "status": status}

    eps, rss = wb.get("events_per_s"), wb.get("peak_rss_over_file")
    targets = [
        check(f"workbench >= {SPEEDUP_VS_HTA:g}x faster than HTA", ratios["workbench_vs_hta"],
              lambda v: v >= SPEEDUP_VS_HTA, f"{ratios['workbench_vs_hta'] or 0:.1f}x"),
        check(f"workbench import >= {SPEEDUP_IMPORT_VS_HTA:g}x faster than HTA",
              ratios["workbench_import_vs_hta"], lambda v: v >= SPEEDUP_IMPORT_VS_HTA,
              f"{ratios['workbench_import_vs_hta'] or 0:.1f}x"),
        check(f"workbench >= {EVENTS_PER_S:,} events/s", eps, lambda v: v >= EVENTS_PER_S,
              f"{eps or 0:,.0f}/s"),
        check(f"workbench peak RSS < {RSS_OVER_FILE:g}x file size", rss, lambda v: v < RSS_OVER_FILE,
              f"{rss or 0:.2f}x"),
    ]
    return {"parsers": parsers, "ratios": ratios, "targets": targets}


def print_report(summary: dict, events: int, file_bytes: int) -> None:
    """The results table, workbench's ratios and the targets, with rich."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Parsing {events:,} Kineto events ({file_bytes / MB:,.1f} MB of JSON)")
    for name in ("parser", "seconds", "events/s", "peak MB", "workers MB", "base MB", "peak/file", "rows"):
        table.add_column(name, justify="left" if name == "parser" else "right")
    for p in summary["parsers"].values():
        if p["error"]:
            table.add_row(p["label"], "[red]failed[/red]", *[""] * 6)
            continue
        table.add_row(p["label"], f"{p['seconds']:.2f}", f"{p['events_per_s']:,.0f}",
                      f"{p['peak_rss_mb']:,.0f}", f"{p['workers_peak_uss_mb']:,.0f}", f"{p['baseline_rss_mb']:,.0f}",
                      f"{p['peak_rss_over_file']:.2f}x", f"{p['rows']:,}")
    console.print(table)
    load = summary["load_average"]
    console.print(f"load average (1 min) before {load['before']:.2f}, after {load['after']:.2f}, "
                  f"on {load['cpus']} CPUs")
    for p in summary["parsers"].values():
        if p["error"]:
            console.print(f"[red]{p['label']} failed:[/red] {p['error']}", highlight=False)
    for key, ours, other in (("workbench_vs_hta", "workbench", "HTA"), ("workbench_vs_json", "workbench", "json.load"),
                             ("workbench_vs_workbench_seq", "workbench", "workbench, 1 process"),
                             ("workbench_import_vs_hta", "workbench import (whole process)", "HTA's load")):
        ratio = summary["ratios"][key]
        if ratio is not None:
            console.print(f"{ours} vs {other}: {ratio:.1f}x {'faster' if ratio >= 1 else 'slower'}"
                          + (f" ({1 / ratio:.1f}x the time)" if ratio < 1 else ""))
    colors = {"PASS": "green", "FAIL": "red", "N/A": "yellow"}
    for t in summary["targets"]:
        console.print(f"  [{colors[t['status']]}]{t['status']:>4}[/]  {t['target']:<45} {t['shown']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="trace events to generate (default 1M)")
    parser.add_argument("--out", type=Path, help="directory for the trace (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the trace afterwards")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each parser but HTA (default 3)")
    parser.add_argument("--hta-repeat", type=int, default=1, help="runs of HTA, which is slow (default 1)")
    parser.add_argument("--skip-hta", action="store_true", help="leave HTA out (quick runs)")
    parser.add_argument("--parsers", default=",".join(DEFAULT_PARSERS),
                        help=f"comma-separated parsers to run, of {', '.join(PARSERS)} "
                             f"(default {','.join(DEFAULT_PARSERS)})")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds one parse may take (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", nargs=2, metavar=("PARSER", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    if min(args.repeat, args.hta_repeat) < 1:
        parser.error("--repeat and --hta-repeat must be at least 1")
    chosen = [name.strip() for name in args.parsers.split(",") if name.strip()]
    if unknown := sorted(set(chosen) - set(PARSERS)):
        parser.error(f"unknown parsers {', '.join(unknown)}: choose from {', '.join(PARSERS)}")

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from synthetic_kineto import write_synthetic_trace

    err = Console(stderr=True)
    made_dir = args.out is None
    out = Path(tempfile.mkdtemp(prefix="workbench-ingest-")) if made_dir else args.out
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"synthetic-{args.events}.pt.trace.json"
    hta_dir = out / f"hta-{args.events}"
    try:
        with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TextColumn("events"),
                      TimeElapsedColumn(), console=err) as progress:
            task = progress.add_task("generate", total=args.events)
            start = time.perf_counter()
            try:
                counts = write_synthetic_trace(path, args.events, args.seed,
                                               progress=lambda n: progress.update(task, completed=n))
            except ValueError as exc:
                parser.error(str(exc))
            generation_s = time.perf_counter() - start
        file_bytes = path.stat().st_size
        major = {k: n for k, n in sorted(counts.items(), key=lambda c: -c[1]) if n >= args.events / 100}
        mix = ", ".join(f"{k} {n / args.events:.1%}" for k, n in major.items())
        mix += f", other {1 - sum(major.values()) / args.events:.1%}"
        err.print(f"wrote {path}: {args.events:,} events, {file_bytes / MB:,.1f} MB, "
                  f"in {generation_s:.1f} s ({mix})")
        hta_dir.mkdir(exist_ok=True)
        (hta_dir / "rank0.pt.trace.json").unlink(missing_ok=True)
        (hta_dir / "rank0.pt.trace.json").symlink_to(path.resolve())

        plan = {name: (hta_dir / "rank0.pt.trace.json" if name == "hta" else path,
                       args.hta_repeat if name == "hta" else args.repeat)
                for name in PARSERS if name in chosen and not (name == "hta" and args.skip_hta)}
        load_before = os.getloadavg()[0]
        results = run_interleaved(plan, args.timeout, err.print)
        summary = summarize(results, args.events, file_bytes)
        summary["load_average"] = {"before": load_before, "after": os.getloadavg()[0],
                                   "cpus": len(os.sched_getaffinity(0))}
        if args.json:
            print(json.dumps({"events": args.events, "seed": args.seed, "file": str(path),
                              "file_bytes": file_bytes, "generation_s": generation_s, "counts": counts,
                              **summary}, indent=2))
        else:
            print_report(summary, args.events, file_bytes)
    finally:
        if args.keep:
            err.print(f"kept {path}")
        else:
            shutil.rmtree(hta_dir, ignore_errors=True)
            path.unlink(missing_ok=True)
            if made_dir:
                shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
