"""Jit helpers every TLX kernel shares: ring indices and phases, work-item decoding, static schedules.

A persistent TLX kernel walks work items ``(tile-list slot, head)`` (the tile list of
:mod:`jfa.kernels.schedule`, head fastest). Producer and consumer partitions decode each item with the
same helpers, so they agree on every loop count, which the mbarrier phases depend on.
"""
from __future__ import annotations

import triton
import triton.language as tl


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
