"""The TensorRT path: ONNX export and ModelOpt precision steps on CPU (checked through onnxruntime), the
engine-inspector fusion parser, the IProfiler layer events, and the engine build/run on a GPU.

CPU tolerances, against torch eager fp32 on the same inputs:
- exported fp32 graph: same arithmetic, other kernels (MLAS vs torch's GEMMs) and summation orders;
  differences are a few float32 ulps per dot product (~1e-6 seen), so 1e-4 absolute + relative is tight
  enough to catch any wrong op or weight and loose enough for kernel choice.
- fp16 AutoCast: fp16's unit roundoff is 4.9e-4 and errors grow over a dozen layers; relative L2 error
  under 1e-2 (≈2e-3 seen) and a result that differs from fp32 at all (so the cast happened).
- int8 / fp8 Q/DQ: int8 keeps 255 levels per tensor (~0.4 % of its range per step), e4m3 fp8 3 mantissa bits
  (6 % relative step); both compound over ~16 quantized matmuls plus fp16 elsewhere. Relative L2 under
  0.1 (int8, ≈0.04 seen) and 0.15 (fp8, ≈0.05 seen), and top-1 agreement of the logits. The small MLP
  gets 0.2 for int8 (≈0.11 seen): its 16–32 wide dot products average little rounding noise, and max
  calibration sets its GELU outputs' int8 step (~0.03) by rare outliers, against typical values ~0.3.
"""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from workbench.analysis.trt_fusion import (
    metadata_nodes,
    read_engine_json,
    split_layer_name,
    tensor_dtype,
    trt_fusions,
    trt_summary,
)
from workbench.backends.tensorrt.deps import MIN_TENSORRT, check_installed, require
from workbench.backends.variants import Variant
from workbench.errors import MissingDependency, VariantUnavailable, WorkbenchError
from workbench.models import load_model
from workbench.trace import schema
from workbench.trace.formats.trt_layers import TRACK, LayerTimes, layer_trace

SEQ = 8


@pytest.fixture(scope="module")
def gpt():
    return load_model("tiny-gpt", d_model=32, layers=1, heads=2, vocab=64, max_seq=16)


@pytest.fixture(scope="module")
def mlp():
    return load_model("mlp", in_features=16, hidden=32, hidden_layers=1, num_classes=10)


@pytest.fixture(scope="module")
def gpt_onnx(gpt, tmp_path_factory):
    pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript (workbench[onnx])")
    from workbench.backends.tensorrt.onnx_export import export_onnx

    return export_onnx(gpt.module, gpt.make_inputs(2, SEQ), tmp_path_factory.mktemp("gpt") / "model.onnx")


@pytest.fixture(scope="module")
def mlp_onnx(mlp, tmp_path_factory):
    pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript (workbench[onnx])")
    from workbench.backends.tensorrt.onnx_export import export_onnx

    # batch 1: the exporter must still keep the batch axis symbolic
    return export_onnx(mlp.module, mlp.make_inputs(1), tmp_path_factory.mktemp("mlp") / "model.onnx")


def _ort_run(path, feeds, *, optimize=True):
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {name: np.asarray(value) for name, value in feeds.items()})[0]


def _reference(loaded, inputs):
    with torch.no_grad():
        return loaded.module(*inputs).numpy()


def _rel_l2(out, ref):
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def _calibration(loaded, names, seq):
    from workbench.backends.tensorrt.prepared import calibration_inputs

    return calibration_inputs(loaded, names, batch=3, seq=seq, samples=9)


# --- ONNX export ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["gpt", "mlp"])
def test_export_matches_eager_at_another_batch(which, request):
    loaded = request.getfixturevalue(which)
    exported = request.getfixturevalue(f"{which}_onnx")
    seq = SEQ if which == "gpt" else None
    inputs = loaded.make_inputs(3, seq)  # exported at batch 2 / 1: runs at 3 only if the batch axis is symbolic
    out = _ort_run(exported.path, dict(zip(exported.input_names, (t.numpy() for t in inputs), strict=True)))
    np.testing.assert_allclose(out, _reference(loaded, inputs), rtol=1e-4, atol=1e-4)


def test_export_facts(gpt_onnx, mlp_onnx):
    from workbench.backends.tensorrt.onnx_graph import graph_facts

    assert gpt_onnx.input_names == ("tokens",) and gpt_onnx.opset == 19 and gpt_onnx.dynamic_batch
    facts = graph_facts(gpt_onnx.path)
    assert facts.inputs["tokens"] == ("INT64", ["batch", SEQ])
    assert facts.ops["MatMul"] >= 6 and facts.ops["Softmax"] == 1  # attention exported as MatMul/Softmax
    assert graph_facts(mlp_onnx.path).inputs[mlp_onnx.input_names[0]] == ("FLOAT", ["batch", 16])


def test_export_rejects_empty_inputs(mlp, tmp_path):
    pytest.importorskip("onnxscript")
    from workbench.backends.tensorrt.onnx_export import export_onnx

    with pytest.raises(WorkbenchError, match="example inputs"):
        export_onnx(mlp.module, (), tmp_path / "x.onnx")


# --- calibration inputs ---------------------------------------------------------------------------------


def test_calibration_rows_follow_the_evaluated_batch(gpt):
    from workbench.backends.tensorrt.prepared import calibration_inputs

    arrays = calibration_inputs(gpt, ["tokens"], batch=2, seq=SEQ, samples=4)
    assert arrays["tokens"].shape == (4, SEQ) and arrays["tokens"].dtype == np.int64
    np.testing.assert_array_equal(arrays["tokens"], gpt.make_inputs(6, SEQ)[0][2:].numpy())
    with pytest.raises(WorkbenchError, match="makes 1 inputs, its ONNX graph takes 2"):
        calibration_inputs(gpt, ["a", "b"], batch=1, seq=SEQ, samples=2)


def test_infer_seq(gpt, mlp):
    from workbench.backends.tensorrt.prepared import infer_seq

    assert infer_seq(gpt, gpt.make_inputs(2, 5)) == 5
    assert infer_seq(gpt, gpt.make_inputs(1)) == gpt.default_seq
    assert infer_seq(mlp, mlp.make_inputs(2)) is None
    with pytest.raises(WorkbenchError, match="sequence length"):
        infer_seq(gpt, (torch.zeros(2, 3, 4, dtype=torch.int64),))


# --- precision in the graph (ModelOpt, on CPU) ----------------------------------------------------------


@pytest.fixture(scope="module")
def modelopt():
    pytest.importorskip("onnxruntime", reason="ModelOpt calibrates through onnxruntime (workbench[onnx])")
    return pytest.importorskip("modelopt.onnx.quantization", reason="needs nvidia-modelopt (workbench[onnx])")


def _prepared(exported, loaded, precision, tmp_path, seq):
    from workbench.backends.tensorrt.precision import apply_precision

    calibration = _calibration(loaded, exported.input_names, seq)
    return apply_precision(exported.path, precision, calibration, tmp_path, batch=3)


def test_fp16_autocast_runs_close_to_fp32(modelopt, gpt, gpt_onnx, tmp_path):
    result = _prepared(gpt_onnx, gpt, "fp16", tmp_path, SEQ)
    summary = result.summary
    assert result.path.name == "model.fp16.onnx" and summary["tool"].endswith("convert_to_mixed_precision")
    assert summary["inserted"].get("Cast", 0) > 0
    assert summary["initializers"]["after"].get("FLOAT16", 0) > 0
    outputs = summary["node_outputs"]["after"]
    assert outputs["FLOAT16"] > outputs.get("FLOAT", 0)  # most of the graph now computes in fp16
    assert summary["calibration"]["samples"] == 9 and summary["calibration"]["inputs"] == {"tokens": [9, SEQ]}
    inputs = gpt.make_inputs(3, SEQ)
    out = _ort_run(result.path, {"tokens": inputs[0].numpy()})
    ref = _reference(gpt, inputs)
    assert out.dtype == np.float32  # I/O types kept
    assert 0 < _rel_l2(out, ref) < 1e-2


def test_bf16_autocast_structure(modelopt, gpt, gpt_onnx, tmp_path):
    # onnxruntime's CPU provider has no bf16 kernels for most ops (Add, MatMul), so only the graph is checked.
    summary = _prepared(gpt_onnx, gpt, "bf16", tmp_path, SEQ).summary
    assert summary["opset"] == {"before": 19, "after": 22}  # ModelOpt's minimum for bf16
    assert summary["initializers"]["after"].get("BFLOAT16", 0) > 0 and "FLOAT16" not in summary["initializers"]["after"]
    assert summary["inserted"].get("Cast", 0) > 0


@pytest.mark.parametrize("which, bound", [("gpt", 0.1), ("mlp", 0.2)])
def test_int8_inserts_qdq_and_still_runs(modelopt, which, bound, request, tmp_path):
    loaded, exported = request.getfixturevalue(which), request.getfixturevalue(f"{which}_onnx")
    seq = SEQ if which == "gpt" else None
    result = _prepared(exported, loaded, "int8", tmp_path, seq)
    summary = result.summary
    q, dq = summary["qdq_inserted"]["QuantizeLinear"], summary["qdq_inserted"]["DequantizeLinear"]
    assert q > 0 and q == dq == summary["ops_after"]["QuantizeLinear"]
    assert summary["initializers"]["after"].get("INT8", 0) > 0  # quantized weights
    assert summary["calibration"]["method"] == "max" and summary["high_precision"] == "fp16"
    assert summary["calibration"]["batch"] == 3 and summary["calibration"]["samples"] == 9
    inputs = loaded.make_inputs(3, seq)
    out = _ort_run(result.path, dict(zip(exported.input_names, (t.numpy() for t in inputs), strict=True)))
    ref = _reference(loaded, inputs)
    assert 0 < _rel_l2(out, ref) < bound
    assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_modelopt_leaves_onnxruntime_quantization_as_it_found_it(modelopt, mlp, mlp_onnx, tmp_path):
    from onnxruntime.quantization import calibrate, qdq_quantizer

    before = {owner: dict(vars(owner)) for owner in (calibrate, calibrate.MinMaxCalibrater, calibrate.CalibraterBase,
                                                     calibrate.HistogramCollector, qdq_quantizer.QDQQuantizer)}
    _prepared(mlp_onnx, mlp, "int8", tmp_path, None)  # ModelOpt patches them for its PTQ
    for owner, attributes in before.items():
        assert {k: v for k, v in vars(owner).items()} == attributes, owner
    quantized = tmp_path / "static.onnx"
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{mlp_onnx.input_names[0]: t.numpy()} for t in mlp.make_inputs(2, None)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(mlp_onnx.path), str(quantized), Reader())  # ORT's own static int8 still works after it
    assert quantized.is_file()


def test_fp8_inserts_float8_qdq(modelopt, gpt, gpt_onnx, tmp_path):
    result = _prepared(gpt_onnx, gpt, "fp8", tmp_path, SEQ)
    summary = result.summary
    assert summary["qdq_inserted"]["QuantizeLinear"] > 0
    assert summary["initializers"]["after"].get("FLOAT8E4M3FN", 0) > 0
    assert summary["node_outputs"]["after"].get("FLOAT8E4M3FN", 0) > 0
    inputs = gpt.make_inputs(3, SEQ)
    try:
        # With graph optimizations on, onnxruntime's CPU provider rewrites Q/DQ + MatMul into its int8-only
        # MatMulIntegerToFloat, which rejects float8; unoptimized, it runs the float8 Q/DQ reference kernels.
        out = _ort_run(result.path, {"tokens": inputs[0].numpy()}, optimize=False)
    except Exception as exc:  # an onnxruntime build without float8 Q/DQ kernels
        pytest.skip(f"onnxruntime cannot execute float8 Q/DQ on CPU here: {type(exc).__name__}: {exc}")
    ref = _reference(gpt, inputs)
    assert 0 < _rel_l2(out, ref) < 0.15
    assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.8


def test_fp32_is_the_exported_graph(gpt_onnx, tmp_path):
    from workbench.backends.tensorrt.precision import apply_precision

    result = apply_precision(gpt_onnx.path, "fp32", None, tmp_path)
    assert result.path == gpt_onnx.path and result.summary["inserted"] == {} and result.summary["tool"] is None


def test_precision_rejects_bad_requests(gpt_onnx, tmp_path):
    from workbench.backends.tensorrt.precision import apply_precision

    with pytest.raises(WorkbenchError, match="one of"):
        apply_precision(gpt_onnx.path, "int4", None, tmp_path)
    with pytest.raises(WorkbenchError, match="needs calibration"):
        apply_precision(gpt_onnx.path, "int8", None, tmp_path)
    with pytest.raises(WorkbenchError, match=r"missing \['tokens'\], unknown \['ids'\]"):
        apply_precision(gpt_onnx.path, "int8", {"ids": np.zeros((2, SEQ), np.int64)}, tmp_path)
    with pytest.raises(WorkbenchError, match="at least one batch of 4"):
        apply_precision(gpt_onnx.path, "int8", {"tokens": np.zeros((3, SEQ), np.int64)}, tmp_path, batch=4)
    with pytest.raises(WorkbenchError, match="no such ONNX file"):
        apply_precision(tmp_path / "missing.onnx", "fp16", None, tmp_path)


# --- engine inspector JSON → fusion table --------------------------------------------------------------

# Verbatim excerpt of a DETAILED inspector document (TensorRT 8.x, ResNet fp16 on an A100): NVIDIA/TensorRT
# tools/experimental/trt-engine-explorer/examples/pytorch/resnet/A100/fp16/resnet.onnx.engine.graph.json
# (first, fourth to sixth and last layers, and the Bindings).
RESNET_FP16 = r"""{"Layers": [{
  "Name": "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1",
  "LayerType": "Reformat",
  "Inputs": [{"Name": "input.1", "Location": "Device", "Dimensions": [32,3,224,224],
              "Format/Datatype": "Row major linear FP32"}],
  "Outputs": [{"Name": "Reformatted Input Tensor 0 to Conv_0 + Relu_1", "Location": "Device",
               "Dimensions": [32,3,224,224], "Format/Datatype": "Channel major FP16 format where channel % 4 == 0"}],
  "ParameterType": "Reformat", "Origin": "REFORMAT", "TacticValue": "0x0000000000000000"
},{
  "Name": "Conv_3 + Relu_4",
  "LayerType": "CaskConvolution",
  "Inputs": [{"Name": "input.8", "Location": "Device", "Dimensions": [32,64,56,56],
              "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
  "Outputs": [{"Name": "onnx::Conv_129", "Location": "Device", "Dimensions": [32,64,56,56],
               "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
  "ParameterType": "Convolution", "Kernel": [3,3], "PaddingMode": "kEXPLICIT_ROUND_DOWN", "PrePadding": [1,1],
  "PostPadding": [1,1], "Stride": [1,1], "Dilation": [1,1], "OutMaps": 64, "Groups": 1,
  "Weights": {"Type": "Half", "Count": 36864}, "Bias": {"Type": "Half", "Count": 64}, "HasSparseWeights": 0,
  "Activation": "RELU", "HasBias": 1, "HasReLU": 1,
  "TacticName": "sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize256x64x32_stage3_warpsize4x1x1_g1_tensor16x8x16_t1r3s3_aACCESS",
  "TacticValue": "0x0866ddee325d07a6"
},{
  "Name": "Reformatting CopyNode for Input Tensor 0 to Conv_5 + Add_6 + Relu_7",
  "LayerType": "NoOp",
  "Inputs": [{"Name": "onnx::Conv_129", "Location": "Device", "Dimensions": [32,64,56,56],
              "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
  "Outputs": [{"Name": "Reformatted Input Tensor 0 to Conv_5 + Add_6 + Relu_7", "Location": "Device",
               "Dimensions": [32,64,56,56], "Format/Datatype": "Channel major FP16 format where channel % 16 == 0"}],
  "TacticValue": "0x0000000000000000"
},{
  "Name": "Conv_5 + Add_6 + Relu_7",
  "LayerType": "CaskConvolution",
  "Inputs": [{"Name": "Reformatted Input Tensor 0 to Conv_5 + Add_6 + Relu_7", "Location": "Device",
              "Dimensions": [32,64,56,56], "Format/Datatype": "Channel major FP16 format where channel % 16 == 0"},
             {"Name": "Reformatted Input Tensor 1 to Conv_5 + Add_6 + Relu_7", "Location": "Device",
              "Dimensions": [32,64,56,56], "Format/Datatype": "Channel major FP16 format where channel % 16 == 0"}],
  "Outputs": [{"Name": "input.24", "Location": "Device", "Dimensions": [32,64,56,56],
               "Format/Datatype": "Channel major FP16 format where channel % 16 == 0"}],
  "ParameterType": "Convolution", "Kernel": [3,3], "PaddingMode": "kEXPLICIT_ROUND_DOWN", "PrePadding": [1,1],
  "PostPadding": [1,1], "Stride": [1,1], "Dilation": [1,1], "OutMaps": 64, "Groups": 1,
  "Weights": {"Type": "Half", "Count": 36864}, "Bias": {"Type": "Half", "Count": 64}, "HasSparseWeights": 0,
  "Activation": "RELU", "HasBias": 1, "HasReLU": 1,
  "TacticName": "sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize256x64x32_stage3_warpsize4x1x1_g1_tensor16x8x16_t1r3s3_aACCESS",
  "TacticValue": "0x0866ddee325d07a6"
},{
  "Name": "Reformatting CopyNode for Output Tensor 0 to reshape_after_Gemm_48",
  "LayerType": "Reformat",
  "Inputs": [{"Name": "Reformatted Output Tensor 0 to reshape_after_Gemm_48", "Location": "Device",
              "Dimensions": [32,1000], "Format/Datatype": "Row major linear FP16 format"}],
  "Outputs": [{"Name": "191", "Location": "Device", "Dimensions": [32,1000], "Format/Datatype": "Row major linear FP32"}],
  "ParameterType": "Reformat", "Origin": "REFORMAT", "TacticValue": "0x00000000000003e8"
}],
"Bindings": ["input.1"
,"191"
]}
"""  # noqa: E501 (verbatim JSON)

# Verbatim excerpt of a LAYER_NAMES_ONLY document of a Q/DQ detector: NVIDIA/TensorRT
# tools/experimental/trt-engine-explorer/src/notebooks/layer_info.json (ForeignNode = Myelin region).
NAMES_ONLY = r"""{"Layers": ["[trainStation1]"
,"/backbone/conv1/_input_quantizer/QuantizeLinear"
,"backbone.conv1.weight + /backbone/conv1/_weight_quantizer/QuantizeLinear + /backbone/conv1/Conv"
,"PWN((Unnamed Layer* 112) [ElementWise], PWN(PWN((Unnamed Layer* 109) [Constant] + (Unnamed Layer* 110) [ElementWise], (Unnamed Layer* 111) [Unary]), (Unnamed Layer* 113) [ElementWise]))"
,"neck.detect1.conv1.conv.weight + /neck/detect1/conv1/conv/_weight_quantizer/QuantizeLinear + /neck/detect1/conv1/conv/Conv + PWN(/neck/detect1/conv1/relu/LeakyRelu)"
,"{ForeignNode[/head/Constant_2_output_0.../Unsqueeze_2]}"
,"[trainStation2]"
],
"Bindings": ["input"
,"output"
]}
"""  # noqa: E501 (verbatim JSON)


def test_detailed_document_becomes_a_fusion_table():
    ops = {"Conv_3": "Conv", "Relu_4": "Relu", "Conv_5": "Conv", "Add_6": "Add", "Relu_7": "Relu"}
    table = trt_fusions(RESNET_FP16, node_ops=ops)
    assert list(table["name"])[1] == "Conv_3 + Relu_4" and len(table) == 5
    fused = table.set_index("name").loc["Conv_5 + Add_6 + Relu_7"]
    assert fused["type"] == "CaskConvolution" and fused["source"] == "name"
    assert fused["onnx_nodes"] == "Conv_5 + Add_6 + Relu_7" and fused["fused_ops"] == "Conv, Add, Relu"
    assert fused["n_ops"] == 3 and not fused["single_op"] and fused["compute"]
    assert fused["tactic"].startswith("sm80_xmma_fprop_implicit_gemm_f16f16")
    assert fused["tactic_value"] == "0x0866ddee325d07a6"
    assert fused["precision"] == "fp16" and fused["input_dtypes"] == "fp16, fp16"
    assert fused["input_dims"] == "[32,64,56,56]; [32,64,56,56]"
    reformats = table[~table["compute"]]
    assert list(reformats["source"]) == ["inserted"] * 3 and (reformats["onnx_nodes"] == "").all()
    assert table.iloc[-1]["input_dtypes"] == "fp16" and table.iloc[-1]["output_dtypes"] == "fp32"
    assert trt_summary(table) == {"layers": 5, "kernels": 2, "fusions": 2, "fused_ops": 5, "unfused_ops": 0,
                                  "inserted": 3, "by_type": {"CaskConvolution": 2}, "by_precision": {"fp16": 2}}
    engine = read_engine_json(RESNET_FP16)
    assert engine.detailed and engine.io_tensors == ("input.1", "191")


def test_names_only_document_parses_names():
    engine = read_engine_json(NAMES_ONLY)
    assert not engine.detailed and engine.io_tensors == ("input", "output")
    ops = {"/backbone/conv1/_input_quantizer/QuantizeLinear": "QuantizeLinear",
           "/backbone/conv1/_weight_quantizer/QuantizeLinear": "QuantizeLinear", "/backbone/conv1/Conv": "Conv",
           "/head/Constant_2_output_0": "Constant", "/Unsqueeze_2": "Unsqueeze"}
    table = trt_fusions(NAMES_ONLY, node_ops=ops).set_index("name")
    conv = table.loc["backbone.conv1.weight + /backbone/conv1/_weight_quantizer/QuantizeLinear + /backbone/conv1/Conv"]
    assert conv["fused_ops"] == "QuantizeLinear, Conv" and conv["unmatched"] == "backbone.conv1.weight"
    assert conv["precision"] is None and conv["type"] is None
    myelin = table.loc["{ForeignNode[/head/Constant_2_output_0.../Unsqueeze_2]}"]
    assert myelin["source"] == "name-endpoints" and math.isnan(myelin["n_ops"])
    assert myelin["onnx_nodes"] == "/head/Constant_2_output_0 + /Unsqueeze_2"
    assert not table.loc["[trainStation1]", "compute"]
    summary = trt_summary(trt_fusions(NAMES_ONLY))
    assert summary["inserted"] == 2 and summary["kernels"] == 5
    # PWN group: 5 TensorRT-internal layers; neck conv: weight + Q + Conv + LeakyRelu; Myelin region counted as a fusion
    assert summary["fusions"] == 4 and summary["unfused_ops"] == 1 and summary["fused_ops"] == 3 + 5 + 4


def test_layer_name_forms():
    pwn = split_layer_name("neck.w + /neck/Conv + PWN(/neck/relu/LeakyRelu)")
    assert pwn.parts == ("neck.w", "/neck/Conv", "/neck/relu/LeakyRelu") and not pwn.inserted
    assert split_layer_name("Reformatting CopyNode for Output Tensor 0 to x").inserted
    assert split_layer_name("Conv_5 + Add_6 [profile 1]").profile == 1
    assert split_layer_name("a\x1fb").parts == ("a", "b")  # TensorRT 10 separators in names


def test_metadata_lists_the_onnx_nodes():
    # The Metadata form ("[ONNX Layer: <node>]" items joined by U+001E, U+001F in TensorRT 10) is the one
    # trt-engine-explorer's parser (trex/parser.py, fix_metadata / fix_unicode) handles; the kgen layer's
    # name, type and input are those TensorRT 10.10 printed for a BERT model in NVIDIA/TensorRT issue #4397.
    layer = {
        "Name": "__myl_GathGathGathMulAddMulAddCastMeanSubMulMeanAddSqrtDivMulCastMulAdd_myl0_0",
        "LayerType": "kgen",
        "Inputs": [{"Name": "pos_ids", "Dimensions": [1, 40], "Format/Datatype": "Int32"}],
        "Outputs": [{"Name": "__myl_out", "Dimensions": [1, 40, 768], "Format/Datatype": "Half"}],
        "Metadata": "[ONNX Layer: /embeddings/Gather]\x1e[ONNX Layer: /embeddings/Add]\x1f"
                    "[ONNX Layer: /embeddings/LayerNorm/ReduceMean]",
        "TacticValue": "0x0000000000000000",
    }
    row = trt_fusions({"Layers": [layer]}).iloc[0]
    assert row["source"] == "metadata" and row["n_ops"] == 3
    assert row["onnx_nodes"] == "/embeddings/Gather + /embeddings/Add + /embeddings/LayerNorm/ReduceMean"
    assert row["precision"] == "int32" and row["output_dtypes"] == "fp16"
    assert metadata_nodes("[ONNX Layer: a][ONNX Layer: b][ONNX Layer: a]") == ["a", "b"]


def test_tensorrt_11_io_tensors_and_split_types():
    # TensorRT 11 replaces "Bindings" by "I/O Tensors" objects (TensorRT 10.x→11.x IEngineInspector migration
    # guide, whose example is copied here) and splits a layer tensor's "Format/Datatype" into "Datatype" and
    # "Format" (as polygraphy 0.53 reads it: polygraphy/tools/inspect/subtool/model/extractors/_trt.py).
    document = {
        "Layers": [{"Name": "node_linear", "LayerType": "gemm",
                    "Inputs": [{"Name": "input", "Datatype": "Half", "Format": "Row major linear FP16 format (kLINEAR)",
                                "Dimensions": [1, 3, 224, 224]}],
                    "Outputs": [{"Name": "y", "Datatype": "Float", "Dimensions": [1, 1000]}]}],
        "I/O Tensors": [
            {"Name": "input_0", "IOMode": "Input", "DataType": "Float", "Dimensions": [1, 3, 224, 224],
             "Location": "Device", "IsShapeInferenceIO": False,
             "ProfileInfo": [{"MinShape": [1, 3, 224, 224], "OptShape": [1, 3, 224, 224],
                              "MaxShape": [1, 3, 224, 224], "Format": "Row major linear FP32 format (kLINEAR)"}]},
            {"Name": "output_0", "IOMode": "Output", "DataType": "Float", "Dimensions": [1, 1000],
             "Location": "Device", "IsShapeInferenceIO": False},
        ],
    }
    assert read_engine_json(document).io_tensors == ("input_0", "output_0")
    row = trt_fusions(document).iloc[0]
    assert (row["precision"], row["output_dtypes"], row["inputs"]) == (
        "fp16", "fp32", "Half Row major linear FP16 format (kLINEAR)")
    assert tensor_dtype({"Format/Datatype": "Thirty-two wide channel vectorized row major Int8 format."}) == "int8"
    assert tensor_dtype({"Format/Datatype": "Row major linear BFloat16 format"}) == "bf16"
    assert tensor_dtype({"Name": "x"}) is None


def test_other_profiles_are_left_out_by_default():
    document = {"Layers": ["Conv_1 + Relu_2", "Conv_1 + Relu_2 [profile 1]"]}
    assert len(trt_fusions(document)) == 1
    assert list(trt_fusions(document, profile=None)["profile"]) == [0, 1]


@pytest.mark.parametrize("document, problem", [
    ("{not json", "not JSON"),
    ({"Bindings": []}, "no \"Layers\" list"),
    ({"Layers": ["a", 3]}, "layer 1 is neither"),
])
def test_malformed_documents_are_named(document, problem):
    with pytest.raises(WorkbenchError, match=problem):
        trt_fusions(document)


# --- IProfiler timings → layer events -------------------------------------------------------------------


def _times():
    times = LayerTimes()
    for execution, begin in enumerate((1_000_000, 5_000_000)):
        times.begin(begin)
        times.record("Conv_3 + Relu_4", 0.25)
        times.record("Reformatting CopyNode for Input Tensor 0 to Conv_5 + Add_6 + Relu_7", 0.0)
        times.record("Conv_5 + Add_6 + Relu_7", 0.5 + execution)
        times.end(begin + (3_000_000 if execution == 0 else 1_000_000))  # 2nd wall < its layers' sum
    return times


def test_layer_trace_lays_layers_back_to_back_under_each_execution():
    trace = layer_trace(_times(), "cuda:1", engine="trt-fp16", layers=trt_fusions(RESNET_FP16))
    assert trace.events.schema.equals(schema.EVENTS)
    events = trace.df()
    assert list(events["kind"].astype(str)) == ["module", "layer", "layer", "layer"] * 2
    assert set(events["track"].astype(str)) == {f"cuda:1/{TRACK}"} and set(events["device"].astype(str)) == {"cuda:1"}
    assert (events["pid"] == 1).all()
    assert list(events["start_ns"]) == [0, 0, 250_000, 250_000, 4_000_000, 4_000_000, 4_250_000, 4_250_000]
    assert list(events["dur_ns"]) == [3_000_000, 250_000, 0, 500_000, 1_750_000, 250_000, 0, 1_500_000]
    assert list(events["parent"]) == [-1, 0, 0, 0, -1, 4, 4, 4] and list(events["depth"]) == [0, 1, 1, 1] * 2
    conv = json.loads(events["args"][3])
    assert conv["type"] == "CaskConvolution" and conv["onnx_nodes"] == "Conv_5 + Add_6 + Relu_7"
    assert conv["start"] == "synthesized" and conv["execution"] == 0 and conv["index"] == 2
    assert events["shapes"][3] == "[32,64,56,56]; [32,64,56,56]" and events["dtypes"][3] == "fp16, fp16"
    assert json.loads(events["args"][4])["wall_ns"] == 1_000_000
    assert trace.metadata["source"]["format"] == "tensorrt-iprofiler" and trace.metadata["executions"] == 2


def test_layer_trace_skips_bad_times_and_round_trips(tmp_path):
    from workbench.trace.store.bundle import open_bundle, write_bundle

    times = LayerTimes.from_dict(json.loads(json.dumps(_times().to_dict())))
    times.record("broken", float("nan"))
    trace = layer_trace(times, "cuda:0", origin_ns=0)
    assert trace.metadata["reader"]["skipped"] == {"invalid_layer_time": 1}
    assert trace.df()["start_ns"].min() == 1_000_000
    write_bundle(tmp_path, "trt-run", {"variant": {"name": "trt-fp16"}}, trace)
    assert open_bundle("trt-run", tmp_path).trace().kind_counts() == {"layer": 6, "module": 2}
    assert times.total_ms()["Conv_5 + Add_6 + Relu_7"] == pytest.approx(2.0)


def test_layer_times_misuse_is_named():
    with pytest.raises(WorkbenchError, match="before any execution"):
        LayerTimes().record("x", 1.0)
    with pytest.raises(WorkbenchError, match="cuda:N"):
        layer_trace(_times(), "cpu")
    with pytest.raises(WorkbenchError, match="no TensorRT executions"):
        layer_trace(LayerTimes(), "cuda:0")
    with pytest.raises(WorkbenchError, match="refer to execution 3"):
        LayerTimes.from_dict({"executions": [[0, 1]], "layers": [{"execution": 3, "name": "x", "ms": 1}]})


# --- prepare_tensorrt without TensorRT ------------------------------------------------------------------


def _variant(precision="fp16"):
    return Variant(f"trt-{precision}", backend="tensorrt", precision=precision, device="cuda")


def test_prepare_without_tensorrt_gives_the_install_line(monkeypatch, mlp):
    from workbench.backends.tensorrt import prepare_tensorrt

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # importing it now raises ImportError
    with pytest.raises(VariantUnavailable, match=r"trt-fp16: TensorRT not installed: pip install tensorrt-cu1[23]"):
        prepare_tensorrt(_variant(), mlp)


def test_prepare_rejects_old_tensorrt_and_unknown_precision(monkeypatch, mlp):
    from workbench.backends.tensorrt import prepare_tensorrt

    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="8.6.1"))
    with pytest.raises(VariantUnavailable, match=f"TensorRT 8.6.1 is too old.*>= {MIN_TENSORRT}"):
        prepare_tensorrt(_variant(), mlp)
    with pytest.raises(WorkbenchError, match="precision must be one of"):
        prepare_tensorrt(_variant("int8-weight-only"), mlp)


def test_missing_python_packages_name_the_extra():
    expected = r"no_such_module_xyz is not installed: pip install 'workbench\[onnx\]'"
    with pytest.raises(MissingDependency, match=expected):
        require("no_such_module_xyz")
    with pytest.raises(MissingDependency, match="no_such_module_xyz"):
        check_installed("onnx", "no_such_module_xyz.sub")


def test_optimization_profile_spans_batches_up_to_the_example():
    from workbench.backends.tensorrt.engine import batch_profiles

    profiles = batch_profiles({"tokens": (4, SEQ), "mask": (4, SEQ)}, {"tokens": (-1, SEQ), "mask": (4, SEQ)})
    assert (profiles["tokens"].min, profiles["tokens"].opt, profiles["tokens"].max) == ((1, SEQ), (4, SEQ), (4, SEQ))
    assert profiles["mask"].min == profiles["mask"].max == (4, SEQ)  # a static input keeps its shape


# --- on a GPU with TensorRT -----------------------------------------------------------------------------


def _gpu_ready():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("tensorrt", reason="needs TensorRT (pip install tensorrt-cu12 / tensorrt-cu13)")
    pytest.importorskip("modelopt.onnx.quantization", reason="needs nvidia-modelopt (workbench[onnx])")


@pytest.mark.gpu
@pytest.mark.parametrize("precision, which, rel", [("fp32", "mlp", 1e-3), ("fp16", "gpt", 2e-2),
                                                   ("int8", "gpt", 0.1)])
def test_engine_builds_runs_and_explains_itself(precision, which, rel, request, tmp_path):
    _gpu_ready()
    from workbench.backends.tensorrt import prepare_tensorrt

    loaded = request.getfixturevalue(which)
    seq = SEQ if which == "gpt" else None
    prepared = prepare_tensorrt(_variant(precision), loaded, timing_cache=tmp_path / "timing.cache")
    inputs = loaded.make_inputs(4, seq)
    placed = prepared.place(inputs)
    assert prepared.first_call(placed) > 0
    out = prepared.run(placed)
    prepared.sync()
    ref = _reference(loaded, inputs)
    assert out.dtype == torch.float32 and _rel_l2(out.cpu().numpy(), ref) < rel
    assert (tmp_path / "timing.cache").stat().st_size > 0 and (prepared.compile_dir / "timing.cache").is_file()
    build = prepared.notes["tensorrt"]["build"]
    assert build["profiling_verbosity"] == "DETAILED" and build["plan_bytes"] > 0
    table = trt_fusions(prepared.artifacts["tensorrt_engine.json"],
                        node_ops=json.loads(prepared.artifacts["onnx_nodes.json"]))
    assert read_engine_json(prepared.artifacts["tensorrt_engine.json"]).detailed
    assert table["compute"].any() and (table["onnx_nodes"] != "").any()
    times = prepared.profile_layers(placed, iterations=3)
    trace = layer_trace(times, prepared.notes["device"], layers=table)
    assert trace.kind_counts()["module"] == 3 and trace.kind_counts()["layer"] >= 3
    prepared.close()
    assert not prepared.compile_dir.exists()
