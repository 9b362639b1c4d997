"""Portable jagged FlashAttention forward (Triton): runs on any CUDA GPU and, unchanged, on the CPU
interpreter.

One program owns one (query tile, head) pair taken from a host-built tile list and streams that
sequence's keys in ``BLOCK_N`` chunks with the online softmax. The KV loop is peeled: a branch-free
bulk over chunks every row of the tile fully sees, then a masked tail (causal diagonal and the
sequence's last partial chunk). A sliding window (``WINDOW``) visits only the chunks inside the tile's
band, each through the masked step. Grouped-query attention: query head h reads key/value head
h // group. Index arithmetic on token rows is int64, so tensors past 2**31 elements are addressed
correctly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.bands import band_offsets, window_band
from jfa.kernels.schedule import build_tile_list
from jfa.kernels.triton._interpreter import install_bf16_dot_fix
from jfa.kernels.triton.configs import configs_for, padded_head_dim

install_bf16_dot_fix()


@triton.jit
def _head_dim_mask(offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """A constant all-true mask when the head dim fills the block, so the compiler drops it and keeps
    16-byte vector loads (a runtime head-dim mask defeats the alignment analysis); a real mask only
    for padded head dims."""
    mask = offs_d < HEAD_DIM
    if HEAD_DIM == BLOCK_D:
        mask = tl.full([BLOCK_D], 1, tl.int1)
    return mask


@triton.jit
def _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q: tl.constexpr):
    """(q_row0, out_row0, Lq, k_row0, Lk) of sequence ``seq``; a broadcast Q is read from row 0."""
    k_row0 = tl.load(CU_K + seq).to(tl.int64)
    len_k = (tl.load(CU_K + seq + 1).to(tl.int64) - k_row0).to(tl.int32)
    if BROADCAST_Q:
        q_row0 = tl.zeros((), dtype=tl.int64)
        out_row0 = seq.to(tl.int64) * len_q_bcast
        len_q = len_q_bcast
    else:
        q_row0 = tl.load(CU_Q + seq).to(tl.int64)
        out_row0 = q_row0
        len_q = (tl.load(CU_Q + seq + 1).to(tl.int64) - q_row0).to(tl.int32)
    return q_row0, out_row0, len_q, k_row0, len_k


@triton.jit
def query_tile_keys(m_start, len_q, len_k, causal_shift, band_lo, band_hi, CAUSAL: tl.constexpr,
                    WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys the query tile of rows [m_start, m_start + BLOCK_M) sees: (lo, hi, kv_begin, bulk_end,
    kv_end). Chunks from kv_begin to bulk_end are fully visible to every row (no mask), chunks from
    bulk_end to kv_end are masked; with WINDOW, (lo, hi) is the band (``jfa.kernels.bands``) and every
    chunk from the first row's first key to the last row's last is masked (lo, hi are 0 otherwise).
    ``causal_shift``: Lk - Lq (row i sees keys j <= i + causal_shift)."""
    lo, hi = 0, 0
    if WINDOW:
        lo, hi = band_offsets(len_q, len_k, band_lo, band_hi)
        kv_begin = (tl.minimum(tl.maximum(m_start + lo, 0), len_k) // BLOCK_N) * BLOCK_N
        kv_end = tl.minimum(tl.maximum(tl.minimum(m_start + BLOCK_M, len_q) + hi, 0), len_k)
        bulk_end = kv_begin
    elif CAUSAL:
        kv_begin = 0
        kv_end = tl.minimum(len_k, tl.maximum(m_start + BLOCK_M + causal_shift, 0))
        bulk_end = (tl.minimum(len_k, tl.maximum(m_start + causal_shift + 1, 0)) // BLOCK_N) * BLOCK_N
    else:
        kv_begin = 0
        kv_end = len_k
        bulk_end = (len_k // BLOCK_N) * BLOCK_N
    return lo, hi, kv_begin, bulk_end, kv_end


@triton.jit
def dot_accumulate(acc, a, b, DOT_PRECISION: tl.constexpr):
    """``acc + a @ b`` in fp32. Tensor-core dots accumulate in place (one accumulator; the inputs' rounding
    dominates). fp32 dots ("ieee": FMA chains) sum the tile's products from zero and then add them: Triton
    fuses ``acc + dot(a, b)`` into one FMA chain through every tile of a sequence, whose rounding grows
    with the sequence length (on long sums of near-equal terms past 2x the fp32 reference's, found by
    jfa fuzz on the H200). The zero is ``acc * 0``: a constant zero would be fused again."""
    if DOT_PRECISION == "ieee":
        return acc + tl.dot(a, b, acc * 0.0, input_precision=DOT_PRECISION)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _fwd_kv_step(acc, m_i, l_i, q, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                 stride_kt, stride_vt, len_k, causal_shift, qk_scale, band_lo, band_hi,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One KV chunk of the online softmax (base-2 logits). MASKED handles the causal diagonal, the
    window's band and the sequence tail; the bulk instantiation carries no mask at all."""
    offs_kn = n_start + offs_n
    rows = (k_row0 + offs_kn).to(tl.int64)
    if MASKED:
        kv_mask = (offs_kn < len_k)[:, None] & d_mask[None, :]
        k = tl.load(K + rows[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + rows[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
    else:
        k = tl.load(K + rows[:, None] * stride_kt + offs_d[None, :], mask=d_mask[None, :], other=0.0)
        v = tl.load(V + rows[:, None] * stride_vt + offs_d[None, :], mask=d_mask[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        visible = (offs_kn < len_k)[None, :]
        if WINDOW:
            offset = offs_kn[None, :] - offs_m[:, None]
            visible = visible & (offset >= band_lo) & (offset <= band_hi)
        elif CAUSAL:
            visible = visible & (offs_kn[None, :] <= offs_m[:, None] + causal_shift)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row that has seen no key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = dot_accumulate(acc * alpha[:, None], p.to(v.dtype), v, DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])  # per-batch values: no recompiles
def jagged_fwd_kernel(
    Q, K, V, OUT, LSE, CU_Q, CU_K, TILES,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    num_seqs, num_heads, group, HEAD_DIM: tl.constexpr, len_q_bcast, sm_scale, band_lo, band_hi,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    slot = pid // num_heads
    head = pid % num_heads
    kv_head = head // group
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:  # a spare slot of the tile list (see jfa.kernels.schedule)
        return
    tile = tl.load(TILES + tl.num_programs(0) // num_heads + slot)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)

    m_start = tile * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    m_mask = offs_m < len_q

    Q += head.to(tl.int64) * stride_qh
    K += kv_head.to(tl.int64) * stride_kh
    V += kv_head.to(tl.int64) * stride_vh
    q_rows = (q_row0 + offs_m).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :], other=0.0)

    qk_scale = sm_scale * 1.4426950408889634  # log2(e): the loop works in base 2
    causal_shift = len_k - len_q  # bottom-right alignment: row i sees keys j <= i + Lk - Lq
    lo, hi, kv_begin, bulk_end, kv_end = query_tile_keys(m_start, len_q, len_k, causal_shift, band_lo, band_hi,
                                                         CAUSAL, WINDOW, BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n_start in range(kv_begin, bulk_end, BLOCK_N):
        acc, m_i, l_i = _fwd_kv_step(acc, m_i, l_i, q, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                                     stride_kt, stride_vt, len_k, causal_shift, qk_scale, lo, hi,
                                     MASKED=False, CAUSAL=CAUSAL, WINDOW=WINDOW, DOT_PRECISION=DOT_PRECISION)
    for n_start in range(bulk_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _fwd_kv_step(acc, m_i, l_i, q, K, V, k_row0, n_start, offs_m, offs_n, offs_d, d_mask,
                                     stride_kt, stride_vt, len_k, causal_shift, qk_scale, lo, hi,
                                     MASKED=True, CAUSAL=CAUSAL, WINDOW=WINDOW, DOT_PRECISION=DOT_PRECISION)

    # rows that saw no key: out = 0, lse = -inf (the contract); l_i == 0 exactly there
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    out_rows = (out_row0 + offs_m).to(tl.int64)
    o_ptrs = OUT + head.to(tl.int64) * stride_oh + out_rows[:, None] * stride_ot + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
    tl.store(LSE + out_rows * num_heads + head, lse, mask=m_mask)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not silently drop to tf32: the tolerance rule compares against an fp32 reference
    return "ieee" if dtype == torch.float32 else "tf32"


def _head_strides(t: torch.Tensor) -> tuple[int, int]:
    assert t.stride(-1) == 1, "the head dim must be contiguous (the API makes it so)"
    return t.stride(0), t.stride(1)


def jagged_forward(q, k, v, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                   num_seqs: int, len_q_bcast: int = 0, window=(-1, -1)):
    """Launch the forward. Returns (out [rows, H, D] in q's dtype, lse [rows, H] float32), where rows is
    ``total_q``, or ``B * Lq`` for a broadcast Q. ``cu_q`` is ignored for a broadcast Q. k and v may
    have fewer heads than q (a divisor: grouped-query attention); ``window=(left, right)`` as the API's
    ``window_size``."""
    head_dim = q.shape[-1]
    num_heads = q.shape[1]
    cfg = configs_for(head_dim, q.dtype).forward
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q)
    if rows == 0 or num_heads == 0:
        return out, lse
    tiles = build_tile_list(out_cu, rows, cfg.block_m, work_offsets=cu_k)
    if tiles.num_slots == 0:
        return out, lse
    causal, band, band_lo, band_hi = window_band(causal, window)
    jagged_fwd_kernel[(tiles.num_slots * num_heads,)](
        q, k, v, out, lse, out_cu, cu_k, tiles.tiles,
        *_head_strides(q), *_head_strides(k), *_head_strides(v), *_head_strides(out),
        num_seqs, num_heads, num_heads // k.shape[1], head_dim, len_q_bcast, softmax_scale, band_lo, band_hi,
        CAUSAL=causal and not band, WINDOW=band, BROADCAST_Q=broadcast_q, DOT_PRECISION=_dot_precision(q.dtype),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=padded_head_dim(head_dim),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out, lse
