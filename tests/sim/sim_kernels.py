"""Toy TLX kernels for the simulator's tests, each with the protocol bugs its tests inject.

A ``BUG`` constexpr picks the bug (0: none). Lines the tests expect a report to name carry a marker
comment (``# <name>``); ``line_of(name)`` finds them, so the tests do not hard-code line numbers.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.tools.tensor_descriptor import TensorDescriptor

import jfa.sim as sim
from jfa.kernels.tlx.common.device import to_16bit_pairs
from word_ring import WORD_RING_BUGS, word_ring_kernel

HERE = os.path.abspath(__file__)


def line_of(marker: str, path: str = HERE) -> int:
    """The line of ``path`` (this file by default) that carries ``# <marker>``."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <{marker}>"):
                return n
    raise KeyError(marker)


# ---------------------------------------------------------------------------------------------------------
# A TMA ring: the producer loads tiles into NUM_BUF buffers, the consumer sums them (local_load).
# ---------------------------------------------------------------------------------------------------------
RING_BUGS = {
    "none": 0,
    "producer_wrong_parity": 1,  # waits for the empty barrier's phase of the wrong parity
    "expect_too_many_bytes": 2,
    "expect_too_few_bytes": 3,
    "release_before_read": 4,  # hands the buffer back before reading it
    "missing_full_wait": 5,
    "buffer_index_out_of_range": 6,
    "barrier_index_out_of_range": 7,
    "store_out_of_bounds": 8,
    "arrive_count_too_high": 9,  # empties need two arrivals, one consumer gives one
    "over_arrival": 10,  # arrives twice on a barrier of arrive count 1
    "runaway_loop": 11,
    "double_arrive": 12,  # two arrivals per use on a barrier of arrive count 1: phases pass unseen
}


@triton.jit
def ring_kernel(desc_x, OUT, N_TILES, BLOCK: tl.constexpr, D: tl.constexpr, NUM_BUF: tl.constexpr,
                BUG: tl.constexpr):
    bufs = tlx.local_alloc((BLOCK, D), tl.float32, NUM_BUF)
    fulls = tlx.alloc_barriers(num_barriers=NUM_BUF, arrive_count=1)
    if BUG == 9:
        empties = tlx.alloc_barriers(num_barriers=NUM_BUF, arrive_count=2)
    else:
        empties = tlx.alloc_barriers(num_barriers=NUM_BUF, arrive_count=1)
    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer
            for i in range(0, N_TILES):
                b = i % NUM_BUF
                ph = (i // NUM_BUF) & 1
                if BUG == 1:
                    tlx.barrier_wait(empties[b], ph)  # <ring-wrong-parity>
                else:
                    tlx.barrier_wait(empties[b], ph ^ 1)  # <ring-wait-empty>
                if BUG == 2:
                    tlx.barrier_expect_bytes(fulls[b], 2 * BLOCK * D * 4)
                elif BUG == 3:
                    tlx.barrier_expect_bytes(fulls[b], BLOCK * D * 2)
                else:
                    tlx.barrier_expect_bytes(fulls[b], BLOCK * D * 4)
                tlx.async_descriptor_load(desc_x, bufs[b], [i * BLOCK, 0], fulls[b])  # <ring-load>
        with tlx.async_task(num_warps=4):  # consumer
            acc = tl.zeros((BLOCK, D), dtype=tl.float32)
            n = N_TILES
            if BUG == 11:
                n = N_TILES * 1000000
            for i in tl.range(0, n):  # <ring-consumer-loop>
                b = i % NUM_BUF
                ph = (i // NUM_BUF) & 1
                if BUG == 6:
                    acc += tlx.local_load(bufs[b + NUM_BUF])  # <ring-bad-buffer>
                elif BUG == 7:
                    tlx.barrier_wait(fulls[b + NUM_BUF], ph)  # <ring-bad-barrier>
                elif BUG == 11:
                    tlx.fence_async_shared()  # <ring-spin-op>
                else:
                    if BUG != 5:
                        tlx.barrier_wait(fulls[b], ph)  # <ring-wait-full>
                    if BUG == 4:
                        tlx.barrier_arrive(empties[b], 1)  # <ring-early-release>
                        acc += tlx.local_load(bufs[b])  # <ring-late-read>
                    else:
                        acc += tlx.local_load(bufs[b])  # <ring-read>
                        if BUG == 10:
                            tlx.barrier_arrive(empties[b], 2)  # <ring-over-arrival>
                        elif BUG == 12:
                            tlx.barrier_arrive(empties[b], 1)
                            tlx.barrier_arrive(empties[b], 1)  # <ring-double-arrive>
                        else:
                            tlx.barrier_arrive(empties[b], 1)  # <ring-release>
            offs = tl.arange(0, BLOCK)[:, None] * D + tl.arange(0, D)[None, :]
            if BUG == 8:
                offs = offs + BLOCK * D
            tl.store(OUT + offs, acc)  # <ring-store>


def run_ring(bug="none", n_tiles=5, block=16, d=32, num_buf=2, **launch_kw):
    """(max |out - expected|, LaunchReport) of the ring kernel with ``bug``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_tiles * block, d, generator=g)
    out = torch.zeros(block, d)
    desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [block, d])
    report = sim.launch(ring_kernel, (1,), desc, out, n_tiles, BLOCK=block, D=d, NUM_BUF=num_buf,
                        BUG=RING_BUGS[bug], **launch_kw)
    expected = x.view(n_tiles, block, d).sum(0)
    return (out - expected).abs().max().item(), report


# ---------------------------------------------------------------------------------------------------------
# A word ring (word_ring.py): generic stores handed to two consumer warpgroups by mbarriers alone.
# ---------------------------------------------------------------------------------------------------------


def run_word_ring(bug="none", n_items=7, ctas=2, **launch_kw):
    """(what each consumer of each CTA counted, LaunchReport): n_items everywhere when every word arrived."""
    out = torch.full((ctas * 2,), -1, dtype=torch.int32)
    report = sim.launch(word_ring_kernel, (ctas,), out, n_items, BUG=WORD_RING_BUGS[bug], **launch_kw)
    return out.tolist(), report


# ---------------------------------------------------------------------------------------------------------
# wgmma: the producer loads A [64, K] and B [K, 64] tiles, the consumer accumulates A_i B_i by async_dot.
# ---------------------------------------------------------------------------------------------------------
MMA_BUGS = {
    "none": 0,
    "release_before_retire": 1,  # hands the operands back before async_dot_wait
    "use_before_wait": 2,  # computes with the async_dot result before its wait
    "missing_fence": 3,  # local_store of an operand, read by wgmma with no fence_async_shared
}


@triton.jit
def mma_kernel(desc_a, desc_b, OUT, N_STEPS, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
               BUG: tl.constexpr):
    a_tiles = tlx.local_alloc((M, K), tl.bfloat16, 2)
    b_tiles = tlx.local_alloc((K, N), tl.bfloat16, 2)
    a_copy = tlx.local_alloc((M, K), tl.bfloat16, 1)
    fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    empties = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    with tlx.async_tasks():
        with tlx.async_task("default"):
            for i in range(0, N_STEPS):
                b = i % 2
                tlx.barrier_wait(empties[b], ((i // 2) & 1) ^ 1)
                tlx.barrier_expect_bytes(fulls[b], (M * K + K * N) * 2)
                tlx.async_descriptor_load(desc_a, a_tiles[b], [i * M, 0], fulls[b])
                tlx.async_descriptor_load(desc_b, b_tiles[b], [i * K, 0], fulls[b])  # <mma-load-b>
        with tlx.async_task(num_warps=4):
            acc = tl.zeros((M, N), dtype=tl.float32)
            for i in range(0, N_STEPS):
                b = i % 2
                tlx.barrier_wait(fulls[b], (i // 2) & 1)
                if BUG == 3:
                    a_regs = tlx.local_load(a_tiles[b])
                    tlx.local_store(a_copy[0], a_regs)  # <mma-generic-store>
                    acc = tlx.async_dot(a_copy[0], b_tiles[b], acc)  # <mma-unfenced-dot>
                    acc = tlx.async_dot_wait(0, acc)
                else:
                    acc = tlx.async_dot(a_tiles[b], b_tiles[b], acc)  # <mma-dot>
                if BUG == 1:
                    tlx.barrier_arrive(empties[b], 1)  # <mma-early-release>
                    acc = tlx.async_dot_wait(0, acc)  # <mma-late-wait>
                elif BUG == 2:
                    acc = acc * 1.0  # <mma-use-before-wait>
                    acc = tlx.async_dot_wait(0, acc)
                    tlx.barrier_arrive(empties[b], 1)
                else:
                    acc = tlx.async_dot_wait(0, acc)
                    tlx.barrier_arrive(empties[b], 1)
            offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
            tl.store(OUT + offs, acc)


def run_mma(bug="none", n_steps=4, m=64, k=32, n=64, fence=True, **launch_kw):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(n_steps * m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n_steps * k, n, generator=g).to(torch.bfloat16)
    out = torch.zeros(m, n)
    da = TensorDescriptor(a, list(a.shape), list(a.stride()), [m, k])
    db = TensorDescriptor(b, list(b.shape), list(b.stride()), [k, n])
    report = sim.launch(mma_kernel, (1,), da, db, out, n_steps, M=m, K=k, N=n, BUG=MMA_BUGS[bug], **launch_kw)
    expected = sum(a[i * m:(i + 1) * m].float() @ b[i * k:(i + 1) * k].float() for i in range(n_steps))
    return (out - expected).abs().max().item(), report


# ---------------------------------------------------------------------------------------------------------
# Pingpong: two consumer replicas take turns through named barriers 9 and 10 (the forward's handshake).
# ---------------------------------------------------------------------------------------------------------
PINGPONG_BUGS = {"none": 0, "dropped_first_turn": 1, "thread_count_mismatch": 2}


@triton.jit
def pingpong_kernel(OUT, N_TURNS, BUG: tl.constexpr):
    with tlx.async_tasks():
        with tlx.async_task("default"):
            pass
        with tlx.async_task(num_warps=4, replicate=2):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if cid == 1:
                if BUG != 1:
                    tlx.named_barrier_arrive(9, 256)  # <pp-first-turn>
            for i in range(0, N_TURNS):
                if cid == 0:
                    tlx.named_barrier_wait(9, 256)  # <pp-wait-0>
                    tl.atomic_add(OUT, 1)
                    if BUG == 2:
                        tlx.named_barrier_arrive(10, 384)  # <pp-bad-count>
                    else:
                        tlx.named_barrier_arrive(10, 256)
                else:
                    tlx.named_barrier_wait(10, 256)  # <pp-wait-1>
                    tl.atomic_add(OUT + 1, 1)
                    tlx.named_barrier_arrive(9, 256)


def run_pingpong(bug="none", turns=3, **launch_kw):
    out = torch.zeros(2, dtype=torch.int32)
    report = sim.launch(pingpong_kernel, (1,), out, turns, BUG=PINGPONG_BUGS[bug], **launch_kw)
    return out, report


# ---------------------------------------------------------------------------------------------------------
# TMA store reduce-add: tiles staged in shared memory, reduce-added into OUT one after another.
# ---------------------------------------------------------------------------------------------------------
@triton.jit
def reduce_add_kernel(X, desc_out, N_TILES, BLOCK: tl.constexpr, D: tl.constexpr, FENCE: tl.constexpr):
    stage = tlx.local_alloc((BLOCK, D), tlx.dtype_of(desc_out), 1)
    offs = tl.arange(0, BLOCK)[:, None] * D + tl.arange(0, D)[None, :]
    for i in range(0, N_TILES):
        tile = tl.load(X + i * BLOCK * D + offs)
        tlx.local_store(stage[0], tile)  # <reduce-stage>
        if FENCE:
            tlx.fence_async_shared()
        tlx.async_descriptor_store(desc_out, stage[0], [0, 0], store_reduce="add")  # <reduce-store>
        tlx.async_descriptor_store_wait(0)


def run_reduce_add(dtype=torch.float32, n_tiles=4, block=16, d=32, fence=True, **launch_kw):
    """(simulated out, expected out): expected adds the tiles one at a time, rounding to ``dtype`` each time."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(n_tiles, block, d, generator=g) * 3).to(dtype)
    out = (torch.randn(block, d, generator=g) * 100).to(dtype)
    expected = out.clone()
    for i in range(n_tiles):
        expected = (expected.float() + x[i].float()).to(dtype)  # fp32 sum of two values, rounded to nearest even
    desc = TensorDescriptor(out, list(out.shape), list(out.stride()), [block, d])
    report = sim.launch(reduce_add_kernel, (1,), x, desc, n_tiles, BLOCK=block, D=d, FENCE=fence, **launch_kw)
    return out, expected, report


# ---------------------------------------------------------------------------------------------------------
# A TMA store, its wait, then generic loads of its destination by the same task.
# ---------------------------------------------------------------------------------------------------------
@triton.jit
def store_then_load_kernel(X, desc_out, OUT, SEEN, BLOCK: tl.constexpr, D: tl.constexpr, FULL_WAIT: tl.constexpr):
    stage = tlx.local_alloc((BLOCK, D), tlx.dtype_of(desc_out), 1)
    offs = tl.arange(0, BLOCK)[:, None] * D + tl.arange(0, D)[None, :]
    tlx.local_store(stage[0], tl.load(X + offs))
    tlx.fence_async_shared()
    tlx.async_descriptor_store(desc_out, stage[0], [0, 0])
    if FULL_WAIT:
        tlx.async_descriptor_store_wait(0, read_only=False)
    else:
        tlx.async_descriptor_store_wait(0)
    tl.store(SEEN + offs, tl.load(OUT + offs))
    tlx.local_store(stage[0], tl.zeros((BLOCK, D), dtype=tlx.dtype_of(desc_out)))  # the source, reused


def run_store_then_load(full_wait: bool, block=16, d=32, **launch_kw):
    """(x, out before the launch, out after it, what the loads after the wait saw)."""
    g = torch.Generator().manual_seed(3)
    x, out = torch.randn(block, d, generator=g), torch.randn(block, d, generator=g)
    before, seen = out.clone(), torch.full_like(out, float("nan"))
    desc = TensorDescriptor(out, list(out.shape), list(out.stride()), [block, d])
    sim.launch(store_then_load_kernel, (1,), x, desc, out, seen, BLOCK=block, D=d, FULL_WAIT=full_wait, **launch_kw)
    return x, before, out, seen


# ---------------------------------------------------------------------------------------------------------
# Small kernels with one bug each
# ---------------------------------------------------------------------------------------------------------
@triton.jit
def uninitialised_read_kernel(OUT, D: tl.constexpr):
    buf = tlx.local_alloc((16, D), tl.float32, 2)
    offs = tl.arange(0, 16)[:, None] * D + tl.arange(0, D)[None, :]
    tlx.local_store(buf[0], tl.zeros((16, D), dtype=tl.float32))
    x = tlx.local_load(buf[1])  # <uninit-read>
    tl.store(OUT + offs, x)


@triton.jit
def spin_kernel(OUT, N):
    i = 0
    while i < N:  # <spin-loop>
        i = i * 1  # <spin-body>
    tl.store(OUT, i)


@triton.jit
def masked_gather_kernel(X, OUT, row, n_rows, D: tl.constexpr):
    """Loads row ``row`` of X [n_rows, D] under the mask ``(d < D) & (row < n_rows)``: built from two
    comparisons, which the interpreter may hand over as integers 0/1."""
    offs = tl.arange(0, D)
    x = tl.load(X + row * D + offs, mask=(offs < D) & (row < n_rows), other=0.0)
    tl.store(OUT + offs, x)


@triton.jit
def pair_cast_kernel(X, OUT, N: tl.constexpr, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """OUT = X (fp32) cast to DTYPE by ``to_16bit_pairs`` (ASM ""), or by the inline asm ASM itself."""
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    if ASM == "":
        y = to_16bit_pairs(x, DTYPE)
    else:
        y = tl.inline_asm_elementwise(ASM, "=r,r,r", [x], dtype=DTYPE, is_pure=True, pack=2)  # <raw-asm>
    tl.store(OUT + offs, y)


# ---------------------------------------------------------------------------------------------------------
# tcgen05 (Blackwell): the producer loads A [M, K] and B [K, N] tiles by TMA, the MMA task accumulates A_i B_i
# into a TMEM accumulator (each MMA releasing its tiles by arriving on their empty barrier, the last one
# also on `done`, or a tcgen05_commit on `done`), the epilogue waits on `done` and reads TMEM.
# ---------------------------------------------------------------------------------------------------------
TCGEN05_BUGS = {
    "none": 0,
    "commit": 1,  # not a bug: the MMAs arrive on nothing, a tcgen05_commit arrives on `done`
    "read_before_done": 2,  # the epilogue reads the accumulator without waiting on `done`
    "no_commit": 3,  # `done` is never arrived on: the epilogue waits for ever
    "release_at_issue": 4,  # the MMA task hands the tiles back at issue, not when the MMA completes
}


@triton.jit
def tcgen05_kernel(desc_a, desc_b, OUT, N_STEPS, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                   TMEM_BUFFERS: tl.constexpr, BUG: tl.constexpr):
    a_tiles = tlx.local_alloc((M, K), tl.bfloat16, 2)
    b_tiles = tlx.local_alloc((K, N), tl.bfloat16, 2)
    acc = tlx.local_alloc((M, N), tl.float32, TMEM_BUFFERS, tlx.storage_kind.tmem)  # <tc-tmem-alloc>
    fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    empties = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    done = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA
            for i in range(0, N_STEPS):
                b = i % 2
                tlx.barrier_wait(empties[b], ((i // 2) & 1) ^ 1)
                tlx.barrier_expect_bytes(fulls[b], (M * K + K * N) * 2)
                tlx.async_descriptor_load(desc_a, a_tiles[b], [i * M, 0], fulls[b])  # <tc-load-a>
                tlx.async_descriptor_load(desc_b, b_tiles[b], [i * K, 0], fulls[b])
        with tlx.async_task(num_warps=1):  # the MMA issuer
            for i in range(0, N_STEPS):
                b = i % 2
                tlx.barrier_wait(fulls[b], (i // 2) & 1)
                if BUG == 1 or BUG == 3:
                    tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0)
                    tlx.tcgen05_commit(empties[b])
                elif BUG == 4:
                    tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0)
                    tlx.barrier_arrive(empties[b], 1)  # <tc-release-at-issue>
                elif i == N_STEPS - 1:
                    tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0, mBarriers=[empties[b], done[0]])
                else:
                    tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0, mBarriers=[empties[b]])  # <tc-mma>
            if BUG == 1:
                tlx.tcgen05_commit(done[0])
            if BUG == 4:
                tlx.tcgen05_commit(done[0])
        with tlx.async_task(num_warps=4):  # epilogue
            if BUG != 2:
                tlx.barrier_wait(done[0], 0)  # <tc-wait-done>
            result = tlx.local_load(acc[0])  # <tc-read-acc>
            offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
            tl.store(OUT + offs, result)


def run_tcgen05(bug="none", n_steps=4, m=128, k=32, n=64, tmem_buffers=1, **launch_kw):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(n_steps * m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n_steps * k, n, generator=g).to(torch.bfloat16)
    out = torch.zeros(m, n)
    da = TensorDescriptor(a, list(a.shape), list(a.stride()), [m, k])
    db = TensorDescriptor(b, list(b.shape), list(b.stride()), [k, n])
    report = sim.launch(tcgen05_kernel, (1,), da, db, out, n_steps, M=m, K=k, N=n, TMEM_BUFFERS=tmem_buffers,
                        BUG=TCGEN05_BUGS[bug], arch=(10, 0), **launch_kw)
    expected = sum(a[i * m:(i + 1) * m].float() @ b[i * k:(i + 1) * k].float() for i in range(n_steps))
    return (out - expected).abs().max().item(), report


# ---------------------------------------------------------------------------------------------------------
# tlx.subslice: an MMA into a TMEM accumulator, then its column slices scaled in place (local_load/local_store
# of each slice, as a correction partition rescales O) and read back; OFFSET past the columns is the bug.
# ---------------------------------------------------------------------------------------------------------
@triton.jit
def tmem_subslice_kernel(A, B, OUT, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, SLICES: tl.constexpr,
                         OFFSET: tl.constexpr):
    a = tlx.local_alloc((M, K), tl.bfloat16, 1)
    b = tlx.local_alloc((K, N), tl.bfloat16, 1)
    acc = tlx.local_alloc((M, N), tl.float32, 1, tlx.storage_kind.tmem)
    done = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    tlx.local_store(a[0], tl.load(A + tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :]))
    tlx.local_store(b[0], tl.load(B + tl.arange(0, K)[:, None] * N + tl.arange(0, N)[None, :]))
    tlx.fence_async_shared()
    tlx.async_dot(a[0], b[0], acc[0], use_acc=False, mBarriers=[done[0]])
    tlx.barrier_wait(done[0], 0)
    W: tl.constexpr = N // SLICES
    for s in tl.static_range(SLICES):
        part = tlx.subslice(acc[0], OFFSET + s * W, W)  # <tmem-subslice>
        tlx.local_store(part, tlx.local_load(part) * (s + 1.0))
    for s in tl.static_range(SLICES):
        cols = s * W + tl.arange(0, W)
        tl.store(OUT + tl.arange(0, M)[:, None] * N + cols[None, :], tlx.local_load(tlx.subslice(acc[0], s * W, W)))


def run_tmem_subslice(m=128, k=32, n=64, slices=2, offset=0):
    """(kernel result, expected): column slice s of A @ B scaled by s + 1."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16)
    out = torch.zeros(m, n)
    sim.launch(tmem_subslice_kernel, (1,), a, b, out, M=m, K=k, N=n, SLICES=slices, OFFSET=offset, arch=(10, 0))
    expected = a.float() @ b.float()
    for s in range(slices):
        expected[:, s * n // slices:(s + 1) * n // slices] *= s + 1
    return out, expected


# ---------------------------------------------------------------------------------------------------------
# tcgen05 block-scaled (MXFP8 on Blackwell): E4M3 A [M, K] and B^T [N, K] stored to shared memory, E8M0 scales
# per 32 along K (A's in TMEM, B's in shared memory), one scaled MMA into TMEM, the epilogue reads it.
# ---------------------------------------------------------------------------------------------------------
@triton.jit
def tcgen05_scaled_kernel(A8, B8, SA, SB, OUT, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                          SCALE_COLS: tl.constexpr, COPY: tl.constexpr):
    """COPY: 0 stores A's scales into TMEM from registers; 1 copies them from shared memory (tmem_copy) and
    waits for the copy's commit; 2 overwrites the copy's source before that (a race)."""
    a = tlx.local_alloc((M, K), tl.float8e4nv, 1)
    bt = tlx.local_alloc((N, K), tl.float8e4nv, 1)
    sa = tlx.local_alloc((M, SCALE_COLS), tl.uint8, 1, tlx.storage_kind.tmem)
    sa_smem = tlx.local_alloc((M, SCALE_COLS), tl.uint8, 1)
    sb = tlx.local_alloc((N, SCALE_COLS), tl.uint8, 1)
    acc = tlx.local_alloc((M, N), tl.float32, 1, tlx.storage_kind.tmem)
    done = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    rk = tl.arange(0, K)[None, :]
    tlx.local_store(a[0], tl.load(A8 + tl.arange(0, M)[:, None] * K + rk).to(tl.float8e4nv, bitcast=True))
    tlx.local_store(bt[0], tl.load(B8 + tl.arange(0, N)[:, None] * K + rk).to(tl.float8e4nv, bitcast=True))
    rs = tl.arange(0, SCALE_COLS)[None, :]
    scales_a = tl.load(SA + tl.arange(0, M)[:, None] * SCALE_COLS + rs)
    if COPY == 0:
        tlx.local_store(sa[0], scales_a)
    else:
        tlx.local_store(sa_smem[0], scales_a)
    tlx.local_store(sb[0], tl.load(SB + tl.arange(0, N)[:, None] * SCALE_COLS + rs))
    tlx.fence_async_shared()
    if COPY > 0:
        tlx.tmem_copy(sa_smem[0], sa[0])
        if COPY == 2:
            tlx.local_store(sa_smem[0], scales_a)  # <tcs-overwrite-copy-source>
        tlx.tcgen05_commit(done[1])
        tlx.barrier_wait(done[1], 0)
    tlx.async_dot_scaled(a[0], tlx.local_trans(bt[0]), acc[0], sa[0], "e4m3", sb[0], "e4m3",  # <tcs-mma>
                         use_acc=False, mBarriers=[done[0]])
    tlx.barrier_wait(done[0], 0)
    result = tlx.local_load(acc[0])
    tl.store(OUT + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], result)


def run_tcgen05_scaled(m=128, n=64, k=64, scale_cols=None, seed=3, copy=0, **launch_kw):
    """(kernel result, the exact block-scaled product in float64) of one scaled MMA."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    a[(a & 0x7F) == 0x7F] = 0  # no NaN elements
    b[(b & 0x7F) == 0x7F] = 0
    sa = torch.randint(117, 137, (m, k // 32), generator=g, dtype=torch.uint8)
    sb = torch.randint(117, 137, (n, k // 32), generator=g, dtype=torch.uint8)
    out = torch.zeros(m, n)
    sim.launch(tcgen05_scaled_kernel, (1,), a, b, sa, sb, out, M=m, N=n, K=k, SCALE_COLS=scale_cols or k // 32,
               COPY=copy, arch=(10, 0), **launch_kw)
    dec = lambda codes, s: (codes.view(torch.float8_e4m3fn).double()  # noqa: E731
                            * torch.pow(2.0, s.double() - 127).repeat_interleave(32, dim=1))
    return out.double(), dec(a, sa) @ dec(b, sb).T


# ---------------------------------------------------------------------------------------------------------
# Cluster launch control: each CTA works its own tile, then asks CLC for another CTA's, until none is left.
# ---------------------------------------------------------------------------------------------------------
CLC_BUGS = {"none": 0, "wrong_phase": 1, "stop_after_first": 2, "consumer_wrong_phase": 3, "ask_after_failure": 4,
            "drop_last_answer": 5}


@triton.jit
def clc_kernel(OUT, WHO, BUG: tl.constexpr):
    ctx = tlx.clc_create_context(1, 1)
    pid = tl.program_id(0)
    tile = pid
    i = 0
    while tile != -1:
        tl.store(OUT + tile, tl.load(OUT + tile) + 1)  # every tile worked exactly once: OUT all 1
        tl.store(WHO + tile, pid)
        if BUG == 1:
            tlx.clc_producer(ctx, i & 1)  # <clc-producer-wrong-phase>
        else:
            tlx.clc_producer(ctx, (i & 1) ^ 1)  # <clc-producer>
        if BUG == 3:
            tile = tlx.clc_consumer(ctx, (i & 1) ^ 1)  # <clc-consumer-wrong-phase>
        elif BUG == 5:
            if i == 0:
                tile = tlx.clc_consumer(ctx, i & 1)
            else:
                tile = -1
        else:
            tile = tlx.clc_consumer(ctx, i & 1)
        if BUG == 2:
            tile = -1
        i += 1
    if BUG == 4:
        tlx.clc_producer(ctx, (i & 1) ^ 1)  # <clc-ask-after-failure>


def run_clc(bug="none", grid=7, **launch_kw):
    """(OUT: times each tile was worked, WHO: the CTA that worked it, the LaunchReport) of ``clc_kernel``."""
    out = torch.zeros(grid, dtype=torch.int32)
    who = torch.full((grid,), -1, dtype=torch.int32)
    report = sim.launch(clc_kernel, (grid,), out, who, BUG=CLC_BUGS[bug], arch=(10, 0), **launch_kw)
    return out, who, report
