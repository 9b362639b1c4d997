"""The TLX Hopper forward's item ring: the producer decodes each work item once and hands it to both consumer
warpgroups through shared memory, so that a consumer starts its next item after a few shared-memory reads
instead of the tile list's and the offsets' dependent global loads.

The ring has ``ITEM_BUFFERS`` slots of ``ITEM_FIELDS`` int32 words (``+ WINDOW_FIELDS`` in windowed builds),
allocated by the kernel with a full barrier (one arrival: the producer) and an empty barrier (one arrival
per consumer) per slot. The producer publishes the CTA's items in order (``publish_item``), then the launch's
item count (``publish_end``), which ends the consumers' loop; each consumer waits for the slot
(``peek_item``), reads the rest and hands it back (``take_item``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from jfa.kernels.tlx.common.device import ITEM_BUFFERS, bufidx_phase
from jfa.kernels.tlx.common.host import tlx

# The words of one work item as the producer hands it to the consumers (``publish_item``).
# OUT_ROW fits int32: an output of 2**31 rows of even 64 bf16 values would be 256 GiB.
ITEM_FIELDS = tl.constexpr(10)
F_ITEM = tl.constexpr(0)
F_HEAD = tl.constexpr(1)
F_M_START = tl.constexpr(2)
F_LEN_Q = tl.constexpr(3)
F_LEN_K = tl.constexpr(4)
F_OUT_ROW = tl.constexpr(5)
F_J0 = tl.constexpr(6)
F_N_BLOCKS = tl.constexpr(7)
F_N_BULK = tl.constexpr(8)  # one word per consumer
# a windowed build's ring words follow: the band and the visiting order's rotation (``forward._window_rotation``)
WINDOW_FIELDS = tl.constexpr(3)
F_LO = tl.constexpr(10)
F_HI = tl.constexpr(11)
F_ROT = tl.constexpr(12)


@triton.jit
def _put(ring, index, value):
    tlx.local_store(ring[index], (tl.zeros([1], dtype=tl.int32) + value).to(tl.int32))


@triton.jit
def _get(ring, index):
    return tl.max(tlx.local_load(ring[index]), 0)


@triton.jit
def publish_item(ring, fulls, empties, count, item, head, m_start, len_q, len_k, out_row0, j0, n_blocks, n_bulk0,
                 n_bulk1, lo=0, hi=0, rot=0, WINDOW: tl.constexpr = False):
    """Producer: hand the consumers work item ``item`` decoded, as the CTA's ``count``-th (an item >= the
    launch's count ends their loop). The consumers then read nine words of shared memory (WINDOW: twelve,
    the band and the rotation too) instead of the tile list's and the offsets' dependent global loads at
    every item boundary. barrier_arrive syncs the producer's warps before thread 0 arrives, so the stores
    are visible to whoever passes the full barrier."""
    buf, phase = bufidx_phase(count, ITEM_BUFFERS)
    tlx.barrier_wait(empties[buf], phase ^ 1)
    base = buf * (ITEM_FIELDS + WINDOW_FIELDS * WINDOW)
    _put(ring, base + F_ITEM, item)
    _put(ring, base + F_HEAD, head)
    _put(ring, base + F_M_START, m_start)
    _put(ring, base + F_LEN_Q, len_q)
    _put(ring, base + F_LEN_K, len_k)
    _put(ring, base + F_OUT_ROW, out_row0)
    _put(ring, base + F_J0, j0)
    _put(ring, base + F_N_BLOCKS, n_blocks)
    _put(ring, base + F_N_BULK, n_bulk0)
    _put(ring, base + F_N_BULK + 1, n_bulk1)
    if WINDOW:
        _put(ring, base + F_LO, lo)
        _put(ring, base + F_HI, hi)
        _put(ring, base + F_ROT, rot)
    tlx.barrier_arrive(fulls[buf], 1)


@triton.jit
def publish_end(ring, fulls, empties, count, num_items, WINDOW: tl.constexpr = False):
    """Producer: after its ``count`` items, the launch's item count ``num_items`` as the next item, which ends
    the consumers' loop (without it they wait on the next slot forever)."""
    publish_item(ring, fulls, empties, count, num_items, 0, 0, 0, 0, 0, 0, 0, 0, 0, WINDOW=WINDOW)


@triton.jit
def peek_item(ring, fulls, count, WINDOW: tl.constexpr = False):
    """Consumer: the ``count``-th item its producer published (waits for it; ``take_item`` reads the rest)."""
    buf, phase = bufidx_phase(count, ITEM_BUFFERS)
    tlx.barrier_wait(fulls[buf], phase)
    return _get(ring, buf * (ITEM_FIELDS + WINDOW_FIELDS * WINDOW) + F_ITEM)


@triton.jit
def take_item(ring, empties, count, cid: tl.constexpr, WINDOW: tl.constexpr = False):
    """Consumer ``cid``: the rest of the ``count``-th published item (after ``peek_item``), then its slot
    handed back. Returns (head, m_start, len_q, len_k, out_row0, j0, n_blocks, n_bulk, lo, hi, rot), the
    last three 0 without WINDOW."""
    buf = count % ITEM_BUFFERS
    base = buf * (ITEM_FIELDS + WINDOW_FIELDS * WINDOW)
    head = _get(ring, base + F_HEAD)
    m_start = _get(ring, base + F_M_START)
    len_q = _get(ring, base + F_LEN_Q)
    len_k = _get(ring, base + F_LEN_K)
    out_row0 = _get(ring, base + F_OUT_ROW).to(tl.int64)
    j0 = _get(ring, base + F_J0)
    n_blocks = _get(ring, base + F_N_BLOCKS)
    n_bulk = _get(ring, base + F_N_BULK + cid)
    lo, hi, rot = 0, 0, 0  # (Python ints: folded away where there is no window)
    if WINDOW:
        lo = _get(ring, base + F_LO)
        hi = _get(ring, base + F_HI)
        rot = _get(ring, base + F_ROT)
    tlx.barrier_arrive(empties[buf], 1)
    return head, m_start, len_q, len_k, out_row0, j0, n_blocks, n_bulk, lo, hi, rot
