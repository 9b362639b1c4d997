"""Jagged FlashAttention backward for Hopper (sm_90a) in TLX: the dK/dV kernel (issue 4, first part).

STATUS: compile-verified offline only (``python -m jfa.kernels.compile_check --backend tlx``); it has
never run on a GPU and nothing in ``jfa.api`` reaches it. ``jagged_backward_tlx`` is the portable
backward (``jfa.kernels.triton.backward``) with its dK/dV pass swapped for this kernel: the delta
pre-pass and the dQ pass stay portable until the staged dQ reduction lands (issue 4, part 2).

Shape of the kernel (the forward's structure turned around: keys are the rows):

* Persistent grid, one CTA per SM, dealing work items zig-zag over a longest-first list (the forward's
  ``_static_item``). A work item is (key tile of ``2 * BLOCK_N`` rows, head); the tile list is built on
  the key offsets and sorted by each sequence's query length (the work a key tile streams over).
* Producer (default partition, one warpgroup): per item, TMA loads of each consumer's K and V half
  (``BLOCK_N`` rows each, single-buffered: reloaded when both MMAs of the item's last step retired),
  then one (Q, dO) tile pair of ``BLOCK_M`` query rows per step into a ring shared by both consumers.
* Two consumer warpgroups, each owning ``BLOCK_N`` key rows, in the transposed formulation: per query
  step ``S^T = K Q^T`` and ``dP^T = V dO^T`` on wgmma, ``P^T = exp2(S^T * scale * log2 e - lse2)``,
  ``dS^T = P^T (dP^T - delta)``, then ``dV += P^T dO`` and ``dK += dS^T Q`` with P^T and dS^T as
  register A operands. dK and dV live in registers for the whole item and are written once.
* Loop peeling: steps whose every query row sees every key of the tile run without a mask; the causal
  diagonal and the sequence's last partial query tile run the masked step (one helper, ``MASKED``).
* Jagged tails without padding: the TMA boxes may read rows of the next sequence; their lse and delta
  are loaded masked (lse2 = +inf makes P^T exactly 0) and key rows past the sequence are never stored.

Supported: bf16 and fp16, head dim 64 (D 128 spills; see ``_CONFIGS``), the forward's TMA layout rules.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.schedule import build_tile_list
from jfa.kernels.tlx.hopper.forward import (
    SCHEDULE_ZIGZAG,
    _bufidx_phase,
    _descriptor,
    _item_sequence,
    _sm_count,
    _static_item,
    supports,
    tlx,
)


@dataclass(frozen=True)
class HopperDkDvConfig:
    block_n: int  # key rows per consumer warpgroup (the M of every wgmma: 64)
    block_m: int  # query rows per step
    num_buffers_qdo: int  # (Q, dO) stages shared by both consumers
    consumer_regs: int  # setmaxnreg of each consumer warpgroup


NUM_CONSUMERS = 2
PRODUCER_WARPS = 4
_CONSUMERS = tl.constexpr(NUM_CONSUMERS)
_CONSUMER_WARPS = tl.constexpr(4)

_CONFIGS: dict[int, HopperDkDvConfig] = {
    # D 64: dK and dV accumulators 64x64 fp32 = 32 regs/thread each, S^T and dP^T (64x32) 16 each; no
    # spill at 240 registers (232 spilled; 64-row steps spill 24 B in the broadcast-Q build). Shared
    # memory: K, V halves 4 x 8 KB + 3 stages x (Q 4 KB + dO 4 KB) = 56 KB (72 KB with Triton's scratch).
    64: HopperDkDvConfig(block_n=64, block_m=32, num_buffers_qdo=3, consumer_regs=240),
    # D 128 is not shipped yet: dK and dV alone take 128 regs/thread, and the best build measured
    # offline (32-row steps, 240 registers) still spills 8 B; 16-row steps are not possible (wgmma
    # N >= 32). Needs the accumulators split differently (issue 4; NOTES.md has the measurements).
}
SUPPORTED_HEAD_DIMS = tuple(sorted(_CONFIGS))


def config_for(head_dim: int) -> HopperDkDvConfig:
    return _CONFIGS[head_dim]


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
def _step_tile(j, first, n_lead, bulk_end):
    """Query tile of the j-th step of an item. Masked steps come first (the causal diagonal tiles, then
    the partial last tile), the fully visible bulk after them: the consumer runs two loops (masked,
    bulk) instead of three, one inlined copy of the step less (registers), and the producer loads in
    the same order."""
    return tl.where(j < n_lead, first + j, bulk_end + j - n_lead)


@triton.jit
def _produce_dkdv_item(item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, k_tiles, v_tiles, q_tiles, do_tiles,
                       kv_fulls, kv_empties, qdo_fulls, qdo_empties, TILES, CU_Q, CU_K, num_slots, num_heads,
                       num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, col_stride_do,
                       CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, TILE_N: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr,
                       KV_BYTES: tl.constexpr, QDO_BYTES: tl.constexpr):
    """Producer, one work item: each consumer's K and V half, then the (Q, dO) tile of every step."""
    head, q_row0, out_row0, len_q, k_row0, _lk, n_start, _cs, first, n_lead, bulk_end, num_q_tiles = _dkdv_item(
        TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q, TILE_N, BLOCK_M)
    n_masked = n_lead + num_q_tiles - bulk_end
    kv_phase = kv_cnt & 1
    for c in tl.static_range(_CONSUMERS):
        tlx.barrier_wait(kv_empties[c], kv_phase ^ 1)
        tlx.barrier_expect_bytes(kv_fulls[c], 2 * KV_BYTES)
        row = k_row0 + n_start + c * BLOCK_N
        tlx.async_descriptor_load(desc_k, k_tiles[c], [row, head * col_stride_k], kv_fulls[c])
        tlx.async_descriptor_load(desc_v, v_tiles[c], [row, head * col_stride_v], kv_fulls[c])
    for j in tl.range(0, num_q_tiles - first):
        # masked steps first, then the bulk (the consumers' order, see _step_tile)
        i = tl.where(j < n_masked, _step_tile(j, first, n_lead, bulk_end), first + n_lead + j - n_masked)
        buf, phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
        tlx.barrier_wait(qdo_empties[buf], phase ^ 1)
        tlx.barrier_expect_bytes(qdo_fulls[buf], 2 * QDO_BYTES)
        tlx.async_descriptor_load(desc_q, q_tiles[buf], [q_row0 + i * BLOCK_M, head * col_stride_q], qdo_fulls[buf])
        tlx.async_descriptor_load(desc_do, do_tiles[buf], [(out_row0 + i * BLOCK_M).to(tl.int32),
                                                           head * col_stride_do], qdo_fulls[buf])
        qdo_cnt += 1
    return kv_cnt + 1, qdo_cnt


@triton.jit
def _dkdv_step(dk, dv, k_tile, v_tile, q_tile, do_tile, LSE, DELTA, out_row0, m_start, offs_n, len_q, num_heads,
               head, causal_shift, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
               DTYPE: tl.constexpr):
    """One query step of one consumer: S^T and dP^T on wgmma, P^T and dS^T in registers, then
    dV += P^T dO and dK += dS^T Q. Returns (dk, dv) with both MMAs retired."""
    offs_m = m_start + tl.arange(0, BLOCK_M)
    o_rows = out_row0 + offs_m.to(tl.int64)
    if MASKED:
        m_ok = offs_m < len_q
        lse = tl.load(LSE + o_rows * num_heads + head, mask=m_ok, other=float("-inf"))
        delta = tl.load(DELTA + o_rows * num_heads + head, mask=m_ok, other=0.0)
    else:
        lse = tl.load(LSE + o_rows * num_heads + head)
        delta = tl.load(DELTA + o_rows * num_heads + head)
    # a row that saw no key (or lies past the sequence) has lse = -inf: +inf makes P^T exactly 0
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    s_t = tlx.async_dot(k_tile, tlx.local_trans(q_tile))     # [BLOCK_N, BLOCK_M]
    dp_t = tlx.async_dot(v_tile, tlx.local_trans(do_tile))   # [BLOCK_N, BLOCK_M]
    s_t = tlx.async_dot_wait(1, s_t)
    p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
    if MASKED:
        if CAUSAL:
            p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_shift, p_t, 0.0)
    dp_t = tlx.async_dot_wait(0, dp_t)
    dv = tlx.async_dot(p_t.to(DTYPE), do_tile, dv)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tlx.async_dot(ds_t.to(DTYPE), q_tile, dk)
    dv = tlx.async_dot_wait(1, dv)
    dk = tlx.async_dot_wait(0, dk)
    return dk, dv


@triton.jit
def _dkdv_ring_step(dk, dv, qdo_cnt, k_tile, v_tile, q_tiles, do_tiles, qdo_fulls, qdo_empties, LSE, DELTA,
                    out_row0, m_start, offs_n, len_q, num_heads, head, causal_shift, qk_scale, MASKED: tl.constexpr,
                    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, DTYPE: tl.constexpr):
    """Wait for the next (Q, dO) ring slot, run one step on it, hand the slot back."""
    buf, phase = _bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    tlx.barrier_wait(qdo_fulls[buf], phase)
    dk, dv = _dkdv_step(dk, dv, k_tile, v_tile, q_tiles[buf], do_tiles[buf], LSE, DELTA, out_row0, m_start, offs_n,
                        len_q, num_heads, head, causal_shift, qk_scale, MASKED, CAUSAL, BLOCK_M, DTYPE)
    tlx.barrier_arrive(qdo_empties[buf], 1)
    return dk, dv, qdo_cnt + 1


@triton.jit
def _consume_dkdv_item(item, kv_cnt, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, kv_fulls, kv_empties, qdo_fulls,
                       qdo_empties, DK, DV, LSE, DELTA, TILES, CU_Q, CU_K, stride_dkt, stride_dkh, stride_dvt,
                       stride_dvh, num_slots, num_heads, num_seqs, len_q_bcast, sm_scale, qk_scale,
                       cid: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
                       TILE_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       NUM_BUFFERS_QDO: tl.constexpr, DTYPE: tl.constexpr):
    """Consumer ``cid``, one work item: its BLOCK_N key rows against every query step, then one store
    of dK (scaled) and dV."""
    head, _qr, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, n_lead, bulk_end, num_q_tiles = \
        _dkdv_item(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, CAUSAL, BROADCAST_Q,
                   TILE_N, BLOCK_M)
    offs_n = n_start + cid * BLOCK_N + tl.arange(0, BLOCK_N)
    k_tile = k_tiles[cid]
    v_tile = v_tiles[cid]
    tlx.barrier_wait(kv_fulls[cid], kv_cnt & 1)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    # masked steps (causal diagonal, partial last tile) first, then the bulk: the producer's order
    for j in tl.range(0, n_lead + num_q_tiles - bulk_end):
        dk, dv, qdo_cnt = _dkdv_ring_step(
            dk, dv, qdo_cnt, k_tile, v_tile, q_tiles, do_tiles, qdo_fulls, qdo_empties, LSE, DELTA, out_row0,
            _step_tile(j, first, n_lead, bulk_end) * BLOCK_M, offs_n, len_q, num_heads, head, causal_shift,
            qk_scale, True, CAUSAL, BLOCK_M, NUM_BUFFERS_QDO, DTYPE)
    for i in tl.range(first + n_lead, bulk_end):
        dk, dv, qdo_cnt = _dkdv_ring_step(
            dk, dv, qdo_cnt, k_tile, v_tile, q_tiles, do_tiles, qdo_fulls, qdo_empties, LSE, DELTA, out_row0,
            i * BLOCK_M, offs_n, len_q, num_heads, head, causal_shift, qk_scale, False, CAUSAL, BLOCK_M,
            NUM_BUFFERS_QDO, DTYPE)
    tlx.barrier_arrive(kv_empties[cid], 1)  # every MMA reading this item's K and V has retired

    # epilogue: key rows past the sequence belong to the next one and are never written
    row_ok = offs_n < len_k
    offs_d = tl.arange(0, HEAD_DIM)
    rows = k_row0.to(tl.int64) + offs_n.to(tl.int64)
    tl.store(DK + rows[:, None] * stride_dkt + head * stride_dkh + offs_d[None, :], (dk * sm_scale).to(DTYPE),
             mask=row_ok[:, None])
    tl.store(DV + rows[:, None] * stride_dvt + head * stride_dvh + offs_d[None, :], dv.to(DTYPE),
             mask=row_ok[:, None])
    return kv_cnt + 1, qdo_cnt


@triton.jit(do_not_specialize=["num_items", "num_slots", "num_seqs", "num_heads", "len_q_bcast"])
def jagged_dkdv_tlx_kernel(
    desc_q, desc_k, desc_v, desc_do, DK, DV, LSE, DELTA, CU_Q, CU_K, TILES,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh, col_stride_q, col_stride_k, col_stride_v, col_stride_do,
    num_items, num_slots, num_seqs, num_heads, len_q_bcast, sm_scale,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, CONSUMER_REGS: tl.constexpr,
):
    TILE_N: tl.constexpr = _CONSUMERS * BLOCK_N
    DTYPE: tl.constexpr = tlx.dtype_of(desc_q)
    KV_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(DTYPE)
    QDO_BYTES: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(DTYPE)
    pid = tl.program_id(0)
    num_progs = tl.num_programs(0)

    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, _CONSUMERS)
    v_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), DTYPE, _CONSUMERS)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), DTYPE, NUM_BUFFERS_QDO)
    kv_fulls = tlx.alloc_barriers(num_barriers=_CONSUMERS, arrive_count=1)
    kv_empties = tlx.alloc_barriers(num_barriers=_CONSUMERS, arrive_count=1)
    qdo_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=1)
    qdo_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_QDO, arrive_count=_CONSUMERS)

    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA loads
            kv_cnt = 0
            qdo_cnt = 0
            for rounds in range(0, tl.cdiv(num_items, num_progs)):
                item = _static_item(rounds, pid, num_progs, SCHEDULE_ZIGZAG)
                if item < num_items:
                    kv_cnt, qdo_cnt = _produce_dkdv_item(
                        item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, k_tiles, v_tiles, q_tiles, do_tiles,
                        kv_fulls, kv_empties, qdo_fulls, qdo_empties, TILES, CU_Q, CU_K, num_slots, num_heads,
                        num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v, col_stride_do, CAUSAL,
                        BROADCAST_Q, TILE_N, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, KV_BYTES, QDO_BYTES)
        with tlx.async_task(num_warps=_CONSUMER_WARPS, registers=CONSUMER_REGS, replicate=_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            qk_scale = sm_scale * 1.4426950408889634
            kv_cnt = 0
            qdo_cnt = 0
            for rounds in range(0, tl.cdiv(num_items, num_progs)):
                item = _static_item(rounds, pid, num_progs, SCHEDULE_ZIGZAG)
                if item < num_items:
                    kv_cnt, qdo_cnt = _consume_dkdv_item(
                        item, kv_cnt, qdo_cnt, k_tiles, v_tiles, q_tiles, do_tiles, kv_fulls, kv_empties, qdo_fulls,
                        qdo_empties, DK, DV, LSE, DELTA, TILES, CU_Q, CU_K, stride_dkt, stride_dkh, stride_dvt,
                        stride_dvh, num_slots, num_heads, num_seqs, len_q_bcast, sm_scale, qk_scale, cid, HEAD_DIM,
                        CAUSAL, BROADCAST_Q, TILE_N, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, DTYPE)


# ----------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------
def _constexprs(cfg: HopperDkDvConfig, head_dim: int, *, causal: bool, broadcast_q: bool) -> dict:
    return dict(HEAD_DIM=head_dim, CAUSAL=causal, BROADCAST_Q=broadcast_q, BLOCK_N=cfg.block_n,
                BLOCK_M=cfg.block_m, NUM_BUFFERS_QDO=cfg.num_buffers_qdo, CONSUMER_REGS=cfg.consumer_regs)


def _launch_options() -> dict:
    return dict(num_warps=PRODUCER_WARPS, num_stages=1)  # explicit pipelining only


def compile_spec(dtype: str, head_dim: int, *, causal: bool, broadcast_q: bool):
    """``(kernel, signature, constants, attrs, options)`` for an offline ``triton.compile``."""
    cfg = config_for(head_dim)
    constants = _constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q)
    blocks = {"desc_q": cfg.block_m, "desc_do": cfg.block_m, "desc_k": cfg.block_n, "desc_v": cfg.block_n}
    signature, attrs = {}, {}
    for index, name in enumerate(jagged_dkdv_tlx_kernel.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name in blocks:
            signature[name] = f"tensordesc<{dtype}[{blocks[name]}, {head_dim}]>"
        elif name in ("DK", "DV"):
            signature[name] = f"*{dtype}"
        elif name in ("LSE", "DELTA"):
            signature[name] = "*fp32"
        elif name in ("CU_Q", "CU_K", "TILES"):
            signature[name] = "*i32"
        elif name == "sm_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        if signature[name].startswith("*") or "stride" in name:
            attrs[(index,)] = [["tt.divisibility", 16]]
    return jagged_dkdv_tlx_kernel, signature, constants, attrs, _launch_options()


def jagged_dkdv_tlx(q, k, v, dout, lse, delta, dk, dv, out_cu, cu_k, *, causal: bool, softmax_scale: float,
                    broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0) -> None:
    """Write dK and dV (``dk``, ``dv``: like k, v) of the jagged attention; ``delta`` is
    rowsum(dO * O) - dlse per output row and head (float32, like ``lse``). Raises ValueError when the
    TLX kernel cannot take these inputs (``forward.supports``, dout included)."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    ok, reason = supports(q, head_dim, q.dtype, k=k, v=v)
    if ok and head_dim not in SUPPORTED_HEAD_DIMS:
        ok, reason = False, f"head_dim {head_dim} not supported by the dK/dV kernel (only {SUPPORTED_HEAD_DIMS})"
    if ok:
        ok, reason = supports(dout, head_dim, dout.dtype)
    if not ok:
        raise ValueError(f"jagged_dkdv_tlx: {reason}")
    cfg = config_for(head_dim)
    if k.shape[0] == 0:
        return
    if q.shape[0] == 0 or dout.shape[0] == 0:  # no query anywhere: every key gets zero gradients
        dk.zero_()
        dv.zero_()
        return
    tiles = build_tile_list(cu_k, k.shape[0], NUM_CONSUMERS * cfg.block_n,
                            work_offsets=None if broadcast_q else out_cu)
    desc_q, col_q = _descriptor(q, cfg.block_m)
    desc_do, col_do = _descriptor(dout, cfg.block_m)
    desc_k, col_k = _descriptor(k, cfg.block_n)
    desc_v, col_v = _descriptor(v, cfg.block_n)
    num_items = tiles.num_slots * num_heads
    cu_q = cu_k if broadcast_q else out_cu
    grid = (min(_sm_count(q.device), num_items),)
    jagged_dkdv_tlx_kernel[grid](
        desc_q, desc_k, desc_v, desc_do, dk, dv, lse, delta, cu_q, cu_k, tiles.tiles,
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), col_q, col_k, col_v, col_do,
        num_items, tiles.num_slots, num_seqs, num_heads, len_q_bcast, softmax_scale,
        **_constexprs(cfg, head_dim, causal=causal, broadcast_q=broadcast_q), **_launch_options())


def jagged_backward_tlx(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float,
                        broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None):
    """The portable backward with its dK/dV pass on this kernel (same contract as
    ``jfa.kernels.triton.backward.jagged_backward``)."""
    from jfa.kernels.triton import backward as portable

    return portable.jagged_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal,
                                    softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs,
                                    len_q_bcast=len_q_bcast, dlse=dlse, dkdv=jagged_dkdv_tlx)
