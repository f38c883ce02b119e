"""Fusion analysis: HLO text parsing on hand-written and real XLA:CPU modules (fused and with fusion off),
kernels per step from real JAX and torch traces, and the per-variant fusion table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import write_trace

from workbench.analysis.fusion import (
    FusionInputs,
    fusion_table,
    hlo_fusions,
    hlo_summary,
    kernel_units,
)
from workbench.analysis.steps import step_windows
from workbench.backends.jax_backend import FUSION_OFF
from workbench.errors import WorkbenchError
from workbench.trace import read_trace
from workbench.trace.formats.hlo_text import parse_hlo
from workbench.trace.model import Trace

NO_FUSION = FUSION_OFF
"""Compiler options that turn XLA:CPU's fusion passes off (one compile, not the process)."""

STEPS = 3
TRIPS = 3

# A GPU-style module with one fusion of each kind, a one-op fusion, a custom call, a while loop whose body
# holds a fusion, and the syntax that trips naive parsers: tuple shapes, quoted strings holding commas,
# braces and "calls=", JSON and string backend configs.
KINDS_HLO = r"""HloModule jit_kinds, entry_computation_layout={(f32[8,8]{1,0}, f32[8,8]{1,0})->(f32[8,8]{1,0}, f32[8]{0})}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

%fused_loop (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %mul = f32[8,8]{1,0} multiply(%p0, %p1), metadata={op_name="jit(f)/mul"}
  ROOT %tanh = f32[8,8]{1,0} tanh(%mul)
}

%fused_reduce (p0: f32[8,8]) -> f32[8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %exp = f32[8,8]{1,0} exponential(%p0)
  %zero = f32[] constant(0)
  ROOT %sum = f32[8]{0} reduce(%exp, %zero), dimensions={1}, to_apply=%add_f32
}

%fused_dot_bias (p0: f32[8,8], p1: f32[8,8], p2: f32[8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %p2 = f32[8]{0} parameter(2)
  %dot = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bias = f32[8,8]{1,0} broadcast(%p2), dimensions={1}
  ROOT %out = f32[8,8]{1,0} add(%dot, %bias)
}

%triton_gemm_computation (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %cvt = bf16[8,8]{1,0} convert(%p0)
  %back = f32[8,8]{1,0} convert(%cvt)
  %flat = f32[64]{0} bitcast(%back)
  %square = f32[8,8]{1,0} bitcast(%flat)
  ROOT %gemm = f32[8,8]{1,0} dot(%square, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%wrapped_negate_computation (p0: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  ROOT %negate = f32[8,8]{1,0} negate(%p0)
}

%body (state: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %state = (s32[], f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %h = f32[8,8]{1,0} get-tuple-element(%state), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %act = f32[8,8]{1,0} fusion(%h, %h), kind=kLoop, calls=%fused_loop, metadata={op_name="jit(f)/while/body/tanh"}
  ROOT %out = (s32[], f32[8,8]{1,0}) tuple(%next, %act)
}

%cond (state: (s32[], f32[8,8])) -> pred[] {
  %state = (s32[], f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.9 (x: f32[8,8], y: f32[8,8]) -> (f32[8,8], f32[8]) {
  %x = f32[8,8]{1,0} parameter(0), metadata={op_name="x"}
  %y = f32[8,8]{1,0} parameter(1), metadata={op_name="y"}
  %bias = f32[8]{0} constant({0, 1, 2, 3, 4, 5, 6, 7})
  %loop_fusion = f32[8,8]{1,0} fusion(%x, %y), kind=kLoop, calls=%fused_loop, metadata={op_name="jit(f)/tanh, then (calls=%nothing)" source_file="f.py" source_line=3}
  %input_fusion = f32[8]{0} fusion(%loop_fusion), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(f)/reduce_sum"}
  %output_fusion = f32[8,8]{1,0} fusion(%x, %y, %bias), kind=kOutput, calls=%fused_dot_bias
  %gemm_fusion = f32[8,8]{1,0} fusion(%output_fusion, %y), kind=kCustom, calls=%triton_gemm_computation, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"16"}}}
  %wrapped_negate = f32[8,8]{1,0} fusion(%gemm_fusion), kind=kLoop, calls=%wrapped_negate_computation
  %cublas = (f32[8,8]{1,0}, s8[1024]{0}) custom-call(%wrapped_negate, %y), custom_call_target="__cublas$gemm", backend_config="{\"alpha_real\":1,\"note\":\"a, b}\"}"
  %gte = f32[8,8]{1,0} get-tuple-element(%cublas), index=0
  %copy = f32[8,8]{1,0} copy(%gte)
  %flat = f32[64]{0} bitcast(%copy)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,8]{1,0}) tuple(%zero, %copy)
  %loop = (s32[], f32[8,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %result = f32[8,8]{1,0} get-tuple-element(%loop), index=1
  ROOT %tuple = (f32[8,8]{1,0}, f32[8]{0}) tuple(%result, %input_fusion)
}
"""  # noqa: E501 (HLO lines are long)


def test_each_fusion_kind_with_its_ops() -> None:
    fusions = hlo_fusions(KINDS_HLO).set_index("name")
    assert list(fusions.index) == ["loop_fusion", "input_fusion", "output_fusion", "gemm_fusion", "wrapped_negate",
                                   "act"]
    assert fusions["kind"].to_dict() == {"loop_fusion": "loop", "input_fusion": "input", "output_fusion": "output",
                                         "gemm_fusion": "custom", "wrapped_negate": "loop", "act": "loop"}
    assert fusions.loc["loop_fusion", "fused_ops"] == "multiply, tanh"
    assert fusions.loc["input_fusion", "fused_ops"] == "exponential, reduce"  # not the reducer's add
    assert fusions.loc["output_fusion", "fused_ops"] == "dot, broadcast, add"
    assert fusions.loc["gemm_fusion", "fused_ops"] == "convert, convert, dot"  # bitcasts are no ops
    assert fusions.loc["gemm_fusion", "n_ops"] == 3
    assert fusions.loc["gemm_fusion", "custom_kind"] == "triton_gemm"
    assert fusions["custom_kind"].drop("gemm_fusion").isna().all()
    assert fusions["single_op"].to_dict() == {"loop_fusion": False, "input_fusion": False, "output_fusion": False,
                                              "gemm_fusion": False, "wrapped_negate": True, "act": False}
    assert fusions.loc["wrapped_negate", "fused_ops"] == "negate"
    assert fusions.loc["loop_fusion", "op_name"] == "jit(f)/tanh, then (calls=%nothing)"
    assert fusions.loc["loop_fusion", "calls"] == "fused_loop"  # not the "calls=" inside the op name
    assert pd.isna(fusions.loc["output_fusion", "op_name"])
    assert fusions.loc["act", "computation"] == "body"  # the while body runs, so its fusion is listed
    assert fusions.loc["input_fusion", "shape"] == "f32[8]{0}"


def test_summary_counts_fusions_unfused_ops_and_kernels() -> None:
    summary = hlo_summary(KINDS_HLO)
    assert summary["module"] == "jit_kinds"
    assert summary["entry_instructions"] == 17
    assert summary["fusions_by_kind"] == {"loop": 2, "input": 1, "output": 1, "custom": 1}
    assert summary["fusions"] == 5
    assert summary["fused_ops"] == 2 + 2 + 3 + 3 + 2
    assert summary["single_op_fusions"] == 1
    # the one-op fusion, the custom call, the copy, and the loop counter's add and compare
    assert summary["unfused_by_opcode"] == {"negate": 1, "custom-call": 1, "copy": 1, "add": 1, "compare": 1}
    assert summary["unfused_ops"] == 5 and summary["custom_calls"] == 1 and summary["control_flow"] == 1
    assert summary["kernels"] == 10
    assert summary["instructions"] == 17 + 7 + 4  # entry, body, condition; not fused or reducer computations


def test_instruction_syntax() -> None:
    module = parse_hlo(KINDS_HLO)
    entry = {inst.name: inst for inst in module.entry.instructions}
    assert entry["cublas"].shape == "(f32[8,8]{1,0}, s8[1024]{0})"
    assert entry["cublas"].opcode == "custom-call"
    assert entry["cublas"].attrs["custom_call_target"] == '"__cublas$gemm"'
    assert entry["loop"].references("body") == ["body"] and entry["loop"].references("condition") == ["cond"]
    assert entry["tuple"].root and not entry["copy"].root
    assert entry["bias"].opcode == "constant"
    assert [c.name for c in module.executed()] == ["main.9", "cond", "body"]
    bare = parse_hlo("ENTRY main {\n  ROOT x = f32[2]{0} parameter(0)\n}\n")  # no % sigils, no signature
    assert bare.entry.name == "main" and bare.entry.instructions[0].opcode == "parameter"


@pytest.mark.parametrize(("text", "problem"), [
    ("", "empty"),
    ("   \n\t", "empty"),
    ("HloModule m\n", "no computations"),
    ("HloModule m\n\n%c (a: f32[]) -> f32[] {\n  ROOT %a = f32[] parameter(0)\n}\n", "no ENTRY"),
    ("ENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(1)\n", r"ends inside computation %main"),
    ("ENTRY %main () -> f32[] {\n  this is not hlo\n}\n", r"line 2: not an instruction"),
    ("ENTRY %main () -> f32[] {\n  %c = f32[] constant(1\n}\n", r"line 2: malformed instruction %c"),
    ("ENTRY %main () -> f32[] {\n  %c = f32[] constant(1)) , x=1\n}\n", r"line 2: malformed instruction %c"),
    ("ENTRY %main () -> f32[] {\n  %c = f32[] \n}\n", r"line 2: .*%c"),
    ("ENTRY %a () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\nENTRY %b () -> f32[] {\n"
     "  ROOT %c = f32[] constant(1)\n}\n", "2 ENTRY computations: a, b"),
    ("%a () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n%a () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n",
     "computation %a is defined twice"),
])
def test_malformed_text_is_an_error_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(WorkbenchError, match=problem):
        hlo_summary(text)


@pytest.mark.parametrize(("instruction", "problem"), [
    ("ROOT %f = f32[] fusion(%p), kind=kLoop, calls=%missing", r"line 6: %f calls %missing, which is not in"),
    ("ROOT %f = f32[] fusion(%p), calls=%c", r"line 6: fusion %f has no kind="),
    ("ROOT %f = f32[] fusion(%p), kind=kLoop", r"line 6: fusion %f has no single calls="),
])
def test_broken_fusions_are_errors(instruction: str, problem: str) -> None:
    text = ("%c (a: f32[]) -> f32[] {\n  ROOT %a = f32[] negate(%a)\n}\n"
            f"ENTRY %main (p: f32[]) -> f32[] {{\n  %p = f32[] parameter(0)\n  {instruction}\n}}\n")
    with pytest.raises(WorkbenchError, match=problem):
        hlo_fusions(text)


# --- real XLA:CPU modules and traces ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Three small jitted functions, each compiled normally and with fusion off; per compile its optimized
    HLO, cost analysis and an XSpace capture of `STEPS` annotated calls."""
    jax = pytest.importorskip("jax", reason="needs jax (pip install 'workbench[jax]')")
    jnp = jax.numpy

    def gelu_sum(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.nn.gelu(jnp.tanh(x @ w) * 2 + 1).sum()

    def mlp_softmax(x: jax.Array, w: jax.Array) -> jax.Array:
        h = jax.nn.gelu(x @ w + 1.0)
        return jax.nn.softmax(h @ w[:64, :32], axis=-1)

    def loop(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, TRIPS, lambda i, h: jnp.tanh(h @ w[:64]) + 1.0, x[:, :64]).sum()

    x, w = jnp.ones((64, 128)), jnp.full((128, 64), 0.01)
    runs = {}
    for name, f in (("gelu_sum", gelu_sum), ("mlp_softmax", mlp_softmax), ("loop", loop)):
        lowered = jax.jit(f).lower(x, w)
        for fusion, options in (("jit", None), ("nofusion", NO_FUSION)):
            compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
            compiled(x, w).block_until_ready()  # first call outside the capture
            root = tmp_path_factory.mktemp(f"{name}-{fusion}")
            with jax.profiler.trace(str(root)):
                for n in range(STEPS):
                    with jax.profiler.StepTraceAnnotation("step", step_num=n):
                        compiled(x, w).block_until_ready()
            (xplane,) = root.glob("plugins/profile/*/*.xplane.pb")
            runs[f"{name}/{fusion}"] = {"hlo": compiled.as_text(), "cost": compiled.cost_analysis(),
                                        "trace": read_trace(xplane)}
    return runs


def test_xla_cpu_fuses_the_elementwise_chain(jax_runs: dict[str, dict]) -> None:
    text = jax_runs["gelu_sum/jit"]["hlo"]
    fusions = hlo_fusions(text)
    several = fusions[~fusions["single_op"]]
    assert not several.empty
    fused = {op for ops in several["fused_ops"] for op in ops.split(", ")}
    assert {"tanh", "multiply", "add"} <= fused  # tanh(.)*2+1 and the tanh-form gelu
    assert not fused & {"parameter", "constant", "tuple", "get-tuple-element"}
    summary = hlo_summary(text)
    assert "dot" in fused or "dot" in summary["unfused_by_opcode"]
    custom = fusions[fusions["kind"] == "custom"]
    assert custom["custom_kind"].str.contains("ynn").all()  # XLA:CPU's custom fusions are YNNPACK's
    assert summary["fusions"] == len(several) and summary["fused_ops"] == several["n_ops"].sum()
    assert summary["kernels"] == summary["fusions"] + summary["unfused_ops"]
    assert summary["entry_instructions"] == text.split("ENTRY", 1)[1].split("\n}", 1)[0].count(" = ")


@pytest.mark.parametrize("name", ["gelu_sum", "mlp_softmax"])
def test_fusion_off_leaves_one_op_wrapped_fusions(jax_runs: dict[str, dict], name: str) -> None:
    fused, unfused = (jax_runs[f"{name}/{fusion}"]["hlo"] for fusion in ("jit", "nofusion"))
    fusions = hlo_fusions(unfused)
    assert len(fusions) > 5 and fusions["single_op"].all() and fusions["kind"].eq("loop").all()
    assert fusions["name"].str.startswith("wrapped_").all()
    # `wrapped_<op>[.n]` holds exactly <op>
    assert (fusions["name"].str.removeprefix("wrapped_").str.split(".").str[0] == fusions["fused_ops"]).all()
    off, on = hlo_summary(unfused), hlo_summary(fused)
    assert off["fusions"] == 0 and off["fused_ops"] == 0
    assert off["unfused_ops"] == off["kernels"] == off["single_op_fusions"] + off["unfused_by_opcode"]["dot"]
    assert off["kernels"] > on["kernels"] and on["fusions"] > 0
    assert off["unfused_by_opcode"]["tanh"] >= 1 and off["unfused_by_opcode"]["dot"] >= 1


def test_while_body_fusions_are_found(jax_runs: dict[str, dict]) -> None:
    text = jax_runs["loop/jit"]["hlo"]
    fusions = hlo_fusions(text)
    entry = parse_hlo(text).entry.name
    in_body = fusions[fusions["computation"] != entry]
    assert not in_body.empty and in_body["op_name"].str.contains("while/").all()
    assert "tanh" in ", ".join(in_body["fused_ops"])
    assert hlo_summary(text)["control_flow"] == 1


def test_trace_kernels_are_the_xla_ops_of_each_step(jax_runs: dict[str, dict]) -> None:
    for fusion in ("jit", "nofusion"):
        run = jax_runs[f"gelu_sum/{fusion}"]
        units = kernel_units(run["trace"])
        assert step_windows(run["trace"])["step"].tolist() == list(range(STEPS))
        assert units["step"].value_counts().sort_index().tolist() == [hlo_summary(run["hlo"])["kernels"]] * STEPS
        module = parse_hlo(run["hlo"])
        launched = {i.name for i in module.entry.instructions if i.opcode not in ("parameter", "constant")}
        assert set(units["name"]) == launched


def test_trace_kernels_of_a_loop_are_its_body_ops_per_trip(jax_runs: dict[str, dict]) -> None:
    run = jax_runs["loop/jit"]
    units = kernel_units(run["trace"])
    module = parse_hlo(run["hlo"])
    whiles = [i for i in module.entry.instructions if i.opcode == "while"]
    assert len(whiles) == 1 and whiles[0].name not in set(units["name"])  # the loop is no kernel, its ops are
    body = module.computations[whiles[0].references("body")[0]]
    body_fusions = [i.name for i in body.instructions if i.opcode == "fusion"]
    per_step = units[units["step"] == 0]["name"].value_counts()
    assert body_fusions and all(per_step[name] == TRIPS for name in body_fusions)


def test_jit_against_nofusion_in_one_table(jax_runs: dict[str, dict]) -> None:
    runs = [FusionInputs(f"jax-{fusion}", "jax", jax_runs[f"mlp_softmax/{fusion}"]["hlo"],
                         jax_runs[f"mlp_softmax/{fusion}"]["cost"], jax_runs[f"mlp_softmax/{fusion}"]["trace"])
            for fusion in ("jit", "nofusion")]
    table = fusion_table(runs).set_index("variant")
    jit, off = table.loc["jax-jit"], table.loc["jax-nofusion"]
    assert off["kernels"] > jit["kernels"] and off["fusions"] < jit["fusions"]
    assert jit["fusions"] == hlo_summary(runs[0].hlo_text)["fusions"]
    assert off["fusions"] == 0 and off["fused_ops"] == 0 and jit["fused_ops"] > 0
    assert jit["kernels"] == jit["hlo_kernels"] and off["kernels"] == off["hlo_kernels"]  # measured = static
    assert (table["steps"] == STEPS).all() and (table["kernel_ns"] > 0).all() and (table["step_ns"] > 0).all()
    assert off["bytes_accessed"] > jit["bytes_accessed"] > 0  # unfused ops write their results to memory
    assert jit["flops"] == pytest.approx(runs[0].cost_analysis["flops"]) and off["flops"] > 0
    assert table["elementwise_ops"].isna().all()
    static = fusion_table([FusionInputs("hlo-only", "jax", runs[1].hlo_text)]).iloc[0]
    assert static["kernels"] == off["hlo_kernels"] and math.isnan(static["kernel_ns"]) and math.isnan(static["steps"])


# --- torch traces --------------------------------------------------------------------------------------------

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16}


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trace]:
    """Steady-state captures (1 warm-up, 2 profiled steps) of a one-block GPT, eager and torch.compile."""
    from workbench.backends import get_variant
    from workbench.models import load_model
    from workbench.profiling import ProfileSettings, attach_flops
    from workbench.profiling.lifecycle import profile_variant

    gpt = load_model("tiny-gpt", **TINY_GPT)
    traces = {}
    for variant in ("eager", "compile"):
        run = profile_variant(get_variant(variant, batch=2), gpt, gpt.make_inputs(2, 16),
                              tmp_path_factory.mktemp(variant),
                              ProfileSettings(record_setup=False, warmup_steps=1, active_steps=2))
        traces[variant] = attach_flops(read_trace(run.trace_path), run.op_flops)
    return traces


@pytest.mark.slow
def test_compile_shows_fused_kernels_where_eager_shows_none(torch_runs: dict[str, Trace]) -> None:
    table = fusion_table([FusionInputs(v, "torch", trace=t) for v, t in torch_runs.items()]).set_index("variant")
    eager, compiled = table.loc["eager"], table.loc["compile"]
    assert (table["steps"] == 2).all()  # `step N`, not also torch's `ProfilerStep#N`
    assert eager["fusions"] == 0 and compiled["fusions"] > 0
    assert compiled["kernels"] < eager["kernels"]
    assert eager["unfused_ops"] == eager["kernels"]
    assert compiled["unfused_ops"] == compiled["kernels"] - compiled["fusions"]
    assert compiled["elementwise_ops"] < eager["elementwise_ops"]  # gelu, add, layer_norm went into the fused kernels
    assert table["fused_ops"].isna().all() and table["hlo_kernels"].isna().all()
    assert table["bytes_accessed"].isna().all()
    # the same GEMMs; eager also counts its elementwise aten::add, which compile fused
    assert 0 < compiled["flops"] <= eager["flops"] and compiled["flops"] == pytest.approx(eager["flops"], rel=0.01)
    assert (table["kernel_ns"] > 0).all() and (table["kernel_ns"] <= table["step_ns"]).all()  # one thread


@pytest.mark.slow
def test_torch_cpu_kernels(torch_runs: dict[str, Trace]) -> None:
    eager, compiled = (kernel_units(torch_runs[v]) for v in ("eager", "compile"))
    fused = compiled[compiled["fused"]]
    assert not fused.empty and fused["name"].str.contains("cpp_fused").all()
    assert "aten::addmm" in set(compiled["name"])  # extern ops called from the compiled graph
    assert not compiled["name"].str.contains("TorchDynamo|Torch-Compiled|CompiledFxGraph|AOTDispatcher").any()
    assert not eager["fused"].any() and {"aten::linear", "aten::gelu"} <= set(eager["name"])
    assert "aten::addmm" not in set(eager["name"])  # inside aten::linear, which is the dispatched op
    for units in (eager, compiled):
        assert (units["step"] >= 0).all() and units["step"].nunique() == 2


# --- inline traces --------------------------------------------------------------------------------------------


def _kineto_steps(tmp_path: Path) -> Trace:
    """A GPU-like trace: per step an op launching a kernel that runs after the step's host range ended;
    torch's `ProfilerStep#N` and the workbench's `step N` around the same iterations."""
    events = []
    for n, kernel in enumerate(("sm80_xmma_gemm", "triton_poi_fused_add_tanh_0", "triton_per_fused_sum_1")):
        t0 = 1000 * n
        corr = 10 + n
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": t0,
             "dur": 300},
            {"ph": "X", "cat": "user_annotation", "name": f"step {n}", "pid": 1, "tid": 1, "ts": t0 + 10,
             "dur": 200},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 20, "dur": 50,
             "args": {"External id": corr}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 30,
             "dur": 5, "args": {"correlation": corr, "External id": corr}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t0 + 400, "dur": 40 + n,
             "args": {"correlation": corr, "External id": corr, "device": 0, "stream": 7}},
        ]
    return read_trace(write_trace(tmp_path / "gpu.json", events))


def test_gpu_kernels_belong_to_the_step_that_launched_them(tmp_path: Path) -> None:
    trace = _kineto_steps(tmp_path)
    windows = step_windows(trace)
    assert windows["step"].tolist() == [0, 1, 2] and (windows["end_ns"] - windows["start_ns"]).eq(200_000).all()
    units = kernel_units(trace)
    assert units["step"].tolist() == [0, 1, 2]  # each kernel starts after its step's host range
    assert units["fused"].tolist() == [False, True, True]
    row = fusion_table([FusionInputs("compile", "torch", trace=trace)]).iloc[0]
    assert row["kernels"] == 1 and row["fusions"] == 1 and row["unfused_ops"] == 0  # medians over 3 steps
    assert row["kernel_ns"] == 41_000 and row["step_ns"] == 200_000 and math.isnan(row["elementwise_ops"])


def test_step_windows_without_steps_are_the_measure_phase_or_the_trace(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 10}]
    plain = read_trace(write_trace(tmp_path / "plain.json", events))
    assert step_windows(plain)[["start_ns", "end_ns"]].values.tolist() == [[0, 10_000]]
    measure = {"ph": "X", "cat": "user_annotation", "name": "measure", "pid": 1, "tid": 1, "ts": 0, "dur": 100}
    phased = read_trace(write_trace(tmp_path / "phased.json", [measure, *events]))
    assert step_windows(phased)[["start_ns", "end_ns"]].values.tolist() == [[0, 100_000]]
    row = fusion_table([FusionInputs("eager", "torch", trace=phased)]).iloc[0]
    assert row["steps"] == 1 and row["kernels"] == 1 and row["elementwise_ops"] == 1  # aten::add


def test_cost_analysis_forms_and_bad_inputs() -> None:
    listed = fusion_table([FusionInputs("old-jax", "jax", cost_analysis=[{"flops": 8.0, "bytes accessed": 4}])])
    assert listed.loc[0, ["flops", "bytes_accessed"]].tolist() == [8.0, 4.0]
    assert math.isnan(listed.loc[0, "kernels"])
    with pytest.raises(WorkbenchError, match="variant v: cost_analysis must be a dict"):
        fusion_table([FusionInputs("v", "jax", cost_analysis=3.5)])  # type: ignore[arg-type]
    with pytest.raises(WorkbenchError, match="list of 2 entries"):
        fusion_table([FusionInputs("v", "jax", cost_analysis=[{}, {}])])
    with pytest.raises(WorkbenchError, match="framework must be 'jax' or 'torch'"):
        FusionInputs("v", "tensorflow")  # type: ignore[arg-type]
    with pytest.raises(WorkbenchError, match="needs a variant name"):
        FusionInputs("", "jax")
    assert list(fusion_table([]).columns)[:3] == ["variant", "framework", "steps"]
