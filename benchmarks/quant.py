"""Quantization lab benchmark: what a full sensitivity scan costs against one evaluation, and the recipes' table.

For each trained built-in (tiny-gpt on the Python standard library, convnet on scikit-learn's digits), in one run:

1. the time of one held-out evaluation of the fp32 model (perplexity over the held-out windows, top-1 over the
   held-out digits) and of one calibration forward;
2. the time of the per-layer scan, every Linear × every format, with the held-out metric at each point
   (`workbench.quant.sensitivity.layer_sensitivity`), printed as a ratio to the single evaluation;
3. the recipes side by side (`workbench.quant.lab.compare_recipes`): output SQNR, the held-out metric, weight and
   KV-cache bytes, the time projected on `--device`, and the CPU latency measured (interleaved medians) where a
   real kernel exists.

    python benchmarks/quant.py                      # both models, the lab's default formats and recipes
    python benchmarks/quant.py --models convnet --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from workbench.quant import lab
from workbench.quant.sensitivity import layer_sensitivity
from workbench.quiet import quiet


def _timed(fn, repeats: int) -> tuple[Any, float]:
    """`fn()`'s last result and its median wall time over `repeats` calls, in seconds."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def bench_model(name: str, formats: list[str], device: str, repeats: int) -> dict[str, Any]:
    """One model's figures: evaluation and scan times, and its recipes' table."""
    task = lab.quant_task(name)
    with torch.no_grad():
        _, forward_s = _timed(lambda: task.module(*task.inputs), repeats)
        metric, evaluate_s = _timed(lambda: task.evaluate(task.module), repeats)
    start = time.perf_counter()
    layers = layer_sensitivity(task.module, task.inputs, formats, evaluate=task.evaluate)
    scan_s = time.perf_counter() - start
    recipes = lab.compare_recipes(task, device=device, strict=False)  # a default recipe a model cannot take says why
    points = len(layers)
    return {
        "model": name, "about": task.about, "metric": task.metric, "fp32_metric": metric,
        "forward_ms": forward_s * 1e3, "evaluate_s": evaluate_s, "scan_s": scan_s, "scan_points": points,
        "scan_over_evaluate": scan_s / evaluate_s, "per_point_over_evaluate": scan_s / points / evaluate_s,
        "recipes": recipes.to_dict("records"),
    }


def print_model(result: dict[str, Any]) -> None:
    print(f"\n{result['about']}")
    print(f"  one calibration forward {result['forward_ms']:.2f} ms; one fp32 {result['metric']} evaluation "
          f"{result['evaluate_s']:.3f} s ({result['fp32_metric']:.4g})")
    print(f"  per-layer scan: {result['scan_points']} points (layers × formats) in {result['scan_s']:.1f} s = "
          f"{result['scan_over_evaluate']:.1f}x one evaluation ({result['per_point_over_evaluate']:.2f}x per point)")
    print(f"  {'recipe':72} {'SQNR dB':>8} {'metric':>8} {'weights B':>10} {'KV B/tok':>9} {'proj µs':>8} "
          f"{'CPU ms':>8}  kernel")
    for r in result["recipes"]:
        kv = "-" if r["kv_bytes_per_token"] is None or r["kv_bytes_per_token"] != r["kv_bytes_per_token"] \
            else f"{r['kv_bytes_per_token']:.0f}"
        projected = "-" if r["projected_us"] is None or r["projected_us"] != r["projected_us"] \
            else f"{r['projected_us']:.3f}"
        measured = "-" if r["measured_ms"] != r["measured_ms"] else f"{r['measured_ms']:.3f}"
        if r['sqnr_db'] != r['sqnr_db']:  # a recipe this model cannot take
            print(f"  {r['recipe'][:72]:72} {r['kernel']}")
            continue
        print(f"  {r['recipe'][:72]:72} {r['sqnr_db']:8.1f} {r['metric']:8.4g} {int(r['weight_bytes']):10,} {kv:>9} "
              f"{projected:>8} {measured:>8}  {r['kernel']}")
    reference = result["recipes"][0]["measured_ms"]
    for r in result["recipes"][1:]:
        if r["measured_ms"] == r["measured_ms"]:
            print(f"  measured {r['recipe']}: {reference / r['measured_ms']:.2f}x the fp32 speed (medians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-gpt,convnet", help="trained built-ins to benchmark")
    parser.add_argument("--formats", default=",".join(lab.DEFAULT_FORMATS), help="formats of the per-layer scan")
    parser.add_argument("--device", default="b200", help="device the recipes' time is projected on")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of a single evaluation")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)
    results = [bench_model(name, args.formats.split(","), args.device, args.repeats)
               for name in args.models.split(",")]
    if args.json:
        print(json.dumps(results, default=float, indent=1))
        return
    for result in results:
        print_model(result)


if __name__ == "__main__":
    main()
