"""The text reports of the LLM commands, as tables every surface places: a generation sweep's runs
(`workbench generate`) and the analytical model's projection (`workbench llm-model`). The CLI prints these
blocks; the HTML views embed them (`text_tables.blocks_view`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workbench.hardware.units import format_bytes
from workbench.views.text_tables import Block, Cell, TextTable, cells, format_number, status_cell

GENERATION_COLUMNS = ("run", "status", "TTFT ms", "TPOT p50 ms", "TPOT p99 ms", "tokens/s", "KV bytes", "accept",
                      "speedup", "bundle")


def generation_table(experiment_id: str, runs: Sequence[Mapping[str, Any]]) -> TextTable:
    """The runs of a generation sweep (`GenerationResult.to_dict()`s) with their headline figures."""
    rows = []
    for run in runs:
        llm = run.get("llm") or {}
        spec = llm.get("speculative") or {}
        rows.append(cells(run["variant"], status_cell(run["status"]), llm.get("ttft_ms"), llm.get("tpot_ms"),
                          llm.get("tpot_p99_ms"), llm.get("tokens_per_s"), llm.get("kv_cache_bytes"),
                          spec.get("acceptance_rate"), Cell(format_number(spec.get("speedup_vs_greedy"), "x")),
                          run["run_id"]))
    return TextTable(f"generation {experiment_id}", GENERATION_COLUMNS, tuple(rows),
                     left=frozenset({"run", "status", "bundle"}))


def llm_model_blocks(result: Mapping[str, Any]) -> list[Block]:
    """`llm_projection`'s result as text: the model and device, the scenarios, the contexts, the KV cache per
    attention variant and precision, and the speculative-decoding projection when there is one."""
    c, d, w = result["config"], result["device"], result["weights"]
    attention = c["attention"] + (f" (kv_latent {c['kv_latent']}, rope {c['rope_dim']})" if c["attention"] == "mla"
                                  else f" ({c['kv_heads']} kv heads of {c['heads']})")
    blocks: list[Block] = [
        (Cell(c["name"], "strong"), Cell(" on "), Cell(d["name"], "strong"), Cell(
            " (a projection: roofline, no measurement)  "
            f"{w['params'] / 1e9:.3g}B params ({w['active_params'] / 1e9:.3g}B active), weights {_gb(w['bytes'])} "
            f"{c['weight_dtype']}, attention {attention}, KV {_gb(result['kv_bytes_per_token'])}/token "
            f"{c['kv_dtype']}; peak {d['peak_flops_per_s'] / 1e12:.4g} TFLOP/s {d['peak_dtype']}, "
            f"{d['memory_bw_bytes_per_s'] / 1e9:.4g} GB/s, ridge {d['ridge_point']:.3g} FLOP/B")),
        scenario_table(result),
        context_table(result),
    ]
    if any(row["crossover_batch"] is None for row in result["contexts"]):
        blocks.append("crossover 'never': the KV-cache read grows with the batch as fast as the FLOPs, so the "
                      "decode step stays memory-bound at any batch at that context")
    blocks.append(kv_variant_table(result))
    spec = result["speculative"]
    if spec:
        blocks.append(f"speculative decoding (k={spec['k']}, acceptance {spec['acceptance']:g}, draft cost "
                      f"{spec['draft_cost']:g}): {spec['expected_tokens']:.3g} tokens per target pass, speedup "
                      f"{spec['speedup']:.3g}x (Leviathan et al. 2023), {spec['speedup_roofline']:.3g}x with the "
                      f"modelled verify pass ({spec['verify_over_step']:.3g}x a decode step); best k {spec['best_k']} "
                      f"({spec['best_k_speedup']:.3g}x)")
    return blocks


def scenario_table(result: Mapping[str, Any]) -> TextTable:
    """One row per (batch, prompt, new): prefill and decode time and what bounds them, memory and whether it fits."""
    max_seq = result["config"]["max_seq"]
    rows = []
    for s in result["scenarios"]:
        dec = s["decode"]
        new = (Cell(str(s["new"])), Cell(" (> max_seq)", "bad")) if s["beyond_max_seq"] else Cell(str(s["new"]))
        longer = max_seq and s["max_context"] and s["max_context"] > max_seq
        rows.append(cells(
            str(s["batch"]), str(s["prompt"]), new, s["prefill"]["flops"] / 1e12, s["ttft_ms"], s["prefill"]["bound"],
            dec.get("bytes_per_step", 0) / 1e9, s["tpot_ms"], dec.get("bound", "-"), s["tokens_per_s"],
            _gb(s["kv_bytes"]), _gb(s["memory_bytes"]),
            {True: Cell("yes"), False: Cell("no", "bad"), None: Cell("?")}[s["fits"]],
            _crossover(s["crossover_batch"]),
            format_number(s["max_context"]) + (f" (model: {max_seq:,})" if longer else "")))
    return TextTable("scenarios", ("batch", "prompt", "new", "prefill TFLOP", "TTFT ms", "bound", "decode GB/step",
                                   "TPOT ms", "bound", "tok/s", "KV", "memory", "fits", "crossover batch",
                                   "max context"), tuple(rows))


def context_table(result: Mapping[str, Any]) -> TextTable:
    """Per context: one sequence's KV cache and the batch from which decoding turns compute-bound."""
    rows = tuple(cells(f"{row['context']:,}", _gb(row["kv_bytes_per_sequence"]), _crossover(row["crossover_batch"]))
                 for row in result["contexts"])
    return TextTable("by context (one sequence)", ("context", "KV cache", "crossover batch"), rows)


def kv_variant_table(result: Mapping[str, Any]) -> TextTable:
    """The KV cache of one sequence at the longest context, per attention variant (rows) and precision."""
    kv = result["kv_cache"]
    longest = max(row["context"] for row in kv)
    dtypes = list(dict.fromkeys(row["kv_dtype"] for row in kv))
    at_longest = [row for row in kv if row["context"] == longest]
    rows = []
    for variant in dict.fromkeys(row["variant"] for row in at_longest):
        by_dtype = {row["kv_dtype"]: row for row in at_longest if row["variant"] == variant}
        rows.append(cells(variant, *(_gb(by_dtype[t]["kv_bytes"]) for t in dtypes),
                          f"{by_dtype[dtypes[0]]['vs_mha']:.3g}x"))
    return TextTable(f"KV cache per sequence at {longest:,} tokens, by attention variant",
                     ("variant", *dtypes, "vs mha"), tuple(rows), left=frozenset({"variant"}))


def _gb(n: float) -> str:
    return format_bytes(n, binary=False)


def _crossover(batch: float | None) -> str:
    return format_number(batch) if batch else "never"
