"""Provenance of kernels: a one-block GPT captured eager, under torch.compile and (where jax is installed) under
JAX/XLA; every fused kernel names its source ops, the per-source-op totals add up to each run's kernel time,
and eager and compile line up op by op."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from workbench.analysis.fusion import OPTIMIZED_HLO, hlo_fusions, kernel_units
from workbench.analysis.provenance import (
    INDUCTOR_GRAPHS,
    by_source_op,
    compare_by_source_op,
    fused_name_ops,
    provenance,
)
from workbench.trace.store.bundle import Bundle, open_bundle

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 2, "max_seq": 16}


def _capture(root, variants: tuple[str, ...]) -> dict[str, Bundle]:
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.profiling import ProfileSettings

    settings = ExperimentSettings(model="tiny-gpt", variants=variants, seq=16, model_overrides=TINY_GPT, batch=2,
                                  warmup=1, iterations=2, threads=1,
                                  profile_settings=ProfileSettings(warmup_steps=1, active_steps=2))
    result = run_experiment(settings, root)
    assert [run.status for run in result.runs] == ["ok"] * len(variants), [run.error for run in result.runs]
    return {run.variant: open_bundle(run.run_id, root) for run in result.runs}


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    return _capture(tmp_path_factory.mktemp("traces"), ("eager", "compile"))


def _kernel_total(bundle: Bundle) -> int:
    """The run's kernel time inside its profiled steps, from the fusion analysis' kernels."""
    units = kernel_units(bundle.trace())
    return int(units.loc[units["step"] >= 0, "dur_ns"].sum())


def test_kernel_names_list_their_aten_ops() -> None:
    assert fused_name_ops("graph_0_cpp_fused_add_arange_embedding_native_layer_norm_view_1") == [
        "add", "arange", "embedding", "native_layer_norm", "view"]
    assert fused_name_ops("triton_per_fused__softmax_add_1") == ["_softmax", "add"]
    assert fused_name_ops("aten::addmm") == []


@pytest.mark.slow
def test_compile_keeps_inductors_record(torch_runs: dict[str, Bundle]) -> None:
    path = torch_runs["compile"].local_files() / "compile" / INDUCTOR_GRAPHS
    graphs = json.loads(path.read_text())["graphs"]
    assert len(graphs) == 1
    assert "cppCodeToPost" in graphs[0]["provenance"] and "def call" in graphs[0]["output_code"]
    assert "gelu(" in graphs[0]["dynamo_graph"] and "tiny_gpt.py" in graphs[0]["dynamo_graph"]
    assert not (torch_runs["eager"].local_files() / "compile" / INDUCTOR_GRAPHS).exists()


@pytest.mark.slow
def test_every_fused_kernel_names_its_source_ops(torch_runs: dict[str, Bundle]) -> None:
    compiled, eager = provenance(torch_runs["compile"]), provenance(torch_runs["eager"])
    generated = compiled[compiled["kernel"].str.contains("cpp_fused")]
    assert len(generated) >= 3
    assert (generated["how"] == "inductor provenance").all() and (generated["n_source_ops"] >= 1).all()
    eager_ops = {op for ops in eager["source_ops"] for op in ops}
    compiled_ops = {op for ops in compiled["source_ops"] for op in ops}
    assert compiled_ops <= eager_ops  # the same names for the same calls of the model
    gelu = generated[generated["kernel"].str.contains("gelu")]
    assert [list(ops) for ops in gelu["source_ops"]] == [["gelu"]]
    addmm = compiled[compiled["kernel"] == "aten::addmm"]
    assert sorted(op for ops in addmm["source_ops"] for op in ops) == [f"linear_{i}" if i else "linear"
                                                                       for i in range(6)]
    assert (eager["source_kind"] == "eager").all() and (eager["n_source_ops"] == 1).all()
    assert set(compiled["source_kind"]) == {"inductor", "eager"}  # the output's .float() runs eager


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["eager", "compile"])
def test_source_op_totals_add_up_to_the_runs_kernel_time(torch_runs: dict[str, Bundle], variant: str) -> None:
    bundle = torch_runs[variant]
    total = _kernel_total(bundle)
    sources = by_source_op(bundle)
    assert int(sources["time_ns"].sum()) == total == int(provenance(bundle)["time_ns"].sum())
    assert sources["share"].sum() == pytest.approx(1.0)
    assert sources["source_op"].is_unique


@pytest.mark.slow
def test_eager_against_compile_by_source_op(torch_runs: dict[str, Bundle]) -> None:
    eager, compiled = torch_runs["eager"], torch_runs["compile"]
    groups = compare_by_source_op(eager, compiled)
    assert groups.attrs["a"] == "eager" and groups.attrs["b"] == "compile" and groups.attrs["a_kind"] == "eager"
    assert groups["a_ns"].sum() == pytest.approx(_kernel_total(eager) / 2)  # two profiled steps
    assert groups["b_ns"].sum() == pytest.approx(_kernel_total(compiled) / 2)
    ops = [op for group in groups["source_ops"] for op in group]
    assert len(ops) == len(set(ops))  # each source op in one group
    gelu = groups[groups["source_ops"].map(lambda g: g == ["gelu"])].iloc[0]
    assert (gelu["a_n"], gelu["b_n"]) == (1, 1) and gelu["b_kernels"][0].endswith("cpp_fused_gelu_view_2")
    norms = groups[groups["source_ops"].map(lambda g: "layer_norm_1" in g)].iloc[0]
    assert norms["a_n"] > norms["b_n"] >= 1  # several eager ops, fewer fused kernels
    assert all("cpp_fused" in kernel for kernel in norms["b_kernels"])


@pytest.mark.slow
def test_cli_json(torch_runs: dict[str, Bundle]) -> None:
    from workbench.cli import main

    eager, compiled = torch_runs["eager"], torch_runs["compile"]
    root = str(eager.path.parent)
    result = CliRunner().invoke(main, ["provenance", eager.run_id, compiled.run_id, "--json", "--out", root])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["a"], document["b"]) == ("eager", "compile")
    assert sum(g["b_ns"] for g in document["groups"]) == pytest.approx(_kernel_total(compiled) / 2)
    one = CliRunner().invoke(main, ["provenance", compiled.run_id, "--json", "--out", root])
    assert one.exit_code == 0, one.output
    assert sum(row["time_ns"] for row in json.loads(one.output)["by_source_op"]) == _kernel_total(compiled)


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    return _capture(tmp_path_factory.mktemp("jax"), ("jax-nofusion", "jax-jit"))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["jax-nofusion", "jax-jit"])
def test_xla_kernels_name_their_source_ops(jax_runs: dict[str, Bundle], variant: str) -> None:
    bundle = jax_runs[variant]
    table = provenance(bundle)
    hlo = (bundle.local_files() / "compile" / OPTIMIZED_HLO).read_text()
    fusions = hlo_fusions(hlo)
    fused = set(fusions.loc[~fusions["single_op"], "name"])
    rows = table[table["kernel"].isin(fused)]
    assert len(rows) == len(fused) and (len(fused) > 0) == (variant == "jax-jit")
    assert (rows["how"] == "hlo metadata").all() and (rows["n_source_ops"] >= 1).all()
    assert all(" @ " in op for ops in rows["source_ops"] for op in ops)  # each with its call site
    assert int(by_source_op(bundle)["time_ns"].sum()) == _kernel_total(bundle)


@pytest.mark.slow
def test_xla_fusion_against_no_fusion(jax_runs: dict[str, Bundle]) -> None:
    groups = compare_by_source_op(jax_runs["jax-nofusion"], jax_runs["jax-jit"])
    assert groups["a_ns"].sum() == pytest.approx(_kernel_total(jax_runs["jax-nofusion"]) / 2)
    assert groups["b_ns"].sum() == pytest.approx(_kernel_total(jax_runs["jax-jit"]) / 2)
    assert (groups["a_n"] >= groups["b_n"]).sum() > len(groups) / 2  # fusion folds several kernels into one


@pytest.fixture(scope="module")
def ort_run(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    pytest.importorskip("onnxruntime")
    return _capture(tmp_path_factory.mktemp("ort"), ("ort",))["ort"]


@pytest.mark.slow
def test_ort_fused_nodes_name_the_onnx_nodes_they_replaced(ort_run: Bundle) -> None:
    table = provenance(ort_run)
    record = json.loads((ort_run.local_files() / "compile" / "ort_graph.json").read_text())
    types = record["node_types"]
    fused = table[table["how"] == "ort graph"]
    assert len(fused) >= 2 and (fused["n_source_ops"] >= 2).all(), table
    assert (table.loc[table["how"] == "ort node", "n_source_ops"] == 1).all()
    # What ORT's fusions are documented to replace: a FusedMatMul (MatMulScaleFusion) is a MatMul and the Mul of
    # its scale; a SkipLayerNormalization a residual Add and a LayerNormalization.
    expected = {"FusedMatMul": {"MatMul", "Mul"}, "SkipLayerNormalization": {"Add", "LayerNormalization"}}
    seen = set()
    for row in fused.itertuples():
        assert row.kernel not in row.source_ops
        assert all(types[op] == t for op, t in zip(row.source_ops, row.op_types, strict=True))
        if types[row.kernel] in expected:
            seen.add(types[row.kernel])
            assert expected[types[row.kernel]] <= set(row.op_types), row
    assert seen == set(expected)
    assert by_source_op(ort_run)["time_ns"].sum() == _kernel_total(ort_run)
