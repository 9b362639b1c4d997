"""Toy cluster kernels for the simulator's cluster model (jfa.sim.cluster), each with injected bugs.

``pair_gemm_kernel``: a CTA pair computes C = A @ B with 2-CTA tcgen05 MMAs (cta_group::2), as TLX writes it:
CTA r loads its M rows of A and its half of B's N columns into its own shared memory (landing on its own
barrier), tells the pair's leader through a remote arrive that they are there, and the leader (even CTA) issues
the MMA for both once both CTAs have arrived; the MMA's barrier arrival is multicast to both CTAs, and each CTA
reads its own M rows x N of the result from its own TMEM. ``multicast_kernel``: each CTA of a pair loads one
row block and multicasts it into both CTAs' buffers.
"""
import os

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.tools.tensor_descriptor import TensorDescriptor

import jfa.sim as sim
import sim_kernels

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    """The line of this file that carries ``# <marker>``."""
    return sim_kernels.line_of(marker, HERE)


PAIR_BUGS = {
    "none": 0,
    "no_pair_wait": 1,  # the leader issues without waiting for its partner's operands
    "commit_own_cta": 2,  # the last MMA committed with a 1-CTA commit: the partner's barrier hears nothing of it
    "peer_skips_mma": 3,  # the odd CTA's MMA task skips the last 2-CTA call its leader issues
    "peer_exits_early": 4,  # the odd CTA does not wait for the result: it exits while the MMA reads its memory
    "peer_misses_cluster_barrier": 5,  # the odd CTA blocks on a phase that never comes, short of the cluster barrier
}


@triton.jit
def pair_gemm_kernel(desc_a, desc_b, OUT, N_STEPS, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                     BUG: tl.constexpr, TWO_CTA_LOADS: tl.constexpr = False):
    """TWO_CTA_LOADS: both CTAs' TMA loads use the 2-CTA form (two_ctas=True), which completes on the leader's
    barrier; the leader expects both CTAs' bytes and needs no remote arrive."""
    rank = tlx.cluster_cta_rank()
    leader = rank % 2 == 0
    HALF: tl.constexpr = N // 2
    a_tiles = tlx.local_alloc((M, K), tl.bfloat16, 2)
    b_tiles = tlx.local_alloc((K, HALF), tl.bfloat16, 2)
    acc = tlx.local_alloc((M, N), tl.float32, 1, tlx.storage_kind.tmem)
    fulls = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    pair_ready = tlx.alloc_barriers(num_barriers=2, arrive_count=2)  # the leader's: both CTAs' operands landed
    empties = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    done = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    tlx.cluster_barrier()  # every CTA's barriers initialised before anyone arrives on a partner's
    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA
            for i in range(0, N_STEPS):
                b = i % 2
                tlx.barrier_wait(empties[b], ((i // 2) & 1) ^ 1)
                if TWO_CTA_LOADS:
                    tlx.barrier_expect_bytes(fulls[b], 2 * (M * K + K * HALF) * 2, pred=leader)
                    tlx.async_descriptor_load(desc_a, a_tiles[b], [rank * M, i * K], fulls[b], two_ctas=True)
                    tlx.async_descriptor_load(desc_b, b_tiles[b], [i * K, rank * HALF], fulls[b], two_ctas=True)
                else:
                    tlx.barrier_expect_bytes(fulls[b], (M * K + K * HALF) * 2)
                    tlx.async_descriptor_load(desc_a, a_tiles[b], [rank * M, i * K], fulls[b])  # <pg-load-a>
                    tlx.async_descriptor_load(desc_b, b_tiles[b], [i * K, rank * HALF], fulls[b])  # <pg-load-b>
        with tlx.async_task(num_warps=1):  # the MMA: issued by the leader for both
            for i in range(0, N_STEPS):
                b = i % 2
                if TWO_CTA_LOADS:  # both CTAs' boxes complete on the leader's barrier
                    tlx.barrier_wait(fulls[b], (i // 2) & 1, pred=leader)
                else:
                    tlx.barrier_wait(fulls[b], (i // 2) & 1)
                    tlx.barrier_arrive(pair_ready[b], 1, remote_cta_rank=rank & ~1)
                    if BUG != 1:
                        tlx.barrier_wait(pair_ready[b], (i // 2) & 1, pred=leader)
                if i == N_STEPS - 1:
                    if BUG == 2:
                        tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0, mBarriers=[empties[b]],
                                      two_ctas=True)  # <pg-last-mma>
                        tlx.tcgen05_commit(done[0])
                    elif BUG == 3:
                        tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0, mBarriers=[empties[b], done[0]],
                                      two_ctas=True, pred=leader)
                    else:
                        tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0, mBarriers=[empties[b], done[0]],
                                      two_ctas=True)  # <pg-last-mma>
                else:
                    tlx.async_dot(a_tiles[b], b_tiles[b], acc[0], use_acc=i > 0, mBarriers=[empties[b]],  # <pg-mma>
                                  two_ctas=True)
    if BUG == 4 and not leader:
        pass
    else:
        tlx.barrier_wait(done[0], 0)
        c = tlx.local_load(acc[0])  # <pg-read-acc>
        rows = rank * M + tl.arange(0, M)
        tl.store(OUT + rows[:, None] * N + tl.arange(0, N)[None, :], c)
    if BUG == 5 and not leader:
        tlx.barrier_wait(done[0], 1)  # <pg-peer-stuck>
    tlx.cluster_barrier()  # <pg-final-cluster-barrier>


def run_pair_gemm(bug="none", n_steps=3, m=128, k=32, n=64, ctas_per_cga=(2, 1, 1), grid=2, two_cta_loads=False,
                  **launch_kw):
    """(max |C - A @ B|, report) for a 2-CTA GEMM of A [grid * m, n_steps * k] and B [n_steps * k, n]."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(grid * m, n_steps * k, generator=g).to(torch.bfloat16)
    b = torch.randn(n_steps * k, n, generator=g).to(torch.bfloat16)
    out = torch.full((grid * m, n), float("nan"))
    da = TensorDescriptor(a, list(a.shape), list(a.stride()), [m, k])
    db = TensorDescriptor(b, list(b.shape), list(b.stride()), [k, n // 2])
    kw = dict(launch_kw)
    if ctas_per_cga is not None:
        kw["ctas_per_cga"] = ctas_per_cga
    report = sim.launch(pair_gemm_kernel, (grid,), da, db, out, n_steps, M=m, K=k, N=n, BUG=PAIR_BUGS[bug],
                        TWO_CTA_LOADS=two_cta_loads, arch=(10, 0), **kw)
    return (out - a.float() @ b.float()).abs().max().item(), report


MULTICAST_BUGS = {
    "none": 0,
    "expect_one_box": 1,  # each CTA expects only its own box's bytes, but two boxes land on its barrier
    "no_init_barrier": 2,  # no cluster_barrier after the barriers' init: a partner may reach one not yet there
}


@triton.jit
def multicast_kernel(desc_x, OUT, BM: tl.constexpr, D: tl.constexpr, BUG: tl.constexpr):
    """CTA r loads row block r of X and multicasts it into slot r of both CTAs' buffers; each CTA then writes
    slot 0 + slot 1 (the same sum in both) to its own output rows."""
    rank = tlx.cluster_cta_rank()
    bufs = tlx.local_alloc((BM, D), tl.float32, 2)
    bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    if BUG != 2:
        tlx.cluster_barrier()
    if BUG == 1:
        tlx.barrier_expect_bytes(bar[0], BM * D * 4)
    else:
        tlx.barrier_expect_bytes(bar[0], 2 * BM * D * 4)
    tlx.async_descriptor_load(desc_x, bufs[rank], [rank * BM, 0], bar[0], multicast_targets=[0, 1])  # <mc-load>
    tlx.barrier_wait(bar[0], 0)
    s = tlx.local_load(bufs[0]) + tlx.local_load(bufs[1])
    rows = rank * BM + tl.arange(0, BM)
    tl.store(OUT + rows[:, None] * D + tl.arange(0, D)[None, :], s)
    tlx.cluster_barrier()  # neither CTA leaves while its partner's multicast may still land in it


def run_multicast(bug="none", bm=16, d=32, **launch_kw):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2 * bm, d, generator=g)
    out = torch.full((2 * bm, d), float("nan"))
    dx = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, d])
    report = sim.launch(multicast_kernel, (2,), dx, out, BM=bm, D=d, BUG=MULTICAST_BUGS[bug], arch=(10, 0),
                        ctas_per_cga=(2, 1, 1), **launch_kw)
    want = (x[:bm] + x[bm:]).repeat(2, 1)
    return (out - want).abs().max().item(), report


@triton.jit
def remote_wait_kernel(OUT, EARLY_ARRIVE: tl.constexpr):
    """EARLY_ARRIVE: CTA 1 arrives on CTA 0's barrier before any cluster barrier, i.e. possibly before CTA 0 has
    initialised it; otherwise CTA 1 waits on CTA 0's barrier (a remote view), which TLX does not allow."""
    rank = tlx.cluster_cta_rank()
    if EARLY_ARRIVE:
        if rank == 0:
            tlx.fence_async_shared()  # a TLX op: where a seeded schedule may switch to CTA 1 before the allocation
        bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
        if rank == 1:
            tlx.barrier_arrive(bar[0], 1, remote_cta_rank=0)  # <rw-early-arrive>
        tlx.cluster_barrier()
    else:
        bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
        tlx.cluster_barrier()
        tlx.barrier_wait(tlx.remote_view(bar[0], rank ^ 1), 0)  # <rw-remote-wait>


@triton.jit
def rank_kernel(OUT, PEER_STORE: tl.constexpr):
    """Each CTA writes (its program id, its cluster rank, the cluster size); with PEER_STORE each CTA stores its
    rank into its partner's buffer (remote_shmem_store), both cluster-barrier, and each reads what it got."""
    pid = tl.program_id(0)
    rank = tlx.cluster_cta_rank()
    tl.store(OUT + pid * 4 + 0, pid)
    tl.store(OUT + pid * 4 + 1, rank)
    tl.store(OUT + pid * 4 + 2, tlx.cluster_size_1d())
    if PEER_STORE:
        box = tlx.local_alloc((16,), tl.int32, 1)
        tlx.cluster_barrier()
        tlx.remote_shmem_store(box[0], tl.full((16,), 0, tl.int32) + rank, rank ^ 1)  # <rk-remote-store>
        if PEER_STORE == 1:
            tlx.cluster_barrier()
        got = tlx.local_load(box[0])  # <rk-read>
        tl.store(OUT + pid * 4 + 3, tl.max(got, 0))
        tlx.cluster_barrier()


def run_ranks(grid=4, cluster=2, peer_store=0, **launch_kw):
    out = torch.full((grid * 4,), -7, dtype=torch.int32)
    report = sim.launch(rank_kernel, (grid,), out, PEER_STORE=peer_store, arch=(10, 0),
                        ctas_per_cga=(cluster, 1, 1), **launch_kw)
    return out.view(grid, 4), report


def run_remote_wait(early_arrive, **launch_kw):
    out = torch.zeros(4, dtype=torch.int32)
    return sim.launch(remote_wait_kernel, (2,), out, EARLY_ARRIVE=early_arrive, arch=(10, 0), ctas_per_cga=(2, 1, 1),
                      **launch_kw)
