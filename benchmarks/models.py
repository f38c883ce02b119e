"""Model sources benchmark: load time per source, then `eager` vs `compile` vs `ort` on each model in one run.

For every source (a built-in, reduced Hugging Face architectures from configs, torchvision and timm models, an
ONNX file) it times `load_model` (build or load plus seeded weights), then runs one experiment per model with
the variants interleaved in every benchmark round (`run_experiment`, no profiler): the first call of each
variant (preparation: compile, ONNX export and session creation) and its median latency, and the ratio of each
variant's median to eager's on the same model. torch threads = 1 so the runs are steady on a small machine.

    python benchmarks/models.py                        # all sources, variants eager,compile,ort
    python benchmarks/models.py --only hf-config:llama-3-8b --variants eager,ort,ort-int8 --json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.errors import WorkbenchError
from workbench.experiment import ExperimentSettings, run_experiment
from workbench.models.registry import load_model

SOURCES: dict[str, dict[str, Any]] = {
    "tiny-gpt": {},
    "hf-config:llama-3-8b": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512,
                             "vocab": 4096},
    "hf-config:bert-base": {"layers": 2, "hidden": 256, "heads": 4, "intermediate": 512, "vocab": 4096},
    "hf-config:vit-base": {"layers": 2, "hidden": 256, "heads": 4, "intermediate": 512},
    "torchvision:resnet50": {},
    "timm:mobilenetv3_small_100": {},
}
"""Model references and their `--set` overrides (reduced where the full model would take minutes per round)."""
BATCH = {"tiny-gpt": 4, "hf-config:llama-3-8b": 2, "hf-config:bert-base": 2}
"""Batch per model (1 where not listed); sequence models run at their default sequence length."""


def onnx_file(folder: Path) -> str:
    """An `onnx:` reference: the built-in mlp exported to an ONNX file in `folder`."""
    import torch

    loaded = load_model("mlp")
    path = folder / "mlp.onnx"
    torch.onnx.export(loaded.module, loaded.make_inputs(4), str(path), input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    return f"onnx:{path}"


def measure(ref: str, overrides: dict[str, Any], variants: tuple[str, ...], iterations: int,
            root: Path) -> list[dict[str, Any]]:
    """Load `ref` once to time it, then its experiment: one row per variant."""
    start = time.perf_counter()
    load_model(ref, **overrides)
    load_s = time.perf_counter() - start
    onnx = ref.startswith("onnx:")
    # an ONNX file runs only on onnxruntime; its reference is ORT without graph optimizations
    wanted = ("ort-noopt", *(v for v in variants if v.startswith("ort") and v != "ort-noopt")) if onnx else variants
    settings = ExperimentSettings(model=ref, variants=wanted, batch=BATCH.get(ref, 1), profile=False,
                                  warmup=2, iterations=iterations, threads=1, model_overrides=overrides)
    start = time.perf_counter()
    result = run_experiment(settings, root=root)
    total_s = time.perf_counter() - start
    rows = []
    base = next((r.p50_ms for r in result.runs if r.variant == ("ort-noopt" if onnx else "eager") and r.p50_ms),
                None)
    for run in result.runs:
        rows.append({"source": ref, "load_s": load_s, "variant": run.variant, "status": run.status,
                     "first_call_s": run.first_call_s, "p50_ms": run.p50_ms, "p99_ms": run.p99_ms,
                     "vs_eager": (base / run.p50_ms) if base and run.p50_ms else None,
                     "experiment_s": total_s, "weights": run.weights,
                     "error": (run.error or "")[:80] or None})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="benchmark only this source (repeatable)")
    parser.add_argument("--variants", default="eager,compile,ort")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    variants = tuple(v for v in args.variants.split(",") if v)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="wb-models-") as scratch:
        sources = dict(SOURCES)
        sources[onnx_file(Path(scratch))] = {}
        for ref, overrides in sources.items():
            if args.only and not any(ref.startswith(only) for only in args.only):
                continue
            try:
                rows += measure(ref, overrides, variants, args.iterations, Path(scratch) / "traces")
            except WorkbenchError as exc:
                rows.append({"source": ref, "status": "failed", "error": str(exc)[:120]})
    table = pd.DataFrame(rows)
    if args.json:
        print(table.to_json(orient="records"))
        return
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.float_format",
                           "{:.3g}".format):
        print(table.drop(columns=["experiment_s"], errors="ignore").to_string(index=False))
    ok = table[table["status"] == "ok"]
    for variant in ("compile", "ort"):
        ratios = ok[ok["variant"] == variant].set_index("source")["vs_eager"].dropna()
        if not ratios.empty:
            print(f"{variant} vs eager (median latency ratio, >1 is faster): "
                  + ", ".join(f"{source} {ratio:.2f}x" for source, ratio in ratios.items()))


if __name__ == "__main__":
    main()
