"""Projection benchmark: how far `workbench project` is from measured times, on real traces and on this CPU.

- Fixtures (`/work/shared/fixtures`, or `$WORKBENCH_FIXTURES`): ResNet-50 training on a V100 (Kineto, 2021), its
  ops with recorded shapes (convolutions there lack the concrete inputs op_cost needs, so they are left out)
  projected onto a V100 SXM2 described from its datasheet (examples/accelerators/v100-sxm2-eager.yaml),
  each against the GPU time it launched.
- This CPU: tiny-gpt (batch 4, seq 128, random weights), one eager forward timed op by op, projected
  onto this CPU as the probe measures it (`workbench.hardware.cpu_probe`: matmul FLOP/s per dtype and copy
  bandwidth, with one torch thread by default: the probe and the forward use the same count) with the dispatch cost of
  an empty op, measured here, as its `op_overhead`. Each op's time is the shortest of 9 forwards (a shared CPU
  lends its time slices to others: the shortest call is the one nothing interrupted).

Printed per operator kind and in total: ops, measured and projected time, the error (projected / measured − 1)
and the median |ln(projected / measured)| per op. A projection is a roofline of perfect kernels, so it is expected
to be faster than measured (negative error) for work the kernels do not run at peak.

    python benchmarks/projection.py           # both
    python benchmarks/projection.py --json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from workbench.codesign.description import Description, from_device_spec, load_description
from workbench.codesign.graph import graph_from_trace
from workbench.codesign.validation import dispatch_overhead_s, projection_error, timed_forward_graph

FIXTURES = Path(os.environ.get("WORKBENCH_FIXTURES", "/work/shared/fixtures"))
V100 = Path(__file__).parents[1] / "examples" / "accelerators" / "v100-sxm2-eager.yaml"
"""The V100 of the ResNet-50 fixture, from its datasheet; eager PyTorch, so nothing fused."""


def fixture_errors() -> pd.DataFrame:
    """The ResNet-50 V100 fixture's ops against their launched GPU time."""
    from workbench.trace.registry import read_trace

    trace = read_trace(FIXTURES / "kineto" / "resnet50_v100_train.pt.trace.json.gz")
    graph = graph_from_trace(trace.df())
    return projection_error(graph, load_description(V100))


def cpu_errors(batch: int = 4, seq: int = 128, threads: int = 1) -> tuple[pd.DataFrame, Description]:
    """tiny-gpt timed op by op on this CPU, with `threads` torch threads, against its projection onto the CPU the
    probe measures with as many threads."""
    from dataclasses import replace

    import torch

    torch.set_num_threads(threads)
    from workbench.hardware.cpu_probe import local_cpu_spec
    from workbench.models.registry import load_model

    loaded = load_model("tiny-gpt")
    graph = timed_forward_graph(loaded.module, tuple(loaded.make_inputs(batch=batch, seq=seq)), repeats=9)
    cpu = replace(from_device_spec(local_cpu_spec()), op_overhead_s=dispatch_overhead_s(), fusion=False)
    return projection_error(graph, cpu), cpu


def _print(title: str, table: pd.DataFrame) -> None:
    print(title)
    print(table.to_string(index=False, formatters={
        "measured_ns": "{:,.0f}".format, "projected_ns": "{:,.0f}".format, "error": "{:+.1%}".format,
        "abs_log_error": "{:.2f}".format}))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the CPU run (default 1)")
    args = parser.parse_args()
    fixture = fixture_errors()
    cpu, description = cpu_errors(threads=args.threads)
    if args.json:
        print(json.dumps({"resnet50_v100": fixture.to_dict("records"), "cpu_tiny_gpt": cpu.to_dict("records"),
                          "cpu_op_overhead_s": description.op_overhead_s}, indent=2))
        return
    _print("ResNet-50 training on a V100 (fixture), ops with shapes, against launched GPU time", fixture)
    _print(f"tiny-gpt on this CPU ({description.name}; op overhead {description.op_overhead_s * 1e6:.1f} µs "
           "measured), against eager op times", cpu)


if __name__ == "__main__":
    main()
