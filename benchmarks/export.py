"""Export benchmark: a bundle written as Perfetto protobuf and as Chrome Trace Event JSON, side by side in one run.

For a real trace (default the ResNet-50 V100 Kineto fixture, 44,668 events; `--trace FILE` for another), imported
once into a scratch traces root: each format's file size, the median time to write it (`workbench.export.export_run`)
and to read it back (`workbench.trace.registry.read_trace`), `--repeats` interleaved rounds, and Perfetto's figures
as ratios to Chrome JSON's. The round trip's event count is checked on every read.

    python benchmarks/export.py
    python benchmarks/export.py --trace profile.nsys.sqlite --repeats 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from workbench.export import export_run
from workbench.imports import import_traces
from workbench.trace.registry import read_trace
from workbench.trace.store.bundle import open_bundle

FIXTURES = Path(os.environ.get("WORKBENCH_FIXTURES", "/work/shared/fixtures"))
FORMATS = {"perfetto": ".perfetto-trace", "chrome": ".json"}


def measure(trace: Path, repeats: int) -> dict[str, dict[str, float]]:
    """Per format: bytes, median write and read seconds, events read back."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (run,) = import_traces([trace], root)
        folder = open_bundle(run, root).local_files()
        times: dict[str, dict[str, list[float]]] = {f: {"write_s": [], "read_s": []} for f in FORMATS}
        result: dict[str, dict[str, float]] = {}
        for _ in range(repeats):
            for fmt, suffix in FORMATS.items():  # interleaved: each round writes and reads both
                out = root / f"export{suffix}"
                start = time.perf_counter()
                summary = export_run(folder, fmt, out)
                times[fmt]["write_s"].append(time.perf_counter() - start)
                start = time.perf_counter()
                events = len(read_trace(out).events)
                times[fmt]["read_s"].append(time.perf_counter() - start)
                result[fmt] = {"bytes": summary["bytes"], "events_written": summary["events"],
                               "events_read": events}
                out.unlink()
        for fmt in FORMATS:
            result[fmt].update({k: statistics.median(v) for k, v in times[fmt].items()})
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=FIXTURES / "kineto" / "resnet50_v100_train.pt.trace.json.gz")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    result = measure(args.trace, args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.trace.name}: medians of {args.repeats} interleaved rounds")
    print(f"{'format':10} {'MB':>8} {'write s':>8} {'read s':>8} {'events':>8}")
    for fmt, r in result.items():
        print(f"{fmt:10} {r['bytes'] / 1e6:8.1f} {r['write_s']:8.2f} {r['read_s']:8.2f} {r['events_read']:8,}")
    p, c = result["perfetto"], result["chrome"]
    print(f"perfetto / chrome: size {p['bytes'] / c['bytes']:.2f}x, write {p['write_s'] / c['write_s']:.2f}x, "
          f"read {p['read_s'] / c['read_s']:.2f}x")


if __name__ == "__main__":
    main()
