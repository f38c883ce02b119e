"""Multi-rank import benchmark: one process vs the local process pool vs a local Ray cluster, side by side.

Writes a job of synthetic ranks (`synthetic_kineto.py`: one trace written once, copied per rank with its
`distributedInfo` rank set), then imports the folder with each engine (`workbench.rank_import`), each in a
fresh subprocess so its memory is its own, into a fresh traces root:

- one process: `LocalEngine(1)`, everything in the driver;
- pool: `LocalEngine()`, a forked worker per usable CPU decoding (the traces come back to the driver, which
  writes the bundles: the import as it is on one machine);
- ray: `RayEngine` on a local cluster of `--ray-cpus` CPUs started by the subprocess, its workers started and
  their imports done before the clock starts (as on a running cluster): tasks decode and write; the driver
  holds facts and run.json texts only.

Ingest throughput is the job's events over the import's wall seconds; driver peak RSS is the driver's
`ru_maxrss` (workers and Ray's processes are not the driver). Then the driver's peak RSS of Ray imports of
`--scale` rank counts (of `--scale-events` events each), which should stay flat as ranks grow, and a projection
of a cluster import of 1,024 ranks x 1 GB from the measured per-task figures (assumptions printed with it).

    python benchmarks/ranks.py                                   # 64 x 200k; 16, 64, 256 x 20k
    python benchmarks/ranks.py --ranks 16 --events 50000 --scale 16,64 --scale-events 5000   # a busy machine
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_kineto import write_synthetic_trace

from workbench.rank_import import READ_TASK, WRITE_TASK
from workbench.runner import NullProgress

MODES = ("one-process", "pool", "ray")
_RANK = re.compile(rb'"rank": 0, "world_size": 1')


def write_job(folder: Path, ranks: int, events: int) -> int:
    """`ranks` copies of one synthetic trace of `events` events, rank i's header saying rank i; the bytes of one."""
    folder.mkdir(parents=True)
    template = folder.parent / f".template-{events}.json"
    if not template.exists():
        write_synthetic_trace(template, events)
    text = template.read_bytes()
    head, tail = text[:4096], text[4096:]
    for rank in range(ranks):
        header = _RANK.sub(f'"rank": {rank}, "world_size": {ranks}'.encode(), head, count=1)
        (folder / f"rank{rank}.pt.trace.json").write_bytes(header + tail)
    return len(text)


def child(mode: str, folder: str, root: str, cpus: int) -> None:
    """Import `folder` into `root` with one engine; print seconds, ranks and the driver's peak RSS as JSON."""
    from workbench.distributed import LocalEngine
    from workbench.rank_import import import_rank_job

    if mode == "ray":
        import ray

        from workbench.distributed.ray_engine import RayEngine

        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        engine = RayEngine("auto")
        with engine:  # start the workers and their imports, as on a cluster that is already running
            engine.map(_warm, [()] * cpus * 2)
    else:
        engine = LocalEngine(1 if mode == "one-process" else None)
    clock = PhaseClock()
    start = time.perf_counter()
    imported = import_rank_job(folder, root, engine=engine, progress=clock)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "ranks": len(imported.run_ids), "failed": len(imported.failed),
                      "driver_peak_rss": peak, "read_s": clock.seconds[READ_TASK],
                      "write_s": clock.seconds[WRITE_TASK]}))


class PhaseClock(NullProgress):
    """Seconds each step of the import (`READ_TASK`, `WRITE_TASK`) took, from its bar's start to its finish."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def start(self, task: str, total: int | None = None) -> None:
        self.started[task] = time.perf_counter()

    def finish(self, task: str) -> None:
        self.seconds[task] = time.perf_counter() - self.started[task]


def _warm() -> None:
    """A Ray worker's first task: the imports every rank task needs."""
    import workbench.trace.ranks.tasks  # noqa: F401


def run(mode: str, folder: Path, work: Path, cpus: int) -> dict:
    """One import in a fresh subprocess; its JSON line."""
    root = work / f"traces-{mode}-{folder.name}"
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(folder), str(root), str(cpus)],
                          capture_output=True, text=True, check=False)
    shutil.rmtree(root, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{mode} on {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def project(read_s: float, write_s: float, file_bytes: int, slots: int,
            driver_per_rank_s: float) -> tuple[float, list[str]]:
    """Cluster seconds for 1,024 ranks x 1 GB, and the assumptions. `read_s`, `write_s`: one rank's task times
    measured here (CPU seconds of a slot)."""
    ranks, size = 1024, 10**9
    scale = size / file_bytes
    task = (2 * read_s + write_s) * scale  # a 1 TB job is over the keep budget: decoded to read, again to write
    waves = -(-ranks // slots)
    total = waves * task + ranks * driver_per_rank_s
    return total, [
        f"two tasks per rank (read, then write); their time scales with the file's bytes: read {read_s:.2f} s + "
        f"write {write_s:.2f} s per {file_bytes / 1e6:.0f} MB measured here; a job of 1 TB exceeds the memory "
        f"kept between the steps (`keep_budget`), so each write decodes its file again: "
        f"{task:.0f} s of a slot per 1 GB rank (this machine's CPU speed)",
        f"{slots} task slots (CPUs) in the cluster, each with memory for one 1 GB rank's trace (~10-20 GB): "
        f"{waves} waves",
        "storage (shared file system or object store) delivers every task's reads and writes at the rate "
        "measured here from the page cache: no I/O bound",
        f"driver work per rank as measured ({driver_per_rank_s * 1e3:.1f} ms: facts, ids, record), serial",
        "one file per rank (no chunking of a 1 GB file across tasks); Ray scheduling overhead included in the "
        "measured per-task time",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--scale", default="16,64,256", help="rank counts for the driver RSS scaling")
    parser.add_argument("--scale-events", type=int, default=20_000)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--slots", type=int, default=256, help="task slots of the projected cluster")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", nargs=4, metavar=("MODE", "FOLDER", "ROOT", "CPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, folder, root, cpus = args.child
        child(mode, folder, root, int(cpus))
        return
    work = Path(tempfile.mkdtemp(prefix="workbench-ranks-bench-"))
    try:
        print(f"load average before: {os.getloadavg()[0]:.1f}; {len(os.sched_getaffinity(0))} usable CPUs")
        job = work / f"job-{args.ranks}x{args.events}"
        file_bytes = write_job(job, args.ranks, args.events)
        total_events = args.ranks * args.events
        print(f"\n{args.ranks} ranks x {args.events:,} events ({file_bytes / 1e6:.1f} MB each)")
        print(f"{'engine':<12} {'seconds':>8} {'read s':>7} {'write s':>8} {'events/s':>12} {'driver peak MB':>15}")
        results = {}
        for mode in args.modes.split(","):
            result = results[mode] = run(mode, job, work, args.ray_cpus)
            print(f"{mode:<12} {result['seconds']:>8.1f} {result['read_s']:>7.1f} {result['write_s']:>8.1f} "
                  f"{total_events / result['seconds']:>12,.0f} {result['driver_peak_rss'] / 1e6:>15.0f}")
        shutil.rmtree(job)
        print(f"\ndriver peak RSS of Ray imports, ranks of {args.scale_events:,} events")
        peaks = {}
        for count in map(int, args.scale.split(",")):
            folder = work / f"job-{count}x{args.scale_events}"
            write_job(folder, count, args.scale_events)
            peaks[count] = run("ray", folder, work, args.ray_cpus)
            shutil.rmtree(folder)
            print(f"{count:>5} ranks: {peaks[count]['driver_peak_rss'] / 1e6:.0f} MB "
                  f"({peaks[count]['seconds']:.1f} s)")
        counts = sorted(peaks)
        growth = peaks[counts[-1]]["driver_peak_rss"] / peaks[counts[0]]["driver_peak_rss"] - 1
        print(f"growth {counts[0]} -> {counts[-1]} ranks: {growth:+.1%} (target < +10%)")
        if "ray" in results:
            ray = results["ray"]
            read, write = (ray[key] * args.ray_cpus / args.ranks for key in ("read_s", "write_s"))
            small, large = peaks[counts[0]], peaks[counts[-1]]
            driver = max((large["seconds"] - small["seconds"]) / (counts[-1] - counts[0]) -
                         (read + write) * args.scale_events / args.events / args.ray_cpus, 0.0) \
                if len(counts) > 1 else 0
            seconds, assumptions = project(read, write, file_bytes, args.slots, driver)
            print(f"\nprojected cluster import of 1,024 ranks x 1 GB: {seconds / 60:.1f} min")
            for line in assumptions:
                print(f"  - {line}")
        print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
