"""Jit helpers every TLX kernel shares: ring indices and phases, work-item decoding, static and dynamic
schedules.

A persistent TLX kernel walks work items ``(tile-list slot, head)`` (the tile list of
:mod:`jfa.kernels.schedule`, head fastest). Producer and consumer partitions decode each item with the
same helpers, so they agree on every loop count, which the mbarrier phases depend on. Under the dynamic
schedule the dK/dV producer takes items from a global counter (``fetch_item``) and hands each to the consumers
through a ring in shared memory (``receive_item``), so every partition of a CTA walks the same items (the
forward's producer publishes its items decoded instead: ``jfa.kernels.tlx.hopper.item_ring``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from jfa.kernels.tlx.common.host import tlx

ITEM_BUFFERS = tl.constexpr(2)  # dynamic schedule: items the producer may fetch ahead of the consumers


@triton.jit
def bufidx_phase(count, NUM_BUFFERS: tl.constexpr):
    """Buffer index and mbarrier phase of the ``count``-th use of a ring of NUM_BUFFERS buffers."""
    return count % NUM_BUFFERS, (count // NUM_BUFFERS) & 1


@triton.jit
def safe_sequence(seq, num_seqs):
    """(a sequence index safe to load offsets with, whether ``seq`` is real) for a tile-list entry: a
    spare slot (sequence == num_seqs) reads sequence 0's offsets, and its caller discards what it got."""
    valid = seq < num_seqs
    return tl.where(valid, seq, 0), valid


@triton.jit
def item_sequence(TILES, CU_Q, CU_K, item, num_slots, num_heads, num_seqs, len_q_bcast, BROADCAST_Q: tl.constexpr,
                  HEAD_MAJOR: tl.constexpr = False):
    """(head, tile, q_row0, out_row0, len_q, k_row0, len_k) of work item ``item`` (``item_slot_head``).
    Row origins are int32 (TMA coordinates; the packed tensors are checked to hold < 2**31 rows), output
    rows int64. A spare slot (sequence == num_seqs) gets both lengths 0."""
    slot, head = item_slot_head(item, num_slots, num_heads, HEAD_MAJOR)
    seq = tl.load(TILES + slot)
    tile = tl.load(TILES + (slot + num_slots))
    s, valid = safe_sequence(seq, num_seqs)
    k_row0 = tl.load(CU_K + s).to(tl.int32)
    len_k = tl.load(CU_K + s + 1).to(tl.int32) - k_row0
    if BROADCAST_Q:
        q_row0 = tl.zeros((), dtype=tl.int32)
        out_row0 = s.to(tl.int64) * len_q_bcast
        len_q = len_q_bcast + tl.zeros((), dtype=tl.int32)
    else:
        q_row0 = tl.load(CU_Q + s).to(tl.int32)
        out_row0 = q_row0.to(tl.int64)
        len_q = tl.load(CU_Q + s + 1).to(tl.int32) - q_row0
    return head, tile, q_row0, out_row0, tl.where(valid, len_q, 0), k_row0, tl.where(valid, len_k, 0)


@triton.jit
def item_slot_head(item, num_slots, num_heads, HEAD_MAJOR: tl.constexpr):
    """(tile-list slot, head) of work item ``item``: slot-major (the heads of a slot side by side) or, with
    HEAD_MAJOR, head-major (every slot of head 0, then of head 1, ...). Head-major, the CTAs at work at one
    time share a head and a few sequences, so what they read or reduce into per (sequence, head) stays in
    L2: the block-sparse dK/dV, whose key blocks each visit their own query tiles, outgrew L2 with the
    heads interleaved (hit rate 52% against 79% dense, NOTES.md session 16)."""
    if HEAD_MAJOR:
        return item % num_slots, item // num_slots
    return item // num_heads, item % num_heads


@triton.jit
def static_item(round, pid, num_progs, ZIGZAG: tl.constexpr):
    """Work item of CTA ``pid`` in round ``round`` of a static schedule (>= num_items: no more work).

    Items are ordered longest first, so a round deals items of similar length. Round-robin gives CTA
    ``pid`` items pid, pid + P, pid + 2P, ...; zig-zag deals even rounds left to right and odd rounds
    right to left, so the CTA that got the longest item of one round gets the shortest of the next,
    which evens out the per-CTA totals (LPT by hand, no synchronisation)."""
    if ZIGZAG:
        lane = tl.where(round % 2 == 0, pid, num_progs - 1 - pid)
    else:
        lane = pid
    return round * num_progs + lane


@triton.jit
def fetch_item(COUNTER, item_bufs, item_fulls, item_empties, count):
    """Producer side of the dynamic schedule: the next item of the launch (an atomic add on ``COUNTER[0]``;
    >= num_items: no more work), handed to the consumers as the CTA's ``count``-th through shared memory.
    barrier_arrive syncs the producer's warps before thread 0 arrives, so the store is visible to whoever
    passes the full barrier."""
    item = tl.atomic_add(COUNTER, 1)
    buf, phase = bufidx_phase(count, ITEM_BUFFERS)
    tlx.barrier_wait(item_empties[buf], phase ^ 1)
    tlx.local_store(item_bufs[buf], item + tl.zeros([1], dtype=tl.int32))
    tlx.barrier_arrive(item_fulls[buf], 1)
    return item


@triton.jit
def receive_item(item_bufs, item_fulls, item_empties, count):
    """Consumer side of the dynamic schedule: the ``count``-th item the CTA's producer fetched."""
    buf, phase = bufidx_phase(count, ITEM_BUFFERS)
    tlx.barrier_wait(item_fulls[buf], phase)
    item = tl.max(tlx.local_load(item_bufs[buf]), 0)
    tlx.barrier_arrive(item_empties[buf], 1)
    return item


@triton.jit
def retire_counter(COUNTER, num_progs):
    """The producer's last act under the dynamic schedule (after its fetch past the last item): count the
    CTA done; the last CTA done zeroes both words, so the counter is zero for the next launch on its
    stream without a memset (every CTA's last fetch came before it counted itself done)."""
    done = tl.atomic_add(COUNTER + 1, 1)
    if done == num_progs - 1:
        tl.store(COUNTER, 0)
        tl.store(COUNTER + 1, 0)


@triton.jit
def to_16bit_pairs(x, DTYPE: tl.constexpr):
    """fp32 ``x`` cast to DTYPE (bf16 or fp16), round to nearest even: bitwise ``x.to(DTYPE)``. Two elements
    per ``cvt.rn.*x2.f32``, which writes the packed register a wgmma A operand reads from registers; the
    cast's one-element conversions need a byte permute (PRMT) per pair to build that register."""
    if DTYPE == tl.bfloat16:
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.float16,
                                         is_pure=True, pack=2)


@triton.jit
def online_softmax_step(qk, m_i, l_i, n_start, offs_m, len_k, causal_shift, qk_scale, lo, hi, MASKED: tl.constexpr,
                        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SCALE_NONNEG: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    """Online softmax of one K/V block in base 2 (bf16/fp16 builds). Returns (p, m_new, l_new, alpha).

    The bulk instantiation (MASKED=False) has no mask at all and folds the scale into the row max (max(S) *
    scale for a non-negative scale, min(S) * scale otherwise: one FMA per element). The masked one drops keys
    past the sequence end (rows of the next sequence or TMA zero fill) and, if CAUSAL, past the diagonal, or
    with WINDOW outside the band ``lo <= j - i <= hi``; a row that has seen no key yet keeps m = -inf and
    subtracts 0, so exp2 gives 0, not NaN."""
    if MASKED:
        offs_n = n_start + tl.arange(0, BLOCK_N)
        if WINDOW:
            # each row's first and last visible key, the sequence's end folded into the last (spelled per row,
            # not per element as j - i: that way the D 128 window build spills 12 B; compile gate, offline)
            first_key = offs_m + lo
            last_key = tl.minimum(offs_m + hi, len_k - 1)
            visible = (offs_n[None, :] >= first_key[:, None]) & (offs_n[None, :] <= last_key[:, None])
        else:
            visible = (offs_n < len_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= (offs_m + causal_shift)[:, None])
        s = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
    else:
        if SCALE_NONNEG:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        else:
            m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, m_new, l_new, alpha


@triton.jit
def mx_scale_rows(TILES, QB_OFF, OB_OFF, item, num_slots, num_heads, num_seqs, BROADCAST_Q: tl.constexpr):
    """The first token-axis scale rows of an MX backward item's sequence: Q's (``QB_OFF``; the one broadcast
    query block's under BROADCAST_Q) and dO's (``OB_OFF``). Returns (qb0, ob0)."""
    slot, _h = item_slot_head(item, num_slots, num_heads, False)
    seq, _valid = safe_sequence(tl.load(TILES + slot), num_seqs)
    if BROADCAST_Q:
        qb0 = tl.load(QB_OFF)
    else:
        qb0 = tl.load(QB_OFF + seq)
    ob0 = tl.load(OB_OFF + seq)
    return qb0, ob0


@triton.jit
def record_stamp(TIMELINE, item, FIELD: tl.constexpr, value, RECORD: tl.constexpr):
    """A profiling build's record: field FIELD of row ``item`` of TIMELINE (int64 rows of RECORD fields), written
    as its phase ends, so that nothing of the record stays in registers across the item."""
    tl.store(TIMELINE + item.to(tl.int64) * RECORD + FIELD, value.to(tl.int64))


# ----------------------------------------------------------------------------------------------------
# clocks of the profiling builds (the simulator answers these reads: ``jfa.sim.launch``)
@triton.jit
def globaltimer():
    """Nanoseconds of the GPU's global timer (one clock for every SM, unlike clock64)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def smid():
    """The SM running the CTA."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def clock64():
    """The SM's cycle counter: one clock for the warps of a CTA, not comparable across SMs."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
