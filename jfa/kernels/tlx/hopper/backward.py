"""Jagged FlashAttention backward for Hopper (sm_90a) in TLX: the dK/dV kernel, with dQ fused into it.

``jagged_backward_tlx`` is what autograd runs after the TLX forward: a pre-pass for the row statistics
(lse and delta = rowsum(dO * O), ``row_stats``), then this kernel for dK and dV, and dQ either fused
into it (below) or from the portable dQ pass (no atomics, bitwise reproducible: every
``deterministic=True`` call). A fused dQ build (``FUSED_DQ``) also computes dQ = dS K per step and
reduce-adds it into an fp32 accumulator (``DqAccumulator``) by TMA from double-buffered shared memory,
replacing the portable dQ pass. At D 64 the producer warpgroup computes it (``DQ_PRODUCER``; the
consumers only store dS^T), over both consumers' keys, one reduce-add per step. At D 128 the fused build
runs 64-row query steps (``D128_STEPS64``, since session 11: S^T and dP^T at N = 64 read two thirds of
the shared memory per FLOP of 32-row steps) and each consumer computes dQ^T for one head-dim half over both
consumers' keys (``DQ_HALVES``, FA3's split), reduce-adding it a step later (``halves_send_late``); its
LLVM IR is left to ptxas (``HopperDkDvConfig.llvm_o0``: with LLVM's loop-invariant code motion its
consumers spilled). The deterministic D 128 build keeps 32-row steps, where the steps are below wgmma's
M of 64 and a fused dQ would be computed transposed (dQ^T = K^T dS^T, ``DQ_T``; the ablation's
``steps64=0`` builds). The fused dQ ships at D 64 and D 128 (``JFA_TLX_FUSED_DQ=0`` turns it off), never
for ``deterministic=True`` (``gpu_check bwd-ablation``, BENCHMARKS.md).

Shape of the kernel (the forward's structure turned around: keys are the rows):

* Persistent grid, one CTA per SM, dealing work items round-robin over a longest-first list (the
  forward's ``_static_item``; ``BackwardVariant.schedule``). A work item is (key tile of
  ``2 * BLOCK_N`` rows, head); the tile list is built on the key offsets and sorted by each sequence's
  query length (the work a key tile streams over).
* Producer (default partition, one warpgroup): per item, TMA loads of each consumer's K and V half
  (``BLOCK_N`` rows each, single-buffered: reloaded when both MMAs of the item's last step retired),
  then per step the ``BLOCK_M`` query rows' Q, dO and row statistics (lse2, delta) into a ring shared by
  both consumers. The statistics come transposed ([2H, T], ``row_stats``) so that a tile's rows are one
  TMA box: as per-step global loads they sat on every step's critical path (0.7x the portable pass).
* Two consumer warpgroups, each owning ``BLOCK_N`` key rows, in the transposed formulation: per query
  step ``S^T = K Q^T`` and ``dP^T = V dO^T`` on wgmma, ``P^T = exp2(S^T * scale * log2 e - lse2)``,
  ``dS^T = P^T (dP^T - delta)``, then ``dV += P^T dO`` and ``dK += dS^T Q`` with P^T and dS^T as
  register A operands. dK and dV live in registers for the whole item and are written once, so dK and
  dV are bitwise reproducible.
* Loop peeling: steps whose every query row sees every key of the tile run without a mask; the causal
  diagonal and the sequence's last partial query tile run the masked step (one helper, ``MASKED``); with
  the fused dQ (non-causal) so does every step of a consumer whose key rows reach past its sequence. A
  consumer whose key rows all lie past it runs no MMA at all (``BackwardVariant.skip_keyless``).
* Jagged tails without padding of the inputs: the TMA boxes may read rows of the next sequence (Q, dO
  and its statistics, K and V); the masked step zeroes P^T (and so dS^T) for every query row past the
  sequence, and for key rows past it where dQ sums over them; such key rows are never stored. (The
  statistics are laid out with each sequence on an aligned column: ``row_stats.aligned_columns``.)

Supported: bf16 and fp16, head dims 64 and 128, the forward's TMA layout rules (``supports``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jfa.flags import env_flag
from jfa.kernels import alloc
from jfa.kernels.schedule import build_tile_list
from jfa.kernels.tlx import pipeline
from jfa.kernels.tlx.hopper.row_stats import row_stats, stats_descriptor
from jfa.kernels.tlx.hopper.forward import (
    SCHEDULES,
    _bufidx_phase,
    _descriptor,
    _item_sequence,
    _safe_sequence,
    _sm_count,
    _static_item,
    offline_signature,
    parse_switches,
    supports,
    tlx,
)


@dataclass(frozen=True)
class HopperDkDvConfig:
    block_n: int  # key rows per consumer warpgroup (the M of every wgmma: 64)
    block_m: int  # query rows per step
    num_buffers_qdo: int  # (Q, dO) stages shared by both consumers
    consumer_regs: int  # setmaxnreg of each consumer warpgroup
    # ... when the producer computes dQ (BackwardVariant.dq_in_producer): the consumers hold no dQ
    # accumulator and give the producer warpgroup registers for its own (Triton then sets it to 72:
    # 128 * 72 + 256 * 216 <= 65536; at 56 it spilled 176-192 B, at consumers' 208 they spilled)
    consumer_regs_dq_in_producer: int = 216
    dq_in_producer_causal: bool = True  # False: the causal build keeps the consumers' dQ (registers)
    # S = Q K^T and dP = dO V^T with the query rows as wgmma's M (``_dkdv_step_rows``), P and dS^T
    # through shared memory; False: the transposed formulation (S^T = K Q^T, P^T and dS^T in registers)
    rows_major: bool = False
    # the fused dQ computed by the two consumers by head-dim halves, each over both consumers' keys
    # (FA3's split: ``_dq_halves``); the producer then only loads
    dq_halves: bool = False
    # the fused build's LLVM IR left to ptxas (``pipeline.build_llvm_o0``): LLVM hoists per-thread
    # shared-memory addresses out of the loops, and at 240 registers ptxas spilled them
    llvm_o0: bool = False


NUM_CONSUMERS = 2
PRODUCER_WARPS = 4
_CONSUMERS = tl.constexpr(NUM_CONSUMERS)
_CONSUMER_WARPS = tl.constexpr(4)

_CONFIGS: dict[int, HopperDkDvConfig] = {
    # D 64: dK and dV accumulators 64x64 fp32 = 32 regs/thread each, S^T and dP^T (64 x block_m) 16-32
    # each; no spill at 240 registers. Shared memory: K, V halves 4 x 8 KB + 3 stages x (Q, dO, lse2,
    # delta). 32-row steps ran at 0.7x the portable dK/dV pass on the H200 when lse and delta were
    # global loads on each step's critical path (NOTES.md, 2026-11-29); they now come by TMA with Q, dO.
    64: HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=3, consumer_regs=240),
    # D 128 with 32-row steps (what ships at D 128 is D128_STEPS64; this one with steps64=0, shipped until
    # session 11): dK + dV take 128 regs/thread; 32-row steps fit in 240 registers with no spill once lse and
    # delta stopped living in registers (8 B spilled before; 64-row steps spill 96 B). Shared memory:
    # K, V halves 4 x 16 KB + 3 stages x (Q 8 KB + dO 8 KB + stats 256 B), 129 KB as compiled; with the
    # fused dQ also dS^T 2 x 4 KB and 2 (producer's dQ) or 4 (consumers') fp32 dQ stages of 16 KB:
    # at most 201 KB of the 227 KB.
    # The producer's dQ: the causal consumers spill 8-16 B at 216 registers (dS^T stored before or
    # after the dK MMA, the slot waited early or late, dK from shared memory: all tried offline), so the
    # causal build keeps the consumers' dQ.
    128: HopperDkDvConfig(block_n=64, block_m=32, num_buffers_qdo=3, consumer_regs=240,
                          dq_in_producer_causal=False),
}
SUPPORTED_HEAD_DIMS = tuple(sorted(_CONFIGS))
# fused dQ (dQ = dS K per step, TMA reduce-add into an fp32 accumulator): every supported head dim
FUSED_DQ_HEAD_DIMS = SUPPORTED_HEAD_DIMS


# An experiment (BackwardVariant.rows64; its oracle tests passed on the H200 in session 8, +1-4% over
# 32-row steps without the fused dQ, -10 to -21% with it): 64-row steps at D 128 in the
# row-major formulation. Every MMA doubles in N or K against the 32-row steps
# (S, dP: N 32 -> 64; dV, dK: K 32 -> 64) and an item runs half as many steps. The transposed
# formulation spilled 96 B at 64 rows (the row statistics and key masks take 16 registers each per
# thread when rows are wgmma's N); this one still keeps a stack frame (offline, 2026-11-29): 56 B
# (causal 88 B) with the portable dQ pass, 296-400 B with the producer's dQ (consumers at 216), so the
# gate leaves it out. Shared memory: K, V halves 64 KB + 2 stages x (Q, dO) 64 KB + P 16 KB, one dS
# slot pair 16 KB (DQ_LAG 1: two ring stages), the producer's two dQ half-stages 32 KB: 209 of the
# 227 KiB (fused, as compiled).
D128_ROWS64 = HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=2, consumer_regs=240, rows_major=True)

# What ships at D 128 (BackwardVariant.steps64, since session 11): 64-row steps in the transposed
# formulation that ships at D 64 (and the one FA3 uses at 80 rows: NOTES.md, session 8). S^T, dP^T at
# N = 64 read 1.5x less shared memory per FLOP than at N = 32, the measured wall. The fused dQ is FA3's:
# each consumer computes dQ^T for one head-dim half over both consumers' keys (``_dq_halves``: the
# producer cannot hold a [64, 128] fp32 dQ), its half sent a step late (``halves_send_late``). On the
# H200 (session 11, 5 interleaved rounds in one process, against the 32-row build): uniform-D128 +1.7%,
# longtail +11.7%, dense +11.6%, broadcast Q +2.5%. Its consumers spilled (56 spill stores: per-thread
# shared-memory addresses LLVM hoisted to the kernel's entry) until the dK/dV kernel's LLVM IR was left
# to ptxas (``llvm_o0``, ``pipeline.build_llvm_o0``): no spill since. Shared memory: K, V 64 KB + 2 stages x
# (Q, dO) 64 KB + dS^T 2 slots x 2 x 8 KB + one fp32 dQ half-stage of 16 KB per consumer: 209 KB as
# compiled (two stages each: 241 KB).
# Two (Q, dO) stages for the unfused build too (it measured the same with three: uniform-D128 288.5 with
# three, 290.8 and 291.3 with two; longtail 375.2 / 375.3, 372.9; session 9).
D128_STEPS64 = HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=2, consumer_regs=240, dq_halves=True,
                                llvm_o0=True)


def config_for(head_dim: int, variant: "BackwardVariant" = None, fused_dq: bool = True) -> HopperDkDvConfig:
    """The dK/dV config of ``variant``'s build at ``head_dim`` (None: what ships), with the fused dQ or
    without it (the deterministic backward: its dK/dV kernel keeps 32-row steps at D 128, the build
    validated on the GPU; its 64-row build spilled 11 stores with LLVM's optimisation and is not
    validated without it)."""
    variant = SHIPPED if variant is None else variant
    if variant.rows64 and head_dim == 128:
        return D128_ROWS64
    if variant.steps64 and fused_dq and head_dim == 128:
        return D128_STEPS64
    return _CONFIGS[head_dim]


def dq_in_producer(cfg: HopperDkDvConfig, variant: "BackwardVariant", causal: bool) -> bool:
    """Whether the fused dQ build computes dQ in the producer warpgroup (else in the consumers)."""
    return variant.dq_in_producer and not cfg.dq_halves and (cfg.dq_in_producer_causal or not causal)


def consumer_regs(cfg: HopperDkDvConfig, *, fused_dq: bool, variant: "BackwardVariant", causal: bool) -> int:
    """setmaxnreg of each consumer warpgroup in this build (fewer where the producer computes dQ)."""
    if fused_dq and dq_in_producer(cfg, variant, causal):
        return cfg.consumer_regs_dq_in_producer
    return cfg.consumer_regs


def dq_box_columns(cfg: HopperDkDvConfig, head_dim: int) -> int:
    """Head-dim columns of one dQ reduce-add (a row-major step's producer and the dq_halves consumers
    reduce dQ by halves)."""
    return head_dim // 2 if cfg.rows_major or cfg.dq_halves else head_dim


def dq_transposed(cfg: HopperDkDvConfig) -> bool:
    """Whether the fused dQ is computed transposed: a step of fewer than 64 query rows is below wgmma's M,
    so the kernel computes dQ^T = K^T dS^T ([HEAD_DIM, BLOCK_M], M = HEAD_DIM), stored transposed into
    the stage (``_stage_dq``)."""
    return cfg.block_m < 64


DQ_REDUCES = ("tma", "atomic", "none", "stage-only")


@dataclass(frozen=True)
class BackwardVariant:
    """Switches of the backward's ablation study (``gpu_check bwd-ablation``); the defaults ship.
    ``dq_reduce`` applies to the fused dQ build only:
    "tma" reduce-adds each step's dQ from shared
    memory (staged, what ships), "atomic" (the consumers' dQ only) adds it from registers with element-wise
    atomics, "none" drops it after its MMA (timing only: dq is NOT computed; the MMA stays, as the PTX
    shows), "stage-only" stores it to the shared stage but issues no reduce-add (timing only: what the
    staging costs without the L2 traffic). On the H200 (NOTES.md, 2026-11-29) staging beat atomics by 7-27%; a
    paired variant (consumer 1 adding consumer 0's partial in shared memory, one reduce-add per step) was 4-7%
    slower than one reduce-add per consumer and was removed."""

    # "round-robin" (ships) or "zigzag" (the forward's static schedules) over the longest-first list. On
    # the H200 within +-2% of each other (NOTES.md, session 8); zig-zag's per-CTA lane (P - 1 - pid)
    # costs the D 128 producer (72 registers) a spill of two item-level scalars
    schedule: str = "round-robin"
    persistent: bool = True  # False: one CTA per work item, dealt by the hardware block scheduler
    dq_reduce: str = "tma"
    # fused dQ, order. The consumers' dQ: store dS^T and issue the dQ MMA before the dK MMA, so that
    # the dQ reduction (store, fence, reduce-add) runs while dK computes (the kernel's own waits, which
    # ship: under Triton's generic pipeliner every MMA is waited for at once). The producer's
    # dQ: each producer iteration runs the dQ step before issuing the next step's loads.
    dq_first: bool = False
    # fused dQ computed by the producer warpgroup (ships at D 64; False: by each consumer over its own keys;
    # at D 128 the 32-row build's switch, steps64=0):
    # each consumer only stores its dS^T (DQ_LAG slots) and signals; the producer, between its loads,
    # issues dQ over both consumers' keys (one accumulator, one reduce-add per step) and runs the
    # staging, off the consumers' critical path. On the H200 +0.4 to +10% over the consumers' dQ on
    # every gem shape (NOTES.md, session 7). Not where the config says the consumers cannot give the
    # registers (``HopperDkDvConfig.dq_in_producer_causal``).
    dq_in_producer: bool = True
    # the producer's dQ (ships): a step's staged dQ is fenced and reduce-added one step later, after the
    # next step's dQ MMA is issued, so the fence no longer waits for the stage's stores to drain through
    # shared memory (ncu, longtail-D128: 29% of the producer's time sat at that fence). On the H200 +2 to
    # +4.5% on six of eight shapes, +-0.3% on broadcast Q (NOTES.md, session 8). No effect where the
    # build has no producer's dQ (the 64-row D 128 steps, the 32-row causal D 128 build,
    # dq_in_producer=0), with rows64 or dq_reduce != "tma".
    dq_send_late: bool = True
    # D 128 with 64-row steps in the row-major formulation (``D128_ROWS64``)
    rows64: bool = False
    # D 128 with 64-row steps in the transposed formulation (``D128_STEPS64``, ships); its fused dQ is the
    # consumers' by head-dim halves. False: the 32-row D 128 build (``_CONFIGS[128]``), the one the switches
    # of the producer's and the consumers' dQ above (dq_in_producer, dq_first, dq_send_late, the atomic
    # reduction) and skip_keyless concern at D 128; they do not apply to the 64-row build.
    steps64: bool = True
    # each consumer looks at its own BLOCK_N key rows (ships): one whose rows all lie past the sequence
    # (the upper half of a last key tile of at most BLOCK_N keys) runs no MMA, only keeps the barriers'
    # phases (and hands the producer's dQ a zero dS^T), so the other consumer and the producer get the
    # tensor cores to themselves; one whose rows all lie inside runs the unmasked bulk even where the
    # other's reach past the sequence. False: both consumers run every step of such a tile, masked.
    # On the H200 +3 to +5% on the jagged gem shapes, longtail (2% of its steps) -1.4% (NOTES.md,
    # session 10). The MMA skip is not for the dq_halves consumers (each computes a dQ half over both
    # consumers' keys) or the row-major steps; the per-consumer masking is for every build.
    skip_keyless: bool = True
    # steps64 (dq_halves): a consumer's dQ half is stored to its stage at the end of a step, and fenced
    # and reduce-added at the start of the next, once that step's S^T and dP^T are issued (the producer's
    # dq_send_late, for the consumers): the fence no longer waits on the critical path for the stage's
    # stores to drain through shared memory, which the other consumer's wgmma keep busy
    # On the H200 (session 11), 7 interleaved rounds: +1.7% (uniform-D128) to +8% over the half sent in its
    # own step (its fence then waits for the stage's stores to drain)
    halves_send_late: bool = True

    def __post_init__(self):
        if self.schedule not in SCHEDULES[:2]:
            raise ValueError(f"BackwardVariant.schedule: must be one of {SCHEDULES[:2]}, got {self.schedule!r}")
        if self.dq_reduce not in DQ_REDUCES:
            raise ValueError(f"BackwardVariant.dq_reduce: must be one of {DQ_REDUCES}, got {self.dq_reduce!r}")
        if self.dq_first and self.dq_reduce != "tma":
            raise ValueError("BackwardVariant.dq_first: only with dq_reduce='tma'")
        if self.dq_in_producer and self.dq_reduce == "atomic":
            raise ValueError("BackwardVariant: dq_reduce='atomic' applies to the consumers' dQ: add dq_in_producer=0")
        if self.rows64 and not self.dq_in_producer:
            raise ValueError("BackwardVariant.rows64: only with the producer's dQ (dq_in_producer=1)")
        if self.rows64 and self.steps64:
            raise ValueError("BackwardVariant: rows64 and steps64 are two layouts of the D 128 steps: rows64=1 "
                             "needs steps64=0 (steps64 ships)")

    @classmethod
    def parse(cls, text: str) -> "BackwardVariant":
        """``"dq_first=1,schedule=round-robin"`` -> BackwardVariant; unknown keys, bad values raise ValueError."""
        return parse_switches(cls, text, "JFA_TLX_BWD_VARIANT")


SHIPPED = BackwardVariant()


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _dkdv_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast,
               CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, TILE_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """What producer and consumers need about work item ``item`` (computed identically by both).

    Returns (head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, n_masked_lead,
    bulk_end, num_q_tiles): query steps run over tiles [first, num_q_tiles); the first
    ``n_masked_lead`` of them straddle the causal diagonal, tiles [first + n_masked_lead, bulk_end)
    are fully visible, the rest (at most one: the sequence's partial last tile) masked again."""
    head, tile, q_row0, out_row0, len_q, k_row0, len_k = _item_sequence(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, BROADCAST_Q)
    n_start = tile * TILE_N
    causal_shift = len_k - len_q  # query i sees key j iff j <= i + shift (bottom-right)
    num_q_tiles = tl.cdiv(len_q, BLOCK_M)
    if CAUSAL:
        first = tl.minimum(tl.maximum(n_start - causal_shift, 0) // BLOCK_M, num_q_tiles)
        first_full = tl.cdiv(tl.maximum(n_start + TILE_N - 1 - causal_shift, 0), BLOCK_M)
        diag_end = tl.maximum(first, tl.minimum(first_full, num_q_tiles))
    else:
        first = tl.zeros((), dtype=tl.int32)
        diag_end = first
    bulk_end = tl.maximum(diag_end, len_q // BLOCK_M)
    return (head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, diag_end - first,
            bulk_end, num_q_tiles)


@triton.jit
def _aligned_column(TILES, STATS_CU, item, num_heads, num_seqs):
    """The first column of work item ``item``'s sequence in the column-aligned tensors (the row
    statistics: ``row_stats.aligned_columns``); a multiple of its COLUMN_ALIGN."""
    seq, _valid = _safe_sequence(tl.load(TILES + item // num_heads), num_seqs)
    return tl.load(STATS_CU + seq).to(tl.int32)


@triton.jit
def _step_order(s, first, n_lead, n_masked, bulk_end):
    """Query tile of the s-th step of an item, in the order producer and consumers share: the masked
    steps first (the causal diagonal tiles, then the sequence's partial last tile), the fully visible
    bulk after them. The consumer then runs two loops (masked, bulk) instead of three: one inlined copy
    of the step less (registers)."""
    masked_tile = tl.where(s < n_lead, first + s, bulk_end + s - n_lead)
    return tl.where(s < n_masked, masked_tile, first + n_lead + s - n_masked)


@triton.jit
def _load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls,
                   qdo_empties, head, q_row0, out_row0, stats_col0, first, n_lead, n_masked, bulk_end, num_heads,
                   col_stride_q, col_stride_do, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr,
                   QDO_BYTES: tl.constexpr):
    """Producer: the j-th step's query tile (Q, dO and its row statistics) into the next ring slot."""
    i = _step_order(j, first, n_lead, n_masked, bulk_end)
    buf, phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    tlx.barrier_wait(qdo_empties[buf], phase ^ 1)
    tlx.barrier_expect_bytes(qdo_fulls[buf], 2 * QDO_BYTES + 2 * BLOCK_M * 4)
    o_row = out_row0 + i * BLOCK_M
    tlx.async_descriptor_load(desc_q, q_tiles[buf], [q_row0 + i * BLOCK_M, head * col_stride_q], qdo_fulls[buf])
    tlx.async_descriptor_load(desc_do, do_tiles[buf], [o_row, head * col_stride_do], qdo_fulls[buf])
    stats_col = stats_col0 + i * BLOCK_M
    tlx.async_descriptor_load(desc_stats, lse_tiles[buf], [head, stats_col], qdo_fulls[buf])
    tlx.async_descriptor_load(desc_stats, delta_tiles[buf], [num_heads + head, stats_col], qdo_fulls[buf])
    return qdo_cnt + 1


@triton.jit
def _produce_dkdv_item(item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, k_tiles,
                       v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, ds_tiles, dq_stages, kv_fulls, kv_empties,
                       qdo_fulls, qdo_empties, ds_fulls, ds_empties, TILES, CU_Q, CU_K, STATS_CU, num_slots, num_heads,
                       num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, col_stride_do,
                       sm_scale, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
                       DQ_PRODUCER: tl.constexpr, DQ_REDUCE: tl.constexpr, DQ_FIRST: tl.constexpr,
                       DQ_SEND_LATE: tl.constexpr, DQ_T: tl.constexpr, ROWS: tl.constexpr, TILE_N: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                       NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr, KV_BYTES: tl.constexpr,
                       QDO_BYTES: tl.constexpr):
    """Producer, one work item: each consumer's K and V half, then per step the query tile's Q, dO and
    row statistics (lse2 and delta rows of the transposed stats tensor). With DQ_PRODUCER also every
    step's dQ, DQ_LAG (= NUM_BUFFERS_DS) steps behind the loads (so that a load is issued DQ_LAG steps
    before it is needed), the last ones flushed before the item's K is given up. Loads and dQ steps
    are counted by ``qdo_cnt`` alone (returned): both advance by the item's steps, so at an item's
    start the dQ count equals it (one register less in a producer of 72)."""
    head, q_row0, out_row0, len_q, k_row0, _lk, n_start, _cs, first, n_lead, bulk_end, num_q_tiles = _dkdv_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_N, BLOCK_M)
    stats_col0 = _aligned_column(TILES, STATS_CU, item, num_heads, num_seqs)
    # dO's first row as an int32 TMA coordinate (the packed tensors hold < 2**31 rows): one register
    # where the int64 row took two, in a producer of 72 registers
    out_row0 = out_row0.to(tl.int32)
    n_masked = n_lead + num_q_tiles - bulk_end
    kv_phase = kv_cnt & 1
    for c in tl.static_range(_CONSUMERS):
        tlx.barrier_wait(kv_empties[c], kv_phase ^ 1)
        tlx.barrier_expect_bytes(kv_fulls[c], 2 * KV_BYTES)
        row = k_row0 + n_start + c * BLOCK_N
        tlx.async_descriptor_load(desc_k, k_tiles[c], [row, head * col_stride_k], kv_fulls[c])
        tlx.async_descriptor_load(desc_v, v_tiles[c], [row, head * col_stride_v], kv_fulls[c])
    n_steps = num_q_tiles - first
    DQ_LAG: tl.constexpr = NUM_BUFFERS_DS  # the kernel's: the consumers run this many steps ahead at most
    if DQ_PRODUCER:
        dq_row0, dq_col = q_row0, head * HEAD_DIM  # where the item's dQ goes in the (contiguous, q-shaped) accumulator
        for j in tl.range(0, tl.minimum(n_steps, DQ_LAG)):
            qdo_cnt = _load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                     delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0, stats_col0, first,
                                     n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, BLOCK_M,
                                     NUM_BUFFERS_QDO, QDO_BYTES)
        staged_row = dq_row0  # DQ_SEND_LATE: the row of the step staged and not yet sent
        for j in tl.range(DQ_LAG, n_steps):
            if DQ_FIRST:
                staged_row = _producer_dq_step(
                    j - DQ_LAG, qdo_cnt - DQ_LAG, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties, dq_stages,
                    desc_dq, dq_row0, dq_col, first, n_lead, n_masked, bulk_end, sm_scale, DQ_REDUCE, DQ_T, ROWS,
                    DQ_SEND_LATE, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_DS)
            qdo_cnt = _load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                     delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0, stats_col0, first,
                                     n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, BLOCK_M,
                                     NUM_BUFFERS_QDO, QDO_BYTES)
            if not DQ_FIRST:
                staged_row = _producer_dq_step(
                    j - DQ_LAG, qdo_cnt - DQ_LAG - 1, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties,
                    dq_stages, desc_dq, dq_row0, dq_col, first, n_lead, n_masked, bulk_end, sm_scale, DQ_REDUCE,
                    DQ_T, ROWS, DQ_SEND_LATE, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_DS)
        for j in tl.range(tl.maximum(n_steps - DQ_LAG, 0), n_steps):
            staged_row = _producer_dq_step(
                j, qdo_cnt - n_steps + j, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq,
                dq_row0, dq_col,
                first, n_lead, n_masked, bulk_end, sm_scale, DQ_REDUCE, DQ_T, ROWS, DQ_SEND_LATE, BLOCK_N,
                BLOCK_M, HEAD_DIM, NUM_BUFFERS_DS)
        if DQ_SEND_LATE and n_steps > 0:  # the item's last step (its K tiles are given up next)
            _send_staged_dq(dq_stages[(qdo_cnt + 1) & 1], desc_dq, staged_row, dq_col)
    else:
        for j in tl.range(0, n_steps):
            qdo_cnt = _load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                     delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0, stats_col0, first,
                                     n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, BLOCK_M,
                                     NUM_BUFFERS_QDO, QDO_BYTES)
    return qdo_cnt


@triton.jit
def _dq_mma(ds_tile, k_tile, DQ_T: tl.constexpr, dq=None):
    """Issue a dQ MMA over one consumer's keys: dQ = dS K [BLOCK_M, HEAD_DIM], or with DQ_T its
    transpose K^T dS^T [HEAD_DIM, BLOCK_M] (steps of fewer than 64 query rows: wgmma's M is 64); added
    to ``dq`` when given (the producer's dQ over both consumers' keys)."""
    if DQ_T:
        return tlx.async_dot(tlx.local_trans(k_tile), ds_tile, dq)
    else:
        return tlx.async_dot(tlx.local_trans(ds_tile), k_tile, dq)


@triton.jit
def _stage_dq(dq_stage, dq, sm_scale, DQ_T: tl.constexpr):
    """A step's dQ (times the softmax scale) into its [BLOCK_M, HEAD_DIM] fp32 stage (or a head-dim
    slice of it). With DQ_T ``dq`` is dQ^T and is stored transposed: each thread then writes 4-byte
    words of eight query rows, which the stage's 128-byte swizzle spreads over all 32 banks (one
    wavefront per store; the accumulator fragment's 8-byte pairs along the rows took two, ncu
    2026-11-29), and the accumulator stays like q (no transposed layout, no read-out kernel)."""
    if DQ_T:
        tlx.local_store(tlx.local_trans(dq_stage), dq * sm_scale)
    else:
        tlx.local_store(dq_stage, dq * sm_scale)


@triton.jit
def _reduce_add_dq(dq, dq_stage, desc_dq, dq_row, dq_col, sm_scale, DQ_T: tl.constexpr, STAGES: tl.constexpr = 2):
    """Staged dQ reduction: registers -> shared memory -> TMA reduce-add into the fp32 accumulator (the
    copy runs behind the next step) at query row ``dq_row``, column ``dq_col`` (the head's). The stage was
    last handed to TMA STAGES steps ago (its writer's stages take turns): wait until that reduce-add has
    read it."""
    tlx.async_descriptor_store_wait(STAGES - 1)
    _stage_dq(dq_stage, dq, sm_scale, DQ_T)
    tlx.fence_async_shared()
    tlx.async_descriptor_store(desc_dq, dq_stage, [dq_row, dq_col], store_reduce="add")


@triton.jit
def _producer_dq_step(s, ds_cnt, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq, dq_row0,
                      dq_col, first, n_lead, n_masked, bulk_end, sm_scale, DQ_REDUCE: tl.constexpr,
                      DQ_T: tl.constexpr, ROWS: tl.constexpr, DQ_SEND_LATE: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                      NUM_BUFFERS_DS: tl.constexpr):
    """Producer (DQ_PRODUCER), step s of the item: once both consumers have stored their dS^T, dQ over
    all TILE_N keys (two MMAs, one accumulator), the dS^T slot handed back, then the staged reduce-add
    (one per step, not one per consumer). With DQ_SEND_LATE the step's dQ is only stored to its stage;
    the fence and reduce-add follow in the next step of the item, after its dQ MMA is issued
    (``_send_staged_dq``; the item's last step is sent after its loop) at ``staged_row``, the previous
    step's row. ``ds_cnt``: the item's first step's count plus s (the dS^T slot and the stage follow
    it). Returns this step's row."""
    m_start = _step_order(s, first, n_lead, n_masked, bulk_end) * BLOCK_M
    buf, phase = _bufidx_phase(ds_cnt, NUM_BUFFERS_DS)
    tlx.barrier_wait(ds_fulls[buf], phase)
    if ROWS:
        # dS is [BLOCK_M, BLOCK_N] (rows-major step): dQ = dS K, by head-dim halves so that the
        # accumulator ([BLOCK_M, HEAD_DIM / 2] fp32) fits the producer's registers
        HALF: tl.constexpr = HEAD_DIM // 2
        for h in tl.static_range(2):
            dq = None
            for c in tl.static_range(_CONSUMERS):
                dq = tlx.async_dot(ds_tiles[buf * _CONSUMERS + c],
                                   tlx.local_slice(k_tiles[c], [0, h * HALF], [BLOCK_N, HALF]), dq)
            dq = tlx.async_dot_wait(0, dq)
            if h == 1:
                tlx.barrier_arrive(ds_empties[buf], 1)
            _dq_out(dq, dq_stages[h], desc_dq, dq_row0 + m_start, dq_col + h * HALF, sm_scale, DQ_REDUCE,
                             False)
    else:
        dq = _dq_mma(ds_tiles[buf * _CONSUMERS], k_tiles[0], DQ_T)
        dq = _dq_mma(ds_tiles[buf * _CONSUMERS + 1], k_tiles[1], DQ_T, dq)
        if DQ_SEND_LATE and s > 0:  # the previous step's stage (the other one), stored a whole step ago
            _send_staged_dq(dq_stages[(ds_cnt + 1) & 1], desc_dq, staged_row, dq_col)
        dq = tlx.async_dot_wait(0, dq)
        tlx.barrier_arrive(ds_empties[buf], 1)
        dq_row = dq_row0 + m_start
        if DQ_SEND_LATE:
            tlx.async_descriptor_store_wait(1)  # this stage's reduce-add two steps back has read it
            _stage_dq(dq_stages[ds_cnt & 1], dq, sm_scale, DQ_T)
            staged_row = dq_row
        else:
            _dq_out(dq, dq_stages[ds_cnt & 1], desc_dq, dq_row, dq_col, sm_scale, DQ_REDUCE, DQ_T)
    return staged_row


@triton.jit
def _send_staged_dq(dq_stage, desc_dq, dq_row, dq_col, BARRIER: tl.constexpr = 0):
    """The second half of the staged reduction with DQ_SEND_LATE: fence the stage's stores (issued a
    step ago, so the fence no longer waits for them to drain through shared memory, which the
    consumers' wgmma keep busy) and reduce-add it at (``dq_row``, ``dq_col``)."""
    tlx.fence_async_shared()
    # every producer thread fenced its own stores before the elected one issues the reduce-add (the
    # compiler's barrier sits before the fence here: the stores are a loop iteration back). Named
    # barrier 0 with 128 threads is the producer warpgroup's own (Triton's, as the PTX shows); the
    # consumers (HALVES_LATE) pass their own.
    tlx.named_barrier_wait(BARRIER, 128)
    tlx.async_descriptor_store(desc_dq, dq_stage, [dq_row, dq_col], store_reduce="add")


@triton.jit
def _dq_out(dq, dq_stage, desc_dq, dq_row, dq_col, sm_scale, DQ_REDUCE: tl.constexpr, DQ_T: tl.constexpr,
            STAGES: tl.constexpr = 2):
    """A step's dQ (the producer's or a consumer's) to the accumulator through shared memory as
    ``DQ_REDUCE`` says (``BackwardVariant.dq_reduce``: 0 the staged reduce-add; timing only: 3 the
    staging without the reduce-add, 2 nothing; 1, the consumers' atomics, is theirs). ``STAGES``: how
    many stages the writer takes turns over."""
    if DQ_REDUCE == 0:
        _reduce_add_dq(dq, dq_stage, desc_dq, dq_row, dq_col, sm_scale, DQ_T, STAGES)
    elif DQ_REDUCE == 3:
        _stage_dq(dq_stage, dq, sm_scale, DQ_T)
        tlx.fence_async_shared()


@triton.jit
def _hand_over_ds(ds_tile, ds_t, ds_full):
    """Store this consumer's dS^T (bf16) for another warpgroup's dQ MMA and signal it on ``ds_full``."""
    tlx.local_store(ds_tile, ds_t)
    tlx.fence_async_shared()  # generic-proxy stores made visible to the readers' wgmma (async proxy)
    tlx.barrier_arrive(ds_full, 1)  # after a warpgroup barrier: all 128 threads have stored and fenced


@triton.jit
def _dq_halves(dk, ds_t, q_tile, k_tiles, ds_tiles, ds_tile, ds_buf, ds_phase, ds_full, ds_empty, dq_stage, desc_dq,
               dq_row, dq_col, sm_scale, cid: tl.constexpr, DQ_REDUCE: tl.constexpr, HALVES_LATE: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """DQ_HALVES (FA3's split of the fused dQ): issue dK += dS^T Q, store this consumer's dS^T to its
    slot, and once both consumers have (``ds_full``: one arrival each), compute dQ^T for head-dim columns
    [cid * D/2, (cid + 1) * D/2) over both consumers' keys, K^T[half] dS^T: [D/2, BLOCK_M], 32 registers
    at D 128, the same MMA shape as S^T. Both slots are handed back (``ds_empty``) once the dQ MMAs
    retire; the half goes to the accumulator through this consumer's stage (with HALVES_LATE only stored
    there: the next step sends it, ``_send_halves_dq``). Returns dk, retired."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dk = tlx.async_dot(ds_t, q_tile, dk)
    _hand_over_ds(ds_tile, ds_t, ds_full)
    tlx.barrier_wait(ds_full, ds_phase)  # the other consumer's dS^T is stored too
    dq = None
    for c in tl.static_range(_CONSUMERS):
        k_half_t = tlx.local_trans(tlx.local_slice(k_tiles[c], [0, cid * HALF], [BLOCK_N, HALF]))
        dq = tlx.async_dot(k_half_t, ds_tiles[ds_buf * _CONSUMERS + c], dq)
    dk = tlx.async_dot_wait(2, dk)
    dq = tlx.async_dot_wait(0, dq)
    tlx.barrier_arrive(ds_empty, 1)
    if HALVES_LATE:
        # the stage's last reduce-add (sent at this step's start, behind S^T and dP^T) must have read it
        tlx.async_descriptor_store_wait(0)
        _stage_dq(dq_stage, dq, sm_scale, True)
    else:
        # one stage per consumer (shared memory): the last step's reduce-add, issued a whole step ago, must
        # have read it
        _dq_out(dq, dq_stage, desc_dq, dq_row, dq_col + cid * HALF, sm_scale, DQ_REDUCE, True, STAGES=1)
    return dk


@triton.jit
def _send_halves_dq(dq_stage, desc_dq, staged_row, dq_col, cid: tl.constexpr, HEAD_DIM: tl.constexpr):
    """HALVES_LATE: reduce-add the dQ half a previous step of the item stored to this consumer's stage
    (at query row ``staged_row``; < 0: none is staged). Named barrier 11 + cid: the consumer's own
    warpgroup (the forward's pingpong takes 9 and 10)."""
    if staged_row >= 0:
        _send_staged_dq(dq_stage, desc_dq, staged_row, dq_col + cid * (HEAD_DIM // 2), 11 + cid)


@triton.jit
def _dkdv_step(dk, dv, k_tile, v_tile, q_tile, do_tile, lse_tile, delta_tile, ds_tile, ds_full, dq_stage, desc_dq,
               DQ, stride_dqt, dq_row, dq_col, m_start, offs_n, len_q, len_k, causal_shift, qk_scale, sm_scale,
               k_tiles, ds_tiles, ds_buf, ds_phase, ds_empty, staged_row, cid: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, FUSED_DQ: tl.constexpr,
               DQ_REDUCE: tl.constexpr, DQ_FIRST: tl.constexpr, DQ_T: tl.constexpr, DQ_PRODUCER: tl.constexpr,
               DQ_HALVES: tl.constexpr, HALVES_LATE: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """One query step of one consumer: S^T and dP^T on wgmma, P^T and dS^T in registers, then
    dV += P^T dO and dK += dS^T Q; with FUSED_DQ also dQ = dS K for these rows (transposed with DQ_T),
    reduce-added into the fp32 dQ accumulator by TMA from shared memory, or with DQ_PRODUCER only dS^T
    stored for the producer's dQ (slot ``ds_tile``, free, signalled on ``ds_full``), or with DQ_HALVES
    one head-dim half of dQ over both consumers' keys (``_dq_halves``; with HALVES_LATE the previous
    step's half, ``staged_row``, is sent once S^T and dP^T are issued). Returns (dk, dv) with every MMA
    retired."""
    s_t = tlx.async_dot(k_tile, tlx.local_trans(q_tile))     # [BLOCK_N, BLOCK_M]
    dp_t = tlx.async_dot(v_tile, tlx.local_trans(do_tile))   # [BLOCK_N, BLOCK_M]
    if HALVES_LATE:
        _send_halves_dq(dq_stage, desc_dq, staged_row, dq_col, cid, HEAD_DIM)
    lse2 = tlx.local_load(lse_tile)                          # [1, BLOCK_M]: lse * log2(e), +inf for empty rows
    s_t = tlx.async_dot_wait(1, s_t)
    p_t = tl.math.exp2(s_t * qk_scale - lse2)
    if MASKED:
        # the TMA boxes may reach into the next sequence's rows: their P^T (and so dS^T) must be 0
        offs_m = m_start + tl.arange(0, BLOCK_M)
        visible = (offs_m < len_q)[None, :]
        if CAUSAL:  # also excludes key rows past the sequence
            visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
        elif FUSED_DQ:  # dQ sums over the keys: the next sequence's must add nothing
            visible = visible & (offs_n < len_k)[:, None]
        p_t = tl.where(visible, p_t, 0.0)
    delta = tlx.local_load(delta_tile)                       # [1, BLOCK_M]
    dp_t = tlx.async_dot_wait(0, dp_t)
    dv = tlx.async_dot(p_t.to(DTYPE), do_tile, dv)
    ds_t = p_t * (dp_t - delta)
    if FUSED_DQ and MASKED:
        # dQ sums over this tile's keys and lands in other rows' dQ: query rows past the sequence must
        # add exactly 0, and so must key rows past it (the next sequence's keys, loaded by the tile's TMA
        # box; a consumer that has such keys runs every step masked). P^T is 0 there already, but dP^T of a
        # foreign row need not be finite: select, do not multiply (on P^T, not the mask: registers).
        ds_t = tl.where(p_t == 0.0, 0.0, ds_t)
    if DQ_HALVES:
        dk = _dq_halves(dk, ds_t.to(DTYPE), q_tile, k_tiles, ds_tiles, ds_tile, ds_buf, ds_phase, ds_full, ds_empty,
                        dq_stage, desc_dq, dq_row, dq_col, sm_scale, cid, DQ_REDUCE, HALVES_LATE, BLOCK_N, HEAD_DIM)
        dv = tlx.async_dot_wait(0, dv)
    elif DQ_PRODUCER:
        dk = tlx.async_dot(ds_t.to(DTYPE), q_tile, dk)
        _hand_over_ds(ds_tile, ds_t.to(DTYPE), ds_full)
        dv = tlx.async_dot_wait(1, dv)
        dk = tlx.async_dot_wait(0, dk)
    elif DQ_FIRST:
        # dS^T to shared memory and the dQ MMA first; its reduction then overlaps the dK MMA
        tlx.local_store(ds_tile, ds_t.to(DTYPE))
        tlx.fence_async_shared()
        dq = _dq_mma(ds_tile, k_tile, DQ_T)
        dk = tlx.async_dot(ds_t.to(DTYPE), q_tile, dk)
        dq = tlx.async_dot_wait(1, dq)  # retires dV and dQ (committed before dK)
        dv = tlx.async_dot_wait(1, dv)
        _reduce_add_dq(dq, dq_stage, desc_dq, dq_row, dq_col, sm_scale, DQ_T)
        dk = tlx.async_dot_wait(0, dk)
    else:
        dk = tlx.async_dot(ds_t.to(DTYPE), q_tile, dk)
        if FUSED_DQ:
            tlx.local_store(ds_tile, ds_t.to(DTYPE))
            tlx.fence_async_shared()
            dq = _dq_mma(ds_tile, k_tile, DQ_T)  # dS K over this consumer's keys
            dv = tlx.async_dot_wait(2, dv)
            dk = tlx.async_dot_wait(1, dk)
            dq = tlx.async_dot_wait(0, dq)
            if DQ_REDUCE != 1:  # staged (or its timing-only parts)
                _dq_out(dq, dq_stage, desc_dq, dq_row, dq_col, sm_scale, DQ_REDUCE, DQ_T)
            else:  # element-wise atomics from registers (the ablation's baseline)
                row_ok = m_start + tl.arange(0, BLOCK_M) < len_q
                offs_d = tl.arange(0, HEAD_DIM)
                rows = (dq_row + tl.arange(0, BLOCK_M)).to(tl.int64)
                if DQ_T:  # dq is dQ^T [HEAD_DIM, BLOCK_M]
                    tl.atomic_add(DQ + rows[None, :] * stride_dqt + dq_col + offs_d[:, None], dq * sm_scale,
                                  mask=row_ok[None, :], sem="relaxed")
                else:
                    tl.atomic_add(DQ + rows[:, None] * stride_dqt + dq_col + offs_d[None, :], dq * sm_scale,
                                  mask=row_ok[:, None], sem="relaxed")
        else:
            dv = tlx.async_dot_wait(1, dv)
            dk = tlx.async_dot_wait(0, dk)
    return dk, dv


@triton.jit
def _dkdv_step_rows(dk, dv, k_tile, v_tile, q_tile, do_tile, lse_tile, delta_tile, p_tile, ds_tile, ds_full, m_start,
                    key0, len_q, len_k, causal_shift, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    FUSED_DQ: tl.constexpr, DQ_PRODUCER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    DTYPE: tl.constexpr):
    """``_dkdv_step`` in the row-major formulation (config ``rows_major``): S = Q K^T and dP = dO V^T
    are [BLOCK_M, BLOCK_N] with the query rows as wgmma's M, so each thread holds the row statistics
    of two rows (not BLOCK_M / 8); P and dS go to shared memory (``p_tile``, ``ds_tile``) and their
    transposed views are the A operands of dV += P^T dO and dK += dS^T Q. With DQ_PRODUCER (the only
    fused dQ of this step) the dS tile is the producer's, signalled on ``ds_full``. Returns (dk, dv)
    with every MMA retired."""
    s = tlx.async_dot(q_tile, tlx.local_trans(k_tile))     # [BLOCK_M, BLOCK_N]
    dp = tlx.async_dot(do_tile, tlx.local_trans(v_tile))   # [BLOCK_M, BLOCK_N]
    lse2 = tl.reshape(tlx.local_load(lse_tile), [BLOCK_M, 1])
    s = tlx.async_dot_wait(1, s)
    p = tl.math.exp2(s * qk_scale - lse2)
    if MASKED:  # as in _dkdv_step, transposed
        # keys relative to the tile (key0: its first): the column indices are per-thread constants here,
        # 16 registers if a key vector were carried through the loop
        offs_m = m_start + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        visible = (offs_m < len_q)[:, None]
        if CAUSAL:
            visible = visible & (cols[None, :] <= (offs_m + causal_shift - key0)[:, None])
        elif FUSED_DQ:
            visible = visible & (cols < len_k - key0)[None, :]
        p = tl.where(visible, p, 0.0)
    tlx.local_store(p_tile, p.to(DTYPE))
    tlx.fence_async_shared()  # generic-proxy stores made visible to wgmma (the async proxy)
    dv = tlx.async_dot(tlx.local_trans(p_tile), do_tile, dv)
    delta = tl.reshape(tlx.local_load(delta_tile), [BLOCK_M, 1])
    dp = tlx.async_dot_wait(1, dp)
    ds = p * (dp - delta)
    if FUSED_DQ and MASKED:
        ds = tl.where(p == 0.0, 0.0, ds)
    tlx.local_store(ds_tile, ds.to(DTYPE))
    tlx.fence_async_shared()
    dk = tlx.async_dot(tlx.local_trans(ds_tile), q_tile, dk)
    if DQ_PRODUCER:
        tlx.barrier_arrive(ds_full, 1)
    dv = tlx.async_dot_wait(1, dv)
    dk = tlx.async_dot_wait(0, dk)
    return dk, dv


@triton.jit
def _dkdv_ring_step(dk, dv, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls,
                    qdo_empties, p_tile, ds_tile, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq, DQ, stride_dqt,
                    dq_row0, dq_col, m_start, offs_n, key0, len_q, len_k, causal_shift, qk_scale, sm_scale,
                    staged_row, cid: tl.constexpr,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, FUSED_DQ: tl.constexpr, DQ_REDUCE: tl.constexpr,
                    DQ_FIRST: tl.constexpr, DQ_T: tl.constexpr, DQ_PRODUCER: tl.constexpr,
                    DQ_HALVES: tl.constexpr, ROWS: tl.constexpr, HALVES_LATE: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    HEAD_DIM: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                    DTYPE: tl.constexpr):
    """Wait for the next (Q, dO, stats) ring slot, run one step on it, hand the slot back. ``ds_tile``
    is the consumer's dS^T tile, or with DQ_PRODUCER or DQ_HALVES the step's slot of ``ds_tiles`` (the
    producer's step count equals the consumers'). ``staged_row``: with HALVES_LATE the query row of the
    dQ half staged and not yet sent (< 0: none); returns the one this step leaves staged."""
    k_tile = k_tiles[cid]
    v_tile = v_tiles[cid]
    buf, phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    ds_buf, ds_phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_DS)
    if DQ_PRODUCER or DQ_HALVES:
        ds_tile = ds_tiles[ds_buf * _CONSUMERS + cid]
        # the dQ MMAs (the producer's, or with DQ_HALVES both consumers') have read this slot's last
        # dS^T (waited here, where no tile is live: registers)
        tlx.barrier_wait(ds_empties[ds_buf], ds_phase ^ 1)
    tlx.barrier_wait(qdo_fulls[buf], phase)
    if ROWS:
        dk, dv = _dkdv_step_rows(dk, dv, k_tile, v_tile, q_tiles[buf], do_tiles[buf], lse_tiles[buf],
                                 delta_tiles[buf], p_tile, ds_tile, ds_fulls[ds_buf], m_start, key0, len_q, len_k,
                                 causal_shift, qk_scale, MASKED, CAUSAL, FUSED_DQ, DQ_PRODUCER, BLOCK_N, BLOCK_M,
                                 DTYPE)
    else:
        # (with DQ_PRODUCER the stage is never used: the producer has the only two)
        dk, dv = _dkdv_step(dk, dv, k_tile, v_tile, q_tiles[buf], do_tiles[buf], lse_tiles[buf], delta_tiles[buf],
                            ds_tile, ds_fulls[ds_buf], dq_stages[cid if DQ_HALVES else cid * 2 + (qdo_cnt & 1)],
                            desc_dq, DQ, stride_dqt,
                            dq_row0 + m_start,
                            dq_col, m_start, offs_n, len_q, len_k, causal_shift, qk_scale, sm_scale, k_tiles, ds_tiles,
                            ds_buf, ds_phase, ds_empties[ds_buf], staged_row, cid, MASKED, CAUSAL, FUSED_DQ,
                            DQ_REDUCE, DQ_FIRST, DQ_T, DQ_PRODUCER, DQ_HALVES, HALVES_LATE, BLOCK_N,
                            BLOCK_M, HEAD_DIM, DTYPE)
        if HALVES_LATE:
            staged_row = dq_row0 + m_start
    tlx.barrier_arrive(qdo_empties[buf], 1)
    return dk, dv, qdo_cnt + 1, staged_row


@triton.jit
def _keyless_ring_step(qdo_cnt, qdo_fulls, qdo_empties, ds_tiles, ds_fulls, ds_empties, cid: tl.constexpr,
                       STAGED_DQ: tl.constexpr, DQ_PRODUCER: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                       DTYPE: tl.constexpr):
    """A step of a consumer with no key rows in the item: no MMA, only the ring's protocol. It waits for
    the slot to fill before handing it back, so that its arrival counts for this fill and not a later
    one (the empty barrier takes both consumers' arrivals). With DQ_PRODUCER its dS^T slot gets zeros:
    the producer's dQ MMA runs over both consumers' slots, and the K rows it pairs them with (the next
    sequence's, or TMA's zero fill) are finite. With STAGED_DQ (this consumer reduce-adds its own dQ
    through two stages picked by the step count's parity) it waits until its reduce-adds have read their
    stages: a step without a reduce-add breaks the alternation its next one relies on (it waits for all
    but the last, which may then be reading the very stage it rewrites)."""
    buf, phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    if STAGED_DQ:
        tlx.async_descriptor_store_wait(0)
    if DQ_PRODUCER:
        ds_buf, ds_phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_DS)
        tlx.barrier_wait(ds_empties[ds_buf], ds_phase ^ 1)
        _hand_over_ds(ds_tiles[ds_buf * _CONSUMERS + cid], tl.zeros([BLOCK_N, BLOCK_M], dtype=DTYPE),
                      ds_fulls[ds_buf])
    tlx.barrier_wait(qdo_fulls[buf], phase)
    tlx.barrier_arrive(qdo_empties[buf], 1)
    return qdo_cnt + 1


@triton.jit
def _consume_dkdv_item(item, kv_cnt, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, kv_fulls,
                       kv_empties, qdo_fulls, qdo_empties, p_tiles, ds_tiles, ds_fulls, ds_empties, dq_stages,
                       desc_dq, DQ, DK, DV, TILES, CU_Q, CU_K, stride_dqt, stride_dkt, stride_dkh, stride_dvt,
                       stride_dvh,
                       num_slots, num_heads, num_seqs, len_q_bcast, sm_scale, qk_scale,
                       cid: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
                       FUSED_DQ: tl.constexpr, DQ_REDUCE: tl.constexpr, DQ_FIRST: tl.constexpr, DQ_T: tl.constexpr,
                       DQ_PRODUCER: tl.constexpr, DQ_HALVES: tl.constexpr, ROWS: tl.constexpr,
                       SKIP_KEYLESS: tl.constexpr, HALVES_LATE: tl.constexpr,
                       TILE_N: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                       DTYPE: tl.constexpr):
    """Consumer ``cid``, one work item: its BLOCK_N key rows against every query step, then one store
    of dK (scaled) and dV."""
    head, q_row0, _or, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, bulk_end, num_q_tiles = \
        _dkdv_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q,
                   TILE_N, BLOCK_M)
    n_masked = n_lead + num_q_tiles - bulk_end  # the producer's step order (_step_order)
    n_masked_steps = n_masked
    bulk_start = first + n_lead
    if FUSED_DQ and not CAUSAL:
        # key rows reaching past the sequence (the TMA box holds the next sequence's first keys) run
        # every step masked, so that the bulk step carries no key mask (registers: D 128 spilled with it)
        if SKIP_KEYLESS:  # this consumer's rows (the other's may reach past while these do not)
            partial = n_start + (cid + 1) * BLOCK_N > len_k
        else:
            partial = n_start + TILE_N > len_k
        n_masked_steps = tl.where(partial, num_q_tiles - first, n_masked)
        bulk_start = tl.where(partial, bulk_end, bulk_start)
    n_keyless_steps = 0
    if SKIP_KEYLESS and cid > 0 and not DQ_HALVES and not ROWS:
        # this consumer's key rows all lie past the sequence: its steps run no MMA (the loops below then
        # run no step, and the epilogue stores no row). Loop counts rather than a branch around the
        # loops: with the branch, the consumers of the producer's-dQ build (216 registers) kept a stack.
        keyless = n_start + cid * BLOCK_N >= len_k
        n_keyless_steps = tl.where(keyless, num_q_tiles - first, 0)
        n_masked_steps = tl.where(keyless, 0, n_masked_steps)
        bulk_start = tl.where(keyless, bulk_end, bulk_start)
    offs_n = n_start + cid * BLOCK_N + tl.arange(0, BLOCK_N)
    ds_tile = ds_tiles[cid]
    p_tile = p_tiles[cid]
    dq_row0, dq_col = q_row0, head * HEAD_DIM  # where the item's dQ goes in the (contiguous, q-shaped) accumulator
    if DQ_HALVES:  # its dQ reads both consumers' K
        for c in tl.static_range(_CONSUMERS):
            tlx.barrier_wait(kv_fulls[c], kv_cnt & 1)
    else:
        tlx.barrier_wait(kv_fulls[cid], kv_cnt & 1)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for j in tl.range(0, n_keyless_steps):
        qdo_cnt = _keyless_ring_step(qdo_cnt, qdo_fulls, qdo_empties, ds_tiles, ds_fulls, ds_empties, cid,
                                     FUSED_DQ and not DQ_PRODUCER and DQ_REDUCE == 0, DQ_PRODUCER, BLOCK_N,
                                     BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE)
    staged_row = -1  # HALVES_LATE: no dQ half staged yet in this item
    for j in tl.range(0, n_masked_steps):  # the producer's order (_step_order): masked steps, then the bulk
        dk, dv, qdo_cnt, staged_row = _dkdv_ring_step(
            dk, dv, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties,
            p_tile, ds_tile, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq, DQ, stride_dqt, dq_row0, dq_col,
            _step_order(j, first, n_lead, n_masked, bulk_end) * BLOCK_M, offs_n, n_start + cid * BLOCK_N, len_q,
            len_k, causal_shift, qk_scale, sm_scale, staged_row, cid, True, CAUSAL, FUSED_DQ, DQ_REDUCE, DQ_FIRST,
            DQ_T, DQ_PRODUCER, DQ_HALVES, ROWS, HALVES_LATE, BLOCK_N, BLOCK_M, HEAD_DIM,
            NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE)
    for i in tl.range(bulk_start, bulk_end):
        dk, dv, qdo_cnt, staged_row = _dkdv_ring_step(
            dk, dv, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties,
            p_tile, ds_tile, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq, DQ, stride_dqt, dq_row0, dq_col,
            i * BLOCK_M, offs_n, n_start + cid * BLOCK_N, len_q, len_k, causal_shift, qk_scale, sm_scale,
            staged_row, cid, False, CAUSAL, FUSED_DQ, DQ_REDUCE, DQ_FIRST, DQ_T, DQ_PRODUCER, DQ_HALVES, ROWS,
            HALVES_LATE, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE)
    if HALVES_LATE:  # the item's last staged half
        _send_halves_dq(dq_stages[cid], desc_dq, staged_row, dq_col, cid, HEAD_DIM)
    if DQ_HALVES:  # every MMA of this consumer reading the item's K and V (both halves of K) has retired
        for c in tl.static_range(_CONSUMERS):
            tlx.barrier_arrive(kv_empties[c], 1)
    else:
        tlx.barrier_arrive(kv_empties[cid], 1)  # every MMA reading this item's K and V has retired

    # epilogue: key rows past the sequence belong to the next one and are never written
    if DQ_HALVES:
        # the item's numbers read again rather than carried through the loops (registers: at 240 with
        # 64-row steps the values kept for the epilogue were spilled to the stack)
        head, _t, _qr, _or, _lq, k_row0, len_k = _item_sequence(TILES, CU_Q, CU_K, item, num_slots, num_heads,
                                                                num_seqs, len_q_bcast, BROADCAST_Q)
        offs_n = _t * TILE_N + cid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_n < len_k
    offs_d = tl.arange(0, HEAD_DIM)
    rows = k_row0.to(tl.int64) + offs_n.to(tl.int64)
    tl.store(DK + rows[:, None] * stride_dkt + head * stride_dkh + offs_d[None, :], (dk * sm_scale).to(DTYPE),
             mask=row_ok[:, None])
    tl.store(DV + rows[:, None] * stride_dvt + head * stride_dvh + offs_d[None, :], dv.to(DTYPE),
             mask=row_ok[:, None])
    return qdo_cnt


@triton.jit(do_not_specialize=["num_items", "num_progs", "num_rounds", "num_slots", "num_seqs", "num_heads", "len_q_bcast"])
def jagged_dkdv_tlx_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, DQ, DK, DV, CU_Q, CU_K, STATS_CU, TILES,
    stride_dqt, stride_dkt, stride_dkh, stride_dvt, stride_dvh, col_stride_q, col_stride_k, col_stride_v,
    col_stride_do, num_items, num_progs, num_rounds, num_slots, num_seqs, num_heads, len_q_bcast, sm_scale,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, FUSED_DQ: tl.constexpr,
    DQ_REDUCE: tl.constexpr, DQ_FIRST: tl.constexpr, DQ_T: tl.constexpr, DQ_PRODUCER: tl.constexpr,
    DQ_SEND_LATE: tl.constexpr, DQ_HALVES: tl.constexpr, ROWS: tl.constexpr, SCHEDULE: tl.constexpr,
    SKIP_KEYLESS: tl.constexpr, HALVES_LATE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    NUM_BUFFERS_QDO: tl.constexpr, CONSUMER_REGS: tl.constexpr,
):
    TILE_N: tl.constexpr = _CONSUMERS * BLOCK_N
    # the K/V tiles' use count is the round counter (below): true for the static schedules only, where
    # every round but the last deals an item to every CTA
    tl.static_assert(SCHEDULE < 2, "the dK/dV kernel takes a static schedule (zigzag or round-robin)")
    DTYPE: tl.constexpr = tlx.dtype_of(desc_q)
    KV_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(DTYPE)
    QDO_BYTES: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(DTYPE)
    # the grid's size and the number of rounds come as arguments, not from %nctaid and a division: a
    # kernel parameter is re-read from the constant bank where needed, while ptxas kept the computed
    # values on the stack (4-8 B) once the consumers had a loop more
    pid = tl.program_id(0)

    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, _CONSUMERS)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, _CONSUMERS)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    lse_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_BUFFERS_QDO)
    delta_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_BUFFERS_QDO)
    # fused dQ: each consumer's dS^T (an operand of its dQ MMA) and two fp32 dQ stages per consumer (one
    # being read by its TMA reduce-add while the next step fills the other), [BLOCK_M, HEAD_DIM]. With
    # DQ_PRODUCER: NUM_BUFFERS_DS slots of both consumers' dS^T (the producer reads a step's slot while
    # the consumers fill the next) and the producer's two stages. With DQ_HALVES: see below.
    DQ_ROWS: tl.constexpr = BLOCK_M if FUSED_DQ else 8
    # DQ_PRODUCER: the producer computes a step's dQ DQ_LAG steps after issuing its loads, so that its
    # wait for the consumers' dS^T delays the next load by no more than the ring allows: one less than
    # the ring's depth (a load waits for the slot's consumers DQ_LAG + 1 steps back anyway). Also the
    # number of dS^T slots: the consumers may run DQ_LAG steps ahead of the producer's dQ.
    DQ_LAG: tl.constexpr = NUM_BUFFERS_QDO - 1
    # DQ_HALVES: two slots of both consumers' dS^T (a consumer stores step s + 1's while the other may
    # still run step s's dQ MMAs over both), one fp32 half-stage per consumer (two each came to 241 KB
    # as compiled, over the 227 KB)
    NUM_BUFFERS_DS: tl.constexpr = DQ_LAG if DQ_PRODUCER else (2 if DQ_HALVES else 1)
    NUM_DQ_STAGES: tl.constexpr = 2 if DQ_PRODUCER else (1 if DQ_HALVES else 2) * _CONSUMERS
    if ROWS:  # P and dS of the row-major step ([BLOCK_M, BLOCK_N]); the producer's dQ by head-dim halves
        p_tiles = tlx.local_alloc((BLOCK_M, BLOCK_N), DTYPE, _CONSUMERS)
        ds_tiles = tlx.local_alloc((BLOCK_M, BLOCK_N), DTYPE, _CONSUMERS * NUM_BUFFERS_DS)
        dq_stages = tlx.local_alloc((DQ_ROWS, HEAD_DIM // 2), tl.float32, NUM_DQ_STAGES)
    else:
        p_tiles = tlx.local_alloc((8, 16), DTYPE, _CONSUMERS)  # unused
        ds_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M if FUSED_DQ else 16), DTYPE, _CONSUMERS * NUM_BUFFERS_DS)
        dq_stages = tlx.local_alloc((DQ_ROWS, HEAD_DIM // 2 if DQ_HALVES else HEAD_DIM), tl.float32, NUM_DQ_STAGES)
    kv_fulls = tlx.alloc_barriers(num_barriers=_CONSUMERS, arrive_count=1)
    # DQ_HALVES: a K half is read by both consumers' dQ, so both give it back
    kv_empties = tlx.alloc_barriers(num_barriers=_CONSUMERS, arrive_count=_CONSUMERS if DQ_HALVES else 1)
    qdo_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=1)
    qdo_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=_CONSUMERS)
    if DQ_PRODUCER or DQ_HALVES:  # a slot is full once both consumers stored; empty once its readers retired
        ds_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DS, arrive_count=_CONSUMERS)
        ds_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DS, arrive_count=_CONSUMERS if DQ_HALVES else 1)
    else:  # never waited on
        ds_fulls = qdo_fulls
        ds_empties = qdo_empties

    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA loads
            qdo_cnt = 0
            for rounds in range(0, num_rounds):
                item = _static_item(rounds, pid, num_progs, SCHEDULE)
                if item < num_items:
                    # the K/V tiles' use count is `rounds`: every round but the last has an item
                    # for every CTA (so no register carries it: the D 128 producer has 72)
                    qdo_cnt = _produce_dkdv_item(
                        item, rounds, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, k_tiles,
                        v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, ds_tiles, dq_stages, kv_fulls, kv_empties,
                        qdo_fulls, qdo_empties, ds_fulls, ds_empties, TILES, CU_Q, CU_K, STATS_CU, num_slots,
                        num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, col_stride_do,
                        sm_scale, CAUSAL, BROADCAST_Q, DQ_PRODUCER, DQ_REDUCE, DQ_FIRST,
                        DQ_SEND_LATE, DQ_T, ROWS, TILE_N,
                        BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, KV_BYTES, QDO_BYTES)
            if DQ_PRODUCER:
                tlx.async_descriptor_store_wait(0)  # shared memory must outlive the last reduce-add's read
        with tlx.async_task(num_warps=_CONSUMER_WARPS, registers=CONSUMER_REGS, replicate=_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            qk_scale = sm_scale * 1.4426950408889634
            qdo_cnt = 0
            for rounds in range(0, num_rounds):
                item = _static_item(rounds, pid, num_progs, SCHEDULE)
                if item < num_items:
                    qdo_cnt = _consume_dkdv_item(
                        item, rounds, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles,
                        kv_fulls, kv_empties, qdo_fulls, qdo_empties, p_tiles, ds_tiles, ds_fulls, ds_empties,
                        dq_stages, desc_dq, DQ, DK, DV, TILES, CU_Q, CU_K, stride_dqt, stride_dkt,
                        stride_dkh, stride_dvt, stride_dvh, num_slots, num_heads, num_seqs,
                        len_q_bcast, sm_scale, qk_scale, cid, HEAD_DIM, CAUSAL, BROADCAST_Q, FUSED_DQ, DQ_REDUCE,
                        DQ_FIRST, DQ_T, DQ_PRODUCER, DQ_HALVES, ROWS, SKIP_KEYLESS, HALVES_LATE, TILE_N,
                        BLOCK_N, BLOCK_M,
                        NUM_BUFFERS_QDO, NUM_BUFFERS_DS,
                        DTYPE)
            if FUSED_DQ and DQ_REDUCE == 0 and not DQ_PRODUCER:
                tlx.async_descriptor_store_wait(0)  # shared memory must outlive the last reduce-add's read


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------
def _constexprs(cfg: HopperDkDvConfig, head_dim: int, *, causal: bool, broadcast_q: bool, fused_dq: bool,
                variant: BackwardVariant = SHIPPED) -> dict:
    producer_dq = fused_dq and dq_in_producer(cfg, variant, causal)
    if cfg.rows_major and fused_dq and not producer_dq:
        raise ValueError("a rows-major dK/dV config computes a fused dQ only in the producer (dq_in_producer=1)")
    if cfg.dq_halves and fused_dq and variant.dq_reduce == "atomic":
        raise ValueError("BackwardVariant: dq_reduce='atomic' (the consumers' element-wise atomics) has no build "
                         "with the 64-row D 128 steps' dQ halves: at D 128 add steps64=0")
    return dict(HEAD_DIM=head_dim, CAUSAL=causal, BROADCAST_Q=broadcast_q, FUSED_DQ=fused_dq,
                # the dQ switches mean nothing without the fused dQ: one build for every unfused variant
                DQ_REDUCE=DQ_REDUCES.index(variant.dq_reduce) if fused_dq else 0,
                # (nor dq_first with the 64-row steps' dQ halves)
                DQ_FIRST=fused_dq and variant.dq_first and not cfg.dq_halves,
                DQ_T=fused_dq and dq_transposed(cfg),
                DQ_PRODUCER=producer_dq,
                DQ_SEND_LATE=producer_dq and variant.dq_send_late and variant.dq_reduce == "tma" and not cfg.rows_major,
                DQ_HALVES=fused_dq and cfg.dq_halves,
                ROWS=cfg.rows_major,
                SCHEDULE=SCHEDULES.index(variant.schedule),
                SKIP_KEYLESS=variant.skip_keyless,
                HALVES_LATE=fused_dq and cfg.dq_halves and variant.halves_send_late and variant.dq_reduce == "tma",
                BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, NUM_BUFFERS_QDO=cfg.num_buffers_qdo,
                CONSUMER_REGS=consumer_regs(cfg, fused_dq=fused_dq, variant=variant, causal=causal))


def _launch_options() -> dict:
    return dict(num_warps=PRODUCER_WARPS, num_stages=1)  # explicit pipelining only


def compile_spec(dtype: str, head_dim: int, *, causal: bool, broadcast_q: bool, fused_dq: bool = False,
                 config: HopperDkDvConfig = None, variant: BackwardVariant = SHIPPED):
    """``(kernel, signature, constants, attrs, options)`` for an offline ``triton.compile``."""
    cfg = config or config_for(head_dim, variant, fused_dq)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, fused_dq=fused_dq,
                            variant=variant)
    types = {f"desc_{x}": f"tensordesc<{dtype}[{rows}, {head_dim}]>"
             for x, rows in (("q", cfg.block_m), ("do", cfg.block_m), ("k", cfg.block_n), ("v", cfg.block_n))}
    # unused without the fused dQ: the launcher passes desc_q
    dq_box = (cfg.block_m, dq_box_columns(cfg, head_dim) if fused_dq else head_dim)
    types.update(
        desc_stats=f"tensordesc<fp32[1, {cfg.block_m}]>",
        # unused without fused dQ: the launcher passes desc_q there
        desc_dq=f"tensordesc<{'fp32' if fused_dq else dtype}[{dq_box[0]}, {dq_box[1]}]>",
        DQ="*fp32" if fused_dq else f"*{dtype}", DK=f"*{dtype}", DV=f"*{dtype}", CU_Q="*i32", CU_K="*i32",
        TILES="*i32", STATS_CU="*i64", sm_scale="fp32")
    signature, attrs = offline_signature(jagged_dkdv_tlx_kernel, constants, types)
    return jagged_dkdv_tlx_kernel, signature, constants, attrs, _launch_options()


class DqAccumulator:
    """The zeroed fp32 accumulator the fused dQ reduce-adds into (shaped like q, [T, H, D]), and its
    read-out as dq. With ``zeroed=False`` it is allocated uninitialised and ``jagged_dkdv_tlx`` zeroes it
    before its kernel: in the row statistics' pass where that pass covers its rows (not broadcast Q),
    which saves a memset of 4 bytes per element (0.06-0.12 ms on the gem shapes, H200). A query step's
    reduce-add is one TMA box of BLOCK_M rows and the head's D columns, or half of them where dQ is
    reduced by head-dim halves (``dq_box_columns``: the 64-row D 128 steps that ship, 64 x 64).
    (The kernel computes dQ^T and stores it transposed into the stage: ``_stage_dq``. Until 2026-11-29,
    session 8, it kept a transposed accumulator blocked by 32 tokens, which padded every sequence to
    32 columns and needed its own read-out kernel.)"""

    def __init__(self, q: torch.Tensor, config: HopperDkDvConfig = None, zeroed: bool = True):
        self.q = q
        self.config = config or config_for(q.shape[2])
        self.zeroed = zeroed
        self.tensor = (torch.zeros if zeroed else torch.empty)(q.shape, dtype=torch.float32, device=q.device)

    def descriptor(self):
        """(TMA descriptor over [T, H * D], row stride) for the kernel; head h starts at column h * D."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc, _ = _descriptor(self.tensor, self.config.block_m)
        columns = dq_box_columns(self.config, self.q.shape[2])
        if columns != self.q.shape[2]:  # the rows-major producer and the dq_halves consumers reduce-add halves
            desc = TensorDescriptor(desc.base, shape=desc.shape, strides=desc.strides,
                                    block_shape=[self.config.block_m, columns])
        return desc, self.tensor.stride(0)

    def read(self) -> torch.Tensor:
        """dq in q's dtype and shape (contiguous)."""
        return self.tensor.to(self.q.dtype)


def jagged_dkdv_tlx(q, k, v, dout, lse, delta, dk, dv, out_cu, cu_k, *, causal: bool, softmax_scale: float,
                    broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, config: HopperDkDvConfig = None,
                    dq_accum: DqAccumulator = None, variant: BackwardVariant = SHIPPED, outputs=None) -> None:
    """Write dK and dV (``dk``, ``dv``: like k, v) of the jagged attention; ``delta`` is
    rowsum(dO * O) - dlse per output row and head (float32, like ``lse``), or None with
    ``outputs=(out, dout, dlse or None)`` to compute it with the row statistics (``row_stats``). With ``dq_accum``
    (a ``DqAccumulator`` of q, same config) the kernel also reduce-adds every tile's dQ into it (fused
    dQ: the order of the additions varies from run to run; ``dq_accum.read()`` gives dq). Raises
    ValueError when the TLX kernel cannot take these inputs (``forward.supports``, dout included).
    ``config`` and ``variant`` override what ships (measurements)."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    ok, reason = supports(q, head_dim, q.dtype, k=k, v=v)
    if ok and head_dim not in SUPPORTED_HEAD_DIMS:
        ok, reason = False, f"head_dim {head_dim} not supported by the dK/dV kernel (only {SUPPORTED_HEAD_DIMS})"
    if ok and dq_accum is not None and head_dim not in FUSED_DQ_HEAD_DIMS:
        ok, reason = False, f"head_dim {head_dim}: no fused dQ (only {FUSED_DQ_HEAD_DIMS})"
    if ok:
        ok, reason = supports(dout, head_dim, dout.dtype)
    if not ok:
        raise ValueError(f"jagged_dkdv_tlx: {reason}")
    cfg = config or config_for(head_dim, variant, fused_dq=dq_accum is not None)
    # the build's constants first: a variant without a build here raises before any kernel runs
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, fused_dq=dq_accum is not None,
                            variant=variant)
    if k.shape[0] == 0 or q.shape[0] == 0 or dout.shape[0] == 0 or num_heads == 0 or num_seqs == 0:
        if dq_accum is not None and not dq_accum.zeroed:  # no key anywhere: dq is 0
            dq_accum.tensor.zero_()
            dq_accum.zeroed = True
        dk.zero_()  # no query anywhere: every key gets zero gradients
        dv.zero_()
        return
    tiles = build_tile_list(cu_k, k.shape[0], NUM_CONSUMERS * cfg.block_n,
                            work_offsets=None if broadcast_q else out_cu)
    desc_q, col_q = _descriptor(q, cfg.block_m)
    desc_do, col_do = _descriptor(dout, cfg.block_m)
    desc_k, col_k = _descriptor(k, cfg.block_n)
    desc_v, col_v = _descriptor(v, cfg.block_n)
    if dq_accum is not None and (dq_accum.config != cfg or dq_accum.q.shape != q.shape):
        raise ValueError("jagged_dkdv_tlx: dq_accum was built for another q or config")
    # (the kernel places head h of the accumulator at column h * D: it is contiguous, like q)
    desc_dq, stride_dq = (desc_q, q.stride(0)) if dq_accum is None else dq_accum.descriptor()
    zero = None  # the accumulator's zeroing: in the statistics' pass where it covers the accumulator's rows
    if dq_accum is not None and not dq_accum.zeroed:
        if outputs is not None and not broadcast_q and q.shape[0] == lse.shape[0]:
            zero = dq_accum.tensor
        else:
            dq_accum.tensor.zero_()
            dq_accum.zeroed = True
    stats, stats_cu = row_stats(lse, delta, out_cu, num_seqs, outputs=outputs, zero=zero)
    if zero is not None:
        dq_accum.zeroed = True
    desc_stats = stats_descriptor(stats, cfg.block_m)
    num_items = tiles.num_slots * num_heads
    cu_q = cu_k if broadcast_q else out_cu
    grid = (min(_sm_count(q.device), num_items) if variant.persistent else num_items,)
    dq_ptr = q if dq_accum is None else dq_accum.tensor  # read only by the atomic fused dQ (ablation)
    with pipeline.build_llvm_o0(jagged_dkdv_tlx_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        jagged_dkdv_tlx_kernel[grid](
            desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, dq_ptr, dk, dv, cu_q, cu_k, stats_cu, tiles.tiles,
            stride_dq, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), col_q, col_k, col_v, col_do,
            num_items, grid[0], triton.cdiv(num_items, grid[0]), tiles.num_slots, num_seqs, num_heads, len_q_bcast,
            softmax_scale, **constants, **_launch_options())


def default_variant() -> BackwardVariant:
    """What ships, overridden for a process by ``JFA_TLX_BWD_VARIANT="steps64=0"`` (or
    ``steps64=0,dq_in_producer=0``, ...: tests and measurements of each switch; dq_reduce=none drops dQ
    and is refused here)."""
    text = os.environ.get("JFA_TLX_BWD_VARIANT", "")
    variant = BackwardVariant.parse(text) if text else SHIPPED
    if variant.dq_reduce in ("none", "stage-only"):
        raise ValueError(f"JFA_TLX_BWD_VARIANT: dq_reduce={variant.dq_reduce} computes no dQ (timing only), "
                         "not through the API")
    return variant


def fused_dq_default() -> bool:
    """Whether the TLX backward reduces dQ inside the dK/dV kernel (``JFA_TLX_FUSED_DQ``, default on:
    on the H200 as fast as the portable dQ pass or faster, up to 27% on broadcast Q; deterministic calls
    never do)."""
    return env_flag("JFA_TLX_FUSED_DQ", True)


def jagged_backward_tlx(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float,
                        broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None, deterministic=False,
                        fused_dq: bool = None, variant: BackwardVariant = None):
    """The TLX backward (same contract as ``jfa.kernels.triton.backward.jagged_backward``): the row
    statistics' pre-pass, then this kernel for dK and dV; dQ either reduce-added by the same kernel (fused:
    head dims in ``FUSED_DQ_HEAD_DIMS``, never when ``deterministic``;
    ``fused_dq`` None means ``fused_dq_default()``) or by the portable dQ pass, which writes each row
    once in a fixed order (bitwise reproducible)."""
    from jfa.kernels.triton import backward as portable

    if fused_dq is None:
        fused_dq = fused_dq_default()
    if variant is None:
        variant = default_variant()
    cfg = config_for(q.shape[-1], variant) if q.shape[-1] in SUPPORTED_HEAD_DIMS else None
    fused = fused_dq and not deterministic and q.shape[-1] in FUSED_DQ_HEAD_DIMS
    if not fused:
        return portable.jagged_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal,
                                        softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs,
                                        len_q_bcast=len_q_bcast, dlse=dlse,
                                        dkdv=functools.partial(jagged_dkdv_tlx, variant=variant))
    out_cu = portable.output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    dq_accum = DqAccumulator(q, cfg, zeroed=False)  # zeroed by the statistics' pass
    # delta = rowsum(dO * O) - dlse is computed with the row statistics, in one pass (no delta tensor)
    jagged_dkdv_tlx(q, k, v, dout, lse, None, dk, dv, out_cu, cu_k, causal=causal, softmax_scale=softmax_scale,
                    broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dq_accum=dq_accum,
                    variant=variant, outputs=(out, dout, dlse))
    return dq_accum.read(), dk, dv
