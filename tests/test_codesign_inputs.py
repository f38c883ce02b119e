"""Operator graphs of model files (`workbench.codesign.file_graphs`): a hand-built ONNX model whose rows are worked
out by hand, tiny-gpt exported to ONNX against the graph of its own forward, a saved torch.export program against
its module's forward, the HLO of small jitted JAX functions, and bad inputs failing in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.codesign.file_graphs import (
    UNCOSTED,
    file_kind,
    graph_from_export,
    graph_from_file,
    graph_from_hlo,
    graph_from_onnx,
)
from workbench.codesign.graph import GRAPH_COLUMNS, TOP_LEVEL, graph_from_model
from workbench.errors import WorkbenchError

onnx = pytest.importorskip("onnx")
helper, numpy_helper, TensorProto = onnx.helper, onnx.numpy_helper, onnx.TensorProto
F32 = 4  # bytes per fp32 element


def _init(name: str, shape: tuple[int, ...]) -> object:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _small_model(batch: int | str = 64) -> onnx.ModelProto:
    """MatMul 64x100 · 100x128, + bias, GELU through Erf, Softmax, ReduceMean (no FLOP rule); a Gemm with transB; a
    Conv with stride 2 and padding 1, then a Transpose; and shape-only nodes (Shape, Gather of a shape, Reshape)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="/fc/MatMul"),
        helper.make_node("Add", ["y", "b"], ["z"], name="/fc/Add"),
        helper.make_node("Div", ["z", "sqrt2"], ["z1"], name="/act/Div"),
        helper.make_node("Erf", ["z1"], ["z2"], name="/act/Erf"),
        helper.make_node("Add", ["z2", "one"], ["z3"], name="/act/Add"),
        helper.make_node("Mul", ["z", "z3"], ["z4"], name="/act/Mul"),
        helper.make_node("Mul", ["z4", "half"], ["g"], name="/act/Mul_1"),
        helper.make_node("Softmax", ["g"], ["s"], name="/Softmax", axis=-1),
        helper.make_node("Shape", ["s"], ["s_shape"], name="/Shape"),
        helper.make_node("Gather", ["s_shape", "zero"], ["rows"], name="/Gather", axis=0),
        helper.make_node("Reshape", ["s", "flat"], ["s_flat"], name="/Reshape"),
        helper.make_node("ReduceMean", ["s_flat", "axes"], ["mean"], name="/head/ReduceMean", keepdims=0),
        helper.make_node("Gemm", ["x", "wt", "b"], ["gemm"], name="/proj/Gemm", transB=1),
        helper.make_node("Conv", ["img", "k", "kb"], ["c"], name="/conv/Conv", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c"], ["ct"], name="/conv/Transpose", perm=[0, 2, 3, 1]),
    ]
    scalars = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
               (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]
    ints = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
            (("zero", 0), ("flat", [-1]), ("axes", [0]))]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 100]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("mean", "gemm", "ct")],
        [_init("w", (100, 128)), _init("b", (128,)), _init("wt", (128, 100)), _init("k", (16, 3, 3, 3)),
         _init("kb", (16,)), *scalars, *ints])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def test_hand_built_onnx_rows_are_costed_by_hand(tmp_path: Path) -> None:
    graph = graph_from_onnx(_save(_small_model(), tmp_path / "small.onnx"))
    assert tuple(graph.columns) == GRAPH_COLUMNS
    # Shape, Gather of the shape (all inputs constant once shapes are fixed) and Reshape (a view) leave no row.
    assert list(graph["name"]) == ["matmul", "add", "div", "erf", "add", "mul", "mul", "softmax", "mean", "addmm",
                                   "convolution", "clone"]
    rows = graph.set_index(graph["order"])
    assert rows["measured_ns"].isna().all()
    # MatMul [64,100]·[100,128]: 2·64·100·128 = 1,638,400 FLOPs; bytes x + w + y = (6,400 + 12,800 + 8,192)·4.
    mm = rows.loc[0]
    assert (mm["kind"], mm["layer"], mm["batch"], mm["m"], mm["k"], mm["n"]) == ("matmul", "fc", 1, 64, 100, 128)
    assert mm["flops"] == 1_638_400 and mm["bytes"] == 109_568 and mm["out_bytes"] == 8_192 * F32
    # + bias [128]: 8,192 adds; bytes y + b + z = (8,192 + 128 + 8,192)·4 = 66,048.
    assert rows.loc[1, ["kind", "elements", "flops", "bytes"]].tolist() == ["elementwise", 8_192, 8_192, 66_048]
    # GELU = z · (1 + erf(z / √2)) · 0.5: five elementwise ops of 8,192 elements; only erf is transcendental.
    # The scalar ops read z and a 4-byte scalar, write 8,192 elements: 65,540 B; erf 65,536 B; z · z3 98,304 B.
    chain = rows.loc[2:6]
    assert chain["layer"].tolist() == ["act"] * 5
    assert chain["flops"].tolist() == [8_192] * 5
    assert chain["transcendental"].tolist() == [0, 8_192, 0, 0, 0]
    assert chain["bytes"].tolist() == [65_540, 65_536, 65_540, 98_304, 65_540]
    # Softmax of [64,128]: 5 FLOPs per element (max, subtract, exp, sum, divide) = 40,960; each element one exp.
    softmax = rows.loc[7]
    assert (softmax["kind"], softmax["layer"], softmax["elements"]) == ("softmax", TOP_LEVEL, 8_192)
    assert (softmax["flops"], softmax["transcendental"], softmax["bytes"]) == (40_960, 8_192, 65_536)
    # ReduceMean of the 8,192 flattened elements (+ its 8-byte axes) to a scalar: no FLOP rule, costed by bytes.
    mean = rows.loc[8]
    assert (mean["kind"], mean["flops"], mean["bytes"]) == ("other", 0, 8_192 * F32 + 8 + 4)
    assert graph.attrs[UNCOSTED] == [{"node": "/head/ReduceMean", "op": "ReduceMean", "reason":
                                      "ReduceMean: no FLOP rule for reductions and pooling, costed by its bytes"}]
    # Gemm x·wtᵀ + b (transB): the same product as the MatMul, plus the 512-byte bias read.
    gemm = rows.loc[9]
    assert (gemm["kind"], gemm["m"], gemm["k"], gemm["n"]) == ("matmul", 64, 100, 128)
    assert (gemm["flops"], gemm["bytes"]) == (1_638_400, 109_568 + 512)
    # Conv [1,3,32,32] * [16,3,3,3], stride 2, pad 1: out (32 + 2 - 2 - 1)//2 + 1 = 16 -> [1,16,16,16].
    # FLOPs 2·16·(16·16)·3·3·3 = 221,184; implicit GEMM M = 256 positions, K = 27, N = 16.
    # Bytes: input 3,072·4 + weight 432·4 + bias 16·4 + output 4,096·4 = 30,464.
    conv = rows.loc[10]
    assert (conv["kind"], conv["layer"], conv["m"], conv["k"], conv["n"]) == ("conv", "conv", 256, 27, 16)
    assert (conv["flops"], conv["bytes"]) == (221_184, 30_464)
    # Transpose of the conv output materializes it: read and write 4,096 elements, a copy with no FLOPs.
    transpose = rows.loc[11]
    assert (transpose["kind"], transpose["flops"], transpose["bytes"]) == ("copy", 0, 2 * 4_096 * F32)
    # Dataflow: the rows that wrote each node's inputs (through the Reshape view), and whether it reads a weight
    # (an initializer of more than one element: not the scalars √2, 1, 0.5 or the axes).
    assert graph["inputs_from"].tolist() == [(), (0,), (1,), (2,), (3,), (1, 4), (5,), (6,), (7,), (), (), (10,)]
    assert graph["weight_input"].tolist() == [True, True] + [False] * 7 + [True, True, False]


def test_onnx_asymmetric_padding_and_transposed_convolution(tmp_path: Path) -> None:
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("ConvTranspose", ["y", "kt"], ["t"], strides=[2, 2], pads=[1, 1, 1, 1],
                              output_padding=[1, 1])]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 7, 7]),
                                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 5])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("c", "t")],
                              [_init("k", (2, 1, 3, 3)), _init("kt", (8, 4, 3, 3))])
    rows = graph_from_onnx(_save(helper.make_model(graph), tmp_path / "convs.onnx"))
    assert rows["kind"].tolist() == ["conv", "conv"]
    # Conv 7x7, kernel 3, stride 2, padding 0 before and 1 after: out (7 + 1 - 3)//2 + 1 = 3 -> [1,2,3,3];
    # 2·2 features·9 positions·(1·3·3) = 324 FLOPs, M = 9, K = 9, N = 2. Its bytes count the padded input row and
    # column (8·8 = 64 elements read), the 18 weights and the 18 outputs.
    assert rows.loc[0, ["flops", "m", "k", "n", "bytes"]].tolist() == [324, 9, 9, 2, (64 + 18 + 18) * F32]
    # ConvTranspose 5x5 -> (5 - 1)·2 - 2 + 3 + 1 = 10: [1,4,10,10]; every input element meets every weight of its
    # channel: 2·25 positions·8·4·9 = 14,400 FLOPs; bytes input 200 + weights 288 + output 400 elements.
    assert rows.loc[1, ["flops", "bytes", "out_bytes"]].tolist() == [14_400, (200 + 288 + 400) * F32, 400 * F32]


def test_onnx_runtime_contrib_ops(tmp_path: Path) -> None:
    """ONNX Runtime's fused ops, whose shapes onnx cannot infer: FusedMatMul and SkipLayerNormalization are costed as
    the matmul and layer norm they compute; the packed com.microsoft Attention has no rule: a row by its bytes, and
    an entry in attrs["uncosted"]."""
    ms = "com.microsoft"
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["y"], name="/fc/FusedMatMul", domain=ms, transB=1,
                              alpha=0.5),
             helper.make_node("SkipLayerNormalization", ["y", "y", "gamma", "beta"], ["n"], name="/ln/Skip",
                              domain=ms),
             helper.make_node("Attention", ["n", "qkv", "qkv_b"], ["a"], name="/attn/Attention", domain=ms,
                              num_heads=4),
             helper.make_node("Relu", ["a"], ["r"], name="/Relu")]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 16])],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
                              [_init("w", (32, 16)), _init("gamma", (32,)), _init("beta", (32,)),
                               _init("qkv", (32, 96)), _init("qkv_b", (96,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ms, 1)])
    rows = graph_from_onnx(_save(model, tmp_path / "contrib.onnx"))
    assert rows["name"].tolist() == ["matmul", "layer_norm", "com.microsoft::Attention", "relu"]
    # [4,8,16] · [32,16]ᵀ: one GEMM of M = 32 rows, K = 16, N = 32: 2·32·16·32 = 32,768 FLOPs (alpha is free).
    assert rows.loc[0, ["m", "k", "n", "flops"]].tolist() == [32, 16, 32, 32_768]
    # Layer norm of 1,024 elements at 8 FLOPs each; bytes: y twice (input and skip) + γ + β + the output.
    assert rows.loc[1, ["kind", "flops", "bytes"]].tolist() == ["norm", 8_192, (3 * 1_024 + 2 * 32) * F32]
    # Attention: input 1,024 + weights 3,072 + bias 96 + output [4,8,32] 1,024 elements, no FLOPs counted.
    assert rows.loc[2, ["kind", "flops", "bytes"]].tolist() == ["other", 0, (1_024 + 3_072 + 96 + 1_024) * F32]
    assert rows.loc[3, ["kind", "flops"]].tolist() == ["elementwise", 1_024]  # shapes carried on past it
    assert rows.attrs[UNCOSTED] == [{"node": "/attn/Attention", "op": "com.microsoft::Attention", "reason":
                                     "com.microsoft Attention (packed or past-state inputs): no cost rule, costed by "
                                     "its bytes"}]


def test_onnx_dynamic_dims_are_sized_by_shapes_never_guessed(tmp_path: Path) -> None:
    path = _save(_small_model(batch="batch"), tmp_path / "dynamic.onnx")
    with pytest.raises(WorkbenchError) as error:
        graph_from_onnx(path)
    assert str(error.value) == (f"{path}: input 'x' dim 0 ('batch') is dynamic: give its size (--shape x=DIMS, "
                                "or shapes={'x': (...)})")
    graph = graph_from_onnx(path, {"x": (8, 100)})
    assert graph.iloc[0][["m", "flops"]].tolist() == [8, 2 * 8 * 100 * 128]
    with pytest.raises(WorkbenchError, match=r"shapes\['img'\] dim 2 = 16, but the model fixes it at 32$"):
        graph_from_onnx(path, {"x": (8, 100), "img": (1, 3, 16, 32)})
    with pytest.raises(WorkbenchError, match=r"shapes names 'tokens', which the model does not take as inputs"):
        graph_from_onnx(path, {"tokens": (8, 100)})


def test_bad_files_fail_in_one_line_naming_the_file(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07 this is not a protobuf \xff\xfe" * 8)
    empty = tmp_path / "empty.hlo.txt"
    empty.write_text("  \n")
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"PK\x03\x04 no zip")
    for call, path, problem in ((graph_from_onnx, corrupt, "not a readable ONNX model"),
                                (graph_from_hlo, empty, "HLO text is empty"),
                                (graph_from_export, broken, "not a loadable torch.export program"),
                                (graph_from_hlo, tmp_path / "missing.hlo", "no such HLO file")):
        with pytest.raises(WorkbenchError) as error:
            call(path)
        message = str(error.value)
        assert message.startswith(f"{path}: {problem}") and "\n" not in message
    with pytest.raises(WorkbenchError, match=r"^HLO text: HLO text has no computations"):
        graph_from_hlo("HloModule m\n\njunk that is no computation\n")


def test_tiny_gpt_onnx_export_has_the_matmuls_of_its_forward(tmp_path: Path) -> None:
    """The exporter keeps each Linear as a MatMul by its weight, so those products equal the forward's addmm/mm
    rows exactly (same M, K, N, FLOPs and module). Attention is exported as MatMul-Softmax-MatMul over the whole
    T x T score matrix (the causal mask is added to the scores), while the forward's SDPA op counts only the
    unmasked pairs: those two products per layer are checked against 2·B·H·T·T·D each, by hand."""
    pytest.importorskip("onnxscript")
    from workbench.backends.tensorrt.onnx_export import export_onnx
    from workbench.models.registry import load_model

    batch, seq = 2, 32
    loaded = load_model("tiny-gpt")
    inputs = loaded.make_inputs(batch=batch, seq=seq)
    exported = export_onnx(loaded.module, inputs, tmp_path / "tiny-gpt.onnx")
    assert exported.dynamic_batch  # the batch is a symbolic dim: it must be sized
    with pytest.raises(WorkbenchError, match="input 'tokens' dim 0 \\('batch'\\) is dynamic"):
        graph_from_onnx(exported.path)
    onnx_graph = graph_from_onnx(exported.path, {"tokens": (batch, seq)})
    forward = graph_from_model(loaded.module, tuple(inputs))
    assert onnx_graph.attrs[UNCOSTED] == []

    def products(graph: pd.DataFrame) -> list[tuple]:
        rows = graph[(graph["kind"] == "matmul") & (graph["batch"] == 1)]
        return sorted(zip(rows["layer"], rows["m"], rows["k"], rows["n"], rows["flops"], strict=True))

    assert products(onnx_graph) == products(forward)
    layers, heads, d_model = loaded.config["layers"], loaded.config["heads"], loaded.config["d_model"]
    scores = onnx_graph[(onnx_graph["kind"] == "matmul") & (onnx_graph["batch"] > 1)]
    head_dim = d_model // heads
    assert len(scores) == 2 * layers
    assert scores["flops"].sum() == layers * 2 * (2 * batch * heads * seq * seq * head_dim)
    assert set(scores["layer"]) == {f"blocks.{i}.attn" for i in range(layers)}
    norms = onnx_graph[onnx_graph["kind"] == "norm"]
    assert norms["flops"].sum() == forward.loc[forward["kind"] == "norm", "flops"].sum()
    # ONNX Runtime's optimized copy fuses nodes into its contrib ops (FusedMatMul, SkipLayerNormalization): the same
    # products and normalizations, nothing left uncosted.
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(exported.path), options, providers=["CPUExecutionProvider"])
    assert {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node if n.domain == "com.microsoft"}
    optimized = graph_from_onnx(options.optimized_model_filepath, {"tokens": (batch, seq)})
    assert optimized.attrs[UNCOSTED] == []
    for kind in ("matmul", "norm"):
        assert optimized.loc[optimized["kind"] == kind, "flops"].sum() == \
            onnx_graph.loc[onnx_graph["kind"] == kind, "flops"].sum()


def test_saved_torch_export_program_is_its_module_forward(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8), nn.Softmax(dim=-1)).eval()
    x = torch.randn(4, 16)
    path = tmp_path / "seq.pt2"
    torch.export.save(torch.export.export(module, (x,)), path)
    graph = graph_from_export(path)
    pd.testing.assert_frame_equal(graph, graph_from_model(module, (x,)))
    assert graph["layer"].tolist() == ["0", "1", "2", "3"]
    assert graph_from_file(path).equals(graph)


def _hlo(function, *shapes: tuple[int, ...]) -> tuple[str, dict]:
    jax = pytest.importorskip("jax")
    compiled = jax.jit(function).lower(*(jax.numpy.ones(s, jax.numpy.float32) for s in shapes)).compile()
    return compiled.as_text(), compiled.cost_analysis()


def test_hlo_dot_with_its_epilogue_is_one_matmul_row() -> None:
    jnp = pytest.importorskip("jax.numpy")
    text, xla = _hlo(lambda x, w, b: jnp.tanh(x @ w + b), (64, 100), (100, 128), (128,))
    graph = graph_from_hlo(text)
    assert tuple(graph.columns) == GRAPH_COLUMNS
    # dot 2·64·100·128 = 1,638,400 FLOPs, the bias add 8,192 and tanh 8,192 elements (one FLOP each in the graph,
    # transcendental): whatever XLA fuses, each op is counted once, in one row.
    assert graph["flops"].sum() == 1_638_400 + 8_192 + 8_192
    assert graph["transcendental"].sum() == 8_192
    assert graph["flops"].sum() == xla["flops"] + xla["transcendentals"]  # XLA's own totals
    matmul = graph[graph["kind"] == "matmul"]
    assert len(matmul) == 1
    assert matmul.iloc[0][["batch", "m", "k", "n", "dtype"]].tolist() == [1, 64, 100, 128, "fp32"]
    assert (graph["layer"] == TOP_LEVEL).all()  # op_name "jit(<lambda>)/dot_general": no scope below the function
    # Each row is a kernel of the entry computation, never an op inside a fusion.
    entry = text[text.index("ENTRY"):]
    assert all(f"%{name} = " in entry for name in graph["name"])
    # Each row reads what earlier rows wrote, in program order; which parameters are weights the text does not say.
    assert all(all(o < order for o in read) for order, read in zip(graph["order"], graph["inputs_from"], strict=True))
    assert graph["weight_input"].isna().all()


HAND_HLO = """HloModule m

%fused (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  %d = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[8,4]{1,0} tanh(%d)
}

ENTRY %main (x: f32[8,16], w: f32[16,4]) -> (f32[8,4], f32[8,16]) {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,4]{1,0} parameter(1)
  %e = f32[8,16]{1,0} exponential(%x), metadata={op_name="jit(f)/exp"}
  %f = f32[8,4]{1,0} fusion(%e, %w), kind=kOutput, calls=%fused, metadata={op_name="jit(f)/mlp/dense/dot_general"}
  %pair = (f32[8,4]{1,0}, f32[8,16]{1,0}) tuple(%f, %e)
  %second = f32[8,16]{1,0} get-tuple-element(%pair), index=1
  %first = f32[8,4]{1,0} get-tuple-element(%pair), index=0
  %c = f32[8,4]{1,0} copy(%first)
  %s = f32[8,16]{1,0} negate(%second)
  ROOT %out = (f32[8,4]{1,0}, f32[8,16]{1,0}) tuple(%c, %s)
}
"""


def test_hand_written_hlo_rows_layers_and_dataflow() -> None:
    graph = graph_from_hlo(HAND_HLO)
    assert graph["name"].tolist() == ["e", "f", "c", "s"]
    assert graph["kind"].tolist() == ["elementwise", "matmul", "copy", "elementwise"]
    # exp of 8·16 = 128 elements: one FLOP and one transcendental each. The fusion: dot 2·8·16·4 = 1,024 FLOPs and
    # tanh of its 32 outputs; bytes at its boundary e (512 B) + w (256 B) + its output (128 B) = 896 B.
    assert graph["flops"].tolist() == [128, 1_024 + 32, 0, 128]
    assert graph["transcendental"].tolist() == [128, 32, 0, 0]
    assert graph.loc[1, ["batch", "m", "k", "n", "bytes", "out_bytes"]].tolist() == [1, 8, 16, 4, 896, 128]
    # op_name scopes: jit(f) is a transformation, the last part the primitive; no metadata: "".
    assert graph["layer"].tolist() == [TOP_LEVEL, "mlp.dense", "", ""]
    # The tuple and its get-tuple-elements are plumbing: each element leads back to the row that wrote it.
    assert graph["inputs_from"].tolist() == [(), (0,), (1,), (0,)]


def test_hlo_batched_dot_and_convolution_dims() -> None:
    jnp = pytest.importorskip("jax.numpy")
    lax = pytest.importorskip("jax.lax")
    text, xla = _hlo(lambda a, b: jnp.einsum("bij,bjk->bik", a, b), (4, 8, 16), (4, 16, 32))
    dot = graph_from_hlo(text).query("kind == 'matmul'").iloc[0]
    # 4 products of 8x16 by 16x32: 2·4·8·16·32 = 32,768 FLOPs; bytes (512 + 2,048 + 1,024)·4 = 14,336.
    assert dot[["batch", "m", "k", "n", "flops", "bytes"]].tolist() == [4, 8, 16, 32, 32_768, 14_336]

    def conv(image, kernel):
        return lax.conv_general_dilated(image, kernel, (2, 2), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))

    text, xla = _hlo(conv, (2, 3, 17, 17), (8, 3, 3, 3))
    graph = graph_from_hlo(text)
    row = graph.query("kind == 'conv'").iloc[0]
    # Output (17 - 3)//2 + 1 = 8 -> [2,8,8,8]: M = 2·8·8 = 128 positions, K = 3·3·3 = 27, N = 8 features;
    # FLOPs 2·128·27·8 = 55,296 (no padding, so XLA's count is the same).
    assert row[["batch", "m", "k", "n", "flops"]].tolist() == [1, 128, 27, 8, 55_296]
    assert graph["flops"].sum() == xla["flops"]


def test_file_kind_by_suffix_and_content(tmp_path: Path) -> None:
    onnx_file = _save(_small_model(), tmp_path / "model.bin")
    hlo_file = tmp_path / "module.txt"
    hlo_file.write_text("HloModule m\n\nENTRY %main (p: f32[4]) -> f32[4] {\n"
                        "  %p = f32[4]{0} parameter(0)\n  ROOT %e = f32[4]{0} exponential(%p)\n}\n")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert [file_kind(p) for p in (onnx_file, hlo_file, other, tmp_path / "x.onnx", tmp_path / "x.hlo.txt",
                                   tmp_path / "x.pt2")] == ["onnx", "hlo", None, "onnx", "hlo", "export"]
    row = graph_from_file(hlo_file).iloc[0]
    assert (row["name"], row["kind"], row["flops"], row["transcendental"], row["layer"]) == ("e", "elementwise", 4,
                                                                                           4, "")
    assert graph_from_file(onnx_file)["name"].iloc[0] == "matmul"
    with pytest.raises(WorkbenchError, match=r"notes\.txt: not an ONNX model, a torch\.export program"):
        graph_from_file(other)


def test_project_sources_read_model_files(tmp_path: Path) -> None:
    """`workbench project FILE` reads a model file before it looks for a run or a model of that name; input sizes
    are for ONNX files only."""
    from workbench.codesign.sources import graph_source

    onnx_path = _save(_small_model(batch="batch"), tmp_path / "dynamic.onnx")
    source = graph_source(f"onnx:{onnx_path}", tmp_path, shapes={"x": (8, 100)})
    assert source.label == "onnx file dynamic.onnx" and source.steps == 1
    assert source.graph.equals(graph_from_onnx(onnx_path, {"x": (8, 100)}))
    hlo_path = tmp_path / "f.hlo.txt"
    hlo_path.write_text(_hlo(lambda x, w: x @ w, (8, 16), (16, 4))[0])
    assert graph_source(str(hlo_path), tmp_path).graph.equals(graph_from_hlo(hlo_path))
    with pytest.raises(WorkbenchError, match="ONNX models only"):
        graph_source(str(hlo_path), tmp_path, shapes={"x": (1,)})
    with pytest.raises(WorkbenchError, match="'mlp' is not one"):
        graph_source("mlp", tmp_path, shapes={"x": (1,)})


def test_cli_projects_an_onnx_file_with_its_input_sizes(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from workbench.cli import main

    path = _save(_small_model(batch="batch"), tmp_path / "dynamic.onnx")
    args = ["project", str(path), "--accelerator", "tpu-v5e", "--out", str(tmp_path), "--json"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "--shape x=DIMS" in refused.output
    done = CliRunner().invoke(main, [*args, "--shape", "x=8x100"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    first = next(op for op in result["ops"] if op["kind"] == "matmul")
    assert first["flops"] == 2 * 8 * 100 * 128 and result["source"] == "onnx file dynamic.onnx"
