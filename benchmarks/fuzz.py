"""Fuzz `workbench import` for longer than the test suite does: the cases of `fuzzing.py`, checked as
`fuzz_check.py` does, in worker processes that a hang or a crash of the interpreter cannot take down.

    python benchmarks/fuzz.py                                   # 3,000 cases or 10 minutes
    python benchmarks/fuzz.py --cases 500 --seed 10000 --workers 2
    python benchmarks/fuzz.py --seconds 3600 --out /tmp/fuzz-failures

Case numbers run from --seed on (case N is the same input wherever the seeds are the same; the seeds
captured with jax differ in their timestamps from run to run, so failing inputs are saved as they were).
Each worker imports the case's file with the real command line in its own process (click's runner), then
`show --json` and, every --report-every cases, `report`; a case past --timeout seconds is a hang (the
worker is killed and replaced). Prints the counts per format and outcome (ok, error: refused in one line;
crash, hang, debris) and saves every failing input with a note of what happened in --out. Exits 1 if any
case crashed, hung or left debris.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_check import OUTCOMES, Outcome, check_case, in_process
from fuzz_seeds import build_seeds
from fuzzing import FORMATS, SUFFIXES, Case, NoSeed, make_case

FAILURES = ("crash", "hang", "debris")


def _serve(conn: multiprocessing.connection.Connection) -> None:
    """Worker: check the cases sent until None comes."""
    while (job := conn.recv()) is not None:
        case, report = job
        with tempfile.TemporaryDirectory(prefix="workbench-fuzz-") as folder:
            conn.send(check_case(case, Path(folder), in_process, report=report))


@dataclass
class Worker:
    """A worker process, its end of the pipe, and the case it is on (with when it got it)."""

    process: Any
    conn: multiprocessing.connection.Connection
    case: Case | None = None
    since: float = 0.0

    @classmethod
    def start(cls) -> Worker:
        ours, theirs = multiprocessing.Pipe()
        process = multiprocessing.get_context("spawn").Process(target=_serve, args=(theirs,), daemon=True)
        process.start()
        theirs.close()
        return cls(process, ours)

    def give(self, case: Case, report: bool) -> None:
        self.case, self.since = case, time.monotonic()
        self.conn.send((case, report))

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def run(cases: int, seconds: float, first: int, workers: int, timeout_s: float, report_every: int,
        out: Path) -> Counter[tuple[str, str]]:
    """Check up to `cases` cases from number `first` for at most `seconds`; return counts by (format, outcome)."""
    seeds = build_seeds()
    missing = [f for f in FORMATS if not seeds.has(f)]
    if missing:
        print(f"no seeds for {', '.join(missing)} here (jax or ../shared/fixtures missing): those cases are skipped")
    counts: Counter[tuple[str, str]] = Counter()
    pool = [Worker.start() for _ in range(workers)]
    numbers = iter(range(first, first + cases))
    deadline = time.monotonic() + seconds
    busy: list[Worker] = []
    try:
        while True:
            for worker in pool:
                if worker.case is None and time.monotonic() < deadline:
                    case = _next_case(numbers, seeds)
                    if case is not None:
                        worker.give(case, report=case.number % report_every == 0)
                        busy.append(worker)
            if not busy:
                return counts
            ready = multiprocessing.connection.wait([w.conn for w in busy], timeout=1.0)
            for worker in list(busy):
                outcome = _outcome(worker, ready, timeout_s)
                if outcome is None:
                    continue
                assert worker.case is not None
                _record(worker.case, outcome, counts, out)
                busy.remove(worker)
                if outcome.kind == "hang" or not worker.process.is_alive():
                    worker.stop()
                    pool[pool.index(worker)] = Worker.start()
                else:
                    worker.case = None
    finally:
        for worker in pool:
            if worker.process.is_alive():
                worker.conn.send(None)
            worker.stop()


def _next_case(numbers: Any, seeds: Any) -> Case | None:
    for number in numbers:
        try:
            return make_case(number, seeds)
        except NoSeed:
            continue
    return None


def _outcome(worker: Worker, ready: list[Any], timeout_s: float) -> Outcome | None:
    """The worker's outcome if it has one (a dead worker is a crash, one past the timeout a hang), else None."""
    if worker.conn in ready:
        try:
            return worker.conn.recv()
        except EOFError:
            worker.process.join()
            return Outcome("crash", f"the worker process died (exit code {worker.process.exitcode})")
    if time.monotonic() - worker.since > timeout_s:
        return Outcome("hang", f"no outcome after {timeout_s:g} s")
    return None


def _record(case: Case, outcome: Outcome, counts: Counter[tuple[str, str]], out: Path) -> None:
    counts[case.format, outcome.kind] += 1
    if outcome.kind not in FAILURES:
        return
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{outcome.kind}-{case.format}-{case.number}"
    (out / f"{stem}{SUFFIXES[case.format]}").write_bytes(case.data)
    (out / f"{stem}.txt").write_text(f"{case.label}\n\n{outcome.detail}\n", encoding="utf-8")
    print(f"{outcome.kind}: {case.label[:200]}  (saved as {out / stem}.*)", flush=True)


def print_counts(counts: Counter[tuple[str, str]], elapsed: float) -> None:
    total = sum(counts.values())
    print(f"\n{total:,} cases in {elapsed:.0f} s ({total / max(elapsed, 1e-9):.1f}/s)")
    print(f"{'format':<15}" + "".join(f"{o:>9}" for o in (*OUTCOMES, "total")))
    for fmt in FORMATS:
        row = [counts[fmt, o] for o in OUTCOMES]
        print(f"{fmt:<15}" + "".join(f"{n:>9,}" for n in (*row, sum(row))))
    row = [sum(counts[f, o] for f in FORMATS) for o in OUTCOMES]
    print(f"{'all':<15}" + "".join(f"{n:>9,}" for n in (*row, sum(row))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=3000, help="Most cases to run (default 3000).")
    parser.add_argument("--seconds", type=float, default=600, help="Stop starting cases after this (default 600).")
    parser.add_argument("--seed", type=int, default=0, help="Number of the first case (default 0).")
    parser.add_argument("--workers", type=int, default=1, help="Worker processes (default 1).")
    parser.add_argument("--timeout", type=float, default=60, help="Seconds before a case is a hang (default 60).")
    parser.add_argument("--report-every", type=int, default=10, help="Also run `report` on every Nth case.")
    parser.add_argument("--out", type=Path, default=Path("fuzz-failures"), help="Folder for failing inputs.")
    args = parser.parse_args()
    started = time.monotonic()
    counts = run(args.cases, args.seconds, args.seed, max(args.workers, 1), args.timeout,
                 max(args.report_every, 1), args.out)
    print_counts(counts, time.monotonic() - started)
    failed = sum(n for (_, kind), n in counts.items() if kind in FAILURES)
    if failed:
        print(f"{failed} failing inputs saved in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
