"""Jagged FlashAttention forward for Blackwell (sm_100a) in TLX: persistent, warp-specialised, tcgen05 MMA
with the accumulators in tensor memory.

Same contract as the Hopper forward (``jfa.kernels.tlx.hopper.forward.jagged_forward_tlx``) and the portable
one: ``out [rows, H, D]`` in q's dtype, ``lse [rows, H]`` float32 (natural log); rows that see no key give
``out = 0`` and ``lse = -inf``; causal masks are bottom-right aligned (query i of (Lq, Lk) sees keys
j <= i + Lk - Lq); broadcast-Q output rows are ``b * Lq + i``; query head h reads key/value head
``h // GROUP``.

Shape of the kernel (the roles of the TLX tutorial ``blackwell_fa_ws_pipelined_persistent``):

* Persistent CTAs, two schedules (``CLC``). The CLC build, scheduled by cluster launch control: the grid has
  one CTA per work item (tile-list slot, head; decoded by ``common.device.item_sequence``), the item of
  program id ``i`` being the ``i``-th of the longest-first tile list. Each CTA works the item of its own
  program id, then asks CLC to cancel a CTA that has not started yet and works that CTA's item instead, until
  the answer is -1 (every CTA has started or been claimed). The hardware starts CTAs in program-id order and a
  try_cancel claims the next one, so the heaviest items still go first while the load balances itself. The
  correction partition issues each try_cancel when it starts an item (the request is in flight while the item
  runs); all five partitions read the answer (``_NEXT_ITEM_READERS``) when they finish the item, and the last
  of them hands the response slot back for the next request. The static build (what a GPU runs while the
  toolchain does not lower CLC, ``common.target.TOOLCHAIN_LOWERS_CLC``): one CTA per SM deals the items
  zig-zag (``common.device.static_item``), as on Hopper.
* A work item is ``NUM_GROUPS * block_m`` query rows: two groups of ``block_m`` rows (one tcgen05 M each),
  whose softmaxes run in two warpgroups while the tensor core works on the other group.
* Five partitions per CTA, one mbarrier protocol between each pair:

  - load (1 warp): TMA of both groups' Q once per item, then K(j), V(j) alternately through one ring of
    ``num_buffers_kv`` shared-memory tiles;
  - MMA (1 warp, the only tcgen05 issuer): ``S_g = Q_g K(j)^T`` into tensor memory, then ``O_g += P_g V(j-1)``
    (P from shared memory), so QK^T of block j overlaps the softmax of block j - 1; every MMA completes on
    mbarriers (its consumers' and the ring slot's), ``tcgen05_commit`` hands Q back after the item's last
    QK^T;
  - softmax (2 warpgroups, one per group): S from tensor memory, online softmax in base 2 (exp2), P to
    shared memory (fenced for the async proxy), and one row vector per PV to the correction: the
    rescale ``alpha = exp2(m_old - m_new)`` after each PV but the item's last, ``1 / l`` after the last;
    it stores lse;
  - correction (the default partition, 1 warpgroup): once a PV has completed, multiplies O in tensor
    memory by that vector (column slices of ``o_slices``), and after the item's last PV stores
    ``out = O / l`` with a row mask; each time it hands O back to the MMA for the next PV.

* Loop peeling: the softmax runs the blocks every row of its group fully sees without any mask, then
  the causal diagonal and the sequence's partial last block through the masked step.
* Jagged tails without padding: TMA reads the packed tensors as 2-D views (``common.host.descriptor``), so
  a tile may read rows of the next sequence (or zeros past the tensor's end). Key rows past the
  sequence are masked to -inf before the softmax (their P is exactly 0); query rows past it are computed
  and never stored (out and lse stores are row-masked against the tile's own sequence).

Divergence from the portable kernel, as on Hopper: a key block straddling a sequence end multiplies P = 0
by V rows of the next sequence, so an inf/NaN there reaches this sequence's output.

Supported: bf16 and fp16, head dims 64 and 128, grouped key/value heads; no sliding window (``supports``).

MXFP8 (``MX`` builds, :func:`mx_forward_blackwell`; docs/mxfp8.md section 2, the portable MX kernel's semantics):
E4M3 Q, K, V by TMA and both products on the block-scaled tcgen05 MMA, Q's and K's E8M0 scales along D, P's and
V's along keys. The softmax quantizes P with the step every MX kernel shares (``weight_blocks``: an integer running
maximum, power-of-two rescales) and stores its E4M3 elements and scales; the correction warpgroup loads every
tile's scales (masked to the sequence) beside the load warp's TMA (``_fill_item_scales``). At D 128 the groups take
turns in one S (``s_buffers``: Triton's scale tiles take tensor memory too). Causal runs, no sliding window
(``mx_supports``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.bands import window_band
from jfa.kernels.schedule import build_tile_list
from jfa.kernels.tlx import pipeline
from jfa.kernels.tlx.common import scaled_mma, target
from jfa.kernels.tlx.common.device import bufidx_phase, item_sequence, online_softmax_step, static_item
from jfa.kernels.tlx.common.host import check_inputs, descriptor, offline_signature, sm_count, tlx
from jfa.kernels.triton.mx_attention import _ldexp, pow2_step, visible_keys, weight_blocks


# ----------------------------------------------------------------------------------------------------
# Configs, as data. One row per head dim; the same row serves bf16 and fp16 (same bytes, same MMA).
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlackwellForwardConfig:
    block_m: int  # query rows per softmax group (the tcgen05 M); a work item is NUM_GROUPS * block_m rows
    block_n: int  # key rows per K or V tile (the N of QK^T, the K of PV)
    num_buffers_q: int  # Q tiles per group: > 1 lets the load partition fetch the next item's Q early
    num_buffers_kv: int  # tiles of the K/V ring (K(j) and V(j) take turns in it)
    softmax_regs: int  # setmaxnreg of each softmax warpgroup (S is 128 fp32 a thread; at 192 the D 64 builds
    # spilled 16 B: ptxas's choice, the gate measures it)
    o_slices: int  # column slices the correction moves O through: 32 fp32 per row (its warpgroup has what
    # the other partitions leave: 96 registers a thread)
    # the build's LLVM IR left to ptxas (pipeline.build_llvm_o0): LLVM hoists the CTA's and the lanes' indices
    # to the kernel's entry, ahead of every partition's setmaxnreg, and ptxas spills them (12 bytes)
    llvm_o0: bool = True
    s_buffers: int = 2  # S tiles in tensor memory: one per group, or one both groups take turns in


NUM_GROUPS = 2  # softmax warpgroups, one per block_m-row group of a work item
SOFTMAX_WARPS = 4  # one warpgroup: 128 threads, one query row each (tcgen05.ld lane = row)
CORRECTION_WARPS = 4  # the default partition
SINGLE_WARP = 1  # the load and MMA partitions: one thread issues everything
_GROUPS = tl.constexpr(NUM_GROUPS)
_SOFTMAX_WARPS = tl.constexpr(SOFTMAX_WARPS)
_SINGLE_WARP = tl.constexpr(SINGLE_WARP)
# setmaxnreg of the load and MMA partitions (a few scalars). The register file: 2 x 128 threads x 184 (softmax)
# + 128 x 48 (the two single-warp partitions share one warpgroup's allocation) + 128 x 96 (what is left to the
# correction) = 65536.
ISSUER_REGS = tl.constexpr(48)
# the partitions that read each CLC answer (the next work item): correction, the softmax groups, MMA, load
_NEXT_ITEM_READERS = tl.constexpr(1 + NUM_GROUPS + 2)

_CONFIGS: dict[int, BlackwellForwardConfig] = {
    # D 64. Tensor memory: S 2 x 128 columns + O 2 x 64 = 384 of 512. Shared memory: Q 2 groups x 2 x 16 KB
    # (the next item's Q in flight) + K/V ring 4 x 16 KB + P 2 x 32 KB = 192 KB of 227 KB.
    64: BlackwellForwardConfig(block_m=128, block_n=128, num_buffers_q=2, num_buffers_kv=4, softmax_regs=184,
                               o_slices=2),
    # D 128. Tensor memory: S 2 x 128 + O 2 x 128 = 512 columns, all of them. Shared memory: Q 2 x 32 KB +
    # K/V ring 2 x 32 KB + P 2 x 32 KB = 192 KB (195 KB with barriers and scratch); a third K/V tile would
    # take it to 232636 B, past the SM's 232448.
    128: BlackwellForwardConfig(block_m=128, block_n=128, num_buffers_q=1, num_buffers_kv=2, softmax_regs=184,
                                o_slices=4),
}

# MXFP8 builds (``MX``): E4M3 tiles are half the bytes, so the rings deepen; E8M0 scales live in shared memory
# beside their tiles (Q, K: [rows, D / 32]; V: [D, block_n / 32]; P: [block_m, block_n / 32]), a few KB. D 64: Q 2 x 2 x 8 KB + K/V 4 x 8 KB + P 2 x 16 KB = 96 KB; D 128: Q 2 x 2 x
# 16 KB + K/V 4 x 16 KB + P 2 x 16 KB = 160 KB.
_MX_CONFIGS: dict[int, BlackwellForwardConfig] = {
    64: BlackwellForwardConfig(block_m=128, block_n=128, num_buffers_q=2, num_buffers_kv=4, softmax_regs=184,
                               o_slices=2),
    # D 128: Triton gives each block-scaled MMA's two scale tiles tensor memory of their own (16 tiles, 64 columns)
    # beside S and O, so the groups take turns in one S: 128 + O 2 x 128 + 64 = 448 of 512 columns
    128: BlackwellForwardConfig(block_m=128, block_n=128, num_buffers_q=2, num_buffers_kv=4, softmax_regs=184,
                                o_slices=4, s_buffers=1),
}
MX_RULES = ("floor", "rceil")

SUPPORTED_HEAD_DIMS = tuple(sorted(_CONFIGS))
CAPABILITY = (10, 0)
# the shared layout of an MX build's scale tiles where they are all scaled_mma.SCALE_TILE (tcgen05.cp's)
_SCALE_LAYOUT = tl.constexpr(scaled_mma.scale_layout())


def config_for(head_dim: int, mx: str = "") -> BlackwellForwardConfig:
    """The config of a build: bf16/fp16 (``mx=""``) or MXFP8 (``mx`` the P rule)."""
    return (_MX_CONFIGS if mx else _CONFIGS)[head_dim]


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _work_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL: tl.constexpr,
               BROADCAST_Q: tl.constexpr, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(head, q_row0, out_row0, len_q, k_row0, len_k, m_start, causal_shift, n_blocks) of work item ``item``,
    computed identically by every partition (they must agree on the number of K/V blocks, or the
    mbarrier phases drift). The item's K/V blocks are 0 .. n_blocks - 1; a spare slot has n_blocks 0."""
    head, tile, q_row0, out_row0, len_q, k_row0, len_k = item_sequence(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, BROADCAST_Q)
    m_start = tile * TILE_M
    causal_shift = len_k - len_q  # bottom-right alignment: row i sees keys j <= i + Lk - Lq
    if CAUSAL:
        # keys up to the last real row of the tile (its rows past Lq need none)
        kv_end = tl.maximum(tl.minimum(m_start + TILE_M, len_q) + causal_shift, 0)
    else:
        kv_end = len_k
    n_blocks = tl.cdiv(tl.minimum(kv_end, len_k), BLOCK_N)
    return head, q_row0, out_row0, len_q, k_row0, len_k, m_start, causal_shift, n_blocks


# ---- load partition ----------------------------------------------------------------------------------
@triton.jit
def _load_tile(desc, tiles, fulls, empties, count, row, col, NUM_BUFFERS: tl.constexpr, BYTES: tl.constexpr):
    """TMA of one box into the ring's next slot once the MMA that read its last fill has completed."""
    buf, phase = bufidx_phase(count, NUM_BUFFERS)
    tlx.barrier_wait(empties[buf], phase ^ 1)
    tlx.barrier_expect_bytes(fulls[buf], BYTES)
    tlx.async_descriptor_load(desc, tiles[buf], [row, col], fulls[buf])
    return count + 1


@triton.jit
def _dim_scales(SCALES, row0, rows_valid, head, num_heads, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """E8M0 bytes ``[ROWS, HEAD_DIM // 32]`` of rows ``row0 ..`` of a D-axis operand's scales (``[T, heads, D / 32]``,
    contiguous) at ``head``; rows from ``rows_valid`` on (past the sequence) read nothing and hold 127 (2^0)."""
    NB: tl.constexpr = HEAD_DIM // 32
    rows = tl.arange(0, ROWS)
    ptrs = SCALES + ((row0 + rows).to(tl.int64) * num_heads + head)[:, None] * NB + tl.arange(0, NB)[None, :]
    return tl.load(ptrs, mask=(rows < rows_valid)[:, None], other=127)


@triton.jit
def _token_scales(SCALES, scale_row0, n_start, len_k, head, num_heads, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr):
    """E8M0 bytes ``[HEAD_DIM, BLOCK_N // 32]`` of V's token-axis scales (``[rows, heads, D]``, contiguous) for keys
    ``n_start ..`` of the sequence whose first scale row is ``scale_row0``, transposed to the B-operand scale
    layout of PV (one row per output column d, one byte per 32 keys). Blocks from ``len_k`` on read nothing
    and hold 127."""
    blocks = n_start // 32 + tl.arange(0, BLOCK_N // 32)
    cols = tl.arange(0, HEAD_DIM)
    ptrs = SCALES + ((scale_row0 + blocks).to(tl.int64) * num_heads + head)[None, :] * HEAD_DIM + cols[:, None]
    return tl.load(ptrs, mask=(blocks * 32 < len_k)[None, :], other=127)


@triton.jit
def _load_item(item, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles, kv_tiles, q_fulls, q_empties, kv_fulls,
               kv_empties, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q,
               col_stride_k, col_stride_v, CAUSAL: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr,
               TILE_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
               NUM_BUFFERS_KV: tl.constexpr, Q_BYTES: tl.constexpr, KV_BYTES: tl.constexpr):
    """Load partition, one work item: both groups' Q, then K(0), V(0), K(1), V(1), ... through the ring."""
    head, q_row0, _o, _lq, k_row0, _lk, m_start, _cs, n_blocks = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N)
    if n_blocks > 0:
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        for g in tl.static_range(_GROUPS):
            tlx.barrier_wait(q_empties[g * NUM_BUFFERS_Q + q_buf], q_phase ^ 1)
            tlx.barrier_expect_bytes(q_fulls[g * NUM_BUFFERS_Q + q_buf], Q_BYTES)
            tlx.async_descriptor_load(desc_q, q_tiles[g * NUM_BUFFERS_Q + q_buf],
                                      [q_row0 + m_start + g * BLOCK_M, head * col_stride_q],
                                      q_fulls[g * NUM_BUFFERS_Q + q_buf])
        k_col = (head // GROUP) * col_stride_k  # grouped-query attention: the query head's key/value head
        v_col = (head // GROUP) * col_stride_v
        for j in tl.range(0, n_blocks):
            kv_cnt = _load_tile(desc_k, kv_tiles, kv_fulls, kv_empties, kv_cnt, k_row0 + j * BLOCK_N, k_col,
                                NUM_BUFFERS_KV, KV_BYTES)
            kv_cnt = _load_tile(desc_v, kv_tiles, kv_fulls, kv_empties, kv_cnt, k_row0 + j * BLOCK_N, v_col,
                                NUM_BUFFERS_KV, KV_BYTES)
        q_cnt += 1
    return q_cnt, kv_cnt


# ---- MMA partition ------------------------------------------------------------------------------------
@triton.jit
def _issue_qk(q_tiles, kv_tiles, s_tiles, kv_fulls, kv_empties, s_fulls, s_empties, qs_tiles, ks_tiles, kvs_fulls,
              q_buf, k_use, s_cnt, NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, MX: tl.constexpr,
              S_BUFFERS: tl.constexpr):
    """S_g = Q_g K^T for both groups, K the ring's ``k_use``-th fill. Each waits until its softmax has read
    the previous S_g; it completes on s_fulls[g], the last one also on the K slot's empty barrier (MX builds:
    ``_qk_scaled``, once K's scales are in the slot too). With one S (S_BUFFERS 1) QK^T of group g waits instead
    for the softmax that read S last: the previous group's this round, the last group's the round before."""
    k_buf, k_phase = bufidx_phase(k_use, NUM_BUFFERS_KV)
    tlx.barrier_wait(kv_fulls[k_buf], k_phase)
    if MX != "":
        tlx.barrier_wait(kvs_fulls[k_buf], k_phase)
    k_t = tlx.local_trans(kv_tiles[k_buf])
    s_phase = s_cnt & 1
    for g in tl.static_range(_GROUPS):
        if S_BUFFERS == 1:
            if g == 0:
                tlx.barrier_wait(s_empties[_GROUPS - 1], s_phase ^ 1)
            else:
                tlx.barrier_wait(s_empties[g - 1], s_phase)
        else:
            tlx.barrier_wait(s_empties[g], s_phase ^ 1)
        if MX != "":
            _qk_scaled(q_tiles[g * NUM_BUFFERS_Q + q_buf], k_t, s_tiles[g % S_BUFFERS],
                       qs_tiles[g * NUM_BUFFERS_Q + q_buf],
                       ks_tiles[k_buf], s_fulls[g], kv_empties[k_buf], g == _GROUPS - 1)
        elif g == _GROUPS - 1:
            tlx.async_dot(q_tiles[g * NUM_BUFFERS_Q + q_buf], k_t, s_tiles[g], use_acc=False,
                          mBarriers=[s_fulls[g], kv_empties[k_buf]])
        else:
            tlx.async_dot(q_tiles[g * NUM_BUFFERS_Q + q_buf], k_t, s_tiles[g], use_acc=False,
                          mBarriers=[s_fulls[g]])
    return s_cnt + 1


@triton.jit
def _qk_scaled(q, k_t, s, q_scales, k_scales, s_full, k_empty, LAST: tl.constexpr):
    """S = Q K^T as a block-scaled MMA (MX builds): E4M3 Q and K with their E8M0 scales along D (Q's per row, K's
    per key); completes on ``s_full``, the LAST group's also on the K slot's ``k_empty``."""
    if LAST:
        tlx.async_dot_scaled(q, k_t, s, q_scales, "e4m3", k_scales, "e4m3", use_acc=False, mBarriers=[s_full, k_empty])
    else:
        tlx.async_dot_scaled(q, k_t, s, q_scales, "e4m3", k_scales, "e4m3", use_acc=False, mBarriers=[s_full])


@triton.jit
def _issue_pv(kv_tiles, p_tiles, o_tiles, kv_fulls, kv_empties, p_fulls, pv_dones, o_readies, ps_tiles, vs_tiles,
              kvs_fulls, v_use, pv_cnt, use_acc, NUM_BUFFERS_KV: tl.constexpr, MX: tl.constexpr):
    """O_g (+)= P_g V for both groups, V the ring's ``v_use``-th fill, once the softmax has stored P_g and
    the correction has handed O_g back. Each completes on pv_dones[g], the last one also on the V slot's
    empty barrier. MX builds issue the block-scaled MMA, once V's scales are in the slot too: E4M3 P and V with
    their E8M0 scales along keys (P's per row and 32-key block, V's per column d and 32-key block)."""
    v_buf, v_phase = bufidx_phase(v_use, NUM_BUFFERS_KV)
    tlx.barrier_wait(kv_fulls[v_buf], v_phase)
    if MX != "":
        tlx.barrier_wait(kvs_fulls[v_buf], v_phase)
    pv_phase = pv_cnt & 1
    for g in tl.static_range(_GROUPS):
        tlx.barrier_wait(p_fulls[g], pv_phase)
        tlx.barrier_wait(o_readies[g], pv_phase ^ 1)
        if MX != "":  # block-scaled: E4M3 P and V with their E8M0 scales along keys
            if g == _GROUPS - 1:
                tlx.async_dot_scaled(p_tiles[g], kv_tiles[v_buf], o_tiles[g], ps_tiles[g], "e4m3", vs_tiles[v_buf],
                                     "e4m3", use_acc=use_acc, mBarriers=[pv_dones[g], kv_empties[v_buf]])
            else:
                tlx.async_dot_scaled(p_tiles[g], kv_tiles[v_buf], o_tiles[g], ps_tiles[g], "e4m3", vs_tiles[v_buf],
                                     "e4m3", use_acc=use_acc, mBarriers=[pv_dones[g]])
        elif g == _GROUPS - 1:
            tlx.async_dot(p_tiles[g], kv_tiles[v_buf], o_tiles[g], use_acc=use_acc,
                          mBarriers=[pv_dones[g], kv_empties[v_buf]])
        else:
            tlx.async_dot(p_tiles[g], kv_tiles[v_buf], o_tiles[g], use_acc=use_acc, mBarriers=[pv_dones[g]])
    return pv_cnt + 1


@triton.jit
def _mma_item(item, q_cnt, kv_cnt, s_cnt, pv_cnt, q_tiles, kv_tiles, p_tiles, s_tiles, o_tiles, q_fulls, q_empties,
              kv_fulls, kv_empties, s_fulls, s_empties, p_fulls, pv_dones, o_readies, qs_tiles, ks_tiles, vs_tiles,
              ps_tiles, qs_fulls, kvs_fulls, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast,
              CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr,
              NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, MX: tl.constexpr, S_BUFFERS: tl.constexpr):
    """MMA partition, one work item: QK^T(0), then per block j >= 1 QK^T(j) before PV(j - 1) (the tensor core
    computes S(j) while the softmax turns S(j - 1) into P), then PV of the last block. K(j) is the ring's
    fill kv_cnt + 2 j and V(j) the next one, in the load partition's order."""
    _h, _qr, _o, _lq, _kr, _lk, _m, _cs, n_blocks = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N)
    if n_blocks > 0:
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        for g in tl.static_range(_GROUPS):
            tlx.barrier_wait(q_fulls[g * NUM_BUFFERS_Q + q_buf], q_phase)
            if MX != "":
                tlx.barrier_wait(qs_fulls[g * NUM_BUFFERS_Q + q_buf], q_phase)
        s_cnt = _issue_qk(q_tiles, kv_tiles, s_tiles, kv_fulls, kv_empties, s_fulls, s_empties, qs_tiles, ks_tiles,
                          kvs_fulls, q_buf, kv_cnt, s_cnt, NUM_BUFFERS_Q, NUM_BUFFERS_KV, MX, S_BUFFERS)
        for j in tl.range(1, n_blocks):
            s_cnt = _issue_qk(q_tiles, kv_tiles, s_tiles, kv_fulls, kv_empties, s_fulls, s_empties, qs_tiles, ks_tiles,
                              kvs_fulls, q_buf, kv_cnt + 2 * j, s_cnt, NUM_BUFFERS_Q, NUM_BUFFERS_KV, MX, S_BUFFERS)
            pv_cnt = _issue_pv(kv_tiles, p_tiles, o_tiles, kv_fulls, kv_empties, p_fulls, pv_dones, o_readies,
                               ps_tiles, vs_tiles, kvs_fulls, kv_cnt + 2 * j - 1, pv_cnt, j > 1, NUM_BUFFERS_KV, MX)
        # every QK^T of the item is issued: Q goes back to the load partition once they have completed
        for g in tl.static_range(_GROUPS):
            tlx.tcgen05_commit(q_empties[g * NUM_BUFFERS_Q + q_buf])
        pv_cnt = _issue_pv(kv_tiles, p_tiles, o_tiles, kv_fulls, kv_empties, p_fulls, pv_dones, o_readies, ps_tiles,
                           vs_tiles, kvs_fulls, kv_cnt + 2 * n_blocks - 1, pv_cnt, n_blocks > 1, NUM_BUFFERS_KV, MX)
        kv_cnt += 2 * n_blocks
        q_cnt += 1
    return q_cnt, kv_cnt, s_cnt, pv_cnt


# ---- softmax partitions -------------------------------------------------------------------------------
@triton.jit
def _mx_softmax_update(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift, qk_scale, MASKED: tl.constexpr,
                       CAUSAL: tl.constexpr, RCEIL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """MX softmax step of one block (docs/mxfp8.md section 2): logits ``qk * qk_scale``, the integer running
    maximum and P quantized in its 32-key blocks by the step every MX kernel shares (``weight_blocks``: P's
    element bytes are the portable kernel's). Returns (P's E4M3 elements ``[BLOCK_M, BLOCK_N]``, their E8M0
    scales relative to m_new ``[BLOCK_M, BLOCK_N // 32]``, m_new, l_new, alpha = the exact ``2^(m_i - m_new)``).

    A block whose exponent falls below E8M0's range (all its weights under 448 * 2^-128 of the running
    maximum) is dropped from P and l alike; a block holding a NaN logit gets the NaN scale 0xFF. l sums each
    block's elements (exact in fp32: E4M3 values of one block) times its power of two."""
    s = qk * qk_scale
    if MASKED:
        s = tl.where(visible_keys(offs_m, n_start + tl.arange(0, BLOCK_N), len_k, causal_shift, 0, 0, CAUSAL, False),
                     s, float("-inf"))
    q, se, shift, nan, m_new = weight_blocks(s, m_i, RCEIL, BLOCK_M, BLOCK_N)
    e = se + shift  # the block's exponent relative to m_new
    kept = e >= -127
    q = tl.where(kept[:, :, None], q, 0.0)
    block_sums = _ldexp(tl.sum(q, 2), tl.maximum(e, -127))
    block_sums = tl.where(nan, float("nan"), block_sums)
    scales = tl.where(nan, 255, tl.where(kept, e + 127, 0)).to(tl.uint8)
    codes = tl.reshape(tl.where(nan[:, :, None], float("nan"), q), [BLOCK_M, BLOCK_N]).to(tl.float8e4nv)
    alpha = pow2_step(m_i, tl.where(m_new == float("-inf"), 0.0, m_new))
    l_new = l_i * alpha + tl.sum(block_sums, 1)
    return codes, scales, m_new, l_new, alpha


@triton.jit
def _send_scale(scale, scale_tiles, scale_fulls, scale_empties, index, g: tl.constexpr):
    """Softmax -> correction: the row vector that goes with PV number ``index`` of group g."""
    tlx.barrier_wait(scale_empties[g], (index & 1) ^ 1)
    tlx.local_store(scale_tiles[g], scale)
    tlx.barrier_arrive(scale_fulls[g], 1)


@triton.jit
def _softmax_block(m_i, l_i, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles, s_fulls, s_empties, p_fulls,
                   pv_dones, scale_fulls, scale_empties, n_start, offs_m, len_k, causal_shift, qk_scale,
                   g: tl.constexpr, FIRST: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   SCALE_NONNEG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr,
                   MX: tl.constexpr, S_BUFFERS: tl.constexpr):
    """One K/V block of group g: S from tensor memory (handed back at once), the softmax step, the rescale of
    the previous PV to the correction (not for the item's FIRST block), P into shared memory once the
    previous PV has read it (MX builds: P's E4M3 elements and its E8M0 scales). Returns the advanced (m_i, l_i,
    s_cnt, pv_cnt)."""
    tlx.barrier_wait(s_fulls[g], s_cnt & 1)
    qk = tlx.local_load(s_tiles[g % S_BUFFERS])
    tlx.barrier_arrive(s_empties[g], 1)
    if MX != "":
        p, p_scales, m_i, l_i, alpha = _mx_softmax_update(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift,
                                                          qk_scale, MASKED, CAUSAL, MX == "rceil", BLOCK_M, BLOCK_N)
    else:
        p, m_i, l_i, alpha = online_softmax_step(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift, qk_scale, 0, 0,
                                                 MASKED, CAUSAL, False, SCALE_NONNEG, BLOCK_N)
        p = p.to(DTYPE)  # before the waits: 16-bit P halves what the warpgroup holds while it waits (fp32 spills)
    if not FIRST:  # O holds PV(j - 1) at the old maximum: the correction rescales it before PV(j)
        _send_scale(alpha, scale_tiles, scale_fulls, scale_empties, pv_cnt - 1, g)
    tlx.barrier_wait(pv_dones[g], (pv_cnt & 1) ^ 1)  # the previous PV has read P
    tlx.local_store(p_tiles[g], p)
    if MX != "":
        tlx.local_store(ps_tiles[g], p_scales)
    tlx.fence_async_shared()  # generic-proxy stores, read by the tensor core (async proxy)
    tlx.barrier_arrive(p_fulls[g], 1)
    return m_i, l_i, s_cnt + 1, pv_cnt + 1


@triton.jit
def _seen(l_i, MX: tl.constexpr):
    """Rows that saw a key: l > 0; MX builds take l != 0, so a NaN l (a NaN operand) reaches out and lse as the
    portable MX kernel's does."""
    if MX != "":
        seen = l_i != 0.0
    else:
        seen = l_i > 0.0
    return seen


@triton.jit
def _softmax_item(item, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles, s_fulls, s_empties, p_fulls,
                  pv_dones, scale_fulls, scale_empties, LSE, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs,
                  len_q_bcast, qk_scale, g: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
                  SCALE_NONNEG: tl.constexpr, TILE_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  DTYPE: tl.constexpr, MX: tl.constexpr, S_BUFFERS: tl.constexpr):
    """Softmax of group g, one work item: the peeled first block, the unmasked bulk, the masked tail, then
    1 / l to the correction and lse (row-masked) to memory."""
    head, _qr, out_row0, len_q, _kr, len_k, m_start, causal_shift, n_blocks = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N)
    offs_m = m_start + g * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if n_blocks > 0:
        # blocks every row of this group fully sees: below the diagonal and inside Lk
        if CAUSAL:
            bulk_end = tl.minimum(len_k, tl.maximum(m_start + g * BLOCK_M + causal_shift + 1, 0))
        else:
            bulk_end = len_k
        n_bulk = bulk_end // BLOCK_N
        if n_bulk > 0:
            m_i, l_i, s_cnt, pv_cnt = _softmax_block(
                m_i, l_i, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles, s_fulls, s_empties, p_fulls, pv_dones,
                scale_fulls, scale_empties, 0, offs_m, len_k, causal_shift, qk_scale, g, True, False, CAUSAL,
                SCALE_NONNEG, BLOCK_M, BLOCK_N, DTYPE, MX, S_BUFFERS)
        else:
            m_i, l_i, s_cnt, pv_cnt = _softmax_block(
                m_i, l_i, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles, s_fulls, s_empties, p_fulls, pv_dones,
                scale_fulls, scale_empties, 0, offs_m, len_k, causal_shift, qk_scale, g, True, True, CAUSAL,
                SCALE_NONNEG, BLOCK_M, BLOCK_N, DTYPE, MX, S_BUFFERS)
        for j in tl.range(1, n_bulk):  # bulk: no mask anywhere
            m_i, l_i, s_cnt, pv_cnt = _softmax_block(
                m_i, l_i, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles, s_fulls, s_empties, p_fulls, pv_dones,
                scale_fulls, scale_empties, j * BLOCK_N, offs_m, len_k, causal_shift, qk_scale, g, False, False,
                CAUSAL, SCALE_NONNEG, BLOCK_M, BLOCK_N, DTYPE, MX, S_BUFFERS)
        for j in tl.range(tl.maximum(n_bulk, 1), n_blocks):  # tail: causal diagonal, partial last block
            m_i, l_i, s_cnt, pv_cnt = _softmax_block(
                m_i, l_i, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles, s_fulls, s_empties, p_fulls, pv_dones,
                scale_fulls, scale_empties, j * BLOCK_N, offs_m, len_k, causal_shift, qk_scale, g, False, True,
                CAUSAL, SCALE_NONNEG, BLOCK_M, BLOCK_N, DTYPE, MX, S_BUFFERS)
        # rows that saw no key have l == 0 exactly: their O is 0 (every P was 0), scaled by 1
        _send_scale(1.0 / tl.where(_seen(l_i, MX), l_i, 1.0), scale_tiles, scale_fulls, scale_empties, pv_cnt - 1, g)
    lse = tl.where(_seen(l_i, MX), (m_i + tl.math.log2(tl.where(_seen(l_i, MX), l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    out_rows = out_row0 + offs_m.to(tl.int64)
    tl.store(LSE + out_rows * num_heads + head, lse, mask=offs_m < len_q)
    return s_cnt, pv_cnt


# ---- correction partition -----------------------------------------------------------------------------
@triton.jit
def _rescale(o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones, o_readies, pv_cnt, g: tl.constexpr,
             HEAD_DIM: tl.constexpr, O_SLICES: tl.constexpr):
    """After PV number pv_cnt of group g: O_g *= alpha in tensor memory, then O_g back to the MMA."""
    tlx.barrier_wait(pv_dones[g], pv_cnt & 1)
    tlx.barrier_wait(scale_fulls[g], pv_cnt & 1)
    alpha = tlx.local_load(scale_tiles[g])
    tlx.barrier_arrive(scale_empties[g], 1)
    for s in tl.static_range(O_SLICES):
        o_slice = tlx.subslice(o_tiles[g], s * (HEAD_DIM // O_SLICES), HEAD_DIM // O_SLICES)
        tlx.local_store(o_slice, tlx.local_load(o_slice) * alpha[:, None])
    tlx.barrier_arrive(o_readies[g], 1)


@triton.jit
def _epilogue(o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones, o_readies, pv_cnt, OUT, out_row0, head,
              stride_ot, stride_oh, offs_m, len_q, g: tl.constexpr, HEAD_DIM: tl.constexpr, O_SLICES: tl.constexpr):
    """After the item's last PV of group g: out = O_g / l, row-masked pointer stores (a row past this
    sequence's Lq belongs to the next sequence), then O_g back to the MMA."""
    tlx.barrier_wait(pv_dones[g], pv_cnt & 1)
    tlx.barrier_wait(scale_fulls[g], pv_cnt & 1)
    inv_l = tlx.local_load(scale_tiles[g])
    tlx.barrier_arrive(scale_empties[g], 1)
    SLICE: tl.constexpr = HEAD_DIM // O_SLICES
    rows = (out_row0 + offs_m.to(tl.int64))[:, None] * stride_ot + head * stride_oh
    for s in tl.static_range(O_SLICES):
        o = tlx.local_load(tlx.subslice(o_tiles[g], s * SLICE, SLICE)) * inv_l[:, None]
        cols = s * SLICE + tl.arange(0, SLICE)
        tl.store(OUT + rows + cols[None, :], o.to(OUT.dtype.element_ty), mask=(offs_m < len_q)[:, None])
    tlx.barrier_arrive(o_readies[g], 1)


@triton.jit
def _fill_scales(scale_tiles, fulls, empties, count, scales, NUM_BUFFERS: tl.constexpr):
    """MX builds, correction partition: ``scales`` into the scale slot of the K/V ring's ``count``-th fill once the
    MMA that read its last fill has completed (the load warp waits for the same phase before its TMA), fenced
    for the tensor core, then one arrival on the slot's scale barrier (the MMA waits for it beside the bytes')."""
    buf, phase = bufidx_phase(count, NUM_BUFFERS)
    tlx.barrier_wait(empties[buf], phase ^ 1)
    tlx.local_store(scale_tiles[buf], scales)
    tlx.fence_async_shared()
    tlx.barrier_arrive(fulls[buf], 1)
    return count + 1


@triton.jit
def _fill_item_scales(item, q_cnt, kv_cnt, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties,
                      QS, KS, VS, VB_OFF, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, j,
                      CAUSAL: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                      TILE_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                      NUM_BUFFERS_KV: tl.constexpr, WHICH: tl.constexpr):
    """MX builds, correction partition: the E8M0 scales of one fill of work item ``item`` (WHICH "q": both groups'
    Q; "k" / "v": block j's K or V), loaded with plain loads masked to the sequence (no scale of another sequence
    is read) and stored beside the tile the load warp brings. The tensor ops of a scale tile need a warpgroup: the
    load partition is one warp. Returns the advanced (q_cnt, kv_cnt)."""
    head, q_row0, _o, len_q, k_row0, len_k, m_start, _cs, _nb = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N)
    if WHICH == "q":
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        for g in tl.static_range(_GROUPS):
            scales = _dim_scales(QS, q_row0 + m_start + g * BLOCK_M, len_q - m_start - g * BLOCK_M, head, num_heads,
                                 BLOCK_M, HEAD_DIM)
            tlx.barrier_wait(q_empties[g * NUM_BUFFERS_Q + q_buf], q_phase ^ 1)
            tlx.local_store(qs_tiles[g * NUM_BUFFERS_Q + q_buf], scales)
            tlx.fence_async_shared()
            tlx.barrier_arrive(qs_fulls[g * NUM_BUFFERS_Q + q_buf], 1)
        q_cnt += 1
    elif WHICH == "k":
        scales = _dim_scales(KS, k_row0 + j * BLOCK_N, len_k - j * BLOCK_N, head // GROUP, num_heads // GROUP, BLOCK_N,
                             HEAD_DIM)
        kv_cnt = _fill_scales(ks_tiles, kvs_fulls, kv_empties, kv_cnt, scales, NUM_BUFFERS_KV)
    else:
        scale_row0 = tl.load(VB_OFF + tl.load(TILES + item // num_heads))  # V's first scale row of the sequence
        scales = _token_scales(VS, scale_row0, j * BLOCK_N, len_k, head // GROUP, num_heads // GROUP, BLOCK_N,
                               HEAD_DIM)
        kv_cnt = _fill_scales(vs_tiles, kvs_fulls, kv_empties, kv_cnt, scales, NUM_BUFFERS_KV)
    return q_cnt, kv_cnt


@triton.jit
def _correct_item(item, pv_cnt, q_cnt, kv_cnt, o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones, o_readies,
                  OUT, TILES, CU_Q, CU_K, stride_ot, stride_oh, num_slots, num_heads, num_seqs, len_q_bcast,
                  qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS, KS, VS, VB_OFF,
                  CAUSAL: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                  TILE_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, O_SLICES: tl.constexpr,
                  NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, MX: tl.constexpr):
    """Correction, one work item: a rescale after every PV but the last, the epilogue after the last; an
    item with no K/V block stores zeros (its rows see no key). MX builds also fill the item's scale slots
    (``_fill_item_scales``), in the load warp's fill order: Q's, K(0)'s and V(0)'s first, then per block j K(j)'s
    before the rescale of PV(j - 1) (QK^T(j) precedes PV(j - 1)) and V(j)'s after it (its slot frees when PV(j - 2)
    or an earlier MMA completes). Returns the advanced (pv_cnt, q_cnt, kv_cnt): q_cnt, kv_cnt count the fills as
    the load warp does."""
    head, _qr, out_row0, len_q, _kr, _lk, m_start, _cs, n_blocks = _work_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N)
    if n_blocks > 0:
        if MX != "":  # Q's, K(0)'s and V(0)'s scales
            q_cnt, kv_cnt = _fill_item_scales(
                item, q_cnt, kv_cnt, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS, KS,
                VS, VB_OFF, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, 0, CAUSAL, GROUP,
                BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, "q")
            q_cnt, kv_cnt = _fill_item_scales(
                item, q_cnt, kv_cnt, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS, KS,
                VS, VB_OFF, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, 0, CAUSAL, GROUP,
                BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, "k")
            q_cnt, kv_cnt = _fill_item_scales(
                item, q_cnt, kv_cnt, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS, KS,
                VS, VB_OFF, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, 0, CAUSAL, GROUP,
                BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, "v")
        for _j in tl.range(1, n_blocks):
            if MX != "":
                q_cnt, kv_cnt = _fill_item_scales(
                    item, q_cnt, kv_cnt, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS,
                    KS, VS, VB_OFF, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, _j, CAUSAL, GROUP,
                    BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, "k")
            for g in tl.static_range(_GROUPS):
                _rescale(o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones, o_readies, pv_cnt, g, HEAD_DIM,
                         O_SLICES)
            if MX != "":
                q_cnt, kv_cnt = _fill_item_scales(
                    item, q_cnt, kv_cnt, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS,
                    KS, VS, VB_OFF, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, _j, CAUSAL, GROUP,
                    BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, "v")
            pv_cnt += 1
        for g in tl.static_range(_GROUPS):
            _epilogue(o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones, o_readies, pv_cnt, OUT, out_row0,
                      head, stride_ot, stride_oh, m_start + g * BLOCK_M + tl.arange(0, BLOCK_M), len_q, g, HEAD_DIM,
                      O_SLICES)
        pv_cnt += 1
    else:
        offs_m = m_start + tl.arange(0, TILE_M)
        rows = (out_row0 + offs_m.to(tl.int64))[:, None] * stride_ot + head * stride_oh
        zeros = tl.zeros([TILE_M, HEAD_DIM], dtype=OUT.dtype.element_ty)
        tl.store(OUT + rows + tl.arange(0, HEAD_DIM)[None, :], zeros, mask=(offs_m < len_q)[:, None])
    return pv_cnt, q_cnt, kv_cnt


@triton.jit
def _clc_next_item(clc, rounds, num_items):
    """The work item a partition of the CLC build takes after its ``rounds + 1``-th: the answer to the request of
    that round, i.e. the program id of the CTA it cancelled, or ``num_items`` when none was left. Every partition
    of a CTA reads the same answer."""
    claimed = tlx.clc_consumer(clc, rounds & 1)
    return tl.where(claimed == -1, num_items, claimed)


# per-batch values: no recompiles, one specialisation per config (the one the offline gate compiles)
@triton.jit(do_not_specialize=["num_items", "num_slots", "num_seqs", "num_heads", "len_q_bcast"])
def jagged_fwd_blackwell_kernel(
    desc_q, desc_k, desc_v, OUT, LSE, CU_Q, CU_K, TILES, QS, KS, VS, VB_OFF,
    stride_ot, stride_oh, col_stride_q, col_stride_k, col_stride_v,
    num_items, num_slots, num_seqs, num_heads, len_q_bcast, sm_scale,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr,
    SCALE_NONNEG: tl.constexpr, MX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, SOFTMAX_REGS: tl.constexpr, O_SLICES: tl.constexpr,
    SCALE_TILES: tl.constexpr, S_BUFFERS: tl.constexpr, CLC: tl.constexpr,
):
    """MX ("" or the P rule): "" reads bf16/fp16 q, k, v; an MXFP8 build reads E4M3 q, k, v (TMA, as the bf16
    build) and their E8M0 scales QS, KS (D-axis) and VS (token-axis, sequence b's first scale row VB_OFF[b])
    with plain loads, and issues both products as block-scaled tcgen05 MMAs (P quantized by the softmax).
    SCALE_TILES: every scale tile is a ``scaled_mma.SCALE_TILE``; they then take the layout tcgen05.cp reads
    (``_SCALE_LAYOUT``), else the default one (the simulator runs either). A bf16 launch passes the tile list for
    the four scale pointers (never read).
    CLC: the persistent schedule takes each next item from cluster launch control (a grid of ``num_items`` CTAs);
    else it is static (``static_item``, a grid of at most one CTA per SM)."""
    TILE_M: tl.constexpr = _GROUPS * BLOCK_M  # rows of one work item: one BLOCK_M group per softmax warpgroup
    DTYPE: tl.constexpr = tlx.dtype_of(desc_q)  # E4M3 in MX builds
    Q_BYTES: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(DTYPE)
    KV_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(DTYPE)

    # shared memory: Q per group (index g * NUM_BUFFERS_Q + b), the K/V ring, P per group, the row vectors
    # the softmax hands the correction; MX builds: each tile's E8M0 scales beside it (the B operands' scales, K's
    # and V's, in rings of their own indexed like the K/V ring)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, _GROUPS * NUM_BUFFERS_Q)
    kv_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, NUM_BUFFERS_KV)
    p_tiles = tlx.local_alloc((BLOCK_M, BLOCK_N), DTYPE, _GROUPS)
    scale_tiles = tlx.local_alloc((BLOCK_M,), tl.float32, _GROUPS)
    if MX != "":
        if SCALE_TILES:
            qs_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM // 32), tl.uint8, _GROUPS * NUM_BUFFERS_Q,
                                       layout=_SCALE_LAYOUT)
            ks_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_KV, layout=_SCALE_LAYOUT)
            vs_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_N // 32), tl.uint8, NUM_BUFFERS_KV, layout=_SCALE_LAYOUT)
            ps_tiles = tlx.local_alloc((BLOCK_M, BLOCK_N // 32), tl.uint8, _GROUPS, layout=_SCALE_LAYOUT)
        else:
            qs_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM // 32), tl.uint8, _GROUPS * NUM_BUFFERS_Q)
            ks_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM // 32), tl.uint8, NUM_BUFFERS_KV)
            vs_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_N // 32), tl.uint8, NUM_BUFFERS_KV)
            ps_tiles = tlx.local_alloc((BLOCK_M, BLOCK_N // 32), tl.uint8, _GROUPS)
    else:
        qs_tiles = None
        ks_tiles = None
        vs_tiles = None
        ps_tiles = None
    # tensor memory: S per group (or one both groups take turns in: S_BUFFERS 1) and O per group
    s_tiles = tlx.local_alloc((BLOCK_M, BLOCK_N), tl.float32, S_BUFFERS, tlx.storage_kind.tmem)
    o_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), tl.float32, _GROUPS, tlx.storage_kind.tmem)

    q_fulls = tlx.alloc_barriers(num_barriers=_GROUPS * NUM_BUFFERS_Q, arrive_count=1)  # TMA bytes
    q_empties = tlx.alloc_barriers(num_barriers=_GROUPS * NUM_BUFFERS_Q, arrive_count=1)  # tcgen05_commit
    kv_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)  # TMA bytes
    kv_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)  # the slot's last MMA
    s_fulls = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)  # QK^T completed
    s_empties = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)  # softmax has read S
    p_fulls = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)  # softmax has stored P
    pv_dones = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)  # PV completed (P free, O final)
    o_readies = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)  # correction is done with O
    scale_fulls = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)
    scale_empties = tlx.alloc_barriers(num_barriers=_GROUPS, arrive_count=1)
    if MX != "":  # the correction has stored a slot's E8M0 scales (the TMA bytes land on q_fulls / kv_fulls)
        qs_fulls = tlx.alloc_barriers(num_barriers=_GROUPS * NUM_BUFFERS_Q, arrive_count=1)
        kvs_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    else:
        qs_fulls = None
        kvs_fulls = None

    # one CLC response slot: the correction asks for the next item when it starts one, having read the answer that
    # named it; asking further ahead would claim CTAs before this one can work their items, which CTAs still
    # waiting to start might work sooner
    if CLC:
        clc = tlx.clc_create_context(num_consumers=_NEXT_ITEM_READERS, num_stages=1)
    else:
        clc = None

    # every partition walks the same items. CLC: its CTA's own (program id), then each one CLC claims
    # (``_clc_next_item``; ``rounds``, the items done, gives the response phase). Static: a counted loop over the
    # rounds (as a while loop like CLC's the MX fp32-output GQA build spills 32 B of stack, not 8: the gate)
    with tlx.async_tasks():
        # ---------------------------------------------------------------- correction + epilogue, CLC requests
        with tlx.async_task("default"):
            pv_cnt = 0
            q_cnt = 0  # MX builds: the scale fills, counted as the load warp counts its fills
            kv_cnt = 0
            if CLC:
                item = tl.program_id(0)
                rounds = 0
                while item < num_items:
                    # the next item's request flies while this one runs (a fresh empty barrier passes parity 1)
                    tlx.clc_producer(clc, (rounds & 1) ^ 1)
                    pv_cnt, q_cnt, kv_cnt = _correct_item(
                        item, pv_cnt, q_cnt, kv_cnt, o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones,
                        o_readies, OUT, TILES, CU_Q, CU_K, stride_ot, stride_oh, num_slots, num_heads, num_seqs,
                        len_q_bcast, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS, KS,
                        VS, VB_OFF, CAUSAL, GROUP, BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, O_SLICES,
                        NUM_BUFFERS_Q, NUM_BUFFERS_KV, MX)
                    item = _clc_next_item(clc, rounds, num_items)
                    rounds += 1
            else:
                for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0))):
                    item = static_item(rounds, tl.program_id(0), tl.num_programs(0), True)
                    if item < num_items:
                        pv_cnt, q_cnt, kv_cnt = _correct_item(
                            item, pv_cnt, q_cnt, kv_cnt, o_tiles, scale_tiles, scale_fulls, scale_empties, pv_dones,
                            o_readies, OUT, TILES, CU_Q, CU_K, stride_ot, stride_oh, num_slots, num_heads, num_seqs,
                            len_q_bcast, qs_tiles, ks_tiles, vs_tiles, qs_fulls, q_empties, kvs_fulls, kv_empties, QS,
                            KS, VS, VB_OFF, CAUSAL, GROUP, BROADCAST_Q, HEAD_DIM, TILE_M, BLOCK_M, BLOCK_N, O_SLICES,
                            NUM_BUFFERS_Q, NUM_BUFFERS_KV, MX)

        # ---------------------------------------------------------------- softmax, one warpgroup per group
        with tlx.async_task(num_warps=_SOFTMAX_WARPS, registers=SOFTMAX_REGS, replicate=_GROUPS):
            g: tl.constexpr = tlx.async_task_replica_id()
            qk_scale = sm_scale * 1.4426950408889634  # log2(e): the loop works in base 2
            s_cnt = 0
            pv_cnt = 0
            if CLC:
                item = tl.program_id(0)
                rounds = 0
                while item < num_items:
                    s_cnt, pv_cnt = _softmax_item(item, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles,
                                                  s_fulls, s_empties, p_fulls, pv_dones, scale_fulls, scale_empties,
                                                  LSE, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast,
                                                  qk_scale, g, CAUSAL, BROADCAST_Q, SCALE_NONNEG, TILE_M, BLOCK_M,
                                                  BLOCK_N, DTYPE, MX, S_BUFFERS)
                    item = _clc_next_item(clc, rounds, num_items)
                    rounds += 1
            else:
                for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0))):
                    item = static_item(rounds, tl.program_id(0), tl.num_programs(0), True)
                    if item < num_items:
                        s_cnt, pv_cnt = _softmax_item(item, s_cnt, pv_cnt, s_tiles, p_tiles, ps_tiles, scale_tiles,
                                                      s_fulls, s_empties, p_fulls, pv_dones, scale_fulls,
                                                      scale_empties, LSE, TILES, CU_Q, CU_K, num_slots, num_heads,
                                                      num_seqs, len_q_bcast, qk_scale, g, CAUSAL, BROADCAST_Q,
                                                      SCALE_NONNEG, TILE_M, BLOCK_M, BLOCK_N, DTYPE, MX, S_BUFFERS)

        # ---------------------------------------------------------------- MMA issuer
        with tlx.async_task(num_warps=_SINGLE_WARP, registers=ISSUER_REGS):
            q_cnt = 0
            kv_cnt = 0
            s_cnt = 0
            pv_cnt = 0
            if CLC:
                item = tl.program_id(0)
                rounds = 0
                while item < num_items:
                    q_cnt, kv_cnt, s_cnt, pv_cnt = _mma_item(
                        item, q_cnt, kv_cnt, s_cnt, pv_cnt, q_tiles, kv_tiles, p_tiles, s_tiles, o_tiles, q_fulls,
                        q_empties, kv_fulls, kv_empties, s_fulls, s_empties, p_fulls, pv_dones, o_readies, qs_tiles,
                        ks_tiles, vs_tiles, ps_tiles, qs_fulls, kvs_fulls, TILES, CU_Q, CU_K, num_slots, num_heads,
                        num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, MX,
                        S_BUFFERS)
                    item = _clc_next_item(clc, rounds, num_items)
                    rounds += 1
            else:
                for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0))):
                    item = static_item(rounds, tl.program_id(0), tl.num_programs(0), True)
                    if item < num_items:
                        q_cnt, kv_cnt, s_cnt, pv_cnt = _mma_item(
                            item, q_cnt, kv_cnt, s_cnt, pv_cnt, q_tiles, kv_tiles, p_tiles, s_tiles, o_tiles, q_fulls,
                            q_empties, kv_fulls, kv_empties, s_fulls, s_empties, p_fulls, pv_dones, o_readies,
                            qs_tiles, ks_tiles, vs_tiles, ps_tiles, qs_fulls, kvs_fulls, TILES, CU_Q, CU_K, num_slots,
                            num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_M, BLOCK_N, NUM_BUFFERS_Q,
                            NUM_BUFFERS_KV, MX, S_BUFFERS)

        # ---------------------------------------------------------------- TMA loads
        with tlx.async_task(num_warps=_SINGLE_WARP, registers=ISSUER_REGS):
            q_cnt = 0
            kv_cnt = 0
            if CLC:
                item = tl.program_id(0)
                rounds = 0
                while item < num_items:
                    q_cnt, kv_cnt = _load_item(
                        item, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles, kv_tiles, q_fulls, q_empties, kv_fulls,
                        kv_empties, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q,
                        col_stride_k, col_stride_v, CAUSAL, GROUP, BROADCAST_Q, TILE_M, BLOCK_M, BLOCK_N,
                        NUM_BUFFERS_Q, NUM_BUFFERS_KV, Q_BYTES, KV_BYTES)
                    item = _clc_next_item(clc, rounds, num_items)
                    rounds += 1
            else:
                for rounds in range(0, tl.cdiv(num_items, tl.num_programs(0))):
                    item = static_item(rounds, tl.program_id(0), tl.num_programs(0), True)
                    if item < num_items:
                        q_cnt, kv_cnt = _load_item(
                            item, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles, kv_tiles, q_fulls, q_empties,
                            kv_fulls, kv_empties, TILES, CU_Q, CU_K, num_slots, num_heads, num_seqs, len_q_bcast,
                            col_stride_q, col_stride_k, col_stride_v, CAUSAL, GROUP, BROADCAST_Q, TILE_M, BLOCK_M,
                            BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, Q_BYTES, KV_BYTES)


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------
def supports(q: torch.Tensor, head_dim: int, dtype: torch.dtype, *, k: Optional[torch.Tensor] = None,
             v: Optional[torch.Tensor] = None, window=(-1, -1)) -> tuple[bool, str]:
    """Whether this kernel can run these inputs, and why not: bf16/fp16, head dim 64 or 128, an sm_100
    launch target (read at call time only), TMA-readable q/k/v, no sliding window (causal is the window
    (-1, 0) and runs)."""
    ok, reason = check_inputs({"q": q, "k": k, "v": v}, dtype=dtype, head_dim=head_dim,
                              head_dims=SUPPORTED_HEAD_DIMS, capability=CAPABILITY)
    if ok and window_band(False, tuple(window))[1]:
        return False, f"window_size {tuple(window)} (the TLX Blackwell forward has no sliding-window build)"
    return ok, reason


def _constexprs(cfg: BlackwellForwardConfig, head_dim: int, *, causal: bool, broadcast_q: bool, scale_nonneg: bool,
                group: int = 1, mx: str = "", clc: bool = False) -> dict:
    """The compile-time arguments of one launch (shared by the launcher and the offline compile gate)."""
    constants = dict(HEAD_DIM=head_dim, CAUSAL=causal, GROUP=group, BROADCAST_Q=broadcast_q, SCALE_NONNEG=scale_nonneg,
                     MX=mx, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_BUFFERS_Q=cfg.num_buffers_q,
                     NUM_BUFFERS_KV=cfg.num_buffers_kv, SOFTMAX_REGS=cfg.softmax_regs, O_SLICES=cfg.o_slices,
                     S_BUFFERS=cfg.s_buffers, CLC=clc)
    constants["SCALE_TILES"] = bool(mx) and mx_scale_tiles(cfg, head_dim) == {scaled_mma.SCALE_TILE}
    return constants


def mx_scale_tiles(cfg: BlackwellForwardConfig, head_dim: int) -> set:
    """The shapes of an MX build's scale tiles (Q's, K's, V's, P's): sm_100a compiles the build only where they are
    all ``scaled_mma.SCALE_TILE`` (D 128; at D 64, Q's and K's have 2 columns and V's 64 rows)."""
    return {(cfg.block_m, head_dim // 32), (cfg.block_n, head_dim // 32), (head_dim, cfg.block_n // 32),
            (cfg.block_m, cfg.block_n // 32)}


def _launch_options() -> dict:
    # num_warps: the default (correction) partition; the others add 2 x 4 + 1 + 1 warps (14 in all).
    # num_stages=1: the pipelining is explicit (mbarrier rings), Triton's own pipeliner stays off.
    return dict(num_warps=CORRECTION_WARPS, num_stages=1)


def compile_spec(dtype: str, head_dim: int, *, causal: bool, broadcast_q: bool, group: int = 1, mx: str = "",
                 clc: bool = False):
    """``(kernel, signature, constants, attrs, options)`` for an offline ``triton.compile`` of one config
    (the compile gate). Descriptors are typed from the config's block shapes, as the launcher's binder
    spells them. ``dtype``: the inputs' (and output's) type; with ``mx`` (an MXFP8 build) the output's, the
    inputs being E4M3; ``clc``: the cluster-launch-control build."""
    cfg = config_for(head_dim, mx)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, scale_nonneg=True, group=group,
                            mx=mx, clc=clc)
    types = {f"desc_{x}": f"tensordesc<{'fp8e4nv' if mx else dtype}[{rows}, {head_dim}]>"
             for x, rows in (("q", cfg.block_m), ("k", cfg.block_n), ("v", cfg.block_n))}
    scales = "*u8" if mx else "*i32"  # a bf16 launch passes the tile list for the unused scale pointers
    types.update(OUT=f"*{dtype}", LSE="*fp32", CU_Q="*i32", CU_K="*i32", TILES="*i32", QS=scales, KS=scales,
                 VS=scales, VB_OFF="*i32", sm_scale="fp32")
    signature, attrs = offline_signature(jagged_fwd_blackwell_kernel, constants, types)
    return jagged_fwd_blackwell_kernel, signature, constants, attrs, _launch_options()


def kernel_arguments(q, k, v, out, lse, out_cu, cu_k, tiles, *, causal: bool, softmax_scale: float,
                     broadcast_q: bool, num_seqs: int, len_q_bcast: int, mx=None, clc: bool = False
                     ) -> tuple[tuple, dict, int]:
    """(positional args, keyword args, number of work items) of one launch. Touches no GPU, so the offline
    gate can bind them to the kernel on a CPU machine and check that a launch specialises to the very
    signature ``compile_spec`` compiles. ``mx``: an MXFP8 launch's ``(rule, q scales, k scales, v scales, v
    block offsets)``, with q, k, v its E4M3 data; ``clc``: the cluster-launch-control build (``uses_clc``)."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    rule = mx[0] if mx is not None else ""
    cfg = config_for(head_dim, rule)
    desc_q, col_q = descriptor(q, cfg.block_m)
    desc_k, col_k = descriptor(k, cfg.block_n)
    desc_v, col_v = descriptor(v, cfg.block_n)
    num_items = tiles.num_slots * num_heads
    cu_q = cu_k if broadcast_q else out_cu  # never read for a broadcast Q; cu_k keeps one pointer type
    scales = tuple(mx[1:]) if mx is not None else (tiles.tiles,) * 4  # (never read by a bf16 launch)
    args = (desc_q, desc_k, desc_v, out, lse, cu_q, cu_k, tiles.tiles, *scales, out.stride(0), out.stride(1), col_q,
            col_k, col_v, num_items, tiles.num_slots, num_seqs, num_heads, len_q_bcast, softmax_scale)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, scale_nonneg=softmax_scale >= 0,
                            group=num_heads // k.shape[1], mx=rule, clc=clc)
    return args, {**constants, **_launch_options()}, num_items


def uses_clc(device: torch.device) -> bool:
    """Whether a launch on ``device`` runs the cluster-launch-control build: where its target lowers CLC
    (``LaunchTarget.cluster_launch_control``)."""
    t = target.target_for(device)
    return t is not None and t.cluster_launch_control


def launch_forward(args, kwargs, num_items: int, device) -> None:
    """Launch the kernel on ``kernel_arguments``' binding: the CLC build with one CTA per work item (the first
    to start claim the others'), the static one with at most one per SM; none for no item."""
    if num_items > 0:
        grid = num_items if kwargs["CLC"] else min(sm_count(device), num_items)
        target.launch(jagged_fwd_blackwell_kernel, (grid,), device, *args, **kwargs)


def jagged_forward_blackwell(q, k, v, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                             num_seqs: int, len_q_bcast: int = 0, window=(-1, -1)):
    """Launch the forward; same contract as ``jfa.kernels.tlx.hopper.forward.jagged_forward_tlx``. Returns
    (out [rows, H, D] in q's dtype, lse [rows, H] float32), rows = ``total_q`` or ``B * Lq`` for a broadcast
    Q (``cu_q`` is ignored then). Raises ValueError when ``supports`` says no."""
    head_dim = q.shape[-1]
    ok, reason = supports(q, head_dim, q.dtype, k=k, v=v, window=window)
    if not ok:
        raise ValueError(f"jagged_forward_blackwell: {reason}")
    causal = window_band(causal, tuple(window))[0]
    cfg = config_for(head_dim)
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q)
    if rows == 0 or k.shape[0] == 0:
        # no row, or no key anywhere: every row sees none (and TMA cannot describe an empty tensor)
        return alloc.unseen(out, lse)
    tiles = build_tile_list(out_cu, rows, NUM_GROUPS * cfg.block_m, work_offsets=cu_k)
    args, kwargs, num_items = kernel_arguments(q, k, v, out, lse, out_cu, cu_k, tiles, causal=causal,
                                               softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                               num_seqs=num_seqs, len_q_bcast=len_q_bcast, clc=uses_clc(q.device))
    with pipeline.build_llvm_o0(jagged_fwd_blackwell_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        launch_forward(args, kwargs, num_items, q.device)
    return out, lse


def mx_supports(q, k, v, window=(-1, -1)) -> tuple[bool, str]:
    """Whether the MXFP8 build runs these operands, and why not: MXTensors (q, k along dim, v along tokens) or
    the high-precision tensors a call quantizes; head dim 128 on an sm_100 GPU (64 too on the TLX simulator: its
    build does not compile for sm_100a), no sliding window (causal runs). The launcher makes the E4M3 bytes contiguous and 16-byte aligned, so their layout is never
    the reason."""
    axes = tuple(getattr(t, "axis", None) for t in (q, k, v))
    if axes != (None,) * 3 and axes != ("dim", "dim", "tokens"):
        return False, f"MX axes {axes} (the kernel takes ('dim', 'dim', 'tokens'))"
    if tuple(window) not in ((-1, -1), (-1, 0)):
        return False, f"window_size {tuple(window)} (the TLX Blackwell MXFP8 forward has no windowed build)"
    probe = torch.empty((0, q.shape[1], q.shape[-1]), dtype=torch.bfloat16, device=q.device)
    ok, reason = check_inputs({"q": probe}, dtype=torch.bfloat16, head_dim=q.shape[-1],
                              head_dims=tuple(sorted(_MX_CONFIGS)), capability=CAPABILITY)
    head_dim = q.shape[-1]
    if ok and q.device.type == "cuda" and mx_scale_tiles(config_for(head_dim, "floor"), head_dim) != {scaled_mma.SCALE_TILE}:
        return False, (f"head_dim {head_dim}: the MXFP8 build's scale tiles have no tcgen05.cp layout in Triton 3.8, "
                       "so it compiles for the TLX simulator only (D 128 runs on the GPU)")
    return ok, reason


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a 16-byte aligned base (what a TMA descriptor over it needs)."""
    t = t.contiguous()
    return t.clone() if t.data_ptr() % 16 else t


def mx_forward_blackwell(q, k, v, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                         num_seqs: int, len_q_bcast: int = 0, window=(-1, -1), rule: str = "floor",
                         out_dtype=torch.bfloat16):
    """MXFP8 forward on the Blackwell kernel (``MX`` build): the contract of the portable
    ``jfa.kernels.triton.mx_attention.mx_forward`` (docs/mxfp8.md section 2), q, k, v MXTensors, as the Hopper
    ``mx_forward_tlx``. Returns (out ``[rows, H, D]`` out_dtype, lse ``[rows, H]`` fp32). Raises ValueError where
    ``mx_supports`` says no."""
    from jfa import mx as jmx

    if rule not in MX_RULES:
        raise ValueError(f"rule: must be one of {MX_RULES}, got {rule!r}")
    ok, reason = mx_supports(q, k, v, window)
    if not ok:
        raise ValueError(f"mx_forward_blackwell: {reason}")
    causal = window_band(causal, tuple(window))[0]
    head_dim = q.shape[-1]
    cfg = config_for(head_dim, rule)
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q, out_dtype)
    if rows == 0 or k.shape[0] == 0:
        # no row, or no key anywhere: every row sees none (and TMA cannot describe an empty tensor)
        return alloc.unseen(out, lse)
    tiles = build_tile_list(out_cu, rows, NUM_GROUPS * cfg.block_m, work_offsets=cu_k)
    data = [_tma_ready(t.data) for t in (q, k, v)]
    scales = (rule, q.scales.contiguous(), k.scales.contiguous(), v.scales.contiguous(), jmx.token_block_offsets(cu_k))
    args, kwargs, num_items = kernel_arguments(*data, out, lse, out_cu, cu_k, tiles, causal=causal,
                                               softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                               num_seqs=num_seqs, len_q_bcast=len_q_bcast, mx=scales,
                                               clc=uses_clc(q.device))
    with pipeline.build_llvm_o0(jagged_fwd_blackwell_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        launch_forward(args, kwargs, num_items, q.device)
    return out, lse
