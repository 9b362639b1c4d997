"""PyTorch reference for jagged attention (the ``backend="torch"`` path and the ``ref_t`` of the
tolerance rule in DESIGN.md section 4).

Plain per-sequence PyTorch ops, differentiable by autograd with respect to ``q``, ``k`` and ``v``,
on any device. Semantics match :mod:`jfa.oracle` exactly (DESIGN.md section 3); numerics follow
the usual "reference in dtype t" recipe:

- ``q @ k^T`` in ``compute_dtype`` (inputs cast to it), converted to the softmax dtype, then scaled;
- masking, softmax and lse in float32 (float64 when ``compute_dtype`` is float64);
- probabilities cast back to ``compute_dtype`` and ``p @ v`` computed in ``compute_dtype``;
- ``out`` returned in ``q``'s dtype, ``lse`` in the softmax dtype.

Rows that see no key give ``out = 0``, ``lse = -inf`` and exactly zero (never NaN) gradients.
Offsets are moved to the host (``.tolist()``), so this synchronises with the device. A sequence whose scores
take more than CHUNK_BYTES is taken a chunk of query rows at a time (``row_chunks``), each chunk's scores and
block-sparse mask recomputed for the backward (activation checkpointing): its memory is a chunk's, not its whole
score matrix's.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence, Union

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["attention_reference", "kv_block_lists", "listed_keys", "row_chunks", "select_kv_blocks_reference"]

Offsets = Union[torch.Tensor, Sequence[int]]
# the [H, rows, keys] scores of one sequence computed at a time, at most (the reference's and the fuzzer's float64
# twin's alike): a longer sequence's query rows go in chunks (``row_chunks``)
CHUNK_BYTES = 1 << 27


def row_chunks(len_q: int, len_k: int, heads: int, itemsize: int) -> list:
    """The query rows of a (len_q, len_k) sequence as consecutive ranges whose [heads, rows, len_k] scores of
    ``itemsize`` bytes take at most CHUNK_BYTES (one row at least); a single range when they all fit."""
    step = max(1, CHUNK_BYTES // max(1, heads * len_k * itemsize))
    return [range(r, min(len_q, r + step)) for r in range(0, len_q, step)]


def _offsets_list(cu: Offsets, name: str) -> list:
    if isinstance(cu, torch.Tensor):
        if cu.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor of B+1 offsets, got shape {tuple(cu.shape)}")
        if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
            raise TypeError(f"{name}: offsets must be an integer tensor, got {cu.dtype}")
        vals = [int(x) for x in cu.tolist()]
    else:
        vals = [int(x) for x in cu]
    if len(vals) < 1 or vals[0] != 0:
        raise ValueError(f"{name}: expected B+1 >= 1 offsets starting at 0, got {vals[:4]}...")
    if any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError(f"{name}: offsets must be non-decreasing")
    return vals


def _softmax_rows(scores: torch.Tensor):
    """Masked-safe softmax over the last dim of float32/64 ``scores`` (masked entries are -inf).

    Returns ``(p, lse)``; all -inf rows give ``p = 0`` and ``lse = -inf`` with zero gradients.
    The row max is detached: it cancels mathematically, so gradients stay exact.
    """
    m = scores.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)                      # exp(-inf) = 0, derivative 0: no NaN
    l = e.sum(dim=-1, keepdim=True)
    seen = l > 0
    l_safe = torch.where(seen, l, torch.ones_like(l))
    p = e / l_safe
    lse = torch.where(seen, m + torch.log(l_safe), torch.full_like(l, float("-inf")))
    return p, lse.squeeze(-1)


def _rows(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, blocks: Optional[tuple], row0: int,
          shift: int, scale: float, left: int, right: int, sdt: torch.dtype):
    """Query rows ``row0 ..`` of one sequence (``qh`` [H, rows, D]) against all its keys: (out [H, rows, D] in
    the compute dtype, lse [H, rows] in ``sdt``). ``shift`` = Lk - Lq; ``blocks``: block-sparse attention's
    (listed, block_size) of the sequence (``kv_block_lists``) or None."""
    s = torch.matmul(qh, kh.transpose(-1, -2)).to(sdt) * scale      # [H, rows, lk]
    if right >= 0 or left >= 0:
        i = torch.arange(row0, row0 + qh.shape[1], device=qh.device)[:, None]
        j = torch.arange(kh.shape[1], device=qh.device)[None, :]
        hidden = torch.zeros((qh.shape[1], kh.shape[1]), dtype=torch.bool, device=qh.device)
        if right >= 0:
            hidden |= j > i + shift + right
        if left >= 0:
            hidden |= j < i + shift - left
        s = s.masked_fill(hidden, float("-inf"))
    if blocks is not None:
        s = s.masked_fill(~listed_keys(*blocks, range(row0, row0 + qh.shape[1]), kh.shape[1]), float("-inf"))
    p, lse = _softmax_rows(s)
    return torch.matmul(p.to(qh.dtype), vh), lse


def _sequence_rows(qh, kh, vh, blocks, shift: int, scale: float, left: int, right: int, sdt: torch.dtype):
    """``_rows`` over every query row of one sequence, in ``row_chunks`` when its scores take more than
    CHUNK_BYTES: each chunk's scores are recomputed in the backward (activation checkpointing) rather than kept,
    so the memory a sequence takes is bounded by a chunk's, in the forward and in autograd's backward alike."""
    chunks = row_chunks(qh.shape[1], kh.shape[1], qh.shape[0], torch.finfo(sdt).bits // 8)
    if len(chunks) == 1:
        return _rows(qh, kh, vh, blocks, 0, shift, scale, left, right, sdt)
    keep_graph = torch.is_grad_enabled() and any(t.requires_grad for t in (qh, kh, vh))
    outs, lses = [], []
    for rows in chunks:
        args = (qh[:, rows.start:rows.stop], kh, vh, blocks, rows.start, shift, scale, left, right, sdt)
        o, lse = checkpoint(_rows, *args, use_reentrant=False) if keep_graph else _rows(*args)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


def kv_block_lists(kv_blocks, lengths_q: Sequence[int], lengths_k: Sequence[int], num_heads: int,
                   device) -> list:
    """Per sequence, bool ``[H, NQ_b, NK_b]`` on ``device`` (its query and key blocks): which key blocks each
    query block lists, from ``kv_blocks = (offsets, indices, block_size)``, the exact CSR of block-sparse
    attention (row ``h * NQB + g`` for query block g of the batch, numbered through the sequences in order)."""
    offsets, indices, block_size = kv_blocks
    offsets = torch.as_tensor(offsets).to(device="cpu", dtype=torch.int64)
    indices = torch.as_tensor(indices).to(device="cpu", dtype=torch.int64)
    blocks_q = [-(-int(n) // block_size) for n in lengths_q]
    blocks_k = [-(-int(n) // block_size) for n in lengths_k]
    nqb = sum(blocks_q)
    if offsets.numel() != num_heads * nqb + 1:
        raise ValueError(f"kv_blocks: expected {num_heads * nqb + 1} offsets (H * query blocks + 1), "
                         f"got {offsets.numel()}")
    counts = offsets[1:] - offsets[:-1]
    listed = torch.zeros((num_heads * nqb, max(blocks_k, default=0) + 1), dtype=torch.bool)
    rows = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    listed[rows, indices[offsets[0]:offsets[-1]]] = True
    listed = listed.view(num_heads, nqb, listed.shape[1])
    firsts = [0, *itertools.accumulate(blocks_q)]
    return [listed[:, first:first + nq, :nk].to(device) for first, nq, nk in zip(firsts, blocks_q, blocks_k)]


def listed_keys(listed: torch.Tensor, block_size: int, rows: range, len_k: int) -> torch.Tensor:
    """Bool ``[H, len(rows), len_k]``: the keys query rows ``rows`` of a sequence see through the key blocks their
    query block lists (``listed``: the sequence's ``kv_block_lists`` entry); built a chunk of rows at a time, so
    its memory is the chunk's scores'."""
    query_blocks = torch.arange(rows.start, rows.stop, device=listed.device) // block_size
    key_blocks = torch.arange(len_k, device=listed.device) // block_size
    return listed[:, query_blocks][:, :, key_blocks]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[Offsets],
    cu_seqlens_k: Offsets,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    broadcast_q: bool = False,
    compute_dtype: Optional[torch.dtype] = None,
    window: tuple = (-1, -1),
    kv_blocks: Optional[tuple] = None,
):
    """Jagged attention by per-sequence PyTorch ops. Returns ``(out, lse)``.

    ``q`` ``[total_q, H, D]`` (``[Lq, H, D]`` with ``broadcast_q``), ``k``/``v`` ``[total_k, H_kv, D]``
    with ``H % H_kv == 0`` (query head h reads key/value head h // (H / H_kv)); strided views are fine.
    ``window=(left, right)``: FlashAttention's ``window_size`` (-1: unbounded; with ``causal`` right is 0).
    ``out`` is ``[total_q, H, D]`` (``[B*Lq, H, D]`` with ``broadcast_q``) in
    ``q.dtype``; ``lse`` is ``[total_q, H]`` float32 (float64 when ``compute_dtype`` is float64).
    ``compute_dtype`` (default ``q.dtype``) is the dtype of the two matmuls. Both outputs are always
    connected to ``q``, ``k`` and ``v`` in the autograd graph (also for ``B = 0`` or all-empty
    batches), so ``backward`` works and yields zero gradients where nothing is visible.
    ``kv_blocks=(offsets, indices, block_size)``: block-sparse attention, a row sees only the keys of the
    key blocks its query block lists (the exact CSR of ``jfa.oracle.attention_forward``).
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v: expected 3-D [tokens, H, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k, v: shapes must match, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[2] != k.shape[2] or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q, k: head dims must match and q's heads be a multiple of k's, got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    cu_k = _offsets_list(cu_seqlens_k, "cu_seqlens_k")
    if cu_k[-1] != k.shape[0]:
        raise ValueError(f"cu_seqlens_k: last offset {cu_k[-1]} != total_k {k.shape[0]}")
    B = len(cu_k) - 1
    if broadcast_q:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q: must be None when broadcast_q=True (q is one dense sequence)")
        lq_b = q.shape[0]
        q_rows = [(0, lq_b)] * B
    else:
        if cu_seqlens_q is None:
            raise ValueError("cu_seqlens_q: required unless broadcast_q=True")
        cu_q = _offsets_list(cu_seqlens_q, "cu_seqlens_q")
        if len(cu_q) != len(cu_k):
            raise ValueError(f"cu_seqlens_q, cu_seqlens_k: must have the same length B+1, "
                             f"got {len(cu_q)} and {len(cu_k)}")
        if cu_q[-1] != q.shape[0]:
            raise ValueError(f"cu_seqlens_q: last offset {cu_q[-1]} != total_q {q.shape[0]}")
        q_rows = [(cu_q[b], cu_q[b + 1]) for b in range(B)]

    H, D = q.shape[1], q.shape[2]
    group = H // k.shape[1]
    left, right = window
    if causal:
        right = 0
    cdt = q.dtype if compute_dtype is None else compute_dtype
    sdt = torch.float64 if cdt == torch.float64 else torch.float32
    scale = (1.0 / math.sqrt(D)) if softmax_scale is None else float(softmax_scale)
    dev = q.device
    block_lists = (None if kv_blocks is None else
                   kv_block_lists(kv_blocks, [q1 - q0 for q0, q1 in q_rows], [cu_k[b + 1] - cu_k[b] for b in range(B)],
                                  H, dev))

    outs, lses = [], []
    for b in range(B):
        q0, q1 = q_rows[b]
        k0, k1 = cu_k[b], cu_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        if lk == 0:
            outs.append(q.new_zeros((lq, H, D)))
            lses.append(torch.full((lq, H), float("-inf"), dtype=sdt, device=dev))
            continue
        qh = q[q0:q1].to(cdt).transpose(0, 1)                           # [H, lq, D]
        kh = k[k0:k1].to(cdt).repeat_interleave(group, dim=1).transpose(0, 1)  # [H, lk, D]
        vh = v[k0:k1].to(cdt).repeat_interleave(group, dim=1).transpose(0, 1)  # [H, lk, D]
        blocks = None if block_lists is None else (block_lists[b], kv_blocks[2])
        o, lse = _sequence_rows(qh, kh, vh, blocks, lk - lq, scale, left, right, sdt)
        outs.append(o.transpose(0, 1).to(q.dtype))
        lses.append(lse.transpose(0, 1))

    out = torch.cat(outs, dim=0) if outs else q.new_zeros((0, H, D))
    lse = torch.cat(lses, dim=0) if lses else torch.zeros((0, H), dtype=sdt, device=dev)
    # A zero that depends on q, k and v (sum of empty slices): keeps both outputs in the autograd
    # graph even when nothing was computed (B = 0, all rows empty/masked), with exactly zero grads.
    anchor = q[:0].sum() + k[:0].sum() + v[:0].sum()
    return out + anchor.to(out.dtype), lse + anchor.to(lse.dtype)


def select_kv_blocks_reference(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: Optional[Offsets],
                               cu_seqlens_k: Offsets, *, block_size: int, topk: Optional[int] = None,
                               keep_ratio: Optional[float] = None, causal: bool = False,
                               broadcast_q: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Block selection (``jfa.select_kv_blocks``'s rule) by per-sequence torch ops: the exact CSR
    ``(offsets, indices)`` (int64, on the host). Per head, block sums of q and k in float32,
    ``score = q_sum . k_sum / n_k``; candidates all key blocks (causal: none wholly in the future, the blocks
    of each row's diagonal key always kept); budget ``min(topk, n)`` or ``ceil(keep_ratio * n)``; higher
    score first, ties to the lower index, NaN last. Sums in another order than the kernel's: the lists may
    differ from it where two scores are within fp32 rounding."""
    bs = block_size
    cu_k = _offsets_list(cu_seqlens_k, "cu_seqlens_k")
    num_seqs = len(cu_k) - 1
    if broadcast_q:
        q_rows = [(0, q.shape[0])] * num_seqs
    else:
        cu_q = _offsets_list(cu_seqlens_q, "cu_seqlens_q")
        q_rows = [(cu_q[b], cu_q[b + 1]) for b in range(num_seqs)]
    heads, group = q.shape[1], q.shape[1] // k.shape[1]

    def block_sums(x, lo, hi):
        n = -(-(hi - lo) // bs)
        index = torch.arange(hi - lo, device=x.device) // bs
        sums = torch.zeros((n, x.shape[1], x.shape[2]), dtype=torch.float32, device=x.device)
        sums.index_add_(0, index, x[lo:hi].float())
        return sums, ((hi - lo) - bs * torch.arange(n, device=x.device)).clamp(max=bs)

    rows = [[] for _ in range(heads)]
    for b in range(num_seqs):
        (q0, q1), k0, k1 = q_rows[b], cu_k[b], cu_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        nq, nk = -(-lq // bs), -(-lk // bs)
        scores = None
        if nq and nk:
            qs, _ = block_sums(q, q0, q1)
            ks, counts = block_sums(k, k0, k1)
            ks = ks.repeat_interleave(group, dim=1)
            scores = (torch.einsum("thd,uhd->htu", qs, ks) / counts.float()).cpu()
        for t in range(nq):
            n, forced = nk, range(0)
            if causal:
                last_key = min((t + 1) * bs, lq) - 1 + lk - lq
                n = min(nk, last_key // bs + 1) if last_key >= 0 else 0
                forced = range(max(t * bs + lk - lq, 0) // bs, last_key // bs + 1) if last_key >= 0 else range(0)
            budget = min(topk, n) if topk is not None else math.ceil(float(keep_ratio) * n)
            for h in range(heads):
                if n == 0:
                    rows[h].append([])
                    continue
                s = scores[h, t, :n]
                nan = torch.isnan(s)
                order = torch.sort(-torch.where(nan, torch.full_like(s, -math.inf), s), stable=True).indices
                order = order[torch.sort(nan[order].to(torch.int8), stable=True).indices]
                best = [int(u) for u in order if int(u) not in forced][:max(budget - len(forced), 0)]
                rows[h].append(sorted(list(forced) + best))
    flat = [row for head in rows for row in head]
    offsets = torch.zeros(len(flat) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(r) for r in flat], dtype=torch.int64), 0)
    return offsets, torch.tensor([u for r in flat for u in r], dtype=torch.int64)
