"""`workbench serve`: profile an inference server under load, from each request down to the engine's steps and
kernels. It launches an engine (`--engine vllm`, in the Python environment `make serving` sets up) or attaches
to a running OpenAI-compatible server (`--url`), drives a load generator (AIPerf, or `vllm bench serve`) at
one load or a sweep (`--rate 1,2,4` or `--concurrency 1,4,16`), samples the engine's metrics and opens its
profiler for a window, and writes one bundle per load point (and an experiment for a sweep).

Exit codes: 0 every request of every point succeeded; 1 a point failed or some requests failed (what completed
is kept); 2 misuse, an engine that never became ready or died, a URL that is not an OpenAI-compatible server;
130 Ctrl-C. The engine and the generator are stopped however the command ends.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from workbench.cli.options import json_option, out_option, parse_overrides, set_option
from workbench.cli.render import err, errors, labelled, out, print_json, print_table
from workbench.errors import EXIT_PARTIAL, WorkbenchError
from workbench.views.text_tables import TextTable, cells

POINT_COLUMNS = ("load", "ok", "failed", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                 "E2E p99", "goodput/s", "run")


def _floats(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        values = tuple(float(item) for item in value.split(",") if item.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    if not values or any(not 0 < v < float("inf") for v in values):
        raise click.BadParameter("give positive, finite numbers, e.g. 1,2,4")
    return values


def _ints(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    numbers = _floats(ctx, param, value)
    if numbers is not None and any(n != int(n) for n in numbers):
        raise click.BadParameter("give whole numbers, e.g. 1,4,16")
    return None if numbers is None else tuple(int(n) for n in numbers)


@click.command()
@click.option("--engine", default="vllm", show_default=True, help="The engine to launch (vllm).")
@click.option("--engine-python", default=None, metavar="PATH",
              help="The Python of the engine's environment (default .serving/vllm/bin/python, from `make serving`; "
                   "$WORKBENCH_SERVING names another folder).")
@click.option("--url", default=None, metavar="URL",
              help="Attach to a running OpenAI-compatible server (any engine) instead of launching one.")
@click.option("--model", "model_ref", default=None, metavar="REF",
              help="hf:FOLDER (a save_pretrained folder), or hf-config:<preset> scaled with --set and saved with "
                   "random weights and a word-level tokenizer (default: a 2-layer Llama-3); with --url, the served "
                   "model's name (default: the first it lists).")
@set_option("Scale an hf-config: preset, e.g. --set layers=2 hidden=128.")
@click.option("--rate", default=None, callback=_floats, metavar="R[,R...]",
              help="Open loop: requests per second, or a sweep (1,2,4,8). Default 4.")
@click.option("--concurrency", default=None, callback=_ints, metavar="N[,N...]",
              help="Closed loop: requests in flight, or a sweep (1,4,16).")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), default="poisson", show_default=True,
              help="Arrivals of an open-loop load.")
@click.option("--requests", default=32, show_default=True, type=click.IntRange(1, 100_000),
              help="Requests per load point.")
@click.option("--isl", default=64, show_default=True, type=click.IntRange(1), help="Prompt tokens (mean).")
@click.option("--isl-stddev", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--osl", default=16, show_default=True, type=click.IntRange(1), help="Output tokens (mean).")
@click.option("--osl-stddev", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--sessions", default=None, type=click.IntRange(1),
              help="Multi-turn: this many conversations (AIPerf), each of --turns turns on average.")
@click.option("--turns", default=1.0, show_default=True, type=click.FloatRange(1))
@click.option("--shared-prefix", default=0, show_default=True, type=click.IntRange(0),
              help="Tokens of a system prompt every request shares (prefix-cache reuse).")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--generator", type=click.Choice(["aiperf", "vllm-bench"]), default="aiperf", show_default=True,
              help="The load generator: NVIDIA AIPerf, or `vllm bench serve` run with the engine's Python.")
@click.option("--aiperf", "aiperf_path", default=None, metavar="PATH",
              help="AIPerf's program (default .serving/aiperf/bin/aiperf, from `make serving`).")
@click.option("--tokenizer", default=None, metavar="PATH",
              help="The tokenizer folder the generator counts prompt tokens with (default: the served model's).")
@click.option("--profile-window", default=None, metavar="load|off|requests:N|seconds:S",
              help="When the engine's profiler records: the whole load (default when the workbench launches the "
                   "engine), the first N completed requests, S seconds, or off (default with --url).")
@click.option("--profile-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="With --url: the server's torch_profiler_dir, where its profiler writes (same machine).")
@click.option("--max-steps", default=2000, show_default=True, type=click.IntRange(1, 100_000),
              help="Engine steps the profiler records at most (bounds the trace and the engine's memory).")
@click.option("--metrics-period", default=0.5, show_default=True, type=click.FloatRange(0, 60),
              help="Seconds between samples of the engine's /metrics (0: none).")
@click.option("--slo", default=None, metavar="ttft=200ms,tpot=50ms",
              help="Service-level objectives for goodput (ttft, tpot, itl, e2e; ns, us, ms or s).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Where a launched engine listens.")
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="Its port (default: a free one).")
@click.option("--max-model-len", default=512, show_default=True, type=click.IntRange(16))
@click.option("--max-num-seqs", default=16, show_default=True, type=click.IntRange(1))
@click.option("--engine-arg", "engine_args", multiple=True, metavar="ARG",
              help="An argument passed to the engine as it is (repeat for more).")
@click.option("--ready-timeout", default=600.0, show_default=True, type=click.FloatRange(1),
              help="Seconds a launched engine has to become ready.")
@out_option
@json_option
def serve(engine: str, engine_python: str | None, url: str | None, model_ref: str | None, overrides: tuple[str, ...],
          rate: tuple[float, ...] | None, concurrency: tuple[int, ...] | None, arrival: str, requests: int, isl: int,
          isl_stddev: float, osl: int, osl_stddev: float, sessions: int | None, turns: float, shared_prefix: int,
          endpoint: str, generator: str, aiperf_path: str | None, tokenizer: str | None, profile_window: str | None,
          profile_dir: Path | None, max_steps: int, metrics_period: float, slo: str | None, host: str, port: int,
          max_model_len: int, max_num_seqs: int, engine_args: tuple[str, ...], ready_timeout: float,
          out_dir: str | None, as_json: bool) -> None:
    """Profile an inference server under load: per-request latencies, engine steps, metrics and kernels."""
    from workbench.paths import checked_root
    from workbench.serving import load as loads
    from workbench.serving.metrics import parse_slo
    from workbench.serving.run import ProfileWindow
    from workbench.serving.session import ServeRequest, run_serving

    if rate is not None and concurrency is not None:
        raise click.UsageError("give --rate or --concurrency, not both")
    with errors():
        try:
            bounds = parse_slo(slo) if slo else None
        except WorkbenchError as exc:
            raise click.BadParameter(str(exc), param_hint="--slo") from None
        shape = {"requests": requests, "arrival": arrival, "isl": isl, "isl_stddev": isl_stddev, "osl": osl,
                 "osl_stddev": osl_stddev, "sessions": sessions, "turns": turns, "shared_prefix": shared_prefix,
                 "endpoint": endpoint, "timeout_s": max(600.0, requests * 10.0)}
        points = ([loads.Load(concurrency=c, **shape) for c in concurrency] if concurrency else
                  [loads.Load(rate=r, **shape) for r in (rate or (4.0,))])
        request = ServeRequest(
            points=tuple(points), url=url, model=model_ref, overrides=parse_overrides(overrides), tokenizer=tokenizer,
            engine=engine, engine_python=engine_python, generator=generator, aiperf=aiperf_path,
            window=None if profile_window is None else ProfileWindow.parse(profile_window), profile_dir=profile_dir,
            max_steps=max_steps, metrics_period_s=metrics_period, slo=bounds, host=host, port=port,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs, engine_args=engine_args,
            ready_timeout_s=ready_timeout)
        root = checked_root(out_dir, writing=True)
        with _Status(as_json) as status:
            result = run_serving(request, root, status)
    _print_result(result, bounds, as_json)
    if result.failed:
        sys.exit(EXIT_PARTIAL)


class _Status:
    """A spinner on stderr with the latest progress line (none with --json)."""

    def __init__(self, quiet: bool) -> None:
        self._status = None if quiet else err.status("starting", spinner="dots")

    def __enter__(self) -> _Status:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def __call__(self, message: str) -> None:
        if self._status is not None:
            self._status.update(message)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _print_result(result: Any, slo: dict[str, int] | None, as_json: bool) -> None:
    """Each point's headline, the sweep's knee and SLO limit, and each point's failure, as text or JSON."""
    from workbench.serving.metrics import sweep_summary

    summaries = [{("rate" if p.load.rate is not None else "concurrency"): p.load.rate or p.load.concurrency,
                  **p.summary} for p in result.points if p.summary]
    sweep = sweep_summary(summaries) if len(summaries) > 1 else None
    if as_json:
        print_json({"experiment": result.experiment_id, "runs": [
            {"load": p.load.label, "run": p.run_id, "summary": p.summary, "error": p.error,
             "errors": p.errors, "warnings": list(p.warnings)} for p in result.points], "sweep": sweep})
        return
    rows = []
    for p in result.points:
        s = p.summary or {}
        rows.append(cells(p.load.label, s.get("ok"), s.get("failed"), s.get("request_throughput"),
                          s.get("output_token_throughput"), _ms((s.get("ttft") or {}).get("p50")),
                          _ms((s.get("ttft") or {}).get("p99")), _ms((s.get("tpot") or {}).get("p50")),
                          _ms((s.get("tpot") or {}).get("p99")), _ms((s.get("e2e") or {}).get("p99")),
                          s.get("goodput") if slo else None, p.run_id or "failed"))
    print_table(TextTable("serving (latencies in ms)", POINT_COLUMNS, tuple(rows), left=frozenset({"load", "run"})),
                no_wrap=("run",))
    if result.experiment_id:
        out.print(f"experiment {result.experiment_id}")
    if sweep:
        knee = ("no knee within the loads tried" if sweep["knee"] is None else
                f"knee at {sweep['load']} {sweep['knee']:g}")
        best = sweep["max_load_meeting_slo"]
        meets = ("give --slo to find the highest load that meets it" if not slo else
                 f"no {sweep['load']} tried meets the SLO" if best is None else
                 f"highest {sweep['load']} meeting the SLO: {best:g}")
        out.print(f"{knee}; {meets}")
    for p in result.points:
        if p.error:
            err.print(labelled("failed:", "red", f"{p.load.label}: {p.error}"))
        for message, count in sorted(p.errors.items(), key=lambda e: -e[1])[:3]:
            err.print(labelled("failed:", "red", f"{p.load.label}: {count} requests: {message[:300]}"))
        for warning in p.warnings:
            err.print(labelled("warning:", "yellow", f"{p.load.label}: {warning}"))
