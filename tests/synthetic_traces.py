"""Synthetic GPU training traces with the truth built in: verl (FSDP / Megatron actor) and NeMo RL shapes.

A small discrete-event simulation of one rank's RL steps: host threads (the main thread F and the
autograd thread B) run ops that launch kernels onto CUDA streams; kernels start when their stream is
free and their launch call has returned, so GPU work is asynchronous, the autograd thread launches the
backward while F waits, and a sync (``loss.item()``) drains the stream. Kernel durations follow a cost
model per precision (``fixed + per_token * tokens`` per kernel), so every micro-batch's seconds and the
BF16 / MXFP8 breakeven are known exactly. Writers turn a simulated rank into the formats mxperf reads:

- :func:`write_kineto` -- a torch.profiler Chrome trace (verl with ``contents: [cpu, cuda, shapes]``,
  Megatron with ``--pytorch-profiler-collect-shapes``): ``cpu_op`` with ``Input Dims``, ``cuda_runtime``,
  ``kernel``, ``gpu_memcpy``, ``user_annotation`` (phase ranges, ``Optimizer.step#...``, ``ProfilerStep#N``);
- :func:`write_nsys_sqlite` -- an ``nsys export --type sqlite`` file in the schema of
  ``tests/data/real/nsysai_h100x2_mfu_before.sqlite`` (NeMo RL worker NVTX ranges such as
  ``dtensor_policy_worker_v2/train``, ``emit_nvtx(record_shapes=True)`` op ranges, CUPTI kernel, runtime
  and memcpy rows).

``Job`` describes what to simulate (framework, precision, the token counts of each step's micro-batches,
model size, cost model); :func:`simulate` returns a :class:`Rank` with its events and the truth of every
micro-batch (:class:`TruthRow`): phase, step, index, tokens and seconds on the docs/contracts.md, v2 time basis (first
host op -> later of last host op and last GPU op end). Used by the micro-batch detection tests; meant to be
reused for large and many-rank traces (``ranks=``, many steps).
"""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

US = 1000
COMPUTE, COMM = 7, 20  # CUDA streams

KERNELS = {
    "embed": "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)",
    "embed_bwd": "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>(long const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int, int)",
    "norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
    "act": "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)",
    "attn": "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(flash::Flash_fwd_params)",
    "attn_bwd": "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, false, false, false, false>(flash::Flash_bwd_params)",
    "gemm_bf16": "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_TNT",
    "gemm_mxfp8": "nvjet_sm100_qqtst_128x256_128x6_2x1_2cta_v_bz_Avec32UE8M0_Bvec32UE8M0_TNT",
    "quant": "void transformer_engine::mxfp8::quantize_mxfp8_kernel<__nv_bfloat16, __nv_fp8_e4m3, 32ul, 128ul>(CUtensorMap, CUtensorMap, CUtensorMap, unsigned char*, unsigned char*, float const*, float*, unsigned long, unsigned long, unsigned long, unsigned long)",
    "xent": "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, c10::BFloat16, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)",
    "adam": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, float*)",
    "zero": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "all_gather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
}


@dataclass(frozen=True)
class Costs:
    """GPU ns of the kernels of one layer for ``n`` tokens: ``fixed + per_token * n`` each."""

    gemm_per_token: float = 400.0  # one BF16 GEMM (4 per layer forward, 8 backward)
    gemm_fixed: float = 6_000.0
    mx_speedup: float = 0.6  # MXFP8 GEMM per-token cost = mx_speedup x BF16's
    quant_fixed: float = 60_000.0  # one MXFP8 quantize kernel (weights re-cast every micro-batch)
    quant_per_token: float = 20.0
    attn_per_token: float = 300.0
    elem_per_token: float = 40.0
    elem_fixed: float = 15_000.0


@dataclass(frozen=True)
class Job:
    """One rank of an RL job to simulate.

    ``steps[i]`` lists step i's update micro-batches: an int T (packed ``[1, T]`` indices) or (B, S)
    (padded ``[B, S]``). ``logprob`` adds a forward-only logprob phase before each update with the same
    micro-batches. ``framework``: ``verl-fsdp`` | ``verl-megatron`` (Kineto) | ``nemo-rl`` (nsys).
    ``minibatches`` splits each step's micro-batches into that many optimizer steps (verl
    ``ppo_mini_batch_size``). ``explicit_ranges``: "" (none, as verl's workers and Megatron), ``verl``
    (newer verl engines: ``micro_batch<i>`` record_function ranges) or ``mxperf`` (``update/microbatch[...]``
    with attributes). ``schedule="1f1b"`` interleaves forwards and backwards as a pipeline-parallel stage
    does (micro-batches cannot be cut; no truth rows). ``device`` defaults to the rank.
    """

    framework: str = "verl-fsdp"
    precision: str = "bf16"
    steps: tuple[tuple[int | tuple[int, int], ...], ...] = ((2048, 1024), (4096, 512, 512))
    logprob: bool = True
    layers: int = 2
    vocab: int = 32000
    hidden: int = 1024
    rank: int = 0
    pid: int = 4242
    costs: Costs = Costs()
    jitter: float = 0.01  # relative noise on every kernel duration
    seed: int = 0
    profiler_steps: bool = True  # ProfilerStep#N around each step (Kineto)
    sync_per_microbatch: bool = True  # loss.item() after each backward (verl); NeMo RL syncs in its loss
    base_time_ns: int = 1_700_000_000_000_000_000
    minibatches: int = 1
    explicit_ranges: str = ""
    schedule: str = "sequential"
    device: int | None = None
    start_ns: int = 1_000_000  # host clock at the start (colocated processes: overlap them in time)
    position_bias: bool = False  # a relative-position-bias lookup ([32, 16] table) in every layer (T5 / UMT5)
    towers: int = 1  # a model call through this many towers, each with its own embedding table (CLIP-like)


HOST_TRUTH = ("phase", "step", "microbatch", "tokens", "start_ns", "end_ns")  # TruthRow's first fields


@dataclass
class TruthRow:
    phase: str
    step: int
    microbatch: int
    tokens: int
    start_ns: int
    end_ns: int
    queued_end_ns: int = 0  # end of the GPU work queued before the micro-batch's first host op
    gpu: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each GPU op it launched

    @property
    def seconds(self) -> float:
        """The host window: first host op -> later of last host op and last own GPU op end."""
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def device_seconds(self) -> float:
        """Completion interval on the device: end of the work queued before it (or its first host op, if
        later) -> end of its last GPU op."""
        return (max(e for _, e in self.gpu) - max(self.start_ns, self.queued_end_ns)) / 1e9

    @property
    def gpu_busy_seconds(self) -> float:
        """Union of its own GPU ops."""
        busy, reach = 0, -1
        for a, b in sorted(self.gpu):
            busy += max(0, b - max(a, reach))
            reach = max(reach, b)
        return busy / 1e9


@dataclass
class Host:
    """A host op (cpu op, user range, NVTX range) or a runtime call; ``gpu`` is the op it launched."""

    kind: str  # cpu_op | range | runtime
    name: str
    tid: int
    start: int
    end: int = 0
    shapes: list[list[int]] | None = None
    correlation: int = -1
    external: int = -1
    gpu: Gpu | None = None
    seq: int = -1


@dataclass
class Gpu:
    kind: str  # kernel | memcpy | memset
    name: str
    stream: int
    start: int
    end: int
    correlation: int
    copy_kind: int = 0  # memcpy: 1 HtoD, 2 DtoH
    nbytes: int = 0


@dataclass
class Rank:
    job: Job
    host: list[Host] = field(default_factory=list)
    truth: list[TruthRow] = field(default_factory=list)

    @property
    def main_tid(self) -> int:
        return self.job.pid

    @property
    def autograd_tid(self) -> int:
        return self.job.pid + 7


class _Sim:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.rank = Rank(job)
        self.rng = random.Random(job.seed * 1000 + job.rank)
        self.clock: dict[int, int] = {}
        self.stream_free = {COMPUTE: 0, COMM: 0}
        self.corr = 1000
        self.ext = 1
        self.seq = 0
        self.stack: list[Host] = []
        self.mb: TruthRow | None = None

    def now(self, tid: int) -> int:
        return self.clock.setdefault(tid, self.job.start_ns)

    def advance(self, tid: int, ns: float) -> int:
        self.clock[tid] = self.now(tid) + int(ns)
        return self.clock[tid]

    def _touch(self, end: int) -> None:
        if self.mb is not None:
            self.mb.end_ns = max(self.mb.end_ns, end)

    def op(self, tid: int, name: str, shapes: list[list[int]] | None = None, kind: str = "cpu_op") -> Host:
        h = Host(kind, name, tid, self.now(tid), shapes=shapes, external=self.ext)
        self.ext += 1
        if kind == "cpu_op" and name.startswith("aten::"):
            h.seq, self.seq = self.seq, self.seq + 1
        self.rank.host.append(h)
        if self.mb is not None and self.mb.start_ns < 0:
            self.mb.start_ns = h.start
            self.mb.queued_end_ns = max(self.stream_free.values())
        self.advance(tid, 3 * US)
        return h

    def close(self, h: Host, ns: float = 2 * US) -> None:
        h.end = self.advance(h.tid, ns)
        self._touch(h.end)

    def launch(
        self, tid: int, key: str, gpu_ns: float, stream: int = COMPUTE, parent: Host | None = None
    ) -> Gpu:
        api = "cudaLaunchKernel"
        call = Host("runtime", api, tid, self.now(tid), correlation=self.corr)
        call.external = parent.external if parent else -1
        call.end = self.advance(tid, 4 * US)
        dur = max(1_000, int(gpu_ns * (1 + self.job.jitter * (2 * self.rng.random() - 1))))
        start = max(self.stream_free[stream], call.end + 1_500)
        g = Gpu("kernel", KERNELS.get(key, key), stream, start, start + dur, self.corr)
        self.stream_free[stream] = g.end
        call.gpu = g
        if self.mb is not None:
            self.mb.gpu.append((g.start, g.end))
        self.corr += 1
        self.rank.host.append(call)
        self._touch(max(call.end, g.end))
        return g

    def memcpy(self, tid: int, copy_kind: int, nbytes: int, parent: Host | None = None) -> Gpu:
        call = Host("runtime", "cudaMemcpyAsync", tid, self.now(tid), correlation=self.corr)
        call.external = parent.external if parent else -1
        call.end = self.advance(tid, 5 * US)
        start = max(self.stream_free[COMPUTE], call.end + 1_000)
        name = "Memcpy HtoD (Pinned -> Device)" if copy_kind == 1 else "Memcpy DtoH (Device -> Pageable)"
        g = Gpu(
            "memcpy", name, COMPUTE, start, start + 2_000 + nbytes // 20_000, self.corr, copy_kind, nbytes
        )
        self.stream_free[COMPUTE] = g.end
        call.gpu = g
        if self.mb is not None:
            self.mb.gpu.append((g.start, g.end))
        self.corr += 1
        self.rank.host.append(call)
        self._touch(max(call.end, g.end))
        return g

    def sync(self, tid: int) -> None:
        """``loss.item()``: aten::item -> _local_scalar_dense -> DtoH copy + stream sync."""
        item = self.op(tid, "aten::item", [[]])
        dense = self.op(tid, "aten::_local_scalar_dense", [[]])
        self.memcpy(tid, 2, 4, dense)
        call = Host("runtime", "cudaStreamSynchronize", tid, self.now(tid), correlation=self.corr)
        self.corr += 1
        call.end = max(call.start + 2 * US, self.stream_free[COMPUTE] + 3 * US)
        self.clock[tid] = call.end
        self.rank.host.append(call)
        self._touch(call.end)
        self.close(dense)
        self.close(item)


def _tokens(mb: int | tuple[int, int]) -> tuple[int, list[int]]:
    if isinstance(mb, tuple):
        return mb[0] * mb[1], [mb[0], mb[1]]
    return mb, [1, mb]


def _layer_forward(sim: _Sim, tid: int, n: int, shape: list[int], gemm_ops: bool) -> None:
    job, c = sim.job, sim.job.costs
    h = job.hidden
    mx = job.precision == "mxfp8"
    for _ in range(job.layers):
        if job.position_bias:  # T5's relative_attention_bias: an embedding lookup of [S, S] buckets
            bias = sim.op(tid, "aten::embedding", [[32, 16], [shape[-1], shape[-1]], [], [], []])
            sim.launch(tid, "embed", c.elem_fixed, parent=bias)
            sim.close(bias)
        norm = sim.op(tid, "aten::layer_norm", [[*shape, h], [h], [h], [], []])
        sim.launch(tid, "norm", c.elem_fixed + c.elem_per_token * n, parent=norm)
        sim.close(norm)
        for g, out in enumerate((3 * h, h, 4 * h, h)):
            k = 4 * h if g == 3 else h
            # torch linears are aten::linear ops with shapes; Transformer Engine's leave no op, only launches
            op = sim.op(tid, "aten::linear", [[*shape, k], [out, k], []]) if gemm_ops else None
            if mx:
                sim.launch(tid, "quant", c.quant_fixed, parent=op)  # weight re-cast
                sim.launch(tid, "quant", c.elem_fixed + c.quant_per_token * n, parent=op)  # activation
            per_tok = c.gemm_per_token * (c.mx_speedup if mx else 1.0)
            sim.launch(tid, "gemm_mxfp8" if mx else "gemm_bf16", c.gemm_fixed + per_tok * n, parent=op)
            if op is not None:
                sim.close(op)
            else:
                sim.advance(tid, 4 * US)
            if g == 0:
                att = sim.op(tid, "aten::_flash_attention_forward", [[*shape, h]])
                sim.launch(tid, "attn", c.elem_fixed + c.attn_per_token * n, parent=att)
                sim.close(att)
            if g == 2:
                act = sim.op(tid, "aten::silu", [[*shape, 4 * h]])
                sim.launch(tid, "act", c.elem_fixed + c.elem_per_token * n, parent=act)
                sim.close(act)


def _forward(sim: _Sim, tid: int, mb: int | tuple[int, int], with_loss: bool) -> int:
    job, c = sim.job, sim.job.costs
    n, shape = _tokens(mb)
    gemm_ops = job.framework != "verl-megatron"  # TE linears leave no aten::linear op
    copy = sim.op(tid, "aten::to", [[*shape], [], [], [], []])
    sim.memcpy(tid, 1, n * 8, copy)
    sim.close(copy)
    emb = sim.op(tid, "aten::embedding", [[job.vocab, job.hidden], shape, [], [], []])
    sim.launch(tid, "embed", c.elem_fixed + c.elem_per_token * n, parent=emb)
    sim.close(emb)
    _layer_forward(sim, tid, n, shape, gemm_ops)
    for tower in range(1, job.towers):  # another tower of the same call, with its own table
        emb = sim.op(tid, "aten::embedding", [[job.vocab + 1000 * tower, job.hidden], shape, [], [], []])
        sim.launch(tid, "embed", c.elem_fixed + c.elem_per_token * n, parent=emb)
        sim.close(emb)
        _layer_forward(sim, tid, n, shape, gemm_ops)
    head = sim.op(tid, "aten::linear", [[*shape, job.hidden], [job.vocab, job.hidden], []])
    sim.launch(tid, "gemm_bf16", c.gemm_fixed + c.gemm_per_token * 2 * n, parent=head)  # LM head stays BF16
    sim.close(head)
    lsm = sim.op(tid, "aten::_log_softmax", [[*shape, job.vocab], [], []])
    sim.launch(tid, "xent", c.elem_fixed + c.elem_per_token * 4 * n, parent=lsm)
    sim.close(lsm)
    if with_loss and job.framework == "nemo-rl":
        sim.sync(tid)  # NeMo RL's loss functions return metrics with .item() (before backward)
    return n


def _backward(sim: _Sim, n: int) -> None:
    job, c = sim.job, sim.job.costs
    f, b = sim.rank.main_tid, sim.rank.autograd_tid
    sim.clock[b] = max(sim.now(b), sim.now(f) + 5 * US)
    mx = job.precision == "mxfp8"
    ev = sim.op(b, "autograd::engine::evaluate_function: LogSoftmaxBackward0")
    sim.launch(b, "xent", c.elem_fixed + c.elem_per_token * 4 * n, parent=ev)
    sim.close(ev)
    ev = sim.op(b, "autograd::engine::evaluate_function: MmBackward0")
    sim.launch(b, "gemm_bf16", 2 * (c.gemm_fixed + c.gemm_per_token * 2 * n), parent=ev)
    sim.close(ev)
    for layer in range(job.layers):
        for g in range(4):
            ev = sim.op(b, "autograd::engine::evaluate_function: MmBackward0")
            for _ in range(2):  # dgrad + wgrad
                if mx:
                    sim.launch(b, "quant", c.quant_fixed, parent=ev)
                per_tok = c.gemm_per_token * (c.mx_speedup if mx else 1.0)
                sim.launch(b, "gemm_mxfp8" if mx else "gemm_bf16", c.gemm_fixed + per_tok * n, parent=ev)
            sim.close(ev)
            if g == 0:
                ev = sim.op(b, "autograd::engine::evaluate_function: FlashAttnFuncBackward")
                sim.launch(b, "attn_bwd", c.elem_fixed + 2 * c.attn_per_token * n, parent=ev)
                sim.close(ev)
        if job.framework == "verl-fsdp" and layer == 0:  # FSDP reduce-scatter of a layer's grads
            rs = sim.op(b, "c10d::_reduce_scatter_base_")
            sim.launch(b, "reduce_scatter", 50 * US, stream=COMM, parent=rs)
            sim.close(rs)
    ev = sim.op(b, "autograd::engine::evaluate_function: EmbeddingBackward0")
    sim.launch(b, "embed_bwd", c.elem_fixed + c.elem_per_token * n, parent=ev)
    sim.close(ev)
    sim.clock[f] = sim.now(b) + 4 * US  # loss.backward() returns once the autograd thread is done


def _microbatch(sim: _Sim, phase: str, step: int, index: int, mb: int | tuple[int, int]) -> None:
    n, _ = _tokens(mb)
    sim.mb = TruthRow(phase, step, index, n, -1, 0)
    f, job = sim.rank.main_tid, sim.job
    rng = None
    if job.explicit_ranges == "verl":
        rng = _range(sim, f"micro_batch{index}")
    elif job.explicit_ranges == "mxperf" and phase == "update":
        rng = _range(
            sim, f"update/microbatch[step={step},microbatch={index},tokens={n},precision={job.precision}]"
        )
    _forward(sim, f, mb, with_loss=phase == "update")
    if phase == "update":
        _backward(sim, n)
        if job.sync_per_microbatch and job.framework != "nemo-rl":
            sim.sync(f)
    if rng is not None:
        sim.close(rng)
    sim.rank.truth.append(sim.mb)
    sim.mb = None
    sim.advance(f, 40 * US)  # Python between micro-batches


def _one_f_one_b(sim: _Sim, mbs: Sequence[int | tuple[int, int]]) -> None:
    """A pipeline stage's 1F1B schedule: two forwards in flight before the first backward."""
    f = sim.rank.main_tid
    pending = []
    for mb in mbs:
        pending.append(_forward(sim, f, mb, with_loss=True))
        if len(pending) == 2:
            _backward(sim, pending.pop(0))
    for n in pending:
        _backward(sim, n)
    sim.sync(f)


def _range(sim: _Sim, name: str) -> Host:
    return sim.op(sim.rank.main_tid, name, kind="range")


def _optimizer(sim: _Sim) -> None:
    f = sim.rank.main_tid
    r = _range(sim, "Optimizer.step#AdamW.step")
    for _ in range(4):
        op = sim.op(f, "aten::_fused_adam_")
        sim.launch(f, "adam", 200 * US, parent=op)
        sim.close(op)
    sim.sync(f)  # grad-norm check
    sim.close(r)


def simulate(job: Job) -> Rank:
    """Run the job; every host op, launch and GPU op, and the truth of each micro-batch."""
    sim = _Sim(job)
    names = _phase_names(job.framework)
    for step, mbs in enumerate(job.steps):
        ps = (
            _range(sim, f"ProfilerStep#{step}") if job.profiler_steps and job.framework != "nemo-rl" else None
        )
        if job.logprob:
            r = _range(sim, names["logprob"])
            for i, mb in enumerate(mbs):
                _microbatch(sim, "logprob", step, i, mb)
            sim.sync(sim.rank.main_tid)  # the log-probs go back to the driver: .cpu() waits for the GPU
            sim.close(r)
        r = _range(sim, names["update"])
        if job.schedule == "1f1b":
            _one_f_one_b(sim, mbs)
            _optimizer(sim)
        else:
            size = -(-len(mbs) // job.minibatches)
            for first in range(0, len(mbs), size):
                z = _range(sim, "Optimizer.zero_grad#AdamW.zero_grad")
                zero = sim.op(sim.rank.main_tid, "aten::zero_")
                sim.launch(sim.rank.main_tid, "zero", 30 * US, parent=zero)
                sim.close(zero)
                sim.close(z)
                for i, mb in enumerate(mbs[first : first + size], start=first):
                    _microbatch(sim, "update", step, i, mb)
                _optimizer(sim)
        sim.close(r)
        sim.advance(sim.rank.main_tid, 2_000 * US)  # generation, sync ... (not simulated)
        if ps is not None:
            sim.close(ps)
    return sim.rank


def simulate_inference(job: Job, kind: str = "decode", loop: int = 12) -> Rank:
    """No training, so no micro-batches (no truth rows), in one ``ProfilerStep#0``: ``decode`` -- a prefill
    forward of ``job.steps[0][0]`` ((B, S) or T), then ``loop`` one-token forwards, each looking up its token
    and ending in a sync (sampling); ``diffusion`` -- a text encoder's forward, then a denoising loop of
    ``loop`` transformer passes over 4096 latent patches without any lookup."""
    sim = _Sim(job)
    f = sim.rank.main_tid
    ps = _range(sim, "ProfilerStep#0")
    mb = job.steps[0][0]
    batch = mb[0] if isinstance(mb, tuple) else 1
    _forward(sim, f, mb, with_loss=False)
    sim.sync(f)
    for _ in range(loop):
        if kind == "decode":
            _forward(sim, f, (batch, 1), with_loss=False)
            sim.sync(f)
        else:
            _layer_forward(sim, f, 4096, [1, 4096], True)
    sim.sync(f)
    sim.close(ps)
    return sim.rank


def _phase_names(framework: str) -> dict[str, str]:
    if framework == "nemo-rl":
        return {
            "update": "dtensor_policy_worker_v2/train",
            "logprob": "dtensor_policy_worker_v2/get_logprobs",
        }
    return {"update": "update_actor", "logprob": "compute_log_prob"}


def expected_line(
    job: Job, phase: str = "update", sizes: tuple[int, int] = (512, 4096)
) -> tuple[float, float]:
    """(fixed_s, per_token_s) of one micro-batch's seconds under ``job``'s cost model, without noise.

    Measured on a noise-free simulation of two single-micro-batch steps; inside a micro-batch the
    simulation is GPU-bound, so seconds are exactly linear in tokens (a host lead and a sync tail that do
    not depend on the precision, plus the GPU work). The BF16 / MXFP8 breakeven is
    ``(fixed_mx - fixed_bf) / (per_token_bf - per_token_mx)`` of these lines.
    """
    quiet = replace(job, jitter=0.0, steps=tuple((n,) for n in sizes), logprob=phase == "logprob")
    rows = [t for t in simulate(quiet).truth if t.phase == phase]
    (n0, s0), (n1, s1) = ((r.tokens, r.seconds) for r in rows)
    slope = (s1 - s0) / (n1 - n0)
    return s0 - slope * n0, slope


def breakeven_tokens(base: Job, low: Job) -> float:
    """The breakeven built into two jobs' cost models (tokens per micro-batch)."""
    fb, tb = expected_line(base)
    fl, tl = expected_line(low)
    return (fl - fb) / (tb - tl)


# --------------------------------------------------------------------------------------------- writers


def _us(ns: int) -> str:
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def write_kineto(rank: Rank, path: str | Path, *, shapes: bool = True, world_size: int = 1) -> Path:
    """A torch.profiler Chrome trace of the rank (ts relative to ``baseTimeNanoseconds``)."""
    job, path = rank.job, Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    for h in rank.host:
        if h.kind == "range":
            parts.append(
                _event("user_annotation", h.name, job.pid, h.tid, h.start, h.end, {"External id": h.external})
            )
            continue
        if h.kind == "cpu_op":
            args: dict = {"External id": h.external}
            if h.seq >= 0:
                args["Sequence number"] = h.seq
            if shapes and h.shapes is not None:
                args["Input Dims"] = h.shapes
            parts.append(_event("cpu_op", h.name, job.pid, h.tid, h.start, h.end, args))
            continue
        args = {"correlation": h.correlation, "External id": h.external, "cbid": 211}
        parts.append(_event("cuda_runtime", h.name, job.pid, h.tid, h.start, h.end, args))
        g = h.gpu
        if g is not None:
            cat = "kernel" if g.kind == "kernel" else "gpu_memcpy"
            dev = job.rank if job.device is None else job.device
            gargs = {
                "correlation": g.correlation,
                "External id": h.external,
                "device": dev,
                "stream": g.stream,
            }
            if g.kind == "memcpy":
                gargs["bytes"] = g.nbytes
            parts.append(_event(cat, g.name, dev, g.stream, g.start, g.end, gargs))
    meta = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912}],
        "distributedInfo": {"backend": "nccl", "rank": job.rank, "world_size": world_size},
        "record_shapes": int(shapes),
        "traceName": path.name,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": job.base_time_ns,
    }
    head = json.dumps(meta)[:-1]
    text = head + ', "traceEvents": [\n' + ",\n".join(parts) + "\n]}"
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as fh:
        fh.write(text)
    return path


def two_process_kineto(tmp: Path) -> Path:
    """One Kineto file (``tmp/two.json``) holding two processes on one device: a learner (pid 100) and a
    sampler (pid 200, correlation ids after the learner's), so GPU rows need the (correlation -> pid) map."""
    learner = simulate(Job(steps=((2048, 1024),), logprob=False, pid=100, device=0))
    sampler = simulate(Job(steps=((512,) * 4,), logprob=False, pid=200, device=0, start_ns=3_000_000, seed=3))
    docs = [
        json.loads(gzip.decompress(write_kineto(r, tmp / f"{r.job.pid}.json.gz").read_bytes()))
        for r in (learner, sampler)
    ]
    for ev in docs[1]["traceEvents"]:  # the sampler's correlation ids follow the learner's
        if "correlation" in ev.get("args", {}):
            ev["args"]["correlation"] += 10_000_000
    docs[0]["traceEvents"] += docs[1]["traceEvents"]
    path = tmp / "two.json"
    path.write_text(json.dumps(docs[0]))
    return path


def _event(cat: str, name: str, pid: int, tid: int, start: int, end: int, args: dict) -> str:
    return (
        f'{{"ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid}, "tid": {tid}, '
        f'"ts": {_us(start)}, "dur": {_us(end - start)}, "args": {json.dumps(args)}}}'
    )


_NSYS_DDL = (
    "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
    "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, "
    "domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, "
    "int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER "
    "NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, "
    "callchainId INTEGER)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT "
    "NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
    "globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
    "launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
    "gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ "
    "INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
    "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, "
    "sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER, qmdBulkReleaseDone "
    "INTEGER, qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER, clusterX INTEGER, clusterY "
    "INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER, maxPotentialClusterSize INTEGER, "
    "maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER, tensorSizeMinusOneElements TEXT NOT NULL)",
    "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT "
    "NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
    "globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind "
    "INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId "
    "INTEGER, migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER)",
    "CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT)",
    "CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER)",
    "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT, "
    "systemClockNs INTEGER)",
    "CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT)",
)
_RUNTIME_NAMES = {
    "cudaLaunchKernel": "cudaLaunchKernel_v7000",
    "cudaMemcpyAsync": "cudaMemcpyAsync_v3020",
    "cudaStreamSynchronize": "cudaStreamSynchronize_v3020",
}


def _shape_text(shapes: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes) + "]"


def write_nsys_sqlite(ranks: Sequence[Rank], path: str | Path, *, emit_nvtx: bool = True) -> Path:
    """An nsys SQLite export holding ``ranks`` (one process each, same session clock)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    for ddl in _NSYS_DDL:
        con.execute(ddl)
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        return strings.setdefault(s, len(strings) + 1)

    nvtx, runtime, kernels, memcpy = [], [], [], []
    op_id = 1
    for rank in ranks:
        job = rank.job
        gpid = (1 << 48) | (job.pid << 24)
        dev = job.rank if job.device is None else job.device
        con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (gpid, job.pid, "python3"))
        for h in rank.host:
            gtid = gpid | h.tid
            if h.kind == "range":  # record_function ranges get emit_nvtx's op_id; nvtx.range_push ones do not
                text = h.name + (
                    f", op_id = {op_id}" if emit_nvtx and h.name.startswith("Optimizer.") else ""
                )
                op_id += 1
                nvtx.append((h.start, h.end, 59, text, gtid))
            elif h.kind == "cpu_op":
                if not emit_nvtx:
                    continue
                text = h.name + (f", seq = {h.seq}" if h.seq >= 0 else "") + f", op_id = {op_id}"
                op_id += 1
                if h.shapes is not None:
                    text += f", sizes = {_shape_text(h.shapes)}"
                nvtx.append((h.start, h.end, 59, text, gtid))
            else:
                runtime.append((h.start, h.end, 0, gtid, h.correlation, sid(_RUNTIME_NAMES[h.name]), 0))
                g = h.gpu
                if g is not None and g.kind == "kernel":
                    n = sid(g.name)
                    kernels.append((g.start, g.end, dev, 1, 0, g.stream, g.correlation, gpid, n, n, n))
                elif g is not None:
                    memcpy.append(
                        (g.start, g.end, dev, 1, 0, g.stream, g.correlation, gpid, g.nbytes, g.copy_kind)
                    )
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, ?, ?, ?, 0)",
        nvtx,
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, nameId, "
        "returnValue) VALUES (?, ?, ?, ?, ?, ?, ?)",
        runtime,
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, greenContextId, streamId, "
        "correlationId, globalPid, demangledName, shortName, mangledName, registersPerThread, gridX, gridY, gridZ, "
        "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, "
        "gridId, tensorSizeMinusOneElements) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 32, 132, 1, 1, 128, 1, 1, 0, "
        "0, 0, 0, 1, '[]')",
        kernels,
    )
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, greenContextId, streamId, "
        "correlationId, globalPid, bytes, copyKind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        memcpy,
    )
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    con.execute(
        "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '2026-01-01T00:00:00', '2026-01-01T00:00:00', 0)",
        (ranks[0].job.base_time_ns,),
    )
    con.executemany(
        "INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
        [("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_SCHEMA_VERSION", "3.25.0")],
    )
    con.commit()
    con.close()
    return path
