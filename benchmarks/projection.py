"""Projection benchmark: how far `workbench project` is from measured times, on real traces and on this CPU.

- Fixtures (`/work/shared/fixtures`, or `$WORKBENCH_FIXTURES`), each op with recorded shapes projected against
  the GPU time it launched: ResNet-50 training on a V100 (Kineto, 2021; convolutions there lack the concrete
  inputs op_cost needs, so they are left out) onto a V100 SXM2 described from its datasheet
  (examples/accelerators/v100-sxm2-eager.yaml), and a job on an A100 (HTA's diff_control trace) onto an A100 SXM4
  with TF32 matmuls (examples/accelerators/a100-sxm4-40gb-tf32-eager.yaml). Each description's `op_floor` is the
  10th percentile of its trace's kernel durations.
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
EXAMPLES = Path(__file__).parents[1] / "examples" / "accelerators"
GPU_CASES = {"resnet50_v100": ("resnet50_v100_train.pt.trace.json.gz", "v100-sxm2-eager.yaml",
                               "ResNet-50 training on a V100 (fixture)"),
             "job_a100": ("diff_control.json.gz", "a100-sxm4-40gb-tf32-eager.yaml", "a job on an A100 (fixture)")}
"""Each GPU fixture, the description of its GPU (datasheet figures; eager PyTorch, so nothing fused) and a title."""


def fixture_errors(case: str) -> pd.DataFrame:
    """A GPU fixture's ops (`GPU_CASES`) against their launched GPU time."""
    from workbench.trace.registry import read_trace

    fixture, description, _ = GPU_CASES[case]
    graph = graph_from_trace(read_trace(FIXTURES / "kineto" / fixture).df())
    return projection_error(graph, load_description(EXAMPLES / description))


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
    gpus = {case: fixture_errors(case) for case in GPU_CASES}
    cpu, description = cpu_errors(threads=args.threads)
    if args.json:
        print(json.dumps({**{case: table.to_dict("records") for case, table in gpus.items()},
                          "cpu_tiny_gpt": cpu.to_dict("records"), "cpu_op_overhead_s": description.op_overhead_s},
                         indent=2))
        return
    for case, table in gpus.items():
        _print(f"{GPU_CASES[case][2]}, ops with shapes, against launched GPU time", table)
    _print(f"tiny-gpt on this CPU ({description.name}; op overhead {description.op_overhead_s * 1e6:.1f} µs "
           "measured), against eager op times", cpu)


if __name__ == "__main__":
    main()
