"""The key-side view of block lists in one Triton launch (portable: the CPU interpreter runs it unchanged).

:func:`transpose_lists` returns exactly what :func:`jfa.kernels.block_lists.transpose_reference` returns (the same
``offsets``, the same ``indices`` up to ``offsets[-1]``, past it anything), with one kernel launch and two
allocations instead of ~35 small torch ops (a sort over every entry among them); no host sync.

Column ``c = h * num_kv_slots + gk`` lists, ascending, the local query blocks ``t`` of the key block's
sequence ``b`` whose row ``h * num_q_slots + qb_off[b] + t`` holds the key block's local index ``u``. Its
start needs no separate count pass and prefix sum. With rows in (head, query block slot) order and sequences
in slot order, the entries before column ``c`` in the transposed order are

- every entry of the rows before ``h * num_q_slots + qb_off[b]`` (earlier heads, or earlier sequences of
  head ``h``, whose key block slots all come before ``gk``): ``offsets[h * num_q_slots + qb_off[b]]``;
- plus the entries ``< u`` of the rows of ``(h, b)``: in a sorted row that is the lower bound of ``u``,
  the same binary search that tells whether the row holds ``u``.

So one program per (block of ``BLOCK_C`` key block slots, head) binary-searches ``u`` in every row of its
sequence (``BLOCK_T`` rows at a time), writes its columns' starts, and writes the hits at the start plus
their prefix count along the rows: ascending query block order. A spare key block slot (sequence
``num_seqs``) has no rows and starts at ``offsets[h * num_q_slots + NQB]``, the end of head ``h``. Work per
(head, sequence): ``NQB_b * NKB_b`` searches of ``log2(row length + 1)`` steps (twice for a sequence with
more than ``BLOCK_T`` query blocks: one pass for the starts, one for the writes), plus, per program, two
binary searches of the query tile list for ``qb_off[b]`` and ``qb_off[b + 1]``.

Preconditions (those of :class:`jfa.kernels.block_lists.BlockLists`, which the torch version also relies on
for its meaning): ``offsets[0] == 0``, non-decreasing; rows strictly ascending, each index in
``[0, ceil(Lk_b / bs))``; rows of spare query slots empty; ``q_blocks`` the unsorted (sequence order) tile
list of the output rows, so slot ``g`` of sequence ``b`` is query block ``g - qb_off[b]`` (written as such,
not read from ``tiles[1]``). Lists cut at their capacity (``offsets[-1] > indices.numel()``, a too-small
``max_seqlen_k``) transpose the entries that exist, as in the torch version: every row range is clamped to
the capacity.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.block_lists import BlockLists, Transposed, key_blocks
from jfa.kernels.launch import launch
from jfa.kernels.schedule import TileList

_BLOCK_C = 32  # key block slots per program
_BLOCK_T = 32  # query block rows per step


@triton.jit
def _lower_bound(BASE, lo, n, value):
    """Per lane, the first position ``p`` in ``[lo, lo + n)`` with ``BASE[p] >= value`` (``lo + n`` if none),
    over a range sorted ascending; ``n == 0`` lanes stay at ``lo`` and load nothing."""
    while tl.max(n) > 0:
        half = n // 2
        mid = lo + half
        v = tl.load(BASE + mid, mask=n > 0, other=0)
        go = (n > 0) & (v < value)
        lo = tl.where(go, mid + 1, lo)
        n = tl.where(go, n - half - 1, half)
    return lo


@triton.jit
def _probe(OFFSETS, INDICES, row0, u, n_rows, t0, capacity, BLOCK_T: tl.constexpr):
    """For rows ``t0 .. t0 + BLOCK_T - 1`` of each column's sequence: ``(less, hit, t)``, the entries ``< u``
    of the row and whether it holds ``u`` (``[BLOCK_C, BLOCK_T]``), and the local query block ``t``."""
    t = t0 + tl.arange(0, BLOCK_T)
    active = t[None, :] < n_rows[:, None]
    r = row0[:, None] + t[None, :]
    lo = tl.minimum(tl.load(OFFSETS + r, mask=active, other=0).to(tl.int64), capacity)
    hi = tl.minimum(tl.load(OFFSETS + r + 1, mask=active, other=0).to(tl.int64), capacity)
    hi = tl.maximum(hi, lo)
    p = _lower_bound(INDICES, lo, hi - lo, u[:, None])
    inside = active & (p < hi)
    hit = inside & (tl.load(INDICES + p, mask=inside, other=-1) == u[:, None])
    return p - lo, hit, t


@triton.jit(do_not_specialize=["num_rows", "num_cols", "num_q_slots", "num_kv_slots", "num_seqs", "capacity"])
def _transpose_kernel(OFFSETS, INDICES, Q_TILES, K_TILES, T_OFFSETS, T_INDICES,
                      num_rows, num_cols, num_q_slots, num_kv_slots, num_seqs, capacity,
                      BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    """Columns ``head * num_kv_slots + gk`` for the ``BLOCK_C`` key block slots ``gk`` of ``program_id(0)``
    and the head ``program_id(1)``: their starts in ``T_OFFSETS`` and their query blocks in ``T_INDICES``
    (``num_rows``, ``num_cols``: the heads times the query, the key block slots)."""
    pid = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    if (pid == 0) & (head == 0):  # the end of the last column: every entry that exists
        total = tl.load(OFFSETS + num_rows).to(tl.int64)
        tl.store(T_OFFSETS + num_cols, tl.minimum(total, capacity).to(tl.int32))
    gk = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    in_range = gk < num_kv_slots
    seq = tl.load(K_TILES + gk, mask=in_range, other=num_seqs)
    u = tl.load(K_TILES + num_kv_slots + gk, mask=in_range, other=0)
    # the sequence's query block slots [q_lo, q_hi): slots are in sequence order, spare ones hold num_seqs
    zero = tl.zeros([BLOCK_C], dtype=tl.int64)
    q_lo = _lower_bound(Q_TILES, zero, zero + num_q_slots, seq)
    q_hi = _lower_bound(Q_TILES, q_lo, num_q_slots - q_lo, seq + 1)
    n_rows = tl.where(in_range & (seq < num_seqs), q_hi - q_lo, 0)
    row0 = head * num_q_slots + q_lo
    base = tl.minimum(tl.load(OFFSETS + row0, mask=in_range, other=0).to(tl.int64), capacity)
    col = head * num_kv_slots + gk
    n_max = tl.max(n_rows).to(tl.int32)
    if n_max <= BLOCK_T:  # every column's rows in one step: search once
        less, hit, t = _probe(OFFSETS, INDICES, row0, u, n_rows, 0, capacity, BLOCK_T)
        start = base + tl.sum(less, 1)
        tl.store(T_OFFSETS + col, start.to(tl.int32), mask=in_range)
        h = hit.to(tl.int64)
        dest = start[:, None] + tl.cumsum(h, 1) - h
        tl.store(T_INDICES + dest, tl.broadcast_to(t[None, :], [BLOCK_C, BLOCK_T]), mask=hit)
    else:  # one pass for the starts, one for the writes
        start = base
        for t0 in range(0, n_max, BLOCK_T):
            less, hit, t = _probe(OFFSETS, INDICES, row0, u, n_rows, t0, capacity, BLOCK_T)
            start += tl.sum(less, 1)
        tl.store(T_OFFSETS + col, start.to(tl.int32), mask=in_range)
        for t0 in range(0, n_max, BLOCK_T):
            less, hit, t = _probe(OFFSETS, INDICES, row0, u, n_rows, t0, capacity, BLOCK_T)
            h = hit.to(tl.int64)
            dest = start[:, None] + tl.cumsum(h, 1) - h
            tl.store(T_INDICES + dest, tl.broadcast_to(t[None, :], [BLOCK_C, BLOCK_T]), mask=hit)
            start += tl.sum(h, 1)


def transpose_lists(lists: BlockLists, q_blocks: TileList, cu_k: torch.Tensor, total_k: int) -> Transposed:
    """The key-side view of ``lists`` (:class:`jfa.kernels.block_lists.Transposed`), identical to
    :func:`jfa.kernels.block_lists.transpose_reference`, in one launch and without a host sync (module docstring).
    ``q_blocks``: :func:`jfa.kernels.block_lists.query_blocks` of the same batch."""
    bs, heads, nqs = lists.block_size, lists.num_heads, lists.num_q_slots
    k_blocks = key_blocks(cu_k, total_k, bs)  # cached per cu_k: the backward builds it anyway
    nks = k_blocks.num_slots
    device = lists.offsets.device
    capacity = lists.indices.numel()
    # inside alloc.poisoned_outputs the outputs start as -1, so an entry the kernel should have written and
    # did not shows up
    new = ((lambda n: torch.full((n,), -1, dtype=torch.int32, device=device)) if alloc.poisoning()
           else (lambda n: torch.empty(n, dtype=torch.int32, device=device)))
    indices = new(capacity)
    if heads * nks == 0:  # no sequence (so no query block slot either) or no head: nothing is listed
        return Transposed(torch.zeros(1, dtype=torch.int32, device=device), indices, nks)
    if q_blocks.num_slots != nqs or k_blocks.num_seqs != q_blocks.num_seqs:
        raise ValueError(f"transpose_lists: q_blocks ({q_blocks.num_slots} slots, {q_blocks.num_seqs} sequences) "
                         f"does not match the lists ({nqs} slots) and cu_k ({k_blocks.num_seqs} sequences)")
    src_offsets, src_indices = lists.offsets.contiguous(), lists.indices.contiguous()  # no-ops here
    if src_offsets.dtype != torch.int32 or src_indices.dtype != torch.int32:
        raise TypeError("transpose_lists: block lists must be int32")
    offsets = new(heads * nks + 1)
    launch(
        _transpose_kernel, (triton.cdiv(nks, _BLOCK_C), heads), src_offsets, src_indices, q_blocks.tiles, k_blocks.tiles, offsets, indices,
        heads * nqs, heads * nks, nqs, nks, k_blocks.num_seqs, capacity,
        BLOCK_C=_BLOCK_C, BLOCK_T=_BLOCK_T, num_warps=4)
    return Transposed(offsets, indices, nks)
