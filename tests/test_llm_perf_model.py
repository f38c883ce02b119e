"""The analytical LLM model: FLOPs, bytes and KV sizes against hand arithmetic, the variant reduction
factors, crossover and max-context rules, the speculative formula, presets against the real tiny-gpt,
the view, and the `workbench llm-model` CLI (JSON shape, bad input -> exit 2)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.hardware import DeviceSpec
from workbench.llm import perf_model as pm

# A fixed small GQA config for hand arithmetic: L=2 layers, d=64, H=4 heads of hd=16, KV=2 kv heads,
# vocab V=100, GELU MLP of F=4·64=256, no biases, RoPE (no position table), RMSNorm, fp16 (2 bytes).
SMALL = {"layers": 2, "d_model": 64, "heads": 4, "kv_heads": 2, "vocab": 100, "mlp_ratio": 4, "mlp": "gelu",
         "bias": False, "pos_emb": "rope", "norm": "rmsnorm", "dtype": "fp16"}
L, D, H, HD, KV, V, F, B2 = 2, 64, 4, 16, 2, 100, 256, 2


@pytest.fixture
def small() -> pm.LLMConfig:
    return pm.make_config(SMALL)


def _device(peak: float = 1e12, bandwidth: float = 1e11, memory: float | None = 1e9) -> DeviceSpec:
    return DeviceSpec(name="test", kind="custom", peak_flops={"fp16": peak, "fp32": peak / 2},
                      memory_bw_bytes_per_s=bandwidth, memory_bytes=memory)


# --- configs ---------------------------------------------------------------------------------------------


def test_config_resolution(small):
    assert (small.attention, small.kv_heads, small.head_dim, small.ffn_hidden) == ("gqa", 2, 16, 256)
    assert (small.weight_dtype, small.kv_dtype) == ("fp16", "fp16")
    assert pm.make_config({**SMALL, "kv_heads": None}).attention == "mha"
    assert pm.make_config({**SMALL, "kv_heads": 1}).attention == "mqa"
    assert pm.make_config({**SMALL, "kv_heads": None, "attention": "mqa"}).kv_heads == 1
    mla = pm.make_config({**SMALL, "kv_heads": None, "kv_latent": 32, "rope_dim": 8})
    assert (mla.attention, mla.v_head_dim) == ("mla", 16)
    assert pm.make_config({**SMALL, "kv_heads": None, "attention": "mla"}).kv_latent == 4 * 16  # DeepSeek-V2's 4·hd


@pytest.mark.parametrize(("values", "message"), [
    ({"kv_head": 2}, "unknown config key 'kv_head'"),
    ({"layers": "two"}, "'layers' must be a non-negative integer"),
    ({"attention": "sparse"}, "'attention' must be one of"),
    ({"attention": "gqa", "kv_heads": None}, "attention=gqa needs 1 < kv_heads < heads"),
    ({"attention": "mha"}, "attention=mha means kv_heads=4"),
    ({"kv_heads": 3}, "heads 4 is not divisible by kv_heads 3"),
    ({"kv_latent": 32}, "drop kv_heads"),
    ({"rope_dim": 8}, "'rope_dim' applies only to attention=mla"),
    ({"ffn_hidden": 100}, "give mlp_ratio or ffn_hidden, not both"),
    ({"moe_experts": 8}, "moe_active <= moe_experts"),
    ({"d_model": 66, "heads": 4, "kv_heads": None}, "not divisible by heads 4; give head_dim"),
])
def test_config_errors_name_the_key(values, message):
    with pytest.raises(WorkbenchError, match=message.replace("(", r"\(")):
        pm.make_config({**SMALL, **values})


def test_parse_config_inline_preset_and_file(tmp_path):
    inline = pm.parse_config("layers=2,d_model=64,heads=4,kv_heads=2,vocab=100,dtype=fp16")
    assert (inline.layers, inline.kv_heads, inline.dtype, inline.name) == (2, 2, "fp16", "custom")
    preset = pm.parse_config("tiny-gpt,kv_heads=2,kv_dtype=int8")
    assert (preset.d_model, preset.kv_heads, preset.kv_dtype, preset.name) == (256, 2, "int8", "tiny-gpt (modified)")
    path = tmp_path / "model.yaml"
    path.write_text("preset: llama-3-8b\nkv_dtype: fp8\n")
    from_file = pm.parse_config(str(path))
    assert (from_file.layers, from_file.kv_heads, from_file.kv_dtype) == (32, 8, "fp8")
    with pytest.raises(WorkbenchError, match="neither key=value nor a preset"):
        pm.parse_config("layers=2,gpt-9")
    with pytest.raises(WorkbenchError, match="missing config key"):
        pm.parse_config("layers=2")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(WorkbenchError, match="expected a mapping"):
        pm.parse_config(str(tmp_path / "list.json"))


def test_preset_overrides_replace_what_they_mean():
    assert pm.parse_config("tiny-gpt,ffn_hidden=512").ffn_hidden == 512  # the preset's mlp_ratio gives way
    assert pm.parse_config("llama-3-8b,mlp_ratio=3").ffn_hidden == 3 * 4096
    mqa = pm.parse_config("llama-3-8b,attention=mqa")
    assert (mqa.attention, mqa.kv_heads) == ("mqa", 1)
    mla = pm.parse_config("llama-3-8b,kv_latent=512,rope_dim=64")
    assert (mla.attention, mla.kv_latent) == ("mla", 512)
    gqa = pm.parse_config("deepseek-v2-lite,kv_heads=4")
    assert (gqa.attention, gqa.kv_heads, gqa.kv_latent, gqa.rope_dim) == ("gqa", 4, 0, 0)


def test_parse_sweep():
    assert pm.parse_sweep("1,8,64", "--batch") == [1, 8, 64]
    assert pm.parse_sweep("1..16", "--batch") == [1, 2, 4, 8, 16]
    assert pm.parse_sweep("4k,1k..4k", "--context") == [4096, 1024, 2048, 4096]
    for bad in ("0", "x", "8..2", "1,,2"):
        with pytest.raises(WorkbenchError, match="--batch"):
            pm.parse_sweep(bad, "--batch")


# --- parameters, FLOPs and bytes by hand ---------------------------------------------------------------


def test_parameters_by_hand(small):
    per_layer = D * H * HD + 2 * D * KV * HD + H * HD * D + 2 * D * F  # q, k+v, o, fc_in+fc_out
    matrix = L * per_layer + D * V  # + LM head
    other = L * 2 * D + D + V * D  # two RMSNorms per layer, the final one, the embedding table
    assert pm.parameter_counts(small) == {"matrix": matrix, "other": other, "total": matrix + other,
                                          "active": matrix + other - V * D}
    assert pm.weight_bytes(small) == (matrix + other) * 2


def test_prefill_flops_by_hand(small):
    batch, t = 2, 8
    n = batch * t
    qkv = 2 * n * D * (H * HD + 2 * KV * HD)
    out = 2 * n * H * HD * D
    pairs = batch * t * (t + 1) // 2  # causal: 36 pairs per sequence
    attention = 2 * H * pairs * (HD + HD)  # QK^T and PV
    mlp = 2 * n * 2 * D * F
    lm_head = 2 * n * D * V
    cost = pm.forward_cost(small, batch, t, logits="all")
    assert cost.flops_by_part == {"qkv_proj": L * qkv, "out_proj": L * out, "attention": L * attention,
                                  "mlp": L * mlp, "lm_head": lm_head}
    assert cost.flops == 3_125_248  # 2·(262144 + 131072 + 18432 + 1048576) + 204800
    last = pm.forward_cost(small, batch, t, logits="last")
    assert cost.flops - last.flops == 2 * (n - batch) * D * V


def test_decode_step_flops_and_bytes_by_hand(small):
    batch, past = 2, 10
    qkv, out = 2 * batch * D * (H * HD + 2 * KV * HD), 2 * batch * H * HD * D
    attention = 2 * H * batch * (past + 1) * (2 * HD)  # one query over past + itself
    mlp, lm_head = 2 * batch * 2 * D * F, 2 * batch * D * V
    cost = pm.forward_cost(small, batch, 1, past)
    assert cost.flops == L * (qkv + out + attention + mlp) + lm_head == 397_312
    kv_token = 2 * L * KV * HD * 2  # K and V, 2 layers, 2 kv heads of 16, fp16 = 256 bytes
    assert cost.kv_read_bytes == kv_token * batch * (past + 1)
    assert cost.kv_write_bytes == kv_token * batch
    matrices = L * (D * H * HD + 2 * D * KV * HD + H * HD * D + 2 * D * F) + D * V
    norms, rows = L * 2 * D + D, batch * D  # embedding: only the rows looked up
    assert cost.weight_bytes == (matrices + norms + rows) * 2 == 193_920
    assert cost.act_bytes > 0
    assert cost.bytes == cost.weight_bytes + cost.kv_bytes + cost.act_bytes


def test_kv_bytes_by_hand(small):
    assert pm.kv_bytes(small, 3, 1000) == 2 * L * KV * HD * 1000 * 3 * 2 == 768_000
    head = replace(small, kv_dtype="int8", kv_scale="token-head")
    token = replace(small, kv_dtype="int8", kv_scale="token")
    tensor = replace(small, kv_dtype="int8", kv_scale="static")
    assert pm.kv_bytes_per_token(head) == 2 * L * KV * HD * 1 + 2 * L * KV * 4  # + an fp32 scale per vector
    assert pm.kv_bytes_per_token(token) == 2 * L * KV * HD * 1 + 2 * L * 4  # + one per token, layer, K/V
    assert pm.kv_bytes_per_token(tensor) == 2 * L * KV * HD
    assert pm.kv_bytes_per_token(replace(small, kv_dtype="fp8")) == 2 * L * KV * HD
    assert pm.kv_bytes_per_token(replace(small, kv_dtype="int4", kv_scale="static")) == L * KV * HD
    mla = pm.make_config({**SMALL, "kv_heads": None, "kv_latent": 32, "rope_dim": 8})
    assert pm.kv_bytes(mla, 2, 100) == L * (32 + 8) * 100 * 2 * 2
    assert pm.kv_bytes_per_token(replace(mla, kv_dtype="int8")) == L * (32 + 8) + L * 4


def test_kv_reduction_factors(small):
    table = pm.kv_cache_table(small, [1024, 4096], kv_dtypes=("fp16", "int8"))
    assert set(table["variant"]) == {"mha", "gqa", "mqa", "mla"}
    at = table[(table["kv_dtype"] == "fp16") & (table["context"] == 4096)].set_index("variant")
    assert at.loc["mha", "kv_bytes"] == 2 * L * H * HD * 4096 * 2
    assert at.loc["gqa", "vs_mha"] == KV / H
    assert at.loc["mqa", "vs_mha"] == 1 / H
    # MLA with DeepSeek-V2's proportions: latent 4·hd + rope hd/2 per layer, against 2·H·hd
    assert at.loc["mla", "vs_mha"] == pytest.approx((4 * HD + HD // 2) / (2 * H * HD))
    assert (table.groupby(["variant", "kv_dtype"])["kv_bytes"].apply(lambda s: s.is_monotonic_increasing)).all()
    llama = pm.kv_cache_table(pm.parse_config("llama-3-8b"), [8192], kv_dtypes=("bf16",)).set_index("variant")
    assert llama.loc["gqa", "kv_bytes"] == 2 * 32 * 8 * 128 * 8192 * 2  # 1 GiB: Llama-3-8B at 8k, bf16
    deepseek = pm.kv_cache_table(pm.parse_config("deepseek-v2-lite"), [1], kv_dtypes=("bf16",)).set_index("variant")
    assert deepseek.loc["mla", "bytes_per_token"] == 27 * (512 + 64) * 2


def test_mla_absorbed_and_naive_decode():
    mla = pm.make_config({**SMALL, "kv_heads": None, "kv_latent": 32, "rope_dim": 8})
    c, r = 32, 8
    absorbed = pm.forward_cost(mla, 1, 1, 99)
    assert absorbed.flops_by_part["attention"] == L * 2 * H * 100 * ((c + r) + c)
    naive = pm.forward_cost(replace(mla, mla_decode="naive"), 1, 1, 99)
    assert naive.flops_by_part["attention"] == L * 2 * H * 100 * ((HD + r) + HD)
    # naive decompresses all 100 cached latents, absorbed applies the same weights to the one new token
    assert naive.flops_by_part["qkv_proj"] - absorbed.flops_by_part["qkv_proj"] == L * 2 * 99 * c * H * (HD + HD)
    assert naive.kv_read_bytes == absorbed.kv_read_bytes


# --- presets -------------------------------------------------------------------------------------------


def test_presets_match_their_sources():
    from workbench.models import describe_model, load_model

    tiny = pm.parse_config("tiny-gpt")
    defaults = describe_model("tiny-gpt")
    assert (tiny.vocab, tiny.layers, tiny.d_model, tiny.heads, tiny.max_seq) == \
        tuple(defaults[k] for k in ("vocab", "layers", "d_model", "heads", "max_seq"))
    module = load_model("tiny-gpt", d_model=64, heads=4, kv_heads=2, vocab=100, max_seq=32).module
    small_tiny = pm.parse_config("tiny-gpt,d_model=64,heads=4,kv_heads=2,vocab=100,max_seq=32")
    assert pm.parameter_counts(small_tiny)["total"] == sum(p.numel() for p in module.parameters())
    if "kv_latent" in defaults:  # tiny-gpt's MLA option: q, kv_down (+ LayerNorm), k_up and v_up without bias, o
        module = load_model("tiny-gpt", d_model=64, heads=4, vocab=100, max_seq=32, attention="mla",
                            kv_latent=32).module
        mla = pm.parse_config("tiny-gpt,d_model=64,heads=4,vocab=100,max_seq=32,attention=mla,kv_latent=32")
        assert pm.parameter_counts(mla)["total"] == sum(p.numel() for p in module.parameters())
    assert pm.parameter_counts(pm.parse_config("llama-3-8b"))["total"] == pytest.approx(8.03e9, rel=1e-3)
    deepseek = pm.parameter_counts(pm.parse_config("deepseek-v2-lite"))
    assert deepseek["total"] == pytest.approx(15.7e9, rel=5e-3)
    assert deepseek["active"] == pytest.approx(2.4e9, rel=0.03)  # "2.4B activated" (embedding table aside)


# --- roofline time, crossover, max context -------------------------------------------------------------


def test_pass_time_is_the_roofline(small):
    cost = pm.forward_cost(small, 1, 1, 0)
    device = _device()
    timing = pm.pass_time(cost, device, "fp16", overhead_s=0.0)
    assert timing["time_s"] == max(cost.flops / 1e12, cost.bytes / 1e11)
    assert timing["bound"] == "memory"
    assert pm.pass_time(cost, device, "fp16", overhead_s=1.0)["bound"] == "latency"


def test_decode_steps_sum_each_step(small):
    device = _device()
    steps = pm.predicted_decode_steps(small, device, 2, 5, 4)
    expected = [pm.pass_time(pm.forward_cost(small, 2, 1, past), device, "fp16", 1e-6)["time_s"]
                for past in (5, 6, 7)]
    steps = pm.predicted_decode_steps(small, device, 2, 5, 4, overhead_s=1e-6)
    assert steps["steps"] == 3
    assert steps["step_s"].tolist() == pytest.approx(expected)
    assert pm.predicted_decode_steps(small, device, 2, 5, 1)["steps"] == 0


def test_crossover_batch(small):
    device = _device(peak=1e12, bandwidth=1e11)  # ridge 10 FLOP/byte
    context = 16
    batch = pm.crossover_batch(small, device, context)
    ridge = device.ridge_point("fp16")
    assert batch is not None
    assert pm.forward_cost(small, batch, 1, context).intensity >= ridge
    assert pm.forward_cost(small, batch - 1, 1, context).intensity < ridge
    # by hand from the affine parts: bytes = W + b·k, FLOPs = b·f, so b* = ceil(R·W / (f − R·k))
    one, two = pm.forward_cost(small, 1, 1, context), pm.forward_cost(small, 2, 1, context)
    per_seq_bytes, fixed = two.bytes - one.bytes, 2 * one.bytes - two.bytes
    assert batch == math.ceil(ridge * fixed / (one.flops - ridge * per_seq_bytes))
    # monotone: a higher ridge (more peak, less bandwidth) needs a larger batch, never a smaller one
    batches = [pm.crossover_batch(small, _device(peak=p, bandwidth=bw), context)
               for p, bw in ((5e11, 1e11), (1e12, 1e11), (1e12, 8e10), (1.2e12, 9e10))]  # ridge 5 .. 13.3
    assert batches == sorted(batches) and batches[0] < batches[-1]
    # far above what attention reaches per KV byte: never compute-bound
    assert pm.crossover_batch(small, _device(peak=1e15, bandwidth=1e11), context) is None


def test_max_context_by_hand(small):
    device = _device(memory=1_000_000)
    weights = pm.weight_bytes(small)  # 206,464 bytes
    kv_token = 2 * 2 * L * KV * HD * 2  # batch 2: 512 bytes per context token
    # prefill activation peak per token: residual + normed (2·64) + the MLP hidden and its GELU (2·256)
    act_token = 2 * (2 * D + 2 * F) * 2
    logits = 2 * V * 2  # the last token's logits of 2 sequences
    expected = (1_000_000 - weights - logits) // (kv_token + act_token)
    assert expected == 258
    assert pm.max_context(small, device, 2, memory_fraction=1.0) == expected
    assert pm.memory_bytes(small, 2, expected) <= 1_000_000 < pm.memory_bytes(small, 2, expected + 1)
    # chunked prefill: activations stop growing beyond the chunk, so more context fits
    chunked = pm.max_context(small, device, 2, memory_fraction=1.0, prefill_chunk=16)
    assert chunked == 16 + (1_000_000 - pm.memory_bytes(small, 2, 16, prefill_chunk=16)) // kv_token
    assert pm.max_context(small, _device(memory=100_000), 2) == 0  # the weights alone do not fit
    assert pm.max_context(small, _device(memory=None), 2) is None


# --- speculative decoding ------------------------------------------------------------------------------


def test_speculative_formula():
    assert pm.expected_tokens(0.0, 4) == 1.0
    assert pm.speculative_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # every draft wasted
    assert pm.expected_tokens(1.0, 4) == 5.0
    assert pm.expected_tokens(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)  # continuous at α -> 1
    assert pm.speculative_speedup(1.0, 4, 0.0) == 5.0
    assert pm.expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)  # 3.3616
    assert pm.speculative_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    for bad in ((1.5, 4, 0.1), (0.5, -1, 0.1), (0.5, 4, -0.1)):
        with pytest.raises(WorkbenchError):
            pm.speculative_speedup(*bad)


def test_speculative_projection(small):
    result = pm.speculative_projection(small, _device(), batch=1, context=64, k=4, acceptance=0.8, draft_cost=0.1)
    assert result["speedup"] == pytest.approx(3.3616 / 1.4)
    # memory-bound verify of 5 tokens costs about one step, so the roofline speedup is close to the paper's
    assert 1.0 <= result["verify_over_step"] < 1.2
    assert result["speedup_roofline"] == pytest.approx(result["expected_tokens"] / (0.4 + result["verify_over_step"]))
    assert result["best_k_speedup"] >= result["speedup"]


# --- projection, view, CLI -----------------------------------------------------------------------------


def test_project_scenario(small):
    device = _device()
    result = pm.project(small, device, batch=2, prompt=8, new=4)
    assert result["ttft_ms"] == pytest.approx(pm.pass_time(pm.forward_cost(small, 2, 8, logits="last"), device,
                                                           "fp16")["time_s"] * 1e3)
    assert result["decode"]["steps"] == 3
    assert result["e2e_ms"] == pytest.approx(result["ttft_ms"] + 3 * result["tpot_ms"])
    assert result["kv_bytes"] == pm.kv_bytes(small, 2, 12)
    assert result["fits"] is True
    json.dumps(result)  # JSON-ready
    with pytest.raises(WorkbenchError):
        pm.project(small, device, batch=0, prompt=8, new=4)


def test_prediction_errors_and_view(small):
    rows = pd.DataFrame({"metric": ["ttft_ms", "tpot_ms"], "predicted": [1.0, 2.0], "measured": [2.0, 2.0],
                         "unit": ["ms", "ms"], "batch": [1, 1], "prompt": [8, 8], "new": [4, 4]})
    errors = pm.prediction_errors(rows)
    assert errors["rel_error"].tolist() == [-0.5, 0.0]
    assert errors["ratio"].tolist() == [2.0, 1.0]
    with pytest.raises(WorkbenchError, match="measured"):
        pm.prediction_errors(rows.drop(columns="measured"))
    from bokeh.embed import json_item

    from workbench.views.llm_model import llm_model_view

    layout = llm_model_view(pm.kv_cache_table(small, [128, 256]), errors, kv_budget_bytes=1e6, title="t")
    assert json.dumps(json_item(layout))


@pytest.fixture
def runner():
    return CliRunner()


def test_cli_json_shape(runner, tmp_path):
    html = tmp_path / "kv.html"
    result = runner.invoke(main, ["llm-model", "--config", "tiny-gpt,kv_heads=2", "--device", "h100", "--batch",
                                  "1..4", "--prompt", "64", "--new", "16", "--context", "128,512", "--spec-k", "3",
                                  "--html", str(html), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"config", "device", "weights", "kv_bytes_per_token", "scenarios", "contexts", "kv_cache",
            "speculative"} <= data.keys()
    assert [s["batch"] for s in data["scenarios"]] == [1, 2, 4]
    scenario = data["scenarios"][0]
    assert {"flops", "bytes", "kv_bytes", "weight_bytes", "act_bytes", "time_ms", "bound"} <= scenario["prefill"].keys()
    assert {"ttft_ms", "tpot_ms", "kv_bytes", "crossover_batch", "max_context", "fits"} <= scenario.keys()
    assert data["config"]["kv_heads"] == 2 and data["device"]["name"] == "h100-sxm"
    assert [c["context"] for c in data["contexts"]] == [128, 512]
    assert data["speculative"]["k"] == 3
    assert html.stat().st_size > 0


def test_cli_text(runner):
    result = runner.invoke(main, ["llm-model", "--config", "llama-3-8b", "--device", "l4", "--batch", "1,8"])
    assert result.exit_code == 0, result.output
    assert "llama-3-8b" in result.stdout and "TPOT ms" in result.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--config", "tiny-gpt,kv_head=2"], "kv_head"),
    (["--config", "layers=2,d_model=64"], "missing config key"),
    (["--config", "tiny-gpt", "--device", "no-such-gpu"], "unknown device"),
    (["--config", "tiny-gpt", "--batch", "0"], "--batch"),
])
def test_cli_bad_input_exits_2(runner, args, needle):
    result = runner.invoke(main, ["llm-model", *args])
    assert result.exit_code == 2
    assert needle in result.stderr
