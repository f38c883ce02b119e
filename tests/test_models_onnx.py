"""ONNX files as a model source (`onnx:<file>` or a .onnx path): inputs from the graph's declared inputs, run only
by the ONNX Runtime variants against ORT without optimizations, a corrupt file refused before anything is
written, and a torch model whose export fails failing only its ORT variant."""

from __future__ import annotations

import json
import textwrap
import uuid

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.experiment import ExperimentSettings, run_experiment
from workbench.models import load_model
from workbench.models.registry import model_source
from workbench.trace.store.bundle import open_bundle

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

MLP = {"in_features": 16, "hidden": 32, "num_classes": 10}
VOCAB = 50


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    """mlp exported by the workbench's exporter (symbolic batch axis), as a user's .onnx file."""
    from workbench.backends.tensorrt.onnx_export import export_onnx

    loaded = load_model("mlp", **MLP)
    path = tmp_path_factory.mktemp("onnx") / "mlp.onnx"
    export_onnx(loaded.module, loaded.make_inputs(2), path)
    return path, loaded


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    """A graph taking int64 `tokens` [batch, seq] into a VOCAB-row embedding (Gather) and a fixed `scale` [1]."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(VOCAB * 4, dtype=np.float32).reshape(VOCAB, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "tokens"], ["e"]), helper.make_node("Mul", ["e", "scale"], ["y"])], "g",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])], [table])
    path = tmp_path_factory.mktemp("onnx") / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), path)
    return path


def test_an_onnx_file_resolves_with_inputs_from_its_graph(mlp_file):
    path, mlp = mlp_file
    assert model_source(f"onnx:{path}") == model_source(str(path)) == "onnx"
    for ref in (f"onnx:{path}", str(path)):
        loaded = load_model(ref)
        assert loaded.source == "onnx" and loaded.name == "mlp"
        assert loaded.backends == ("onnxruntime",) and loaded.reference == "ort-noopt"
        (x,) = loaded.make_inputs(3)
        assert x.shape == (3, MLP["in_features"]) and x.dtype == torch.float32
        assert loaded.default_seq is None and loaded.tokens(3) is None
        # the file's initializers: mlp's weights and the GELU's scalar constants
        weights = sum(int(np.prod(init.dims)) for init in onnx.load(str(path)).graph.initializer)
        assert loaded.parameter_count == weights and 0 <= weights - mlp.parameter_count <= 4
    (again,) = load_model(str(path)).make_inputs(3)
    assert torch.equal(x, again)  # seeded


def test_symbolic_dims_take_batch_and_seq_and_shapes_override(token_file):
    loaded = load_model(str(token_file))
    tokens, scale = loaded.make_inputs(2, 7)
    assert tokens.shape == (2, 7) and tokens.dtype == torch.int64
    assert 0 <= int(tokens.min()) <= int(tokens.max()) < VOCAB
    assert scale.shape == (1,) and scale.dtype == torch.float32
    assert loaded.default_seq == 128 and loaded.tokens(2, 7) == 14
    tokens, _ = load_model(str(token_file), shapes={"tokens": "1x5"}).make_inputs(2)
    assert tokens.shape == (1, 5)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"shapes": {"tokens": "1xa"}}, "expected dims like 1x3x224x224"),
    ({"shapes": {"pixels": "1x5"}}, "names no graph input: pixels; inputs: tokens, scale"),
    ({"layers": 2}, "no config key"),
])
def test_bad_overrides_say_what_is_wrong(token_file, overrides, message):
    with pytest.raises(WorkbenchError, match=message):
        load_model(str(token_file), **overrides)


def test_only_ort_variants_run_it_against_ort_without_optimizations(mlp_file, tmp_path):
    path, _ = mlp_file
    settings = ExperimentSettings(model=f"onnx:{path}", variants=("eager", "ort", "ort-int8"), batch=2, warmup=1,
                                  iterations=2, threads=1, profile=False)
    runs = {run.variant: run for run in run_experiment(settings, tmp_path).runs}
    assert runs["eager"].status == "failed"
    assert "runs only on onnxruntime variants" in runs["eager"].error
    assert runs["ort"].status == runs["ort-int8"].status == "ok", runs
    assert float(runs["ort"].numerics["sqnr_db"]) > 60 and runs["ort-int8"].numerics["sqnr_db"] > 15
    record = open_bundle(runs["ort"].run_id, tmp_path).record
    assert record.reference == "ort-noopt" and record.model["source"] == "onnx"
    assert record.notes["onnx"]["source"] == "onnx file"


def test_capture_takes_input_shapes_for_an_onnx_file(mlp_file, tmp_path):
    path, _ = mlp_file
    result = CliRunner().invoke(main, ["capture", "--model", str(path), "--variants", "ort", "--batch", "3",
                                       "--shape", f"input={3}x{MLP['in_features']}", "--iterations", "2",
                                       "--warmup", "0", "--no-profile", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output[result.output.index("{"):])["runs"]
    record = open_bundle(run["run_id"], tmp_path).record
    assert record.model["config"]["shapes"] == {"input": [3, MLP["in_features"]]} and record.reference == "ort-noopt"
    bad = CliRunner().invoke(main, ["capture", "--model", str(path), "--shape", "input", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "expected NAME=DIMS" in bad.output


def test_a_corrupt_onnx_file_exits_2_naming_it_with_nothing_written(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf" * 5)
    root = tmp_path / "root"
    result = CliRunner().invoke(main, ["capture", "--model", str(bad), "--variants", "ort", "--out", str(root)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "broken.onnx" in lines[0] and "not a readable ONNX model" in lines[0]
    assert not root.exists() or not [p for p in root.iterdir() if not p.name.startswith(".")]


UNEXPORTABLE = """
    import torch

    class RunningMax(torch.nn.Module):
        def forward(self, x):
            return torch.cummax(x, 1).values  # aten.cummax has no ONNX function in torch's exporter

    def make():
        return RunningMax(), (torch.randn(2, 4),)
"""


def test_an_export_failure_fails_only_the_ort_variant(tmp_path, monkeypatch):
    name = f"wb_unexportable_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(UNEXPORTABLE))
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "root"
    result = CliRunner().invoke(main, ["capture", "--model", f"{name}:make", "--variants", "eager,ort", "--batch",
                                       "2", "--iterations", "2", "--warmup", "0", "--no-profile", "--json",
                                       "--out", str(root)])
    assert result.exit_code == 1, result.output
    runs = {run["variant"]: run for run in json.loads(result.output[result.output.index("{"):])["runs"]}
    assert runs["eager"]["status"] == "ok"
    assert runs["ort"]["status"] == "failed"
    assert "ONNX export of RunningMax failed: DispatchError: No ONNX function found" in runs["ort"]["error"]
    assert "aten.cummax" in runs["ort"]["error"] and "\n" not in runs["ort"]["error"]
