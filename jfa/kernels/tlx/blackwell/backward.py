"""Jagged FlashAttention backward for Blackwell (sm_100a) in TLX: the dK/dV kernel on tcgen05 with its
accumulators in tensor memory, dQ fused into it.

``jagged_backward_blackwell`` has the portable backward's contract (``jfa.kernels.triton.backward.
jagged_backward``) and the Hopper TLX backward's shape (``jfa.kernels.tlx.hopper.backward``): the row
statistics' pre-pass (``row_stats``: lse in base 2 and delta = rowsum(dO * O) - dlse, transposed so that a
query tile's statistics are one TMA box), then this kernel for dK and dV, dQ either reduce-added by the same
kernel into an fp32 accumulator or, with ``deterministic=True``, computed by the portable dQ pass (each row
written once in a fixed order: bitwise reproducible).

Shape of the kernel (the forward's roles turned around: keys are the rows, one TMEM lane per key):

* Persistent grid, static zig-zag schedule (``common.device.static_item``) over work items (key tile of
  ``block_n`` rows, head); the tile list is built on the key offsets and sorted by each sequence's query
  length, the work a key tile streams over. Query steps of ``block_m`` rows run in the Hopper kernel's
  order (``hopper.dkdv_steps.dkdv_item``, ``step_order``): the masked ones (causal diagonal, the partial last
  query tile) first, the fully visible bulk after them.
* Five partitions per CTA, one mbarrier protocol between each pair:

  - load (1 warp): per item K and V once, then per step Q, dO and the step's lse2 and delta through a ring
    of ``num_buffers_qdo`` slots (``hopper.dkdv_steps.load_qdo_step``);
  - MMA (1 warp, the only tcgen05 issuer): per step ``S^T = K Q^T`` and ``dP^T = V dO^T`` into tensor memory,
    ``dV += P^T dO`` once the compute has stored P^T, and a step late (so that the tensor core runs S^T of
    step s while the compute works on step s - 1) ``dK += dS^T Q`` and ``dQ = dS K``; every MMA completes on
    mbarriers, ``tcgen05_commit`` hands K/V back and dK/dV to the epilogue after the item's last MMA;
  - compute (1 warpgroup, one key row a thread): S^T and dP^T from tensor memory, ``P^T = exp2(S^T * scale *
    log2 e - lse2)`` and ``dS^T = P^T (dP^T - delta)`` to shared memory (fenced for the async proxy); after
    the item's last MMA it stores dK (scaled) and dV from tensor memory with a row mask;
  - dQ (the default partition, 1 warpgroup): each step's dQ from tensor memory, times the scale, in parts of
    ``dq_columns`` through ``dq_stages`` fp32 shared-memory stages, each part a TMA reduce-add into the
    accumulator (shaped like q: a broadcast Q sums over the batch there); a stage is refilled once its
    reduce-add has read it.

* Jagged tails without padding: the TMA boxes may read the next sequence's rows (Q, dO and statistics, K and
  V) or TMA's zero fill. A masked step zeroes P^T (and so dS^T) for query rows past the sequence and, since
  dQ sums over the tile's keys, for key rows past it; a key tile whose rows reach past its sequence runs
  every step masked. Key rows past the sequence are never stored; a dQ box reaching past the sequence
  adds exact zeros to the next one's rows (or is clipped at the tensor's end).

Supported: bf16 and fp16, head dims 64 and 128, grouped key/value heads (dK and dV as fp32 partials per
query head, summed by the launcher), no sliding window (``supports``: the forward has none either).

MXFP8 (``MX`` builds, :func:`mx_backward_blackwell`; docs/mxfp8.md section 2, the semantics of the portable
``mx_dkdv_kernel`` and the Hopper MX build): the same partitions and step order, 1-CTA, without the fused dQ. All
four products are block-scaled tcgen05 MMAs (``kind::mxf8f6f4.block_scale``) of E4M3 operands the load warp brings
by TMA: S^T = K Q^T and dP^T = V dO^T with K, Q, V, dO quantized along D, dV += P^T dO and dK += dS^T Q with Q and
dO quantized along the sequence's 32-row query blocks (a second E4M3 copy of each in the ring slot). The default
partition, idle without the fused dQ, loads every tile's E8M0 scales (masked to the sequence) into shared memory
beside it (``_scales_item``); the MMA waits for them as for the bytes. The compute quantizes P^T and dS^T along their
columns (the step's queries; steps of 128 rows from the sequence's first row hold whole blocks) into E4M3 elements
and scales (``_compute_step_mx``). dQ = dS^(keys) K^(keys) runs on the portable MX dQ pass
(``mx_attention.mx_backward`` with this build as its ``dkdv``), as on Hopper: the backward stays bitwise
reproducible. A query tail's TMA box holds the next sequence's Q and dO rows; P^T and dS^T are 0 in their columns,
so only a NaN there (E4M3 NaN bytes: a NaN block of that sequence) would reach this sequence's dK, dV (the forward's
caveat). D 128 compiles for sm_100a; D 64 runs on the simulator only (``mx_backward_supports``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.bands import window_band
from jfa.kernels.schedule import build_tile_list, output_offsets
from jfa.kernels.tlx import pipeline
from jfa.kernels.tlx.common import scaled_mma, target
from jfa.kernels.tlx.common.device import bufidx_phase, mx_scale_rows, static_item
from jfa.kernels.tlx.common.host import check_inputs, descriptor, offline_signature, sm_count, tlx
from jfa.kernels.tlx.blackwell.forward import MX_RULES, _SCALE_LAYOUT, _dim_scales, _tma_ready, _token_scales
from jfa.kernels.tlx.hopper.dkdv_steps import (aligned_column, dkdv_item, load_qdo_step, send_staged_dq, stage_dq,
                                                step_order)
from jfa.kernels.tlx.hopper.row_stats import row_stats, stats_descriptor
from jfa.kernels.triton.mx_attention import mx_elements


# ----------------------------------------------------------------------------------------------------
# Configs, as data. One row per head dim; the same row serves bf16 and fp16.
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlackwellDkDvConfig:
    block_n: int  # key rows per work item: the tcgen05 M of S^T, dP^T, dK and dV (one TMEM lane per key)
    block_m: int  # query rows per step: the N of S^T and dP^T, the K of dK and dV, the M of dQ
    num_buffers_qdo: int  # (Q, dO, lse2, delta) slots of the load ring
    num_buffers_kv: int  # (K, V) slots: 2 lets the load warp fetch the next item's while this one runs
    num_buffers_dkdv: int  # dK, dV accumulators in tensor memory: 2 lets the next item's MMAs overlap the epilogue
    dq_columns: int  # head-dim columns of one dQ reduce-add (a step sends head_dim / dq_columns of them)
    dq_stages: int  # fp32 shared-memory stages of dq_columns each (> 1: a stage's stores overlap the last send)
    compute_regs: int  # setmaxnreg of the compute warpgroup (S^T and dP^T: block_m fp32 a thread each)
    epilogue_slices: int  # column slices the dK/dV epilogue moves out of tensor memory
    # a cluster of two CTAs per work item (``cta_pair``): CTA r of the pair works key tile r of a pair of adjacent
    # key tiles over the same query steps, and dK += dS^T Q, dV += P^T dO are 2-CTA MMAs (tcgen05 cta_group::2:
    # the even CTA issues them for both; B is split along N = the head dim, each CTA's half at the same
    # shared-memory offset, so the odd CTA keeps Q, dO, K and V with the two halves of the head dim swapped:
    # S^T and dP^T contract over the head dim, which a consistent permutation leaves unchanged)
    cta_pair: bool = False
    # the build's LLVM IR left to ptxas (pipeline.build_llvm_o0), as the forward's: LLVM hoists the CTA's and
    # the lanes' indices ahead of every partition's setmaxnreg
    llvm_o0: bool = True


COMPUTE_WARPS = 4  # one warpgroup: 128 threads, one key row each (tcgen05.ld lane = row)
DQ_WARPS = 4  # the default partition
_COMPUTE_WARPS = tl.constexpr(COMPUTE_WARPS)
_SINGLE_WARP = tl.constexpr(1)
ISSUER_REGS = tl.constexpr(48)  # setmaxnreg of the load and MMA warps (a few scalars)

_CONFIGS: dict[int, BlackwellDkDvConfig] = {
    # D 64. Tensor memory: S^T, dP^T 2 x 64 columns + 2 x (dK, dV) 2 x 64 + dQ 64 = 448 of 512. Shared memory:
    # 2 x (K, V) 2 x 16 KB + 2 slots x (Q, dO) 2 x 8 KB + P^T, dS^T 2 x 16 KB + dQ stages 2 x 16 KB = 160 KB
    # (167168 B as compiled). The compute warpgroup: S^T (then P^T), dP^T, lse2 and delta broadcast over
    # its rows take 64 fp32 a thread each; at 192 registers it spilled 224 bytes, at 240 none.
    64: BlackwellDkDvConfig(block_n=128, block_m=64, num_buffers_qdo=2, num_buffers_kv=2, num_buffers_dkdv=2,
                            dq_columns=64, dq_stages=2, compute_regs=240, epilogue_slices=2),
    # D 128. Tensor memory: S^T, dP^T 2 x 64 + dK, dV 2 x 128 + dQ 128 = 512 columns, all of them. Shared
    # memory: K, V 2 x 32 KB + 2 slots x (Q, dO) 2 x 16 KB + P^T, dS^T 2 x 16 KB + dQ 2 half-width stages of
    # 16 KB = 192 KB (two full-width stages took it to 232704 B as compiled, past the SM's 232448): a step's dQ
    # goes out in two halves, one staged while the other is sent.
    128: BlackwellDkDvConfig(block_n=128, block_m=64, num_buffers_qdo=2, num_buffers_kv=1, num_buffers_dkdv=1,
                             dq_columns=64, dq_stages=2, compute_regs=240, epilogue_slices=4),
}
SUPPORTED_HEAD_DIMS = tuple(sorted(_CONFIGS))
CAPABILITY = (10, 0)
# the 2-CTA build: per CTA the same tiles, buffers and registers as the 1-CTA rows (S^T = K Q^T and dP^T = V dO^T
# stay 1-CTA MMAs, which need every column of Q and dO in each CTA); what it changes is who issues dK and dV
# dQ goes out in parts of at most half the head dim: the odd CTA's dQ holds its halves swapped (below)
_PAIR_CONFIGS: dict[int, BlackwellDkDvConfig] = {
    d: replace(c, cta_pair=True, dq_columns=min(c.dq_columns, d // 2)) for d, c in _CONFIGS.items()}


# MXFP8 builds (``MX``, :func:`mx_backward_blackwell`): dK and dV only, dQ on the portable MX dQ pass (as on Hopper:
# its dS is quantized along keys and multiplies K^(keys), and the pass keeps dq bitwise reproducible). Steps of 128
# query rows: the K of dV += P^T dO and dK += dS^T Q is the step, and Triton 3.8 moves a block-scaled MMA's scales
# to tensor memory (tcgen05.cp) only from 128-row tiles of 4 bytes a row (``scaled_mma.SCALE_TILE``), so every
# scale tile of the D 128 build is one: K's, V's [128 keys, 4], Q's, dO's [128 queries, 4] along D, Q's and dO's
# [128 columns d, 4] along queries, P^T's, dS^T's [128 keys, 4]. The D 64 build runs on the simulator only (its D-axis
# scale tiles have 2 columns). Tensor memory: S^T and dP^T take turns in one 128-column tile (dP^T(s) is issued once
# the compute has read S^T(s)) beside dK, dV 2 x 128 and Triton's scale tiles (4 columns per scaled MMA operand): 512
# columns as compiled; the fp32 P^T waits for dP^T in shared memory. Shared memory at D 128: K, V 2 x 16 KB + one
# slot of Q, dO along D and along queries 4 x 16 KB + P^T, dS^T 2 x 16 KB + the fp32 P^T 64 KB = 192 KB (204032 B as
# compiled; a second slot would pass the SM's 232448), so dK(s - 1), the slot's last reader, goes ahead of step s
# (``_mma_item``); D 64: two slots. The compute quantizes P^T and dS^T by half-steps in registers: at 240 registers
# it spilled 16 bytes, at 256 none (compile gate, 2026-12-02).
_MX_CONFIGS: dict[int, BlackwellDkDvConfig] = {
    64: BlackwellDkDvConfig(block_n=128, block_m=128, num_buffers_qdo=2, num_buffers_kv=1, num_buffers_dkdv=1,
                            dq_columns=64, dq_stages=1, compute_regs=256, epilogue_slices=2),
    128: BlackwellDkDvConfig(block_n=128, block_m=128, num_buffers_qdo=1, num_buffers_kv=1, num_buffers_dkdv=1,
                             dq_columns=64, dq_stages=1, compute_regs=256, epilogue_slices=4),
}
# the MX build's operands besides the four E4M3 descriptors in desc_q, desc_k, desc_v, desc_do's places: Q and dO
# along queries (descriptors), the E8M0 scales, each sequence's first query-axis scale row; None in the bf16/fp16
# builds (constexpr: no parameters there)
MX_ARGS = ("desc_qt", "desc_dot", "QS", "QTS", "QB_OFF", "KS", "VS", "DOS", "DOTS", "OB_OFF")
_HALVES = tl.constexpr(2)  # column slices of a step the MX compute moves S^T, dP^T and the fp32 P^T / dS^T in


def config_for(head_dim: int, cta_pair: bool = False, mx: str = "") -> BlackwellDkDvConfig:
    """The dK/dV build at ``head_dim``: the 1-CTA or 2-CTA bf16/fp16 one, or the MXFP8 one (``mx`` the rule)."""
    if mx:
        return _MX_CONFIGS[head_dim]
    return (_PAIR_CONFIGS if cta_pair else _CONFIGS)[head_dim]


def mx_scale_tiles(cfg: BlackwellDkDvConfig, head_dim: int) -> set:
    """The shapes of an MX build's scale tiles (K's, V's, Q's and dO's along D and along queries, P^T's, dS^T's):
    sm_100a compiles the build only where they are all ``scaled_mma.SCALE_TILE`` (D 128)."""
    return {(cfg.block_n, head_dim // 32), (cfg.block_m, head_dim // 32), (head_dim, cfg.block_m // 32),
            (cfg.block_n, cfg.block_m // 32)}


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _work_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL: tl.constexpr,
               BROADCAST_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, PAIR: tl.constexpr = False):
    """(head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, n_masked,
    bulk_end, n_steps, n_masked_run) of work item ``item``, computed identically by every partition (they must
    agree on the number of steps, or the mbarrier phases drift). Step s's query tile is
    ``step_order(s, first, n_lead, n_masked, bulk_end)``; the first ``n_masked_run`` steps run masked: the
    masked ones of that order, or every step where the tile's keys reach past the sequence (dQ sums over
    them; causal masks exclude them already).

    PAIR: the item is a pair of adjacent key tiles (the tile list's blocks are 2 x BLOCK_N rows); both CTAs of
    the cluster run the steps of the pair's 2 x BLOCK_N keys (the same steps, in the same order: their 2-CTA
    MMAs pair up), and ``n_start`` is the first key row of this CTA's tile (rank r: the pair's start + r x
    BLOCK_N). A tile past the sequence's keys runs every step with all its rows masked."""
    SPAN: tl.constexpr = 2 * BLOCK_N if PAIR else BLOCK_N
    head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, bulk_end, num_q_tiles, \
        _lo, _hi = dkdv_item(TILES, CU_Q, CU_K, TILES, item, num_slots, num_heads, num_seqs, len_q_bcast, None,
                             None, CAUSAL, False, BROADCAST_Q, False, SPAN, BLOCK_M)
    n_steps = num_q_tiles - first
    n_masked = n_lead + num_q_tiles - bulk_end
    n_masked_run = n_masked
    if not CAUSAL:
        n_masked_run = tl.where(n_start + SPAN > len_k, n_steps, n_masked)
    if PAIR:
        n_start = n_start + (tlx.cluster_cta_rank() % 2) * BLOCK_N
    return (head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, n_masked, bulk_end,
            n_steps, n_masked_run)


# ---- load partition ----------------------------------------------------------------------------------
@triton.jit
def _load_tile(desc, tile, row, col0, bar, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PAIR: tl.constexpr):
    """One [ROWS, HEAD_DIM] tile of a head starting at column ``col0``; with PAIR in two half-width boxes (the
    descriptor's), the odd CTA's with the halves swapped (``_half``)."""
    if PAIR:
        HALF: tl.constexpr = HEAD_DIM // 2
        swap = tlx.cluster_cta_rank() % 2
        tlx.async_descriptor_load(desc, tlx.local_slice(tile, [0, 0], [ROWS, HALF]), [row, col0 + swap * HALF], bar)
        tlx.async_descriptor_load(desc, tlx.local_slice(tile, [0, HALF], [ROWS, HALF]),
                                  [row, col0 + (1 - swap) * HALF], bar)
    else:
        tlx.async_descriptor_load(desc, tile, [row, col0], bar)


@triton.jit
def _load_qdo_pair_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls,
                        qdo_empties, head, q_row0, out_row0, stats_col0, first, n_lead, n_masked, bulk_end, num_heads,
                        col_stride_q, col_stride_do, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        NUM_BUFFERS_QDO: tl.constexpr, QDO_BYTES: tl.constexpr):
    """``hopper.dkdv_steps.load_qdo_step`` for the 2-CTA build: Q and dO in half-width boxes (``_load_tile``)."""
    i = step_order(j, first, n_lead, n_masked, bulk_end)
    buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    tlx.barrier_wait(qdo_empties[buf], phase ^ 1)
    tlx.barrier_expect_bytes(qdo_fulls[buf], 2 * QDO_BYTES + 2 * BLOCK_M * 4)
    _load_tile(desc_q, q_tiles[buf], q_row0 + i * BLOCK_M, head * col_stride_q, qdo_fulls[buf], BLOCK_M, HEAD_DIM,
               True)
    _load_tile(desc_do, do_tiles[buf], out_row0 + i * BLOCK_M, head * col_stride_do, qdo_fulls[buf], BLOCK_M,
               HEAD_DIM, True)
    stats_col = stats_col0 + i * BLOCK_M
    tlx.async_descriptor_load(desc_stats, lse_tiles[buf], [head, stats_col], qdo_fulls[buf])
    tlx.async_descriptor_load(desc_stats, delta_tiles[buf], [num_heads + head, stats_col], qdo_fulls[buf])
    return qdo_cnt + 1


@triton.jit
def _load_item(item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, k_tiles, v_tiles, q_tiles,
               do_tiles, lse_tiles, delta_tiles, kv_fulls, kv_empties, qdo_fulls, qdo_empties, TILES, CU_Q, CU_K,
               STATS_CU, num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v,
               col_stride_do, CAUSAL: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr,
               NUM_BUFFERS_KV: tl.constexpr, KV_BYTES: tl.constexpr, QDO_BYTES: tl.constexpr,
               HEAD_DIM: tl.constexpr = 0, PAIR: tl.constexpr = False, desc_qt=None, desc_dot=None, qt_tiles=None,
               dot_tiles=None, MX: tl.constexpr = ""):
    """Load partition, one work item: K and V into the next (K, V) slot once the MMAs of the item that last
    used it have all completed, then every step's Q, dO and statistics through the ring (MX builds: E4M3 bytes,
    Q and dO along D and along queries, all four on the slot's full barrier). An item without steps loads
    nothing."""
    head, q_row0, out_row0, _lq, k_row0, _lk, n_start, _cs, first, n_lead, n_masked, bulk_end, n_steps, _r = \
        _work_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q,
                   BLOCK_N, BLOCK_M, PAIR)
    if n_steps > 0:
        kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
        tlx.barrier_wait(kv_empties[kv_buf], kv_phase ^ 1)
        tlx.barrier_expect_bytes(kv_fulls[kv_buf], 2 * KV_BYTES)
        # grouped-query attention: the query head's key/value head (its dK, dV are per query head partials)
        row = k_row0 + n_start
        _load_tile(desc_k, k_tiles[kv_buf], row, (head // GROUP) * col_stride_k, kv_fulls[kv_buf], BLOCK_N, HEAD_DIM,
                   PAIR)
        _load_tile(desc_v, v_tiles[kv_buf], row, (head // GROUP) * col_stride_v, kv_fulls[kv_buf], BLOCK_N, HEAD_DIM,
                   PAIR)
        stats_col0 = aligned_column(TILES, STATS_CU, item, num_slots, num_heads, num_seqs, False)
        for s in tl.range(0, n_steps):
            if PAIR:
                qdo_cnt = _load_qdo_pair_step(s, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                              delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0.to(tl.int32),
                                              stats_col0, first, n_lead, n_masked, bulk_end, num_heads, col_stride_q,
                                              col_stride_do, HEAD_DIM, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
            elif MX != "":  # the expect-bytes count all four tiles; the query-axis ones land on the same barrier
                buf, _phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
                qdo_cnt = load_qdo_step(s, qdo_cnt, desc_q, desc_do, desc_stats,
                                        (q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties), head,
                                        q_row0, out_row0.to(tl.int32), stats_col0, first, n_lead, n_masked, bulk_end,
                                        num_heads, col_stride_q, col_stride_do, TILES, False, 1, BLOCK_M,
                                        NUM_BUFFERS_QDO, 2 * QDO_BYTES)
                m_start = step_order(s, first, n_lead, n_masked, bulk_end) * BLOCK_M
                tlx.async_descriptor_load(desc_qt, qt_tiles[buf], [q_row0 + m_start, head * col_stride_q],
                                          qdo_fulls[buf])
                tlx.async_descriptor_load(desc_dot, dot_tiles[buf], [out_row0.to(tl.int32) + m_start,
                                                                     head * col_stride_do], qdo_fulls[buf])
            else:
                qdo_cnt = load_qdo_step(s, qdo_cnt, desc_q, desc_do, desc_stats,
                                        (q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties), head,
                                        q_row0, out_row0.to(tl.int32), stats_col0, first, n_lead, n_masked, bulk_end,
                                        num_heads, col_stride_q, col_stride_do, TILES, False, 1, BLOCK_M,
                                        NUM_BUFFERS_QDO, QDO_BYTES)
        kv_cnt += 1
    return kv_cnt, qdo_cnt


# ---- MMA partition ------------------------------------------------------------------------------------
@triton.jit
def _pair_ready(fulls, pairs, cnt, PAIR: tl.constexpr):
    """Before an MMA that reads what the compute stored (``fulls[0]``'s phase ``cnt``): with PAIR, this CTA's
    MMA warp tells the pair's leader (remote arrive on its ``pairs[0]``, 2 arrivals a phase) and the leader,
    which issues the 2-CTA MMA for both, waits until both CTAs' operands are there."""
    tlx.barrier_wait(fulls[0], cnt & 1)
    if PAIR:
        rank = tlx.cluster_cta_rank()
        tlx.barrier_arrive(pairs[0], 1, remote_cta_rank=rank & ~1)
        tlx.barrier_wait(pairs[0], cnt & 1, pred=rank % 2 == 0)


@triton.jit
def _half(tiles, buf, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PAIR: tl.constexpr):
    """The B operand of dK += dS^T Q / dV += P^T dO: the slot's tile, or with PAIR the first half of its columns,
    the head dim's first half in the even CTA and its second in the odd one (which holds them swapped): the
    2-CTA MMA's B, split along N between the pair at one shared-memory offset, is then the whole tile, and each
    CTA's accumulator gets all of N in order."""
    if PAIR:
        HALF: tl.constexpr = HEAD_DIM // 2
        return tlx.local_slice(tiles[buf], [0, 0], [BLOCK_M, HALF])
    else:
        return tiles[buf]


@triton.jit
def _issue_dk_dq(k_tile, q_tiles, ds_tiles, dk_tile, dq_tiles, qdo_empties, ds_fulls, ds_empties, dq_fulls,
                 dq_empties, buf, cnt, use_acc, FUSED_DQ: tl.constexpr, ds_pairs=None, HEAD_DIM: tl.constexpr = 0,
                 BLOCK_M: tl.constexpr = 0, PAIR: tl.constexpr = False):
    """dK += dS^T Q of the step ``cnt`` (its Q in ring slot ``buf``) once the compute has stored dS^T, then
    with the fused dQ ``dQ = dS K`` once the dQ partition has read the previous one. dK, the slot's last
    reader (dV read its dO before it, in issue order), hands the slot back on completion; the last MMA
    reading dS^T hands it back. PAIR: dK is a 2-CTA MMA (its arrivals reach both CTAs' barriers) and dQ this
    CTA's own, so dS^T's slot waits for both (``ds_empties``: 2 arrivals with the fused dQ)."""
    _pair_ready(ds_fulls, ds_pairs, cnt, PAIR)
    if FUSED_DQ:
        if PAIR:
            tlx.async_dot(ds_tiles[0], _half(q_tiles, buf, HEAD_DIM, BLOCK_M, PAIR), dk_tile, use_acc=use_acc,
                          mBarriers=[qdo_empties[buf], ds_empties[0]], two_ctas=True)
        else:
            tlx.async_dot(ds_tiles[0], q_tiles[buf], dk_tile, use_acc=use_acc, mBarriers=[qdo_empties[buf]])
        tlx.barrier_wait(dq_empties[0], (cnt & 1) ^ 1)
        tlx.async_dot(tlx.local_trans(ds_tiles[0]), k_tile, dq_tiles[0], use_acc=False,
                      mBarriers=[ds_empties[0], dq_fulls[0]])
    else:
        tlx.async_dot(ds_tiles[0], _half(q_tiles, buf, HEAD_DIM, BLOCK_M, PAIR), dk_tile, use_acc=use_acc,
                      mBarriers=[qdo_empties[buf], ds_empties[0]], two_ctas=PAIR)


@triton.jit
def _issue_dk_mx(ds_tiles, dss_tiles, qt_tiles, qts_tiles, dk_tile, qdo_empties, ds_fulls, ds_empties, buf, cnt,
                 use_acc):
    """MX builds: dK += dS^(queries)^T Q^(queries) of the step ``cnt`` (its Q along queries in ring slot ``buf``) as a
    block-scaled MMA once the compute has stored dS^T's E4M3 elements and scales; the slot's last reader (it hands
    the slot back) and dS^T's only one."""
    tlx.barrier_wait(ds_fulls[0], cnt & 1)
    tlx.async_dot_scaled(ds_tiles[0], qt_tiles[buf], dk_tile, dss_tiles[0], "e4m3", qts_tiles[buf], "e4m3",
                         use_acc=use_acc, mBarriers=[qdo_empties[buf], ds_empties[0]])


@triton.jit
def _mma_item(item, kv_cnt, qdo_cnt, step_cnt, k_tiles, v_tiles, q_tiles, do_tiles, p_tiles, ds_tiles, s_tiles,
              dp_tiles, dk_tiles, dv_tiles, dq_tiles, kv_fulls, kv_empties, qdo_fulls, qdo_empties, s_fulls, s_empties,
              dp_fulls, dp_empties, p_fulls, p_empties, ds_fulls, ds_empties, dq_fulls, dq_empties, dkdv_fulls,
              dkdv_empties, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL: tl.constexpr,
              BROADCAST_Q: tl.constexpr, FUSED_DQ: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
              NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, NUM_BUFFERS_DKDV: tl.constexpr,
              p_pairs=None, ds_pairs=None, HEAD_DIM: tl.constexpr = 0, PAIR: tl.constexpr = False, qt_tiles=None,
              dot_tiles=None, ks_tiles=None, vs_tiles=None, qs_tiles=None, dos_tiles=None, qts_tiles=None,
              dots_tiles=None, ps_tiles=None, dss_tiles=None, kvs_fulls=None, qdos_fulls=None, MX: tl.constexpr = ""):
    """MMA partition, one work item. Step s: S^T(s), then dK and dQ of step s - 1, then dP^T(s) and dV(s);
    after the loop dK and dQ of the last step, then ``tcgen05_commit`` hands dK/dV to the epilogue and K/V
    back to the load partition. S^T, dP^T, P^T, dS^T and dQ are single-buffered: their phase is the CTA's
    step count ``step_cnt``; the ring slot follows ``qdo_cnt``; the (K, V) slot and the dK/dV accumulators
    follow the CTA's count of items with steps, ``kv_cnt``.

    MX builds: the four products are block-scaled MMAs of E4M3 operands, each once its scales are in shared
    memory too (``kvs_fulls``, ``qdos_fulls``): S^T = K Q^T and dP^T = V dO^T with K, V, Q, dO along D, dV += P^T dO
    and dK += dS^T Q with P^T, dS^T (the compute's) and Q, dO along queries; no dQ. S^T and dP^T share their
    tensor memory: S^T(s) waits until the compute has read dP^T(s - 1), dP^T(s) until it has read S^T(s). With one
    ring slot (D 128) dK(s - 1) goes first in step s: the slot's step s lands only once it has completed."""
    _h, _qr, _or, _lq, _kr, _lk, _ns, _cs, _f, _nl, _nm, _be, n_steps, _r = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, BLOCK_N, BLOCK_M,
        PAIR)
    if n_steps > 0:
        kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
        acc_buf, acc_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_DKDV)
        k_tile, v_tile = k_tiles[kv_buf], v_tiles[kv_buf]
        dk_tile, dv_tile = dk_tiles[acc_buf], dv_tiles[acc_buf]
        tlx.barrier_wait(kv_fulls[kv_buf], kv_phase)
        if MX != "":
            tlx.barrier_wait(kvs_fulls[kv_buf], kv_phase)
        for s in tl.range(0, n_steps):
            cnt = step_cnt + s
            buf, phase = bufidx_phase(qdo_cnt + s, NUM_BUFFERS_QDO)
            if MX != "" and NUM_BUFFERS_QDO == 1:  # one ring slot: dK(s - 1), its last reader, frees it for step s
                if s > 0:
                    _issue_dk_mx(ds_tiles, dss_tiles, qt_tiles, qts_tiles, dk_tile, qdo_empties, ds_fulls, ds_empties,
                                 buf, cnt - 1, s > 1)
            tlx.barrier_wait(qdo_fulls[buf], phase)
            tlx.barrier_wait(s_empties[0], (cnt & 1) ^ 1)
            if MX != "":
                tlx.barrier_wait(qdos_fulls[buf], phase)
                tlx.barrier_wait(dp_empties[0], (cnt & 1) ^ 1)  # dP^T(s - 1), in S^T's tensor memory, is read
                tlx.async_dot_scaled(k_tile, tlx.local_trans(q_tiles[buf]), s_tiles[0], ks_tiles[kv_buf], "e4m3",
                                     qs_tiles[buf], "e4m3", use_acc=False, mBarriers=[s_fulls[0]])
            else:
                tlx.async_dot(k_tile, tlx.local_trans(q_tiles[buf]), s_tiles[0], use_acc=False,
                              mBarriers=[s_fulls[0]])
            if s > 0:
                prev, _ = bufidx_phase(qdo_cnt + s - 1, NUM_BUFFERS_QDO)
                if MX != "":
                    if NUM_BUFFERS_QDO > 1:
                        _issue_dk_mx(ds_tiles, dss_tiles, qt_tiles, qts_tiles, dk_tile, qdo_empties, ds_fulls,
                                     ds_empties, prev, cnt - 1, s > 1)
                else:
                    _issue_dk_dq(k_tile, q_tiles, ds_tiles, dk_tile, dq_tiles, qdo_empties, ds_fulls, ds_empties,
                                 dq_fulls, dq_empties, prev, cnt - 1, s > 1, FUSED_DQ, ds_pairs, HEAD_DIM, BLOCK_M,
                                 PAIR)
            tlx.barrier_wait(dp_empties[0], (cnt & 1) ^ 1)
            if MX != "":
                tlx.barrier_wait(s_empties[0], cnt & 1)  # S^T(s) is read: dP^T(s) takes its tensor memory
                tlx.async_dot_scaled(v_tile, tlx.local_trans(do_tiles[buf]), dp_tiles[0], vs_tiles[kv_buf], "e4m3",
                                     dos_tiles[buf], "e4m3", use_acc=False, mBarriers=[dp_fulls[0]])
            else:
                tlx.async_dot(v_tile, tlx.local_trans(do_tiles[buf]), dp_tiles[0], use_acc=False,
                              mBarriers=[dp_fulls[0]])
            if s == 0:  # the epilogue has read dK and dV of the item that last used these accumulators (with PAIR,
                # both CTAs' epilogues: they arrive on the leader's barrier, which issues the 2-CTA dK and dV)
                if PAIR:
                    tlx.barrier_wait(dkdv_empties[acc_buf], acc_phase ^ 1, pred=tlx.cluster_cta_rank() % 2 == 0)
                else:
                    tlx.barrier_wait(dkdv_empties[acc_buf], acc_phase ^ 1)
            _pair_ready(p_fulls, p_pairs, cnt, PAIR)
            if MX != "":
                tlx.async_dot_scaled(p_tiles[0], dot_tiles[buf], dv_tile, ps_tiles[0], "e4m3", dots_tiles[buf], "e4m3",
                                     use_acc=s > 0, mBarriers=[p_empties[0]])
            else:
                tlx.async_dot(p_tiles[0], _half(do_tiles, buf, HEAD_DIM, BLOCK_M, PAIR), dv_tile, use_acc=s > 0,
                              mBarriers=[p_empties[0]], two_ctas=PAIR)
        last, _ = bufidx_phase(qdo_cnt + n_steps - 1, NUM_BUFFERS_QDO)
        if MX != "":
            _issue_dk_mx(ds_tiles, dss_tiles, qt_tiles, qts_tiles, dk_tile, qdo_empties, ds_fulls, ds_empties, last,
                         step_cnt + n_steps - 1, n_steps > 1)
        else:
            _issue_dk_dq(k_tile, q_tiles, ds_tiles, dk_tile, dq_tiles, qdo_empties, ds_fulls, ds_empties, dq_fulls,
                         dq_empties, last, step_cnt + n_steps - 1, n_steps > 1, FUSED_DQ, ds_pairs, HEAD_DIM, BLOCK_M,
                         PAIR)
        # every MMA of the item is issued: dK, dV final and K, V free once they have completed (with PAIR the
        # leader's commit reaches both CTAs' dK/dV barrier)
        tlx.tcgen05_commit(dkdv_fulls[acc_buf], two_ctas=PAIR)
        tlx.tcgen05_commit(kv_empties[kv_buf])
        kv_cnt += 1
    return kv_cnt, qdo_cnt + n_steps, step_cnt + n_steps


# ---- compute partition --------------------------------------------------------------------------------
@triton.jit
def _compute_step(cnt, qdo_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties,
                  s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties, ds_fulls, ds_empties, m_start, offs_n,
                  len_q, len_k, causal_shift, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, DTYPE: tl.constexpr):
    """One step (``cnt``: the CTA's step count; its statistics in ring slot ``qdo_cnt``): P^T from S^T and
    lse2 to shared memory for dV, then dS^T from dP^T and delta for dK and dQ. MASKED zeroes P^T (and so
    dS^T) for query rows past the sequence, key rows past it and, if CAUSAL, keys past the diagonal."""
    buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    tlx.barrier_wait(qdo_fulls[buf], phase)
    lse2 = tlx.local_load(lse_tiles[buf])  # [1, BLOCK_M]: lse * log2(e), +inf for rows that see no key
    tlx.barrier_wait(s_fulls[0], cnt & 1)
    s_t = tlx.local_load(s_tiles[0])  # [BLOCK_N, BLOCK_M]
    tlx.barrier_arrive(s_empties[0], 1)
    p_t = tl.math.exp2(s_t * qk_scale - lse2)
    if MASKED:
        # the TMA boxes may reach into the next sequence's rows: their P^T (and so dS^T) must be 0
        offs_m = m_start + tl.arange(0, BLOCK_M)
        visible = (offs_m < len_q)[None, :] & (offs_n < len_k)[:, None]
        if CAUSAL:
            visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
        p_t = tl.where(visible, p_t, 0.0)
    tlx.barrier_wait(p_empties[0], (cnt & 1) ^ 1)  # the previous dV has read P^T
    tlx.local_store(p_tiles[0], p_t.to(DTYPE))
    tlx.fence_async_shared()  # generic-proxy stores, read by the tensor core (async proxy)
    tlx.barrier_arrive(p_fulls[0], 1)
    delta = tlx.local_load(delta_tiles[buf])  # [1, BLOCK_M]
    tlx.barrier_arrive(qdo_empties[buf], 1)  # the statistics are read (the dK MMA gives the other arrival)
    tlx.barrier_wait(dp_fulls[0], cnt & 1)
    dp_t = tlx.local_load(dp_tiles[0])
    tlx.barrier_arrive(dp_empties[0], 1)
    ds_t = p_t * (dp_t - delta)
    if MASKED:  # a foreign row's dP^T need not be finite: select, do not multiply
        ds_t = tl.where(p_t == 0.0, 0.0, ds_t)
    tlx.barrier_wait(ds_empties[0], (cnt & 1) ^ 1)  # the previous dK (and dQ) have read dS^T
    tlx.local_store(ds_tiles[0], ds_t.to(DTYPE))
    tlx.fence_async_shared()
    tlx.barrier_arrive(ds_fulls[0], 1)
    return cnt + 1, qdo_cnt + 1


@triton.jit
def _columns(tile, h, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Column slice ``h`` of ``_HALVES`` of a ``[ROWS, COLS]`` shared-memory tile."""
    HALF: tl.constexpr = COLS // _HALVES
    return tlx.local_slice(tile, [0, h * HALF], [ROWS, HALF])


@triton.jit
def _visible(offs_n, m_start, h, len_q, len_k, causal_shift, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """``[BLOCK_N, BLOCK_M / _HALVES]``: key row n sees query column m of the step's slice ``h`` (both inside the
    sequence, and the causal diagonal)."""
    offs_m = m_start + h * (BLOCK_M // _HALVES) + tl.arange(0, BLOCK_M // _HALVES)
    visible = (offs_m < len_q)[None, :] & (offs_n < len_k)[:, None]
    if CAUSAL:
        visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
    return visible


@triton.jit
def _join_columns(a, b, ROWS: tl.constexpr, COLS: tl.constexpr):
    """``[a | b]``: two ``[ROWS, COLS]`` tiles side by side, ``[ROWS, 2 COLS]``."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), [ROWS, 2 * COLS])


@triton.jit
def _compute_step_mx(cnt, qdo_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, ps_tiles, dss_tiles, w_tiles, lse_tiles,
                     delta_tiles, qdo_fulls, qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties,
                     ds_fulls, ds_empties, m_start, offs_n, len_q, len_k, causal_shift, qk_scale,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, RCEIL: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr):
    """``_compute_step`` of an MX build (docs/mxfp8.md section 2): P^T = exp2(S^T * scale * log2 e - lse2) and
    dS^T = P^T (dP^T - delta) in fp32, each MX-quantized along its columns (the step's queries: whole 32-row blocks
    of the sequence, the step starting on a multiple of 128 rows from its first row) into E4M3 elements and E8M0
    scales for the block-scaled dV and dK (``mx_elements``, the portable kernels' values). Both are computed and
    quantized in two column halves (registers: ``_HALVES``), the halves' bytes joined before the stores. The fp32
    P^T waits in shared memory (``w_tiles``) for dP^T, whose tensor memory is S^T's. MASKED zeroes P^T and dS^T
    outside the sequence's rows, its keys and (CAUSAL) the diagonal: the TMA boxes may hold the next sequence's
    rows, whose dP^T need not be finite (select, do not multiply)."""
    HALF: tl.constexpr = BLOCK_M // _HALVES
    tl.static_assert(_HALVES == 2, "the halves' bytes are joined pairwise")
    buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    tlx.barrier_wait(qdo_fulls[buf], phase)
    tlx.barrier_wait(s_fulls[0], cnt & 1)
    for h in tl.static_range(_HALVES):
        lse2 = tlx.local_load(_columns(lse_tiles[buf], h, 1, BLOCK_M))  # lse * log2(e), +inf for rows without keys
        p_t = tl.math.exp2(tlx.local_load(tlx.subslice(s_tiles[0], h * HALF, HALF)) * qk_scale - lse2)
        if MASKED:
            p_t = tl.where(_visible(offs_n, m_start, h, len_q, len_k, causal_shift, CAUSAL, BLOCK_M), p_t, 0.0)
        tlx.local_store(_columns(w_tiles[0], h, BLOCK_N, BLOCK_M), p_t)
        if h == 0:
            p_codes, p_scales = mx_elements(p_t, RCEIL, BLOCK_N, HALF)
        else:
            codes, scales = mx_elements(p_t, RCEIL, BLOCK_N, HALF)
            p_codes = _join_columns(p_codes, codes, BLOCK_N, HALF)
            p_scales = _join_columns(p_scales, scales, BLOCK_N, HALF // 32)
    tlx.barrier_arrive(s_empties[0], 1)  # S^T is read: dP^T may take its tensor memory
    tlx.barrier_wait(p_empties[0], (cnt & 1) ^ 1)  # the previous dV has read P^T
    tlx.local_store(p_tiles[0], p_codes)
    tlx.local_store(ps_tiles[0], p_scales)
    tlx.fence_async_shared()  # generic-proxy stores, read by the tensor core (async proxy)
    tlx.barrier_arrive(p_fulls[0], 1)
    tlx.barrier_wait(dp_fulls[0], cnt & 1)
    for h in tl.static_range(_HALVES):
        delta = tlx.local_load(_columns(delta_tiles[buf], h, 1, BLOCK_M))
        dp_t = tlx.local_load(tlx.subslice(dp_tiles[0], h * HALF, HALF))
        ds_t = tlx.local_load(_columns(w_tiles[0], h, BLOCK_N, BLOCK_M)) * (dp_t - delta)
        if MASKED:
            ds_t = tl.where(_visible(offs_n, m_start, h, len_q, len_k, causal_shift, CAUSAL, BLOCK_M), ds_t, 0.0)
        if h == 0:
            ds_codes, ds_scales = mx_elements(ds_t, RCEIL, BLOCK_N, HALF)
        else:
            codes, scales = mx_elements(ds_t, RCEIL, BLOCK_N, HALF)
            ds_codes = _join_columns(ds_codes, codes, BLOCK_N, HALF)
            ds_scales = _join_columns(ds_scales, scales, BLOCK_N, HALF // 32)
    tlx.barrier_arrive(dp_empties[0], 1)
    tlx.barrier_arrive(qdo_empties[buf], 1)  # the statistics are read (the dK MMA gives the other arrival)
    tlx.barrier_wait(ds_empties[0], (cnt & 1) ^ 1)  # the previous dK has read dS^T
    tlx.local_store(ds_tiles[0], ds_codes)
    tlx.local_store(dss_tiles[0], ds_scales)
    tlx.fence_async_shared()
    tlx.barrier_arrive(ds_fulls[0], 1)
    return cnt + 1, qdo_cnt + 1


@triton.jit
def _store_rows(PTR, rows, stride_t, stride_h, head, offs_d, values, row_ok):
    tl.store(PTR + rows[:, None] * stride_t + head * stride_h + offs_d[None, :], values.to(PTR.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _compute_item(item, kv_cnt, qdo_cnt, step_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, dk_tiles, dv_tiles,
                  lse_tiles, delta_tiles, qdo_fulls, qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties, p_fulls,
                  p_empties, ds_fulls, ds_empties, dkdv_fulls, dkdv_empties, DK, DV, TILES, CU_Q, CU_K, stride_dkt,
                  stride_dkh, stride_dvt, stride_dvh, num_slots, num_heads, num_seqs, len_q_bcast, sm_scale, qk_scale,
                  CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DKDV: tl.constexpr,
                  EPILOGUE_SLICES: tl.constexpr, DTYPE: tl.constexpr, PAIR: tl.constexpr = False, ps_tiles=None,
                  dss_tiles=None, w_tiles=None, MX: tl.constexpr = ""):
    """Compute partition, one work item: the masked steps, the bulk, then the epilogue: dK (times the scale)
    and dV from tensor memory to memory, rows past the sequence never written; an item without steps stores
    zeros (its keys are seen by no query). MX builds: ``_compute_step_mx``."""
    head, _qr, _or, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, n_masked, bulk_end, n_steps, \
        n_masked_run = _work_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL,
                                  BROADCAST_Q, BLOCK_N, BLOCK_M, PAIR)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    row_ok = offs_n < len_k
    rows = k_row0.to(tl.int64) + offs_n.to(tl.int64)
    if n_steps > 0:
        for s in tl.range(0, n_masked_run):
            m_start = step_order(s, first, n_lead, n_masked, bulk_end) * BLOCK_M
            if MX != "":
                step_cnt, qdo_cnt = _compute_step_mx(
                    step_cnt, qdo_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, ps_tiles, dss_tiles, w_tiles, lse_tiles,
                    delta_tiles, qdo_fulls, qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties,
                    ds_fulls, ds_empties, m_start, offs_n, len_q, len_k, causal_shift, qk_scale, True, CAUSAL,
                    MX == "rceil", BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO)
            else:
                step_cnt, qdo_cnt = _compute_step(
                    step_cnt, qdo_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, lse_tiles, delta_tiles, qdo_fulls,
                    qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties, ds_fulls, ds_empties,
                    m_start, offs_n, len_q, len_k, causal_shift, qk_scale, True, CAUSAL, BLOCK_M, NUM_BUFFERS_QDO,
                    DTYPE)
        for s in tl.range(n_masked_run, n_steps):
            m_start = step_order(s, first, n_lead, n_masked, bulk_end) * BLOCK_M
            if MX != "":
                step_cnt, qdo_cnt = _compute_step_mx(
                    step_cnt, qdo_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, ps_tiles, dss_tiles, w_tiles, lse_tiles,
                    delta_tiles, qdo_fulls, qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties,
                    ds_fulls, ds_empties, m_start, offs_n, len_q, len_k, causal_shift, qk_scale, False, CAUSAL,
                    MX == "rceil", BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO)
            else:
                step_cnt, qdo_cnt = _compute_step(
                    step_cnt, qdo_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, lse_tiles, delta_tiles, qdo_fulls,
                    qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties, ds_fulls, ds_empties,
                    m_start, offs_n, len_q, len_k, causal_shift, qk_scale, False, CAUSAL, BLOCK_M, NUM_BUFFERS_QDO,
                    DTYPE)
        acc_buf, acc_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_DKDV)
        tlx.barrier_wait(dkdv_fulls[acc_buf], acc_phase)  # the item's last MMA has completed
        SLICE: tl.constexpr = HEAD_DIM // EPILOGUE_SLICES
        for c in tl.static_range(EPILOGUE_SLICES):
            offs_d = c * SLICE + tl.arange(0, SLICE)
            dv = tlx.local_load(tlx.subslice(dv_tiles[acc_buf], c * SLICE, SLICE))
            _store_rows(DV, rows, stride_dvt, stride_dvh, head, offs_d, dv, row_ok)
            dk = tlx.local_load(tlx.subslice(dk_tiles[acc_buf], c * SLICE, SLICE))
            _store_rows(DK, rows, stride_dkt, stride_dkh, head, offs_d, dk * sm_scale, row_ok)
        if PAIR:  # the leader writes both CTAs' accumulators next: it waits for both epilogues
            tlx.barrier_arrive(dkdv_empties[acc_buf], 1, remote_cta_rank=tlx.cluster_cta_rank() & ~1)
        else:
            tlx.barrier_arrive(dkdv_empties[acc_buf], 1)
        kv_cnt += 1
    else:
        cols = tl.arange(0, HEAD_DIM)
        zeros = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
        _store_rows(DV, rows, stride_dvt, stride_dvh, head, cols, zeros, row_ok)
        _store_rows(DK, rows, stride_dkt, stride_dkh, head, cols, zeros, row_ok)
    return kv_cnt, qdo_cnt, step_cnt


# ---- scales partition (MX builds) ----------------------------------------------------------------------------
@triton.jit
def _scales_item(item, kv_cnt, qdo_cnt, ks_tiles, vs_tiles, qs_tiles, dos_tiles, qts_tiles, dots_tiles, kvs_fulls,
                 kv_empties, qdos_fulls, qdo_empties, QS, QTS, QB_OFF, KS, VS, DOS, DOTS, OB_OFF, TILES, CU_Q, CU_K,
                 num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL: tl.constexpr, GROUP: tl.constexpr,
                 BROADCAST_Q: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                 NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr):
    """MX builds, the default partition (no fused dQ): the E8M0 scales of work item ``item``'s fills, in the load
    warp's order, each stored beside the tile its TMA brings once the slot is free (the load warp waits for the
    same phase), fenced for the tensor core and signalled on the slot's scale barrier: K's and V's along D, then
    per step Q's and dO's along D and along the sequence's 32-row query blocks (a broadcast Q: the shared q's own
    blocks; dO: the output rows'), in the B-operand layout of dK and dV (one row per column d). Plain loads masked
    to the sequence (no scale of another sequence is read; the masked entries hold 2^0). The tensor ops of a scale
    tile need a warpgroup: the load partition is one warp. Returns the advanced (kv_cnt, qdo_cnt)."""
    head, q_row0, out_row0, len_q, k_row0, len_k, n_start, _cs, first, n_lead, n_masked, bulk_end, n_steps, _r = \
        _work_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q,
                   BLOCK_N, BLOCK_M)
    if n_steps > 0:
        kv_heads = num_heads // GROUP
        ks = _dim_scales(KS, k_row0 + n_start, len_k - n_start, head // GROUP, kv_heads, BLOCK_N, HEAD_DIM)
        vs = _dim_scales(VS, k_row0 + n_start, len_k - n_start, head // GROUP, kv_heads, BLOCK_N, HEAD_DIM)
        kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
        tlx.barrier_wait(kv_empties[kv_buf], kv_phase ^ 1)
        tlx.local_store(ks_tiles[kv_buf], ks)
        tlx.local_store(vs_tiles[kv_buf], vs)
        tlx.fence_async_shared()  # generic-proxy stores, read by the tensor core (async proxy)
        tlx.barrier_arrive(kvs_fulls[kv_buf], 1)
        qb0, ob0 = mx_scale_rows(TILES, QB_OFF, OB_OFF, item, num_slots, num_heads, num_seqs, BROADCAST_Q)
        for s in tl.range(0, n_steps):
            m_start = step_order(s, first, n_lead, n_masked, bulk_end) * BLOCK_M
            qs = _dim_scales(QS, q_row0 + m_start, len_q - m_start, head, num_heads, BLOCK_M, HEAD_DIM)
            dos = _dim_scales(DOS, out_row0 + m_start, len_q - m_start, head, num_heads, BLOCK_M, HEAD_DIM)
            qts = _token_scales(QTS, qb0, m_start, len_q, head, num_heads, BLOCK_M, HEAD_DIM)
            dots = _token_scales(DOTS, ob0, m_start, len_q, head, num_heads, BLOCK_M, HEAD_DIM)
            buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
            tlx.barrier_wait(qdo_empties[buf], phase ^ 1)
            tlx.local_store(qs_tiles[buf], qs)
            tlx.local_store(dos_tiles[buf], dos)
            tlx.local_store(qts_tiles[buf], qts)
            tlx.local_store(dots_tiles[buf], dots)
            tlx.fence_async_shared()
            tlx.barrier_arrive(qdos_fulls[buf], 1)
            qdo_cnt += 1
        kv_cnt += 1
    return kv_cnt, qdo_cnt


# ---- dQ partition ---------------------------------------------------------------------------------------
@triton.jit
def _dq_item(item, step_cnt, dq_tiles, dq_stages, dq_fulls, dq_empties, desc_dq, TILES, CU_Q, CU_K, num_slots,
             num_heads, num_seqs, len_q_bcast, sm_scale, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, DQ_COLUMNS: tl.constexpr,
             DQ_STAGES: tl.constexpr, PAIR: tl.constexpr = False):
    """dQ partition, one work item: per step, once its dQ MMA has completed, each DQ_COLUMNS-column part of dQ
    (times the scale) from tensor memory into the next stage (once that stage's last reduce-add has read it),
    tensor memory handed back after its last part is read, and the stage reduce-added at the step's query
    rows (``send_staged_dq``: fence, the warpgroup's barrier, TMA)."""
    PARTS: tl.constexpr = HEAD_DIM // DQ_COLUMNS
    head, q_row0, _or, _lq, _kr, _lk, _ns, _cs, first, n_lead, n_masked, bulk_end, n_steps, _r = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, BLOCK_N, BLOCK_M,
        PAIR)
    for s in tl.range(0, n_steps):
        cnt = step_cnt + s
        m_start = step_order(s, first, n_lead, n_masked, bulk_end) * BLOCK_M
        tlx.barrier_wait(dq_fulls[0], cnt & 1)
        for c in tl.static_range(PARTS):
            dq = tlx.local_load(tlx.subslice(dq_tiles[0], c * DQ_COLUMNS, DQ_COLUMNS))
            if c == PARTS - 1:
                tlx.barrier_arrive(dq_empties[0], 1)
            stage = dq_stages[(cnt * PARTS + c) % DQ_STAGES]
            tlx.async_descriptor_store_wait(DQ_STAGES - 1)  # this stage's last reduce-add has read it
            stage_dq(stage, dq, sm_scale, False)
            col = c * DQ_COLUMNS
            if PAIR:  # the odd CTA's K holds the head dim's halves swapped, and so does its dQ = dS K
                col = (col + (tlx.cluster_cta_rank() % 2) * (HEAD_DIM // 2)) % HEAD_DIM
            send_staged_dq(stage, desc_dq, q_row0 + m_start, head * HEAD_DIM + col)
    return step_cnt + n_steps


# per-batch values: no recompiles, one specialisation per config (the one the offline gate compiles)
@triton.jit(do_not_specialize=["num_items", "num_slots", "num_seqs", "num_heads", "len_q_bcast"])
def jagged_dkdv_blackwell_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, DK, DV, CU_Q, CU_K, STATS_CU, TILES,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, col_stride_q, col_stride_k, col_stride_v, col_stride_do,
    num_items, num_slots, num_seqs, num_heads, len_q_bcast, sm_scale,
    desc_qt, desc_dot, QS, QTS, QB_OFF, KS, VS, DOS, DOTS, OB_OFF,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr,
    FUSED_DQ: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr,
    NUM_BUFFERS_KV: tl.constexpr, NUM_BUFFERS_DKDV: tl.constexpr, DQ_COLUMNS: tl.constexpr, DQ_STAGES: tl.constexpr,
    COMPUTE_REGS: tl.constexpr, EPILOGUE_SLICES: tl.constexpr, PAIR: tl.constexpr = False, MX: tl.constexpr = "",
    SCALE_TILES: tl.constexpr = False,
):
    """MX ("" or the rule of an MXFP8 build: 1-CTA, no fused dQ): "" reads bf16/fp16 q, k, v, dO; an MXFP8 build reads
    E4M3 bytes by TMA, Q, K, V, dO along D in desc_q, desc_k, desc_v, desc_do and Q, dO along queries in desc_qt,
    desc_dot, and their E8M0 scales QS, KS, VS, DOS (D-axis) and QTS, DOTS (query-axis, sequence b's first scale row
    QB_OFF[b], OB_OFF[b]) with plain loads in the default partition (``_scales_item``); all four products are
    block-scaled MMAs, P^T and dS^T quantized by the compute (``_compute_step_mx``). SCALE_TILES: every scale tile is
    a ``scaled_mma.SCALE_TILE``; they then take the layout tcgen05.cp reads (``forward._SCALE_LAYOUT``), else the
    default one (the simulator runs either). The MX operands are None in the bf16/fp16 builds."""
    tl.static_assert(MX == "" or (not PAIR and not FUSED_DQ), "the MXFP8 build is 1-CTA, without the fused dQ")
    DTYPE: tl.constexpr = tlx.dtype_of(desc_q)
    CTAS: tl.constexpr = 2 if PAIR else 1  # CTAs per work item: a pair deals the items as one
    KV_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(DTYPE)
    QDO_BYTES: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(DTYPE)

    # shared memory: K, V of the item; the (Q, dO, lse2, delta) ring; P^T and dS^T (16-bit MMA operands);
    # the dQ stages
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, NUM_BUFFERS_KV)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, NUM_BUFFERS_KV)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    lse_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_BUFFERS_QDO)
    delta_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_BUFFERS_QDO)
    p_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M), DTYPE, 1)
    ds_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M), DTYPE, 1)
    # MX builds: Q and dO along queries beside the ring's D-axis tiles, the compute's fp32 P^T / dS^T, and every
    # E4M3 tile's E8M0 scales (B operands of S^T and dP^T: [queries, D / 32]; of dK and dV: [D, queries / 32])
    if MX != "":
        qt_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
        dot_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
        w_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M), tl.float32, 1)
        if SCALE_TILES:
            ks_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_KV, layout=_SCALE_LAYOUT)
            vs_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_KV, layout=_SCALE_LAYOUT)
            qs_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_QDO, layout=_SCALE_LAYOUT)
            dos_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_QDO, layout=_SCALE_LAYOUT)
            qts_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_M // 32), tl.uint8, NUM_BUFFERS_QDO, layout=_SCALE_LAYOUT)
            dots_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_M // 32), tl.uint8, NUM_BUFFERS_QDO, layout=_SCALE_LAYOUT)
            ps_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M // 32), tl.uint8, 1, layout=_SCALE_LAYOUT)
            dss_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M // 32), tl.uint8, 1, layout=_SCALE_LAYOUT)
        else:
            ks_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_KV)
            vs_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_KV)
            qs_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_QDO)
            dos_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_QDO)
            qts_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_M // 32), tl.uint8, NUM_BUFFERS_QDO)
            dots_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_M // 32), tl.uint8, NUM_BUFFERS_QDO)
            ps_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M // 32), tl.uint8, 1)
            dss_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M // 32), tl.uint8, 1)
    else:
        qt_tiles = None
        dot_tiles = None
        w_tiles = None
        ks_tiles = None
        vs_tiles = None
        qs_tiles = None
        dos_tiles = None
        qts_tiles = None
        dots_tiles = None
        ps_tiles = None
        dss_tiles = None
    if FUSED_DQ:
        dq_stages = tlx.local_alloc((BLOCK_M, DQ_COLUMNS), tl.float32, DQ_STAGES)
    else:
        dq_stages = None
    # tensor memory: S^T, dP^T per step, dK and dV per item, dQ per step
    s_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M), tl.float32, 1, tlx.storage_kind.tmem)
    if MX != "":  # S^T and dP^T take turns in one tile (the scaled MMAs' scale tiles take tensor memory too)
        dp_tiles = s_tiles
    else:
        dp_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M), tl.float32, 1, tlx.storage_kind.tmem)
    dk_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), tl.float32, NUM_BUFFERS_DKDV, tlx.storage_kind.tmem)
    dv_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), tl.float32, NUM_BUFFERS_DKDV, tlx.storage_kind.tmem)
    if FUSED_DQ:
        dq_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), tl.float32, 1, tlx.storage_kind.tmem)
    else:
        dq_tiles = None

    kv_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)  # TMA bytes of K and V
    kv_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)  # commit after the item's last MMA
    qdo_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=1)  # TMA bytes
    # the step's dK MMA (the slot's last tensor-core reader) and the compute (done with the statistics)
    qdo_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=2)
    s_fulls = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # S^T MMA completed
    s_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # compute has read S^T
    dp_fulls = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # dP^T MMA completed
    dp_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # compute has read dP^T
    p_fulls = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # compute stored P^T (fenced)
    p_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # dV MMA completed
    ds_fulls = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # compute stored dS^T (fenced)
    if PAIR and FUSED_DQ:  # dS^T's readers: the pair's dK (2-CTA) and this CTA's dQ, issued by different CTAs
        ds_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=2)
    else:
        ds_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # dS^T's last MMA (dQ, or dK) completed
    dq_fulls = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # dQ MMA completed
    dq_empties = tlx.alloc_barriers(num_barriers=1, arrive_count=1)  # the dQ partition has read dQ
    dkdv_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DKDV, arrive_count=1)  # commit after the last MMA
    if PAIR:  # both epilogues arrive on the leader's; the leader waits for both CTAs' P^T / dS^T
        dkdv_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DKDV, arrive_count=2)
        p_pairs = tlx.alloc_barriers(num_barriers=1, arrive_count=2)
        ds_pairs = tlx.alloc_barriers(num_barriers=1, arrive_count=2)
        tlx.cluster_barrier()  # both CTAs' barriers initialised before either arrives on its partner's
    else:
        dkdv_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DKDV, arrive_count=1)  # the epilogue read dK, dV
        p_pairs = None
        ds_pairs = None
    if MX != "":  # the scales partition has stored a slot's E8M0 scales (the TMA bytes land on kv_fulls / qdo_fulls)
        kvs_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
        qdos_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=1)
    else:
        kvs_fulls = None
        qdos_fulls = None

    with tlx.async_tasks():
        # ---------------------------------------------------------------- dQ: tensor memory -> TMA reduce-add
        with tlx.async_task("default"):
            if FUSED_DQ:
                step_cnt = 0
                for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0) // CTAS)):
                    item = static_item(rounds, tl.program_id(0) // CTAS, tl.num_programs(0) // CTAS, True)
                    if item < num_items:
                        step_cnt = _dq_item(item, step_cnt, dq_tiles, dq_stages, dq_fulls, dq_empties, desc_dq, TILES,
                                            CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, sm_scale, CAUSAL,
                                            BROADCAST_Q, HEAD_DIM, BLOCK_N, BLOCK_M, DQ_COLUMNS, DQ_STAGES, PAIR)
                tlx.async_descriptor_store_wait(0)  # shared memory must outlive the last reduce-add's read
            elif MX != "":  # ------------------------------------------ MX builds: the E8M0 scales of every fill
                kv_cnt = 0
                qdo_cnt = 0
                for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0))):
                    item = static_item(rounds, tl.program_id(0), tl.num_programs(0), True)
                    if item < num_items:
                        kv_cnt, qdo_cnt = _scales_item(
                            item, kv_cnt, qdo_cnt, ks_tiles, vs_tiles, qs_tiles, dos_tiles, qts_tiles, dots_tiles,
                            kvs_fulls, kv_empties, qdos_fulls, qdo_empties, QS, QTS, QB_OFF, KS, VS, DOS, DOTS, OB_OFF,
                            TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, GROUP, BROADCAST_Q,
                            HEAD_DIM, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_KV)

        # ---------------------------------------------------------------- compute: P^T, dS^T, dK/dV epilogue
        with tlx.async_task(num_warps=_COMPUTE_WARPS, registers=COMPUTE_REGS):
            qk_scale = sm_scale * 1.4426950408889634  # log2(e): the statistics are in base 2
            kv_cnt = 0
            qdo_cnt = 0
            step_cnt = 0
            for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0) // CTAS)):
                item = static_item(rounds, tl.program_id(0) // CTAS, tl.num_programs(0) // CTAS, True)
                if item < num_items:
                    kv_cnt, qdo_cnt, step_cnt = _compute_item(
                        item, kv_cnt, qdo_cnt, step_cnt, s_tiles, dp_tiles, p_tiles, ds_tiles, dk_tiles, dv_tiles,
                        lse_tiles, delta_tiles, qdo_fulls, qdo_empties, s_fulls, s_empties, dp_fulls, dp_empties,
                        p_fulls, p_empties, ds_fulls, ds_empties, dkdv_fulls, dkdv_empties, DK, DV, TILES, CU_Q, CU_K,
                        stride_dkt, stride_dkh, stride_dvt, stride_dvh, num_slots, num_heads, num_seqs, len_q_bcast,
                        sm_scale, qk_scale, CAUSAL, BROADCAST_Q, HEAD_DIM, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO,
                        NUM_BUFFERS_DKDV, EPILOGUE_SLICES, DTYPE, PAIR, ps_tiles, dss_tiles, w_tiles, MX)

        # ---------------------------------------------------------------- MMA issuer
        with tlx.async_task(num_warps=_SINGLE_WARP, registers=ISSUER_REGS):
            kv_cnt = 0
            qdo_cnt = 0
            step_cnt = 0
            for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0) // CTAS)):
                item = static_item(rounds, tl.program_id(0) // CTAS, tl.num_programs(0) // CTAS, True)
                if item < num_items:
                    kv_cnt, qdo_cnt, step_cnt = _mma_item(
                        item, kv_cnt, qdo_cnt, step_cnt, k_tiles, v_tiles, q_tiles, do_tiles, p_tiles, ds_tiles,
                        s_tiles, dp_tiles, dk_tiles, dv_tiles, dq_tiles, kv_fulls, kv_empties, qdo_fulls, qdo_empties,
                        s_fulls, s_empties, dp_fulls, dp_empties, p_fulls, p_empties, ds_fulls, ds_empties, dq_fulls,
                        dq_empties, dkdv_fulls, dkdv_empties, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs,
                        len_q_bcast, CAUSAL, BROADCAST_Q, FUSED_DQ, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_KV,
                        NUM_BUFFERS_DKDV, p_pairs, ds_pairs, HEAD_DIM, PAIR, qt_tiles, dot_tiles, ks_tiles, vs_tiles,
                        qs_tiles, dos_tiles, qts_tiles, dots_tiles, ps_tiles, dss_tiles, kvs_fulls, qdos_fulls, MX)

        # ---------------------------------------------------------------- TMA loads
        with tlx.async_task(num_warps=_SINGLE_WARP, registers=ISSUER_REGS):
            kv_cnt = 0
            qdo_cnt = 0
            for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0) // CTAS)):
                item = static_item(rounds, tl.program_id(0) // CTAS, tl.num_programs(0) // CTAS, True)
                if item < num_items:
                    kv_cnt, qdo_cnt = _load_item(
                        item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, k_tiles, v_tiles, q_tiles,
                        do_tiles, lse_tiles, delta_tiles, kv_fulls, kv_empties, qdo_fulls, qdo_empties, TILES, CU_Q,
                        CU_K, STATS_CU, num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k,
                        col_stride_v, col_stride_do, CAUSAL, GROUP, BROADCAST_Q, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO,
                        NUM_BUFFERS_KV, KV_BYTES, QDO_BYTES, HEAD_DIM, PAIR, desc_qt, desc_dot, qt_tiles, dot_tiles,
                        MX)
    if PAIR:  # neither CTA leaves while its partner may still arrive on its barriers or run MMAs on its memory
        tlx.cluster_barrier()


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------
def supports(q: torch.Tensor, dout: Optional[torch.Tensor] = None, *, k: Optional[torch.Tensor] = None,
             v: Optional[torch.Tensor] = None) -> tuple[bool, str]:
    """Whether the Blackwell dK/dV kernel can take these tensors (dtype, head dim, an sm_100 launch target,
    TMA layout), and why not. Read at call time only."""
    return check_inputs({"q": q, "k": k, "v": v, "grad of out": dout}, dtype=q.dtype, head_dim=q.shape[-1],
                        head_dims=SUPPORTED_HEAD_DIMS, capability=CAPABILITY)


def _constexprs(cfg: BlackwellDkDvConfig, head_dim: int, *, causal: bool, broadcast_q: bool, fused_dq: bool,
                group: int = 1, mx: str = "") -> dict:
    """The compile-time arguments of one launch (shared by the launcher and the offline compile gate); outside an
    MXFP8 build (``mx``: its rule) the MX operands (``MX_ARGS``) are None, constexprs."""
    constants = dict(PAIR=cfg.cta_pair,
                     HEAD_DIM=head_dim, CAUSAL=causal, GROUP=group, BROADCAST_Q=broadcast_q, FUSED_DQ=fused_dq,
                     BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, NUM_BUFFERS_QDO=cfg.num_buffers_qdo,
                     NUM_BUFFERS_KV=cfg.num_buffers_kv, NUM_BUFFERS_DKDV=cfg.num_buffers_dkdv,
                     DQ_COLUMNS=cfg.dq_columns, DQ_STAGES=cfg.dq_stages, COMPUTE_REGS=cfg.compute_regs,
                     EPILOGUE_SLICES=cfg.epilogue_slices, MX=mx,
                     SCALE_TILES=bool(mx) and mx_scale_tiles(cfg, head_dim) == {scaled_mma.SCALE_TILE})
    if not mx:
        constants.update({name: None for name in MX_ARGS})
    return constants


def _launch_options(cfg: Optional[BlackwellDkDvConfig] = None) -> dict:
    # num_warps: the default (dQ) partition; the others add 4 + 1 + 1 warps (10 in all). num_stages=1: the
    # pipelining is explicit (mbarrier rings), Triton's own pipeliner stays off. The 2-CTA build launches
    # clusters of two CTAs (uTLX's ctas_per_cga: the grid counts CTAs).
    if cfg is not None and cfg.cta_pair:
        return dict(num_warps=DQ_WARPS, num_stages=1, ctas_per_cga=(2, 1, 1))
    return dict(num_warps=DQ_WARPS, num_stages=1)


def compile_spec(dtype: str, head_dim: int, *, causal: bool, broadcast_q: bool, fused_dq: bool = True,
                 group: int = 1, cta_pair: bool = False, mx: str = ""):
    """``(kernel, signature, constants, attrs, options)`` for an offline ``triton.compile`` of one config
    (the compile gate); with ``group`` > 1 dK and dV are the fp32 partials per query head. Without the fused
    dQ the launcher passes desc_q in desc_dq's place (never read). ``cta_pair``: the 2-CTA build (compiled with
    ``num_ctas=2``, the compile-time form of a launch's ``ctas_per_cga=(2, 1, 1)``). ``mx``: the MXFP8 build with
    this rule (E4M3 inputs, no fused dQ; ``dtype`` is the gradients')."""
    cfg = config_for(head_dim, cta_pair, mx)
    fused_dq = fused_dq and not mx
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, fused_dq=fused_dq, group=group,
                            mx=mx)
    grad = "fp32" if group > 1 else dtype
    box_width = head_dim // 2 if cta_pair else head_dim  # the 2-CTA build loads half-width boxes
    elements = "fp8e4nv" if mx else dtype
    tiles = (("q", cfg.block_m), ("do", cfg.block_m), ("k", cfg.block_n), ("v", cfg.block_n))
    if mx:
        tiles += (("qt", cfg.block_m), ("dot", cfg.block_m))
    types = {f"desc_{x}": f"tensordesc<{elements}[{rows}, {box_width}]>" for x, rows in tiles}
    types.update(desc_stats=f"tensordesc<fp32[1, {cfg.block_m}]>",
                 desc_dq=f"tensordesc<fp32[{cfg.block_m}, {constants['DQ_COLUMNS']}]>" if fused_dq else
                 f"tensordesc<{elements}[{cfg.block_m}, {head_dim}]>",
                 DK=f"*{grad}", DV=f"*{grad}", CU_Q="*i32", CU_K="*i32", STATS_CU="*i64", TILES="*i32",
                 sm_scale="fp32")
    if mx:
        types.update({name: "*u8" for name in ("QS", "QTS", "KS", "VS", "DOS", "DOTS")}, QB_OFF="*i32",
                     OB_OFF="*i32")
    signature, attrs = offline_signature(jagged_dkdv_blackwell_kernel, constants, types)
    options = _launch_options()
    if cta_pair:
        options["num_ctas"] = 2
    return jagged_dkdv_blackwell_kernel, signature, constants, attrs, options


def _dq_descriptor(dq_accum: torch.Tensor, cfg: BlackwellDkDvConfig):
    """A TMA descriptor over the accumulator as [T, H * D] whose box is one reduce-add: ``block_m`` rows and
    ``dq_columns`` columns (head h starts at column h * D: it is contiguous, like q)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    desc, _ = descriptor(dq_accum, cfg.block_m)
    return TensorDescriptor(desc.base, shape=desc.shape, strides=desc.strides,
                            block_shape=[cfg.block_m, cfg.dq_columns])


def kernel_arguments(q, k, v, dout, stats, stats_cu, dq_accum, dk, dv, out_cu, cu_k, tiles, *, causal: bool,
                     softmax_scale: float, broadcast_q: bool, num_seqs: int,
                     len_q_bcast: int, cta_pair: bool = False, mx=None) -> tuple[tuple, dict, int]:
    """(positional args, keyword args, number of work items) of one launch; ``dq_accum``: the fp32
    accumulator shaped like q (contiguous), or None for a build without the fused dQ; ``dk``, ``dv``: what
    the kernel writes (fp32 partials per query head with grouped key/value heads); ``cta_pair``: the 2-CTA
    build (``tiles`` then lists pairs of key tiles). ``mx``: an MXFP8 launch's ``(rule, Q along queries, dO along
    queries, QS, QTS, QB_OFF, KS, VS, DOS, DOTS, OB_OFF)`` (E4M3 data: q, k, v, dout along D and the two along
    queries; the E8M0 scales; the query-axis operands' first scale rows per sequence, int32). Touches no GPU."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    rule = mx[0] if mx is not None else ""
    cfg = config_for(head_dim, cta_pair, rule)
    width = head_dim // 2 if cfg.cta_pair else head_dim  # the 2-CTA build loads half-width boxes
    desc_q, col_q = descriptor(q, cfg.block_m, width)
    desc_do, col_do = descriptor(dout, cfg.block_m, width)
    desc_k, col_k = descriptor(k, cfg.block_n, width)
    desc_v, col_v = descriptor(v, cfg.block_n, width)
    # (the kernel places head h of the accumulator at column h * D: it is contiguous, like q)
    desc_dq = desc_q if dq_accum is None else _dq_descriptor(dq_accum, cfg)
    num_items = tiles.num_slots * num_heads
    cu_q = cu_k if broadcast_q else out_cu  # never read for a broadcast Q; cu_k keeps one pointer type
    args = (desc_q, desc_k, desc_v, desc_do, stats_descriptor(stats, cfg.block_m), desc_dq, dk, dv, cu_q, cu_k,
            stats_cu, tiles.tiles, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), col_q, col_k, col_v,
            col_do, num_items, tiles.num_slots, num_seqs, num_heads, len_q_bcast, softmax_scale)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, fused_dq=dq_accum is not None,
                            group=num_heads // k.shape[1], mx=rule)
    if mx is not None:
        desc_qt, _c = descriptor(mx[1], cfg.block_m)
        desc_dot, _c = descriptor(mx[2], cfg.block_m)
        constants.update(zip(MX_ARGS, (desc_qt, desc_dot, *mx[3:])))
    return args, {**constants, **_launch_options(cfg)}, num_items


def jagged_dkdv_blackwell(q, k, v, dout, lse, delta, dk, dv, out_cu, cu_k, *, causal: bool, softmax_scale: float,
                          broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dq_accum=None, outputs=None,
                          window=(-1, -1), cta_pair: Optional[bool] = None) -> None:
    """Write dK and dV (``dk``, ``dv``: like k, v); the signature of ``hopper.backward.jagged_dkdv_tlx`` (the
    portable backward's ``dkdv`` hook). ``delta``: rowsum(dO * O) - dlse per output row and head, or None with
    ``outputs=(out, dout, dlse or None)`` to compute it in the statistics' pass. ``dq_accum``: a zeroed fp32
    tensor shaped like q (contiguous) into which the kernel reduce-adds every step's dQ (the order of the
    additions varies from run to run), or None. Raises ValueError when ``supports`` says no or for a sliding
    window. ``cta_pair``: the 2-CTA build (clusters of two CTAs, a pair of adjacent key tiles an item, dK and dV
    as 2-CTA MMAs); None: the launch target's choice (``LaunchTarget.cta_pair_backward``: a simulator asked for
    it; no GPU target, docs/blackwell.md says why)."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    if cta_pair is None:
        t = target.target_for(q.device)
        cta_pair = t is not None and t.cta_pair_backward
    ok, reason = supports(q, dout, k=k, v=v)
    if not ok:
        raise ValueError(f"jagged_dkdv_blackwell: {reason}")
    causal, banded, _lo, _hi = window_band(causal, tuple(window))
    if banded:
        raise ValueError(f"jagged_dkdv_blackwell: window_size {tuple(window)} (no sliding-window build)")
    if dq_accum is not None and (dq_accum.shape != q.shape or dq_accum.dtype != torch.float32
                                 or not dq_accum.is_contiguous()):
        raise ValueError("jagged_dkdv_blackwell: dq_accum must be a contiguous float32 tensor shaped like q")
    if k.shape[0] == 0 or q.shape[0] == 0 or dout.shape[0] == 0 or num_heads == 0 or num_seqs == 0:
        dk.zero_()  # no query or no key anywhere: zero gradients (and TMA cannot describe an empty tensor)
        dv.zero_()
        return
    cfg = config_for(head_dim, cta_pair)
    span = 2 * cfg.block_n if cfg.cta_pair else cfg.block_n  # a work item's key rows
    tiles = build_tile_list(cu_k, k.shape[0], span, work_offsets=None if broadcast_q else out_cu)
    stats, stats_cu = row_stats(lse, delta, out_cu, num_seqs, outputs=outputs)
    group = num_heads // k.shape[1]
    dk_out, dv_out = dk, dv
    if group > 1:  # per query head partials (every row of every head written: no zeroing), summed below
        dk = alloc.empty((k.shape[0], num_heads, head_dim), torch.float32, k.device)
        dv = alloc.empty((v.shape[0], num_heads, head_dim), torch.float32, v.device)
    args, kwargs, num_items = kernel_arguments(q, k, v, dout, stats, stats_cu, dq_accum, dk, dv, out_cu, cu_k, tiles,
                                               causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                               num_seqs=num_seqs, len_q_bcast=len_q_bcast, cta_pair=cta_pair)
    ctas = 2 if cfg.cta_pair else 1
    grid = ctas * min(max(1, sm_count(q.device) // ctas), num_items)
    with pipeline.build_llvm_o0(jagged_dkdv_blackwell_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        target.launch(jagged_dkdv_blackwell_kernel, (grid,), q.device, *args, **kwargs)
    if group > 1:
        rows, kv_heads = k.shape[0], k.shape[1]
        dk_out.copy_(dk.view(rows, kv_heads, group, head_dim).sum(dim=2))
        dv_out.copy_(dv.view(rows, kv_heads, group, head_dim).sum(dim=2))


def jagged_backward_blackwell(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float,
                              broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None, deterministic=False,
                              window=(-1, -1), cta_pair: Optional[bool] = None):
    """The Blackwell backward (the contract of ``jfa.kernels.triton.backward.jagged_backward``): the row
    statistics' pre-pass, then this kernel for dK and dV with dQ reduce-added by the same kernel, or with
    ``deterministic`` the portable dQ pass (each row written once in a fixed order: bitwise reproducible).
    Returns (dq, dk, dv) in the inputs' dtypes; dq sums over the batch for a broadcast Q. ``cta_pair``: the
    2-CTA dK/dV build (``jagged_dkdv_blackwell``)."""
    from functools import partial

    from jfa.kernels.triton import backward as portable

    if deterministic:
        return portable.jagged_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal,
                                        softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs,
                                        len_q_bcast=len_q_bcast, dlse=dlse, window=window,
                                        dkdv=partial(jagged_dkdv_blackwell, cta_pair=cta_pair))
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    dq_accum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    # delta = rowsum(dO * O) - dlse is computed with the row statistics, in one pass (no delta tensor)
    jagged_dkdv_blackwell(q, k, v, dout, lse, None, dk, dv, out_cu, cu_k, causal=causal, softmax_scale=softmax_scale,
                          broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dq_accum=dq_accum,
                          outputs=(out, dout, dlse), window=window, cta_pair=cta_pair)
    return dq_accum.to(q.dtype), dk, dv


def mx_backward_supports(q, k, v, window=(-1, -1)) -> tuple[bool, str]:
    """Whether the MXFP8 dK/dV build runs the backward of an MXFP8 call on q, k, v (the call's high-precision
    tensors), and why not: head dim 128 on an sm_100 GPU (64 too on the TLX simulator: its build does not compile
    for sm_100a), no sliding window (causal runs)."""
    if tuple(window) not in ((-1, -1), (-1, 0)):
        return False, f"window_size {tuple(window)} (the TLX Blackwell MXFP8 backward has no windowed build)"
    head_dim = q.shape[-1]
    probe = torch.empty((0, q.shape[1], head_dim), dtype=torch.bfloat16, device=q.device)
    ok, reason = check_inputs({"q": probe}, dtype=torch.bfloat16, head_dim=head_dim,
                              head_dims=tuple(sorted(_MX_CONFIGS)), capability=CAPABILITY)
    if ok and q.device.type == "cuda" and \
            mx_scale_tiles(config_for(head_dim, mx="floor"), head_dim) != {scaled_mma.SCALE_TILE}:
        return False, (f"head_dim {head_dim}: the MXFP8 dK/dV build's scale tiles have no tcgen05.cp layout in Triton "
                       "3.8, so it compiles for the TLX simulator only (D 128 runs on the GPU)")
    return ok, reason


def mx_dkdv_blackwell(q_dim, q_tok, k_dim, v_dim, do_dim, do_tok, lse, delta, dk, dv, out_cu, cu_k, *, causal: bool,
                      softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0,
                      rule: str = "floor", keep: Optional[dict] = None) -> None:
    """Write dK and dV (``dk``, ``dv``: the inputs' shapes and dtype) of the MXFP8 backward with the ``MX`` build:
    the hook ``mx_attention.mx_backward`` calls (``dkdv=``), with the contract of the portable ``mx_dkdv_kernel``
    and the Hopper ``mx_dkdv_tlx`` (docs/mxfp8.md section 2). ``q_dim``, ``k_dim``, ``v_dim``, ``do_dim``: MXTensors
    along dim; ``q_tok``, ``do_tok``: along tokens (q by its own offsets, ``[0, Lq]`` for a broadcast Q; dO by the
    output rows' ``out_cu``); ``delta`` = rowsum(dO O) - dlse ``[rows, H]``. Grouped key/value heads: fp32 partials
    per query head, summed here. ``keep``: a dict that receives the launch's (args, kwargs, grid) (tests)."""
    if rule not in MX_RULES:
        raise ValueError(f"rule: must be one of {MX_RULES}, got {rule!r}")
    head_dim, num_heads = q_dim.shape[-1], q_dim.shape[1]
    if k_dim.shape[0] == 0 or delta.shape[0] == 0 or num_heads == 0 or num_seqs == 0:
        dk.zero_()  # no query or no key anywhere: zero gradients (and TMA cannot describe an empty tensor)
        dv.zero_()
        return
    cfg = config_for(head_dim, mx=rule)
    tiles = build_tile_list(cu_k, k_dim.shape[0], cfg.block_n, work_offsets=None if broadcast_q else out_cu)
    stats, stats_cu = row_stats(lse, delta, out_cu, num_seqs)
    group = num_heads // k_dim.shape[1]
    dk_out, dv_out = dk, dv
    if group > 1:  # per query head partials (every row of every head written: no zeroing), summed below
        dk = alloc.empty((k_dim.shape[0], num_heads, head_dim), torch.float32, dk.device)
        dv = alloc.empty((k_dim.shape[0], num_heads, head_dim), torch.float32, dv.device)
    data = [_tma_ready(t.data) for t in (q_dim, k_dim, v_dim, do_dim, q_tok, do_tok)]
    offsets = [t.block_offsets.to(torch.int32) for t in (q_tok, do_tok)]
    mx = (rule, data[4], data[5], q_dim.scales.contiguous(), q_tok.scales.contiguous(), offsets[0],
          k_dim.scales.contiguous(), v_dim.scales.contiguous(), do_dim.scales.contiguous(), do_tok.scales.contiguous(),
          offsets[1])
    args, kwargs, num_items = kernel_arguments(*data[:4], stats, stats_cu, None, dk, dv, out_cu, cu_k, tiles,
                                               causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                               num_seqs=num_seqs, len_q_bcast=len_q_bcast, mx=mx)
    grid = min(sm_count(dk.device), num_items)
    if keep is not None:
        keep.update(args=args, kwargs=kwargs, grid=grid)
    with pipeline.build_llvm_o0(jagged_dkdv_blackwell_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        target.launch(jagged_dkdv_blackwell_kernel, (grid,), dk.device, *args, **kwargs)
    if group > 1:
        rows, kv_heads = k_dim.shape[0], k_dim.shape[1]
        dk_out.copy_(dk.view(rows, kv_heads, group, head_dim).sum(dim=2))
        dv_out.copy_(dv.view(rows, kv_heads, group, head_dim).sum(dim=2))


def mx_backward_blackwell(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float,
                          broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, window=(-1, -1), rule: str = "floor",
                          dlse=None):
    """The MXFP8 backward with dK and dV on this kernel's ``MX`` build (``mx_dkdv_blackwell``) and dQ on the portable
    MX dQ pass: the contract of ``jfa.kernels.triton.mx_attention.mx_backward`` (which quantizes the operands and
    runs the dQ pass), bitwise reproducible (no atomics). Raises ValueError where ``mx_backward_supports`` says
    no."""
    from jfa.kernels.triton import mx_attention

    ok, reason = mx_backward_supports(q, k, v, window)
    if not ok:
        raise ValueError(f"mx_backward_blackwell: {reason}")
    return mx_attention.mx_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale,
                                    broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast,
                                    window=window, rule=rule, dlse=dlse, dkdv=mx_dkdv_blackwell)
