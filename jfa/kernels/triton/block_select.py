"""Block selection for block-sparse jagged attention (portable Triton; the CPU interpreter runs it
unchanged): which key blocks each (query block, head) visits, as CSR lists built on the device with
no host sync.

Semantics:

- Packed tensors ``q`` ``[total_q, H, D]``, ``k`` ``[total_k, H_kv, D]`` (``H % H_kv == 0``; query head
  ``h`` reads kv head ``h // (H // H_kv)``), offsets ``cu_q``, ``cu_k`` ``[B+1]``. ``broadcast_q=True``:
  ``q`` is ``[Lq, H, D]`` shared by all ``B`` sequences, ``cu_q`` is None, and the Q blocks of sequence
  ``b`` are those of the ``Lq`` rows of ``q`` (output rows ``b*Lq + i``).
- ``block_size`` ``bs``: a power of two, 16..256. Q block ``t`` of sequence ``b`` is rows
  ``[t*bs, min((t+1)*bs, Lq_b))``; K block ``u`` is keys ``[u*bs, min((u+1)*bs, Lk_b))``. Blocks never
  straddle sequences.
- Global Q block numbering: ``g = qb_off[b] + t``, ``qb_off`` the exclusive prefix sum of
  ``ceil(Lq_b/bs)`` (for ``broadcast_q``, ``qb_off[b] = b * ceil(Lq/bs)``): slot ``g`` of the unsorted
  tile list of the output rows. Rows of the lists are ``r = h * num_q_slots + g``.
- Pooling: ``qsum`` is the sum of the block's q rows (``n_q`` real rows), ``ksum`` likewise for a K
  block (``n_k`` real rows), accumulated in float32. ``score(t, u) = dot(qsum_t, ksum_u) / n_k(u)`` in
  float32 (the division correctly rounded): the mean-pooled score times ``n_q(t)``, a positive factor
  common to the whole row, so dividing by ``n_q`` would not change the ranking and is left out.
- Candidates. Causal (bottom-right aligned, ``shift = Lk - Lq``; row ``i`` sees keys ``j <= i + shift``):
  the candidates of Q block ``t`` are the K blocks ``u`` with ``u*bs <= i_last + shift`` (``i_last`` the
  block's last row), so a block wholly in the causal future is never kept. Forced blocks: every K block
  holding a diagonal key ``i + shift >= 0`` of a row ``i`` of the Q block (at most 2 blocks) is always
  kept, so every row that sees any key keeps its own diagonal key. Non-causal: the candidates are all K
  blocks of the sequence, none forced. ``Lk = 0`` or no candidate: the list is empty.
- Budget per row: ``topk=k`` (>= 1) gives ``min(k, n_candidates)``; ``keep_ratio=r`` in ``(0, 1]`` gives
  ``ceil(r * n_candidates)``, the product taken in float64 (``r = 1`` keeps every candidate: dense).
  Exactly one of the two. The list is the forced blocks plus the highest-scoring non-forced candidates
  up to the budget (more forced blocks than budget: the forced alone); its length,
  ``max(n_forced, min(budget, n_candidates))``, depends on the shapes only.
- Ranking: higher score first, ties to the lower block index. A NaN score (from a NaN or an overflowing
  input) ranks below every number, ``-inf`` included; NaN scores tie among themselves (lower index
  first). ``-0.0`` and ``+0.0`` are equal scores.
- Output: :class:`jfa.kernels.block_lists.BlockLists`: int32 ``offsets`` ``[H * num_q_slots + 1]`` with
  ``num_q_slots = num_tile_slots(total_rows_q, B, bs)`` rows per head (rows ``g >= NQB`` empty), int32
  ``indices`` (local K block indices, ascending within each row), spare capacity past ``offsets[-1]``
  left unwritten. Capacity (:func:`index_capacity`, from shapes and the ``max_seqlen_k`` bound alone):
  ``H * num_q_slots * min(K, max(budget(K), 2 if causal else 0))`` with ``K = ceil(max_seqlen_k / bs)``
  (``budget(K)``: ``min(topk, K)`` or ``ceil(keep_ratio * K)``); for a broadcast Q also at most
  ``H * ceil(Lq / bs) * num_tile_slots(total_k, B, bs)``.

The NumPy oracle of these lists is ``jfa.oracle.block_select``; on inputs whose block sums and dots are
exact in float32 (small integers) the lists are identical, and otherwise differ only where two scores
are within float32 rounding of each other.

One call is four launches and a device-side cumsum, never a host sync (``n``: a Q block's candidates,
``D``: head dim):

1. :func:`_pool_kernel`, once for Q and once for K: one program per (block, head) sums the block's rows
   in float32, so q and k are read once and each pooled block is computed once.
2. :func:`_count_kernel`: per Q block, the list length from the lengths alone (the same for every
   head); a cumsum turns the lengths into ``offsets``.
3. :func:`_select_kernel`: one program per (Q block, head) ranks its candidates by rank counting, in
   chunks of ``CHUNK`` blocks: a non-forced candidate is kept iff fewer than the remaining budget of the
   other non-forced candidates beat it (higher score, or an equal one and a lower index). That order is
   strict and total, so exactly the budget is kept, deterministically, and the kept blocks are written
   in ascending order at their prefix-sum positions. Cost per (Q block, head): ``O(n)`` writes and no
   score when the row keeps every candidate or only the forced ones; otherwise ``n * D * (1 + n / CHUNK)``
   multiply-adds (the scores of the inner chunks recomputed from the pooled blocks, which stay in L2)
   plus ``n^2`` comparisons. At D = 128 that is about ``3 n^2 + 128 n`` operations.

Scores must be bit-identical however often a program recomputes them, or the rank counting could keep
more or fewer blocks than the budget: each dot runs over the dims in order, elementwise per block (no
cross-lane reduction whose order the layout would pick), the kernel is compiled without floating-point
contraction (``enable_fp_fusion=False``), and its writes never leave a row's range whatever happens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.block_lists import BlockLists, query_blocks
from jfa.kernels.cache import IdentityCache
from jfa.kernels.launch import launch
from jfa.kernels.schedule import build_tile_list, num_tile_slots, output_offsets, virtual_cu_seqlens
from jfa.kernels.triton.configs import padded_head_dim
from jfa.kernels.triton.forward import _seq_bounds

MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 16, 256
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PoolConfig:
    """The pooling kernel's launch: rows summed per step, heads per program (at most; fewer when the
    tensor has fewer), warps."""

    rows: int
    heads: int
    warps: int


# 64 rows a step, 4 heads a program: q and k pooled at 3.0-3.5 TB/s (longtail 146 us, full-B8 88 us against 183
# and 127 at 16 rows, 1 head; among the fastest of POOL_CANDIDATES on both shapes on the H200, NOTES.md session 20)
POOL = PoolConfig(rows=64, heads=4, warps=4)
# the launches ``python -m jfa.bench.sparse --pool-sweep`` times and the tests check
POOL_CANDIDATES = tuple(PoolConfig(rows, heads, warps) for rows in (16, 32, 64) for heads in (1, 2, 4)
                        for warps in (4, 8))
_COUNT_BLOCK = 128  # Q blocks per program of the count kernel
_CHUNK = 64  # K blocks per step of the scoring kernel (fewer when no sequence has that many)


@triton.jit
def _pool_kernel(X, POOL, CU, TILES, stride_t, stride_h, num_slots, num_seqs, num_heads,
                 HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                 HEADS: tl.constexpr):
    """``POOL[h, d, slot]`` = float32 sum over the rows of block ``slot`` of head ``h`` (slots innermost:
    the scoring kernel reads one dim of consecutive blocks at a time), ``HEADS`` heads per program."""
    slot = tl.program_id(0)
    head0 = tl.program_id(1) * HEADS
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:  # a spare slot of the tile list: never read
        return
    tile = tl.load(TILES + num_slots + slot)
    row0 = tl.load(CU + seq).to(tl.int64)
    length = (tl.load(CU + seq + 1).to(tl.int64) - row0).to(tl.int32)
    start = tile * BLOCK
    n_rows = tl.minimum(length - start, BLOCK)
    offs_r = tl.arange(0, ROWS)
    offs_c = tl.arange(0, HEADS * BLOCK_D)  # (head, dim) columns of the program
    head = head0 + offs_c // BLOCK_D
    dim = offs_c % BLOCK_D
    col_ok = (head < num_heads) & (dim < HEAD_DIM)
    base = X + (row0 + start) * stride_t
    cols = head.to(tl.int64) * stride_h + dim
    acc = tl.zeros([HEADS * BLOCK_D], dtype=tl.float32)
    for r0 in range(0, n_rows, ROWS):
        rows = r0 + offs_r
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        x = tl.load(base + rows.to(tl.int64)[:, None] * stride_t + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(x.to(tl.float32), 0)
    out = POOL + (head.to(tl.int64) * HEAD_DIM + dim) * num_slots + slot
    tl.store(out, acc, mask=col_ok)


@triton.jit
def _row_plan(tile, len_q, len_k, topk, ratio, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
              USE_RATIO: tl.constexpr):
    """``(n_cand, f_lo, f_hi, count)`` of Q block ``tile``: candidates ``0 .. n_cand-1``, forced blocks
    ``f_lo .. f_hi`` (empty when ``f_hi < f_lo``), list length ``count``. Elementwise: scalars or blocks."""
    if CAUSAL:
        i_last = tl.minimum((tile + 1) * BLOCK, len_q) - 1
        shift = len_k - len_q
        j_hi = i_last + shift  # the last row's diagonal key (<= len_k - 1)
        j_lo = tl.maximum(tile * BLOCK + shift, 0)
        sees = j_hi >= 0
        # floor divisions of non-negative values only (C and NumPy disagree on negative ones)
        hi_block = tl.where(sees, j_hi, 0) // BLOCK
        n_cand = tl.where(sees, hi_block + 1, 0)
        f_lo = j_lo // BLOCK
        f_hi = tl.where(sees, hi_block, -1)
    else:
        n_cand = (len_k + BLOCK - 1) // BLOCK
        f_lo = tl.zeros_like(n_cand)
        f_hi = f_lo - 1
    n_forced = tl.maximum(f_hi - f_lo + 1, 0)
    if USE_RATIO:
        budget = tl.math.ceil(n_cand.to(tl.float64) * ratio).to(tl.int32)
    else:
        budget = tl.minimum(n_cand, topk)
    count = tl.maximum(n_forced, tl.minimum(budget, n_cand))
    return n_cand, f_lo, f_hi, count


@triton.jit
def _load_ratio(RATIO, USE_RATIO: tl.constexpr):
    if USE_RATIO:
        ratio = tl.load(RATIO)
    else:
        ratio = 0.0
    return ratio


@triton.jit(do_not_specialize=["num_slots", "num_seqs", "len_q_bcast", "topk"])
def _count_kernel(CU_Q, CU_K, TILES, COUNTS, RATIO, num_slots, num_seqs, len_q_bcast, topk,
                  BLOCK: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, USE_RATIO: tl.constexpr,
                  BLOCK_G: tl.constexpr):
    """``COUNTS[g]``: the list length of Q block slot ``g`` (0 for spare slots)."""
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    in_range = g < num_slots
    seq = tl.load(TILES + g, mask=in_range, other=num_seqs)
    real = seq < num_seqs
    seq = tl.where(real, seq, 0)
    tile = tl.load(TILES + num_slots + g, mask=in_range & real, other=0)
    _, _, len_q, _, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    _, _, _, count = _row_plan(tile, len_q, len_k, topk, _load_ratio(RATIO, USE_RATIO), BLOCK, CAUSAL, USE_RATIO)
    tl.store(COUNTS + g, tl.where(real, count, 0), mask=in_range)


@triton.jit
def _scores(QSUM, q_stride, KSUM, k_stride, u, valid, len_k, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
            CHUNK: tl.constexpr):
    """float32 ``dot(qsum, ksum_u) / n_k(u)`` for the K blocks ``u`` (0 where not ``valid``); ``QSUM``,
    ``KSUM``: dim 0 of the pooled Q block and of K block 0, dims ``q_stride`` / ``k_stride`` apart. The dot
    runs over the dims in order, elementwise per block: its rounding depends on nothing but the block,
    not on the tile it is computed in or the layout the compiler picks."""
    dot = tl.zeros([CHUNK], dtype=tl.float32)
    k_ptrs = KSUM + u
    for _ in range(HEAD_DIM):
        q_d = tl.load(QSUM)
        k_d = tl.load(k_ptrs, mask=valid, other=0.0)
        dot = dot + k_d * q_d
        QSUM += q_stride
        k_ptrs += k_stride
    n_k = tl.where(valid, tl.minimum(len_k - u * BLOCK, BLOCK), 1)
    return tl.math.div_rn(dot, n_k.to(tl.float32))


@triton.jit
def _scores_at_once(QSUM, q_stride, KSUM, k_stride, u, valid, len_k, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
    """The scores of :func:`_scores` with the dims loaded as one tile and summed by a reduction: for a row
    whose candidates fit one chunk, computed once (no recomputation to agree with bit for bit)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(QSUM + offs_d * q_stride, mask=d_ok, other=0.0)
    k = tl.load(KSUM + offs_d[:, None] * k_stride + u[None, :], mask=d_ok[:, None] & valid[None, :], other=0.0)
    dot = tl.sum(q[:, None] * k, 0)
    n_k = tl.where(valid, tl.minimum(len_k - u * BLOCK, BLOCK), 1)
    return tl.math.div_rn(dot, n_k.to(tl.float32))


@triton.jit
def _beats(s_v, v, s_u, u):
    """Block ``v`` ranks before block ``u``: a higher score, or an equal one and a lower index; a NaN
    ranks below every number and ties with another NaN."""
    nan_u = s_u != s_u
    nan_v = s_v != s_v
    tie = (s_v == s_u) | (nan_u & nan_v)
    return (s_v > s_u) | (tie & (v < u)) | (nan_u & (s_v == s_v))


@triton.jit(do_not_specialize=["num_slots", "num_qpool", "num_kpool", "num_seqs", "len_q_bcast", "topk",
                               "capacity"])
def _select_kernel(QPOOL, KPOOL, CU_Q, CU_K, KB_START, TILES, OFFSETS, INDICES, RATIO,
                   num_slots, num_qpool, num_kpool, num_seqs, group, len_q_bcast, topk, capacity,
                   HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
                   USE_RATIO: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    """The list of (Q block slot ``program_id(0)``, head ``program_id(1)``), by rank counting. A row whose
    candidates fit one chunk scores them once, as one tile; longer rows score chunk by chunk, the inner
    chunks' scores recomputed by the dim-ordered ``_scores`` (bitwise the outer ones')."""
    slot = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:  # a spare slot: its rows are empty
        return
    tile = tl.load(TILES + num_slots + slot)
    _, _, len_q, _, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    n_cand, f_lo, f_hi, count = _row_plan(tile, len_q, len_k, topk, _load_ratio(RATIO, USE_RATIO), BLOCK, CAUSAL,
                                          USE_RATIO)
    if count == 0:
        return
    n_forced = tl.maximum(f_hi - f_lo + 1, 0)
    budget = count - n_forced  # for the non-forced candidates
    n_free = n_cand - n_forced
    rank = (budget > 0) & (budget < n_free)  # otherwise all candidates, or the forced alone
    take_all = budget >= n_free

    row = head.to(tl.int64) * num_slots + slot
    first = tl.load(OFFSETS + row).to(tl.int64)
    q_slot = tile if BROADCAST_Q else slot
    qsum = QPOOL + head.to(tl.int64) * HEAD_DIM * num_qpool + q_slot
    kv_head = head // group
    ksum = KPOOL + kv_head.to(tl.int64) * HEAD_DIM * num_kpool + tl.load(KB_START + seq)
    offs_c = tl.arange(0, CHUNK)

    written = tl.zeros((), dtype=tl.int32)
    if n_cand <= CHUNK:
        u = offs_c
        in_u = u < n_cand
        forced_u = (u >= f_lo) & (u <= f_hi)
        keep = in_u & (forced_u | take_all)
        if rank:
            s_u = _scores_at_once(qsum, num_qpool, ksum, num_kpool, u, in_u, len_k, HEAD_DIM, BLOCK_D, BLOCK)
            free_u = in_u & ((u < f_lo) | (u > f_hi))
            wins = _beats(s_u[None, :], u[None, :], s_u[:, None], u[:, None]) & free_u[None, :]
            keep = in_u & (forced_u | (tl.sum(wins.to(tl.int32), 1) < budget))
        kept = keep.to(tl.int32)
        dest = first + tl.cumsum(kept, 0) - kept
        tl.store(INDICES + dest, u, mask=keep & (dest < capacity))
        return
    for c0 in range(0, n_cand, CHUNK):
        u = c0 + offs_c
        in_u = u < n_cand
        forced_u = (u >= f_lo) & (u <= f_hi)
        keep = in_u & (forced_u | take_all)
        if rank:
            s_u = _scores(qsum, num_qpool, ksum, num_kpool, u, in_u, len_k, HEAD_DIM, BLOCK, CHUNK)
            beaten = tl.zeros([CHUNK], dtype=tl.int32)
            for c1 in range(0, n_cand, CHUNK):
                v = c1 + offs_c
                in_v = v < n_cand
                s_v = _scores(qsum, num_qpool, ksum, num_kpool, v, in_v, len_k, HEAD_DIM, BLOCK, CHUNK)
                free_v = in_v & ((v < f_lo) | (v > f_hi))
                wins = _beats(s_v[None, :], v[None, :], s_u[:, None], u[:, None]) & free_v[None, :]
                beaten += tl.sum(wins.to(tl.int32), 1)
            keep = in_u & (forced_u | (beaten < budget))
        kept = keep.to(tl.int32)
        pos = written + tl.cumsum(kept, 0) - kept
        dest = first + pos
        tl.store(INDICES + dest, u, mask=keep & (pos < count) & (dest < capacity))
        written += tl.sum(kept, 0)


def max_blocks_per_row(max_seqlen_k: int, block_size: int, *, topk=None, keep_ratio=None,
                       causal: bool = False) -> int:
    """An upper bound on any list's length: ``min(K, max(budget(K), 2 if causal else 0))`` with
    ``K = ceil(max_seqlen_k / bs)`` (the budget grows with the candidate count, forced blocks are at most 2)."""
    kmax = -(-max_seqlen_k // block_size)
    budget = min(int(topk), kmax) if topk is not None else math.ceil(float(keep_ratio) * kmax)
    return min(kmax, max(budget, 2 if causal else 0))


def index_capacity(total_rows_q: int, total_k: int, num_seqs: int, num_heads: int, block_size: int,
                   max_seqlen_k: int, *, topk=None, keep_ratio=None, causal: bool = False,
                   broadcast_q: bool = False, len_q: int = 0) -> int:
    """The ``indices`` entries :func:`select_kv_blocks` allocates, from shapes and the ``max_seqlen_k``
    bound only: ``H * num_q_slots * max_blocks_per_row``; for a broadcast Q also at most
    ``H * ceil(Lq / bs) * num_tile_slots(total_k, B, bs)`` (every sequence has the same Q blocks and a row
    lists at most its sequence's K blocks)."""
    slots = num_tile_slots(total_rows_q, num_seqs, block_size)
    per_row = max_blocks_per_row(max_seqlen_k, block_size, topk=topk, keep_ratio=keep_ratio, causal=causal)
    capacity = num_heads * slots * per_row
    if broadcast_q:
        capacity = min(capacity, num_heads * -(-len_q // block_size) * num_tile_slots(total_k, num_seqs, block_size))
    return capacity


def _check_args(q, k, cu_q, block_size, topk, keep_ratio, broadcast_q, max_seqlen_k):
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q, k: expected [rows, heads, D] tensors, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[2] != k.shape[2] or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q, k: head dims must match and q's heads be a multiple of k's, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size: expected an int, got {type(block_size).__name__}")
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(f"block_size: must be a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}], "
                         f"got {block_size}")
    if (topk is None) == (keep_ratio is None):
        raise ValueError("topk, keep_ratio: give exactly one of the two")
    if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
        raise ValueError(f"topk: must be an int >= 1, got {topk!r}")
    if keep_ratio is not None and not 0.0 < float(keep_ratio) <= 1.0:
        raise ValueError(f"keep_ratio: must be in (0, 1], got {keep_ratio!r}")
    if (cu_q is None) != broadcast_q:
        raise ValueError("cu_q: must be None exactly when broadcast_q=True")
    if isinstance(max_seqlen_k, bool) or not isinstance(max_seqlen_k, int) or max_seqlen_k < 0:
        raise ValueError(f"max_seqlen_k: must be an int >= 0 (a bound on every key sequence), got {max_seqlen_k!r}")


def select_kv_blocks(q: torch.Tensor, k: torch.Tensor, cu_q, cu_k: torch.Tensor, *, block_size: int, topk=None,
                     keep_ratio=None, causal: bool = False, broadcast_q: bool = False, len_q=None,
                     max_seqlen_k: int) -> BlockLists:
    """The lists of the module docstring, on q's device, with no host sync. ``len_q``: the broadcast Q's
    rows (default ``q.shape[0]``; ignored otherwise). ``max_seqlen_k`` must bound every key sequence
    (it sizes ``indices``: :func:`index_capacity`; with a smaller one, lists past the capacity are cut)."""
    _check_args(q, k, cu_q, block_size, topk, keep_ratio, broadcast_q, max_seqlen_k)
    device = q.device
    bs = block_size
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_seqs = cu_k.numel() - 1
    len_q_bcast = (q.shape[0] if len_q is None else int(len_q)) if broadcast_q else 0
    if broadcast_q and len_q_bcast != q.shape[0]:
        raise ValueError(f"len_q: {len_q_bcast} != the broadcast Q's rows {q.shape[0]}")
    rows = num_seqs * len_q_bcast if broadcast_q else q.shape[0]
    total_k = k.shape[0]
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, device)
    q_tiles = query_blocks(out_cu, rows, bs)
    slots = q_tiles.num_slots
    capacity = index_capacity(rows, total_k, num_seqs, num_heads, bs, max_seqlen_k, topk=topk,
                              keep_ratio=keep_ratio, causal=causal, broadcast_q=broadcast_q, len_q=len_q_bcast)
    if max(capacity, num_heads * slots + 1) > _INT32_MAX:
        raise ValueError(f"block lists of {capacity} entries do not fit int32 offsets: use a larger block_size")
    # spare capacity stays unwritten; inside alloc.poisoned_outputs it holds -1, so an entry the kernel
    # should have written and did not shows up
    indices = (torch.full((capacity,), -1, dtype=torch.int32, device=device) if alloc.poisoning()
               else torch.empty(capacity, dtype=torch.int32, device=device))
    if slots == 0 or num_heads == 0 or total_k == 0:  # no Q block, or no key anywhere: every row is empty
        return BlockLists(torch.zeros(num_heads * slots + 1, dtype=torch.int32, device=device), indices, bs,
                          num_heads, slots, causal)

    use_ratio = keep_ratio is not None
    topk_arg = min(int(topk), _INT32_MAX) if topk is not None else 0
    block_d = padded_head_dim(head_dim)
    common = dict(BLOCK=bs, CAUSAL=bool(causal), BROADCAST_Q=bool(broadcast_q), USE_RATIO=use_ratio)
    plan = _plans.get_or_build(
        (out_cu, cu_k), (bs, num_heads, slots, topk_arg, keep_ratio, causal, broadcast_q, len_q_bcast),
        lambda: _plan(out_cu, cu_k, q_tiles, num_heads, slots, num_seqs, len_q_bcast, topk_arg, keep_ratio, common))
    offsets, ratio, kb_start = plan
    lists = BlockLists(offsets, indices, bs, num_heads, slots, causal)

    # pooled blocks: [heads, D, block slots] float32, each block's rows summed once
    if broadcast_q:
        q_cu = virtual_cu_seqlens(1, len_q_bcast, device)
        q_pool_tiles = build_tile_list(q_cu, len_q_bcast, bs)
    else:
        q_cu, q_pool_tiles = cu_q, q_tiles
    k_tiles = build_tile_list(cu_k, total_k, bs)
    qpool = pool_blocks(q, q_cu, q_pool_tiles, bs, block_d)
    kpool = pool_blocks(k, cu_k, k_tiles, bs, block_d)
    kmax = -(-max_seqlen_k // bs)
    chunk = min(max(16, triton.next_power_of_2(max(kmax, 1))), _CHUNK)
    launch(
        _select_kernel, (slots, num_heads), qpool, kpool, out_cu, cu_k, kb_start, q_tiles.tiles, offsets, indices, ratio,
        slots, q_pool_tiles.num_slots, k_tiles.num_slots, num_seqs, num_heads // k.shape[1], len_q_bcast, topk_arg,
        capacity, HEAD_DIM=head_dim, CHUNK=chunk, BLOCK_D=block_d, **common, num_warps=4, enable_fp_fusion=False)
    return lists


# per (offsets, rule): the list offsets, which follow from the lengths and the rule alone (a model's layers
# share the offsets, so one build per batch instead of ~10 small device ops per call)
_plans = IdentityCache()


def _plan(out_cu, cu_k, q_tiles, num_heads: int, slots: int, num_seqs: int, len_q_bcast: int, topk_arg: int,
          keep_ratio, common: dict) -> tuple:
    """(offsets int32 [H * slots + 1], the keep ratio as a float64 device scalar, the first key block slot of
    each sequence int64 [B]) of a selection."""
    device = cu_k.device
    ratio = torch.full((1,), float(keep_ratio) if keep_ratio is not None else 0.0, dtype=torch.float64,
                       device=device)
    counts = torch.empty(slots, dtype=torch.int32, device=device)
    launch(
        _count_kernel, (triton.cdiv(slots, _COUNT_BLOCK),), out_cu, cu_k, q_tiles.tiles, counts, ratio, slots, num_seqs, len_q_bcast, topk_arg,
        BLOCK_G=_COUNT_BLOCK, **common)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)  # per head; heads follow one another
    head_base = torch.arange(num_heads, dtype=torch.int32, device=device)[:, None] * ends[-1:]
    offsets = torch.zeros(num_heads * slots + 1, dtype=torch.int32, device=device)
    offsets[1:] = (head_base + ends[None, :]).reshape(-1)
    bs = common["BLOCK"]
    ck = cu_k.to(torch.int64)
    kb_per_seq = (ck[1:] - ck[:-1] + bs - 1) // bs
    kb_start = torch.cumsum(kb_per_seq, 0) - kb_per_seq
    return offsets, ratio, kb_start


def pool_blocks(x: torch.Tensor, cu: torch.Tensor, tiles, block_size: int, block_d: int,
                config: PoolConfig = None) -> torch.Tensor:
    """float32 ``[heads, D, slots]``: the row sums of every block of ``x`` (spare slots unwritten)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    heads = x.shape[1]
    config = config or POOL
    per_program = min(config.heads, triton.next_power_of_2(max(heads, 1)))
    pool = torch.empty((heads, x.shape[2], tiles.num_slots), dtype=torch.float32, device=x.device)
    if tiles.num_slots and heads:
        launch(
            _pool_kernel, (tiles.num_slots, triton.cdiv(heads, per_program)), x, pool, cu, tiles.tiles, x.stride(0), x.stride(1), tiles.num_slots, tiles.num_seqs, heads,
            HEAD_DIM=x.shape[2], BLOCK=block_size, ROWS=config.rows, BLOCK_D=block_d, HEADS=per_program,
            num_warps=config.warps)
    return pool
