"""Portable block-sparse jagged attention (Triton), forward and backward, CUDA and CPU interpreter alike.

The dense portable kernels' steps (``_fwd_kv_step``, ``_dq_kv_step``, ``_dkdv_q_step``) driven by block
lists (:mod:`jfa.kernels.block_lists`) instead of a sequence's whole key range:

* forward and dQ: one program per (query sub-tile of ``BLOCK_M`` rows, head) walks the key blocks its
  query block lists, each in chunks of ``BLOCK_N`` keys;
* dK/dV: one program per (key sub-tile of ``BLOCK_N`` keys, unit of query heads) walks, for each query head
  of the unit, the query blocks that list its key block (the transposed lists), in chunks of ``BLOCK_M``
  rows. A key block no query block lists gets dK = dV = 0.

A chunk every row sees whole (inside the sequence, wholly at or before the causal diagonal of the
chunk's first row) takes the unmasked step, any other the masked one; chunks past the sequence or wholly
in the causal future are skipped. Programs are ordered by listed blocks (sequences by their listed blocks,
heaviest first, each sequence's blocks together: ``jfa.kernels.block_lists.heaviest_first``). No atomics:
gradients are bitwise reproducible.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.block_lists import (BlockLists, heaviest_first, key_blocks, query_blocks, slot_order, transpose,
                                     transposed_counts)
from jfa.kernels.schedule import output_offsets
from jfa.kernels.triton._interpreter import install_bf16_dot_fix
from jfa.kernels.triton.backward import _dkdv_q_step, _dq_kv_step, dq_row_tile, row_delta
from jfa.kernels.triton.configs import configs_for, padded_head_dim
from jfa.kernels.triton.forward import _dot_precision, _fwd_kv_step, _head_dim_mask, _head_strides, _seq_bounds

install_bf16_dot_fix()


@triton.jit
def _query_slot(QBLOCKS, ORDER, pid, num_heads, num_q_slots, SPARSE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr):
    """(head, g, seq, m_start) of a query-side program: query block slot ``g`` (taken heaviest first), its
    sequence (``num_seqs`` for a spare slot) and the first row of its ``BLOCK_M``-row sub-tile."""
    SUB_M: tl.constexpr = SPARSE_BLOCK // BLOCK_M
    head = pid % num_heads
    rest = pid // num_heads
    g = tl.load(ORDER + rest // SUB_M)
    seq = tl.load(QBLOCKS + g)
    m_start = tl.load(QBLOCKS + num_q_slots + g) * SPARSE_BLOCK + (rest % SUB_M) * BLOCK_M
    return head, g, seq, m_start


@triton.jit
def _visible_keys(m_start, len_q, len_k, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """(kv_limit, full_limit): keys past kv_limit are seen by no row of the sub-tile, keys before full_limit
    by every row."""
    if CAUSAL:
        shift = len_k - len_q
        kv_limit = tl.minimum(len_k, tl.maximum(m_start + BLOCK_M + shift, 0))
        full_limit = tl.minimum(len_k, tl.maximum(m_start + shift + 1, 0))
    else:
        kv_limit = len_k
        full_limit = len_k
    return kv_limit, full_limit


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])
def sparse_fwd_kernel(
    Q, K, V, OUT, LSE, CU_Q, CU_K, QBLOCKS, ORDER, ROW_OFF, KV_IDX,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    num_seqs, num_heads, group, num_q_slots, HEAD_DIM: tl.constexpr, len_q_bcast, sm_scale,
    CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    head, g, seq, m_start = _query_slot(QBLOCKS, ORDER, tl.program_id(0), num_heads, num_q_slots, SPARSE_BLOCK,
                                        BLOCK_M)
    if seq >= num_seqs:  # a spare slot
        return
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    if m_start >= len_q:  # a sub-tile past the sequence's last query block's rows
        return
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    m_mask = offs_m < len_q
    kv_head = head // group
    q_rows = (q_row0 + offs_m).to(tl.int64)
    q = tl.load(Q + head.to(tl.int64) * stride_qh + q_rows[:, None] * stride_qt + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    K += kv_head.to(tl.int64) * stride_kh
    V += kv_head.to(tl.int64) * stride_vh
    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q
    kv_limit, full_limit = _visible_keys(m_start, len_q, len_k, CAUSAL, BLOCK_M)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row = head * num_q_slots + g
    for e in range(tl.load(ROW_OFF + row), tl.load(ROW_OFF + row + 1)):
        block_start = tl.load(KV_IDX + e) * SPARSE_BLOCK
        for c in range(0, SPARSE_BLOCK, BLOCK_N):
            n_start = block_start + c
            if n_start < kv_limit:
                if n_start + BLOCK_N <= full_limit:
                    acc, m_i, l_i = _fwd_kv_step(acc, m_i, l_i, q, K, V, k_row0, n_start, offs_m, offs_n, offs_d,
                                                 d_mask, stride_kt, stride_vt, len_k, causal_shift, qk_scale, 0, 0,
                                                 MASKED=False, CAUSAL=CAUSAL, WINDOW=False,
                                                 DOT_PRECISION=DOT_PRECISION)
                else:
                    acc, m_i, l_i = _fwd_kv_step(acc, m_i, l_i, q, K, V, k_row0, n_start, offs_m, offs_n, offs_d,
                                                 d_mask, stride_kt, stride_vt, len_k, causal_shift, qk_scale, 0, 0,
                                                 MASKED=True, CAUSAL=CAUSAL, WINDOW=False,
                                                 DOT_PRECISION=DOT_PRECISION)
    # rows that saw no listed key: out = 0, lse = -inf (l_i == 0 exactly there)
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    out_rows = (out_row0 + offs_m).to(tl.int64)
    tl.store(OUT + head.to(tl.int64) * stride_oh + out_rows[:, None] * stride_ot + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
    tl.store(LSE + out_rows * num_heads + head, lse, mask=m_mask)


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])
def sparse_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, QBLOCKS, ORDER, ROW_OFF, KV_IDX,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh, stride_dqt, stride_dqh,
    num_seqs, num_heads, group, num_q_slots, HEAD_DIM: tl.constexpr, len_q_bcast, sm_scale,
    CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dQ of one (query sub-tile, head); rows of DQ are output rows (per-sequence partials for a broadcast Q)."""
    head, g, seq, m_start = _query_slot(QBLOCKS, ORDER, tl.program_id(0), num_heads, num_q_slots, SPARSE_BLOCK,
                                        BLOCK_M)
    if seq >= num_seqs:
        return
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    if m_start >= len_q:
        return
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    q, do, lse2, delta, o_rows, row_mask = dq_row_tile(Q, DO, LSE, DELTA, head, q_row0, out_row0, offs_m, offs_d,
                                                       d_mask, len_q, num_heads, stride_qt, stride_qh, stride_dot,
                                                       stride_doh)
    hq = head.to(tl.int64)
    hkv = (head // group).to(tl.int64)
    K += hkv * stride_kh
    V += hkv * stride_vh
    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q
    kv_limit, full_limit = _visible_keys(m_start, len_q, len_k, CAUSAL, BLOCK_M)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row = head * num_q_slots + g
    for e in range(tl.load(ROW_OFF + row), tl.load(ROW_OFF + row + 1)):
        block_start = tl.load(KV_IDX + e) * SPARSE_BLOCK
        for c in range(0, SPARSE_BLOCK, BLOCK_N):
            n_start = block_start + c
            if n_start < kv_limit:
                if n_start + BLOCK_N <= full_limit:
                    dq = _dq_kv_step(dq, q, do, lse2, delta, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                                     stride_kt, stride_vt, len_k, causal_shift, qk_scale, 0, 0,
                                     MASKED=False, CAUSAL=CAUSAL, WINDOW=False, DOT_PRECISION=DOT_PRECISION)
                else:
                    dq = _dq_kv_step(dq, q, do, lse2, delta, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                                     stride_kt, stride_vt, len_k, causal_shift, qk_scale, 0, 0,
                                     MASKED=True, CAUSAL=CAUSAL, WINDOW=False, DOT_PRECISION=DOT_PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + hq * stride_dqh + o_rows[:, None] * stride_dqt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_mask)


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])
def sparse_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, KBLOCKS, ORDER, COL_OFF, Q_IDX,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    num_seqs, num_heads, group, kv_group, num_kv_slots, HEAD_DIM: tl.constexpr, len_q_bcast, sm_scale,
    CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dK, dV of one (key sub-tile, unit of ``group`` query heads reading key/value head
    ``unit * group // kv_group``): the sum over the unit's heads of the query blocks that list the key block."""
    SUB_N: tl.constexpr = SPARSE_BLOCK // BLOCK_N
    num_units = num_heads // group
    pid = tl.program_id(0)
    unit = pid % num_units
    rest = pid // num_units
    gk = tl.load(ORDER + rest // SUB_N)
    seq = tl.load(KBLOCKS + gk)
    if seq >= num_seqs:
        return
    tile = tl.load(KBLOCKS + num_kv_slots + gk)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    n_start = tile * SPARSE_BLOCK + (rest % SUB_N) * BLOCK_N
    if n_start >= len_k:
        return
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    kv_mask = (offs_n < len_k)[:, None] & d_mask[None, :]
    k_rows = (k_row0 + offs_n).to(tl.int64)
    hk = (unit * group // kv_group).to(tl.int64)
    k = tl.load(K + hk * stride_kh + k_rows[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + hk * stride_vh + k_rows[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for gi in range(0, group):
        head = unit * group + gi
        qh = Q + head.to(tl.int64) * stride_qh
        doh = DO + head.to(tl.int64) * stride_doh
        col = head * num_kv_slots + gk
        for e in range(tl.load(COL_OFF + col), tl.load(COL_OFF + col + 1)):
            block_start = tl.load(Q_IDX + e) * SPARSE_BLOCK
            for c in range(0, SPARSE_BLOCK, BLOCK_M):
                m_start = block_start + c
                # rows of the chunk exist, and (causal) its last row sees the sub-tile's first key
                live = m_start < len_q
                if CAUSAL:
                    live = live & (m_start + BLOCK_M - 1 + causal_shift >= n_start)
                if live:
                    full = m_start + BLOCK_M <= len_q
                    if CAUSAL:
                        full = full & (m_start + causal_shift >= n_start + BLOCK_N - 1)
                    if full:
                        dk, dv = _dkdv_q_step(dk, dv, k, v, qh, doh, LSE, DELTA, q_row0, out_row0, m_start, offs_n,
                                              offs_d, d_mask, stride_qt, stride_dot, num_heads, head, len_q,
                                              causal_shift, qk_scale, 0, 0, MASKED=False, CAUSAL=CAUSAL,
                                              WINDOW=False, DOT_PRECISION=DOT_PRECISION, BLOCK_M=BLOCK_M)
                    else:
                        dk, dv = _dkdv_q_step(dk, dv, k, v, qh, doh, LSE, DELTA, q_row0, out_row0, m_start, offs_n,
                                              offs_d, d_mask, stride_qt, stride_dot, num_heads, head, len_q,
                                              causal_shift, qk_scale, 0, 0, MASKED=True, CAUSAL=CAUSAL,
                                              WINDOW=False, DOT_PRECISION=DOT_PRECISION, BLOCK_M=BLOCK_M)
    dk = dk * sm_scale
    hu = unit.to(tl.int64)
    tl.store(DK + hu * stride_dkh + k_rows[:, None] * stride_dkt + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + hu * stride_dvh + k_rows[:, None] * stride_dvt + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=kv_mask)


def _tiles(block_size: int, head_dim: int, dtype: torch.dtype, pass_: str) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of a pass: the dense config's tiles, cut to the block size
    (a power of two: the tiles divide it)."""
    cfg = getattr(configs_for(head_dim, dtype), pass_)
    return min(cfg.block_m, block_size), min(cfg.block_n, block_size), cfg.num_warps, cfg.num_stages


def block_sparse_forward(q, k, v, cu_q, cu_k, lists: BlockLists, *, causal: bool, softmax_scale: float,
                         broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0):
    """(out [rows, H, D] in q's dtype, lse [rows, H] float32) of attention restricted to ``lists``' key
    blocks (rows: ``total_q``, or ``B * Lq`` for a broadcast Q). A row that sees no listed key gets
    out = 0, lse = -inf."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q)
    if rows == 0 or lists.num_q_slots == 0:
        return out, lse
    bs = lists.block_size
    block_m, block_n, warps, stages = _tiles(bs, head_dim, q.dtype, "forward")
    q_blocks = query_blocks(out_cu, rows, bs)
    sparse_fwd_kernel[(lists.num_q_slots * (bs // block_m) * num_heads,)](
        q, k, v, out, lse, out_cu, cu_k, q_blocks.tiles, slot_order(lists, q_blocks), lists.offsets, lists.indices,
        *_head_strides(q), *_head_strides(k), *_head_strides(v), *_head_strides(out),
        num_seqs, num_heads, num_heads // k.shape[1], lists.num_q_slots, head_dim, len_q_bcast, softmax_scale,
        CAUSAL=causal, BROADCAST_Q=broadcast_q, DOT_PRECISION=_dot_precision(q.dtype), SPARSE_BLOCK=bs,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=padded_head_dim(head_dim), num_warps=warps, num_stages=stages)
    return out, lse


def block_sparse_backward(q, k, v, out, lse, dout, cu_q, cu_k, lists: BlockLists, *, causal: bool,
                          softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None,
                          deterministic: bool = True):
    """(dq, dk, dv) of :func:`block_sparse_forward` in the inputs' dtypes; dq is ``[Lq, H, D]`` summed over
    the batch for a broadcast Q. ``dlse``: the gradient reaching the returned lse, if any. Always bitwise
    reproducible (no atomics): ``deterministic`` is accepted for a common signature."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    rows, total_k = out.shape[0], k.shape[0]
    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    if rows == 0 or q.shape[0] == 0 or total_k == 0 or lists.num_q_slots == 0:
        dk.zero_()
        dv.zero_()
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device), dk, dv
    bs = lists.block_size
    block_d = padded_head_dim(head_dim)
    precision = _dot_precision(q.dtype)
    group = num_heads // k.shape[1]
    delta = row_delta(out, dout, dlse)
    common = dict(CAUSAL=causal, BROADCAST_Q=broadcast_q, DOT_PRECISION=precision, SPARSE_BLOCK=bs, BLOCK_D=block_d)

    q_blocks = query_blocks(out_cu, rows, bs)
    k_blocks = key_blocks(cu_k, total_k, bs)
    cols = transpose(lists, q_blocks, cu_k, total_k)
    if k_blocks.num_slots > 0:
        # fp32 GQA: one chain per query head, the group's fp32 partials summed after (as in the dense backward)
        per_head = group > 1 and q.dtype == torch.float32
        heads_per_program = 1 if per_head else group
        dk_sum, dv_sum = ((alloc.empty((total_k, num_heads, head_dim), torch.float32, k.device) for _ in range(2))
                          if per_head else (dk, dv))
        block_m, block_n, warps, stages = _tiles(bs, head_dim, q.dtype, "dkdv")
        order = heaviest_first(transposed_counts(cols, num_heads), k_blocks)
        sparse_dkdv_kernel[(k_blocks.num_slots * (bs // block_n) * (num_heads // heads_per_program),)](
            q, k, v, dout, lse, delta, dk_sum, dv_sum, out_cu, cu_k, k_blocks.tiles, order, cols.offsets, cols.indices,
            *_head_strides(q), *_head_strides(k), *_head_strides(v), *_head_strides(dout),
            *_head_strides(dk_sum), *_head_strides(dv_sum),
            num_seqs, num_heads, heads_per_program, group, k_blocks.num_slots, head_dim, len_q_bcast, softmax_scale,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common)
        if per_head:
            dk.copy_(dk_sum.view(total_k, k.shape[1], group, head_dim).sum(dim=2))
            dv.copy_(dv_sum.view(total_k, k.shape[1], group, head_dim).sum(dim=2))
    else:
        dk.zero_()
        dv.zero_()

    dq = block_sparse_dq(q, k, v, lse, dout, delta, cu_q, cu_k, lists, causal=causal, softmax_scale=softmax_scale,
                         broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast)
    return dq, dk, dv


def block_sparse_dq(q, k, v, lse, dout, delta, cu_q, cu_k, lists: BlockLists, *, causal: bool, softmax_scale: float,
                    broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0):
    """dq of block-sparse attention in q's dtype (``[Lq, H, D]`` summed over the batch for a broadcast Q),
    each row written once in a fixed order; ``delta``: ``row_delta``'s."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    rows, bs = dout.shape[0], lists.block_size
    if rows == 0 or q.shape[0] == 0 or k.shape[0] == 0 or lists.num_q_slots == 0:
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    if broadcast_q:
        dq_rows = alloc.empty((rows, num_heads, head_dim), torch.float32, q.device)
    else:
        dq_rows = alloc.empty(q.shape, q.dtype, q.device)
    block_m, block_n, warps, stages = _tiles(bs, head_dim, q.dtype, "dq")
    q_blocks = query_blocks(out_cu, rows, bs)
    sparse_dq_kernel[(lists.num_q_slots * (bs // block_m) * num_heads,)](
        q, k, v, dout, lse, delta, dq_rows, out_cu, cu_k, q_blocks.tiles, slot_order(lists, q_blocks),
        lists.offsets, lists.indices, *_head_strides(q), *_head_strides(k), *_head_strides(v), *_head_strides(dout),
        *_head_strides(dq_rows), num_seqs, num_heads, num_heads // k.shape[1], lists.num_q_slots, head_dim,
        len_q_bcast, softmax_scale, CAUSAL=causal, BROADCAST_Q=broadcast_q, DOT_PRECISION=_dot_precision(q.dtype),
        SPARSE_BLOCK=bs, BLOCK_D=padded_head_dim(head_dim), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        num_stages=stages)
    if broadcast_q:
        # fixed-order reduction over the batch: deterministic, no atomics
        return dq_rows.view(num_seqs, len_q_bcast, num_heads, head_dim).sum(0).to(q.dtype)
    return dq_rows
