"""MXFP8 attention oracle in NumPy float64: docs/mxfp8.md section 2 ("Attention semantics") in code.

Every quantization is the bit-exact reference quantizer :func:`jfa.oracle.mx.quantize_mx` (the root of
trust); everything else is float64 arithmetic, one Python loop over sequences batched over heads, in the
style of :mod:`jfa.oracle.attention` (whose masks, causal alignment, windows, GQA and broadcast-Q it
reuses). It never imports torch.

Quantization blocks (32 elements, aligned to the first element of the axis, tail zero-filled):

- Q, K, V, dO along ``dim``: the head dim of every (row, head).
- V, K, Q, dO along ``keys``/``queries``: the rows of one sequence (``quantize_mx(axis="tokens")`` with the
  sequence offsets; a broadcast Q is one sequence of ``Lq`` rows, its dO has ``B`` sequences of ``Lq``).
- P and dS, per sequence and head, an ``[Lq, Lk]`` matrix: along keys the blocks are 32 consecutive columns
  of a row, along queries 32 consecutive rows of a column; invisible entries are 0 and count as 0 in a
  block's amax.
"""
from __future__ import annotations

import math

import numpy as np

from jfa.oracle.attention import _backward_inputs, _group, _heads, _prepare, _rows, _seq_rows, _ungroup, _visible
from jfa.oracle.mx import _check_rule, dequantize_mx, quantize_mx

__all__ = ["mx_forward", "mx_backward", "mx_along", "mx_tokens"]

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def mx_along(x, axis: int, rule: str) -> np.ndarray:
    """The dequantized MX quantization of ``x`` (float64) along ``axis``: blocks of 32 consecutive indices of
    that axis starting at index 0, the tail block zero-filled, every other index independent."""
    moved = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    elements, scales = quantize_mx(moved, "dim", rule=rule)
    return np.moveaxis(dequantize_mx(elements, scales, "dim"), -1, axis)


def mx_tokens(x, cu, rule: str) -> np.ndarray:
    """The dequantized MX quantization of packed ``x`` ``[T, H, D]`` along its rows, per sequence of ``cu``."""
    elements, scales = quantize_mx(x, "tokens", cu, rule)
    return dequantize_mx(elements, scales, "tokens", cu)


def _window(window) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window)
    except (TypeError, ValueError):
        raise ValueError(f"window: expected a pair (left, right) of ints (-1: unbounded), got {window!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window: entries must be >= -1, got {window!r}")
    return left, right


def mx_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, *, rule="floor", causal=False, softmax_scale=None,
               broadcast_q=False, window=(-1, -1)) -> tuple[np.ndarray, np.ndarray]:
    """The MXFP8 attention forward of docs/mxfp8.md section 2 ("Forward"), in float64.

    ``q``, ``k``, ``v`` are the original values (any array-like; e.g. float64 holding bf16 values), quantized
    here with ``rule``: Q, K along ``dim``, V along keys by ``cu_seqlens_k``. Per row: ``t = c Q^ K^T``
    (``c = softmax_scale * log2(e)``), the integer maximum ``M = ceil(max t)``, ``p = 2^(t - M)``, ``P^``
    quantized along keys, ``l = sum P^``, ``out = (P^ V^) / l``, ``lse = ln2 (M + log2 l)``.

    Returns ``(out [rows, H, D], lse [rows, H])`` float64; ``out`` is not rounded to an output dtype.
    A row that sees no key has ``out = 0`` and ``lse = -inf``. Raises ``ValueError`` naming the argument for
    a bad rule, window, shapes or offsets.
    """
    _check_rule(rule)
    window = _window(window)
    q, k, v, cu_q, cu_k, lq_bcast, scale = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, broadcast_q)
    H, D = q.shape[1], q.shape[2]
    group = H // k.shape[1]
    qd, kd, vt = mx_along(q, -1, rule), mx_along(k, -1, rule), mx_tokens(v, cu_k, rule)
    c = scale * LOG2E
    total_out = int(cu_q[-1])
    out = np.zeros((total_out, H, D))
    lse = np.full((total_out, H), -np.inf)
    for b in range(cu_k.shape[0] - 1):
        qs, oq, ks = _seq_rows(b, cu_q, cu_k, lq_bcast)
        qh, kh, vh = _heads(qd[qs]), _heads(_group(kd[ks], group)), _heads(_group(vt[ks], group))
        lq, lk = qh.shape[1], kh.shape[1]
        if lq == 0 or lk == 0:
            continue
        vis = np.broadcast_to(_visible(lq, lk, causal, window)[None], (H, lq, lk))
        t = np.where(vis, c * (qh @ kh.transpose(0, 2, 1)), -np.inf)         # [H, lq, lk]
        tmax = t.max(axis=-1, keepdims=True)
        seen = np.isfinite(tmax)                                             # rows with a visible key
        m = np.where(seen, np.ceil(np.where(seen, tmax, 0.0)), 0.0)          # the integer row maximum
        p = np.where(vis, np.exp2(np.where(vis, t - m, 0.0)), 0.0)           # (0, 1] visible, 0 elsewhere
        ph = mx_along(p, -1, rule)                                           # P^ along keys
        l = ph.sum(axis=-1, keepdims=True)
        l_safe = np.where(seen, l, 1.0)
        out[oq] = _rows(np.where(seen, (ph @ vh) / l_safe, 0.0))
        lse[oq] = np.where(seen, LN2 * (m + np.log2(l_safe)), -np.inf)[..., 0].T
    return out, lse


def mx_backward(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, *, rule="floor", causal=False,
                softmax_scale=None, broadcast_q=False, dlse=None, window=(-1, -1)
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MXFP8 attention backward of docs/mxfp8.md section 2 ("Backward"), in float64.

    ``out`` and ``lse`` are the forward's stored outputs (whatever the caller passes: the oracle's or a
    kernel's), ``dout`` the original gradient; ``dlse`` (optional, like ``lse``) a gradient of lse. Per
    sequence and head: ``P = 2^(c Q^(dim) K^(dim)^T - lse / ln2)`` on the visible entries of rows with a
    finite lse (0 elsewhere), ``dV = sum_h P^(queries)^T dO^(queries)``, ``dP = dO^(dim) V^(dim)^T``,
    ``Delta = rowsum(dO * out) - dlse`` (unquantized dO), ``dS = P (dP - Delta)``,
    ``dQ = scale dS^(keys) K^(keys)``, ``dK = scale sum_h dS^(queries)^T Q^(queries)``; GQA heads and (dQ
    of a broadcast Q) sequences are summed. Returns ``(dq, dk, dv)`` float64 shaped like ``q``, ``k``, ``v``.
    """
    _check_rule(rule)
    window = _window(window)
    q, k, v, cu_q, cu_k, lq_bcast, scale = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, broadcast_q)
    total_out = int(cu_q[-1])
    H, D = q.shape[1], q.shape[2]
    out, lse, dout, dlse = _backward_inputs(out, lse, dout, dlse, total_out, H, D)
    group = H // k.shape[1]
    cu_own_q = np.array([0, q.shape[0]]) if broadcast_q else cu_q  # the rows Q is quantized along
    qd, kd, vd, dod = (mx_along(x, -1, rule) for x in (q, k, v, dout))
    qt, kt, dot = mx_tokens(q, cu_own_q, rule), mx_tokens(k, cu_k, rule), mx_tokens(dout, cu_q, rule)
    c = scale * LOG2E
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(cu_k.shape[0] - 1):
        qs, oq, ks = _seq_rows(b, cu_q, cu_k, lq_bcast)
        lq, lk = qs.stop - qs.start, ks.stop - ks.start
        if lq == 0 or lk == 0:
            continue
        lse2 = lse[oq].T[..., None] / LN2                                     # [H, lq, 1], base 2
        vis = _visible(lq, lk, causal, window)[None] & np.isfinite(lse2)     # [H, lq, lk]
        qh, kh = _heads(qd[qs]), _heads(_group(kd[ks], group))
        t = c * (qh @ kh.transpose(0, 2, 1))
        p = np.where(vis, np.exp2(np.where(vis, t - lse2, 0.0)), 0.0)
        pq = mx_along(p, -2, rule)                                           # P^ along queries
        dv[ks] += _ungroup(_rows(pq.transpose(0, 2, 1) @ _heads(dot[oq])), group)
        dp = _heads(dod[oq]) @ _heads(_group(vd[ks], group)).transpose(0, 2, 1)
        delta = (dout[oq] * out[oq]).sum(-1).T[..., None] - dlse[oq].T[..., None]
        ds = np.where(vis, p * (dp - delta), 0.0)
        dsk, dsq = mx_along(ds, -1, rule), mx_along(ds, -2, rule)             # dS^ along keys, queries
        dq[qs] += scale * _rows(dsk @ _heads(_group(kt[ks], group)))
        dk[ks] += scale * _ungroup(_rows(dsq.transpose(0, 2, 1) @ _heads(qt[qs])), group)
    return dq, dk, dv
