"""Synthetic PyTorch-profiler (Kineto) traces of any size, for parser benchmarks and tests.

`write_synthetic_trace(path, events)` writes exactly `events` trace events that look like what
`torch.profiler` exports (Kineto's 2024-2025 layout, as in the real traces in
`shared/fixtures/kineto/`) for a GPT-style model trained in bf16 on one H100: events pretty-printed
over several lines, `schemaVersion`, `deviceProperties`, `distributedInfo` and the other metadata
before `traceEvents`, `traceName`, `displayTimeUnit` and `baseTimeNanoseconds` after them, and
timestamps in µs with three decimals relative to `baseTimeNanoseconds`.

Each `ProfilerStep#N` runs the forward pass on the main thread, the backward pass on the autograd
thread, a foreach AdamW step and `loss.item()`. Events come in Kineto's order: the autograd thread's
CPU events, the main thread's, runtime calls interleaved with the GPU work they launched, GPU
annotations, `"M"` metadata and the `"Trace"` span. What real traces have is there: nested `cpu_op`s
with "Input Dims"/"Input type"/"Input Strides"/"Concrete Inputs", "Sequence number"/"Fwd thread id"
on autograd ops with `fwdbwd` flows from forward op to backward node, `cudaLaunchKernel`/
`cudaMemcpyAsync`/`cudaMemsetAsync` calls joined to their kernel/memcpy/memset by `ac2g` flows
(start on the call, end with `"bp": "e"` on the GPU op), a lone `ac2g` flow end on runtime calls
without GPU work as Kineto writes them, caching-allocator `[memory]` instants, and the autograd
thread named twice.

For large traces the mix is about 34% `cpu_op`, 13% `cuda_runtime`, 12% kernels, 30% flows, 11%
`[memory]` and under 1% memcpy/memset/annotations/metadata: every GPU op has both halves of its
flow, so flows are at least twice the GPU ops. The count is exact: whole steps, then one step with
fewer layers, then `aten::view` ops for the rest. The output is deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

# The modelled job: a 24-layer, 2048-wide GPT, batch 4 x 2048 tokens, on one H100.
BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM, FFN, VOCAB, LAYERS = 4, 2048, 2048, 16, 128, 8192, 32000, 24
TOKENS = BATCH * SEQ
NUM_SMS = 132
BF16, FP32, INT64 = "c10::BFloat16", "float", "long int"

PID, MAIN_TID, AUTOGRAD_TID = 2418731, 2418731, 2418862
GPU_PID, STREAM = 0, 7
BASE_TIME_NS = 1735632360000000000
START_NS = 4203669603018756
"""Trace start, in ns after `baseTimeNanoseconds` (Kineto writes `ts` relative to that base)."""

CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset",
              "gpu_user_annotation", "flow", "memory", "metadata", "trace")
"""Keys of the counts `write_synthetic_trace` returns (`flow`: ac2g and fwdbwd, both halves)."""

_MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    """A runtime call that puts work on the GPU stream: a kernel launch, memcpy or memset."""

    cat: str
    name: str
    dur_ns: int
    args: str = ""
    """Static kernel args (everything after "correlation")."""
    nbytes: int = 0
    runtime: str = "cudaLaunchKernel"
    cbid: int = 211


@dataclass(frozen=True)
class Call:
    """A runtime call with no GPU work (Kineto still gives it an `ac2g` flow end)."""

    name: str
    cbid: int
    wait: bool = False
    """The call blocks until the GPU stream is idle (a stream synchronize)."""


@dataclass(frozen=True)
class Op:
    """A CPU op (or annotation) and what it does: child ops, runtime calls, allocations."""

    name: str
    inputs: str = ""
    children: tuple[Op, ...] = ()
    runtime: tuple[Gpu | Call, ...] = ()
    alloc: tuple[int, ...] = ()
    grad: Grad | None = None
    """The autograd node this forward op records; it runs later on the autograd thread."""
    cost_ns: int = 3000
    cat: str = "cpu_op"
    node: bool = False
    """Part of a backward node: carries the forward op's sequence number."""
    flow_end: bool = False
    """The backward node itself, where the forward op's `fwdbwd` flow ends."""


@dataclass(frozen=True)
class Grad:
    """An autograd node: its backward ops and the parameters it accumulates gradients into."""

    name: str
    children: tuple[Op, ...] = ()
    params: tuple[tuple[int, ...], ...] = ()
    """Shapes of the parameters."""


Program = tuple[tuple[Op, ...], tuple[Op, ...]]
"""One step's forward ops and the ops after the backward pass, all on the main thread."""


# --- op inputs: T(ensor), S(calar), L(ist of scalars), NONE; `_inputs` formats them as Kineto does --


def _contiguous(dims: list[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def T(*dims: int, strides: list[int] | None = None, dtype: str = BF16) -> tuple:
    """A tensor input."""
    return dtype, list(dims), strides if strides is not None else _contiguous(list(dims)), ""


def S(value: str) -> tuple:
    """A scalar input (shown in "Concrete Inputs")."""
    return "Scalar", [], [], value


def L(value: str) -> tuple:
    """A scalar-list input."""
    return "ScalarList", [], [], value


NONE = ("", [], [], "")
"""An omitted optional input."""


def _inputs(*inputs: tuple) -> str:
    types, dims, strides, concrete = zip(*inputs, strict=True)
    return (f', "Concrete Inputs": {json.dumps(list(concrete))}, "Input type": {json.dumps(list(types))}, '
            f'"Input Strides": {json.dumps(list(strides))}, "Input Dims": {json.dumps(list(dims))}')


# --- GPU work -------------------------------------------------------------------------------------


def _kernel(name: str, dur_us: float, grid: tuple[int, int, int], block: tuple[int, int, int],
            regs: int, smem: int, occupancy: int) -> Gpu:
    blocks = math.prod(grid) / NUM_SMS
    warps = blocks * math.prod(block) / 32
    args = (f',      "registers per thread": {regs},      "shared memory": {smem},      '
            f'"blocks per SM": {blocks:.6f},      "warps per SM": {warps:.6f},      '
            f'"grid": {list(grid)},      "block": {list(block)},      '
            f'"est. achieved occupancy %": {occupancy}')
    return Gpu("kernel", name, int(dur_us * 1000), args)


def _gemm(m: int, n: int, k: int, layout: str) -> Gpu:
    return _kernel(f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_{layout}_n_tilesize128x256x64_warpgroupsize2x1x1"
                   "_execute_segment_k_off_kernel__5x_cublas", 2 * m * n * k / 620e6,
                   (math.ceil(n / 256), math.ceil(m / 128), 1), (384, 1, 1), 168, 213248, 9)


def _split_k_reduce(numel: int) -> Gpu:
    return _kernel("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, "
                   "__nv_bfloat16, true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, "
                   "__nv_bfloat16 const*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, "
                   "float const*, __nv_bfloat16*, void*, long, float*, int*)", numel * 10 / 2.6e6,
                   (math.ceil(numel / 2048), 1, 1), (32, 16, 1), 32, 0, 88)


def _elementwise(functor: str, numel: int, arrays: int) -> Gpu:
    array = f"std::array<char*, {arrays}ul>"
    return _kernel(f"void at::native::vectorized_elementwise_kernel<4, {functor}, {array} >(int, {functor}, "
                   f"{array})", numel * 2 * arrays / 2.9e6, (math.ceil(numel / 2048), 1, 1), (128, 1, 1),
                   28, 0, 84)


def _copy_kernel(numel: int) -> Gpu:
    lam = ("at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
           "const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}")
    impl = (f"at::native::gpu_kernel_impl_nocast<{lam}>(at::TensorIteratorBase&, {lam} const&)::"
            "{lambda(int)#1}")
    return _kernel(f"void at::native::elementwise_kernel<128, 4, {impl}>(int, {impl})", numel * 4 / 2.4e6,
                   (math.ceil(numel / 512), 1, 1), (128, 1, 1), 40, 0, 78)


def _reduce_sum(numel: int, columns: int) -> Gpu:
    op = ("at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<float, at::native::sum_functor<"
          "c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
          "unsigned int, c10::BFloat16, 4, 4>")
    return _kernel(f"void at::native::reduce_kernel<512, 1, {op} >({op})", numel * 2 / 2.5e6,
                   (columns // 32, 16, 1), (32, 16, 1), 40, 16, 62)


def _memcpy(name: str, nbytes: int) -> Gpu:
    return Gpu("gpu_memcpy", name, int(1500 + nbytes / 20), nbytes=nbytes, runtime="cudaMemcpyAsync",
               cbid=41)


def _memset(nbytes: int) -> Gpu:
    return Gpu("gpu_memset", "Memset (Device)", int(2000 + nbytes / 1500), nbytes=nbytes,
               runtime="cudaMemsetAsync", cbid=51)


STREAM_IS_CAPTURING = Call("cudaStreamIsCapturing", 317)


# --- the modelled ops -----------------------------------------------------------------------------


def _as_strided(dims: list[int], size: list[int], stride: list[int]) -> Op:
    return Op("aten::as_strided", _inputs(T(*dims), L(str(size)), L(str(stride)), NONE), cost_ns=900)


def _transpose(dims: list[int], d0: int, d1: int) -> Op:
    size, stride = list(dims), _contiguous(dims)
    size[d0], size[d1] = size[d1], size[d0]
    stride[d0], stride[d1] = stride[d1], stride[d0]
    return Op("aten::transpose", _inputs(T(*dims), S(str(d0)), S(str(d1))),
              (_as_strided(dims, size, stride),), cost_ns=1800)


def _aten_t(rows: int, cols: int, grad: bool = False) -> Op:
    return Op("aten::t", _inputs(T(rows, cols)), (_transpose([rows, cols], 0, 1),), cost_ns=2200,
              grad=Grad("TBackward0", (_aten_t(cols, rows),), params=((rows, cols),)) if grad else None)


def _view(dims: list[int], shape: list[int]) -> Op:
    return Op("aten::view", _inputs(T(*dims), L(str(shape))), cost_ns=1400)


def _empty(shape: list[int], nbytes: int, dtype: str = "15") -> Op:
    return Op("aten::empty", _inputs(L(str(shape)), S(dtype), S("0"), NONE, NONE, S("0")),
              alloc=(nbytes,), cost_ns=2600)


def _empty_like(tensor: tuple, nbytes: int) -> Op:
    return Op("aten::empty_like", _inputs(tensor, NONE, NONE, NONE, NONE, NONE), alloc=(nbytes,),
              cost_ns=3000)


def _linear(fan_in: int, fan_out: int) -> Op:
    x, flat = [BATCH, SEQ, fan_in], [TOKENS, fan_in]
    backward = Grad("AddmmBackward0", (
        _aten_t(fan_in, fan_out),
        Op("aten::mm", _inputs(T(TOKENS, fan_out), T(fan_out, fan_in)),
           runtime=(_gemm(TOKENS, fan_in, fan_out, "nn"),), alloc=(TOKENS * fan_in * 2,), cost_ns=9000),
        _aten_t(TOKENS, fan_out),
        Op("aten::mm", _inputs(T(fan_out, TOKENS, strides=[1, fan_out]), T(TOKENS, fan_in)),
           runtime=(_gemm(fan_out, fan_in, TOKENS, "nt"), _split_k_reduce(fan_out * fan_in)),
           alloc=(fan_out * fan_in * 2,), cost_ns=8000),
        _aten_t(fan_in, fan_out),
        Op("aten::sum", _inputs(T(TOKENS, fan_out), L("[0]"), S("True"), NONE),
           runtime=(_reduce_sum(TOKENS * fan_out, fan_out),), alloc=(fan_out * 2,), cost_ns=7000),
        _view([1, fan_out], [fan_out]),
    ), params=((fan_out,),))
    addmm = Op("aten::addmm",
               _inputs(T(fan_out), T(*flat), T(fan_in, fan_out, strides=[1, fan_in]), S("1"), S("1")),
               runtime=(_gemm(TOKENS, fan_out, fan_in, "tn"),), alloc=(TOKENS * fan_out * 2,),
               grad=backward, cost_ns=11000)
    return Op("aten::linear", _inputs(T(*x), T(fan_out, fan_in), T(fan_out)), (
        _aten_t(fan_out, fan_in, grad=True), _view(x, flat), addmm,
        _view([TOKENS, fan_out], [BATCH, SEQ, fan_out]),
    ), cost_ns=4000)


def _layer_norm() -> Op:
    x, stats = T(BATCH, SEQ, HIDDEN), T(BATCH, SEQ, 1, dtype=FP32)
    grad_input = _kernel(
        "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, "
        "float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 "
        "const*, c10::BFloat16*, int)", TOKENS * HIDDEN * 6 / 2.6e6, (TOKENS, 1, 1), (128, 1, 1), 40, 16, 88)
    grad_params = _kernel(
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float, "
        "32u, 32u, 256u, false, true, false>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float "
        "const*, float const*, c10::BFloat16*, c10::BFloat16*)", TOKENS * HIDDEN * 4 / 2.2e6,
        (HIDDEN // 32, 1, 1), (32, 32, 1), 64, 8448, 47)
    backward = Grad("NativeLayerNormBackward0", (
        Op("aten::native_layer_norm_backward",
           _inputs(x, x, L(f"[{HIDDEN}]"), stats, stats, T(HIDDEN), T(HIDDEN), S("")),
           runtime=(grad_input, grad_params), alloc=(TOKENS * HIDDEN * 2,), cost_ns=14000),
    ), params=((HIDDEN,), (HIDDEN,)))
    kernel = _kernel(
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>("
        "int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::"
        "BFloat16*)", TOKENS * HIDDEN * 4 / 2.7e6, (TOKENS, 1, 1), (32, 4, 1), 38, 0, 91)
    return Op("aten::layer_norm", _inputs(x, L(f"[{HIDDEN}]"), T(HIDDEN), T(HIDDEN), S("1e-05"), S("True")), (
        Op("aten::native_layer_norm", _inputs(x, L(f"[{HIDDEN}]"), T(HIDDEN), T(HIDDEN), S("1e-05")),
           runtime=(kernel,), alloc=(TOKENS * HIDDEN * 2,), grad=backward, cost_ns=12000),
    ), cost_ns=3500)


def _add() -> Op:
    x = T(BATCH, SEQ, HIDDEN)
    return Op("aten::add", _inputs(x, x, S("1")),
              runtime=(_elementwise("at::native::CUDAFunctor_add<c10::BFloat16>", TOKENS * HIDDEN, 3),),
              alloc=(TOKENS * HIDDEN * 2,), grad=Grad("AddBackward0"), cost_ns=8000)


def _attention() -> tuple[Op, ...]:
    """View and unbind the fused QKV, flash attention, merge the heads."""
    qkv, heads, merged = [BATCH, SEQ, 3, HEADS, HEAD_DIM], [BATCH, HEADS, SEQ, HEAD_DIM], [BATCH, SEQ, HIDDEN]
    per_head = [BATCH, SEQ, HEADS, HEAD_DIM]
    q = T(*heads, strides=[SEQ * 3 * HIDDEN, HEAD_DIM, 3 * HIDDEN, 1])
    lse = T(BATCH, HEADS, SEQ, dtype=FP32)
    out, lse_bytes, accum_bytes = TOKENS * HIDDEN * 2, BATCH * HEADS * SEQ * 4, TOKENS * HIDDEN * 4 + 4 * _MIB
    blocks, flash_us = (SEQ // 128, BATCH, HEADS), 2 * BATCH * HEADS * SEQ * SEQ * HEAD_DIM / 450e6
    fwd = ("Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
           "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >")
    bwd = ("Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
           "Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >")
    flash_backward = Op("aten::_flash_attention_backward", _inputs(q, q, q, q, q, lse), (
        _empty_like(q, out), _empty_like(q, out), _empty_like(q, out),
        _empty([BATCH, SEQ + 128, HEADS, HEAD_DIM], accum_bytes, dtype="6"),
    ), runtime=(
        STREAM_IS_CAPTURING, _memset(accum_bytes),
        _kernel(f"void pytorch_flash::flash_bwd_dot_do_o_kernel<true, {bwd}>(pytorch_flash::"
                "Flash_bwd_params)", 38.0, blocks, (256, 1, 1), 48, 0, 71),
        _kernel(f"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<{bwd}, true, true, false, "
                "false, false, false, false>(pytorch_flash::Flash_bwd_params)", flash_us * 2.5, blocks,
                (256, 1, 1), 255, 147456, 12),
        _kernel(f"void pytorch_flash::flash_bwd_convert_dq_kernel<{bwd}>(pytorch_flash::Flash_bwd_params, "
                "int)", 31.0, blocks, (256, 1, 1), 40, 49152, 50),
    ), cost_ns=26000)
    backward = Grad("ScaledDotProductFlashAttentionBackward0", (
        Op("aten::_scaled_dot_product_flash_attention_backward",
           _inputs(q, q, q, q, q, lse, NONE, NONE, S(str(SEQ)), S(str(SEQ)), S("0."), S("True"),
                   T(dtype=INT64), T(dtype=INT64), NONE), (flash_backward,), cost_ns=6000),
    ))
    flash_forward = Op("aten::_flash_attention_forward",
                       _inputs(q, q, q, NONE, NONE, S(str(SEQ)), S(str(SEQ)), S("0."), S("True"), S("False"),
                               NONE, NONE, NONE, NONE), (
        _empty_like(q, out), _empty([BATCH, HEADS, SEQ], lse_bytes, dtype="6"),
    ), runtime=(
        STREAM_IS_CAPTURING,
        _kernel(f"void pytorch_flash::flash_fwd_kernel<{fwd}, true, false, false, false, true, true, false, "
                "false>(pytorch_flash::Flash_fwd_params)", flash_us, blocks, (128, 1, 1), 255, 49152, 6),
    ), cost_ns=22000)
    flash = Op("aten::_scaled_dot_product_flash_attention",
               _inputs(q, q, q, S("0."), S("True"), S("False"), NONE), (
        _transpose(heads, 1, 2), _transpose(heads, 1, 2), _transpose(heads, 1, 2), flash_forward,
        _transpose(per_head, 1, 2),
    ), grad=backward, cost_ns=7000)
    sdpa = Op("aten::scaled_dot_product_attention",
              _inputs(q, q, q, NONE, S("0."), S("True"), NONE, S("False")), (flash,), cost_ns=5000)
    ns = "at::native::(anonymous namespace)"
    cat = _kernel(
        f"void {ns}::CatArrayBatchedCopy_aligned16_contig<{ns}::OpaqueType<2u>, unsigned int, 5, 128, 1>("
        f"{ns}::OpaqueType<2u>*, {ns}::CatArrInputTensorMetadata<{ns}::OpaqueType<2u>, unsigned int, 128, "
        f"1>, {ns}::TensorSizeStride<unsigned int, 4u>, int, unsigned int)", TOKENS * HIDDEN * 12 / 2.6e6,
        (4, NUM_SMS * 2, 3), (128, 1, 1), 32, 0, 70)
    stack = Op("aten::stack", _inputs(T(3, *heads)), (
        Op("aten::cat", _inputs(T(3, *heads), S("2")), runtime=(cat,), alloc=(3 * out,), cost_ns=9000),
    ), cost_ns=4000)
    qkv_strides = [SEQ * 3 * HIDDEN, 3 * HIDDEN, HEAD_DIM, 1]
    selects = tuple(Op("aten::select", _inputs(T(*qkv), S("2"), S(str(i))),
                       (_as_strided(qkv, per_head, qkv_strides),), cost_ns=1900) for i in range(3))
    unbind = Op("aten::unbind", _inputs(T(*qkv), S("2")), selects, grad=Grad("UnbindBackward0", (stack,)),
                cost_ns=3000)
    clone = Op("aten::clone", _inputs(T(*per_head), S("0")), (
        Op("aten::empty_like", _inputs(T(*per_head), NONE, NONE, NONE, NONE, S("0")), (
            Op("aten::empty_strided", _inputs(L(str(per_head)), L(str(_contiguous(per_head))), S("15"),
                                              S("0"), NONE, S("False")), alloc=(out,), cost_ns=2800),
        ), cost_ns=2000),
        Op("aten::copy_", _inputs(T(*per_head), T(*per_head), S("False")),
           runtime=(STREAM_IS_CAPTURING, _copy_kernel(TOKENS * HIDDEN)), cost_ns=7000),
    ), grad=Grad("CloneBackward0"), cost_ns=3000)
    reshape = Op("aten::reshape", _inputs(T(*per_head), L(str(merged))), (
        clone, Op("aten::_unsafe_view", _inputs(T(*per_head), L(str(merged))), cost_ns=1500),
    ), cost_ns=2500)
    return _view([BATCH, SEQ, 3 * HIDDEN], qkv), unbind, sdpa, reshape


def _gelu() -> Op:
    x, numel = T(BATCH, SEQ, FFN), TOKENS * FFN
    forward = ("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
               "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}")
    backward = ("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::"
                "{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, "
                "c10::BFloat16)#1}")
    grad = Grad("GeluBackward0", (
        Op("aten::gelu_backward", _inputs(x, x, S("none")), runtime=(_elementwise(backward, numel, 3),),
           alloc=(numel * 2,), cost_ns=8000),))
    return Op("aten::gelu", _inputs(x, S("none")), runtime=(_elementwise(forward, numel, 2),),
              alloc=(numel * 2,), grad=grad, cost_ns=8000)


def _fill(shape: list[int], value: str) -> Op:
    return Op("aten::fill_", _inputs(T(*shape, dtype=FP32), S(value)), runtime=(
        _elementwise("at::native::FillFunctor<float>", max(1, math.prod(shape)), 1),), cost_ns=6000)


def _to_device(shape: list[int]) -> Op:
    ids, nbytes = T(*shape, dtype=INT64), math.prod(shape) * 8
    return Op("aten::to", _inputs(ids, S("4"), S("0"), NONE, NONE, S("True"), S("False"), NONE), (
        Op("aten::_to_copy", _inputs(ids, S("4"), S("0"), NONE, NONE, S("True"), NONE), (
            Op("aten::empty_strided", _inputs(L(str(shape)), L(str(_contiguous(shape))), S("4"), S("0"), NONE,
                                              S("False")), alloc=(nbytes,), cost_ns=4000),
            Op("aten::copy_", _inputs(ids, ids, S("True")), runtime=(
                STREAM_IS_CAPTURING, _memcpy("Memcpy HtoD (Pinned -> Device)", nbytes)), cost_ns=9000),
        ), cost_ns=5000),
    ), cost_ns=3000)


def _embedding() -> Op:
    ids, grad_out = T(BATCH, SEQ, dtype=INT64), T(BATCH, SEQ, HIDDEN)
    info = "at::cuda::detail::TensorInfo"
    gather = _kernel(
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, "
        f"2, -2, true>({info}<c10::BFloat16, unsigned int>, {info}<c10::BFloat16, unsigned int>, "
        f"{info}<long, unsigned int>, int, int, unsigned int, unsigned int, long)",
        TOKENS * HIDDEN * 4 / 2.5e6, (NUM_SMS * 8, 1, 1), (128, 1, 1), 30, 0, 80)
    scatter = _kernel(
        "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, "
        "long>(long const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int)", 210.0,
        (HIDDEN // 32, 1, 1), (32, 32, 1), 56, 8320, 44)
    zeros = Op("aten::zeros", _inputs(L(str([VOCAB, HIDDEN])), S("15"), NONE, NONE, NONE), (
        _empty([VOCAB, HIDDEN], VOCAB * HIDDEN * 2),
        Op("aten::zero_", _inputs(T(VOCAB, HIDDEN)), runtime=(_memset(VOCAB * HIDDEN * 2),), cost_ns=5000),
    ), cost_ns=3000)
    backward = Grad("EmbeddingBackward0", (
        Op("aten::embedding_backward",
           _inputs(grad_out, ids, S(str(VOCAB)), S("-1"), S("False"), S("False")), (
            Op("aten::embedding_dense_backward", _inputs(grad_out, ids, S(str(VOCAB)), S("-1"), S("False")),
               (zeros,), runtime=(scatter,), cost_ns=24000),
        ), cost_ns=4000),
    ), params=((VOCAB, HIDDEN),))
    return Op("aten::embedding", _inputs(T(VOCAB, HIDDEN), ids, S("-1"), S("False"), S("False")), (
        _view([BATCH, SEQ], [TOKENS]),
        Op("aten::index_select", _inputs(T(VOCAB, HIDDEN), S("0"), T(TOKENS, dtype=INT64)), runtime=(gather,),
           alloc=(TOKENS * HIDDEN * 2,), cost_ns=9000),
        _view([TOKENS, HIDDEN], [BATCH, SEQ, HIDDEN]),
    ), grad=backward, cost_ns=4000)


def _cross_entropy() -> Op:
    logits, labels, size = T(TOKENS, VOCAB), T(TOKENS, dtype=INT64), TOKENS * VOCAB * 2
    ns = "at::native::(anonymous namespace)"
    softmax = _kernel(
        f"void {ns}::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, {ns}::LogSoftMaxForward"
        "Epilogue>(c10::BFloat16*, c10::BFloat16 const*, int)", size * 2 / 2.6e6, (TOKENS, 1, 1),
        (1024, 1, 1), 38, 64, 97)
    softmax_backward = _kernel(
        f"void {ns}::cunn_SoftMaxBackward<8, c10::BFloat16, float, c10::BFloat16, {ns}::LogSoftMaxBackward"
        "Epilogue>(c10::BFloat16*, c10::BFloat16 const*, c10::BFloat16 const*, long)", size * 3 / 2.6e6,
        (TOKENS, 1, 1), (1024, 1, 1), 40, 64, 95)
    nll = _kernel(
        f"void {ns}::nll_loss_forward_reduce_cuda_kernel_2d<c10::BFloat16, float, long>(c10::BFloat16*, c10::"
        "BFloat16*, c10::BFloat16 const*, long const*, c10::BFloat16 const*, bool, long, long, long, long)",
        14.0, (1, 1, 1), (32, 1, 1), 32, 128, 1)
    nll_backward = _kernel(
        f"void {ns}::nll_loss_backward_reduce_cuda_kernel_2d<c10::BFloat16, long>(c10::BFloat16*, c10::"
        "BFloat16 const*, long const*, c10::BFloat16 const*, c10::BFloat16 const*, bool, int, int, long, "
        "long)", 12.0, (1, 1, 1), (TOKENS // 16, 1, 1), 30, 0, 3)
    log_softmax = Op("aten::_log_softmax", _inputs(logits, S("1"), S("False")), runtime=(softmax,),
                     alloc=(size,), grad=Grad("LogSoftmaxBackward0", (
                         Op("aten::_log_softmax_backward_data", _inputs(logits, logits, S("1"), S("15")),
                            runtime=(softmax_backward,), alloc=(size,), cost_ns=9000),)), cost_ns=9000)
    nll_grad = Grad("NllLossBackward0", (
        Op("aten::nll_loss_backward", _inputs(T(), logits, labels, NONE, S("1"), S("-100"), T()), (
            Op("aten::zero_", _inputs(logits), (_fill([TOKENS, VOCAB], "0"),), cost_ns=2000),
        ), runtime=(nll_backward,), alloc=(size,), cost_ns=11000),
    ))
    nll_loss = Op("aten::nll_loss_forward", _inputs(logits, labels, NONE, S("1"), S("-100")), runtime=(nll,),
                  alloc=(512, 512), grad=nll_grad, cost_ns=10000)
    return Op("aten::cross_entropy_loss", _inputs(logits, labels, NONE, S("1"), S("-100"), S("0.")), (
        Op("aten::log_softmax", _inputs(logits, S("1"), NONE), (log_softmax,), cost_ns=3000),
        Op("aten::nll_loss_nd", _inputs(logits, labels, NONE, S("1"), S("-100")), (
            Op("aten::nll_loss", _inputs(logits, labels, NONE, S("1"), S("-100")), (nll_loss,), cost_ns=2500),
        ), cost_ns=2500),
    ), cost_ns=4000)


_CHUNK, _BLOCKS = 65536, 320
_TENSORS_PER_LAUNCH = {1: 110, 2: 64, 3: 48}
"""How many tensors one multi_tensor_apply launch takes, by number of lists."""


def _foreach(name: str, functor: str, depth: int, shapes: list[tuple[int, ...]], scalar: str = "",
             lists: int = 0) -> Op:
    """A `torch._foreach_*` op on `lists` (default `depth`) lists of all parameters' shapes.

    `depth` is the number of tensor lists the kernel touches; it launches once per chunk of work.
    """
    tensors = ("TensorList", [list(s) for s in shapes], [_contiguous(list(s)) for s in shapes], "")
    numel = sum(math.prod(s) for s in shapes)
    launches = max(math.ceil(numel / (_CHUNK * _BLOCKS)), math.ceil(len(shapes) / _TENSORS_PER_LAUNCH[depth]))
    ns = "at::native::(anonymous namespace)"
    signature = f"{ns}::TensorListMetadata<{depth}>, {ns}::{functor}"
    kernel = _kernel(f"void {ns}::multi_tensor_apply_kernel<{signature}>({signature})",
                     numel / launches * 2 * depth / 2.8e6, (_BLOCKS, 1, 1), (512, 1, 1), 40, 0, 48)
    inputs = (tensors,) * (lists or depth) + ((S(scalar),) if scalar else ())
    return Op(name, _inputs(*inputs), runtime=(kernel,) * launches, cost_ns=9000 + 4000 * launches)


def _adamw(shapes: list[tuple[int, ...]]) -> tuple[Op, Op]:
    """`optimizer.step()` and `optimizer.zero_grad(set_to_none=False)` of torch.optim.AdamW (foreach)."""
    def scalar(op: str) -> str:
        return f"BinaryOpScalarFunctor<c10::BFloat16, 1, 1, 0>, std::{op}<float>, double>"

    def pointwise(op: str) -> str:
        return f"PointwiseOpScalarFunctor<c10::BFloat16, 3, 3, 0>, std::{op}<float>, float>"

    steps = ("TensorList", [[]] * len(shapes), [[]] * len(shapes), "")
    step = Op("Optimizer.step#AdamW.step", cat="user_annotation", cost_ns=90000, children=(
        Op("aten::_foreach_add_", _inputs(steps, S("1")), cost_ns=40000),
        _foreach("aten::_foreach_mul_", scalar("multiplies"), 1, shapes, "0.99997"),
        _foreach("aten::_foreach_lerp_", "TernaryOpScalarFunctor<c10::BFloat16, 2, 2, 0>, "
                 "at::native::LerpFunctor<float>, float>", 2, shapes, "0.1"),
        _foreach("aten::_foreach_mul_", scalar("multiplies"), 1, shapes, "0.95"),
        _foreach("aten::_foreach_addcmul_", pointwise("multiplies"), 3, shapes, "0.05"),
        _foreach("aten::_foreach_sqrt", "UnaryOpFunctor<c10::BFloat16, 2, 1, 1>, at::native::Sqrt<float>>", 2,
                 shapes, lists=1),
        _foreach("aten::_foreach_div_", scalar("divides"), 1, shapes, "0.22360679774997896"),
        _foreach("aten::_foreach_add_", scalar("plus"), 1, shapes, "1e-08"),
        _foreach("aten::_foreach_addcdiv_", pointwise("divides"), 3, shapes, "-0.0003"),
    ))
    zero = Op("Optimizer.zero_grad#AdamW.zero_grad", cat="user_annotation", cost_ns=25000, children=(
        _foreach("aten::_foreach_zero_", "ZeroFunctor<c10::BFloat16, 1, 1, 0>>", 1, shapes),))
    return step, zero


def _param_shapes(ops: Iterable[Op]) -> list[tuple[int, ...]]:
    """The parameters the ops' autograd nodes accumulate gradients into, in forward order."""
    shapes: list[tuple[int, ...]] = []
    for op in ops:
        if op.grad is not None:
            shapes += op.grad.params
        shapes += _param_shapes(op.children)
    return shapes


def _program(layers: int) -> Program:
    """One training step of the model with `layers` transformer layers."""
    layer = (_layer_norm(), _linear(HIDDEN, 3 * HIDDEN), *_attention(), _linear(HIDDEN, HIDDEN), _add(),
             _layer_norm(), _linear(HIDDEN, FFN), _gelu(), _linear(FFN, HIDDEN), _add())
    loss = T()
    seed_grad = Op("aten::ones_like", _inputs(loss, NONE, NONE, NONE, NONE, S("1")), (
        Op("aten::empty_like", _inputs(loss, NONE, NONE, NONE, NONE, S("1")), (
            Op("aten::empty_strided", _inputs(L("[]"), L("[]"), S("15"), S("0"), NONE, S("False")),
               alloc=(512,), cost_ns=2500),
        ), cost_ns=2000),
        _fill([], "1"),
    ), cost_ns=3000)
    forward = (_to_device([BATCH, SEQ]), _to_device([BATCH, SEQ]), _embedding(), *layer * layers,
               _layer_norm(), _linear(HIDDEN, VOCAB), _cross_entropy(), seed_grad)
    item = Op("aten::item", _inputs(loss), (
        Op("aten::_local_scalar_dense", _inputs(loss), runtime=(
            _memcpy("Memcpy DtoH (Device -> Pageable)", 4), Call("cudaStreamSynchronize", 131, wait=True),
        ), cost_ns=9000),
    ), cost_ns=2500)
    return forward, (*_adamw(_param_shapes(forward)), item)


def _node(grad: Grad) -> tuple[Op, ...]:
    """What the autograd engine runs for `grad`: the node, then one AccumulateGrad per parameter."""
    node = Op(f"autograd::engine::evaluate_function: {grad.name}", children=(
        Op(grad.name, children=grad.children, node=True, flow_end=True, cost_ns=4000),
    ), node=True, cost_ns=3000)
    accumulate = tuple(Op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", children=(
        Op("torch::autograd::AccumulateGrad", children=(
            Op("aten::add_", _inputs(T(*shape), T(*shape), S("1")), runtime=(
                _elementwise("at::native::CUDAFunctorOnSelf_add<c10::BFloat16>", math.prod(shape), 2),),
               cost_ns=6000),
        ), cost_ns=3000),
    ), cost_ns=2000) for shape in grad.params)
    return node, *accumulate


BACKWARD = Op("loss.backward()")
"""Marker among a step's ops: the main thread waits while the autograd thread runs the backward pass."""
RELEASE = Op("release")
"""Marker among a step's ops: the step's remaining tensors are freed."""


# --- event templates (Kineto's ChromeTraceLogger, 2024-2025 layout) ------------------------------

_X = ('\n  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n    "ts": %s, "dur": %s,\n'
      '    "args": {\n      %s\n    }\n  },')
_FLOW = ('\n  {\n    "ph": "%s", "id": %d, "pid": %d, "tid": %d, "ts": %s,\n'
         '    "cat": "%s", "name": "%s"%s\n  },')
_MEMORY = ('\n  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
           '    "pid": %d, "tid": %d,\n    "ts": %s,\n    "args": {\n      "Device Type": 1, "Device Id": 0, '
           '"Addr": %d, "Bytes": %d, "Total Allocated": %d, "Total Reserved": %d, "Ev Idx": %d\n    }\n  },')
_META = ('\n  {\n    "name": "%s", "ph": "M", "ts": %s, "pid": %s, "tid": %s,\n'
         '    "args": {\n      "%s": %s\n    }\n  },')
_FIXED_EVENTS = 18
"""Events outside the steps: 15 metadata, the Trace span, Iteration Start and Record Window End."""


def _ts(ns: int) -> str:
    """Kineto's timestamp: whole µs, '.', three digits of ns."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def _header(trace_id: str) -> str:
    dist = ('{"backend": "nccl", "rank": 0, "world_size": 1, "pg_count": 1, "pg_config": [{"pg_name": "0", '
            '"pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 1, "ranks": [0]}], '
            '"nccl_version": "2.21.5"}')
    return ('\n{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n'
            '      "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984,\n'
            '      "computeMajor": 9, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "warpSize": 32,\n'
            f'      "sharedMemPerBlock": 49152, "numSms": {NUM_SMS}\n'
            '    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, '
            '"sharedMemPerMultiprocessor": 233472\n    }\n  ],\n'
            f'  "distributedInfo": {dist},\n  "cupti_version": 24,\n  "cuda_runtime_version": 12040,\n'
            '  "cuda_driver_version": 12040,\n  "profile_memory": 1,\n  "record_shapes": 1,\n'
            f'  "trace_id": "{trace_id}",\n  "traceEvents": [')


class _Generator:
    """Lays steps out in time and formats their events into three sections (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.counts = dict.fromkeys(CATEGORIES, 0)
        self.autograd: list[str] = []
        self.main: list[str] = []
        self.device: list[str] = []
        self.gpu_annotations: list[str] = []
        self.now = START_NS + 180_000
        self.gpu_free = self.now
        self.ext_id = self.ev_idx = self.seq_nr = self.flow_id = 0
        self.correlation = 112000
        self.tape: list[tuple[int, int, Grad, int]] = []
        """Forward ops' (sequence number, flow id, autograd node, allocations), for the backward pass."""
        self.nodes: dict[int, tuple[Op, ...]] = {}
        self.live: list[tuple[int, int]] = []
        self.cached: dict[int, list[int]] = {}
        """Freed blocks by size, reused like the CUDA caching allocator does."""
        self.allocated = self.reserved = self.allocs = 0
        self.next_addr = self.base_addr = 0x7F3A_2000_0000
        self.open_marks: list[list[int]] = []
        """[first GPU start, last GPU end] of each open annotation."""

    def _jitter(self, ns: int) -> int:
        return int(ns * (0.75 + 0.5 * self.rng.random()))

    def _alloc(self, out: list[str], tid: int, t: int, nbytes: int) -> None:
        nbytes = max(512, -(-nbytes // 512) * 512)
        if self.cached.get(nbytes):
            addr = self.cached[nbytes].pop()
        else:
            addr = self.next_addr
            self.next_addr += nbytes
            self.reserved = -(-(self.next_addr - self.base_addr) // (2 * _MIB)) * 2 * _MIB
        self.live.append((addr, nbytes))
        self.allocated += nbytes
        self.allocs += 1
        self._memory(out, tid, t, addr, nbytes)

    def _free(self, out: list[str], tid: int, t: int, count: int) -> int:
        for _ in range(min(count, len(self.live))):
            addr, nbytes = self.live.pop()
            self.cached.setdefault(nbytes, []).append(addr)
            self.allocated -= nbytes
            self._memory(out, tid, t, addr, -nbytes)
            t += 400
        return t

    def _memory(self, out: list[str], tid: int, t: int, addr: int, nbytes: int) -> None:
        out.append(_MEMORY % (PID, tid, _ts(t), addr, nbytes, self.allocated, self.reserved, self.ev_idx))
        self.ev_idx += 1
        self.counts["memory"] += 1

    def op(self, op: Op, out: list[str], tid: int, t: int, link: tuple[int, int] | None = None) -> int:
        """Emit `op` and everything under it from time `t` on; return its end time.

        `link` is the (sequence number, flow id) of the forward op whose backward node this is.
        """
        self.ext_id += 1
        eid, ev_idx = self.ext_id, self.ev_idx
        self.ev_idx += 1
        slot = len(out)
        out.append("")  # the op's own event, once its duration is known
        seq = ""
        if op.grad is not None:
            self.seq_nr += 1
            self.flow_id += 1
            link = (self.seq_nr, self.flow_id)
            out.append(_FLOW % ("s", self.flow_id, PID, tid, _ts(t), "fwdbwd", "fwdbwd", ""))
            self.counts["flow"] += 1
            seq = f'"Sequence number": {self.seq_nr}, "Fwd thread id": 0, '
        elif op.node and link is not None:
            seq = f'"Sequence number": {link[0]}, "Fwd thread id": 1, '
            if op.flow_end:
                out.append(_FLOW % ("f", link[1], PID, tid, _ts(t), "fwdbwd", "fwdbwd", ', "bp": "e"'))
                self.counts["flow"] += 1
        allocs_before = self.allocs
        mark = [-1, -1] if op.cat == "user_annotation" else None
        if mark is not None:
            self.open_marks.append(mark)
        start, cost = t, self._jitter(op.cost_ns)
        t += cost * 2 // 5
        for nbytes in op.alloc:
            self._alloc(out, tid, t, nbytes)
            t += 300
        for child in op.children:
            if child is BACKWARD:
                t = self.backward(t)
            elif child is RELEASE:
                t = self._free(out, tid, t, len(self.live))
            else:
                t = self.op(child, out, tid, t + self._jitter(700), link if op.node else None)
                t += self._jitter(500)
        for item in op.runtime:
            t = self._runtime(item, tid, t, eid) + self._jitter(600)
        t += cost * 3 // 5
        args = f'"External id": {eid},{seq}"Record function id": {eid}{op.inputs}, "Ev Idx": {ev_idx}'
        out[slot] = _X % (op.cat, op.name, PID, tid, _ts(start), _ts(t - start), args)
        self.counts[op.cat] += 1
        if op.grad is not None:
            self.tape.append((*link, op.grad, self.allocs - allocs_before))
        if mark is not None:
            self.open_marks.pop()
            # Kineto widens GPU annotations by 1 ns on each side of the GPU work under them.
            span = _ts(mark[0] - 1), _ts(mark[1] - mark[0] + 2)
            self.gpu_annotations.append(_X % ("gpu_user_annotation", op.name, GPU_PID, STREAM, *span,
                                              f'"External id": {eid}'))
            self.counts["gpu_user_annotation"] += 1
        return t

    def _runtime(self, item: Gpu | Call, tid: int, t: int, eid: int) -> int:
        self.correlation += 1
        corr = self.correlation
        if isinstance(item, Gpu):
            name, cbid, dur = item.runtime, item.cbid, self._jitter(4500)
            self._gpu(item, t, eid, corr)
            flow = _FLOW % ("s", corr, PID, tid, _ts(t), "ac2g", "ac2g", "")
        else:
            name, cbid, dur = item.name, item.cbid, self._jitter(1800)
            if item.wait:
                dur = max(dur, self.gpu_free - t + self._jitter(9000))
            flow = _FLOW % ("f", corr, PID, tid, _ts(t), "ac2g", "ac2g", ', "bp": "e"')
        self.device.append(_X % ("cuda_runtime", name, PID, tid, _ts(t), _ts(dur),
                                 f'"External id": {eid},      "cbid": {cbid}, "correlation": {corr}'))
        self.device.append(flow)
        self.counts["cuda_runtime"] += 1
        self.counts["flow"] += 1
        return t + dur

    def _gpu(self, gpu: Gpu, launched: int, eid: int, corr: int) -> None:
        start = max(self.gpu_free + self._jitter(1600), launched + self._jitter(6000))
        dur = self._jitter(gpu.dur_ns)
        self.gpu_free = start + dur
        for mark in self.open_marks:
            if mark[0] < 0:
                mark[0] = start
            mark[1] = start + dur
        where = f'"device": 0, "context": 1,      "stream": {STREAM}, "correlation": {corr}'
        if gpu.cat == "kernel":
            args = f'"External id": {eid},      "queued": 0, {where}{gpu.args}'
        else:
            args = (f'"External id": {eid},      {where},      "bytes": {gpu.nbytes}, '
                    f'"memory bandwidth (GB/s)": {gpu.nbytes / dur!r}')
        self.device.append(_X % (gpu.cat, gpu.name, GPU_PID, STREAM, _ts(start), _ts(dur), args))
        self.device.append(_FLOW % ("f", corr, GPU_PID, STREAM, _ts(start), "ac2g", "ac2g", ', "bp": "e"'))
        self.counts[gpu.cat] += 1
        self.counts["flow"] += 1

    def step(self, number: int, program: Program, filler: int) -> None:
        """`ProfilerStep#number`: forward, backward, optimizer, `loss.item()`, then `filler` views."""
        forward, after = program
        body = Op(f"ProfilerStep#{number}", cat="user_annotation", cost_ns=20000,
                  children=(*forward, BACKWARD, *after, *(_view([1], [1]),) * filler, RELEASE))
        self.now = self.op(body, self.main, MAIN_TID, self.now) + self._jitter(40000)

    def backward(self, t: int) -> int:
        """Run the tape backwards on the autograd thread from `t`; return when the main thread resumes."""
        t += self._jitter(25000)
        while self.tape:
            seq, flow, grad, fwd_allocs = self.tape.pop()
            if id(grad) not in self.nodes:
                self.nodes[id(grad)] = _node(grad)
            node, *accumulate = self.nodes[id(grad)]
            allocs_before = self.allocs
            t = self.op(node, self.autograd, AUTOGRAD_TID, t, (seq, flow)) + self._jitter(900)
            t = self._free(self.autograd, AUTOGRAD_TID, t, fwd_allocs + self.allocs - allocs_before)
            for op in accumulate:
                t = self.op(op, self.autograd, AUTOGRAD_TID, t) + self._jitter(700)
            t += self._jitter(2500)
        return t + self._jitter(30000)

    def flush(self, sections: list[TextIO]) -> None:
        """Append what the steps so far produced to the three section files."""
        for lines, sink in zip((self.autograd, self.main, self.device), sections, strict=True):
            sink.write("".join(lines))
            lines.clear()

    def trailer(self, trace_name: str) -> str:
        """GPU annotations, metadata, the Trace span and the keys after `traceEvents`."""
        start, meta_ts, end = _ts(START_NS), _ts(START_NS + 50_000), self.now + 120_000
        meta = []
        for pid, label, sort in ((PID, "CPU", PID), (GPU_PID, "GPU 0", 5000000)):
            meta += [_META % ("process_name", meta_ts, pid, 0, "name", '"python3"'),
                     _META % ("process_labels", meta_ts, pid, 0, "labels", f'"{label}"'),
                     _META % ("process_sort_index", meta_ts, pid, 0, "sort_index", sort)]
        for pid, tid, name in ((GPU_PID, STREAM, f"stream {STREAM} "), (PID, MAIN_TID, "python3"),
                               (PID, AUTOGRAD_TID, "python3"), (PID, AUTOGRAD_TID, "pt_autograd_0")):
            thread = name if pid == GPU_PID else f"thread {tid} ({name})"
            meta += [_META % ("thread_name", meta_ts, pid, tid, "name", f'"{thread}"'),
                     _META % ("thread_sort_index", meta_ts, pid, tid, "sort_index", tid)]
        self.counts["metadata"] += len(meta) + 1
        self.counts["trace"] += 3
        span = (f'\n  {{\n    "ph": "X", "cat": "Trace", "ts": {start}, "dur": {_ts(end - START_NS)},\n'
                '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
                '    "args": {\n      "Op count": 0\n    }\n  },\n'
                f'  {{\n    "name": "process_sort_index", "ph": "M", "ts": {start},\n'
                '    "pid": "Spans", "tid": 0,\n    "args": {\n      "sort_index": 536870912\n    }\n  },\n'
                '  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
                f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {start}\n  }},\n'
                '  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
                f'    "pid": "", "tid": "", "ts": {_ts(end)}\n  }}\n  ],\n')
        tail = (f'  "traceName": {json.dumps(trace_name)},\n  "displayTimeUnit": "ms",\n'
                f'  "baseTimeNanoseconds": {BASE_TIME_NS}\n}}')
        return "".join(self.gpu_annotations) + "".join(meta) + span + tail


def _step_events(program: Program) -> int:
    """How many events one step of `program` writes (its structure does not depend on the seed)."""
    gen = _Generator(0)
    gen.step(1, program, 0)
    return sum(gen.counts.values())


def _plan(events: int) -> list[tuple[Program, int]]:
    """Steps (program, filler views) that with the fixed events make exactly `events`."""
    full = _program(LAYERS)
    full_size, smallest = _step_events(full), _step_events(_program(0))
    if events < _FIXED_EVENTS + smallest:
        raise ValueError(f"a synthetic Kineto trace needs at least {_FIXED_EVENTS + smallest} events")
    steps, rest = divmod(events - _FIXED_EVENTS, full_size)
    plan: list[tuple[Program, int]] = [(full, 0)] * steps
    if rest >= smallest:
        lo, hi = 0, LAYERS - 1  # binary search: the most layers whose step fits in `rest`
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _step_events(_program(mid)) <= rest else (lo, mid - 1)
        partial = _program(lo)
        plan.append((partial, rest - _step_events(partial)))
    elif rest:
        plan[-1] = (full, rest)
    return plan


def write_synthetic_trace(path: str | Path, events: int, seed: int = 0,
                          progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Write a synthetic Kineto trace of exactly `events` trace events to `path`.

    Returns the number of events per category (`CATEGORIES`). `progress`, if given, is called with
    the number of events written so far after each step. Raises ValueError below one small step.
    """
    path = Path(path)
    gen = _Generator(seed)
    plan = _plan(events)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".synthetic-kineto-") as tmp:
        section_paths = [Path(tmp, name) for name in ("autograd", "main", "device")]
        sections = [p.open("w", buffering=1 << 20) for p in section_paths]
        try:
            for number, (program, filler) in enumerate(plan, start=1):
                gen.step(number, program, filler)
                gen.flush(sections)
                if progress is not None:
                    progress(sum(gen.counts.values()))
        finally:
            for section in sections:
                section.close()
        with path.open("w", buffering=1 << 20) as out:
            out.write(_header(f"{gen.rng.getrandbits(128):032X}"))
            for section_path in section_paths:
                with section_path.open() as section:
                    shutil.copyfileobj(section, out, 1 << 20)
            out.write(gen.trailer(str(path)))
    if progress is not None:
        progress(sum(gen.counts.values()))
    return dict(gen.counts)


def main() -> None:
    """`python benchmarks/synthetic_kineto.py OUT.json --events N`: write a trace, print its counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(write_synthetic_trace(args.out, args.events, args.seed), indent=2))


if __name__ == "__main__":
    main()
