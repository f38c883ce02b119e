"""JAX variants through the experiment runner: numerics against torch, compile facts, XSpace capture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("jax")

from workbench.backends import get_variant, prepare
from workbench.backends.jax_backend import ARTIFACTS, jax_device
from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.experiment import ExperimentResult, ExperimentSettings, run_experiment
from workbench.models import load_model
from workbench.profiling import ProfileSettings
from workbench.trace import read_trace
from workbench.trace.store.bundle import open_bundle

SMALL_GPT = {"layers": 1, "d_model": 64, "heads": 4, "kv_heads": 2, "vocab": 256, "max_seq": 64}
JAX_VARIANTS = ("eager", "jax-jit", "jax-jit-bf16", "jax-jit-fp16", "jax-nofusion")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> ExperimentResult:
    root = tmp_path_factory.mktemp("jax-traces")
    settings = ExperimentSettings(model="tiny-gpt", variants=JAX_VARIANTS, batch=2, seq=16, warmup=1, iterations=3,
                                  profile_settings=ProfileSettings(warmup_steps=1, active_steps=2),
                                  model_overrides=SMALL_GPT, threads=1)
    return run_experiment(settings, root)


def _run(experiment: ExperimentResult, variant: str) -> dict:
    (run,) = [r for r in experiment.runs if r.variant == variant]
    assert run.status == "ok", run.error
    return json.loads((run.path / "run.json").read_text())


def test_every_jax_variant_runs_and_matches_torch(experiment: ExperimentResult) -> None:
    fp32 = _run(experiment, "jax-jit")["numerics"]
    assert fp32["sqnr_db"] > 80 and fp32["top1_agreement"] == 1.0  # same weights, float32 rounding only
    nofusion = _run(experiment, "jax-nofusion")["numerics"]
    assert nofusion["sqnr_db"] > 80
    for low in ("jax-jit-bf16", "jax-jit-fp16"):
        numerics = _run(experiment, low)["numerics"]
        assert 15 < numerics["sqnr_db"] < fp32["sqnr_db"], low  # close, but visibly lower precision
    for run in experiment.runs:
        assert run.p50_ms is not None and run.p50_ms > 0


def test_compile_facts_are_recorded(experiment: ExperimentResult) -> None:
    for variant in ("jax-jit", "jax-nofusion"):
        info = _run(experiment, variant)
        xla = info["notes"]["xla"]
        assert xla["cost_analysis"]["flops"] > 0 and xla["cost_analysis"]["bytes accessed"] > 0
        assert {"argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"} <= xla["memory_analysis"].keys()
    fused = _run(experiment, "jax-jit")
    unfused = _run(experiment, "jax-nofusion")
    assert unfused["notes"]["xla"]["compiler_options"]["xla_cpu_use_xnnpack"] is False
    assert fused["notes"]["xla"]["compiler_options"] is None
    for run in experiment.runs:
        if run.variant.startswith("jax"):
            optimized = (run.path / "compile" / ARTIFACTS["optimized"]).read_text()
            assert optimized.startswith("HloModule") and "ENTRY" in optimized
            assert "stablehlo" in (run.path / "compile" / ARTIFACTS["lowered"]).read_text()
    fused_text = (_path(experiment, "jax-jit") / "compile" / ARTIFACTS["optimized"]).read_text()
    unfused_text = (_path(experiment, "jax-nofusion") / "compile" / ARTIFACTS["optimized"]).read_text()
    assert len(unfused_text.splitlines()) > len(fused_text.splitlines())


def _path(experiment: ExperimentResult, variant: str) -> Path:
    return next(r.path for r in experiment.runs if r.variant == variant)


def test_xspace_capture_is_in_the_bundle_with_phases_and_steps(experiment: ExperimentResult) -> None:
    path = _path(experiment, "jax-jit")
    bundle = open_bundle(path, path.parent)
    assert bundle.info["capture"]["profiler"] == "jax.profiler"
    (xplane,) = (path / "raw" / "plugins" / "profile").glob("*/*.xplane.pb")
    assert list(xplane.parent.glob("*.trace.json.gz"))
    events = bundle.trace().events.to_pandas()
    kinds = set(events["kind"])
    assert {"hlo", "module", "annotation"} <= kinds
    names = set(events.loc[events["kind"] == "annotation", "name"])
    assert {"load", "compile", "warmup", "measure", "step 0", "step 1"} <= names
    steps = events[(events["kind"] == "annotation") & (events["name"] == "step")]
    assert len(steps) == 2  # StepTraceAnnotation around each measured iteration
    # the same capture read again from raw/ gives the same table
    again = read_trace(xplane.parent)
    assert again.events.num_rows == bundle.trace().events.num_rows


def test_device_names_and_unavailable_platforms() -> None:
    assert jax_device("cpu").platform == "cpu"
    with pytest.raises(VariantUnavailable, match="no gpu backend"):
        jax_device("cuda:0")
    with pytest.raises(VariantUnavailable, match="no tpu backend"):
        jax_device("tpu:0")
    with pytest.raises(WorkbenchError, match="invalid device"):
        get_variant("jax-jit", device="npu:0")
    with pytest.raises(VariantUnavailable, match="no TPU backend"):
        prepare(get_variant("eager", device="tpu"), load_model("mlp", hidden=16))


FACTORY = """
import torch


def make():
    return torch.nn.Linear(4, 2), (torch.ones(1, 4),)
"""


def test_a_model_without_a_jax_port_fails_only_its_jax_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wb_jax_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = ExperimentSettings(model="wb_jax_factory:make", variants=("eager", "jax-jit"), batch=1,
                                  warmup=0, iterations=1, profile=False)
    result = run_experiment(settings, tmp_path / "traces")
    status = {run.variant: run for run in result.runs}
    assert status["eager"].status == "ok"
    assert status["jax-jit"].status == "failed" and "JAX" in status["jax-jit"].error


def test_xprof_tool_data_is_kept_in_the_bundle(experiment: ExperimentResult) -> None:
    path = _path(experiment, "jax-jit")
    tools = json.loads((path / "run.json").read_text())["xprof"]["tools"]
    assert not tools["trace_viewer"]["empty"] and not tools["graph_viewer"]["empty"]
    for tool in ("trace_viewer", "memory_viewer", "graph_viewer"):
        assert tools[tool]["files"], tool
        for name in tools[tool]["files"]:
            assert (path / "xprof" / name).is_file(), name
    assert tools["op_profile"]["empty"]  # XLA:CPU captures have no device op profile
    assert any("jit_wrapped" in name for name in tools["graph_viewer"]["files"])


def test_fusion_table_sets_jax_jit_against_jax_nofusion_and_eager(experiment: ExperimentResult) -> None:
    from workbench.analysis.fusion import fusion_inputs, fusion_table

    bundles = [open_bundle(run.path, run.path.parent) for run in experiment.runs]
    table = fusion_table([fusion_inputs(b) for b in bundles]).set_index("variant")
    jit, nofusion = table.loc["jax-jit"], table.loc["jax-nofusion"]
    assert jit["framework"] == "jax" and table.loc["eager", "framework"] == "torch"
    assert jit["fusions"] > 0 and nofusion["fusions"] == 0
    assert nofusion["kernels"] > jit["kernels"] and nofusion["bytes_accessed"] > jit["bytes_accessed"]
    assert jit["steps"] == 2 and jit["flops"] > 0


def test_runs_record_their_device_figures(experiment: ExperimentResult) -> None:
    for variant in ("eager", "jax-jit"):
        props = _run(experiment, variant)["device_properties"]
        assert props["kind"] == "cpu" and props["measured"]
        assert props["peak_flops"]["fp32"] > 0 and props["memory_bw_bytes_per_s"] > 0
        assert props["sources"]["peak_flops.fp32"].startswith("measured")


def test_xla_ops_of_the_model_carry_their_costs(experiment: ExperimentResult) -> None:
    path = _path(experiment, "jax-jit")
    info = json.loads((path / "run.json").read_text())
    events = open_bundle(path, path.parent).trace().events.to_pandas()
    ops = events[(events["kind"] == "hlo") & events["args"].str.contains('"hlo_module": "jit_wrapped"')]
    assert ops["flops"].notna().all()
    per_step = ops["flops"].sum() / 4  # the compiling first call, one warm-up and two measured steps
    assert per_step == pytest.approx(info["notes"]["xla"]["cost_analysis"]["flops"], rel=1e-6)
