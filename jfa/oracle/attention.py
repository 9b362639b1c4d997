"""Float64 NumPy oracle for jagged (packed variable-length) attention.

This is the ground truth every kernel is judged against (DESIGN.md section 4). It is deliberately
simple: one Python loop over sequences, float64 arithmetic batched over heads with matmul (BLAS),
a numerically stable forward (row max subtracted) and an analytic backward. It never imports torch.

Semantics (DESIGN.md section 3):

- ``q`` is ``[total_q, H, D]``, ``k``/``v`` are ``[total_k, H_kv, D]`` with ``H % H_kv == 0`` (grouped
  query attention: query head ``h`` reads key/value head ``h // (H / H_kv)``; ``H_kv = 1`` is MQA);
  sequence ``b`` owns query rows ``cu_q[b]:cu_q[b+1]`` and key rows ``cu_k[b]:cu_k[b+1]``. Lengths may
  be 0, ``B`` may be 0.
- ``softmax_scale`` defaults to ``1/sqrt(D)``.
- ``causal`` is bottom-right aligned: query ``i`` of a sequence with lengths ``(Lq, Lk)`` sees keys
  ``j <= i + Lk - Lq``. ``window=(left, right)`` (FlashAttention's ``window_size``; -1: unbounded) keeps
  keys ``i + Lk - Lq - left <= j <= i + Lk - Lq + right``; with ``causal`` right is 0.
- A row that sees no key (fully masked, or ``Lk == 0``) has ``out = 0``, ``lse = -inf`` and
  contributes nothing to any gradient.
- ``broadcast_q=True``: ``q`` is ``[Lq, H, D]`` and shared by all ``B`` sequences; ``cu_seqlens_q``
  must be None; output row ``b*Lq + i`` belongs to sequence ``b``; ``dq`` is summed over ``b``.
- ``kv_blocks=(offsets, indices, block_size)`` (block-sparse attention, DESIGN.md section 10): a row sees
  only the keys of the key blocks its query block lists, on top of the masks above. Blocks are
  ``block_size`` rows of one sequence (the last may be short); query block ``t`` of sequence ``b`` is
  ``g = qb_off[b] + t`` (``qb_off``: exclusive prefix sum of ``ceil(Lq_b / block_size)`` over the output
  rows); CSR row ``h * NQB + g`` (``NQB``: the number of query blocks) lists local key block indices.
"""

from __future__ import annotations

import math

import numpy as np

from jfa.oracle.block_select import kv_block_mask
from jfa.oracle.offsets import as_offsets

__all__ = ["attention_forward", "attention_backward"]


def _as_f64(x, name: str, ndim: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    return a


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, broadcast_q):
    """Validate and normalise inputs; return (q, k, v, cu_q, cu_k, lq_bcast, scale).

    In broadcast mode ``cu_q`` is synthesised as ``[0, Lq, 2*Lq, ...]`` (the output row offsets),
    and ``lq_bcast`` is ``Lq``; otherwise ``lq_bcast`` is None.
    """
    q = _as_f64(q, "q", 3)
    k = _as_f64(k, "k", 3)
    v = _as_f64(v, "v", 3)
    if k.shape != v.shape:
        raise ValueError(f"k, v: shapes must match, got {k.shape} and {v.shape}")
    if q.shape[2] != k.shape[2] or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q, k: head dims must match and q's heads be a multiple of k's, got {q.shape} and {k.shape}")
    cu_k = as_offsets(cu_seqlens_k, "cu_seqlens_k")
    if cu_k[-1] != k.shape[0]:
        raise ValueError(f"cu_seqlens_k: last offset {int(cu_k[-1])} != total_k {k.shape[0]}")
    B = cu_k.shape[0] - 1
    if broadcast_q:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q: must be None when broadcast_q=True (q is one dense sequence)")
        lq = q.shape[0]
        cu_q = np.arange(B + 1, dtype=np.int64) * lq
        lq_bcast = lq
    else:
        if cu_seqlens_q is None:
            raise ValueError("cu_seqlens_q: required unless broadcast_q=True")
        cu_q = as_offsets(cu_seqlens_q, "cu_seqlens_q")
        if cu_q.shape != cu_k.shape:
            raise ValueError(
                f"cu_seqlens_q, cu_seqlens_k: must have the same length B+1, got {cu_q.shape[0]} and {cu_k.shape[0]}"
            )
        if cu_q[-1] != q.shape[0]:
            raise ValueError(f"cu_seqlens_q: last offset {int(cu_q[-1])} != total_q {q.shape[0]}")
        lq_bcast = None
    D = q.shape[2]
    scale = (1.0 / math.sqrt(D)) if softmax_scale is None else float(softmax_scale)
    return q, k, v, cu_q, cu_k, lq_bcast, scale


def _backward_inputs(out, lse, dout, dlse, total_out: int, H: int, D: int):
    """(out, lse, dout, dlse) as float64, shape-checked (out, dout ``[total_out, H, D]``; lse, dlse
    ``[total_out, H]``; a missing dlse is zeros)."""
    out, dout, lse = _as_f64(out, "out", 3), _as_f64(dout, "dout", 3), _as_f64(lse, "lse", 2)
    dlse = np.zeros_like(lse) if dlse is None else _as_f64(dlse, "dlse", 2)
    for name, a, shape in (("out", out, (total_out, H, D)), ("dout", dout, (total_out, H, D)),
                           ("lse", lse, (total_out, H)), ("dlse", dlse, (total_out, H))):
        if a.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
    return out, lse, dout, dlse


def _visible(lq: int, lk: int, causal: bool, window=(-1, -1)) -> np.ndarray:
    """Boolean ``[lq, lk]`` mask of the keys each query row sees (bottom-right causal and windows)."""
    left, right = window
    if causal:
        right = 0
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    shift = lk - lq
    visible = np.ones((lq, lk), dtype=bool)
    if right >= 0:
        visible &= j <= i + shift + right
    if left >= 0:
        visible &= j >= i + shift - left
    return visible


def _block_masks(kv_blocks, cu_q, cu_k, num_heads: int):
    """Per sequence, bool ``[H, Lq_b, Lk_b]`` of the keys the lists ``kv_blocks`` let each row see (None: no
    lists). ``cu_q``: the output rows' offsets."""
    if kv_blocks is None:
        return None
    offsets, indices, block_size = kv_blocks
    return kv_block_mask(offsets, indices, cu_q, cu_k, int(block_size), num_heads)


def _group(x, group: int):
    """[rows, H_kv, D] -> [rows, H_kv * group, D]: each key/value head repeated for its query heads."""
    return np.repeat(x, group, axis=1) if group > 1 else x


def _ungroup(x, group: int):
    """[rows, H, D] -> [rows, H / group, D]: a gradient summed over each key/value head's query heads."""
    return x.reshape(x.shape[0], x.shape[1] // group, group, x.shape[2]).sum(2) if group > 1 else x


def _seq_rows(b, cu_q, cu_k, lq_bcast):
    """(q slice, output-row slice, k slice) of sequence b."""
    oq = slice(int(cu_q[b]), int(cu_q[b + 1]))
    qs = slice(0, lq_bcast) if lq_bcast is not None else oq
    ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
    return qs, oq, ks


def _heads(x):
    """[rows, H, D] -> [H, rows, D] (a view), for matmuls batched over heads."""
    return x.transpose(1, 0, 2)


def _rows(x):
    """[H, rows, D] -> [rows, H, D] (a view): back to the packed layout."""
    return x.transpose(1, 0, 2)


def attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, softmax_scale=None,
                      broadcast_q=False, window=(-1, -1), kv_blocks=None):
    """Exact float64 jagged attention forward.

    Returns ``(out, lse)``: ``out`` ``[total_q, H, D]`` float64 (``[B*Lq, H, D]`` with
    ``broadcast_q``), ``lse`` ``[total_q, H]`` float64, natural log of the row's sum of
    ``exp(scale * q.k)`` over visible keys. Rows that see no key: ``out = 0``, ``lse = -inf``.
    ``kv_blocks``: block-sparse lists (module docstring). Raises ``ValueError`` on inconsistent
    shapes/offsets, or ``cu_seqlens_q`` given with ``broadcast_q``.
    """
    q, k, v, cu_q, cu_k, lq_bcast, scale = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                    softmax_scale, broadcast_q)
    H, D = q.shape[1], q.shape[2]
    block_masks = _block_masks(kv_blocks, cu_q, cu_k, H)
    group = H // k.shape[1]
    total_out = int(cu_q[-1])
    out = np.zeros((total_out, H, D), dtype=np.float64)
    lse = np.full((total_out, H), -np.inf, dtype=np.float64)
    for b in range(cu_k.shape[0] - 1):
        qs, oq, ks = _seq_rows(b, cu_q, cu_k, lq_bcast)
        qb, kb, vb = q[qs], _group(k[ks], group), _group(v[ks], group)
        lq, lk = qb.shape[0], kb.shape[0]
        if lq == 0 or lk == 0:
            continue  # nothing to compute; rows (if any) stay out = 0, lse = -inf
        vis = _visible(lq, lk, causal, window)[None]                    # [1, lq, lk]
        if block_masks is not None:
            vis = vis & block_masks[b]  # [H, lq, lk]
        s = _heads(qb) @ _heads(kb).transpose(0, 2, 1) * scale         # [H, lq, lk]
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)                               # [H, lq, 1]
        m_safe = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m_safe)                                          # masked -> exp(-inf) = 0
        l = p.sum(axis=-1, keepdims=True)
        seen = l > 0
        l_safe = np.where(seen, l, 1.0)
        out[oq] = _rows((p / l_safe) @ _heads(vb))
        lse[oq] = np.where(seen, m_safe + np.log(l_safe), -np.inf)[..., 0].T
    return out, lse


def attention_backward(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                       softmax_scale=None, broadcast_q=False, dlse=None, magnitudes=False, window=(-1, -1),
                       kv_blocks=None):
    """Analytic float64 jagged attention backward.

    Uses the ``out`` and ``lse`` passed in (as a kernel's backward would): ``P = exp(scale*S - lse)``
    on visible entries (0 elsewhere and on ``lse = -inf`` rows), ``dV = P^T dO``, ``dP = dO V^T``,
    ``delta = rowsum(dO * O)``, ``dS = P * (dP - delta)``, ``dQ = scale * dS K``,
    ``dK = scale * dS^T Q``. ``dlse`` (optional, shaped like ``lse``): a gradient reaching the lse
    output too; since d lse_i / d S_ij = P_ij it enters as ``delta - dlse``. Returns ``(dq, dk, dv)`` float64 shaped like ``q``, ``k``, ``v``;
    with ``broadcast_q`` ``dq`` is ``[Lq, H, D]`` summed over all sequences.

    ``magnitudes=True`` returns the same three products taken over absolute values instead
    (``P^T |dO|``, ``|scale| |dS|^T |Q|``, ``|scale| |dS| |K|``): the scale of the rounding error of
    any summation order of those sums, which is what a tolerance floor must be relative to (a key
    seen by many queries sums many terms into dK and dV). ``kv_blocks`` as for ``attention_forward``.
    """
    q, k, v, cu_q, cu_k, lq_bcast, scale = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                    softmax_scale, broadcast_q)
    total_out = int(cu_q[-1])
    H, D = q.shape[1], q.shape[2]
    out, lse, dout, dlse = _backward_inputs(out, lse, dout, dlse, total_out, H, D)
    group = H // k.shape[1]
    block_masks = _block_masks(kv_blocks, cu_q, cu_k, H)
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for b in range(cu_k.shape[0] - 1):
        qs, oq, ks = _seq_rows(b, cu_q, cu_k, lq_bcast)
        qb, kb, vb = q[qs], _group(k[ks], group), _group(v[ks], group)
        lq, lk = qb.shape[0], kb.shape[0]
        if lq == 0 or lk == 0:
            continue
        ob, dob = out[oq], dout[oq]
        lse_b = lse[oq].T[..., None]                                    # [H, lq, 1]
        vis = _visible(lq, lk, causal, window)[None] & np.isfinite(lse_b)  # [H, lq, lk]
        if block_masks is not None:
            vis = vis & block_masks[b]
        qh, kh, vh, doh = _heads(qb), _heads(kb), _heads(vb), _heads(dob)  # [H, rows, D]
        s = qh @ kh.transpose(0, 2, 1) * scale
        lse_safe = np.where(np.isfinite(lse_b), lse_b, 0.0)
        p = np.where(vis, np.exp(np.where(vis, s - lse_safe, 0.0)), 0.0)
        pt = p.transpose(0, 2, 1)                                       # [H, lk, lq]
        dv[ks] += _ungroup(_rows(pt @ (np.abs(doh) if magnitudes else doh)), group)
        dp = doh @ vh.transpose(0, 2, 1)
        delta = (dob * ob).sum(-1).T[..., None] - dlse[oq].T[..., None]  # [H, lq, 1]
        ds = p * (dp - delta)
        if magnitudes:
            ds, qh, kh, factor = np.abs(ds), np.abs(qh), np.abs(kh), abs(scale)
        else:
            factor = scale
        dq[qs] += factor * _rows(ds @ kh)
        dk[ks] += factor * _ungroup(_rows(ds.transpose(0, 2, 1) @ qh), group)
    return dq, dk, dv
