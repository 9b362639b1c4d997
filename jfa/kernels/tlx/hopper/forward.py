"""Jagged FlashAttention forward for Hopper (sm_90a) in TLX: persistent, warp-specialised, pingpong.

What ``backend="auto"`` runs on sm_90 for bf16/fp16 with head dim 64 or 128 (``supports`` says when
it cannot; the API then runs the portable kernel and says why, see ``jfa.which_kernels``). Same
contract as the portable ``jfa.kernels.triton.forward.jagged_forward``: ``out [rows, H, D]`` in q's
dtype, ``lse [rows, H]`` float32 (natural log), rows that see no key give ``out = 0`` and
``lse = -inf``; causal masks are bottom-right aligned; broadcast-Q output rows are ``b * Lq + i``.

Shape of the kernel (the structure of the TLX tutorial ``hopper_fa_ws_pipelined_pingpong_persistent``):

* Persistent grid: one CTA per SM walks work items (tile-list slot, head). The tile list
  (:func:`jfa.kernels.schedule.build_tile_list`) has tiles of ``2 * BLOCK_M`` query rows ordered by
  decreasing key length (longest first); items are dealt zig-zag (``common.device.static_item``).
  Causal launches over long sequences of uneven lengths (``Variant.for_launch``) instead have the producer take the next
  item from a global atomic counter; the counter resets itself at the end of each launch. Spare slots
  carry the sentinel sequence ``B`` and are skipped. The producer decodes each item (tile list,
  offsets, block-sparse list counts) and hands it to the consumers through a shared-memory ring
  (``item_ring.publish_item``), so a consumer starts the next item after a few shared-memory reads instead of
  dependent global loads (a windowed item's band and block order too), under either schedule.
  ``profile=True`` builds a variant that records SM, start and end of every item
  (``jfa.bench.timeline`` draws them).
* Three partitions per CTA. The producer (the default partition, one warpgroup, few registers) issues
  TMA loads of Q, K and V into multi-buffered shared memory, signalling mbarriers. Two consumer
  warpgroups (``replicate=2``, many registers via setmaxnreg) each own one ``BLOCK_M``-row half of
  the work item's query tile and share every K/V buffer (an empty barrier needs both to arrive).
* Pingpong: named barriers 9 and 10 order the consumers' QK^T wgmma issues (0, 1, 0, 1, ...), so one
  warpgroup's softmax runs while the other's wgmma occupies the tensor cores. Both consumers walk the
  same number of K/V blocks per item, so the handshake stays balanced across the persistent loop (a
  consumer whose query rows all lie past the sequence computes nothing but still takes and passes
  its turn per block).
* Inside a consumer, the tutorial's software pipeline: QK^T of block j is issued before PV of block
  j - 1, softmax of block j overlaps that PV. Online softmax in base 2, fp32 accumulators.
* Loop peeling: a branch-free bulk over K/V blocks every row of the consumer's half fully sees, then
  a masked tail (the causal diagonal and the sequence's last partial block, or a window's edges), one
  helper instantiated twice through the ``MASKED`` constexpr.
* Jagged tails without padding: the TMA descriptors cover the packed tensors as 2-D views
  ``[T, (H - 1) * stride_h + D]`` (column offset ``head * stride_h``), so a tile may read rows of the
  next sequence (or zeros past the tensor end). Those key rows are excluded by the tail mask before the
  softmax; those query rows are computed but never stored. The epilogue stores with a row mask against
  the tile's own sequence length (a TMA store would write rows of the next sequence).

* Grouped-query attention: query head h reads key/value head ``h // GROUP`` (a constexpr: one build per
  group size). Sliding windows (``WINDOW``): a work item loads only the K/V blocks its rows' band
  reaches (from the block of its first row's first key), in a rotated order: first the blocks past the
  band's left edge for every row of the tile, of which those inside its right edge for a half's first row
  are that half's unmasked bulk, then the rest (the right edge, the sequence's last block, the left edge)
  through the masked softmax, which keeps keys with ``lo <= j - i <= hi`` (``jfa.kernels.bands``); the
  online softmax does not depend on the order of the blocks. Builds without a window take no band
  arguments (constexpr None), so their code is that of the plain kernel.

Divergence from the portable kernel: a key block straddling a sequence end multiplies P = 0 by the V
rows of the next sequence; a non-finite V value there (inf/NaN in another sequence's V) turns
0 * inf into NaN in this sequence's output. The portable kernel loads zeros instead.

Supported: bf16 and fp16, head dims 64 and 128, grouped key/value heads, sliding windows, q/k/v with
contiguous last dim, 16-byte aligned base and token stride (``supports`` says why not otherwise).

MXFP8 (``MX`` builds, :func:`mx_forward_tlx`; docs/mxfp8.md section 2, the portable MX kernel's semantics
exactly): the same consumers and protocol with 64-key blocks; the softmax step takes an integer running
maximum and quantizes P in its 32-key blocks (``quantized_weights``, shared with the portable kernel, so
P's values do not depend on the tiling). The producer loads the E4M3 bytes and E8M0 scales with
coalesced 16-byte loads (rows past the sequence masked: unlike the bf16 build, no value of another
sequence is read), dequantizes them exactly into the bf16 buffers and fences the stores for wgmma. No
sliding windows (``mx_supports``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
import triton
import triton.language as tl

from jfa import knobs
from jfa.kernels import alloc
from jfa.kernels.bands import band_offsets, window_band
from jfa.kernels.cache import IdentityCache
from jfa.kernels.schedule import build_tile_list
from jfa.kernels.tlx import pipeline
from jfa.kernels.tlx.common import target
from jfa.kernels.tlx.common.device import (ITEM_BUFFERS, bufidx_phase, clock64, globaltimer, item_sequence,
                                           online_softmax_step, record_stamp, retire_counter, smid, static_item,
                                           to_16bit_pairs)
from jfa.kernels.tlx.common.host import (check_inputs, descriptor, make_variant, offline_signature, rebased, sm_count,
                                         schedule_counter, tlx, work_counter)
from jfa.kernels.tlx.hopper.item_ring import (ITEM_FIELDS, WINDOW_FIELDS, peek_item, publish_end, publish_item,
                                              take_item)
from jfa.kernels.tlx.hopper.mx_producers import produce_forward_item_mx
from jfa.kernels.triton.mx_attention import pow2_step, quantized_weights, visible_keys


# ----------------------------------------------------------------------------------------------------
# Configs, as data. One row per head dim; the same row serves bf16 and fp16 (same bytes, same wgmma).
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HopperForwardConfig:
    block_m: int  # query rows per consumer warpgroup; a work item is NUM_CONSUMERS * block_m rows
    block_n: int  # key rows per K/V buffer (one QK^T and one PV wgmma chain per block)
    num_buffers_q: int  # Q buffers per consumer: > 1 lets the producer prefetch the next item's Q
    num_buffers_kv: int  # K and V stages shared by both consumers
    consumer_regs: int  # setmaxnreg of each consumer warpgroup (the producer gets what is left)
    q_in_registers: bool = False  # the bulk loop's QK^T takes Q from registers (RS wgmma), not shared memory
    llvm_o0: bool = False  # the build's LLVM IR left to ptxas (``pipeline.build_llvm_o0``, ``compiled_as_configured``)


NUM_CONSUMERS = 2  # consumer warpgroups in pingpong; the pingpong handshake below assumes exactly two
PRODUCER_WARPS = 4  # the default partition: one warpgroup (setmaxnreg works per warpgroup)
CONSUMER_WARPS = 4  # one warpgroup per consumer: wgmma is issued per warpgroup (M = 64 per instruction)
_CONSUMERS = tl.constexpr(NUM_CONSUMERS)  # the same numbers, as the kernel sees them
_CONSUMER_WARPS = tl.constexpr(CONSUMER_WARPS)

_CONFIGS: dict[int, HopperForwardConfig] = {
    # D 64: 64 rows per consumer = one m64 wgmma per k-step; the fp32 S tile (64x128) is 64 regs/thread
    # and O (64x64) 32, well under the budget. K/V stages are 16 KB each: 3 stages (96 KB) + 2x2 Q
    # buffers (32 KB) + 2x8 KB epilogue scratch = 144 KB, the third stage giving the producer a block of
    # slack on short sequences. block_n 128: one K/V block feeds two 64-row consumers, half the barrier
    # traffic per FLOP of 64. consumer_regs 240 (256 * 240 + 128 * 32 = 65536; setmaxnreg gives the producer
    # 24): at 232 the block-sparse builds spill 8 B of stack with P converted in pairs.
    # Q in registers for the bulk loop's QK^T (+32 regs/thread, within the budget at D 64): +4% on the D 64
    # gem shape (NOTES.md, session 21); at D 128 the same costs 1-5% (and spills where the whole item keeps it).
    64: HopperForwardConfig(block_m=64, block_n=128, num_buffers_q=2, num_buffers_kv=3, consumer_regs=240,
                            q_in_registers=True),
    # D 128: 64 rows per consumer, 128-key blocks. S and O (64x128 fp32) take 64 regs/thread each and P
    # (16-bit) 32 more while PV runs; 128 rows per consumer would double S and O and cannot fit. K/V
    # stages are 32 KB each: 2 stages (128 KB) + 2x2 Q buffers (64 KB) + 2x8 KB epilogue scratch = 208 KB
    # of 227 KB; a third stage (+64 KB) cannot fit, even with single Q buffers. consumer_regs 240
    # (producer 32: 256 * 240 + 128 * 32 = 65536): at 232 the causal broadcast-Q build spills.
    # llvm_o0: with its LLVM IR left to ptxas the build ran 1.7-3.6% faster on the longtail gem shape and
    # 3.0-3.9% on the broadcast-Q one, the others within the runs' spread (three interleaved A/B runs, NOTES.md
    # session 29); at D 64 the O0 build was slower (0.6-1.7%), so D 64 keeps LLVM's optimisation.
    128: HopperForwardConfig(block_m=64, block_n=128, num_buffers_q=2, num_buffers_kv=2, consumer_regs=240,
                             llvm_o0=True),
}

SUPPORTED_HEAD_DIMS = tuple(sorted(_CONFIGS))
# Named barriers of the pingpong handshake: ids 0-8 are left to Triton (it uses a few for partition
# dispatch and intra-warpgroup syncs), 9 and 10 are the ids the TLX tutorial uses. Both consumer
# warpgroups (2 x 128 threads) take part in each.
BAR_TO_C0 = tl.constexpr(9)  # consumer 1 arrives after its QK^T issue, consumer 0 waits before its own
BAR_TO_C1 = tl.constexpr(10)  # consumer 0 arrives after its QK^T issue, consumer 1 waits before its own
PINGPONG_THREADS = tl.constexpr(256)
# The profiling build's TIMELINE: one row per work item (PROFILE_FIELDS: its SM, start and end on the global
# timer, its CTA; ``Timeline.records``), then with ``trace_steps`` one row per traced K/V step of CTA 0 (STEP_FIELDS, SM
# cycles: ``_log_step``), rows of one width
PROFILE_FIELDS = ("sm", "start_ns", "end_ns", "cta")
STEP_FIELDS = ("start", "turn_passed", "v_ready", "done")
assert len(STEP_FIELDS) == len(PROFILE_FIELDS)
(REC_SM, REC_START_NS, REC_END_NS, REC_CTA) = (tl.constexpr(i) for i in range(len(PROFILE_FIELDS)))
(STEP_START, STEP_TURN_PASSED, STEP_V_READY, STEP_DONE) = (tl.constexpr(i) for i in range(len(STEP_FIELDS)))
_RECORD = tl.constexpr(len(PROFILE_FIELDS))
SCHEDULES = ("zigzag", "dynamic")  # Variant.schedule: static zig-zag over the sorted list, or a counter
# A causal launch (no window) takes its items from the counter (``Variant.long_causal_schedule``,
# ``Variant.for_launch``) when its sequences average at least LONG_CAUSAL_TILES work items and the longest has
# at least UNEVEN_LENGTHS times the mean rows, or when they average at least VERY_LONG_CAUSAL_TILES items
LONG_CAUSAL_TILES = 6
UNEVEN_LENGTHS = 1.5
VERY_LONG_CAUSAL_TILES = 20



# MXFP8 builds (``MX``): 64-key blocks at both head dims. The producer loads and dequantizes whole tiles in
# registers (the next K or V tile in flight while one is converted), so producer and consumers split the
# registers evenly at D 128 (256 * 168 + 128 * 168 <= 65536: the consumers' S is 64x64 fp32, 32 regs/thread);
# at D 64 the tiles are half as large. Shared memory: the bf16 kernel's buffers only (D 128: Q 2x2x16 KB +
# K/V 2 stages x 2 x 16 KB = 128 KB). llvm_o0 at D 128: with its LLVM IR left to ptxas the build ran 3-9% faster
# on every D 128 gem shape (interleaved in one process, NOTES.md session 30); at D 64 1.9% slower.
_MX_CONFIGS: dict[int, HopperForwardConfig] = {
    64: HopperForwardConfig(block_m=64, block_n=64, num_buffers_q=2, num_buffers_kv=3, consumer_regs=184),
    128: HopperForwardConfig(block_m=64, block_n=64, num_buffers_q=2, num_buffers_kv=2, consumer_regs=176,
                             llvm_o0=True),
}
MX_RULES = ("floor", "rceil")


def config_for(head_dim: int, mx: str = "") -> HopperForwardConfig:
    """The config of a build: bf16/fp16 (``mx=""``) or MXFP8 (``mx`` the P rule)."""
    return (_MX_CONFIGS if mx else _CONFIGS)[head_dim]


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _work_item(TILES, CU_Q, CU_K, ROW_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
               CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr,
               TILE_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Everything producer and consumers need about work item ``item``: the producer decodes it once and
    publishes what the consumers need through the item ring (``_fill_item``), so all three partitions agree
    on the K/V blocks (or the mbarrier phases and the pingpong would drift).

    Returns (head, q_row0, out_row0, len_q, k_row0, len_k, m_start, causal_shift, j0, n_blocks, lo, hi, rot):
    the item's K/V blocks are j0 .. j0 + n_blocks - 1 (visited in ``_block_start``'s order); with WINDOW,
    (lo, hi) is the band (row i sees key j iff lo <= j - i <= hi: ``jfa.kernels.bands``), j0 the block of
    the tile's first visible key and ``rot`` the rotation of the visiting order (``_window_rotation``). SPARSE
    (block-sparse attention: ``jfa.kernels.block_lists``, query blocks of TILE_M rows): the item's blocks are
    the ones its list row names, KV_IDX[j0 .. j0 + n_blocks - 1] (``_block_start``); TILES' third row holds
    each slot's query block index. A spare slot (sequence index == num_seqs) has both lengths 0, hence
    n_blocks == 0 and every store masked."""
    head, tile, q_row0, out_row0, len_q, k_row0, len_k = item_sequence(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, BROADCAST_Q)
    m_start = tile * TILE_M
    causal_shift = len_k - len_q  # bottom-right alignment: row i sees keys j <= i + Lk - Lq
    j0, lo, hi, rot = 0, 0, 0, 0  # (Python ints: folded away where there is no window)
    if SPARSE:
        row = (item % num_heads) * num_slots + tl.load(TILES + (item // num_heads + 2 * num_slots))
        j0 = tl.load(ROW_OFF + row)
        n_blocks = tl.where(len_q > 0, tl.load(ROW_OFF + row + 1) - j0, 0)
    elif WINDOW:
        lo, hi = band_offsets(len_q, len_k, band_lo, band_hi)
        # from the first row's first key to the last real row's last key
        j0 = tl.minimum(tl.maximum(m_start + lo, 0), len_k) // BLOCK_N
        kv_end = tl.minimum(tl.maximum(tl.minimum(m_start + TILE_M, len_q) + hi, 0), len_k)
        n_blocks = tl.maximum(tl.cdiv(kv_end, BLOCK_N) - j0, 0)
        rot = _window_rotation(m_start, lo, j0, n_blocks, TILE_M, BLOCK_N)
    else:
        if CAUSAL:
            # keys up to the last real row of the tile (a tile's rows past Lq need none)
            kv_end = tl.maximum(tl.minimum(m_start + TILE_M, len_q) + causal_shift, 0)
        else:
            kv_end = len_k
        n_blocks = tl.cdiv(kv_end, BLOCK_N)
    return head, q_row0, out_row0, len_q, k_row0, len_k, m_start, causal_shift, j0, n_blocks, lo, hi, rot


@triton.jit
def _window_rotation(m_start, lo, j0, n_blocks, TILE_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where a windowed item's visiting order starts, as an offset from j0: the first block whose every key
    is at or past the band's left edge for the tile's last row (so for every row of both consumers' halves),
    clamped to the item's blocks. The blocks from there on that also lie within the right edge are the ones
    a half sees whole: visited first, they form the unmasked bulk (``_bulk_blocks``); the band's left-edge
    blocks come last, through the masked path. (Numerator clamped at 0: integer division of a negative
    number rounds differently per backend.)"""
    first_whole = tl.cdiv(tl.maximum(m_start + TILE_M - 1 + lo, 0), BLOCK_N)
    return tl.minimum(tl.maximum(first_whole - j0, 0), n_blocks)


@triton.jit
def _block_start(KV_IDX, j0, j, n_blocks, rot, SPARSE: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """The first key (within the sequence) of the item's ``j``-th K/V block, in the order producer and
    consumers share: ascending, or with WINDOW rotated by ``rot`` (blocks j0 + rot .. j0 + n_blocks - 1, then
    j0 .. j0 + rot - 1)."""
    if SPARSE:
        return tl.load(KV_IDX + j0 + j) * BLOCK_N
    if WINDOW:
        b = j + rot
        return (j0 + tl.where(b < n_blocks, b, b - n_blocks)) * BLOCK_N
    return (j0 + j) * BLOCK_N


@triton.jit
def _listed_bulk(KV_IDX, j0, n_blocks, bulk_end, BLOCK_N: tl.constexpr):
    """How many of the item's listed blocks lie wholly before ``bulk_end`` (every row sees them whole). The
    list is ascending, so those are a prefix and the others a suffix of at most 3 blocks (the causal
    diagonal of a 2 x 64-row tile spans two 128-key blocks, the sequence's partial last block is at or past
    it): counting the suffix among the last 3 entries is exact."""
    masked = 0
    for back in tl.static_range(3):
        if back < n_blocks:
            masked += tl.where((tl.load(KV_IDX + j0 + n_blocks - 1 - back) + 1) * BLOCK_N > bulk_end, 1, 0)
    return n_blocks - masked


@triton.jit
def _bulk_blocks(KV_IDX, j0, n_blocks, rot, m_start, len_k, causal_shift, hi, c: tl.constexpr,
                 CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SPARSE: tl.constexpr, PEEL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """How many of the item's first blocks (in ``_block_start``'s order) consumer ``c``'s half sees whole
    (the branch-free bulk): below the diagonal and inside Lk; with WINDOW, from the rotated start up to the
    band's right edge for the half's first row. 0 without peeling."""
    if not PEEL:
        return 0
    if WINDOW:
        # blocks below whole_end hold only keys <= the half's first row + hi, and inside Lk; the rotated
        # start is at or past the left edge of every row (``_window_rotation``)
        whole_end = tl.minimum(tl.maximum(m_start + c * BLOCK_M + hi + 1, 0), len_k) // BLOCK_N
        return tl.maximum(tl.minimum(whole_end, j0 + n_blocks) - (j0 + rot), 0)
    if CAUSAL:
        bulk_end = tl.minimum(len_k, tl.maximum(m_start + c * BLOCK_M + causal_shift + 1, 0))
    else:
        bulk_end = len_k
    if SPARSE:
        return _listed_bulk(KV_IDX, j0, n_blocks, bulk_end, BLOCK_N)
    return bulk_end // BLOCK_N


@triton.jit
def _wait_turn(CID: tl.constexpr):
    """Pingpong: wait until the other consumer hands this one the tensor-core turn."""
    if CID == 0:
        tlx.named_barrier_wait(BAR_TO_C0, PINGPONG_THREADS)
    else:
        tlx.named_barrier_wait(BAR_TO_C1, PINGPONG_THREADS)


@triton.jit
def _pass_turn(CID: tl.constexpr):
    """Pingpong: hand the tensor-core turn to the other consumer."""
    if CID == 0:
        tlx.named_barrier_arrive(BAR_TO_C1, PINGPONG_THREADS)
    else:
        tlx.named_barrier_arrive(BAR_TO_C0, PINGPONG_THREADS)


@triton.jit
def _issue_qk(q_tile, k_tile, CID: tl.constexpr, PINGPONG: tl.constexpr):
    """Issue S = Q K^T on wgmma in pingpong order: consumer 0 issues, then consumer 1, then 0, ...
    (PINGPONG=False, the ablation: both issue whenever their operands are ready)."""
    k_t = tlx.local_trans(k_tile)
    if PINGPONG:
        _wait_turn(CID)
    qk = tlx.async_dot(q_tile, k_t)
    if PINGPONG:
        _pass_turn(CID)
    return qk


@triton.jit
def _softmax_update(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift, qk_scale, lo, hi,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SCALE_NONNEG: tl.constexpr,
                    BLOCK_N: tl.constexpr, MX: tl.constexpr):
    """Online softmax of one K/V block in base 2. Returns (p, m_new, l_new, alpha).

    bf16/fp16 (MX ""): ``online_softmax_step``, the step every TLX forward shares (bulk without a mask, the
    tail masking the sequence end and the causal diagonal or the WINDOW band). MX ("floor" or "rceil", the
    rule P is quantized with): the portable MXFP8 kernel's step exactly (``jfa.kernels.triton.mx_attention``):
    logits ``qk * qk_scale``, an integer running maximum, P MX-quantized in its 32-key blocks
    (``quantized_weights``) and power-of-two rescales, so P's bytes do not depend on BLOCK_N."""
    if MX != "":
        s = qk * qk_scale
        if MASKED:
            visible = visible_keys(offs_m, n_start + tl.arange(0, BLOCK_N), len_k, causal_shift, lo, hi, CAUSAL,
                                   WINDOW)
            s = tl.where(visible, s, float("-inf"))
        p, m_new = quantized_weights(s, m_i, MX == "rceil", qk.shape[0], BLOCK_N)
        alpha = pow2_step(m_i, tl.where(m_new == float("-inf"), 0.0, m_new))
        l_new = l_i * alpha + tl.sum(p, 1)
    else:
        p, m_new, l_new, alpha = online_softmax_step(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift, qk_scale,
                                                     lo, hi, MASKED, CAUSAL, WINDOW, SCALE_NONNEG, BLOCK_N)
    return p, m_new, l_new, alpha


@triton.jit
def _kv_step(acc, p, m_i, l_i, q_tile, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_cnt,
             n_start, offs_m, len_k, causal_shift, qk_scale, lo, hi,
             CID: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
             SCALE_NONNEG: tl.constexpr, PINGPONG: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, BLOCK_N: tl.constexpr,
             DTYPE: tl.constexpr, MX: tl.constexpr, STEP_LOG, pid,
             TRACE_STEPS: tl.constexpr):
    """One pipelined K/V block: issue QK^T(j), issue PV(j - 1) with the previous P, softmax(j) while
    PV runs, then rescale the accumulator. Releases K(j) and V(j - 1) to the producer. TRACE_STEPS > 0 (a
    profiling build): CTA 0 logs the step's clock stamps (``_log_step``)."""
    if TRACE_STEPS > 0:
        t_start = clock64()
    k_buf, k_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
    tlx.barrier_wait(k_fulls[k_buf], k_phase)
    qk = _issue_qk(q_tile, k_tiles[k_buf], CID, PINGPONG)
    if TRACE_STEPS > 0:
        t_issued = clock64()

    v_buf, v_phase = bufidx_phase(kv_cnt - 1, NUM_BUFFERS_KV)
    tlx.barrier_wait(v_fulls[v_buf], v_phase)
    if TRACE_STEPS > 0:
        t_v = clock64()
    acc = tlx.async_dot(p, v_tiles[v_buf], acc)

    qk = tlx.async_dot_wait(1, qk)  # wgmma groups retire in order: QK(j) is done, PV(j - 1) may run on
    tlx.barrier_arrive(k_empties[k_buf], 1)
    p, m_i, l_i, alpha = _softmax_update(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift, qk_scale, lo, hi,
                                         MASKED, CAUSAL, WINDOW, SCALE_NONNEG, BLOCK_N, MX)
    acc = tlx.async_dot_wait(0, acc)
    if TRACE_STEPS > 0:
        _log_step(STEP_LOG, pid, CID, kv_cnt, TRACE_STEPS, t_start, t_issued, t_v, clock64())
    tlx.barrier_arrive(v_empties[v_buf], 1)
    # P is carried to the next step in 16 bits (half the registers of fp32; carrying fp32 spills), two values
    # per conversion straight into the packed registers the PV wgmma reads (no byte permutes).
    # Converted after the PV wait: converting while PV is in flight makes ptxas serialize wgmma (C7513).
    p = to_16bit_pairs(p, DTYPE)
    acc = acc * alpha[:, None]
    return acc, p, m_i, l_i


@triton.jit
def _log_step(STEP_LOG, pid, CID: tl.constexpr, kv_cnt, TRACE_STEPS: tl.constexpr, t_start, t_issued, t_v, t_done):
    """CTA 0's K/V steps 0 .. TRACE_STEPS - 1 (its block count ``kv_cnt``, the same in both consumers): row
    ``CID * TRACE_STEPS + kv_cnt`` of STEP_LOG gets, in SM cycles, the step's start, the turn passed (QK^T
    issued; the generic pipeliner's wait after each wgmma makes it QK^T done too), V(j - 1) ready (PV about to
    issue), and the step done (softmax computed, PV retired). No stamp sits between the PV issue and its wait:
    one there would hold the softmax behind PV (ptxas interleaves the two), so the traced build runs the
    shipped schedule. An item's peeled first block is no such step (its row stays -1)."""
    if (pid == 0) & (kv_cnt < TRACE_STEPS):
        row = CID * TRACE_STEPS + kv_cnt
        record_stamp(STEP_LOG, row, STEP_START, t_start, _RECORD)
        record_stamp(STEP_LOG, row, STEP_TURN_PASSED, t_issued, _RECORD)
        record_stamp(STEP_LOG, row, STEP_V_READY, t_v, _RECORD)
        record_stamp(STEP_LOG, row, STEP_DONE, t_done, _RECORD)


@triton.jit
def _produce_item(head, q_row0, m_start, k_row0, j0, n_blocks, rot, q_cnt, kv_cnt, desc_q, desc_k, desc_v,
                  q_tiles, k_tiles, v_tiles, q_fulls, q_empties, k_fulls, k_empties, v_fulls, v_empties, KV_IDX,
                  col_stride_q, col_stride_k, col_stride_v, GROUP: tl.constexpr, SPARSE: tl.constexpr,
                  WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                  NUM_BUFFERS_KV: tl.constexpr, Q_BYTES: tl.constexpr, KV_BYTES: tl.constexpr):
    """Producer, one decoded work item: TMA loads of both consumers' Q halves, then every K/V block the item
    needs in ``_block_start``'s order, each into the next free ring slot. Returns the advanced (q_cnt, kv_cnt)."""
    if n_blocks > 0:
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        q_col = head * col_stride_q
        for c in tl.static_range(_CONSUMERS):
            tlx.barrier_wait(q_empties[c * NUM_BUFFERS_Q + q_buf], q_phase ^ 1)
            tlx.barrier_expect_bytes(q_fulls[c * NUM_BUFFERS_Q + q_buf], Q_BYTES)
            tlx.async_descriptor_load(desc_q, q_tiles[c * NUM_BUFFERS_Q + q_buf],
                                      [q_row0 + m_start + c * BLOCK_M, q_col],
                                      q_fulls[c * NUM_BUFFERS_Q + q_buf])
        k_col = (head // GROUP) * col_stride_k  # grouped-query attention: the query head's key/value head
        v_col = (head // GROUP) * col_stride_v
        for j in tl.range(0, n_blocks):
            kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
            kv_row = k_row0 + _block_start(KV_IDX, j0, j, n_blocks, rot, SPARSE, WINDOW, BLOCK_N)
            tlx.barrier_wait(k_empties[kv_buf], kv_phase ^ 1)
            tlx.barrier_expect_bytes(k_fulls[kv_buf], KV_BYTES)
            tlx.async_descriptor_load(desc_k, k_tiles[kv_buf], [kv_row, k_col], k_fulls[kv_buf])
            tlx.barrier_wait(v_empties[kv_buf], kv_phase ^ 1)
            tlx.barrier_expect_bytes(v_fulls[kv_buf], KV_BYTES)
            tlx.async_descriptor_load(desc_v, v_tiles[kv_buf], [kv_row, v_col], v_fulls[kv_buf])
            kv_cnt += 1
        q_cnt += 1
    return q_cnt, kv_cnt


@triton.jit
def _fill_item(item, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles, k_tiles, v_tiles, q_fulls, q_empties, k_fulls,
               k_empties, v_fulls, v_empties, QS, KS, VS, VB_OFF, TILES, CU_Q, CU_K, ROW_OFF, KV_IDX, num_slots,
               num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, band_lo, band_hi, ring,
               ring_fulls, ring_empties, count, PEEL: tl.constexpr, CAUSAL: tl.constexpr,
               WINDOW: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr,
               MX: tl.constexpr, TILE_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
               Q_BYTES: tl.constexpr, KV_BYTES: tl.constexpr):
    """Producer, one work item: decodes it once, hands it to the consumers (the item ring), then fills its
    buffers by TMA straight into the MMA buffers, or (MX: desc_q/k/v are then the E4M3 bytes) loaded and
    dequantized. Returns the advanced (q_cnt, kv_cnt)."""
    head, q_row0, out_row0, len_q, k_row0, len_k, m_start, causal_shift, j0, n_blocks, lo, hi, rot = _work_item(
        TILES, CU_Q, CU_K, ROW_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
        CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_M, BLOCK_N)
    publish_item(ring, ring_fulls, ring_empties, count, item, head, m_start, len_q, len_k, out_row0, j0, n_blocks,
                 _bulk_blocks(KV_IDX, j0, n_blocks, rot, m_start, len_k, causal_shift, hi, 0, CAUSAL, WINDOW, SPARSE,
                              PEEL, BLOCK_M, BLOCK_N),
                 _bulk_blocks(KV_IDX, j0, n_blocks, rot, m_start, len_k, causal_shift, hi, 1, CAUSAL, WINDOW, SPARSE,
                              PEEL, BLOCK_M, BLOCK_N), lo, hi, rot, WINDOW)
    if MX != "":
        q_cnt, kv_cnt = produce_forward_item_mx(
            item, head, q_row0, m_start, len_q, k_row0, len_k, j0, n_blocks, q_cnt, kv_cnt, desc_q, desc_k, desc_v,
            QS, KS, VS, VB_OFF, q_tiles, k_tiles, v_tiles, q_fulls, q_empties, k_fulls, k_empties, v_fulls,
            v_empties, TILES, num_heads, _CONSUMERS, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV)
    else:
        q_cnt, kv_cnt = _produce_item(
            head, q_row0, m_start, k_row0, j0, n_blocks, rot, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles,
            k_tiles, v_tiles, q_fulls, q_empties, k_fulls, k_empties, v_fulls, v_empties, KV_IDX, col_stride_q,
            col_stride_k, col_stride_v, GROUP, SPARSE, WINDOW, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, Q_BYTES,
            KV_BYTES)
    return q_cnt, kv_cnt


@triton.jit
def _pass_rowless_item(q_cnt, kv_cnt, n_blocks, q_fulls, q_empties, k_fulls, k_empties, v_fulls, v_empties,
                       CID: tl.constexpr, PINGPONG: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                       NUM_BUFFERS_KV: tl.constexpr):
    """A consumer with no query row in the item: no MMA, only the protocol. It waits for each buffer
    before handing it back, so that its arrival counts for this fill and not a later one (the K/V
    empty barriers take both consumers' arrivals), and takes and passes the pingpong turn once per
    block as a computing consumer does (the other one's handshake stays balanced)."""
    if n_blocks > 0:
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        tlx.barrier_wait(q_fulls[CID * NUM_BUFFERS_Q + q_buf], q_phase)
        tlx.barrier_arrive(q_empties[CID * NUM_BUFFERS_Q + q_buf], 1)
        for j in tl.range(0, n_blocks):
            kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
            tlx.barrier_wait(k_fulls[kv_buf], kv_phase)
            if PINGPONG:
                _wait_turn(CID)
                _pass_turn(CID)
            tlx.barrier_arrive(k_empties[kv_buf], 1)
            tlx.barrier_wait(v_fulls[kv_buf], kv_phase)
            tlx.barrier_arrive(v_empties[kv_buf], 1)
            kv_cnt += 1
        q_cnt += 1
    return q_cnt, kv_cnt


@triton.jit
def _consume_item(item, q_cnt, kv_cnt, pid, q_tiles, k_tiles, v_tiles, q_fulls, q_empties, k_fulls, k_empties,
                  v_fulls, v_empties, OUT, LSE, KV_IDX, TIMELINE, stride_ot, stride_oh, num_heads, qk_scale,
                  cid: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                  SPARSE: tl.constexpr, SCALE_NONNEG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, PINGPONG: tl.constexpr,
                  PEEL: tl.constexpr, PROFILE: tl.constexpr, DTYPE: tl.constexpr, MX: tl.constexpr,
                  Q_REGS: tl.constexpr, ring, ring_empties, count, STEP_LOG, TRACE_STEPS: tl.constexpr):
    """Consumer ``cid``, the ``count``-th work item its producer published (``item``, already peeked): its
    BLOCK_M-row half of the tile against every visible K/V block
    (peeled first block, branch-free bulk, masked tail), then the epilogue stores; nothing but the
    handshakes where the half has no row (``_pass_rowless_item``: the other consumer then has the
    tensor cores to itself). Returns the advanced (q_cnt, kv_cnt).

    Q_REGS: the bulk loop's QK^T takes Q from registers (loaded once per item; an RS wgmma), the peeled
    block and the masked tail from shared memory (SS): outside the bulk loop the registers are not free."""
    if PROFILE:
        started = globaltimer()
    head, m_start, len_q, len_k, out_row0, j0, n_blocks, n_bulk, lo, hi, rot = take_item(
        ring, ring_empties, count, cid, WINDOW)
    causal_shift = len_k - len_q
    offs_m = m_start + cid * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    rowless = False  # (a Python bool: the branch below is compiled only where it can be taken)
    if cid > 0:  # consumer 0's half holds the tile's first row, which always exists
        rowless = m_start + cid * BLOCK_M >= len_q
    if rowless:
        q_cnt, kv_cnt = _pass_rowless_item(q_cnt, kv_cnt, n_blocks, q_fulls, q_empties, k_fulls, k_empties,
                                           v_fulls, v_empties, cid, PINGPONG, NUM_BUFFERS_Q, NUM_BUFFERS_KV)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # (every store below is masked)
    elif n_blocks > 0:
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        q_tile = q_tiles[cid * NUM_BUFFERS_Q + q_buf]
        tlx.barrier_wait(q_fulls[cid * NUM_BUFFERS_Q + q_buf], q_phase)

        # block 0, peeled: QK^T and softmax only (its PV is issued by the next step)
        k_buf, k_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
        tlx.barrier_wait(k_fulls[k_buf], k_phase)
        qk = _issue_qk(q_tile, k_tiles[k_buf], cid, PINGPONG)
        qk = tlx.async_dot_wait(0, qk)
        tlx.barrier_arrive(k_empties[k_buf], 1)
        n_start0 = _block_start(KV_IDX, j0, 0, n_blocks, rot, SPARSE, WINDOW, BLOCK_N)
        if n_bulk > 0:
            p, m_i, l_i, _alpha = _softmax_update(qk, m_i, l_i, n_start0, offs_m, len_k, causal_shift, qk_scale, lo, hi, False, CAUSAL,
                                                  WINDOW, SCALE_NONNEG, BLOCK_N, MX)
        else:
            p, m_i, l_i, _alpha = _softmax_update(qk, m_i, l_i, n_start0, offs_m, len_k, causal_shift, qk_scale, lo, hi, True, CAUSAL,
                                                  WINDOW, SCALE_NONNEG, BLOCK_N, MX)
        p = to_16bit_pairs(p, DTYPE)
        kv_cnt += 1
        # the accumulator is created only now, after the first softmax: created before it, the D 128
        # builds run out of registers and spill
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

        # bulk: no mask anywhere
        q_bulk = q_tile
        if Q_REGS:  # the buffer stays held: the masked tail reads it again
            q_bulk = tlx.local_load(q_tile)
        for j in tl.range(1, n_bulk):
            acc, p, m_i, l_i = _kv_step(acc, p, m_i, l_i, q_bulk, k_tiles, v_tiles, k_fulls,
                                        k_empties, v_fulls, v_empties, kv_cnt,
                                        _block_start(KV_IDX, j0, j, n_blocks, rot, SPARSE, WINDOW, BLOCK_N), offs_m,
                                        len_k, causal_shift, qk_scale, lo, hi, cid, False, CAUSAL, WINDOW,
                                        SCALE_NONNEG, PINGPONG, NUM_BUFFERS_KV, BLOCK_N, DTYPE, MX,
                                        STEP_LOG, pid, TRACE_STEPS)
            kv_cnt += 1
        # tail: causal diagonal and the sequence's last partial block, or the window band's edges
        for j in tl.range(tl.maximum(n_bulk, 1), n_blocks):
            acc, p, m_i, l_i = _kv_step(acc, p, m_i, l_i, q_tile, k_tiles, v_tiles, k_fulls,
                                        k_empties, v_fulls, v_empties, kv_cnt,
                                        _block_start(KV_IDX, j0, j, n_blocks, rot, SPARSE, WINDOW, BLOCK_N), offs_m,
                                        len_k, causal_shift, qk_scale, lo, hi, cid, True, CAUSAL, WINDOW,
                                        SCALE_NONNEG, PINGPONG, NUM_BUFFERS_KV, BLOCK_N, DTYPE, MX,
                                        STEP_LOG, pid, TRACE_STEPS)
            kv_cnt += 1
        # every QK^T of this item has completed: hand the Q buffer back
        tlx.barrier_arrive(q_empties[cid * NUM_BUFFERS_Q + q_buf], 1)

        # PV of the last block
        v_buf, v_phase = bufidx_phase(kv_cnt - 1, NUM_BUFFERS_KV)
        tlx.barrier_wait(v_fulls[v_buf], v_phase)
        acc = tlx.async_dot(p, v_tiles[v_buf], acc)
        acc = tlx.async_dot_wait(0, acc)
        tlx.barrier_arrive(v_empties[v_buf], 1)
        q_cnt += 1
    else:
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # epilogue: rows that saw no key have l == 0 exactly -> out 0, lse -inf (the contract).
    # Masked pointer stores: a row past this sequence's Lq belongs to the next sequence.
    if MX != "":  # the portable MX kernel's epilogue: a NaN operand's NaN reaches out and lse
        seen = l_i != 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        out = acc / l_safe[:, None]
    else:
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        out = acc * (1.0 / l_safe)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    row_ok = offs_m < len_q
    offs_d = tl.arange(0, HEAD_DIM)
    out_rows = out_row0 + offs_m.to(tl.int64)
    o_ptrs = OUT + out_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + out_rows * num_heads + head, lse, mask=row_ok)
    if PROFILE:
        if cid == 0:  # one record per item (PROFILE_FIELDS)
            record_stamp(TIMELINE, item, REC_SM, smid(), _RECORD)
            record_stamp(TIMELINE, item, REC_START_NS, started, _RECORD)
            record_stamp(TIMELINE, item, REC_END_NS, globaltimer(), _RECORD)
            record_stamp(TIMELINE, item, REC_CTA, pid, _RECORD)
    return q_cnt, kv_cnt


# per-batch values: no recompiles, and one specialisation per config (the one the offline gate compiles)
@triton.jit(do_not_specialize=["num_items", "num_slots", "num_seqs", "num_heads", "len_q_bcast", "band_lo",
                               "band_hi"])
def jagged_fwd_tlx_kernel(
    desc_q, desc_k, desc_v, OUT, LSE, CU_Q, CU_K, TILES, ROW_OFF, KV_IDX, QS, KS, VS, VB_OFF, COUNTER, TIMELINE,
    stride_ot, stride_oh, col_stride_q, col_stride_k, col_stride_v,
    num_items, num_slots, num_seqs, num_heads, len_q_bcast, sm_scale, band_lo, band_hi,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, GROUP: tl.constexpr,
    BROADCAST_Q: tl.constexpr, SCALE_NONNEG: tl.constexpr, SPARSE: tl.constexpr, MX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
    CONSUMER_REGS: tl.constexpr, DYNAMIC: tl.constexpr, PINGPONG: tl.constexpr, PEEL: tl.constexpr,
    PROFILE: tl.constexpr, Q_REGS: tl.constexpr, TRACE_STEPS: tl.constexpr,
):
    """MX ("" or the P rule): "" reads q, k, v (bf16/fp16) by TMA straight into the MMA buffers; an MXFP8
    build reads E4M3 bytes (desc_q/k/v are then uint8 pointers) and the scales QS, KS (D-axis) and VS
    (token-axis, sequence b's first scale row VB_OFF[b]); its producer dequantizes into the bf16 buffers
    (``mx_producers.produce_forward_item_mx``)."""
    tl.static_assert(_CONSUMERS == 2, "the pingpong handshake (named barriers 9/10) is written for two")
    tl.static_assert(MX == "" or not WINDOW, "the MX producer loads its blocks in ascending order: no window")
    TILE_M: tl.constexpr = _CONSUMERS * BLOCK_M  # rows of one work item: one BLOCK_M half per consumer
    DTYPE: tl.constexpr = tl.bfloat16 if MX != "" else tlx.dtype_of(desc_q)
    Q_BYTES: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(DTYPE)
    KV_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(DTYPE)

    pid = tl.program_id(0)
    num_progs = tl.num_programs(0)

    # shared memory: Q per consumer (index cid * NUM_BUFFERS_Q + b), K and V rings shared by both
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, _CONSUMERS * NUM_BUFFERS_Q)
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, NUM_BUFFERS_KV)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, NUM_BUFFERS_KV)
    q_fulls = tlx.alloc_barriers(num_barriers=_CONSUMERS * NUM_BUFFERS_Q, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=_CONSUMERS * NUM_BUFFERS_Q, arrive_count=1)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    k_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=_CONSUMERS)  # one per consumer
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    v_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=_CONSUMERS)
    # the producer hands each item to the consumers decoded (``item_ring.publish_item``)
    ring = tlx.local_alloc((1,), tl.int32, ITEM_BUFFERS * (ITEM_FIELDS + WINDOW_FIELDS * WINDOW))
    ring_fulls = tlx.alloc_barriers(num_barriers=ITEM_BUFFERS, arrive_count=1)
    ring_empties = tlx.alloc_barriers(num_barriers=ITEM_BUFFERS, arrive_count=_CONSUMERS)
    step_log = TIMELINE  # (never written without TRACE_STEPS)
    if TRACE_STEPS > 0:  # the step rows follow the item records
        step_log = TIMELINE + num_items.to(tl.int64) * _RECORD

    with tlx.async_tasks():
        # ---------------------------------------------------------------- producer: TMA loads
        with tlx.async_task("default"):
            q_cnt = 0
            kv_cnt = 0
            count = 0  # items published so far
            if DYNAMIC:
                item = tl.atomic_add(COUNTER, 1)
                while item < num_items:
                    q_cnt, kv_cnt = _fill_item(
                        item, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles, k_tiles, v_tiles, q_fulls, q_empties,
                        k_fulls, k_empties, v_fulls, v_empties, QS, KS, VS, VB_OFF,
                        TILES, CU_Q, CU_K, ROW_OFF, KV_IDX, num_slots, num_heads,
                        num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, band_lo, band_hi,
                        ring, ring_fulls, ring_empties, count, PEEL, CAUSAL,
                        WINDOW, GROUP, BROADCAST_Q, SPARSE, MX, TILE_M, HEAD_DIM, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q,
                        NUM_BUFFERS_KV, Q_BYTES, KV_BYTES)
                    count += 1
                    item = tl.atomic_add(COUNTER, 1)
                retire_counter(COUNTER, num_progs)
            else:
                for rounds in range(0, tl.cdiv(num_items, num_progs)):
                    item = static_item(rounds, pid, num_progs, True)
                    if item < num_items:
                        q_cnt, kv_cnt = _fill_item(
                            item, q_cnt, kv_cnt, desc_q, desc_k, desc_v, q_tiles, k_tiles, v_tiles, q_fulls,
                            q_empties, k_fulls, k_empties, v_fulls, v_empties, QS, KS, VS, VB_OFF,
                            TILES, CU_Q, CU_K, ROW_OFF, KV_IDX, num_slots,
                            num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, band_lo,
                            band_hi, ring, ring_fulls, ring_empties, count, PEEL, CAUSAL, WINDOW, GROUP,
                            BROADCAST_Q, SPARSE, MX, TILE_M, HEAD_DIM, BLOCK_M,
                            BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV, Q_BYTES, KV_BYTES)
                        count += 1
            publish_end(ring, ring_fulls, ring_empties, count, num_items, WINDOW)

        # ---------------------------------------------------------------- consumers: wgmma + softmax
        with tlx.async_task(num_warps=_CONSUMER_WARPS, registers=CONSUMER_REGS, replicate=_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if PINGPONG:
                if cid == 1:
                    tlx.named_barrier_arrive(BAR_TO_C0, PINGPONG_THREADS)  # lets consumer 0 issue the first QK^T
            qk_scale = sm_scale * 1.4426950408889634  # log2(e): the loop works in base 2
            q_cnt = 0
            kv_cnt = 0
            count = 0
            item = peek_item(ring, ring_fulls, count, WINDOW)
            while item < num_items:
                q_cnt, kv_cnt = _consume_item(
                    item, q_cnt, kv_cnt, pid, q_tiles, k_tiles, v_tiles, q_fulls, q_empties, k_fulls, k_empties,
                    v_fulls, v_empties, OUT, LSE, KV_IDX, TIMELINE, stride_ot, stride_oh, num_heads, qk_scale, cid,
                    HEAD_DIM, CAUSAL, WINDOW, SPARSE, SCALE_NONNEG, BLOCK_M, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV,
                    PINGPONG, PEEL, PROFILE, DTYPE, MX, Q_REGS, ring, ring_empties, count, step_log, TRACE_STEPS)
                count += 1
                item = peek_item(ring, ring_fulls, count, WINDOW)


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------
def supports(q: torch.Tensor, head_dim: int, dtype: torch.dtype, *, k: Optional[torch.Tensor] = None,
             v: Optional[torch.Tensor] = None, window=(-1, -1)) -> tuple[bool, str]:
    """Whether this kernel can run these inputs, and why not. Reads the launch target's capability (at
    call time only). ``k``/``v``, when given, get the same memory-layout checks as ``q``; grouped key/value
    heads and sliding windows (``window``, the API's ``window_size``) are supported."""
    return check_inputs({"q": q, "k": k, "v": v}, dtype=dtype, head_dim=head_dim, head_dims=SUPPORTED_HEAD_DIMS)


@dataclass(frozen=True)
class Variant:
    """Switches of the ablation study (``python -m jfa.bench.ablation forward``); the defaults are what
    ships. ``JFA_TLX_VARIANT="schedule=dynamic,pingpong=0"`` (``knobs.tlx_variant``) overrides them for
    measurements through the public API."""

    # How a persistent grid deals the items (one of SCHEDULES). Zig-zag over the longest-first list: the items
    # at work at one time share their sequences' keys in L2, and without a mask a sequence's items cost the
    # same (from the counter: 0-12% slower on the gem shapes, 8% on windows, NOTES.md session 38). A causal
    # item's cost grows with its tile's place in the sequence: where long sequences differ in length the zig-zag
    # CTAs end unevenly, and those launches (``for_launch``) take ``long_causal_schedule`` (from the counter:
    # 1.13x longtail, 1.17x full-B8, 1.03-1.16x on uniform lengths averaging 7-12 tiles; 0.74-0.92x on sequences
    # of one length up to 8 tiles and 0.98x at 16, which stay zig-zag; NOTES.md sessions 38, 41)
    schedule: str = "zigzag"
    long_causal_schedule: str = "dynamic"
    persistent: bool = True  # False: one CTA per work item, dealt by the hardware block scheduler
    longest_first: bool = True  # False: work items in batch order (no LPT sort of the tile list)
    pingpong: bool = True  # False: consumers issue QK^T whenever ready (no named-barrier handshake)
    peel: bool = True  # False: every key block goes through the masked softmax
    # the bulk loop's Q operand: None = the config's (``HopperForwardConfig.q_in_registers``), True registers,
    # False shared memory. bf16/fp16 builds only: the MX builds keep Q in shared memory
    q_regs: Optional[bool] = None

    def __post_init__(self):
        for name in ("schedule", "long_causal_schedule"):
            if getattr(self, name) not in SCHEDULES:
                raise ValueError(f"Variant.{name}: must be one of {SCHEDULES}, got {getattr(self, name)!r}")

    def for_launch(self, *, causal: bool, window, rows: int, num_seqs: int, tile_rows: int,
                   longest_rows: Optional[int] = None) -> "Variant":
        """The variant one dense launch runs: ``long_causal_schedule`` as its schedule where the launch is
        causal without a window (``jfa.kernels.bands.window_band``) and its ``rows`` output rows over the
        ``num_seqs`` sequences average at least LONG_CAUSAL_TILES items of ``tile_rows`` with the longest
        sequence's ``longest_rows`` at least UNEVEN_LENGTHS times that mean (None, unknown: taken as uneven), or
        average at least VERY_LONG_CAUSAL_TILES items; itself otherwise."""
        causal, banded, _, _ = window_band(causal, window)
        if not causal or banded or rows < LONG_CAUSAL_TILES * tile_rows * num_seqs:
            return self
        uneven = longest_rows is None or longest_rows * num_seqs >= UNEVEN_LENGTHS * rows
        if uneven or rows >= VERY_LONG_CAUSAL_TILES * tile_rows * num_seqs:
            return replace(self, schedule=self.long_causal_schedule)
        return self

    @property
    def dynamic(self) -> bool:
        """Whether the launch takes its items from the global counter."""
        return self.schedule == "dynamic"

    @classmethod
    def parse(cls, switches) -> "Variant":
        """``"schedule=dynamic,pingpong=0"`` (or its mapping) -> Variant; unknown keys, bad values raise."""
        if isinstance(switches, str):
            switches = knobs.parse_switches(switches, knobs.KNOBS["tlx_variant"].env)
        return make_variant(cls, switches, knobs.KNOBS["tlx_variant"].env)

    def name(self) -> str:
        flags = [f" -{f}" for f in ("persistent", "longest_first", "pingpong", "peel") if not getattr(self, f)]
        if self.q_regs is not None:
            flags.append(" +q_regs" if self.q_regs else " -q_regs")
        if self.long_causal_schedule != SHIPPED.long_causal_schedule:
            flags.append(f" long_causal={self.long_causal_schedule}")
        return self.schedule + "".join(flags)


SHIPPED = Variant()


def variant_from_knobs() -> Variant:
    """What ships, or the switches ``knobs.tlx_variant`` names."""
    switches = knobs.tlx_variant
    return Variant.parse(switches) if switches else SHIPPED


def _constexprs(cfg: HopperForwardConfig, head_dim: int, *, causal: bool, broadcast_q: bool,
                scale_nonneg: bool, window: bool = False, group: int = 1, variant: Variant = SHIPPED,
                profile: bool = False, sparse: bool = False, mx: str = "", trace_steps: int = 0) -> dict:
    """The compile-time arguments of one launch (shared by the launcher and the offline compile gate).
    Without a window the band offsets are constexpr None: the build takes no band parameters at all."""
    constants = dict(HEAD_DIM=head_dim, CAUSAL=causal, WINDOW=window, GROUP=group, BROADCAST_Q=broadcast_q,
                     SCALE_NONNEG=scale_nonneg, SPARSE=sparse, MX=mx, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                     NUM_BUFFERS_Q=cfg.num_buffers_q, NUM_BUFFERS_KV=cfg.num_buffers_kv,
                     CONSUMER_REGS=cfg.consumer_regs, DYNAMIC=variant.dynamic,
                     PINGPONG=variant.pingpong, PEEL=variant.peel, PROFILE=profile,
                     Q_REGS=not mx and (cfg.q_in_registers if variant.q_regs is None else variant.q_regs),
                     TRACE_STEPS=trace_steps)
    if not window:
        constants.update(band_lo=None, band_hi=None)
    return constants


def compiled_as_configured(cfg: HopperForwardConfig):
    """The block every launch of ``cfg``'s build runs in: compiled with the LLVM setting the config asks for
    (``llvm_o0``; part of the compile cache key, so the binary is the one the offline gate checks)."""
    return pipeline.build_llvm_o0(jagged_fwd_tlx_kernel.fn.__name__, cfg.llvm_o0)


def _launch_options() -> dict:
    # num_warps is the default (producer) partition; the consumers add 2 x 4 warps (12 in all).
    # num_stages=1: the pipelining is explicit (mbarrier rings), Triton's own pipeliner stays off.
    return dict(num_warps=PRODUCER_WARPS, num_stages=1)


def compile_spec(dtype: str, head_dim: int, *, causal: bool, broadcast_q: bool, window: bool = False,
                 group: int = 1, variant: Variant = SHIPPED, profile: bool = False, sparse: bool = False,
                 mx: str = ""):
    """``(kernel, signature, constants, attrs, options)`` for an offline ``triton.compile`` of one
    config (the compile gate). Descriptors are typed from the config's block shapes (as the launcher's
    binder spells them). ``dtype``: the inputs' (and output's) type; with ``mx`` (an MXFP8 build) the
    output's, the inputs being E4M3 bytes."""
    cfg = config_for(head_dim, mx)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, scale_nonneg=True,
                            window=window, group=group, variant=variant, profile=profile, sparse=sparse, mx=mx)
    types = {f"desc_{x}": "*u8" if mx else f"tensordesc<{dtype}[{rows}, {head_dim}]>"
             for x, rows in (("q", cfg.block_m), ("k", cfg.block_n), ("v", cfg.block_n))}
    scales = "*u8" if mx else "*i32"  # a bf16 launch passes the tile list for the unused scale pointers
    types.update(OUT=f"*{dtype}", LSE="*fp32", CU_Q="*i32", CU_K="*i32", TILES="*i32", ROW_OFF="*i32",
                 KV_IDX="*i32", QS=scales, KS=scales, VS=scales, VB_OFF="*i32", COUNTER="*i32",
                 TIMELINE="*i64", sm_scale="fp32")
    signature, attrs = offline_signature(jagged_fwd_tlx_kernel, constants, types)
    return jagged_fwd_tlx_kernel, signature, constants, attrs, _launch_options()


def kernel_arguments(q, k, v, out, lse, out_cu, cu_k, tiles, counter, timeline, *, causal: bool,
                     softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int,
                     window=(-1, -1), variant: Variant = SHIPPED, profile: bool = False,
                     lists=None, mx=None, trace_steps: int = 0) -> tuple[tuple, dict, int]:
    """(positional args, keyword args, number of work items) of one launch. Touches no GPU, so the
    offline gate can bind them to the kernel on a CPU machine and check that a launch specialises to the
    very signature ``compile_spec`` compiles. ``window``: the API's ``window_size`` (causal folded in).
    ``lists``: block-sparse lists (``jfa.kernels.block_lists.BlockLists``, blocks of one work item's rows);
    ``tiles`` then carries each slot's query block as a third row (``sparse_tiles``). ``mx``: an MXFP8
    launch's ``(rule, q scales, k scales, v scales, v block offsets)``, with q, k, v its E4M3 bytes (uint8)."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    causal, banded, band_lo, band_hi = window_band(causal, window)
    rule = mx[0] if mx is not None else ""
    cfg = config_for(head_dim, rule)
    if mx is not None:  # the MX producer reads the (contiguous) E4M3 bytes with plain loads
        (desc_q, col_q), (desc_k, col_k), (desc_v, col_v) = ((t, head_dim) for t in (q, k, v))
    else:
        desc_q, col_q = descriptor(q, cfg.block_m)
        desc_k, col_k = descriptor(k, cfg.block_n)
        desc_v, col_v = descriptor(v, cfg.block_n)
    num_items = tiles.num_slots * num_heads
    cu_q = cu_k if broadcast_q else out_cu  # never read for a broadcast Q; cu_k keeps one pointer type
    # a dense launch never reads the lists: any int32 pointer stands in
    row_off, kv_idx = (lists.offsets, lists.indices) if lists is not None else (tiles.tiles, tiles.tiles)
    scales = tuple(mx[1:]) if mx is not None else (tiles.tiles,) * 4  # (never read by a bf16 launch)
    args = (desc_q, desc_k, desc_v, out, lse, cu_q, cu_k, tiles.tiles, row_off, kv_idx, *scales, counter, timeline,
            out.stride(0), out.stride(1), col_q, col_k, col_v, num_items, tiles.num_slots, num_seqs, num_heads,
            len_q_bcast, softmax_scale)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, scale_nonneg=softmax_scale >= 0,
                            window=banded, group=num_heads // k.shape[1], variant=variant, profile=profile,
                            sparse=lists is not None, mx=rule, trace_steps=trace_steps)
    # the band offsets are positional (None without a window, which the binder makes constexpr)
    args += (constants.pop("band_lo", band_lo), constants.pop("band_hi", band_hi))
    kwargs = {**constants, **_launch_options()}
    return args, kwargs, num_items


_UNUSED_TIMELINES: dict = {}


def _unused_timeline(device: torch.device) -> torch.Tensor:
    """The TIMELINE argument of a launch that records nothing (never written): one per device, so the
    hot path allocates nothing for it."""
    if device not in _UNUSED_TIMELINES:
        _UNUSED_TIMELINES[device] = torch.empty((1, len(PROFILE_FIELDS)), dtype=torch.int64, device=device)
    return _UNUSED_TIMELINES[device]


@dataclass
class Timeline:
    """What a profiling launch recorded: one row per work item (SM, start ns, end ns, CTA), -1 where an
    item was never run; ``seq``/``tile`` name the item's tile (``seq == num_seqs``: a spare slot),
    ``kv_len`` its key length; ``grid`` the CTAs launched. ``steps`` (a launch with ``trace_steps``): CTA 0's
    K/V steps, [consumer, step, (start, turn passed, V ready, done)] in SM cycles, -1 where no bulk or tail step
    ran (``_log_step``)."""

    records: torch.Tensor  # int64 [num_items, len(PROFILE_FIELDS)]
    seq: torch.Tensor
    tile: torch.Tensor
    kv_len: torch.Tensor
    num_heads: int
    grid: int
    variant: Variant
    steps: Optional[torch.Tensor] = None  # int64 [2, trace_steps, len(STEP_FIELDS)]


class _PlannedForward:
    """The forward of one call structure (``jfa.plans``), its launch prepared: a call allocates the
    outputs, re-bases the kept descriptors on its q, k, v and launches."""

    __slots__ = ("launch", "grid", "out_shape", "lse_shape", "descriptors", "dynamic", "cfg")

    # the kernel parameters a planned call replaces: the inputs' descriptors and the outputs, and for the
    # dynamic schedule the current stream's work counter (the static schedules never read it)
    REPLACED = ("desc_q", "desc_k", "desc_v", "OUT", "LSE")
    REPLACED_DYNAMIC = REPLACED + ("COUNTER",)

    def __init__(self, launch, grid: int, out: torch.Tensor, lse: torch.Tensor, descriptors: tuple, dynamic: bool,
                 cfg: HopperForwardConfig):
        self.launch, self.grid, self.descriptors, self.dynamic, self.cfg = launch, grid, descriptors, dynamic, cfg
        self.out_shape, self.lse_shape = out.shape, lse.shape

    @classmethod
    def replaced(cls, dynamic: bool, extra: tuple = ()) -> tuple:
        """The parameters a planned call replaces, in the order ``__call__`` passes them (``extra`` last)."""
        return (cls.REPLACED_DYNAMIC if dynamic else cls.REPLACED) + extra

    def __call__(self, q, k, v, *extra):
        """(out, lse), or None when the prepared launch cannot run (the caller launches the usual way).
        ``extra``: the values of the ``extra`` parameters it was prepared with (``replaced``)."""
        out = alloc.empty(self.out_shape, q.dtype, q.device)
        lse = alloc.empty(self.lse_shape, torch.float32, q.device)
        desc_q, desc_k, desc_v = self.descriptors
        replacements = (rebased(desc_q, q), rebased(desc_k, k), rebased(desc_v, v), out, lse)
        if self.dynamic:
            replacements += (work_counter(q.device),)
        with compiled_as_configured(self.cfg):
            ran = self.launch.run((self.grid,), replacements + extra)
        if not ran:
            return None
        return out, lse


def jagged_forward_tlx(q, k, v, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                       num_seqs: int, len_q_bcast: int = 0, longest_q: Optional[int] = None,
                       variant: Optional[Variant] = None, profile: bool = False, window=(-1, -1), plan=None,
                       trace_steps: int = 0):
    """Launch the forward; same contract as ``jfa.kernels.triton.forward.jagged_forward``. Returns
    (out [rows, H, D] in q's dtype, lse [rows, H] float32), rows = ``total_q`` or ``B * Lq`` for a
    broadcast Q (``cu_q`` is ignored then). Raises ValueError when ``supports`` says no.

    ``window``: as the API's ``window_size``; ``k``/``v`` may have fewer heads (a divisor of q's).
    ``longest_q``: the longest query sequence's rows, if known: with the mean it says whether a long causal
    launch's lengths are uneven enough for the counter (``Variant.for_launch``).
    ``variant``: ablation switches (default: ``knobs.tlx_variant`` or what ships). ``profile=True``
    launches the profiling build and returns ``(out, lse, Timeline)`` (None for the timeline when no
    kernel ran); ``trace_steps`` > 0 (with ``profile``) also logs CTA 0's first K/V steps (``Timeline.steps``).
    ``plan``: the call's plan (``jfa.plans``): the first call keeps its prepared launch there, later ones
    (same structure, validated by the plan's key) reuse it."""
    if not isinstance(trace_steps, int) or trace_steps < 0:
        raise ValueError(f"jagged_forward_tlx: trace_steps must be an int >= 0, got {trace_steps!r}")
    if trace_steps and not profile:
        raise ValueError(f"jagged_forward_tlx: trace_steps={trace_steps} logs into the profiling build's timeline: "
                         "it needs profile=True")
    planned = plan.memo.get("tlx_forward") if plan is not None and not profile else None
    if planned is not None:
        result = planned(q, k, v)
        if result is not None:
            return result
    variant = variant_from_knobs() if variant is None else variant
    head_dim, num_heads = q.shape[-1], q.shape[1]
    ok, reason = supports(q, head_dim, q.dtype, k=k, v=v, window=window)
    if not ok:
        raise ValueError(f"jagged_forward_tlx: {reason}")
    cfg = config_for(head_dim)
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q)
    if rows == 0 or k.shape[0] == 0:
        # no row, or no key anywhere: every row sees none (and TMA cannot describe an empty tensor)
        return (*alloc.unseen(out, lse), None) if profile else alloc.unseen(out, lse)
    # (a broadcast Q's sequences all have Lq rows; its items' work differs with the keys: unknown)
    variant = variant.for_launch(causal=causal, window=window, rows=rows, num_seqs=num_seqs,
                                 tile_rows=NUM_CONSUMERS * cfg.block_m, longest_rows=None if broadcast_q else longest_q)
    tiles = build_tile_list(out_cu, rows, NUM_CONSUMERS * cfg.block_m,
                            work_offsets=cu_k if variant.longest_first else None)
    counter = schedule_counter(variant.dynamic, q.device, tiles.tiles)
    num_items = tiles.num_slots * num_heads
    timeline = (torch.full((num_items + NUM_CONSUMERS * trace_steps, len(PROFILE_FIELDS)), -1, dtype=torch.int64,
                           device=q.device)
                if profile else _unused_timeline(q.device))
    args, kwargs, num_items = kernel_arguments(q, k, v, out, lse, out_cu, cu_k, tiles, counter, timeline,
                                               causal=causal, softmax_scale=softmax_scale,
                                               broadcast_q=broadcast_q, num_seqs=num_seqs,
                                               len_q_bcast=len_q_bcast, window=window, variant=variant,
                                               profile=profile, trace_steps=trace_steps)
    grid = min(sm_count(q.device), num_items) if variant.persistent else num_items
    with compiled_as_configured(cfg):
        target.launch(jagged_fwd_tlx_kernel, (grid,), q.device, *args, **kwargs)
        if plan is not None and not profile:
            dynamic = kwargs["DYNAMIC"]
            prepared = target.prepare(jagged_fwd_tlx_kernel, q.device, args, kwargs,
                                      _PlannedForward.replaced(dynamic))
            if prepared is not None:
                plan.memo["tlx_forward"] = _PlannedForward(prepared, grid, out, lse, args[:3], dynamic, cfg)
    if not profile:
        return out, lse
    seq, tile = tiles.tiles[0].long(), tiles.tiles[1].long()
    kv = torch.cat([cu_k[1:] - cu_k[:-1], cu_k.new_zeros(1)]).long()[seq]
    expand = lambda t: t.repeat_interleave(num_heads)  # noqa: E731 - items are (slot, head), head fastest
    steps = timeline[num_items:].view(NUM_CONSUMERS, trace_steps, len(STEP_FIELDS)) if trace_steps else None
    return out, lse, Timeline(timeline[:num_items], expand(seq), expand(tile), expand(kv), num_heads, grid, variant,
                              steps)


def mx_supports(q, k, v, window=(-1, -1)) -> tuple[bool, str]:
    """Whether the MXFP8 build runs these operands, and why not: MXTensors (q, k along dim, v along tokens)
    or the high-precision tensors a call quantizes; head dim 64 or 128, an sm_90 device, no sliding window
    (its build spills a register at D 128). The launcher makes the E4M3 bytes contiguous, so their layout
    is never the reason."""
    axes = tuple(getattr(t, "axis", None) for t in (q, k, v))
    if axes != (None,) * 3 and axes != ("dim", "dim", "tokens"):
        return False, f"MX axes {axes} (the kernel takes ('dim', 'dim', 'tokens'))"
    if tuple(window) not in ((-1, -1), (-1, 0)):
        return False, f"window_size {tuple(window)} (the TLX MXFP8 forward has no windowed build)"
    probe = torch.empty((0, q.shape[1], q.shape[-1]), dtype=torch.uint8, device=q.device)
    return check_inputs({"q": probe}, dtype=torch.bfloat16, head_dim=q.shape[-1],
                        head_dims=tuple(sorted(_MX_CONFIGS)))


def mx_forward_tlx(q, k, v, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool, num_seqs: int,
                   len_q_bcast: int = 0, window=(-1, -1), rule: str = "floor", out_dtype=torch.bfloat16):
    """MXFP8 forward on the TLX kernel (``MX`` build): the contract of the portable
    ``jfa.kernels.triton.mx_attention.mx_forward`` (docs/mxfp8.md section 2), q, k, v MXTensors. Returns
    (out ``[rows, H, D]`` out_dtype, lse ``[rows, H]`` fp32). Raises ValueError where ``mx_supports`` says no."""
    from jfa import mx as jmx

    if rule not in MX_RULES:
        raise ValueError(f"rule: must be one of {MX_RULES}, got {rule!r}")
    ok, reason = mx_supports(q, k, v, window)
    if not ok:
        raise ValueError(f"mx_forward_tlx: {reason}")
    head_dim = q.shape[-1]
    cfg = config_for(head_dim, rule)
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q, out_dtype)
    if rows == 0 or k.shape[0] == 0:
        return alloc.unseen(out, lse)
    tiles = build_tile_list(out_cu, rows, NUM_CONSUMERS * cfg.block_m, work_offsets=cu_k)
    data = [t.data.contiguous().view(torch.uint8) for t in (q, k, v)]
    scales = (rule, q.scales.contiguous(), k.scales.contiguous(), v.scales.contiguous(),
              jmx.token_block_offsets(cu_k))
    args, kwargs, num_items = kernel_arguments(*data, out, lse, out_cu, cu_k, tiles,
                                               schedule_counter(SHIPPED.dynamic, q.device, tiles.tiles),
                                               _unused_timeline(q.device), causal=causal, softmax_scale=softmax_scale,
                                               broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast,
                                               window=window, mx=scales)
    with compiled_as_configured(cfg):
        target.launch(jagged_fwd_tlx_kernel, (min(sm_count(q.device), num_items),), q.device, *args, **kwargs)
    return out, lse


def sparse_tiles(lists, out_cu, rows: int):
    """The work list of a block-sparse launch: the query blocks' (sequence, tile, block) as three int32
    rows in ``jfa.kernels.block_lists.slot_order`` (sequences by listed blocks); a TileList whose
    ``tiles`` has the extra row. It follows from the lists' offsets (the listed counts) and the output
    offsets alone, so calls that share them (a selection's lists share their offsets across calls of one
    batch) build it once."""
    return _sparse_work.get_or_build((lists.offsets, out_cu), (rows, lists.block_size, lists.num_heads),
                                     lambda: _sparse_tiles(lists, out_cu, rows))


def _sparse_tiles(lists, out_cu, rows: int):
    from jfa.kernels.block_lists import query_blocks, slot_order
    from jfa.kernels.schedule import TileList

    blocks = query_blocks(out_cu, rows, lists.block_size)
    order = slot_order(lists, blocks).long()
    tiles = torch.cat([blocks.tiles[:, order], order.to(torch.int32)[None]]).contiguous()
    return TileList(tiles, blocks.num_slots, blocks.num_seqs, blocks.block)


_sparse_work = IdentityCache()



def sparse_supports(q, k, v, block_size: int) -> tuple[bool, str]:
    """Whether the block-sparse build runs these inputs (the dense rules, and blocks of one work item)."""
    ok, reason = supports(q, q.shape[-1], q.dtype, k=k, v=v)
    if not ok:
        return False, reason
    cfg = config_for(q.shape[-1])
    if block_size != NUM_CONSUMERS * cfg.block_m or block_size != cfg.block_n:
        return False, f"block_size {block_size} (the TLX sparse kernels take {NUM_CONSUMERS * cfg.block_m})"
    return True, ""


def block_sparse_forward_tlx(q, k, v, cu_q, cu_k, lists, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                             num_seqs: int, len_q_bcast: int = 0, plan=None):
    """Block-sparse forward on the TLX kernel (``SPARSE`` build); the contract of
    ``jfa.kernels.triton.block_sparse.block_sparse_forward``. Raises ValueError where ``sparse_supports``
    says no. ``plan``: the call's plan (``jfa.plans``; calls with a selection rule): the first call keeps its
    prepared launch there, later ones replace the inputs' descriptors, the outputs and the lists' indices.
    The lists' offsets and the work list stay the prepared ones: a selection's offsets follow from the plan's
    key (the offsets tensors and the rule), so every call of the plan has the same."""
    planned = plan.memo.get("tlx_sparse_forward") if plan is not None else None
    if planned is not None:
        result = planned(q, k, v, lists.indices)
        if result is not None:
            return result
    ok, reason = sparse_supports(q, k, v, lists.block_size)
    if not ok:
        raise ValueError(f"block_sparse_forward_tlx: {reason}")
    head_dim = q.shape[-1]
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q)
    if rows == 0 or k.shape[0] == 0 or lists.num_q_slots == 0:
        return alloc.unseen(out, lse)
    tiles = sparse_tiles(lists, out_cu, rows)
    variant = variant_from_knobs()
    args, kwargs, num_items = kernel_arguments(q, k, v, out, lse, out_cu, cu_k, tiles,
                                               schedule_counter(variant.dynamic, q.device, tiles.tiles),
                                               _unused_timeline(q.device), causal=causal, softmax_scale=softmax_scale,
                                               broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast,
                                               lists=lists, variant=variant)
    grid = min(sm_count(q.device), num_items)
    cfg = config_for(head_dim)
    with compiled_as_configured(cfg):
        target.launch(jagged_fwd_tlx_kernel, (grid,), q.device, *args, **kwargs)
        if plan is not None:
            dynamic = kwargs["DYNAMIC"]
            prepared = target.prepare(jagged_fwd_tlx_kernel, q.device, args, kwargs,
                                      _PlannedForward.replaced(dynamic, ("KV_IDX",)))
            if prepared is not None:
                plan.memo["tlx_sparse_forward"] = _PlannedForward(prepared, grid, out, lse, args[:3], dynamic, cfg)
    return out, lse
