"""Jagged FlashAttention backward for Hopper (sm_90a) in TLX: the dK/dV kernel, with dQ fused into it.

``jagged_backward_tlx`` is what autograd runs after the TLX forward: a pre-pass for the row statistics
(lse and delta = rowsum(dO * O) - dlse, ``row_stats``), then this kernel for dK and dV, and dQ either
fused into it or from the portable dQ pass (no atomics, bitwise reproducible: every
``deterministic=True`` call, or ``knobs.tlx_fused_dq`` off). Three builds ship, one per config row:

* fused dQ at D 64 (``dq="producer"``): the producer warpgroup computes dQ = dS K over both consumers'
  keys from the dS^T tiles they store, one TMA reduce-add per step into an fp32 accumulator
  (``DqAccumulator``), its staged dQ sent a step late so the fence never waits for the stage's
  stores to drain;
* fused dQ at D 128 (``dq="halves"``, FA3's split): 64-row query steps; each consumer computes dQ^T for
  one head-dim half over both consumers' keys and reduce-adds it a step later; its LLVM IR is left to
  ptxas (``HopperDkDvConfig.llvm_o0``: LLVM's loop-invariant code motion makes its consumers spill);
* no fused dQ (``dq="none"``): dK and dV only (64-row steps at D 64, 32-row steps at D 128).

Shape of the kernel (the forward's structure turned around: keys are the rows):

* Persistent grid, one CTA per SM, dealing work items round-robin over a longest-first list
  (``common.device.static_item``). A work item is (key tile of ``2 * BLOCK_N`` rows, head); the tile
  list is built on the key offsets and sorted by each sequence's query length (the work a key tile
  streams over). Causal and windowed builds, whose key tiles of one sequence differ in work, take their
  items from a global counter (``common.device.fetch_item``), and so do block-sparse builds, which also
  number the items head-major (``common.device.item_slot_head``); ``BackwardVariant`` says why.
* Producer (default partition, one warpgroup; ``dkdv_producers``): per item, TMA loads of each consumer's K and V half
  (``BLOCK_N`` rows each, single-buffered: reloaded when both MMAs of the item's last step retired),
  then per step the ``BLOCK_M`` query rows' Q, dO and row statistics (lse2, delta) into a ring shared by
  both consumers. The statistics come transposed ([2H, T], ``row_stats``) so that a tile's rows are one
  TMA box: as per-step global loads they would sit on every step's critical path.
* Two consumer warpgroups, each owning ``BLOCK_N`` key rows, in the transposed formulation: per query
  step ``S^T = K Q^T`` and ``dP^T = V dO^T`` on wgmma, ``P^T = exp2(S^T * scale * log2 e - lse2)``,
  ``dS^T = P^T (dP^T - delta)``, then ``dV += P^T dO`` and ``dK += dS^T Q`` with P^T and dS^T as
  register A operands. dK and dV live in registers for the whole item and are written once, so dK and
  dV are bitwise reproducible.
* Loop peeling: steps whose every query row sees every key of the tile run without a mask; the causal
  diagonal and the sequence's last partial query tile run the masked step (one helper, ``MASKED``); with
  the fused dQ (non-causal) so does every step of a consumer whose key rows reach past its sequence. A
  consumer whose key rows all lie past it runs no MMA at all (``_keyless_ring_step``), except in the
  ``halves`` build, where each consumer's dQ half needs both consumers' dS^T.
* Jagged tails without padding of the inputs: the TMA boxes may read rows of the next sequence (Q, dO
  and its statistics, K and V); the masked step zeroes P^T (and so dS^T) for every query row past the
  sequence, and for key rows past it where dQ sums over them; such key rows are never stored. (The
  statistics are laid out with each sequence on an aligned column: ``row_stats.aligned_columns``.)

* Grouped-query attention: items are (key tile, key/value head); an item runs the steps of each of the
  group's query heads in turn against its K and V, dK and dV accumulating over the group in registers (one
  bf16/fp16 store per item, no partials), dQ per query head as without groups. Sliding windows: an item's
  steps cover only the query tiles whose band reaches its keys (``jfa.kernels.bands``); the band's two edges
  run masked, the tiles between them, which see every key of the item, the unmasked bulk step.

Supported: bf16 and fp16, head dims 64 and 128, the forward's TMA layout rules (``supports``).

MXFP8 (``MX`` builds, :func:`mx_backward_tlx`; docs/mxfp8.md section 2, the portable ``mx_dkdv_kernel``'s
semantics): the same consumers, ring and step order without the fused dQ. Hopper has no block-scaled MMA, so
the producer loads each operand's E4M3 bytes and E8M0 scales with 16-byte loads (rows past the sequence masked)
and dequantizes them exactly into the bf16 MMA buffers: K and V along D, and per step Q and dO twice, along D
(for S^T and dP^T) and along the sequence's 32-row query blocks (for dK and dV); the row statistics still come
by TMA. The consumers MX-quantize P^T and dS^T along their columns (the queries of a step of 32 or 64 rows
starting on a multiple of the step from the sequence's first row: whole blocks) with the portable kernels'
``_mx_round``. dQ = dS^(keys) K^(keys) runs on the portable MX dQ pass (``mx_attention.mx_backward`` with this
build as its ``dkdv``): the fused dQ's dS^T would need a second quantization, along keys, and a second K tile
(K^(keys)) beside K^(dim), and its reduce-adds would make dq run-to-run nondeterministic; the pass keeps the MX
backward bitwise reproducible. Grouped heads and broadcast Q as in the bf16 builds; no sliding windows
(``mx_backward_supports``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from jfa import knobs
from jfa.kernels import alloc
from jfa.kernels.bands import window_band
from jfa.kernels.schedule import build_tile_list, output_offsets
from jfa.kernels.tlx import pipeline
from jfa.kernels.tlx.common import target
from jfa.kernels.tlx.common.device import (ITEM_BUFFERS, bufidx_phase, clock64, fetch_item, globaltimer,
                                           item_sequence, receive_item, retire_counter, smid, static_item,
                                           to_16bit_pairs)
from jfa.kernels.tlx.common.host import (check_inputs, descriptor, make_variant, offline_signature, rebased, sm_count,
                                         schedule_counter, tlx, work_counter)
from jfa.kernels.tlx.hopper.dkdv_producers import produce_dkdv_item
from jfa.kernels.tlx.hopper.dkdv_steps import (PROFILE_FIELDS, REC_CTA, REC_DECODED, REC_END, REC_FIRST_STEP,
                                                REC_KV_READY, REC_SM, REC_START, REC_START_NS, REC_STEPS,
                                                REC_STEPS_DONE, dkdv_item, send_staged_dq, sparse_step_masked,
                                                stage_dq, stamp, step_tile)
from jfa.kernels.tlx.hopper.mx_producers import produce_dkdv_item_mx
from jfa.kernels.tlx.hopper.row_stats import row_stats, stats_descriptor
from jfa.kernels.triton.mx_attention import _mx_round
from jfa.plans import gradient_key

DQ_MODES = ("none", "producer", "halves")  # HopperDkDvConfig.dq
DQ_NONE = tl.constexpr(0)
DQ_PRODUCER = tl.constexpr(1)
DQ_HALVES = tl.constexpr(2)


@dataclass(frozen=True)
class HopperDkDvConfig:
    block_n: int  # key rows per consumer warpgroup (the M of every wgmma: 64)
    block_m: int  # query rows per step
    num_buffers_qdo: int  # (Q, dO) stages shared by both consumers
    consumer_regs: int  # setmaxnreg of each consumer warpgroup (the producer gets what is left)
    dq: str = "none"  # the fused dQ: one of DQ_MODES
    llvm_o0: bool = False  # the build's LLVM IR left to ptxas (pipeline.build_llvm_o0)

    def __post_init__(self):
        if self.dq not in DQ_MODES:
            raise ValueError(f"HopperDkDvConfig.dq: must be one of {DQ_MODES}, got {self.dq!r}")


NUM_CONSUMERS = 2
PRODUCER_WARPS = 4
# Named barriers: 0 is Triton's own (the producer warpgroup's sends use it), the forward's pingpong takes 9
# and 10 (``forward.BAR_TO_C0``/``BAR_TO_C1``), so the halves' consumers take 11 and 12, one each.
HALVES_DQ_BARRIER = tl.constexpr(11)
_CONSUMERS = tl.constexpr(NUM_CONSUMERS)
_CONSUMER_WARPS = tl.constexpr(4)

# (head dim, fused dQ) -> the build that ships
_CONFIGS: dict = {
    # D 64: dK and dV accumulators 64x64 fp32 = 32 regs/thread each, S^T and dP^T (64 x 64) 32 each.
    # Shared memory: K, V halves 4 x 8 KB + 3 stages x (Q, dO, lse2, delta).
    (64, False): HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=3, consumer_regs=240),
    # The producer's dQ: the consumers hold no dQ accumulator and give the producer warpgroup registers
    # for its own (it gets 72: 128 * 72 + 256 * 216 <= 65536; at 56 it spills, and so do consumers at
    # 208). dS^T slots and dQ stages: DQ_LAG (= stages - 1) slots of both consumers' dS^T, two fp32
    # stages of [64, 64].
    (64, True): HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=3, consumer_regs=216, dq="producer"),
    # D 128 without the fused dQ: dK + dV take 128 regs/thread; 32-row steps fit in 240 registers with no
    # spill (64-row steps spill unless LLVM's optimisation is skipped, and that build is not validated
    # without the fused dQ). Shared memory: K, V halves 4 x 16 KB + 3 stages x (Q 8 KB + dO 8 KB + stats).
    (128, False): HopperDkDvConfig(block_n=64, block_m=32, num_buffers_qdo=3, consumer_regs=240),
    # D 128 with the fused dQ: 64-row steps (S^T, dP^T at N = 64 read 1.5x less shared memory per FLOP
    # than at N = 32, the wall of 32-row steps). The producer cannot hold a [64, 128] fp32 dQ, so each
    # consumer computes one head-dim half over both consumers' keys (``_dq_halves``). Its consumers spill
    # the per-thread shared-memory addresses LLVM hoists to the kernel's entry unless the LLVM IR is left
    # to ptxas (``llvm_o0``). Shared memory: K, V 64 KB + 2 stages x (Q, dO) 64 KB + dS^T 2 slots x 2 x
    # 8 KB + one fp32 dQ half-stage of 16 KB per consumer: 209 KB as compiled (two stages each: 241 KB,
    # over the 227 KB).
    (128, True): HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=2, consumer_regs=240, dq="halves",
                                  llvm_o0=True),
}
SUPPORTED_HEAD_DIMS = tuple(sorted({d for d, _ in _CONFIGS}))

# MXFP8 builds (``MX``, :func:`mx_backward_tlx`): dK and dV only (dQ is the portable MX dQ pass: its dS is
# quantized along keys and multiplies K^(keys), a second quantization of K, and the pass keeps dq bitwise
# reproducible). Each ring slot holds Q and dO twice, dequantized from their D-axis bytes (the operands of
# S^T and dP^T) and from their query-axis bytes (of dK += dS^(queries)^T Q^(queries), dV += P^(queries)^T
# dO^(queries)); steps of a multiple of 32 query rows, so each step's P^T and dS^T columns hold whole
# quantization blocks. The producer loads the bytes and dequantizes them in registers (a step's four tiles, 4 KB
# of bytes each, loaded together; K and V in 4 KB chunks), so it keeps more registers than the TMA producer:
# D 64 consumers 200 (producer 104), D 128 216 (producer 72: 256 * 216 + 128 * 80 <= 65536, TLX keeps 8). Only
# with the LLVM IR left to ptxas (``llvm_o0``) do both sides fit: with LLVM's optimisation the D 64 builds spill
# 12-16 bytes, and at D 128 (or with consumers at 208) the RCEIL or fp32-gradient builds 4-40 bytes
# (compile gate, 2026-12-02).
# Shared memory: D 64: K, V 4 x 8 KB + 3 stages x (4 x 8 KB + stats) = 146 KB; D 128: K, V 4 x 16 KB + 2 stages x
# (4 x 8 KB + stats) = 145 KB (3 stages: 193 KB, and the fp32-gradient builds' epilogue goes past 227 KB).
_MX_CONFIGS: dict = {
    64: HopperDkDvConfig(block_n=64, block_m=64, num_buffers_qdo=3, consumer_regs=200, llvm_o0=True),
    128: HopperDkDvConfig(block_n=64, block_m=32, num_buffers_qdo=2, consumer_regs=216, llvm_o0=True),
}
MX_RULES = ("floor", "rceil")
# the MX build's operands besides the four byte tensors in the descriptors' places: constexpr None in the
# bf16/fp16 builds (no parameters there)
MX_ARGS = ("QS", "QT", "QTS", "QB_OFF", "KS", "VS", "DOS", "DOT_", "DOTS", "OB_OFF")


def config_for(head_dim: int, fused_dq: bool = True, mx: str = "") -> HopperDkDvConfig:
    """The dK/dV build that ships at ``head_dim``, with the fused dQ or without it, or the MXFP8 one (``mx``
    the P and dS rule; no fused dQ)."""
    if mx:
        return _MX_CONFIGS[head_dim]
    return _CONFIGS[(head_dim, fused_dq)]


def dq_box_columns(cfg: HopperDkDvConfig, head_dim: int) -> int:
    """Head-dim columns of one dQ reduce-add (the ``halves`` consumers reduce dQ by halves)."""
    return head_dim // 2 if cfg.dq == "halves" else head_dim


SCHEDULES = ("static", "dynamic")  # BackwardVariant.dense_schedule / masked_schedule / sparse_schedule
PREFETCHES = ("short", "always", "never")  # BackwardVariant.item_prefetch
# ``item_prefetch="short"``: launches whose work items average at most this many query steps (``item_steps``)
# take two K/V slot pairs, by whether Q is broadcast: a broadcast Q's items up to 8 steps (its query tiles,
# shared by every item, come from L2: +2.5% to +25% at 2 to 8 steps, +0.8% at 16), jagged items up to 3.5 (+4.7% at
# 2, +5.5% at 3, +7% at 2 causal; -2% at 4, -2% to -4% at 16). NOTES.md sessions 44-45, the items sweep.
PREFETCH_MAX_STEPS = {False: 3.5, True: 8}


@dataclass(frozen=True)
class BackwardVariant:
    """Switches of the backward's ablation study (``python -m jfa.bench.ablation backward``); the
    defaults ship; ``JFA_TLX_BWD_VARIANT="persistent=0"`` (``knobs.tlx_bwd_variant``) overrides them for
    measurements through the API. The other reported ablation of the backward, the deterministic dQ, is
    the ``deterministic`` argument of every call."""

    persistent: bool = True  # False: one CTA per work item, dealt by the hardware block scheduler
    # How a persistent grid deals the items (one of SCHEDULES). Dense builds without a mask: round-robin over
    # the longest-first list ("static"); a round's items cost about the same, so the CTAs stay in step and
    # those at work share their sequences' query tiles in L2 (from the counter: -4% to +3% on the gem
    # shapes, NOTES.md session 37). Dense causal or windowed builds: from the counter; an item's cost is the
    # query tiles at or after its keys (or inside its band), from one tile to the sequence's, so round-robin
    # CTAs end unevenly (the counter was 1.10-1.52x faster on causal shapes, 1.32x on a 1024-key window,
    # NOTES.md session 37). The MX builds have no counter (static). Block-sparse builds: from a global counter
    # ("dynamic"): an item's cost is its key block's listed query blocks, which vary item to item, so
    # round-robin CTAs drift apart until the items at work span ~3x the sequences (a model of the longtail
    # lists: ~67 MB of Q/dO/dQ against ~24 MB taken in order, L2 holds 50 MB) and the last rounds end
    # unevenly (NOTES.md, session 20).
    dense_schedule: str = "static"
    masked_schedule: str = "dynamic"
    sparse_schedule: str = "dynamic"
    # The producer's-dQ build (D 64) with K and V in two slot pairs: once this item's last query step is
    # issued, and before its dQ of the last DQ_LAG steps (which waits for the consumers' last dS^T and reads
    # this item's K), the producer starts the CTA's next item: its K and V into the other pair and its first
    # DQ_LAG steps' query tiles, so that the consumers' next item does not start with a wait for that dQ, the
    # next item's decode and its loads. 32 KB more shared memory (198 KB). Without the fused dQ the producer
    # issues the next item's loads right after its last ones anyway (and its counter's build spills at 24
    # registers with the prefetch); the halves have no shared memory left for a second pair. The boundary
    # between items shrinks ~1.3 us while each step slows ~0.035 us (NOTES.md session 43), so it pays on short
    # items only: "short" takes it where a dense launch's items average at most PREFETCH_MAX_STEPS query steps
    # (``item_steps``), "always" and "never" (one of PREFETCHES) regardless.
    item_prefetch: str = "short"

    def __post_init__(self):
        for name in ("dense_schedule", "masked_schedule", "sparse_schedule"):
            if getattr(self, name) not in SCHEDULES:
                raise ValueError(f"BackwardVariant.{name}: must be one of {SCHEDULES}, got {getattr(self, name)!r}")
        if self.item_prefetch not in PREFETCHES:
            raise ValueError(f"BackwardVariant.item_prefetch: must be one of {PREFETCHES}, got {self.item_prefetch!r}")

    def dynamic(self, sparse: bool, *, causal: bool = False, window: bool = False, mx: bool = False) -> bool:
        """Whether a build takes its items from the global counter: never an MX build (its kernel has no
        counter); a block-sparse one (``sparse``) by ``sparse_schedule``; a dense one with a causal mask or a
        window by ``masked_schedule``, without by ``dense_schedule``."""
        if mx:
            return False
        if sparse:
            return self.sparse_schedule == "dynamic"
        return (self.masked_schedule if causal or window else self.dense_schedule) == "dynamic"

    def kv_buffers(self, cfg: HopperDkDvConfig, mx: bool = False, steps: Optional[float] = None,
                   broadcast_q: bool = False) -> int:
        """Pairs of K/V slots of build ``cfg`` (``item_prefetch``) in a launch whose items average ``steps`` query
        steps (``item_steps``; None: not estimated, taken as long) of a broadcast Q or not (``broadcast_q``,
        PREFETCH_MAX_STEPS): two only in the producer's-dQ build (``dq="producer"``, never MX)."""
        if cfg.dq != "producer" or mx or self.item_prefetch == "never":
            return 1
        short = steps is not None and steps <= PREFETCH_MAX_STEPS[broadcast_q]
        return 2 if self.item_prefetch == "always" or short else 1

    @classmethod
    def parse(cls, switches) -> "BackwardVariant":
        """``"persistent=0"`` (or its mapping) -> BackwardVariant; unknown keys and bad values raise."""
        if isinstance(switches, str):
            switches = knobs.parse_switches(switches, knobs.KNOBS["tlx_bwd_variant"].env)
        return make_variant(cls, switches, knobs.KNOBS["tlx_bwd_variant"].env)


SHIPPED = BackwardVariant()


def item_steps(q_rows: int, num_seqs: int, *, broadcast_q: bool, len_q_bcast: int, group: int, causal: bool,
               block_m: int) -> float:
    """The query steps a dense work item (one key tile, its GROUP query heads) averages, from the call's
    structure alone (no device sync): ``group`` times a sequence's mean query rows (``q_rows`` over
    ``num_seqs``, a broadcast Q's ``len_q_bcast``) in ``block_m``-row tiles, halved under a causal mask (a key
    tile meets the query tiles at or after it)."""
    rows = len_q_bcast if broadcast_q else q_rows / max(num_seqs, 1)
    steps = group * rows / block_m
    return steps / 2 if causal else steps


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _hand_over_ds(ds_tile, ds_t, ds_full):
    """Store this consumer's dS^T (16-bit) for another warpgroup's dQ MMA and signal it on ``ds_full``."""
    tlx.local_store(ds_tile, ds_t)
    tlx.fence_async_shared()  # generic-proxy stores made visible to the readers' wgmma (async proxy)
    tlx.barrier_arrive(ds_full, 1)  # after a warpgroup barrier: all 128 threads have stored and fenced


@triton.jit
def _dq_halves(dk, ds_t, q_tile, k_tiles, ds_tiles, ds_tile, ds_buf, ds_phase, ds_full, ds_empty, dq_stage,
               sm_scale, cid: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``dq="halves"`` (FA3's split of the fused dQ): issue dK += dS^T Q, store this consumer's dS^T to
    its slot, and once both consumers have (``ds_full``: one arrival each), compute dQ^T for head-dim
    columns [cid * D/2, (cid + 1) * D/2) over both consumers' keys, K^T[half] dS^T: [D/2, BLOCK_M], 32
    registers at D 128, the same MMA shape as S^T. Both slots are handed back (``ds_empty``) once the dQ
    MMAs retire; the half is stored to this consumer's stage, and the next step sends it
    (``_send_halves_dq``). Returns dk, retired."""
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
    # the stage's last reduce-add (sent at this step's start, behind S^T and dP^T) must have read it
    tlx.async_descriptor_store_wait(0)
    stage_dq(dq_stage, dq, sm_scale, True)
    return dk


@triton.jit
def _send_halves_dq(dq_stage, desc_dq, staged_row, dq_col, cid: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Reduce-add the dQ half a previous step of the item stored to this consumer's stage (at query row
    ``staged_row``; < 0: none is staged), its warpgroup synchronised on named barrier ``HALVES_DQ_BARRIER + cid``."""
    if staged_row >= 0:
        send_staged_dq(dq_stage, desc_dq, staged_row, dq_col + cid * (HEAD_DIM // 2), HALVES_DQ_BARRIER + cid)


@triton.jit
def _dkdv_step(dk, dv, k_tile, v_tile, q_tile, do_tile, lse_tile, delta_tile, m_start, offs_n, len_q, len_k,
               causal_shift, lo, hi, qk_scale, sm_scale, k_tiles, ds_tiles, ds_buf, ds_phase, ds_fulls, ds_empties,
               dq_stage, desc_dq, dq_col, staged_row, cid: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               WINDOW: tl.constexpr, DQ: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
               HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr, qt_tile=None, dot_tile=None, MX: tl.constexpr = ""):
    """One query step of one consumer: S^T and dP^T on wgmma, P^T and dS^T in registers, then
    dV += P^T dO and dK += dS^T Q; with the producer's dQ also dS^T stored for the producer (slot
    ``ds_buf``, signalled on its full barrier), with the halves one head-dim half of dQ over both
    consumers' keys (``_dq_halves``; the previous step's half, ``staged_row``, is sent once S^T and dP^T
    are issued). Returns (dk, dv) with every MMA retired.

    MX (the P and dS rule of an MXFP8 build; no fused dQ): K, V, Q, dO are the D-axis dequantized tiles,
    ``qt_tile``/``dot_tile`` Q and dO dequantized along queries; P^T and dS^T are MX-quantized along their
    columns (the step's queries, whole 32-row blocks of the sequence) before dV += P^T dO and dK += dS^T Q
    (docs/mxfp8.md section 2, the portable ``mx_dkdv_kernel``'s step)."""
    s_t = tlx.async_dot(k_tile, tlx.local_trans(q_tile))     # [BLOCK_N, BLOCK_M]
    dp_t = tlx.async_dot(v_tile, tlx.local_trans(do_tile))   # [BLOCK_N, BLOCK_M]
    if DQ == DQ_HALVES:
        _send_halves_dq(dq_stage, desc_dq, staged_row, dq_col, cid, HEAD_DIM)
    lse2 = tlx.local_load(lse_tile)                          # [1, BLOCK_M]: lse * log2(e), +inf for empty rows
    s_t = tlx.async_dot_wait(1, s_t)
    p_t = tl.math.exp2(s_t * qk_scale - lse2)
    if MASKED:
        # the TMA boxes may reach into the next sequence's rows: their P^T (and so dS^T) must be 0
        offs_m = m_start + tl.arange(0, BLOCK_M)
        # The band is spelled two ways, each the one whose D 128 fused-dQ builds fit the consumers' registers
        # without a spill (the other spills 8 B: compile gate, offline). Causal: a key past the sequence is
        # past every real row's diagonal (hi <= Lk - Lq), so the band alone excludes it.
        if WINDOW and CAUSAL:
            offset = offs_n[:, None] - offs_m[None, :]
            visible = (offs_m < len_q)[None, :] & (offset >= lo) & (offset <= hi)
        elif WINDOW:
            # each key's first and last query row in the band, the sequence's end folded into the last; dQ
            # sums over the keys: the next sequence's must add nothing (an empty range, last row -1)
            first_row = offs_n - hi
            last_row = tl.minimum(offs_n - lo, len_q - 1)
            if DQ != DQ_NONE:
                last_row = tl.where(offs_n < len_k, last_row, -1)
            visible = (offs_m[None, :] >= first_row[:, None]) & (offs_m[None, :] <= last_row[:, None])
        else:
            visible = (offs_m < len_q)[None, :]
            if CAUSAL:  # also excludes key rows past the sequence
                visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
            elif DQ != DQ_NONE:  # dQ sums over the keys: the next sequence's must add nothing
                visible = visible & (offs_n < len_k)[:, None]
        p_t = tl.where(visible, p_t, 0.0)
    delta = tlx.local_load(delta_tile)                       # [1, BLOCK_M]
    dp_t = tlx.async_dot_wait(0, dp_t)
    if MX != "":
        dv = tlx.async_dot(_mx_round(p_t, MX == "rceil", BLOCK_N, BLOCK_M).to(DTYPE), dot_tile, dv)
    else:
        dv = tlx.async_dot(to_16bit_pairs(p_t, DTYPE), do_tile, dv)
    ds_t = p_t * (dp_t - delta)
    if DQ != DQ_NONE and MASKED:
        # dQ sums over this tile's keys and lands in other rows' dQ: query rows past the sequence must
        # add exactly 0, and so must key rows past it (the next sequence's keys, loaded by the tile's TMA
        # box; a consumer that has such keys runs every step masked). P^T is 0 there already, but dP^T of a
        # foreign row need not be finite: select, do not multiply (on P^T, not the mask: registers).
        ds_t = tl.where(p_t == 0.0, 0.0, ds_t)
    if DQ == DQ_HALVES:
        dk = _dq_halves(dk, to_16bit_pairs(ds_t, DTYPE), q_tile, k_tiles, ds_tiles, ds_tiles[ds_buf * _CONSUMERS + cid],
                        ds_buf, ds_phase, ds_fulls[ds_buf], ds_empties[ds_buf], dq_stage, sm_scale, cid, BLOCK_N,
                        HEAD_DIM)
        dv = tlx.async_dot_wait(0, dv)
    elif DQ == DQ_PRODUCER:
        ds16 = to_16bit_pairs(ds_t, DTYPE)
        dk = tlx.async_dot(ds16, q_tile, dk)
        _hand_over_ds(ds_tiles[ds_buf * _CONSUMERS + cid], ds16, ds_fulls[ds_buf])
        dv = tlx.async_dot_wait(1, dv)
        dk = tlx.async_dot_wait(0, dk)
    elif MX != "":
        dk = tlx.async_dot(_mx_round(ds_t, MX == "rceil", BLOCK_N, BLOCK_M).to(DTYPE), qt_tile, dk)
        dv = tlx.async_dot_wait(1, dv)
        dk = tlx.async_dot_wait(0, dk)
    else:
        dk = tlx.async_dot(to_16bit_pairs(ds_t, DTYPE), q_tile, dk)
        dv = tlx.async_dot_wait(1, dv)
        dk = tlx.async_dot_wait(0, dk)
    return dk, dv


@triton.jit
def _dkdv_ring_step(dk, dv, qdo_cnt, k_tiles, k_tile, v_tile, qdo_ring, ds_ring, dq_stage, desc_dq, dq_row0, dq_col,
                    m_start, offs_n, len_q, len_k, causal_shift, lo, hi, qk_scale, sm_scale, staged_row,
                    cid: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                    DQ: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                    NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr, DTYPE: tl.constexpr, qt_tiles=None,
                    dot_tiles=None, MX: tl.constexpr = ""):
    """Wait for the next (Q, dO, stats) ring slot, run one step on it, hand the slot back. With a fused
    dQ the step's dS^T slot of ``ds_tiles`` follows the step count (the producer's count equals the
    consumers'). ``staged_row``: with the halves, the query row of the dQ half staged and not yet sent
    (< 0: none); returns the one this step leaves staged. ``k_tile``, ``v_tile``: the consumer's own K and V tiles
    (``k_tiles``: every K tile, which the halves' dQ reads); ``qdo_ring``, ``ds_ring``: the kernel's (Q, dO, stats)
    ring and dS^T slots (``jagged_dkdv_tlx_kernel``)."""
    q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties = qdo_ring
    ds_tiles, ds_fulls, ds_empties = None, None, None
    if DQ != DQ_NONE:
        ds_tiles, ds_fulls, ds_empties, _stages = ds_ring
    buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    ds_buf, ds_phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_DS)
    if DQ != DQ_NONE:
        # the dQ MMAs (the producer's, or with the halves both consumers') have read this slot's last
        # dS^T (waited here, where no tile is live: registers)
        tlx.barrier_wait(ds_empties[ds_buf], ds_phase ^ 1)
    tlx.barrier_wait(qdo_fulls[buf], phase)
    if MX != "":  # the slot's tiles along queries (dK's and dV's B operands)
        qt_tile = qt_tiles[buf]
        dot_tile = dot_tiles[buf]
    else:
        qt_tile = None
        dot_tile = None
    dk, dv = _dkdv_step(dk, dv, k_tile, v_tile, q_tiles[buf], do_tiles[buf], lse_tiles[buf],
                        delta_tiles[buf], m_start, offs_n, len_q, len_k, causal_shift, lo, hi, qk_scale, sm_scale,
                        k_tiles, ds_tiles, ds_buf, ds_phase, ds_fulls, ds_empties, dq_stage, desc_dq, dq_col,
                        staged_row, cid, MASKED, CAUSAL, WINDOW, DQ, BLOCK_N, BLOCK_M, HEAD_DIM, DTYPE, qt_tile,
                        dot_tile, MX)
    if DQ == DQ_HALVES:
        staged_row = dq_row0 + m_start
    tlx.barrier_arrive(qdo_empties[buf], 1)
    return dk, dv, qdo_cnt + 1, staged_row


@triton.jit
def _keyless_ring_step(qdo_cnt, qdo_ring, ds_ring, cid: tl.constexpr, DQ: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                       DTYPE: tl.constexpr):
    """A step of a consumer with no key rows in the item: no MMA, only the ring's protocol. It waits for
    the slot to fill before handing it back, so that its arrival counts for this fill and not a later
    one (the empty barrier takes both consumers' arrivals). With the producer's dQ its dS^T slot gets
    zeros: the producer's dQ MMA runs over both consumers' slots, and the K rows it pairs them with (the
    next sequence's, or TMA's zero fill) are finite."""
    _q, _do, _lse, _delta, qdo_fulls, qdo_empties = qdo_ring
    buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    if DQ == DQ_PRODUCER:
        ds_tiles, ds_fulls, ds_empties, _stages = ds_ring
        ds_buf, ds_phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_DS)
        tlx.barrier_wait(ds_empties[ds_buf], ds_phase ^ 1)
        _hand_over_ds(ds_tiles[ds_buf * _CONSUMERS + cid], tl.zeros([BLOCK_N, BLOCK_M], dtype=DTYPE),
                      ds_fulls[ds_buf])
    tlx.barrier_wait(qdo_fulls[buf], phase)
    tlx.barrier_arrive(qdo_empties[buf], 1)
    return qdo_cnt + 1


@triton.jit
def _consume_head_steps(dk, dv, qdo_cnt, head, q_row0, len_q, len_k, n_start, causal_shift, first, n_lead, bulk_end,
                        num_q_tiles, lo, hi, k_tiles, k_tile, v_tile, qdo_ring, ds_ring, desc_dq, Q_IDX, sm_scale,
                        qk_scale, cid: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                        SPARSE: tl.constexpr, DQ: tl.constexpr, TILE_N: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                        DTYPE: tl.constexpr, qt_tiles=None, dot_tiles=None, MX: tl.constexpr = ""):
    """Consumer ``cid``, the steps of one query head of an item (``dkdv_item``'s numbers for it): its BLOCK_N
    key rows against every query step, accumulated into ``dk`` and ``dv``; with the halves, the head's last dQ
    half sent before it returns. ``k_tile``, ``v_tile``: its own K and V tiles. Returns (dk, dv, qdo_cnt)."""
    SUB: tl.constexpr = TILE_N // BLOCK_M
    n_masked = n_lead + num_q_tiles - bulk_end  # the producer's step order (step_order)
    n_masked_steps = n_masked
    bulk_start = first + n_lead
    partial = False
    if DQ != DQ_NONE and not CAUSAL:
        # key rows of this consumer reaching past the sequence (the TMA box holds the next sequence's first
        # keys) run every step masked, so that the bulk step carries no key mask (registers: D 128 spills
        # with it); the other consumer's rows may reach past while these do not
        partial = n_start + (cid + 1) * BLOCK_N > len_k
        n_masked_steps = tl.where(partial, num_q_tiles - first, n_masked)
        bulk_start = tl.where(partial, bulk_end, bulk_start)
    n_keyless_steps = 0
    if cid > 0 and DQ != DQ_HALVES:
        # this consumer's key rows all lie past the sequence: its steps run no MMA (the loops below then
        # run no step, and the epilogue stores no row). Loop counts rather than a branch around the
        # loops: with the branch, the consumers of the producer's-dQ build (216 registers) keep a stack.
        keyless = n_start + cid * BLOCK_N >= len_k
        n_keyless_steps = tl.where(keyless, num_q_tiles - first, 0)
        n_masked_steps = tl.where(keyless, 0, n_masked_steps)
        bulk_start = tl.where(keyless, bulk_end, bulk_start)
    offs_n = n_start + cid * BLOCK_N + tl.arange(0, BLOCK_N)
    dq_row0, dq_col = q_row0, head * HEAD_DIM  # where the head's dQ goes in the (contiguous, q-shaped) accumulator
    dq_stage = ds_ring[3][cid] if DQ == DQ_HALVES else None  # the halves: one dQ stage per consumer
    for j in tl.range(0, n_keyless_steps):
        qdo_cnt = _keyless_ring_step(qdo_cnt, qdo_ring, ds_ring, cid, DQ, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO,
                                     NUM_BUFFERS_DS, DTYPE)
    staged_row = -1  # the halves: no dQ half staged yet for this head
    for j in tl.range(0, n_masked_steps):  # the producer's order (step_order): masked steps, then the bulk
        m_start = step_tile(j, first, n_lead, n_masked, bulk_end, Q_IDX, SPARSE, SUB) * BLOCK_M
        if SPARSE:  # listed blocks come in block order: each step decides which of the two steps it runs
            if sparse_step_masked(m_start, n_start, len_q, causal_shift, partial, CAUSAL, TILE_N, BLOCK_M):
                dk, dv, qdo_cnt, staged_row = _dkdv_ring_step(
                    dk, dv, qdo_cnt, k_tiles, k_tile, v_tile, qdo_ring, ds_ring, dq_stage, desc_dq, dq_row0, dq_col,
                    m_start, offs_n, len_q, len_k, causal_shift, lo, hi, qk_scale, sm_scale, staged_row, cid, True,
                    CAUSAL, WINDOW, DQ, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE, qt_tiles,
                    dot_tiles, MX)
            else:
                dk, dv, qdo_cnt, staged_row = _dkdv_ring_step(
                    dk, dv, qdo_cnt, k_tiles, k_tile, v_tile, qdo_ring, ds_ring, dq_stage, desc_dq, dq_row0, dq_col,
                    m_start, offs_n, len_q, len_k, causal_shift, lo, hi, qk_scale, sm_scale, staged_row, cid, False,
                    CAUSAL, WINDOW, DQ, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE, qt_tiles,
                    dot_tiles, MX)
        else:
            dk, dv, qdo_cnt, staged_row = _dkdv_ring_step(
                dk, dv, qdo_cnt, k_tiles, k_tile, v_tile, qdo_ring, ds_ring, dq_stage, desc_dq, dq_row0, dq_col,
                m_start, offs_n, len_q, len_k, causal_shift, lo, hi, qk_scale, sm_scale, staged_row, cid, True, CAUSAL,
                WINDOW, DQ, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE, qt_tiles, dot_tiles, MX)
    if not SPARSE:  # (the sparse build's steps all ran above: no third inlined step)
        for i in tl.range(bulk_start, bulk_end):
            dk, dv, qdo_cnt, staged_row = _dkdv_ring_step(
                dk, dv, qdo_cnt, k_tiles, k_tile, v_tile, qdo_ring, ds_ring, dq_stage, desc_dq, dq_row0, dq_col,
                i * BLOCK_M, offs_n, len_q, len_k, causal_shift, lo, hi, qk_scale, sm_scale, staged_row, cid, False,
                CAUSAL, WINDOW, DQ, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE, qt_tiles,
                dot_tiles, MX)
    if DQ == DQ_HALVES:
        _send_halves_dq(dq_stage, desc_dq, staged_row, dq_col, cid, HEAD_DIM)  # the head's last staged half
    return dk, dv, qdo_cnt


@triton.jit
def _store_dkdv(dk, dv, DK, DV, k_row0, n0, len_k, kv_head, stride_dkt, stride_dkh, stride_dvt, stride_dvh, sm_scale,
                BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """dK (scaled) and dV of key rows [n0, n0 + BLOCK_N) of the sequence from registers; rows at or past
    ``len_k`` belong to the next sequence and are never written."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    row_ok = offs_n < len_k
    offs_d = tl.arange(0, HEAD_DIM)
    rows = k_row0.to(tl.int64) + offs_n.to(tl.int64)
    tl.store(DK + rows[:, None] * stride_dkt + kv_head * stride_dkh + offs_d[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=row_ok[:, None])
    tl.store(DV + rows[:, None] * stride_dvt + kv_head * stride_dvh + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _consume_dkdv_item(item, kv_cnt, qdo_cnt, kv, qdo_ring, ds_ring, desc_dq, DK, DV, TILES, CU_Q, CU_K, COL_OFF, Q_IDX,
                       stride_dkt, stride_dkh, stride_dvt, stride_dvh, num_slots, num_heads, num_seqs, len_q_bcast,
                       sm_scale, qk_scale, band_lo, band_hi, cid: tl.constexpr, HEAD_DIM: tl.constexpr,
                       CAUSAL: tl.constexpr, WINDOW: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr,
                       SPARSE: tl.constexpr, DQ: tl.constexpr, TILE_N: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                       DTYPE: tl.constexpr, qt_tiles=None, dot_tiles=None, MX: tl.constexpr = "", TIMELINE=None, pid=0,
                       PROFILE: tl.constexpr = False, NUM_BUFFERS_KV: tl.constexpr = 1):
    """Consumer ``cid``, the CTA's ``kv_cnt``-th work item (its K and V in slot pair kv_cnt % NUM_BUFFERS_KV): its
    BLOCK_N key rows of the item's key/value head against every query step of each of the group's GROUP query heads
    in turn (``_consume_head_steps``), then one store of dK (scaled) and dV. PROFILE: consumer 0 records the item's
    phases (``PROFILE_FIELDS``)."""
    k_tiles, v_tiles, kv_fulls, kv_empties = kv
    if PROFILE:
        if cid == 0:
            stamp(TIMELINE, item, REC_START_NS, globaltimer())
            stamp(TIMELINE, item, REC_START, clock64())
            stamp(TIMELINE, item, REC_FIRST_STEP, qdo_cnt)
    head, q_row0, _or, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, bulk_end, num_q_tiles, lo, hi = \
        dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
                  CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, 0, GROUP)
    if PROFILE:
        if cid == 0:
            stamp(TIMELINE, item, REC_DECODED, clock64())
    kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
    own = kv_buf * _CONSUMERS + cid  # this consumer's K and V tiles and their barriers
    if DQ == DQ_HALVES:  # its dQ reads both consumers' K
        for c in tl.static_range(_CONSUMERS):
            tlx.barrier_wait(kv_fulls[c], kv_phase)
    else:
        tlx.barrier_wait(kv_fulls[own], kv_phase)
    if PROFILE:
        if cid == 0:
            stamp(TIMELINE, item, REC_KV_READY, clock64())
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    # grouped-query attention: the group's query heads in turn, dK and dV summed in the accumulators
    for g in tl.range(0, GROUP):
        if GROUP > 1:  # (one head: the item's numbers above are its own)
            head, q_row0, _or, len_q, _kr, _lk, _ns, causal_shift, first, n_lead, bulk_end, num_q_tiles, lo, hi = \
                dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo,
                          band_hi, CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, g, GROUP)
        dk, dv, qdo_cnt = _consume_head_steps(
            dk, dv, qdo_cnt, head, q_row0, len_q, len_k, n_start, causal_shift, first, n_lead, bulk_end, num_q_tiles,
            lo, hi, k_tiles, k_tiles[own], v_tiles[own], qdo_ring, ds_ring, desc_dq, Q_IDX, sm_scale, qk_scale, cid,
            HEAD_DIM, CAUSAL, WINDOW, SPARSE, DQ, TILE_N, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE,
            qt_tiles, dot_tiles, MX)
    if PROFILE:
        if cid == 0:
            stamp(TIMELINE, item, REC_STEPS_DONE, clock64())
    # every MMA of this consumer reading the item's K and V (with the halves: both consumers' K) has retired
    if DQ == DQ_HALVES:
        for c in tl.static_range(_CONSUMERS):
            tlx.barrier_arrive(kv_empties[c], 1)
    else:
        tlx.barrier_arrive(kv_empties[own], 1)

    # epilogue: key rows past the sequence belong to the next one and are never written
    kv_head = head // GROUP
    if DQ == DQ_HALVES:
        # the item's numbers read again rather than carried through the loops (registers: at 240 with
        # 64-row steps the values kept for the epilogue are spilled to the stack)
        kv_head, _t, _qr, _or, _lq, k_row0, len_k = item_sequence(TILES, CU_Q, CU_K, item, num_slots,
                                                                  num_heads // GROUP, num_seqs, len_q_bcast,
                                                                  BROADCAST_Q, SPARSE)
        n_start = _t * TILE_N
    _store_dkdv(dk, dv, DK, DV, k_row0, n_start + cid * BLOCK_N, len_k, kv_head, stride_dkt, stride_dkh, stride_dvt,
                stride_dvh, sm_scale, BLOCK_N, HEAD_DIM)
    if PROFILE:
        if cid == 0:
            stamp(TIMELINE, item, REC_END, clock64())
            stamp(TIMELINE, item, REC_SM, smid())
            stamp(TIMELINE, item, REC_CTA, pid)
            stamp(TIMELINE, item, REC_STEPS, qdo_cnt)  # the CTA's steps after the item (the launcher subtracts)
    return qdo_cnt


@triton.jit(do_not_specialize=["num_items", "num_progs", "num_rounds", "num_slots", "num_seqs", "num_heads",
                               "len_q_bcast", "band_lo", "band_hi"])
def jagged_dkdv_tlx_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, DK, DV, CU_Q, CU_K, STATS_CU, TILES, COL_OFF, Q_IDX, COUNTER,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, col_stride_q, col_stride_k, col_stride_v, col_stride_do, num_items,
    num_progs, num_rounds, num_slots, num_seqs, num_heads, len_q_bcast, sm_scale, band_lo, band_hi, QS, QT, QTS, QB_OFF,
    KS, VS, DOS, DOT_, DOTS, OB_OFF, TIMELINE, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr, DQ: tl.constexpr, DYNAMIC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, CONSUMER_REGS: tl.constexpr,
    MX: tl.constexpr = "", PROFILE: tl.constexpr = False, NUM_BUFFERS_KV: tl.constexpr = 1,
):
    """MX ("" or the rule of an MXFP8 build: dense, static schedule, no fused dQ): "" reads q, k, v, dO
    (bf16/fp16) by TMA; an MXFP8 build takes D-axis E4M3 bytes in desc_q, desc_k, desc_v, desc_do's places
    (uint8 pointers) with their scales QS, KS, VS, DOS, and Q and dO along the sequences' query blocks (QT/QTS,
    DOT_/DOTS, first scale rows QB_OFF, OB_OFF; ``mx_producers.produce_dkdv_item_mx``); the MX arguments are None
    in the other builds. PROFILE: the profiling build, one record per item in TIMELINE (int64 rows of
    ``PROFILE_FIELDS``; constexpr None elsewhere). NUM_BUFFERS_KV: pairs of K/V slots; with two the producer
    starts the next item's loads while this one runs (``BackwardVariant.item_prefetch``)."""
    tl.static_assert(MX == "" or (DQ == DQ_NONE and not DYNAMIC and not SPARSE and not WINDOW),
                     "the MXFP8 build is dense, statically scheduled, without a window or the fused dQ")
    tl.static_assert(not PROFILE or MX == "", "the profiling build is the bf16/fp16 one (its producer stamps)")
    tl.static_assert(NUM_BUFFERS_KV == 1 or (MX == "" and DQ == DQ_PRODUCER),
                     "two K/V slot pairs: the producer's-dQ build")
    TILE_N: tl.constexpr = _CONSUMERS * BLOCK_N
    DTYPE: tl.constexpr = tl.bfloat16 if MX != "" else tlx.dtype_of(desc_q)
    KV_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(DTYPE)
    QDO_BYTES: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(DTYPE)
    # The K/V tiles' use count is the round counter (below): under a static schedule every round but the
    # last deals an item to every CTA; under the dynamic one (DYNAMIC) a round is the CTA's next item. The
    # grid's size and the number of rounds come as arguments, not from %nctaid and a division: a kernel
    # parameter is re-read from the constant bank where needed, while ptxas keeps computed values on the stack
    # once the consumers have a loop more.
    pid = tl.program_id(0)

    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, _CONSUMERS * NUM_BUFFERS_KV)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, _CONSUMERS * NUM_BUFFERS_KV)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    lse_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_BUFFERS_QDO)
    delta_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, NUM_BUFFERS_QDO)
    if MX != "":  # Q and dO dequantized along queries: dK's and dV's B operands
        qt_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
        dot_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    else:
        qt_tiles = None
        dot_tiles = None
    # The producer's dQ: it computes a step's dQ DQ_LAG steps after issuing its loads, so that its wait for
    # the consumers' dS^T delays the next load by no more than the ring allows: one less than the ring's
    # depth (a load waits for the slot's consumers DQ_LAG + 1 steps back anyway). Also the number of dS^T
    # slots: the consumers may run DQ_LAG steps ahead of the producer's dQ. Its two fp32 stages take turns
    # (one read by its TMA reduce-add while the next step fills the other).
    # The halves: two slots of both consumers' dS^T (a consumer stores step s + 1's while the other may
    # still run step s's dQ MMAs over both), one fp32 half-stage per consumer.
    DQ_LAG: tl.constexpr = NUM_BUFFERS_QDO - 1
    NUM_BUFFERS_DS: tl.constexpr = DQ_LAG if DQ == DQ_PRODUCER else 2
    kv_fulls = tlx.alloc_barriers(num_barriers=_CONSUMERS * NUM_BUFFERS_KV, arrive_count=1)
    # the halves: a K half is read by both consumers' dQ, so both give it back
    kv_empties = tlx.alloc_barriers(num_barriers=_CONSUMERS * NUM_BUFFERS_KV,
                                    arrive_count=_CONSUMERS if DQ == DQ_HALVES else 1)
    qdo_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=1)
    qdo_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=_CONSUMERS)
    if DQ == DQ_NONE:
        ds_ring = None
    else:
        ds_tiles = tlx.local_alloc((BLOCK_N, BLOCK_M), DTYPE, _CONSUMERS * NUM_BUFFERS_DS)
        if DQ == DQ_PRODUCER:
            dq_stages = tlx.local_alloc((BLOCK_M, HEAD_DIM), tl.float32, 2)
        else:
            dq_stages = tlx.local_alloc((BLOCK_M, HEAD_DIM // 2), tl.float32, _CONSUMERS)
        # a slot is full once both consumers stored; empty once its readers (the producer, or with the
        # halves both consumers) retired
        ds_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DS, arrive_count=_CONSUMERS)
        ds_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_DS,
                                        arrive_count=_CONSUMERS if DQ == DQ_HALVES else 1)
        ds_ring = (ds_tiles, ds_fulls, ds_empties, dq_stages)
    if DYNAMIC:  # the producer fetches items from the global counter and passes them on through a ring
        item_bufs = tlx.local_alloc((1,), tl.int32, ITEM_BUFFERS)
        item_fulls = tlx.alloc_barriers(num_barriers=ITEM_BUFFERS, arrive_count=1)
        item_empties = tlx.alloc_barriers(num_barriers=ITEM_BUFFERS, arrive_count=_CONSUMERS)

    # the shared-memory rings as the partitions' helpers take them (with ``ds_ring`` above: the fused dQ's dS^T
    # slots and dQ stages, None without it): the K/V slot pairs and the (Q, dO, stats) ring
    kv = (k_tiles, v_tiles, kv_fulls, kv_empties)
    qdo_ring = (q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties)
    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA loads
            qdo_cnt = 0
            if DYNAMIC:
                rounds = 0
                item = fetch_item(COUNTER, item_bufs, item_fulls, item_empties, rounds)
                while item < num_items:
                    # (with two K/V slot pairs the call fetched the next item itself, before its last dQ steps)
                    qdo_cnt, next_item = produce_dkdv_item(
                        item, rounds, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, kv, qdo_ring,
                        ds_ring, TILES, CU_Q, CU_K, STATS_CU, COL_OFF, Q_IDX,
                        num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v,
                        col_stride_do, sm_scale, band_lo, band_hi, CAUSAL, WINDOW, GROUP, BROADCAST_Q, SPARSE,
                        DQ == DQ_PRODUCER, TILE_N, BLOCK_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS,
                        KV_BYTES, QDO_BYTES, _CONSUMERS, TIMELINE, PROFILE, NUM_BUFFERS_KV, num_items, COUNTER,
                        item_bufs, item_fulls, item_empties, pid, num_progs, True)
                    rounds += 1
                    if NUM_BUFFERS_KV == 1:
                        item = fetch_item(COUNTER, item_bufs, item_fulls, item_empties, rounds)
                    else:
                        item = next_item
                retire_counter(COUNTER, num_progs)
            else:
                for rounds in range(0, num_rounds):
                    item = static_item(rounds, pid, num_progs, False)
                    if item < num_items:
                        # the K/V tiles' use count is `rounds`: every round but the last has an item
                        # for every CTA (so no register carries it: the D 128 producer has 72)
                        if MX != "":
                            qdo_cnt = produce_dkdv_item_mx(
                                item, rounds, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, QS, QT, QTS,
                                QB_OFF, KS, VS, DOS, DOT_, DOTS, OB_OFF, k_tiles, v_tiles, q_tiles, qt_tiles, do_tiles,
                                dot_tiles, lse_tiles, delta_tiles, kv_fulls, kv_empties, qdo_fulls, qdo_empties, TILES,
                                CU_Q, CU_K, STATS_CU, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
                                CAUSAL, _CONSUMERS, GROUP, BROADCAST_Q, TILE_N, BLOCK_N, BLOCK_M, HEAD_DIM,
                                NUM_BUFFERS_QDO)
                        else:
                            qdo_cnt, _next = produce_dkdv_item(
                                item, rounds, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, kv,
                                qdo_ring, ds_ring, TILES, CU_Q, CU_K, STATS_CU,
                                COL_OFF, Q_IDX, num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k,
                                col_stride_v, col_stride_do, sm_scale, band_lo, band_hi, CAUSAL, WINDOW, GROUP,
                                BROADCAST_Q, SPARSE, DQ == DQ_PRODUCER, TILE_N, BLOCK_N, BLOCK_M, HEAD_DIM,
                                NUM_BUFFERS_QDO, NUM_BUFFERS_DS, KV_BYTES, QDO_BYTES, _CONSUMERS, TIMELINE, PROFILE,
                                NUM_BUFFERS_KV, num_items, pid=pid, num_progs=num_progs)
            if DQ == DQ_PRODUCER:
                tlx.async_descriptor_store_wait(0)  # shared memory must outlive the last reduce-add's read
        with tlx.async_task(num_warps=_CONSUMER_WARPS, registers=CONSUMER_REGS, replicate=_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            qk_scale = sm_scale * 1.4426950408889634
            qdo_cnt = 0
            if DYNAMIC:
                rounds = 0
                item = receive_item(item_bufs, item_fulls, item_empties, rounds)
                while item < num_items:
                    qdo_cnt = _consume_dkdv_item(
                        item, rounds, qdo_cnt, kv, qdo_ring, ds_ring, desc_dq, DK, DV, TILES, CU_Q, CU_K, COL_OFF,
                        Q_IDX, stride_dkt, stride_dkh, stride_dvt, stride_dvh, num_slots, num_heads, num_seqs,
                        len_q_bcast, sm_scale, qk_scale, band_lo, band_hi, cid, HEAD_DIM, CAUSAL, WINDOW, GROUP,
                        BROADCAST_Q, SPARSE, DQ, TILE_N, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE,
                        qt_tiles, dot_tiles, MX, TIMELINE, pid, PROFILE, NUM_BUFFERS_KV)
                    rounds += 1
                    item = receive_item(item_bufs, item_fulls, item_empties, rounds)
            else:
                for rounds in range(0, num_rounds):
                    item = static_item(rounds, pid, num_progs, False)
                    if item < num_items:
                        qdo_cnt = _consume_dkdv_item(
                            item, rounds, qdo_cnt, kv, qdo_ring, ds_ring, desc_dq, DK, DV, TILES, CU_Q, CU_K, COL_OFF,
                            Q_IDX, stride_dkt, stride_dkh, stride_dvt, stride_dvh, num_slots, num_heads, num_seqs,
                            len_q_bcast, sm_scale, qk_scale, band_lo, band_hi, cid, HEAD_DIM, CAUSAL, WINDOW, GROUP,
                            BROADCAST_Q, SPARSE, DQ, TILE_N, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, DTYPE,
                            qt_tiles, dot_tiles, MX, TIMELINE, pid, PROFILE, NUM_BUFFERS_KV)
            if DQ == DQ_HALVES:
                tlx.async_descriptor_store_wait(0)  # shared memory must outlive the last reduce-add's read


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------
def supports(q: torch.Tensor, dout: Optional[torch.Tensor] = None, *, k: Optional[torch.Tensor] = None,
             v: Optional[torch.Tensor] = None) -> tuple[bool, str]:
    """Whether the dK/dV kernel can take these tensors (dtype, head dim, device, TMA layout), and why not."""
    return check_inputs({"q": q, "k": k, "v": v, "grad of out": dout}, dtype=q.dtype, head_dim=q.shape[-1],
                        head_dims=SUPPORTED_HEAD_DIMS)


def _constexprs(cfg: HopperDkDvConfig, head_dim: int, *, causal: bool, broadcast_q: bool, window: bool = False,
                group: int = 1, sparse: bool = False, dynamic: bool = False, mx: str = "",
                profile: bool = False, kv_buffers: int = 1) -> dict:
    """The compile-time arguments of one launch; without a window the band offsets are constexpr None
    (the build takes no band parameters), and so are the MX operands (``MX_ARGS``) outside an MXFP8 build and
    the timeline outside the profiling build (the launcher passes it by name)."""
    constants = dict(HEAD_DIM=head_dim, CAUSAL=causal, WINDOW=window, GROUP=group, BROADCAST_Q=broadcast_q,
                     SPARSE=sparse, DQ=DQ_MODES.index(cfg.dq), DYNAMIC=dynamic, BLOCK_N=cfg.block_n,
                     BLOCK_M=cfg.block_m, NUM_BUFFERS_QDO=cfg.num_buffers_qdo, CONSUMER_REGS=cfg.consumer_regs, MX=mx,
                     PROFILE=profile, NUM_BUFFERS_KV=kv_buffers)
    if not profile:
        constants.update(TIMELINE=None)
    if not window:
        constants.update(band_lo=None, band_hi=None)
    if not mx:
        constants.update({name: None for name in MX_ARGS})
    return constants


def _launch_options() -> dict:
    return dict(num_warps=PRODUCER_WARPS, num_stages=1)  # explicit pipelining only


def compile_spec(dtype: str, head_dim: int, *, causal: bool, broadcast_q: bool, fused_dq: bool,
                 window: bool = False, group: int = 1, sparse: bool = False, variant: BackwardVariant = None,
                 mx: str = "", profile: bool = False):
    """``(kernel, signature, constants, attrs, options)`` for an offline ``triton.compile`` (``group``: query
    heads per key/value head) of the build ``variant`` (default: what ships) launches. ``mx``: the MXFP8 build
    with this rule (E4M3 inputs; ``dtype`` is the gradients'); ``profile``: the profiling build."""
    cfg = config_for(head_dim, fused_dq, mx)
    variant = variant or SHIPPED
    dynamic = variant.dynamic(sparse, causal=causal, window=window, mx=bool(mx))
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, window=window, group=group,
                            sparse=sparse, dynamic=dynamic, mx=mx, profile=profile,
                            kv_buffers=variant.kv_buffers(cfg, bool(mx)))
    grad = dtype
    types = {f"desc_{x}": "*u8" if mx else f"tensordesc<{dtype}[{rows}, {head_dim}]>"
             for x, rows in (("q", cfg.block_m), ("do", cfg.block_m), ("k", cfg.block_n), ("v", cfg.block_n))}
    # without the fused dQ the launcher passes desc_q in desc_dq's place (never read); the MX launcher the
    # statistics' descriptor
    dq_box = (cfg.block_m, dq_box_columns(cfg, head_dim) if fused_dq else head_dim)
    types.update(
        desc_stats=f"tensordesc<fp32[1, {cfg.block_m}]>",
        desc_dq=(f"tensordesc<fp32[1, {cfg.block_m}]>" if mx else
                 f"tensordesc<{'fp32' if fused_dq else dtype}[{dq_box[0]}, {dq_box[1]}]>"),
        DK=f"*{grad}", DV=f"*{grad}", CU_Q="*i32", CU_K="*i32", TILES="*i32", STATS_CU="*i64", COL_OFF="*i32",
        Q_IDX="*i32", COUNTER="*i32", TIMELINE="*i64", sm_scale="fp32", QB_OFF="*i32",
        OB_OFF="*i64" if broadcast_q else "*i32",  # (a broadcast Q's output offsets are int64)
        **{name: "*u8" for name in ("QS", "QT", "QTS", "KS", "VS", "DOS", "DOT_", "DOTS")})
    signature, attrs = offline_signature(jagged_dkdv_tlx_kernel, constants, types)
    return jagged_dkdv_tlx_kernel, signature, constants, attrs, _launch_options()


class DqAccumulator:
    """The zeroed fp32 accumulator the fused dQ reduce-adds into (shaped like q, [T, H, D]), and its
    read-out as dq. With ``zeroed=False`` it is allocated uninitialised and ``jagged_dkdv_tlx`` zeroes it
    before its kernel: in the row statistics' pass where that pass covers its rows (not broadcast Q),
    which saves a memset of 4 bytes per element. A query step's reduce-add is one TMA box of BLOCK_M
    rows and the head's D columns, or half of them for the ``halves`` build (``dq_box_columns``)."""

    def __init__(self, q: torch.Tensor, zeroed: bool = True):
        self.q = q
        self.config = config_for(q.shape[2], fused_dq=True)
        self.zeroed = zeroed
        self.tensor = (torch.zeros if zeroed else torch.empty)(q.shape, dtype=torch.float32, device=q.device)

    def descriptor(self):
        """A TMA descriptor over [T, H * D] whose box is one reduce-add; head h starts at column h * D."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc, _ = descriptor(self.tensor, self.config.block_m)
        columns = dq_box_columns(self.config, self.q.shape[2])
        if columns != self.q.shape[2]:
            desc = TensorDescriptor(desc.base, shape=desc.shape, strides=desc.strides,
                                    block_shape=[self.config.block_m, columns])
        return desc

    def read(self) -> torch.Tensor:
        """dq in q's dtype and shape (contiguous)."""
        return self.tensor.to(self.q.dtype)


def jagged_dkdv_tlx(q, k, v, dout, lse, delta, dk, dv, out_cu, cu_k, *, causal: bool, softmax_scale: float,
                    broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dq_accum: Optional[DqAccumulator] = None,
                    variant: BackwardVariant = SHIPPED, outputs=None, window=(-1, -1), lists=None,
                    keep: Optional[dict] = None, profile: bool = False) -> Optional[torch.Tensor]:
    """Write dK and dV (``dk``, ``dv``: like k, v) of the jagged attention; ``delta`` is
    rowsum(dO * O) - dlse per output row and head (float32, like ``lse``), or None with
    ``outputs=(out, dout, dlse or None)`` to compute it with the row statistics (``row_stats``). With
    ``dq_accum`` (a ``DqAccumulator`` of q) the kernel also reduce-adds every tile's dQ into it (fused dQ:
    the order of the additions varies from run to run; ``dq_accum.read()`` gives dq). Raises ValueError
    when the TLX kernel cannot take these inputs (``supports``, dout included). ``window``: the API's
    ``window_size``; k and v may have fewer heads than q (a divisor): a work item is then a key tile of one
    key/value head, whose dK and dV sum its query heads' steps. ``lists``: block-sparse attention's
    (``jfa.kernels.block_lists.BlockLists``, blocks of one work item's keys): each key tile then steps over
    the query blocks that list it (``sparse_key_tiles``). ``keep``: a dict that receives the launches made,
    prepared for repeats (``_PlannedBackward``), when kernels ran. ``profile=True`` launches the profiling build
    and returns its records ([items, len(PROFILE_FIELDS)] int64, -1 where no item ran), None
    when no kernel ran; without it the call returns None."""
    if profile and keep is not None:
        raise ValueError("jagged_dkdv_tlx: a profiling launch is never kept for repeats (keep with profile=True)")
    head_dim, num_heads = q.shape[-1], q.shape[1]
    ok, reason = supports(q, dout, k=k, v=v)
    if not ok:
        raise ValueError(f"jagged_dkdv_tlx: {reason}")
    causal, banded, band_lo, band_hi = window_band(causal, window)
    group = num_heads // k.shape[1]
    fused = dq_accum is not None
    cfg = config_for(head_dim, fused)
    if fused and dq_accum.q.shape != q.shape:
        raise ValueError("jagged_dkdv_tlx: dq_accum was built for another q")
    if k.shape[0] == 0 or q.shape[0] == 0 or dout.shape[0] == 0 or num_heads == 0 or num_seqs == 0:
        if fused and not dq_accum.zeroed:  # no key anywhere: dq is 0
            dq_accum.tensor.zero_()
            dq_accum.zeroed = True
        dk.zero_()  # no query anywhere: every key gets zero gradients
        dv.zero_()
        return None
    if lists is None:
        tiles = build_tile_list(cu_k, k.shape[0], NUM_CONSUMERS * cfg.block_n,
                                work_offsets=None if broadcast_q else out_cu)
        col_off = q_idx = tiles.tiles  # never read by the dense build: any int32 pointer stands in
    else:
        tiles, col_off, q_idx = sparse_key_tiles(lists, out_cu, cu_k, dout.shape[0], k.shape[0])
    desc_q, col_q = descriptor(q, cfg.block_m)
    desc_do, col_do = descriptor(dout, cfg.block_m)
    desc_k, col_k = descriptor(k, cfg.block_n)
    desc_v, col_v = descriptor(v, cfg.block_n)
    # (the kernel places head h of the accumulator at column h * D: it is contiguous, like q)
    desc_dq = dq_accum.descriptor() if fused else desc_q
    zero = None  # the accumulator's zeroing: in the statistics' pass where it covers the accumulator's rows
    if fused and not dq_accum.zeroed:
        if outputs is not None and not broadcast_q and q.shape[0] == lse.shape[0]:
            zero = dq_accum.tensor
        else:
            dq_accum.tensor.zero_()
            dq_accum.zeroed = True
    stats, stats_cu = row_stats(lse, delta, out_cu, num_seqs, outputs=outputs, zero=zero, keep=keep)
    if zero is not None:
        dq_accum.zeroed = True
    desc_stats = stats_descriptor(stats, cfg.block_m)
    num_items = tiles.num_slots * k.shape[1]  # (key tile, key/value head)
    cu_q = cu_k if broadcast_q else out_cu
    grid = min(sm_count(q.device), num_items) if variant.persistent else num_items
    dynamic = variant.persistent and variant.dynamic(lists is not None, causal=causal, window=banded)
    steps = None if lists is not None or banded else item_steps(
        dout.shape[0], num_seqs, broadcast_q=broadcast_q, len_q_bcast=len_q_bcast, group=group, causal=causal,
        block_m=cfg.block_m)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, window=banded, group=group,
                            sparse=lists is not None, dynamic=dynamic, profile=profile,
                            kv_buffers=variant.kv_buffers(cfg, steps=steps, broadcast_q=broadcast_q))
    timeline = None
    if profile:
        constants["TIMELINE"] = timeline = torch.full((num_items, len(PROFILE_FIELDS)), -1, dtype=torch.int64,
                                                      device=q.device)
    band = (constants.pop("band_lo", band_lo), constants.pop("band_hi", band_hi))  # None: constexpr
    band += tuple(constants.pop(name) for name in MX_ARGS)  # (None: the MX build's operands)
    counter = schedule_counter(dynamic, q.device, tiles.tiles)
    args = (desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, dk, dv, cu_q, cu_k, stats_cu, tiles.tiles, col_off,
            q_idx, counter, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), col_q, col_k, col_v, col_do,
            num_items, grid, triton.cdiv(num_items, grid), tiles.num_slots, num_seqs, num_heads, len_q_bcast,
            softmax_scale, *band)
    kwargs = {**constants, **_launch_options()}
    with pipeline.build_llvm_o0(jagged_dkdv_tlx_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        target.launch(jagged_dkdv_tlx_kernel, (grid,), q.device, *args, **kwargs)
        if profile:  # the item's own steps: the CTA's count after it less the count before it
            steps, first_step = (PROFILE_FIELDS.index(f) for f in ("steps", "first_step"))
            timeline[:, steps] = torch.where(timeline[:, steps] >= 0, timeline[:, steps] - timeline[:, first_step], -1)
        if keep is not None:
            replaced = _PlannedBackward.REPLACED + (("COUNTER",) if dynamic else ())
            keep["dkdv"] = (target.prepare(jagged_dkdv_tlx_kernel, q.device, args, kwargs, replaced),
                            grid, cfg.llvm_o0, args[:6], zero is not None, dynamic)
    return timeline


class _PlannedBackward:
    """The fused backward of one call structure and gradient layout (``jfa.plans``), its two launches
    prepared: a call allocates dK, dV, the dQ accumulator and the statistics, re-bases the kept
    descriptors on its tensors and launches the statistics' pass and the dK/dV kernel."""

    # the dK/dV kernel's parameters a planned call replaces: every tensor but the offsets and the tile lists,
    # and under the dynamic schedule the current stream's work counter
    REPLACED = ("desc_q", "desc_k", "desc_v", "desc_do", "desc_stats", "desc_dq", "DK", "DV")

    def __init__(self, keep: dict, q, k):
        """From what ``jagged_dkdv_tlx`` kept (``keep``) of a fused launch on q, k."""
        self.row_stats, self.stats_grid = keep["row_stats"]
        self.dkdv, self.grid, self.llvm_o0, self.descriptors, self.zero_in_stats, self.dynamic = keep["dkdv"]
        self.stats_shape = self.descriptors[4].base.shape

    def __call__(self, q, k, v, out, lse, dout, dlse):
        """(dq, dk, dv), or None when a prepared launch cannot run (the caller runs the usual way)."""
        device = q.device
        dk = alloc.empty(k.shape, k.dtype, device)
        dv = alloc.empty(v.shape, v.dtype, device)
        accumulator = torch.empty(q.shape, dtype=torch.float32, device=device)
        if not self.zero_in_stats:
            accumulator.zero_()
        stats = torch.zeros(self.stats_shape, dtype=torch.float32, device=device)
        dlse = lse if dlse is None else dlse.to(torch.float32).contiguous()
        if not self.row_stats.run(self.stats_grid, (lse, lse, out, dout, dlse, stats,
                                                    accumulator if self.zero_in_stats else stats)):
            return None
        desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq = self.descriptors
        replacements = (rebased(desc_q, q), rebased(desc_k, k), rebased(desc_v, v), rebased(desc_do, dout),
                        rebased(desc_stats, stats), rebased(desc_dq, accumulator), dk, dv)
        if self.dynamic:
            replacements += (work_counter(device),)
        with pipeline.build_llvm_o0(jagged_dkdv_tlx_kernel.fn.__name__, self.llvm_o0):
            ran = self.dkdv.run((self.grid,), replacements)
        if not ran:
            return None
        return accumulator.to(q.dtype), dk, dv


def variant_from_knobs() -> BackwardVariant:
    """What ships, or the switches ``knobs.tlx_bwd_variant`` names."""
    switches = knobs.tlx_bwd_variant
    return BackwardVariant.parse(switches) if switches else SHIPPED


def jagged_backward_tlx(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float,
                        broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None, deterministic=False,
                        variant: Optional[BackwardVariant] = None, window=(-1, -1), plan=None):
    """The TLX backward (same contract as ``jfa.kernels.triton.backward.jagged_backward``): the row
    statistics' pre-pass, then this kernel for dK and dV; dQ either reduce-added by the same kernel (the
    default, ``knobs.tlx_fused_dq``)
    or, with ``deterministic`` (or the knob off), by the portable dQ pass, which writes each row once in a
    fixed order (bitwise reproducible). ``plan``: the call's plan (``jfa.plans``): the fused backward keeps
    its prepared launches there per gradient layout, and later calls with that layout reuse them."""
    from jfa.kernels.triton import backward as portable

    grads_key = None
    if plan is not None:
        grads_key = gradient_key("tlx_backward", dout, dlse)
        planned = plan.memo.get(grads_key)
        if planned is not None:
            grads = planned(q, k, v, out, lse, dout, dlse)
            if grads is not None:
                return grads
    variant = variant_from_knobs() if variant is None else variant
    if deterministic or not knobs.tlx_fused_dq:
        return portable.jagged_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal,
                                        softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs,
                                        len_q_bcast=len_q_bcast, dlse=dlse, window=window,
                                        dkdv=functools.partial(jagged_dkdv_tlx, variant=variant))
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    dq_accum = DqAccumulator(q, zeroed=False)  # zeroed by the statistics' pass
    keep = {} if grads_key is not None else None
    # delta = rowsum(dO * O) - dlse is computed with the row statistics, in one pass (no delta tensor)
    jagged_dkdv_tlx(q, k, v, dout, lse, None, dk, dv, out_cu, cu_k, causal=causal, softmax_scale=softmax_scale,
                    broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dq_accum=dq_accum,
                    variant=variant, outputs=(out, dout, dlse), window=window, keep=keep)
    if keep and "row_stats" in keep and "dkdv" in keep:  # (both kernels ran: the call had rows and keys)
        plan.memo[grads_key] = _PlannedBackward(keep, q, k)
    return dq_accum.read(), dk, dv


def mx_backward_supports(q, k, v, window=(-1, -1)) -> tuple[bool, str]:
    """Whether the MXFP8 dK/dV build runs the backward of an MXFP8 call on q, k, v (the call's high-precision
    tensors), and why not: head dim 64 or 128, an sm_90 device, no sliding window (no windowed MX build)."""
    if tuple(window) not in ((-1, -1), (-1, 0)):
        return False, f"window_size {tuple(window)} (the TLX MXFP8 backward has no windowed build)"
    probe = torch.empty((0, q.shape[1], q.shape[-1]), dtype=torch.uint8, device=q.device)
    return check_inputs({"q": probe}, dtype=torch.bfloat16, head_dim=q.shape[-1],
                        head_dims=tuple(sorted(_MX_CONFIGS)))


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def mx_dkdv_tlx(q_dim, q_tok, k_dim, v_dim, do_dim, do_tok, lse, delta, dk, dv, out_cu, cu_k, *, causal: bool,
                softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, rule: str = "floor",
                keep: Optional[dict] = None) -> None:
    """Write dK and dV (``dk``, ``dv``: the inputs' shapes and dtype) of the MXFP8 backward with the ``MX``
    build: the contract of the portable ``mx_dkdv_kernel`` (docs/mxfp8.md section 2). ``q_dim``, ``k_dim``,
    ``v_dim``, ``do_dim``: MXTensors along dim; ``q_tok``, ``do_tok``: along tokens (q by its own offsets,
    ``[0, Lq]`` for a broadcast Q; dO by the output rows' ``out_cu``); ``delta`` = rowsum(dO O) - dlse
    ``[rows, H]``. Grouped key/value heads: an item's steps cover its key/value head's query heads. ``keep``: a
    dict that receives the launch's (args, kwargs, grid) (tests). The hook ``mx_attention.mx_backward`` calls
    (``dkdv=``)."""
    if rule not in MX_RULES:
        raise ValueError(f"rule: must be one of {MX_RULES}, got {rule!r}")
    head_dim, num_heads = q_dim.shape[-1], q_dim.shape[1]
    group = num_heads // k_dim.shape[1]
    cfg = config_for(head_dim, mx=rule)
    if k_dim.shape[0] == 0 or delta.shape[0] == 0 or num_heads == 0 or num_seqs == 0:
        dk.zero_()
        dv.zero_()
        return
    tiles = build_tile_list(cu_k, k_dim.shape[0], NUM_CONSUMERS * cfg.block_n,
                            work_offsets=None if broadcast_q else out_cu)
    stats, stats_cu = row_stats(lse, delta, out_cu, num_seqs)
    desc_stats = stats_descriptor(stats, cfg.block_m)
    num_items = tiles.num_slots * (num_heads // group)  # (key tile, key/value head)
    grid = min(sm_count(dk.device), num_items)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q, group=group, mx=rule)
    band = (constants.pop("band_lo"), constants.pop("band_hi"))
    cu_q = cu_k if broadcast_q else out_cu
    mx_args = (q_dim.scales, _u8(q_tok.data), q_tok.scales, q_tok.block_offsets, k_dim.scales, v_dim.scales,
               do_dim.scales, _u8(do_tok.data), do_tok.scales, do_tok.block_offsets)
    args = (_u8(q_dim.data), _u8(k_dim.data), _u8(v_dim.data), _u8(do_dim.data), desc_stats, desc_stats, dk, dv,
            cu_q, cu_k, stats_cu, tiles.tiles, tiles.tiles, tiles.tiles, tiles.tiles, dk.stride(0), dk.stride(1),
            dv.stride(0), dv.stride(1), head_dim, head_dim, head_dim, head_dim, num_items, grid,
            triton.cdiv(num_items, grid), tiles.num_slots, num_seqs, num_heads, len_q_bcast, softmax_scale, *band,
            *(t.contiguous() for t in mx_args))
    kwargs = {**constants, **_launch_options()}
    if keep is not None:
        keep.update(args=args, kwargs=kwargs, grid=grid)
    with pipeline.build_llvm_o0(jagged_dkdv_tlx_kernel.fn.__name__, cfg.llvm_o0):  # compiled as the config asks
        target.launch(jagged_dkdv_tlx_kernel, (grid,), dk.device, *args, **kwargs)


def mx_backward_tlx(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                    num_seqs: int, len_q_bcast: int = 0, window=(-1, -1), rule: str = "floor", dlse=None):
    """The MXFP8 backward with dK and dV on the TLX ``MX`` build (``mx_dkdv_tlx``) and dQ on the portable MX
    dQ pass: the contract of ``jfa.kernels.triton.mx_attention.mx_backward`` (which quantizes the operands and
    runs the dQ pass), bitwise reproducible (no atomics). Raises ValueError where ``mx_backward_supports``
    says no."""
    from jfa.kernels.triton import mx_attention

    ok, reason = mx_backward_supports(q, k, v, window)
    if not ok:
        raise ValueError(f"mx_backward_tlx: {reason}")
    return mx_attention.mx_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale,
                                    broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast,
                                    window=window, rule=rule, dlse=dlse, dkdv=mx_dkdv_tlx)


def sparse_key_tiles(lists, out_cu, cu_k, rows: int, total_k: int):
    """(TileList, COL_OFF, Q_IDX) of a block-sparse launch: the key blocks' (sequence, tile, block) as three
    int32 rows in ``heaviest_first``'s order (sequences by the query blocks listing their key blocks), and
    the transposed lists (``jfa.kernels.block_lists.transpose``)."""
    from jfa.kernels.block_lists import heaviest_first, key_blocks, query_blocks, transpose, transposed_counts
    from jfa.kernels.schedule import TileList

    cols = transpose(lists, query_blocks(out_cu, rows, lists.block_size), cu_k, total_k)
    blocks = key_blocks(cu_k, total_k, lists.block_size)
    order = heaviest_first(transposed_counts(cols, lists.num_heads), blocks).long()
    tiles = torch.cat([blocks.tiles[:, order], order.to(torch.int32)[None]]).contiguous()
    return TileList(tiles, blocks.num_slots, blocks.num_seqs, blocks.block), cols.offsets, cols.indices


def sparse_supports(q, k, v, dout, block_size: int) -> tuple[bool, str]:
    """Whether the block-sparse dK/dV build takes these inputs: the dense rules, blocks of one work item."""
    ok, reason = supports(q, dout, k=k, v=v)
    if not ok:
        return False, reason
    tile = NUM_CONSUMERS * config_for(q.shape[-1]).block_n
    if block_size != tile:
        return False, f"block_size {block_size} (the TLX sparse kernels take {tile})"
    return True, ""


def block_sparse_backward_tlx(q, k, v, out, lse, dout, cu_q, cu_k, lists, *, causal: bool, softmax_scale: float,
                              broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None, deterministic=False):
    """Block-sparse backward on the TLX dK/dV kernel (``SPARSE`` build), the contract of
    ``jfa.kernels.triton.block_sparse.block_sparse_backward``: dQ reduce-added by the same kernel where the
    fused build takes the call (``jagged_backward_tlx``'s rule), else by the portable block-sparse dQ pass
    (bitwise reproducible)."""
    from jfa.kernels.triton import block_sparse as portable
    from jfa.kernels.triton.backward import row_delta

    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    variant = variant_from_knobs()
    fused = not deterministic and knobs.tlx_fused_dq
    if not fused:
        delta = row_delta(out, dout, dlse)
        jagged_dkdv_tlx(q, k, v, dout, lse, delta, dk, dv, out_cu, cu_k, causal=causal, softmax_scale=softmax_scale,
                        broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, lists=lists,
                        variant=variant)
        dq = portable.block_sparse_dq(q, k, v, lse, dout, delta, cu_q, cu_k, lists, causal=causal,
                                      softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs,
                                      len_q_bcast=len_q_bcast)
        return dq, dk, dv
    dq_accum = DqAccumulator(q, zeroed=False)  # zeroed by the statistics' pass
    jagged_dkdv_tlx(q, k, v, dout, lse, None, dk, dv, out_cu, cu_k, causal=causal, softmax_scale=softmax_scale,
                    broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dq_accum=dq_accum,
                    outputs=(out, dout, dlse), lists=lists, variant=variant)
    return dq_accum.read(), dk, dv
