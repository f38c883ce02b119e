"""Generation sweeps of Hugging Face models into bundles (the runner and the CLI), and `llm-model` reading HF
configs: reduced Llama (GQA) and DeepSeek (MLA) configs, a local folder written with save_pretrained, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

transformers = pytest.importorskip("transformers")

from workbench.cli import EXIT_BAD_INPUT, main  # noqa: E402
from workbench.errors import WorkbenchError  # noqa: E402
from workbench.llm import hf_run  # noqa: E402
from workbench.llm.hf_run import HFGenerateSettings, run_hf_generation  # noqa: E402
from workbench.llm.tables import trace_decode_steps  # noqa: E402
from workbench.models import LoadedModel  # noqa: E402
from workbench.trace.store.bundle import open_bundle  # noqa: E402
from workbench.trace.store.experiment import read_experiment  # noqa: E402

VOCAB = 512
LLAMA = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 256, "vocab_size": VOCAB}
LLM_KEYS = {"ttft_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s", "kv_cache_bytes", "kv_cache_bytes_predicted"}


def _llama(ref: str, **overrides: object) -> LoadedModel:
    """A reduced Llama as the hf-config loader gives it (the loader itself is tested with the CLI below)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LLAMA)
    return LoadedModel(name="llama-test", module=transformers.LlamaForCausalLM(config).eval(),
                       config=config.to_dict(), source="builtin", default_seq=16,
                       input_maker=lambda batch, seq: (torch.randint(0, VOCAB, (batch, seq),
                                                                     generator=torch.Generator().manual_seed(0)),))


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """Dynamic and static caches, greedy and assisted (k=2, a one-layer draft), one timed run each."""
    root = tmp_path_factory.mktemp("hf-generate")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_run, "load_model", _llama)
        settings = HFGenerateSettings(model="hf-config:llama-test", cache=("dynamic", "static"), prompt=(16,),
                                      new=(8,), speculative=2, draft_layers=1, repeats=1, warmup=0, threads=1)
        return root, run_hf_generation(settings, root)


def test_sweep_writes_a_bundle_per_run_with_the_llm_figures(swept):
    root, result = swept
    assert [run.variant for run in result.runs] == ["gqa-dynamic", "gqa-dynamic-spec2", "gqa-static",
                                                    "gqa-static-spec2"]
    assert [run.status for run in result.runs] == ["ok"] * 4
    assert read_experiment(root, result.experiment_id).run_ids == [run.run_id for run in result.runs]
    for run in result.runs:
        llm = open_bundle(run.run_id, root).info["llm"]
        assert llm.keys() >= LLM_KEYS and llm["ttft_ms"] > 0 and llm["tpot_ms"] > 0 and llm["tokens_per_s"] > 0
        # K and V of 2 kv heads of 32, 2 layers, fp32, prompt + new - 1 positions
        assert llm["kv_cache_bytes"] == llm["kv_cache_bytes_predicted"] == 2 * 2 * 2 * 32 * 23 * 4
        assert llm["cache"] == run.variant.split("-")[1] and llm["attention"] == "gqa" and llm["kv"] == "fp32"
    greedy = open_bundle(result.runs[0].run_id, root).info["llm"]
    assert greedy["numerics"]["vs_recompute"]["tokens"]["identical"]


def test_assisted_runs_report_acceptance(swept):
    root, result = swept
    for run in result.runs[1::2]:
        spec = open_bundle(run.run_id, root).info["llm"]["speculative"]
        assert 0.0 <= spec["acceptance_rate"] <= 1.0 and 0 <= spec["accepted"] <= spec["proposed"]
        assert spec["matches_greedy"] is True and spec["draft_layers"] == 1


def test_bundles_carry_the_prefill_and_decode_phases(swept):
    root, result = swept
    steps = trace_decode_steps(open_bundle(result.runs[2].run_id, root).trace())
    assert steps["label"].tolist() == ["prefill"] + [f"decode {n}" for n in range(7)]
    spec = trace_decode_steps(open_bundle(result.runs[3].run_id, root).trace())
    assert {"prefill", "draft", "verify"} <= set(spec["kind"])


@pytest.mark.parametrize(("changes", "message"), [
    ({"kv": ("int8",)}, "an HF model caches in its weights' dtype"),
    ({"attention": ("mla",)}, "an HF model runs its own"),
    ({"cache": ("paged",)}, "unknown cache 'paged'"),
    ({"cache": ("quantized-fp8",), "speculative": 2}, "use --cache dynamic or static with --speculative"),
    ({"model": "tiny-gpt"}, "not an hf: or hf-config: model"),
])
def test_settings_reject_what_hf_runs_cannot_do(changes, message):
    with pytest.raises(WorkbenchError, match=message):
        HFGenerateSettings(**{"model": "hf-config:llama-3-8b", **changes})


def test_cache_option_is_for_hf_models(tmp_path):
    result = CliRunner().invoke(main, ["generate", "--cache", "static", "--out", str(tmp_path)])
    assert result.exit_code == EXIT_BAD_INPUT and "--cache picks a Hugging Face model's cache" in result.stderr
    assert not any(tmp_path.iterdir())


# --- through the hf-config: loader (workbench.models.hf_presets / hf) -------------------------------------

SMALL = ["--set", "layers=2", "--set", "hidden=128", "--set", "heads=4", "--set", "intermediate=256",
         "--set", "vocab=512"]


@pytest.fixture(scope="module")
def presets():
    return pytest.importorskip("workbench.models.hf_presets", reason="the hf-config: presets are not in this tree")


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "extra", "per_token"), [
    ("llama-3-8b", ["--set", "kv_heads=2"], 2 * 2 * 2 * 32 * 4),  # GQA: K and V of 2 kv heads of 32
    ("deepseek-v3", [], None),  # MLA: the compressed latent + RoPE key, from the preset's own widths
])
def test_cli_generates_with_a_reduced_preset(presets, tmp_path, preset, extra, per_token):
    result = CliRunner().invoke(main, ["generate", "--model", f"hf-config:{preset}", *SMALL, *extra, "--cache",
                                       "dynamic,static", "--prompt", "16", "--new", "8", "--repeats", "1",
                                       "--warmup", "0", "--threads", "1", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [run["status"] for run in runs] == ["ok", "ok"]
    for run in runs:
        llm = run["llm"]
        assert llm.keys() >= LLM_KEYS and llm["kv_cache_bytes"] == llm["kv_cache_bytes_predicted"]
        if per_token is not None:
            assert llm["kv_cache_bytes"] == per_token * 23
        else:
            assert llm["attention"] == "mla" and "MLA" in llm["kv_cache_predicted_from"]


def test_llm_model_reads_a_local_folder(tmp_path):
    pytest.importorskip("workbench.models.hf_local", reason="the hf: local reader is not in this tree")
    transformers.LlamaConfig(**LLAMA).save_pretrained(tmp_path / "llama")
    runner = CliRunner()
    folder = runner.invoke(main, ["llm-model", "--config", f"hf:{tmp_path / 'llama'}", "--device", "h100", "--json"])
    assert folder.exit_code == 0, folder.output
    config = json.loads(folder.stdout)["config"]
    assert (config["layers"], config["d_model"], config["heads"], config["kv_heads"], config["attention"]) == \
        (2, 128, 4, 2, "gqa")
    missing = runner.invoke(main, ["llm-model", "--config", f"hf:{tmp_path / 'nothing-here'}"])
    assert missing.exit_code == EXIT_BAD_INPUT and len(missing.stderr.strip().splitlines()) == 1
    with_set = runner.invoke(main, ["llm-model", "--config", f"hf:{tmp_path / 'llama'}", "--set", "layers=1"])
    assert with_set.exit_code == EXIT_BAD_INPUT and "--set applies to hf-config: presets" in with_set.stderr


def test_llm_model_reads_a_preset_with_overrides(presets):
    preset = CliRunner().invoke(main, ["llm-model", "--config", "hf-config:deepseek-v3", "--set", "layers=2",
                                       "--json"])
    assert preset.exit_code == 0, preset.output
    config = json.loads(preset.stdout)["config"]
    assert config["attention"] == "mla" and config["layers"] == 2 and config["kv_latent"] > 0


@pytest.mark.parametrize("args", [
    ["llm-model", "--config", "hf-config:no-such-model"],
    ["llm-model", "--config", "hf:/no/such/folder"],
    ["llm-model", "--config", "tiny-gpt", "--set", "layers=2"],
    ["generate", "--model", "hf-config:no-such-model"],
])
def test_bad_hf_input_is_one_line_and_exit_2(presets, tmp_path, args):
    result = CliRunner().invoke(main, [*args, *(["--out", str(tmp_path)] if args[0] == "generate" else [])])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not any(tmp_path.iterdir())
