"""Portable jagged FlashAttention backward (Triton), CUDA and CPU interpreter alike.

Three launches, none with atomics, so gradients are bitwise reproducible by construction:
1. ``delta = rowsum(dO * O)`` per row and head;
2. dK/dV: one program per (KV tile, head) streams the sequence's query tiles that can see it and
   keeps dK, dV in registers, written once;
3. dQ: one program per (query tile, head) streams the keys it sees (the forward's loop shape) and
   writes dQ once. For a broadcast Q each (sequence, tile) writes an fp32 partial and the partials
   are summed over the batch afterwards in a fixed order.
Both main loops are peeled like the forward: branch-free bulk, masked diagonal and tail; a sliding
window (``WINDOW``) visits only the band's tiles, each masked. Grouped-query attention: a dK/dV program
owns one key/value head and sums over its group's query heads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.bands import band_offsets, window_band
from jfa.kernels.schedule import build_tile_list, output_offsets
from jfa.kernels.triton._interpreter import install_bf16_dot_fix
from jfa.kernels.triton.configs import configs_for, padded_head_dim
from jfa.kernels.triton.forward import (
    _dot_precision,
    _head_dim_mask,
    _head_strides,
    _seq_bounds,
    dot_accumulate,
    query_tile_keys,
)

install_bf16_dot_fix()


@triton.jit(do_not_specialize=["num_rows"])
def delta_kernel(OUT, DOUT, DELTA, num_rows, num_heads, HEAD_DIM: tl.constexpr,
                 stride_ot, stride_oh, stride_dot, stride_doh,
                 BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta[t, h] = sum_d dO[t, h, d] * O[t, h, d] in fp32."""
    pid = tl.program_id(0)
    head = pid % num_heads
    offs_t = (pid // num_heads) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_t < num_rows)[:, None] & _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)[None, :]
    rows = offs_t.to(tl.int64)
    o = tl.load(OUT + head.to(tl.int64) * stride_oh + rows[:, None] * stride_ot + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DOUT + head.to(tl.int64) * stride_doh + rows[:, None] * stride_dot + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + rows * num_heads + head, delta, mask=offs_t < num_rows)


@triton.jit
def key_tile_queries(n_start, len_q, len_k, causal_shift, band_lo, band_hi, CAUSAL: tl.constexpr,
                     WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query tiles that see the key tile of rows [n_start, n_start + BLOCK_N): (lo, hi, first, diag_end,
    bulk_end, tail_end). Tiles [first, diag_end) (the causal diagonal, or a window's whole band) and
    [bulk_end, tail_end) (the sequence's last partial tile) are masked, [diag_end, bulk_end) fully visible;
    with WINDOW, (lo, hi) is the band (``jfa.kernels.bands``), 0 otherwise."""
    num_q_tiles = (len_q + BLOCK_M - 1) // BLOCK_M
    full_q_tiles = len_q // BLOCK_M
    lo, hi = 0, 0
    if WINDOW:
        # the query rows that see a key of this tile: i in [n_start - hi, last key - lo]; every tile masked
        lo, hi = band_offsets(len_q, len_k, band_lo, band_hi)
        first = tl.minimum(tl.maximum(n_start - hi, 0), len_q) // BLOCK_M
        last_key = tl.minimum(n_start + BLOCK_N, len_k) - 1
        diag_end = tl.maximum(first, (tl.minimum(tl.maximum(last_key - lo + 1, 0), len_q) + BLOCK_M - 1) // BLOCK_M)
    elif CAUSAL:
        # query i sees key j iff j <= i + shift: the first tile with any visible row, and the first
        # whose every row sees every key of this KV tile
        first = tl.maximum(n_start - causal_shift, 0) // BLOCK_M
        first_full = (tl.maximum(n_start + BLOCK_N - 1 - causal_shift, 0) + BLOCK_M - 1) // BLOCK_M
    else:
        first = 0
        first_full = 0
    if WINDOW:
        bulk_end = diag_end  # the band's tiles all go through the masked loop
        tail_end = diag_end
    else:
        diag_end = tl.maximum(first, tl.minimum(first_full, num_q_tiles))
        bulk_end = tl.maximum(diag_end, full_q_tiles)
        tail_end = num_q_tiles
    return lo, hi, first, diag_end, bulk_end, tail_end


@triton.jit
def _dkdv_q_step(dk, dv, k, v, Q, DO, LSE, DELTA, q_row0, out_row0, m_start, offs_n, offs_d, d_mask,
                 stride_qt, stride_dot, num_heads, head, len_q, causal_shift, qk_scale, band_lo, band_hi,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr):
    """Accumulate one query tile's contribution to this program's dK, dV (transposed formulation:
    rows are keys, columns are queries)."""
    offs_m = m_start + tl.arange(0, BLOCK_M)
    q_rows = (q_row0 + offs_m).to(tl.int64)
    o_rows = (out_row0 + offs_m).to(tl.int64)
    if MASKED:
        m_mask = offs_m < len_q
        q = tl.load(Q + q_rows[:, None] * stride_qt + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        do = tl.load(DO + o_rows[:, None] * stride_dot + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        lse = tl.load(LSE + o_rows * num_heads + head, mask=m_mask, other=0.0)
        delta = tl.load(DELTA + o_rows * num_heads + head, mask=m_mask, other=0.0)
    else:
        q = tl.load(Q + q_rows[:, None] * stride_qt + offs_d[None, :], mask=d_mask[None, :], other=0.0)
        do = tl.load(DO + o_rows[:, None] * stride_dot + offs_d[None, :], mask=d_mask[None, :], other=0.0)
        lse = tl.load(LSE + o_rows * num_heads + head)
        delta = tl.load(DELTA + o_rows * num_heads + head)
    # a row that saw no key has lse = -inf and P = 0: use +inf so exp2(s - lse) is 0, not inf * 0
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_N, BLOCK_M]
    p_t = tl.math.exp2(s_t - lse2[None, :])
    if MASKED:
        visible = (offs_m < len_q)[None, :]
        if WINDOW:
            offset = offs_n[:, None] - offs_m[None, :]
            visible = visible & (offset >= band_lo) & (offset <= band_hi)
        elif CAUSAL:
            visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
        p_t = tl.where(visible, p_t, 0.0)
    dv = dot_accumulate(dv, p_t.to(do.dtype), do, DOT_PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = dot_accumulate(dk, ds_t.to(q.dtype), q, DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])  # per-batch values: no recompiles
def jagged_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, TILES,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dkt, stride_dkh, stride_dvt, stride_dvh,
    num_seqs, num_heads, group, kv_group, HEAD_DIM: tl.constexpr, len_q_bcast, sm_scale, band_lo, band_hi,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dK, dV of one (key tile, unit of ``group`` query heads): the sum over the unit's query heads, which
    all read key/value head ``unit * group // kv_group`` (``kv_group`` query heads share a key/value head;
    ``group == kv_group``: the unit is that key/value head; ``group == 1``: one query head's partial)."""
    num_units = num_heads // group
    pid = tl.program_id(0)
    slot = pid // num_units
    unit = pid % num_units
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:  # a spare slot of the tile list
        return
    tile = tl.load(TILES + tl.num_programs(0) // num_units + slot)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)

    n_start = tile * BLOCK_N
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    n_mask = offs_n < len_k
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k_rows = (k_row0 + offs_n).to(tl.int64)
    hk = (unit * group // kv_group).to(tl.int64)  # the key/value head read
    hu = unit.to(tl.int64)  # the head of DK/DV written
    k = tl.load(K + hk * stride_kh + k_rows[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + hk * stride_vh + k_rows[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)

    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q
    lo, hi, first, diag_end, bulk_end, tail_end = key_tile_queries(n_start, len_q, len_k, causal_shift, band_lo,
                                                                   band_hi, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # the causal diagonal tiles and the last partial tile share one masked loop: a third loop (one
    # more inlined copy of the step) pushes D=128 causal past 255 registers and spills
    num_diag = diag_end - first
    # every query head of the key/value head's group, the group as the outer index of each loop (one loop
    # level: an outer loop over the group makes ptxas keep a stack frame)
    n_masked = num_diag + tail_end - bulk_end
    for j in range(0, group * n_masked):
        g = j // n_masked
        s = j - g * n_masked
        i = tl.where(s < num_diag, first + s, bulk_end + s - num_diag)
        head = unit * group + g
        dk, dv = _dkdv_q_step(dk, dv, k, v, Q + head.to(tl.int64) * stride_qh, DO + head.to(tl.int64) * stride_doh,
                              LSE, DELTA, q_row0, out_row0, i * BLOCK_M, offs_n, offs_d, d_mask, stride_qt, stride_dot,
                              num_heads, head, len_q, causal_shift, qk_scale, lo, hi, MASKED=True, CAUSAL=CAUSAL,
                              WINDOW=WINDOW, DOT_PRECISION=DOT_PRECISION, BLOCK_M=BLOCK_M)
    n_bulk = bulk_end - diag_end
    for j in range(0, group * n_bulk):
        g = j // n_bulk
        i = diag_end + j - g * n_bulk
        head = unit * group + g
        dk, dv = _dkdv_q_step(dk, dv, k, v, Q + head.to(tl.int64) * stride_qh, DO + head.to(tl.int64) * stride_doh,
                              LSE, DELTA, q_row0, out_row0, i * BLOCK_M, offs_n, offs_d, d_mask, stride_qt, stride_dot,
                              num_heads, head, len_q, causal_shift, qk_scale, lo, hi, MASKED=False, CAUSAL=CAUSAL,
                              WINDOW=WINDOW, DOT_PRECISION=DOT_PRECISION, BLOCK_M=BLOCK_M)
    dk = dk * sm_scale
    tl.store(DK + hu * stride_dkh + k_rows[:, None] * stride_dkt + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + hu * stride_dvh + k_rows[:, None] * stride_dvt + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_kv_step(dq, q, do, lse2, delta, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                stride_kt, stride_vt, len_k, causal_shift, qk_scale, band_lo, band_hi,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr):
    offs_kn = n_start + offs_n
    rows = (k_row0 + offs_kn).to(tl.int64)
    if MASKED:
        kv_mask = (offs_kn < len_k)[:, None] & d_mask[None, :]
    else:
        kv_mask = d_mask[None, :]
    k = tl.load(K + rows[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + rows[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    p = tl.math.exp2(s - lse2[:, None])
    if MASKED:
        visible = (offs_kn < len_k)[None, :]
        if WINDOW:
            offset = offs_kn[None, :] - offs_m[:, None]
            visible = visible & (offset >= band_lo) & (offset <= band_hi)
        elif CAUSAL:
            visible = visible & (offs_kn[None, :] <= offs_m[:, None] + causal_shift)
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    dq = dot_accumulate(dq, ds.to(k.dtype), k, DOT_PRECISION)
    return dq


@triton.jit
def dq_row_tile(Q, DO, LSE, DELTA, head, q_row0, out_row0, offs_m, offs_d, d_mask, len_q, num_heads,
                stride_qt, stride_qh, stride_dot, stride_doh):
    """What a dQ program holds for its query rows ``offs_m`` of ``head``: (q, do, lse2, delta, o_rows,
    row_mask), lse2 in base 2 with +inf for rows that saw no key (lse = -inf, P = 0: exp2(s - lse2) is
    then 0, not inf * 0)."""
    m_mask = offs_m < len_q
    row_mask = m_mask[:, None] & d_mask[None, :]
    hq = head.to(tl.int64)
    q_rows = (q_row0 + offs_m).to(tl.int64)
    o_rows = (out_row0 + offs_m).to(tl.int64)
    q = tl.load(Q + hq * stride_qh + q_rows[:, None] * stride_qt + offs_d[None, :], mask=row_mask, other=0.0)
    do = tl.load(DO + hq * stride_doh + o_rows[:, None] * stride_dot + offs_d[None, :], mask=row_mask, other=0.0)
    lse = tl.load(LSE + o_rows * num_heads + head, mask=m_mask, other=float("-inf"))
    delta = tl.load(DELTA + o_rows * num_heads + head, mask=m_mask, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    return q, do, lse2, delta, o_rows, row_mask


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])  # per-batch values: no recompiles
def jagged_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, TILES,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
    stride_dqt, stride_dqh,
    num_seqs, num_heads, group, HEAD_DIM: tl.constexpr, len_q_bcast, sm_scale, band_lo, band_hi,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dQ of one (query tile, head); rows of DQ are output rows (per-sequence partials for a broadcast Q)."""
    pid = tl.program_id(0)
    slot = pid // num_heads
    head = pid % num_heads
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:
        return
    tile = tl.load(TILES + tl.num_programs(0) // num_heads + slot)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)

    m_start = tile * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    q, do, lse2, delta, o_rows, row_mask = dq_row_tile(Q, DO, LSE, DELTA, head, q_row0, out_row0, offs_m, offs_d,
                                                       d_mask, len_q, num_heads, stride_qt, stride_qh, stride_dot,
                                                       stride_doh)
    hk = head.to(tl.int64)
    hkv = (head // group).to(tl.int64)
    K += hkv * stride_kh
    V += hkv * stride_vh

    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q
    lo, hi, kv_begin, bulk_end, kv_end = query_tile_keys(m_start, len_q, len_k, causal_shift, band_lo, band_hi,
                                                         CAUSAL, WINDOW, BLOCK_M, BLOCK_N)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n_start in range(kv_begin, bulk_end, BLOCK_N):
        dq = _dq_kv_step(dq, q, do, lse2, delta, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                         stride_kt, stride_vt, len_k, causal_shift, qk_scale, lo, hi,
                         MASKED=False, CAUSAL=CAUSAL, WINDOW=WINDOW, DOT_PRECISION=DOT_PRECISION)
    for n_start in range(bulk_end, kv_end, BLOCK_N):
        dq = _dq_kv_step(dq, q, do, lse2, delta, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                         stride_kt, stride_vt, len_k, causal_shift, qk_scale, lo, hi,
                         MASKED=True, CAUSAL=CAUSAL, WINDOW=WINDOW, DOT_PRECISION=DOT_PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + hk * stride_dqh + o_rows[:, None] * stride_dqt + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_mask)


def row_delta(out: torch.Tensor, dout: torch.Tensor, dlse=None) -> torch.Tensor:
    """``delta = rowsum(dO * O) - dlse`` per output row and head, float32 [rows, H] (the backward's
    pre-pass; ``dlse`` is the gradient reaching the returned lse, if any)."""
    rows, num_heads, head_dim = out.shape
    delta = alloc.empty((rows, num_heads), torch.float32, out.device)
    if rows > 0 and num_heads > 0:
        block_t = 64
        delta_kernel[(triton.cdiv(rows, block_t) * num_heads,)](
            out, dout, delta, rows, num_heads, head_dim, *_head_strides(out), *_head_strides(dout),
            BLOCK_T=block_t, BLOCK_D=padded_head_dim(head_dim))
    if dlse is not None:
        delta = delta - dlse.to(torch.float32)
    return delta


def jagged_backward(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float,
                    broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, dlse=None, dkdv=None,
                    deterministic: bool = True, window=(-1, -1)):
    """Gradients (dq, dk, dv) in the inputs' dtypes; dq is [Lq, H, D] summed over the batch for a broadcast Q.
    Always bitwise reproducible (no atomics): ``deterministic`` is accepted for a common signature.

    ``dlse`` (optional, [rows, H]): the gradient reaching the returned lse. Since d lse_i / d s_ij = P_ij,
    it enters exactly as ``delta - dlse``. ``dkdv`` (optional): a launcher that writes dk and dv in
    place of the portable dK/dV kernel (``jfa.kernels.tlx.hopper.backward.jagged_dkdv_tlx``'s signature)."""
    head_dim, num_heads = q.shape[-1], q.shape[1]
    cfgs = configs_for(head_dim, q.dtype)
    block_d = padded_head_dim(head_dim)
    precision = _dot_precision(q.dtype)
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    rows = out.shape[0]
    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    if broadcast_q:
        dq_rows = alloc.empty((rows, num_heads, head_dim), torch.float32, q.device)
    else:
        dq_rows = alloc.empty(q.shape, q.dtype, q.device)
    if num_heads == 0:
        return (dq_rows.sum(0) if broadcast_q else dq_rows), dk, dv
    if rows == 0 or q.shape[0] == 0 or k.shape[0] == 0:
        # no query row or no key anywhere: every gradient is 0, and no kernel is launched on an empty
        # tensor (its data pointer is null; the dK/dV kernel's unmasked bulk loads faulted on the H200)
        dk.zero_()
        dv.zero_()
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        return dq, dk, dv
    causal, band, band_lo, band_hi = window_band(causal, window)
    group = num_heads // k.shape[1]
    common = dict(CAUSAL=causal and not band, WINDOW=band, BROADCAST_Q=broadcast_q, DOT_PRECISION=precision,
                  BLOCK_D=block_d)

    delta = row_delta(out, dout, dlse)

    total_k = k.shape[0]
    if dkdv is not None:
        dkdv(q, k, v, dout, lse, delta, dk, dv, out_cu, cu_k, causal=causal, softmax_scale=softmax_scale,
             broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, window=window)
    kv_tiles = build_tile_list(cu_k, total_k, cfgs.dkdv.block_n,
                               work_offsets=None if broadcast_q else cu_q)
    if dkdv is None and kv_tiles.num_slots > 0:
        # fp32 gradients: each query head's contributions summed in a chain of their own, then the group's
        # fp32 partials (as the reference sums them). One chain over the whole group grows the rounding of
        # long correlated sums group-fold, past the rule's 2x of the fp32 reference (found by jfa fuzz on
        # the H200: GQA 3:1, broadcast Q of 3995 rows, an expanded dout). In bf16/fp16 the inputs' own
        # rounding dominates: one chain per key/value head, no partials' memory.
        per_head = group > 1 and q.dtype == torch.float32
        heads_per_program = 1 if per_head else group
        dk_sum, dv_sum = ((alloc.empty((total_k, num_heads, head_dim), torch.float32, k.device) for _ in range(2))
                          if per_head else (dk, dv))
        jagged_dkdv_kernel[(kv_tiles.num_slots * (num_heads // heads_per_program),)](
            q, k, v, dout, lse, delta, dk_sum, dv_sum, out_cu, cu_k, kv_tiles.tiles,
            *_head_strides(q), *_head_strides(k), *_head_strides(v), *_head_strides(dout),
            *_head_strides(dk_sum), *_head_strides(dv_sum),
            num_seqs, num_heads, heads_per_program, group, head_dim, len_q_bcast, softmax_scale, band_lo, band_hi,
            BLOCK_M=cfgs.dkdv.block_m, BLOCK_N=cfgs.dkdv.block_n,
            num_warps=cfgs.dkdv.num_warps, num_stages=cfgs.dkdv.num_stages, **common)
        if per_head:
            dk.copy_(dk_sum.view(total_k, k.shape[1], group, head_dim).sum(dim=2))
            dv.copy_(dv_sum.view(total_k, k.shape[1], group, head_dim).sum(dim=2))

    q_tiles = build_tile_list(out_cu, rows, cfgs.dq.block_m, work_offsets=cu_k)
    if q_tiles.num_slots > 0:
        jagged_dq_kernel[(q_tiles.num_slots * num_heads,)](
            q, k, v, dout, lse, delta, dq_rows, out_cu, cu_k, q_tiles.tiles,
            *_head_strides(q), *_head_strides(k), *_head_strides(v), *_head_strides(dout), *_head_strides(dq_rows),
            num_seqs, num_heads, group, head_dim, len_q_bcast, softmax_scale, band_lo, band_hi,
            BLOCK_M=cfgs.dq.block_m, BLOCK_N=cfgs.dq.block_n,
            num_warps=cfgs.dq.num_warps, num_stages=cfgs.dq.num_stages, **common)
    if broadcast_q:
        # fixed-order reduction over the batch: deterministic, no atomics
        dq = dq_rows.view(num_seqs, len_q_bcast, num_heads, head_dim).sum(0).to(q.dtype)
        return dq, dk, dv
    return dq_rows, dk, dv
