"""`workbench generate`: bundles with the llm figures, `show --json`, the sweep, the report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.analysis.summary import run_summary
from workbench.cli import EXIT_BAD_INPUT, main
from workbench.llm.kv_cache import kv_cache_bytes
from workbench.llm.run import GenerateSettings, generation_points, run_generation
from workbench.llm.tables import trace_decode_steps as decode_steps
from workbench.llm.tables import variant_table
from workbench.trace.store.bundle import Bundle, open_bundle
from workbench.trace.store.experiment import read_experiment

SMALL = ["--set", "vocab=256", "--set", "layers=2", "--set", "d_model=64", "--set", "heads=4", "--set", "max_seq=64"]
LLM_KEYS = {"ttft_ms", "tpot_ms", "tokens_per_s", "kv_cache_bytes"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    """One CLI sweep: MHA and MLA, fp32 and int8 caches, greedy and speculative (k=2), with a report."""
    tmp = tmp_path_factory.mktemp("generate")
    root, report = tmp / "traces", tmp / "report.html"
    result = CliRunner().invoke(main, [
        "generate", *SMALL, "--attention", "mha,mla", "--kv", "fp32,int8", "--prompt", "12", "--new", "8",
        "--speculative", "2", "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(root),
        "--report", str(report), "--json"])
    assert result.exit_code == 0, result.output
    return root, json.loads(result.stdout), report


def test_generate_writes_one_bundle_per_run_and_an_experiment(generated):
    root, out, _ = generated
    names = [run["variant"] for run in out["runs"]]
    assert names == ["mha-fp32", "mha-fp32-spec2", "mha-int8", "mha-int8-spec2",
                     "mla-fp32", "mla-fp32-spec2", "mla-int8", "mla-int8-spec2"]
    assert all(run["status"] == "ok" for run in out["runs"])
    experiment = read_experiment(root, out["experiment"])
    assert experiment.run_ids == [run["run_id"] for run in out["runs"]]
    for run in out["runs"]:
        bundle = open_bundle(run["run_id"], root)
        assert bundle.info["experiment"] == out["experiment"]
        assert bundle.info["benchmark"]["iterations"] == 2
        assert len(bundle.info["generation"]["timed"]) == 2


def test_show_json_has_the_llm_figures(generated):
    root, out, _ = generated
    run_id = next(run["run_id"] for run in out["runs"] if run["variant"] == "mla-int8")
    shown = CliRunner().invoke(main, ["show", run_id, "--out", str(root), "--json"])
    assert shown.exit_code == 0, shown.output
    llm = json.loads(shown.stdout)["llm"]
    assert llm.keys() >= LLM_KEYS
    assert llm["ttft_ms"] > 0 and llm["tpot_ms"] > 0 and llm["tokens_per_s"] > 0
    assert (llm["attention"], llm["kv"], llm["decoding"]) == ("mla", "int8", "greedy")


def test_kv_bytes_are_measured_and_predicted_and_mla_halves_them(generated):
    root, out, _ = generated
    infos = {run["variant"]: open_bundle(run["run_id"], root).info for run in out["runs"]}
    for info in infos.values():
        llm = info["llm"]
        assert llm["kv_cache_bytes"] == llm["kv_cache_bytes_predicted"] == kv_cache_bytes(
            info["model"]["config"], 1, 12 + 8 - 1, llm["kv"])
    # MLA's latent (4 · head_dim = 64 values) against K and V of 4 heads of 16 (128 values)
    assert infos["mha-fp32"]["llm"]["kv_cache_bytes"] == 2 * infos["mla-fp32"]["llm"]["kv_cache_bytes"]
    assert infos["mha-int8"]["llm"]["kv_cache_bytes"] < infos["mha-fp32"]["llm"]["kv_cache_bytes"] / 3


def test_numerics_and_speculative_figures(generated):
    root, out, _ = generated
    infos = {run["variant"]: open_bundle(run["run_id"], root).info["llm"] for run in out["runs"]}
    assert infos["mha-fp32"]["numerics"]["vs_recompute"]["tokens"]["identical"]
    vs_fp32 = infos["mla-int8"]["numerics"]["vs_fp32_cache"]
    assert vs_fp32["reference"] == "fp32 KV cache" and vs_fp32["logits"]["sqnr_db"] > 30
    spec = infos["mha-int8-spec2"]["speculative"]
    assert spec["matches_greedy"] is True and spec["k"] == 2 and spec["draft_layers"] == 1
    assert 0 <= spec["accepted"] <= spec["proposed"] and spec["speedup_vs_greedy"] > 0
    assert spec["greedy_run"] == next(r["run_id"] for r in out["runs"] if r["variant"] == "mha-int8")


def test_bundle_trace_shows_prefill_and_decode_steps(generated):
    root, out, _ = generated
    bundle = open_bundle(next(run["run_id"] for run in out["runs"] if run["variant"] == "mha-fp32"), root)
    steps = decode_steps(bundle.trace())
    assert steps["label"].tolist() == ["prefill"] + [f"decode {n}" for n in range(7)]
    assert steps["start_ns"].iloc[0] == 0 and (steps["start_ns"].diff().dropna() > 0).all()
    summary = run_summary(bundle)
    assert summary["ops_window"] == "measure" and summary["top_ops"]
    table = variant_table([open_bundle(run["run_id"], root) for run in out["runs"]])
    assert table["variant"].tolist() == [run["variant"] for run in out["runs"]]
    assert table.loc[table["kv"] == "int8", "sqnr_db"].notna().any()


def test_report_has_the_generation_figures(generated):
    _, out, report = generated
    assert out["report"] == str(report)
    html = report.read_text(encoding="utf-8")
    assert "time to first token" in html and "decode timeline" in html


def test_report_of_a_generation_experiment_places_the_generation_view(generated, tmp_path):
    root, out, _ = generated
    for ref in (out["experiment"], out["runs"][0]["run_id"]):
        target = tmp_path / f"{ref}.html"
        result = CliRunner().invoke(main, ["report", ref, "--out", str(root), "-o", str(target)])
        assert result.exit_code == 0, result.output
        html = target.read_text(encoding="utf-8")
        assert "time to first token" in html and "decode timeline" in html


def test_generate_prints_its_table(tmp_path):
    result = CliRunner().invoke(main, ["generate", *SMALL, "--prompt", "4", "--new", "2", "--repeats", "1",
                                       "--warmup", "0", "--no-profile", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (experiment,) = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("generation ")]
    row = next(line for line in result.stdout.splitlines() if line.lstrip("│ ").startswith("mha-fp32"))
    run = open_bundle(read_experiment(tmp_path, experiment).run_ids[0], tmp_path)
    assert "ok" in row and run.run_id in row
    assert f"{run.info['llm']['ttft_ms']:.3g}" in row


def test_generate_rejects_bad_input_before_writing(tmp_path):
    runner = CliRunner()
    for args, message in ((["--kv", "int4"], "unknown KV-cache dtype 'int4'"),
                          (["--attention", "linear"], "unknown attention 'linear'"),
                          (["--batch", "2", "--speculative", "2"], "use batch 1"),
                          (["--prompt", "60", "--new", "8"], "exceed max_seq 64")):
        result = runner.invoke(main, ["generate", *SMALL, *args, "--out", str(tmp_path)])
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert message in result.stderr
    assert not any(tmp_path.iterdir())
    bad = runner.invoke(main, ["generate", "--new", "0,4", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "values must be >= 1" in bad.output


def test_sweeps_name_runs_by_what_varies(tmp_path):
    settings = GenerateSettings(batch=(1, 2), prompt=(4,), new=(2, 3), repeats=1, warmup=0, profile=False,
                                model_overrides={"vocab": 64, "layers": 1, "d_model": 32, "heads": 2, "max_seq": 16})
    assert len(generation_points(settings)) == 4
    result = run_generation(settings, tmp_path)
    assert [run.variant for run in result.runs] == ["mha-fp32-b1-n2", "mha-fp32-b1-n3", "mha-fp32-b2-n2",
                                                    "mha-fp32-b2-n3"]
    for run in result.runs:
        assert run.status == "ok" and run.llm["output_tokens"] == int(run.variant[-1])
        assert run.llm["batch"] == int(run.variant.split("-b")[1][0]) and run.llm["peak_memory_bytes"] is None
        assert not open_bundle(run.run_id, tmp_path).has_trace


def test_summary_of_other_runs_has_no_llm_figures(tmp_path):
    bundle = Bundle(tmp_path, "plain", {"status": "ok", "benchmark": {"p50": 1.0}})
    assert run_summary(bundle)["llm"] is None
