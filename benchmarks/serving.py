"""Serving benchmark: a rate sweep against a real vLLM CPU server under AIPerf, and the workbench's own overhead.

One engine (vLLM's CPU build from `make serving`, serving the default 2-layer Llama) for the whole run:

1. **Sweep**: one serving run over `--rates` (Poisson arrivals, `--requests` each): per rate the request and
   output-token throughput, TTFT and TPOT percentiles and goodput under `--slo`; then the knee and the highest
   rate that meets the SLO (`workbench.serving.metrics.sweep_summary`).
2. **Overhead**: the same closed-loop load (`--concurrency`, `--overhead-requests`) run by AIPerf alone and through
   `workbench serve` (its /metrics sampling every `--metrics-period` s and its recording of the results),
   interleaved in `--pairs` pairs (AB, BA, ...); the medians of output tokens/s and the median of the pairs'
   ratios; and what the sampling costs the server directly: the time of one /metrics scrape over the period,
   the share of a core it can take at most. The workbench's sampling must not change the engine's throughput by
   more than 3%. On two cores a load's throughput moves by tens of percent from run to run (the engine, its API
   server and the generator's processes share them), more than the 3% the ratio should resolve: the scrape's
   cost is the bound that holds there.

    python benchmarks/serving.py                       # rates 2,4,8,16,32, 48 requests each; 5 overhead pairs
    python benchmarks/serving.py --rates 4,16 --pairs 3 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from workbench.serving.engine import Endpoint, EngineSettings, launched_engine
from workbench.serving.load import Load, aiperf_command, results_file, run_generator
from workbench.serving.metrics import latency_summary, parse_slo, sweep_summary
from workbench.serving.model_folder import DEFAULT_MODEL, model_folder
from workbench.serving.requests import read_requests
from workbench.serving.run import ProfileWindow, ServeOptions, serve
from workbench.serving.session import serving_dir

OVERHEAD_LIMIT = 0.03
"""The largest change of the engine's throughput the workbench's sampling may cause."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2,4,8,16,32")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--slo", default="ttft=50ms,tpot=5ms")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--overhead-requests", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--metrics-period", type=float, default=0.5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    aiperf = str(serving_dir() / "aiperf" / "bin" / "aiperf")
    folder, name = model_folder(DEFAULT_MODEL, {})
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as work_dir:
        work = Path(work_dir)
        settings = EngineSettings(python=str(serving_dir() / "vllm" / "bin" / "python"), model_dir=folder,
                                  served_name=name)
        started = time.monotonic()
        with launched_engine(settings, work / "engine.log") as endpoint:
            ready_s = time.monotonic() - started
            sweep = _sweep(endpoint, args, str(folder), aiperf, work)
            overhead = _overhead(endpoint, args, str(folder), aiperf, work)
    result = {"engine_ready_s": ready_s, "sweep": sweep, "overhead": overhead}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print(result, args)


def _sweep(endpoint: Endpoint, args: argparse.Namespace, tokenizer: str, aiperf: str, work: Path) -> dict[str, Any]:
    slo = parse_slo(args.slo)
    points = [Load(rate=float(r), requests=args.requests) for r in args.rates.split(",")]
    options = ServeOptions(tokenizer=tokenizer, program=aiperf, window=ProfileWindow("off"), slo=slo,
                           model={"name": endpoint.model})
    result = serve(endpoint, points, options, work / "sweep")
    summaries = [{"rate": p.load.rate, **p.summary} for p in result.points if p.summary]
    return {"points": summaries, **sweep_summary(summaries)}


def _overhead(endpoint: Endpoint, args: argparse.Namespace, tokenizer: str, aiperf: str,
              work: Path) -> dict[str, Any]:
    """Output tokens/s of the same load, AIPerf alone and through the workbench, interleaved."""
    load = Load(concurrency=args.concurrency, requests=args.overhead_requests)
    options = ServeOptions(tokenizer=tokenizer, program=aiperf, window=ProfileWindow("off"),
                           metrics_period_s=args.metrics_period, model={"name": endpoint.model})
    alone: list[float] = []
    workbench: list[float] = []

    def run_alone(pair: int) -> None:
        out = work / f"alone-{pair}"
        run_generator(aiperf_command(aiperf, endpoint, load, tokenizer, out), out, load.timeout_s)
        alone.append(latency_summary(read_requests(results_file(out, "aiperf")).table)["output_token_throughput"])

    def run_workbench(pair: int) -> None:
        result = serve(endpoint, [load], options, work / f"workbench-{pair}")
        workbench.append(result.points[0].summary["output_token_throughput"])

    for pair in range(args.pairs):  # AB, BA, AB...: neither arm always runs first
        for arm in ((run_alone, run_workbench) if pair % 2 == 0 else (run_workbench, run_alone)):
            arm(pair)
    ratios = [w / a for w, a in zip(workbench, alone, strict=True)]
    ratio = statistics.median(ratios)
    scrape_s = _scrape_seconds(endpoint)
    return {"alone_tok_s": alone, "workbench_tok_s": workbench, "median_alone": statistics.median(alone),
            "median_workbench": statistics.median(workbench), "pair_ratios": ratios, "ratio": ratio,
            "spread": (min(ratios), max(ratios)), "scrape_ms": scrape_s * 1e3,
            "scrape_share": scrape_s / args.metrics_period, "within_limit": scrape_s / args.metrics_period
            <= OVERHEAD_LIMIT}


def _scrape_seconds(endpoint: Endpoint, count: int = 40) -> float:
    """The median time one /metrics scrape takes, server and client together: a bound on the server time the
    sampler takes per period (the API server renders the page; the engine does not see it)."""
    with httpx.Client(timeout=5.0) as client:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            client.get(f"{endpoint.url}/metrics").raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _print(result: dict[str, Any], args: argparse.Namespace) -> None:
    sweep = result["sweep"]
    print(f"engine ready in {result['engine_ready_s']:.0f} s; SLO {args.slo}")
    print(f"{'rate':>6} {'req/s':>7} {'tok/s':>8} {'TTFT p50':>9} {'p90':>7} {'p99':>7} {'TPOT p50':>9} {'p99':>7} "
          f"{'goodput':>8}")
    for p in sweep["points"]:
        print(f"{p['rate']:>6g} {p['request_throughput']:>7.2f} {p['output_token_throughput']:>8.1f} "
              f"{p['ttft']['p50']:>9.2f} {p['ttft']['p90']:>7.2f} {p['ttft']['p99']:>7.2f} {p['tpot']['p50']:>9.3f} "
              f"{p['tpot']['p99']:>7.3f} {p['goodput']:>8.2f}")
    print(f"knee: rate {sweep['knee']}; highest rate meeting the SLO: {sweep['max_load_meeting_slo']}; "
          f"Pareto: {sweep['pareto']}")
    o = result["overhead"]
    print(f"overhead (concurrency {args.concurrency}, {args.overhead_requests} requests, {args.pairs} pairs "
          f"interleaved): AIPerf alone {o['median_alone']:.1f} tok/s, through the workbench "
          f"{o['median_workbench']:.1f} tok/s (ratio of the medians {o['median_workbench'] / o['median_alone']:.3f}); "
          f"median of the pairs' ratios {o['ratio']:.3f} "
          f"(each: {', '.join(f'{r:.3f}' for r in o['pair_ratios'])})")
    print(f"  one /metrics scrape takes {o['scrape_ms']:.2f} ms of the API server, every {args.metrics_period:g} s: "
          f"at most {o['scrape_share']:.2%} of one core ({'within' if o['within_limit'] else 'OUTSIDE'} the "
          f"{OVERHEAD_LIMIT:.0%} budget); the pairs' spread ({o['spread'][0]:.2f}-{o['spread'][1]:.2f}) is the "
          "run-to-run noise of a 2-core machine, which the throughput ratio cannot resolve below")


if __name__ == "__main__":
    main()
