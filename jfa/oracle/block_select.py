"""Block selection for block-sparse jagged attention: the NumPy oracle, which is the spec of the
device lists (``jfa.kernels.triton.block_select``), plus the rules user-given lists must satisfy.

Semantics:

- Packed tensors ``q`` ``[total_q, H, D]``, ``k`` ``[total_k, H_kv, D]`` (``H % H_kv == 0``; query head
  ``h`` reads kv head ``h // (H // H_kv)``), offsets ``cu_q``, ``cu_k`` ``[B+1]``. ``broadcast_q=True``:
  ``q`` is ``[Lq, H, D]`` shared by all ``B`` sequences, ``cu_q`` is None, and the Q blocks of sequence
  ``b`` are those of the ``Lq`` rows of ``q`` (output rows ``b*Lq + i``).
- ``block_size`` ``bs``: a power of two, 16..256. Q block ``t`` of sequence ``b`` is rows
  ``[t*bs, min((t+1)*bs, Lq_b))``; K block ``u`` is keys ``[u*bs, min((u+1)*bs, Lk_b))``. Blocks never
  straddle sequences.
- Global Q block numbering: ``g = qb_off[b] + t``, ``qb_off`` the exclusive prefix sum of
  ``ceil(Lq_b/bs)`` (for ``broadcast_q``, ``qb_off[b] = b * ceil(Lq/bs)``). ``NQB`` is the total number
  of Q blocks. Lists are rows ``r = h * NQB + g``.
- Pooling: ``qsum`` is the sum of the block's q rows (``n_q`` real rows), ``ksum`` likewise for a K
  block (``n_k`` real rows). ``score(t, u) = dot(qsum_t, ksum_u) / n_k(u)``: the mean-pooled score times
  ``n_q(t)``, a positive factor common to the whole row, so dividing by ``n_q`` would not change the
  ranking within a row and is left out. Device: float32 sums, dot and division (correctly rounded).
  Oracle: float64, then rounded to float32 (``np.float32``). With inputs whose block sums and dots are
  exact in float32 (small integers) the two are bit-identical: one correctly rounded division, double
  rounded through float64, equals the float32 division.
- Candidates. Causal (bottom-right aligned, ``shift = Lk - Lq``; row ``i`` sees keys ``j <= i + shift``):
  the candidates of Q block ``t`` are the K blocks ``u`` with ``u*bs <= i_last + shift`` (``i_last`` the
  block's last row), so a block wholly in the causal future is never kept. Forced blocks: every K block
  holding a diagonal key ``i + shift >= 0`` of a row ``i`` of the Q block (at most 2 blocks) is always
  kept, so every row that sees any key keeps its own diagonal key. Non-causal: the candidates are all K
  blocks of the sequence, none forced. ``Lk = 0`` or no candidate: the list is empty.
- Budget per row: ``topk=k`` (an integer >= 1) gives ``min(k, n_candidates)``; ``keep_ratio=r`` in
  ``(0, 1]`` gives ``ceil(r * n_candidates)``, the product taken in float64 (``r = 1`` keeps every
  candidate: dense). Exactly one of the two. The list is the forced blocks plus the highest-scoring
  non-forced candidates up to the budget (more forced blocks than budget: the forced alone), so its
  length is ``max(n_forced, min(budget, n_candidates))`` and depends on the shapes only, not on the
  scores.
- Ranking: higher score first, ties to the lower block index. A NaN score (from a NaN or an overflowing
  input) ranks below every number, ``-inf`` included; NaN scores tie among themselves (lower index
  first). ``-0.0`` and ``+0.0`` are equal scores.
- Output: CSR lists, int32 ``offsets`` ``[H * NQB + 1]`` and int32 ``indices`` (local K block indices
  within the sequence, ascending within each row). The device version keeps
  ``NQB_slots = num_tile_slots(total_rows_q, B, bs)`` rows per head (rows ``g >= NQB`` empty) and may
  leave spare capacity in ``indices`` past ``offsets[-1]``; :func:`pad_offsets` and
  :func:`compare_block_lists` put the exact lists here beside those.

User-given lists (``kv_blocks=``) follow the same layout; :func:`validate_kv_blocks` states their rules.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jfa.oracle.offsets import as_offsets

__all__ = ["QueryBlock", "query_blocks", "block_plan", "row_budget", "select_kv_blocks", "block_scores",
           "validate_kv_blocks", "kv_block_mask", "pad_offsets", "compare_block_lists"]

MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 16, 256


class QueryBlock(NamedTuple):
    """Q block ``tile`` of sequence ``seq``: its rows ``[start, stop)`` of that sequence (local rows;
    the packed output row is ``cu_out[seq] + start``)."""

    seq: int
    tile: int
    start: int
    stop: int


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_block_size(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_size: expected an int, got {type(block_size).__name__}")
    bs = int(block_size)
    if not (MIN_BLOCK_SIZE <= bs <= MAX_BLOCK_SIZE) or bs & (bs - 1):
        raise ValueError(f"block_size: must be a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}], got {bs}")
    return bs


def _lengths(cu_q, cu_k, broadcast_q: bool, len_q):
    """(query row starts, Lq per sequence, key row starts, Lk per sequence); broadcast rows start at 0."""
    ck = as_offsets(cu_k, "cu_k")
    num_seqs = ck.shape[0] - 1
    if broadcast_q:
        if cu_q is not None:
            raise ValueError("cu_q: must be None when broadcast_q=True (q is one dense sequence)")
        if len_q is None or int(len_q) < 0:
            raise ValueError(f"len_q: the broadcast Q's row count (>= 0) is required, got {len_q}")
        q0 = np.zeros(num_seqs, dtype=np.int64)
        lq = np.full(num_seqs, int(len_q), dtype=np.int64)
    else:
        if cu_q is None:
            raise ValueError("cu_q: required unless broadcast_q=True")
        cq = as_offsets(cu_q, "cu_q")
        if cq.shape != ck.shape:
            raise ValueError(f"cu_q, cu_k: must have the same length B+1, got {cq.shape[0]} and {ck.shape[0]}")
        q0, lq = cq[:-1], np.diff(cq)
    return q0, lq, ck[:-1], np.diff(ck)


def query_blocks(cu_q, block_size: int, broadcast_q: bool = False, num_seqs: int | None = None,
                 len_q: int | None = None) -> list[QueryBlock]:
    """Every Q block in global order ``g`` (``result[g]``). ``broadcast_q``: ``cu_q`` is None and the
    ``num_seqs`` sequences each own ``ceil(len_q / bs)`` blocks of the shared ``len_q`` rows."""
    bs = _check_block_size(block_size)
    if broadcast_q:
        if cu_q is not None:
            raise ValueError("cu_q: must be None when broadcast_q=True (q is one dense sequence)")
        if num_seqs is None or len_q is None:
            raise ValueError("num_seqs, len_q: both required when broadcast_q=True")
        lengths = [int(len_q)] * int(num_seqs)
    else:
        lengths = np.diff(as_offsets(cu_q, "cu_q")).tolist()
    return [QueryBlock(b, t, t * bs, min((t + 1) * bs, lq))
            for b, lq in enumerate(lengths) for t in range(_cdiv(lq, bs))]


def block_plan(tile: int, len_q: int, len_k: int, *, block_size: int, causal: bool) -> tuple[int, range]:
    """``(n_candidates, forced)`` of Q block ``tile`` of a sequence with lengths ``(len_q, len_k)``:
    the candidates are K blocks ``0 .. n_candidates-1``; ``forced`` (a range, at most 2 blocks, all
    candidates) must be kept whatever the scores."""
    bs = block_size
    nkb = _cdiv(len_k, bs)
    if not causal:
        return nkb, range(0)
    shift = len_k - len_q
    i_last = min((tile + 1) * bs, len_q) - 1
    j_hi = i_last + shift  # the last row's diagonal key: <= len_k - 1
    if j_hi < 0:
        return 0, range(0)  # every row of the block sees no key
    j_lo = max(tile * bs + shift, 0)
    return j_hi // bs + 1, range(j_lo // bs, j_hi // bs + 1)


def row_budget(n_candidates: int, *, topk=None, keep_ratio=None) -> int:
    """The budget of a row with ``n_candidates`` candidates (``keep_ratio``'s product in float64)."""
    if topk is not None:
        return min(int(topk), n_candidates)
    return int(math.ceil(float(keep_ratio) * n_candidates))


def _check_budget_args(topk, keep_ratio):
    if (topk is None) == (keep_ratio is None):
        raise ValueError("topk, keep_ratio: give exactly one of the two")
    if topk is not None:
        if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
            raise TypeError(f"topk: expected an int, got {type(topk).__name__}")
        if topk < 1:
            raise ValueError(f"topk: must be >= 1, got {topk}")
    else:
        r = float(keep_ratio)
        if not (0.0 < r <= 1.0):
            raise ValueError(f"keep_ratio: must be in (0, 1], got {keep_ratio}")


def _rank_key(score: float, u: int):
    """Sort key: higher score first, ties to the lower index, NaN after every number."""
    return (1, 0.0, u) if score != score else (0, -score, u)


def _choose(scores: np.ndarray, forced: range, budget: int) -> list[int]:
    """The kept blocks of one row, ascending: ``forced`` plus the best others up to ``budget``."""
    others = [u for u in range(scores.shape[0]) if u not in forced]
    best = sorted(others, key=lambda u: _rank_key(float(scores[u]), u))[:max(budget - len(forced), 0)]
    return sorted(list(forced) + best)


def _check_qk(q, k):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"q, k: expected [rows, heads, D] arrays, got shapes {q.shape} and {k.shape}")
    if q.shape[2] != k.shape[2] or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q, k: head dims must match and q's heads be a multiple of k's, got {q.shape} and {k.shape}")
    return q, k


def _block_sums(x: np.ndarray, length: int, bs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sums [nblocks, heads, D] float64, rows per block [nblocks])`` of the first ``length`` rows."""
    n = _cdiv(length, bs)
    sums = np.stack([x[u * bs:min((u + 1) * bs, length)].sum(0) for u in range(n)]) if n else \
        np.zeros((0,) + x.shape[1:])
    rows = np.minimum(bs, length - bs * np.arange(n))
    return sums, rows


def block_scores(q, k, cu_q, cu_k, *, block_size: int, broadcast_q: bool = False) -> list[np.ndarray]:
    """Per sequence, the float64 scores ``[H, nqb_b, nkb_b]`` (before rounding to float32): the
    ``score(t, u)`` of the module docstring for every Q block and every K block, causality aside."""
    q, k = _check_qk(q, k)
    bs = _check_block_size(block_size)
    q0, lq, k0, lk = _lengths(cu_q, cu_k, broadcast_q, q.shape[0] if broadcast_q else None)
    for name, cu, x in (("cu_q", None if broadcast_q else cu_q, q), ("cu_k", cu_k, k)):
        if cu is not None and int(np.asarray(cu)[-1]) != x.shape[0]:
            raise ValueError(f"{name}: last offset {int(np.asarray(cu)[-1])} != total rows {x.shape[0]}")
    group = q.shape[1] // k.shape[1]
    out = []
    for b in range(lk.shape[0]):
        qsum, _ = _block_sums(q[q0[b]:q0[b] + lq[b]], int(lq[b]), bs)               # [nqb, H, D]
        ksum, n_k = _block_sums(k[k0[b]:k0[b] + lk[b]], int(lk[b]), bs)             # [nkb, H_kv, D]
        ksum = np.repeat(ksum, group, axis=1)                                       # [nkb, H, D]
        out.append(np.einsum("thd,uhd->htu", qsum, ksum) / n_k[None, None, :])
    return out


def select_kv_blocks(q, k, cu_q, cu_k, *, block_size: int, topk=None, keep_ratio=None, causal: bool = False,
                     broadcast_q: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The exact lists: ``(offsets int32 [H * NQB + 1], indices int32 [offsets[-1]])`` (module docstring)."""
    _check_budget_args(topk, keep_ratio)
    q, k = _check_qk(q, k)
    bs = _check_block_size(block_size)
    H = q.shape[1]
    scores = block_scores(q, k, cu_q, cu_k, block_size=bs, broadcast_q=broadcast_q)
    _, lq, _, lk = _lengths(cu_q, cu_k, broadcast_q, q.shape[0] if broadcast_q else None)
    rows = [[] for _ in range(H)]  # rows[h][g]: kept blocks of Q block g, head h
    for b, s64 in enumerate(scores):
        s32 = s64.astype(np.float32)
        for t in range(s32.shape[1]):
            n_cand, forced = block_plan(t, int(lq[b]), int(lk[b]), block_size=bs, causal=causal)
            budget = row_budget(n_cand, topk=topk, keep_ratio=keep_ratio)
            for h in range(H):
                rows[h].append(_choose(s32[h, t, :n_cand], forced, budget) if n_cand else [])
    flat = [row for head in rows for row in head]
    offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(row) for row in flat])
    indices = np.array([u for row in flat for u in row], dtype=np.int32)
    return offsets.astype(np.int32), indices


def _num_kv_blocks(lk: np.ndarray, bs: int) -> np.ndarray:
    return (lk + bs - 1) // bs


def validate_kv_blocks(offsets, indices, cu_q, cu_k, *, block_size: int, num_heads: int, causal: bool = False,
                       broadcast_q: bool = False, len_q: int | None = None) -> None:
    """Raise ``ValueError`` naming the rule when user-given lists break it; return None otherwise.

    Rules: ``offsets`` is 1-D integer of length ``num_heads * NQB + 1``, starts at 0, is non-decreasing
    and ends at ``len(indices)``; ``indices`` is 1-D integer; within each row the indices are strictly
    ascending (so no duplicates) and each lies in ``[0, ceil(Lk_b / bs))``; with ``causal``, no block lies
    wholly in the causal future of its Q block (``u*bs > i_last + Lk - Lq``). Rows may be empty.
    ``broadcast_q``: ``cu_q`` is None and ``len_q`` is the shared Q's row count.
    """
    bs = _check_block_size(block_size)
    _, lq, _, lk = _lengths(cu_q, cu_k, broadcast_q, len_q)
    blocks = query_blocks(None if broadcast_q else cu_q, bs, broadcast_q, lk.shape[0], len_q)
    nqb = len(blocks)
    off = np.asarray(offsets)
    idx = np.asarray(indices)
    if off.ndim != 1 or not np.issubdtype(off.dtype, np.integer):
        raise ValueError(f"kv_blocks offsets: must be a 1-D integer array, got shape {off.shape} dtype {off.dtype}")
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"kv_blocks indices: must be a 1-D integer array, got shape {idx.shape} dtype {idx.dtype}")
    if off.shape[0] != num_heads * nqb + 1:
        raise ValueError(f"kv_blocks offsets: length must be num_heads * num_q_blocks + 1 = {num_heads} * {nqb} + 1"
                         f" = {num_heads * nqb + 1}, got {off.shape[0]}")
    off = off.astype(np.int64)
    if off[0] != 0:
        raise ValueError(f"kv_blocks offsets: the first entry must be 0, got {int(off[0])}")
    steps = np.diff(off)
    if np.any(steps < 0):
        r = int(np.argmax(steps < 0))
        raise ValueError(f"kv_blocks offsets: must be non-decreasing, row {r} has offsets[{r}] = {int(off[r])} > "
                         f"offsets[{r + 1}] = {int(off[r + 1])}")
    if off[-1] != idx.shape[0]:
        raise ValueError(f"kv_blocks offsets: the last entry {int(off[-1])} must equal len(indices) = {idx.shape[0]}")
    idx = idx.astype(np.int64)
    nkb = _num_kv_blocks(lk, bs)
    for r in range(num_heads * nqb):
        row = idx[off[r]:off[r + 1]]
        if row.size == 0:
            continue
        h, g = divmod(r, nqb)
        blk = blocks[g]
        where = f"row {r} (head {h}, query block {g} = sequence {blk.seq} tile {blk.tile})"
        if np.any(np.diff(row) <= 0):
            raise ValueError(f"kv_blocks indices: {where} must be strictly ascending (no duplicates), "
                             f"got {row.tolist()}")
        if row[0] < 0 or row[-1] >= nkb[blk.seq]:
            raise ValueError(f"kv_blocks indices: {where} has a block index out of range [0, {int(nkb[blk.seq])}) "
                             f"(the sequence's K blocks), got {row.tolist()}")
        if causal:
            limit = blk.stop - 1 + int(lk[blk.seq] - lq[blk.seq])  # the last row's last visible key
            if row[-1] * bs > limit:
                raise ValueError(f"kv_blocks indices: {where} lists block {int(row[-1])}, wholly in the causal "
                                 f"future (its first key {int(row[-1]) * bs} > last visible key {limit})")


def _rows_per_head(offsets, num_heads: int, nqb: int, num_q_slots):
    rows = nqb if num_q_slots is None else int(num_q_slots)
    if rows < nqb:
        raise ValueError(f"num_q_slots: {rows} < the number of Q blocks {nqb}")
    off = np.asarray(offsets).astype(np.int64)
    if off.shape[0] != num_heads * rows + 1:
        raise ValueError(f"offsets: expected length {num_heads} * {rows} + 1, got {off.shape[0]}")
    return rows, off


def kv_block_mask(offsets, indices, cu_q, cu_k, block_size: int, num_heads: int, *, broadcast_q: bool = False,
                  len_q: int | None = None, num_q_slots: int | None = None) -> list[np.ndarray]:
    """Per sequence ``b``, a bool ``[num_heads, Lq_b, Lk_b]``: query row ``i`` may attend key ``j`` iff
    ``j``'s K block is in the list of ``i``'s Q block (block membership only; an attention oracle ANDs its
    own causal mask). ``num_q_slots``: rows per head of device lists (``NQB_slots``; None: exactly NQB)."""
    bs = _check_block_size(block_size)
    _, lq, _, lk = _lengths(cu_q, cu_k, broadcast_q, len_q)
    blocks = query_blocks(None if broadcast_q else cu_q, bs, broadcast_q, lk.shape[0], len_q)
    rows, off = _rows_per_head(offsets, num_heads, len(blocks), num_q_slots)
    idx = np.asarray(indices).astype(np.int64)
    masks = [np.zeros((num_heads, int(lq[b]), int(lk[b])), dtype=bool) for b in range(lk.shape[0])]
    for g, blk in enumerate(blocks):
        for h in range(num_heads):
            r = h * rows + g
            for u in idx[off[r]:off[r + 1]]:
                masks[blk.seq][h, blk.start:blk.stop, u * bs:(u + 1) * bs] = True
    return masks


def pad_offsets(offsets, num_heads: int, num_q_slots: int) -> np.ndarray:
    """Exact offsets (``num_heads * NQB + 1``) laid out as the device's, ``num_q_slots`` rows per head
    (rows ``g >= NQB`` empty)."""
    off = np.asarray(offsets).astype(np.int64)
    nqb, rem = divmod(off.shape[0] - 1, num_heads) if num_heads else (0, 0)
    if rem or nqb > num_q_slots:
        raise ValueError(f"offsets: length {off.shape[0]} is not num_heads * NQB + 1 with NQB <= {num_q_slots}")
    g = np.minimum(np.arange(num_q_slots) + 1, nqb)
    padded = np.zeros(num_heads * num_q_slots + 1, dtype=np.int64)
    padded[1:] = off[(np.arange(num_heads)[:, None] * nqb + g[None, :]).reshape(-1)]
    return padded


def compare_block_lists(expected_offsets, expected_indices, offsets, indices, *, num_heads: int,
                        num_q_slots: int, limit: int = 5) -> list[str]:
    """Differences between the exact lists (oracle) and device lists (``num_q_slots`` rows per head,
    ``indices`` possibly longer than ``offsets[-1]``): an empty list when they are equal, else up to
    ``limit`` lines naming the rows that differ."""
    want = pad_offsets(expected_offsets, num_heads, num_q_slots)
    got = np.asarray(offsets).astype(np.int64)
    if got.shape != want.shape:
        return [f"offsets: length {got.shape[0]}, expected {want.shape[0]}"]
    exp_idx = np.asarray(expected_indices).astype(np.int64)
    got_idx = np.asarray(indices).astype(np.int64)
    if got[-1] > got_idx.shape[0]:
        return [f"offsets: last entry {int(got[-1])} past the indices' capacity {got_idx.shape[0]}"]
    diffs = []
    for r in range(want.shape[0] - 1):
        a = exp_idx[want[r]:want[r + 1]].tolist()
        b = got_idx[got[r]:got[r + 1]].tolist() if got[r] <= got[r + 1] else f"bad offsets {got[r]}..{got[r + 1]}"
        if a != b or want[r] != got[r]:
            h, g = divmod(r, num_q_slots)
            diffs.append(f"row {r} (head {h}, slot {g}): expected {a} at {int(want[r])}, got {b} at {int(got[r])}")
            if len(diffs) >= limit:
                break
    return diffs
