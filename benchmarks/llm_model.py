"""LLM model benchmark: the analytical model's TTFT / TPOT against measured CPU runs of tiny-gpt.

Predictions come from `workbench.llm.perf_model` with this machine's measured CPU peaks
(`workbench.hardware.local_cpu_spec(1)`: square-matmul FLOP/s and copy bandwidth, 1 torch thread).
Measurements, with torch threads = 1, every scenario interleaved with the others in each repeat,
medians over the repeats:

- `prefill_ms`: one plain forward of `tiny-gpt` over the prompt (`load_model("tiny-gpt", **overrides)`,
  no cache, logits of every position), the model's prefill with `prefill_logits="all"`;
- `ttft_ms` and `tpot_ms`: `workbench.llm.generate.generate` (prefill into a KV cache, then `new − 1`
  greedy decode steps); TPOT is the mean decode step of a run (the model predicts the mean).

Checks of the counts (exact, no timing): the predicted prefill matmul FLOPs against torch's
`FlopCounterMode`, attention apart (torch counts SDPA over the unmasked square, or not at all for the
CPU flash kernel; the model counts the causal pairs), and the predicted KV cache against the bytes
`generate` allocated. Then the prediction error per metric, and where the model
is off and why: the GEMM efficiency torch reaches at the model's own matmul shapes (against the probe's
square-matmul peak) and the prefill error once it is folded in; the median TPOT residual (measured −
predicted), the fixed host cost of a decode step (Python, op dispatch) that a roofline has no term for,
and the TPOT error with it as the model's `overhead_s`; the load average while measuring.

    python benchmarks/llm_model.py                                  # batch 1,4,16 × prompt 32,128 × new 32
    python benchmarks/llm_model.py --batch 1,8 --prompt 64 --new 64 --set kv_heads=2 --json
    python benchmarks/llm_model.py --html llm-model.html            # the view, measured against predicted
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError
from workbench.llm import perf_model as pm

GEMM_REPEATS = 20
TOP_OPS = 5


def _parse_set(items: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            values[key] = json.loads(text)
        except json.JSONDecodeError:
            values[key] = text
    return values


def _ms(ns: float) -> float:
    return ns / 1e6


def measure(model: Any, loaded: Any, scenarios: list[tuple[int, int, int]], repeats: int) -> dict[tuple, dict]:
    """Per scenario: plain-forward ms, generate TTFT ms and mean TPOT ms of each repeat, and the KV-cache
    bytes generate allocated. Scenarios are interleaved, in a rotated order each repeat."""
    import torch

    from workbench.llm.generate import generate

    prompts = {s: loaded.make_inputs(s[0], s[1])[0] for s in scenarios}
    samples: dict[tuple, dict] = {s: {"prefill_ms": [], "ttft_ms": [], "tpot_ms": []} for s in scenarios}
    with torch.inference_mode():
        for s in scenarios:  # warm-up: allocator, oneDNN kernel selection
            model(prompts[s])
            generate(model, prompts[s], s[2])
        for r in range(repeats):
            for s in scenarios[r % len(scenarios):] + scenarios[:r % len(scenarios)]:
                start = time.perf_counter_ns()
                model(prompts[s])
                samples[s]["prefill_ms"].append(_ms(time.perf_counter_ns() - start))
                run = generate(model, prompts[s], s[2])
                samples[s]["ttft_ms"].append(_ms(run.times.ttft_ns))
                samples[s]["tpot_ms"].append(_ms(float(run.times.tpot_ns().mean())))
                samples[s]["kv_cache_bytes"] = run.kv_cache_bytes
                samples[s]["kv_context"] = run.context
    return samples


def flops_check(model: Any, loaded: Any, config: pm.LLMConfig, batch: int, prompt: int) -> dict[str, Any]:
    """Predicted prefill FLOPs against torch's FlopCounterMode for one plain forward, attention apart:
    FlopCounterMode counts SDPA over the whole T×T square where it has a formula for the op torch ran
    (none for the CPU flash kernel, which then counts 0), the model counts the causal pairs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        model(loaded.make_inputs(batch, prompt)[0])
    by_op = {str(op): float(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    counted_attention = sum(n for op, n in by_op.items() if "attention" in op)
    counted_other = sum(by_op.values()) - counted_attention
    cost = pm.forward_cost(config, batch, prompt, logits="all")
    predicted_other = cost.flops - cost.flops_by_part["attention"]
    per_pair = cost.flops_by_part["attention"] / (batch * pm.attended_pairs(prompt, 0))
    return {"batch": batch, "prompt": prompt, "ops": by_op,
            "predicted_matmul": predicted_other, "counted_matmul": counted_other,
            "matmul_rel_error": (predicted_other - counted_other) / counted_other,
            "predicted_attention_causal": cost.flops_by_part["attention"],
            "predicted_attention_square": per_pair * batch * prompt * prompt,
            "counted_attention": counted_attention}


def gemm_efficiency(config: pm.LLMConfig, rows: list[int], peak: float) -> list[dict[str, float]]:
    """Achieved FLOP/s of the model's largest matmul (the MLP's first layer, [M, d] × [d, F]) at each row
    count M, against the probe's peak: how far below the roofline's ceiling small GEMMs run here."""
    import torch
    import torch.nn.functional as F

    weight = torch.randn(config.ffn_hidden, config.d_model)
    bias = torch.randn(config.ffn_hidden)
    out = []
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, config.d_model)
            F.linear(x, weight, bias)
            times = []
            for _ in range(GEMM_REPEATS):
                start = time.perf_counter_ns()
                F.linear(x, weight, bias)
                times.append(time.perf_counter_ns() - start)
            seconds = statistics.median(times) / 1e9
            achieved = 2.0 * m * config.d_model * config.ffn_hidden / seconds
            out.append({"rows": m, "achieved_flops_per_s": achieved, "fraction_of_peak": achieved / peak})
    return out


MATMUL_OPS = frozenset({"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_int_mm"})
"""Ops whose self time is the matmul kernels (linear, matmul and einsum are wrappers around them)."""


def decode_breakdown(model: Any, loaded: Any, config: pm.LLMConfig, device: Any, batch: int, prompt: int,
                     new: int) -> dict[str, Any]:
    """One generation under torch.profiler: per decode step, the self time of matmul ops, of every other
    op, and the rest of the step (Python and framework code outside any op), against the model's predicted
    step, and the ops with the most self time. Events count when they start inside a `decode N` phase
    label of `generate`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workbench.llm.generate import generate

    tokens = loaded.make_inputs(batch, prompt)[0]
    with torch.inference_mode():
        generate(model, tokens, new)  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run = generate(model, tokens, new)
    events = list(prof.events())
    steps = [e.time_range for e in events if e.name.startswith("decode ")]

    def in_decode(event: Any) -> bool:
        return any(r.start <= event.time_range.start < r.end for r in steps)
    ops = [e for e in events if e.name.startswith("aten::") and in_decode(e)]
    top_level = [e for e in ops if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    n = max(len(steps), 1)
    wall_ms = sum(run.times.step_ns[1:]) / 1e6 / n
    matmul_ms = sum(e.self_cpu_time_total for e in ops if e.name in MATMUL_OPS) / 1e3 / n
    other_ms = sum(e.self_cpu_time_total for e in ops if e.name not in MATMUL_OPS) / 1e3 / n
    by_name: dict[str, list[float]] = {}
    for e in ops:
        entry = by_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += e.self_cpu_time_total / 1e3
    top = sorted(by_name.items(), key=lambda item: -item[1][1])[:TOP_OPS]
    predicted = pm.predicted_decode_steps(config, device, batch, prompt, new)
    cost = pm.forward_cost(config, batch, 1, prompt + new // 2)
    _, peak = device.peak(config.dtype)
    return {"batch": batch, "prompt": prompt, "new": new, "step_ms": wall_ms, "matmul_ms": matmul_ms,
            "other_ops_ms": other_ms, "outside_ops_ms": wall_ms - matmul_ms - other_ms,
            "op_calls_per_step": len(top_level) / n, "predicted_step_ms": predicted["time_per_step_s"] * 1e3,
            "predicted_compute_ms": cost.flops / peak * 1e3,
            "top_ops": [{"name": name, "calls_per_step": calls / n, "ms_per_step": ms / n}
                        for name, (calls, ms) in top]}


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache this Linux machine reports (sysfs), or None."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1024, "M": 1024**2}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KM")) * scale)
        except ValueError:
            continue
    return max(sizes) if sizes else None


def perf_config(model_config: dict[str, Any]) -> pm.LLMConfig:
    """The perf model's config of a loaded tiny-gpt: its config keys, those left None (the model's
    defaults) left to the perf model's own, which are the same (kv_heads = heads, MLA latent 4·head_dim)."""
    values = {k: v for k, v in model_config.items() if k in pm.CONFIG_KEYS and v is not None}
    return pm.make_config({"preset": "tiny-gpt", **values}, origin="tiny-gpt config")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from workbench.hardware import local_cpu_spec
    from workbench.models import load_model

    torch.set_num_threads(1)
    overrides = _parse_set(args.set)
    loaded = load_model("tiny-gpt", **overrides)
    model = loaded.module.eval()
    config = perf_config(loaded.config)
    device = local_cpu_spec(1)
    scenarios = list(itertools.product(pm.parse_sweep(args.batch, "--batch"), pm.parse_sweep(args.prompt, "--prompt"),
                                       pm.parse_sweep(args.new, "--new")))
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    samples = measure(model, loaded, scenarios, args.repeats)
    measure_s = time.perf_counter() - started
    load = {"before": load_before, "after": os.getloadavg()[0], "cores": os.cpu_count()}

    rows, checks = [], []
    for batch, prompt, new in scenarios:
        projected = pm.project(config, device, batch=batch, prompt=prompt, new=new, prefill_logits="all")
        measured = samples[(batch, prompt, new)]
        for metric, predicted, bound in (("prefill_ms", projected["ttft_ms"], projected["prefill"]["bound"]),
                                         ("ttft_ms", projected["ttft_ms"], projected["prefill"]["bound"]),
                                         ("tpot_ms", projected["tpot_ms"], projected["decode"]["bound"])):
            rows.append({"metric": metric, "unit": "ms", "batch": batch, "prompt": prompt, "new": new,
                         "predicted": predicted, "measured": statistics.median(measured[metric]),
                         "spread": float(np.subtract(*np.percentile(measured[metric], [75, 25]))), "bound": bound})
        checks.append({"batch": batch, "context": measured["kv_context"],
                       "predicted": pm.kv_bytes(config, batch, measured["kv_context"]),
                       "allocated": measured["kv_cache_bytes"]})
    errors = pm.prediction_errors(pd.DataFrame(rows))

    _, peak = device.peak(config.dtype)
    rows_m = sorted({b * p for b, p, _ in scenarios} | {b for b, _, _ in scenarios})
    gemm = gemm_efficiency(config, rows_m, peak)
    tpot = errors[errors["metric"] == "tpot_ms"]
    residual_ms = float((tpot["measured"] - tpot["predicted"]).median())
    calibrated = []
    for _, row in tpot.iterrows():
        again = pm.project(config, device, batch=int(row["batch"]), prompt=int(row["prompt"]), new=int(row["new"]),
                           prefill_logits="all", overhead_s=max(residual_ms, 0.0) / 1e3)
        calibrated.append((again["tpot_ms"] - row["measured"]) / row["measured"])
    efficiency = {g["rows"]: g["fraction_of_peak"] for g in gemm}
    prefill = errors[errors["metric"] == "prefill_ms"]
    adjusted = [(row["predicted"] / efficiency[int(row["batch"] * row["prompt"])] - row["measured"]) / row["measured"]
                for _, row in prefill.iterrows()]
    return {
        "config": config.to_dict(), "device": pm.device_summary(device, config.dtype),
        "threads": 1, "repeats": args.repeats, "measure_s": measure_s, "weight_bytes": pm.weight_bytes(config),
        "last_level_cache_bytes": last_level_cache_bytes(),
        "errors": errors.to_dict(orient="records"),
        "flops_check": flops_check(model, loaded, config, scenarios[-1][0], scenarios[-1][1]),
        "kv_check": checks,
        "tpot_overhead": {"residual_ms": residual_ms, "calibrated_rel_error": [float(e) for e in calibrated]},
        "prefill_gemm_adjusted_rel_error": [float(e) for e in adjusted],
        "gemm_efficiency": gemm, "load_average": load,
        "decode_breakdown": decode_breakdown(model, loaded, config, device, scenarios[-1][0], scenarios[-1][1],
                                             min(scenarios[-1][2], 16)),
    }


def explain(result: dict[str, Any]) -> list[str]:
    """Where the model is off and why, from the numbers of this run."""
    errors = pd.DataFrame(result["errors"])
    lines = []
    peak = result["device"]["peak_flops_per_s"]
    gemm = pd.DataFrame(result["gemm_efficiency"])
    prefill = errors[errors["metric"] == "prefill_ms"]
    decode = errors[errors["metric"] == "tpot_ms"]
    lines.append(
        f"prefill: measured / predicted = {prefill['ratio'].min():.2f}–{prefill['ratio'].max():.2f} "
        f"(median {prefill['ratio'].median():.2f}). The roofline ceiling is the probe's square-matmul peak "
        f"({peak / 1e9:.1f} GFLOP/s fp32, 1 thread); the model's own MLP GEMM ([M, {result['config']['d_model']}] × "
        f"[{result['config']['d_model']}, {result['config']['ffn_hidden']}]) reaches "
        + ", ".join(f"{f:.0%} at M={m}" for m, f in zip(gemm["rows"], gemm["fraction_of_peak"], strict=True))
        + " of it here, so a compute-bound prefill comes out optimistic by about the inverse; the ops the FLOP "
          "count leaves out (LayerNorm, GELU, softmax, residual adds, the causal mask) add the rest.")
    if (gemm["fraction_of_peak"] > 1.0).any():
        lines.append("peak: the model's GEMM beats the probe's cached peak at some M: that probe ran under load or "
                     "at a size that misses the cache; `local_cpu_spec(1, force=True)` measures it again, and every "
                     "prediction here scales with it.")
    overhead = result["tpot_overhead"]
    lines.append(
        "prefill with the GEMM efficiency at its M = batch·prompt folded in (predicted / efficiency): errors "
        + ", ".join(f"{e:+.0%}" for e in result["prefill_gemm_adjusted_rel_error"]) + ".")
    lines.append(
        f"decode: the predicted steps ({decode['predicted'].min():.3f}–{decode['predicted'].max():.3f} ms) are a "
        f"memory-bound roofline (the weights once per step) with no per-step term; measured steps run "
        f"{decode['measured'].min():.3f}–{decode['measured'].max():.3f} ms. The median residual, "
        f"{overhead['residual_ms']:.3f} ms per step, is the host cost of a step: Python and the dispatch of "
        f"~{result['decode_breakdown']['op_calls_per_step']:.0f} op calls (profiled below), plus small GEMMs far "
        "below the peak, none of which a roofline counts. With it as `overhead_s` the TPOT errors become "
        + ", ".join(f"{e:+.0%}" for e in overhead["calibrated_rel_error"])
        + " (in-sample: the overhead is fitted on the same runs).")
    b = result["decode_breakdown"]
    lines.append(
        f"decode step profiled (torch.profiler, batch {b['batch']}, prompt {b['prompt']}): {b['step_ms']:.3f} ms = "
        f"matmul ops {b['matmul_ms']:.3f} ms (the model's compute term {b['predicted_compute_ms']:.3f} ms: they "
        f"run at {b['predicted_compute_ms'] / b['matmul_ms']:.0%} of the probe's peak) + "
        f"{b['op_calls_per_step']:.0f} other op calls {b['other_ops_ms']:.3f} ms (norms, GELU, softmax, cache "
        f"writes, views, argmax: no FLOPs in the model, only bytes) + {b['outside_ops_ms']:.3f} ms outside any op "
        f"(Python); the model predicts {b['predicted_step_ms']:.3f} ms. The profiler adds a few µs per op. Most "
        "self time per step: " + ", ".join(f"{o['name']} {o['ms_per_step']:.3f} ms ({o['calls_per_step']:.0f} calls)"
                                           for o in b["top_ops"])
        + (" (aten::bmm is the cached attention: batch × heads GEMVs of one query row each, far below the GEMM "
           "peak)." if any(o["name"] == "aten::bmm" for o in b["top_ops"]) else "."))
    cache = result["last_level_cache_bytes"]
    if cache and cache >= result["weight_bytes"]:
        lines.append(
            f"memory: the weights ({result['weight_bytes'] / 2**20:.1f} MiB) fit in this CPU's largest cache "
            f"({cache / 2**20:.0f} MiB), so decode reads them from cache, not at the DRAM copy bandwidth the "
            "roofline uses: the memory term of a step is pessimistic, and it is small next to the overhead.")
    ttft = errors[errors["metric"] == "ttft_ms"]
    lines.append(
        f"TTFT (generate's prefill) against the plain forward: median {np.median(ttft['measured'].to_numpy()):.2f} "
        f"vs {np.median(prefill['measured'].to_numpy()):.2f} ms: the same forward plus the cache writes and the "
        "argmax, which the model counts as bytes only.")
    flops = result["flops_check"]
    attention = (f"FlopCounterMode counted {flops['counted_attention'] / 1e6:.2f} MFLOP of attention (it has no "
                 "formula for the CPU flash-attention op torch ran)" if not flops["counted_attention"] else
                 f"attention: FlopCounterMode {flops['counted_attention'] / 1e6:.2f} MFLOP (the square)")
    kv_ok = all(c["predicted"] == c["allocated"] for c in result["kv_check"])
    lines.append(
        f"counts: prefill matmul FLOPs (batch {flops['batch']}, prompt {flops['prompt']}) predicted "
        f"{flops['predicted_matmul'] / 1e9:.6f} GFLOP, FlopCounterMode {flops['counted_matmul'] / 1e9:.6f} "
        f"({flops['matmul_rel_error']:+.2%}); attention predicted {flops['predicted_attention_causal'] / 1e6:.2f} "
        f"MFLOP causal ({flops['predicted_attention_square'] / 1e6:.2f} over the square), {attention}. KV cache: "
        + ("predicted = allocated in every scenario." if kv_ok else "predicted ≠ allocated: " + "; ".join(
            f"batch {c['batch']}: {c['predicted']:.0f} vs {c['allocated']}" for c in result["kv_check"])))
    load = result["load_average"]
    if max(load["before"], load["after"]) > 0.5 * (load["cores"] or 1):
        lines.append(f"noise: the load average was {load['before']:.1f} → {load['after']:.1f} on {load['cores']} "
                     "cores while measuring (other processes): measured times are inflated and spread (IQR column); "
                     "rerun on a quiet machine for the model's own error.")
    return lines


def print_report(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 140)
    d, c = result["device"], result["config"]
    attention = f"MLA latent {c['kv_latent']}" if c["attention"] == "mla" else f"{c['attention']}, {c['kv_heads']} kv"
    console.print(f"tiny-gpt {c['layers']} layers, d={c['d_model']}, {c['heads']} heads ({attention}), {c['dtype']} on "
                  f"{d['name']} (measured: {d['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, "
                  f"{d['memory_bw_bytes_per_s'] / 1e9:.1f} GB/s), 1 thread, {result['repeats']} interleaved repeats, "
                  f"medians ({result['measure_s']:.1f} s measuring)", highlight=False)
    table = Table(title="predicted vs measured (error = (predicted − measured) / measured)", title_justify="left")
    for column in ("metric", "batch", "prompt", "new", "predicted ms", "measured ms", "IQR ms", "error", "bound"):
        table.add_column(column, justify="left" if column in ("metric", "bound") else "right")
    for row in result["errors"]:
        table.add_row(row["metric"], str(row["batch"]), str(row["prompt"]), str(row["new"]),
                      f"{row['predicted']:.3f}", f"{row['measured']:.3f}", f"{row['spread']:.3f}",
                      f"{row['rel_error']:+.0%}", row["bound"])
    console.print(table)
    summary = Table(title="error per metric", title_justify="left")
    for column in ("metric", "median error", "min", "max", "median measured/predicted"):
        summary.add_column(column, justify="left" if column == "metric" else "right")
    errors = pd.DataFrame(result["errors"])
    for metric, group in errors.groupby("metric", sort=False):
        summary.add_row(metric, f"{group['rel_error'].median():+.0%}", f"{group['rel_error'].min():+.0%}",
                        f"{group['rel_error'].max():+.0%}", f"{group['ratio'].median():.2f}")
    console.print(summary)
    console.print("[bold]where the model is off, and why[/]")
    for line in explain(result):
        console.print(f"- {line}", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,4,16", help="batch sizes (1,4,16 or 1..16)")
    parser.add_argument("--prompt", default="32,128", help="prompt lengths")
    parser.add_argument("--new", default="32", help="generated tokens per sequence")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (medians)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="tiny-gpt config override, e.g. --set kv_heads=2")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--html", type=Path, default=None, help="write the view (KV cache, measured vs predicted)")
    args = parser.parse_args()
    try:
        result = run(args)
    except WorkbenchError as exc:
        raise SystemExit(f"error: {exc}") from None
    result["explanation"] = explain(result)
    if args.html:
        from workbench.report import write_report
        from workbench.views.llm_model import llm_model_view

        config = pm.LLMConfig(**result["config"])
        dtypes = tuple(dict.fromkeys((config.kv_dtype, *pm.KV_PRECISIONS)))
        layout = llm_model_view(pm.kv_cache_table(config, pm.default_contexts(config, low=16), kv_dtypes=dtypes),
                                pm.prediction_errors(pd.DataFrame(result["errors"])),
                                title="tiny-gpt on this CPU: the analytical model against measured runs")
        result["html"] = str(write_report(layout, args.html, title="workbench: LLM model vs measured"))
    if args.json:
        print(json.dumps(result, indent=2, default=float))
    else:
        print_report(result)
        if args.html:
            print(f"view: {result['html']}")


if __name__ == "__main__":
    main()
