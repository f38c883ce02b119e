"""Generation with a KV cache: the same tokens as recomputing without one, labelled steps, numerics of the
cache formats, the attention options of tiny-gpt, and the per-token metrics."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from conftest import write_trace

from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.llm.generate import PREFILL, decode_label, generate
from workbench.llm.metrics import StepTimes, llm_metrics, peak_allocated_bytes
from workbench.llm.numerics import cache_numerics, recompute_logits, token_agreement, vs_recompute
from workbench.models import LoadedModel, load_model
from workbench.models.tiny_gpt import attention_kind, resolved_kv_heads
from workbench.profiling.torch_profiler import TorchProfilerSession
from workbench.trace import read_trace

SMALL = {"vocab": 256, "layers": 2, "d_model": 64, "heads": 4, "max_seq": 64}
ATTENTIONS = {"mha": {}, "gqa": {"kv_heads": 2}, "mqa": {"attention": "mqa"}, "mla": {"attention": "mla"}}
PROMPT, NEW = 12, 16


@cache
def _model(attention: str, seed: int = 0) -> LoadedModel:
    return load_model("tiny-gpt", **SMALL, **ATTENTIONS[attention], seed=seed)


def _prompt(loaded: LoadedModel, batch: int = 2) -> torch.Tensor:
    return loaded.make_inputs(batch, PROMPT)[0]


def _greedy_without_cache(loaded: LoadedModel, prompt: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy decoding the slow way: a full forward pass over the whole sequence for every token."""
    sequence = prompt
    with torch.inference_mode():
        for _ in range(new):
            nxt = loaded.module(sequence)[:, -1].argmax(dim=-1, keepdim=True)
            sequence = torch.cat([sequence, nxt], dim=1)
    return sequence[:, prompt.shape[1]:]


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_kv_cache_path_gives_the_same_tokens_as_recomputing_without_a_cache(attention):
    loaded = _model(attention)
    prompt = _prompt(loaded)
    run = generate(loaded.module, prompt, NEW, keep_logits=True)
    assert torch.equal(run.tokens, _greedy_without_cache(loaded, prompt, NEW))
    # the logits too, up to float32 summation order (MLA decodes in the absorbed latent form)
    torch.testing.assert_close(run.logits, recompute_logits(loaded.module, prompt, run.tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_prefill_is_the_uncached_forward_bit_for_bit(attention):
    loaded = _model(attention)
    prompt = _prompt(loaded)
    run = generate(loaded.module, prompt, 1, keep_logits=True)
    with torch.inference_mode():
        expected = loaded.module(prompt)[:, -1]
    assert torch.equal(run.logits[:, 0], expected)
    assert run.times.step_tokens == (1,)


def test_generation_is_deterministic_and_batch_rows_are_independent():
    loaded = _model("gqa")
    prompt = _prompt(loaded, batch=3)
    first, second = generate(loaded.module, prompt, NEW), generate(loaded.module, prompt, NEW)
    assert torch.equal(first.tokens, second.tokens)
    alone = generate(loaded.module, prompt[1:2], NEW)
    assert torch.equal(alone.tokens, first.tokens[1:2])


def test_teacher_forcing_feeds_the_given_tokens():
    loaded = _model("mha")
    prompt = _prompt(loaded)
    forced = torch.randint(0, SMALL["vocab"], (2, NEW), generator=torch.Generator().manual_seed(3))
    run = generate(loaded.module, prompt, NEW, force=forced, keep_logits=True)
    torch.testing.assert_close(run.logits, recompute_logits(loaded.module, prompt, forced), rtol=1e-4, atol=1e-4)
    assert torch.equal(run.tokens, run.logits.argmax(dim=-1))  # the choices are still reported


def test_steps_are_labelled_prefill_and_decode_n_in_the_profiler_trace(tmp_path):
    loaded = _model("mla")
    prompt = _prompt(loaded, batch=1)
    with TorchProfilerSession(tmp_path, "gen") as session:
        run = generate(loaded.module, prompt, 5)
    events = read_trace(session.trace_path).df()
    labels = events.loc[events["kind"] == "annotation", "name"].astype(str).tolist()
    expected = [PREFILL] + [decode_label(n) for n in range(4)]
    assert [label for label in labels if label in expected] == expected
    assert len(run.times.step_ns) == 5 and all(ns > 0 for ns in run.times.step_ns)


# numerics of the cache formats against the fp32 cache: the logits are compared on the same inputs
# (teacher-forced), so the error is the cache's own. Measured on these models (3 seeds, 4 attentions):
# fp16 81-83 dB, bf16 64-65 dB (8-bit mantissa), int8 per token 53-56 dB (a step of absmax/127 per
# vector), int8 per head 40-51 dB (one static scale per head, coarser and saturating): ~10 dB of margin.
MIN_SQNR_DB = {"fp16": 70.0, "bf16": 55.0, "int8": 45.0, "int8-per-head": 32.0}


@pytest.mark.parametrize("kv_dtype", sorted(MIN_SQNR_DB))
@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_cache_formats_against_the_fp32_cache(attention, kv_dtype):
    loaded = _model(attention)
    prompt = _prompt(loaded)
    reference = generate(loaded.module, prompt, NEW, keep_logits=True)
    candidate = generate(loaded.module, prompt, NEW, kv_dtype=kv_dtype)
    numerics = cache_numerics(loaded.module, prompt, reference, candidate, kv_dtype)
    assert numerics["logits"]["sqnr_db"] >= MIN_SQNR_DB[kv_dtype]
    assert numerics["logits"]["max_abs_error"] > 0  # a lossy format is not silently fp32
    assert numerics["logits"]["top1_agreement"] >= 0.9
    assert 0.0 <= numerics["tokens"]["token_match"] <= 1.0


def test_fp32_cache_against_itself_and_against_recompute():
    loaded = _model("mqa")
    prompt = _prompt(loaded)
    run = generate(loaded.module, prompt, NEW, keep_logits=True)
    same = cache_numerics(loaded.module, prompt, run, run, "fp32")
    assert same["logits"]["sqnr_db"] == "inf" and same["tokens"]["identical"]
    checked = vs_recompute(loaded.module, prompt, run)
    assert checked["tokens"]["identical"] and checked["sqnr_db"] > 100


def test_token_agreement_finds_the_first_divergence():
    a = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    assert token_agreement(a, b) == {"token_match": 0.75, "identical": False, "first_divergence": 2}
    assert token_agreement(a, a)["first_divergence"] is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"new_tokens": 64}, "prompt 12 \\+ new 64 - 1 positions exceed the model's max_seq 64"),
    ({"new_tokens": 0}, "new tokens must be an integer >= 1"),
    ({"prompt": torch.zeros(2, 3)}, "int64 tensor"),
    ({"force": torch.zeros(2, 3, dtype=torch.int64)}, "forced tokens must be \\[2, 4\\]"),
    ({"kv_dtype": "fp8"}, "unknown KV-cache dtype 'fp8'"),
])
def test_generate_rejects_bad_requests(kwargs, message):
    loaded = _model("mha")
    args = {"prompt": _prompt(loaded), "new_tokens": 4, **kwargs}
    with pytest.raises(WorkbenchError, match=message):
        generate(loaded.module, args.pop("prompt"), args.pop("new_tokens"), **args)


# --- tiny-gpt attention options ------------------------------------------------------------------


def test_attention_kinds_and_their_kv_heads():
    assert attention_kind({**SMALL, "kv_heads": None}) == "mha"
    assert attention_kind({**SMALL, "kv_heads": 2}) == "gqa"
    assert attention_kind({**SMALL, "kv_heads": 1}) == "mqa"
    assert resolved_kv_heads({**SMALL, "kv_heads": None, "attention": "gqa"}) == 2  # smallest divisor above 1
    assert resolved_kv_heads({**SMALL, "heads": 8, "kv_heads": None, "attention": "mqa"}) == 1
    mla = _model("mla").module.blocks[0].attn
    assert type(mla).__name__ == "LatentAttention" and mla.latent == 4 * 16
    state = _model("mla").module.state_dict()
    assert {"blocks.0.attn.kv_down.weight", "blocks.0.attn.kv_norm.weight", "blocks.0.attn.k_up.weight",
            "blocks.0.attn.v_up.weight"} <= state.keys()
    assert "blocks.0.attn.k_up.bias" not in state  # no bias, so the absorbed form equals the expanded one


@pytest.mark.parametrize(("overrides", "message"), [
    ({"attention": "sparse"}, "attention must be one of mha, gqa, mqa, mla"),
    ({"attention": "mha", "kv_heads": 2}, "attention 'mha' does not match kv_heads 2"),
    ({"attention": "gqa", "kv_heads": 1}, "attention 'gqa' does not match kv_heads 1"),
    ({"attention": "mla", "kv_heads": 2}, "leave kv_heads unset"),
    ({"kv_latent": 32}, "kv_latent applies only to attention 'mla'"),
    ({"attention": "mla", "kv_latent": 0}, "kv_latent must be an integer >= 1"),
    ({"attention": "gqa", "heads": 2, "d_model": 64}, "heads 2 has none"),
])
def test_tiny_gpt_rejects_inconsistent_attention_settings(overrides, message):
    with pytest.raises(WorkbenchError, match=message):
        load_model("tiny-gpt", **{**SMALL, **overrides})


def test_jax_port_refuses_mla():
    pytest.importorskip("jax")
    from workbench.models.jax_port import jax_model

    with pytest.raises(VariantUnavailable, match="attention 'mla' has no JAX port"):
        jax_model(_model("mla"))


# --- metrics --------------------------------------------------------------------------------------


def test_step_times_give_ttft_tpot_and_inter_token_latencies():
    # prefill 10 ms, then a plain decode step (1 token, 2 ms) and a speculative round (3 tokens, 6 ms)
    times = StepTimes((10_000_000, 2_000_000, 6_000_000), (1, 1, 3), batch=2)
    assert times.ttft_ns == 10_000_000 and times.total_ns == 18_000_000 and times.output_tokens == 5
    assert times.token_ns().tolist() == [10_000_000, 12_000_000, 18_000_000, 18_000_000, 18_000_000]
    assert times.itl_ns().tolist() == [2_000_000, 6_000_000, 0, 0]
    assert times.tpot_ns().tolist() == [2_000_000, 2_000_000]
    metrics = llm_metrics([times, StepTimes((20_000_000, 4_000_000), (1, 1), batch=2)], kv_cache_bytes=100,
                          kv_cache_bytes_predicted=100)
    assert metrics["ttft_ms"] == 15.0  # median of 10 and 20
    assert metrics["tpot_ms"] == 2.0 and metrics["tpot_p99_ms"] == pytest.approx(3.96)  # samples 2, 2, 4 ms
    assert metrics["itl_ms"]["max"] == 6.0 and metrics["itl_ms"]["count"] == 5
    # tokens/s: 2 · 5 / 18 ms and 2 · 2 / 24 ms, median
    assert metrics["tokens_per_s"] == pytest.approx(np.median([10 / 0.018, 4 / 0.024]))
    assert metrics["kv_cache_bytes"] == metrics["kv_cache_bytes_predicted"] == 100


def test_one_token_runs_have_no_decode_figures():
    metrics = llm_metrics([StepTimes((5_000_000,), (1,), batch=1)])
    assert metrics["ttft_ms"] == 5.0
    assert metrics["tpot_ms"] is None and metrics["itl_ms"] is None and metrics["decode_tokens_per_s"] is None


def test_step_times_reject_mismatched_lists():
    with pytest.raises(WorkbenchError, match="2 durations for 1 token counts"):
        StepTimes((1, 2), (1,), batch=1)
    with pytest.raises(WorkbenchError, match="at least one timed generation"):
        llm_metrics([])


def test_peak_allocated_bytes_counts_only_what_the_window_allocated(tmp_path):
    def memory(ts: float, delta: int, total: int) -> dict:
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
                "args": {"Device Type": 0, "Device Id": -1, "Addr": 64, "Bytes": delta, "Total Allocated": total}}

    events = [memory(1, 5000, 5000),  # the weights, before the window
              {"ph": "X", "cat": "user_annotation", "name": "measure", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
              memory(11, 300, 5300), memory(12, 200, 5500), memory(13, -300, 5200), memory(25, 900, 6100)]
    trace = read_trace(write_trace(tmp_path / "mem.json", events))
    assert peak_allocated_bytes(trace, "cpu", (10_000, 20_000)) == 500
    assert peak_allocated_bytes(trace, "cpu") == 6100
    assert peak_allocated_bytes(trace, "cuda:0") is None
