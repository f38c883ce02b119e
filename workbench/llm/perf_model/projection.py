"""Projections and tables of the LLM model: one scenario (`project`), the KV-cache table per attention
variant and precision, predicted-against-measured errors, sweeps, and everything `workbench llm-model`
reports (`llm_projection`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError
from workbench.hardware.device import DeviceSpec
from workbench.llm.perf_model.config import KV_PRECISIONS, MEMORY_FRACTION, MLA_LATENT_PER_HEAD_DIM, LLMConfig
from workbench.llm.perf_model.cost import forward_cost
from workbench.llm.perf_model.sizes import (
    kv_bytes,
    kv_bytes_per_token,
    max_context,
    memory_bytes,
    parameter_counts,
    weight_bytes,
)
from workbench.llm.perf_model.speculative import speculative_projection
from workbench.llm.perf_model.timing import crossover_batch, pass_time, predicted_decode_steps


def device_summary(device: DeviceSpec, dtype: str) -> dict[str, Any]:
    """The device figures a projection used."""
    peak_dtype, peak = device.peak(dtype)
    return {"name": device.name, "peak_dtype": peak_dtype, "peak_flops_per_s": peak,
            "memory_bw_bytes_per_s": device.memory_bw_bytes_per_s, "memory_bytes": device.memory_bytes,
            "ridge_point": peak / device.memory_bw_bytes_per_s, "measured": device.measured}


def project(c: LLMConfig, device: DeviceSpec, *, batch: int, prompt: int, new: int, overhead_s: float = 0.0,
            prefill_logits: str = "last", memory_fraction: float = MEMORY_FRACTION,
            prefill_chunk: int | None = None) -> dict[str, Any]:
    """One scenario: prefill and decode cost and time, TTFT, TPOT (mean step; None for new = 1),
    end-to-end time and tokens/s, the KV cache and memory of the whole sequence (prompt + new) and
    whether it fits, the crossover batch at that context and the longest context that fits at `batch`."""
    if min(batch, prompt, new) < 1:
        raise WorkbenchError(f"batch, prompt and new must be >= 1, got {batch}, {prompt}, {new}")
    prefill = forward_cost(c, batch, prompt, logits=prefill_logits)
    prefill_t = pass_time(prefill, device, c.dtype, overhead_s)
    decode = predicted_decode_steps(c, device, batch, prompt, new, overhead_s=overhead_s)
    decode.pop("step_s")
    context = prompt + new
    e2e_s = prefill_t["time_s"] + decode.get("time_s", 0.0)
    footprint = memory_bytes(c, batch, context, logits=prefill_logits, prefill_chunk=prefill_chunk)
    return {
        "batch": batch, "prompt": prompt, "new": new, "context": context,
        "prefill": {**prefill.to_dict(), **prefill_t, "time_ms": prefill_t["time_s"] * 1e3},
        "decode": decode,
        "ttft_ms": prefill_t["time_s"] * 1e3,
        "tpot_ms": decode["time_per_step_s"] * 1e3 if decode["steps"] else None,
        "e2e_ms": e2e_s * 1e3, "tokens_per_s": batch * new / e2e_s,
        "kv_bytes": kv_bytes(c, batch, context), "memory_bytes": footprint,
        "fits": None if not device.memory_bytes else footprint <= device.memory_bytes * memory_fraction,
        "beyond_max_seq": c.max_seq is not None and context > c.max_seq,
        "crossover_batch": crossover_batch(c, device, context),
        "max_context": max_context(c, device, batch, memory_fraction=memory_fraction, logits=prefill_logits,
                                   prefill_chunk=prefill_chunk),
    }


def attention_variants(c: LLMConfig) -> dict[str, LLMConfig]:
    """The config in each attention variant, for comparing KV caches: mha (kv_heads = heads), gqa (the
    config's kv_heads when it is GQA, else heads/8 as Llama 3, at least 2), mqa (1 kv head), mla (the
    config's latent when it is MLA, else DeepSeek-V2's proportions: kv_latent = 4·head_dim, rope_dim =
    head_dim/2). Variants that do not exist for the head count (GQA with fewer than 4 heads) are left out."""
    base = replace(c, kv_latent=0, q_latent=0, rope_dim=0, v_head_dim=c.head_dim)
    variants = {"mha": replace(base, attention="mha", kv_heads=c.heads)}
    groups = c.kv_heads if c.attention == "gqa" else max(2, c.heads // 8)
    if c.attention == "gqa" or (1 < groups < c.heads and c.heads % groups == 0):
        variants["gqa"] = replace(base, attention="gqa", kv_heads=groups)
    variants["mqa"] = replace(base, attention="mqa", kv_heads=1)
    variants["mla"] = c if c.attention == "mla" else \
        replace(base, attention="mla", kv_heads=c.heads, kv_latent=MLA_LATENT_PER_HEAD_DIM * c.head_dim,
                rope_dim=c.head_dim // 2)
    return variants


KV_TABLE_COLUMNS = ("variant", "kv_heads", "kv_latent", "rope_dim", "kv_dtype", "context", "batch", "kv_bytes",
                    "bytes_per_token", "vs_mha")


def kv_cache_table(c: LLMConfig, contexts: Sequence[int], *, batch: int = 1,
                   kv_dtypes: Sequence[str] = KV_PRECISIONS,
                   variants: Mapping[str, LLMConfig] | None = None) -> pd.DataFrame:
    """KV-cache size against context length per attention variant and cache precision.

    | variant | kv_heads | kv_latent | rope_dim | kv_dtype | context | batch | kv_bytes | bytes_per_token | vs_mha |

    `vs_mha` is the size over MHA's at the same precision (the reduction factor's inverse).
    """
    variants = variants or attention_variants(c)
    rows = []
    for dtype in kv_dtypes:
        mha = kv_bytes_per_token(replace(variants.get("mha", attention_variants(c)["mha"]), kv_dtype=dtype))
        for name, variant in variants.items():
            per_token = kv_bytes_per_token(replace(variant, kv_dtype=dtype))
            for context in contexts:
                rows.append({"variant": name, "kv_heads": variant.kv_heads if variant.attention != "mla" else None,
                             "kv_latent": variant.kv_latent or None, "rope_dim": variant.rope_dim or None,
                             "kv_dtype": dtype, "context": int(context), "batch": batch,
                             "kv_bytes": per_token * context * batch, "bytes_per_token": per_token,
                             "vs_mha": per_token / mha})
    return pd.DataFrame(rows, columns=list(KV_TABLE_COLUMNS))


ERROR_COLUMNS = ("metric", "predicted", "measured", "rel_error", "ratio")


def prediction_errors(rows: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured values: adds `rel_error` = (predicted − measured) / measured (negative:
    the model is optimistic) and `ratio` = measured / predicted, keeping the other columns.

    | metric | predicted | measured | … | rel_error | ratio |
    """
    missing = {"metric", "predicted", "measured"} - set(rows.columns)
    if missing:
        raise WorkbenchError(f"prediction rows need columns metric, predicted, measured; missing {sorted(missing)}")
    out = rows.copy()
    predicted, measured = out["predicted"].astype(float), out["measured"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["rel_error"] = np.where(measured != 0, (predicted - measured) / measured, np.nan)
        out["ratio"] = np.where(predicted != 0, measured / predicted, np.nan)
    return out


def parse_sweep(text: str, what: str) -> list[int]:
    """Positive integers from a sweep: comma-separated values, each an integer (a `k` suffix multiplies by
    1024: 4k = 4096) or a doubling range `low..high` (1..64 = 1, 2, 4, …, 64); in the given order."""
    values: list[int] = []
    for item in (part.strip() for part in str(text).split(",")):
        low_text, sep, high_text = item.partition("..")
        try:
            low = _sweep_int(low_text)
            high = _sweep_int(high_text) if sep else low
        except ValueError:
            raise WorkbenchError(f"{what} {text!r}: {item!r} is not a positive integer (4096, 4k) "
                                 "or a doubling range low..high") from None
        if low < 1 or high < low:
            raise WorkbenchError(f"{what} {text!r}: {item!r} must be positive, low <= high")
        while low <= high:
            values.append(low)
            low *= 2
    return values


def _sweep_int(text: str) -> int:
    text = text.strip().lower()
    return int(text[:-1]) * 1024 if text.endswith("k") else int(text)


def default_contexts(c: LLMConfig, *, low: int = 128, high: int = 131072) -> list[int]:
    """Powers of two from `low` to the config's max_seq (or `high`), for context sweeps."""
    top = min(c.max_seq or high, high)
    contexts = [low]
    while contexts[-1] * 2 <= top:
        contexts.append(contexts[-1] * 2)
    return contexts if top >= low else [top]


def llm_projection(c: LLMConfig, device: DeviceSpec, *, batches: Sequence[int], prompts: Sequence[int],
                   news: Sequence[int], contexts: Sequence[int] | None = None, spec_k: int | None = None,
                   acceptance: float = 0.7, draft_cost: float = 0.05, overhead_s: float = 0.0,
                   prefill_logits: str = "last", memory_fraction: float = MEMORY_FRACTION,
                   prefill_chunk: int | None = None) -> dict[str, Any]:
    """Everything `workbench llm-model` reports, JSON-ready: the config, device figures, weights, one
    `project` per (batch, prompt, new), per context the KV bytes and crossover batch, the KV-cache table
    per attention variant and precision (the config's own and `KV_PRECISIONS`), and the speculative-decoding
    projection (when `spec_k` is given; at the first scenario's batch and context)."""
    contexts = list(contexts or default_contexts(c))
    scenarios = [project(c, device, batch=b, prompt=p, new=n, overhead_s=overhead_s, prefill_logits=prefill_logits,
                         memory_fraction=memory_fraction, prefill_chunk=prefill_chunk)
                 for b in batches for p in prompts for n in news]
    per_context = [{"context": ctx, "kv_bytes_per_sequence": kv_bytes(c, 1, ctx),
                    "crossover_batch": crossover_batch(c, device, ctx)} for ctx in contexts]
    counts = parameter_counts(c)
    result: dict[str, Any] = {
        "config": c.to_dict(), "device": device_summary(device, c.dtype),
        "weights": {"params": counts["total"], "active_params": counts["active"], "bytes": weight_bytes(c)},
        "kv_bytes_per_token": kv_bytes_per_token(c), "overhead_ms": overhead_s * 1e3,
        "prefill_logits": prefill_logits, "memory_fraction": memory_fraction, "prefill_chunk": prefill_chunk,
        "scenarios": scenarios, "contexts": per_context,
        "kv_cache": kv_cache_table(c, contexts, kv_dtypes=tuple(dict.fromkeys((c.kv_dtype, *KV_PRECISIONS))))
        .to_dict(orient="records"),
        "speculative": None,
    }
    if spec_k is not None:
        first = scenarios[0]
        result["speculative"] = speculative_projection(
            c, device, batch=first["batch"], context=first["context"], k=spec_k, acceptance=acceptance,
            draft_cost=draft_cost, overhead_s=overhead_s)
    return result
