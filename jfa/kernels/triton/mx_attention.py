"""Portable MXFP8 jagged attention (Triton), forward and backward: CUDA and the CPU interpreter alike.

The semantics are docs/mxfp8.md section 2, exactly. Operands travel as E4M3 bytes and E8M0 scale bytes
and are dequantized in the kernel, exactly: ``element * 2^(scale - 127)`` in fp32 (an E8M0 byte 0xFF or
an E4M3 NaN byte gives NaN). The dots take the dequantized tiles as fp32 with IEEE precision (``DOT ==
"ieee"``, the interpreter's default) or as bf16 (``"bf16"``, CUDA's default): every dequantized value is
exact in bf16 unless it is below 2^-126.

Forward: the dense portable forward's structure (``jfa.kernels.triton.forward``: a tile list over
(query tile, head), a branch-free bulk of KV chunks and a masked tail, online softmax in base 2) with the
running maximum kept as the integer ``ceil`` of the running max of the logits t, so every rescale factor
is an exact power of two. P is quantized in the kernel along keys, in the sequence's 32-key blocks (every
chunk starts on a multiple of BLOCK_N, a multiple of 32, from the sequence's first key, so the blocks
lie inside chunks). Each block is quantized from ``2^(t - c)`` with ``c`` the integer ceil of the block's
own largest logit; its dequantized values are then moved to the running maximum m by the exact factor
``2^(c - m)``. MX quantization is equivariant under powers of two, so this is the contract's
``(2^(t - M))^(keys)`` (docs/mxfp8.md, "Why the integer maximum"), and the element and scale bytes of a
block depend on the block's logits alone: not on BLOCK_N, the KV order or the running maximum the
program held (``t - m`` would round differently for every m). ``l`` sums the dequantized P, ``acc`` the
products with V^(keys).

Backward (the straight-through table of section 2): ``delta = rowsum(dO * O) - dlse`` (the dense
backward's pre-pass, :func:`jfa.kernels.triton.backward.row_delta`); a dK/dV kernel over (key tile,
key/value head) that streams the query tiles of its sequence (and the query heads of its group) and a
dQ kernel over (query tile, head) that streams the keys, both peeled like the dense ones. In the kernels
P = exp2(c S - lse2) from Q^(dim), K^(dim); dV += P^(queries)^T dO^(queries); dP = dO^(dim) V^(dim)^T;
dS = P (dP - delta); dK += dS^(queries)^T Q^(queries); dQ += dS^(keys) K^(keys); softmax_scale is
applied to dq and dk in fp32. Query tiles start on the sequence's first row and BLOCK_M is a multiple
of 32, so P and dS are quantized along queries inside a tile; likewise along keys in the dQ kernel.

All MX operands are contiguous (``jfa.mx.quantize`` makes them so; the forward launcher copies any that
are not), so the kernels derive their strides from the head count and head dim. Row arithmetic is int64.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from jfa import mx as jmx
from jfa.kernels import alloc
from jfa.kernels.bands import window_band
from jfa.kernels.schedule import build_tile_list, output_offsets
from jfa.kernels.triton._interpreter import install_bf16_dot_fix
from jfa.kernels.triton.backward import key_tile_queries, row_delta
from jfa.kernels.triton.configs import Configs, KernelConfig, MAX_HEAD_DIM, padded_head_dim
from jfa.kernels.triton.forward import _head_dim_mask, _seq_bounds, dot_accumulate, query_tile_keys
from jfa.kernels.triton.mx_quant import _scale_exponent

install_bf16_dot_fix()

DOTS = ("ieee", "bf16")


# ----------------------------------------------------------------------------------------------------
# jit helpers
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _ldexp(x, n):
    """``x * 2^n`` for fp32 x and int32 n: two normal power-of-two factors built from their exponent bits,
    exact wherever ``x * 2^(n // 2)`` and the result are fp32 numbers (below 2^-252 the result is 0)."""
    n = tl.minimum(tl.maximum(n, -300), 254)
    a = n >> 1  # arithmetic shift: floor(n / 2)
    b = n - a
    fa = ((tl.maximum(a, -126) + 127) << 23).to(tl.float32, bitcast=True)
    fb = ((tl.maximum(b, -126) + 127) << 23).to(tl.float32, bitcast=True)
    return x * fa * fb


@triton.jit
def _decode(codes, exp, nan):
    """fp32 value of E4M3 bytes ``codes`` (int32 0..255) times ``2^exp`` (int32), NaN where ``nan`` or where
    the byte is an E4M3 NaN (0x7F, 0xFF). Exact: an E4M3 value is ``mant * 2^(max(e, 1) - 10)``."""
    e = (codes >> 3) & 15
    m = codes & 7
    mant = tl.where(e > 0, m + 8, m)
    val = _ldexp(mant.to(tl.float32), tl.maximum(e, 1) - 10 + exp)
    val = tl.where((codes & 0x80) != 0, -val, val)
    return tl.where(nan | ((codes & 0x7F) == 0x7F), float("nan"), val)


@triton.jit
def e8m0_factor(scales):
    """fp32 ``2^(b - 127)`` of E8M0 bytes ``scales`` (uint8), NaN for 0xFF (2^-127 is an fp32 subnormal)."""
    sb = scales.to(tl.int32)
    factor = tl.where(sb == 0, 0x00400000, sb << 23).to(tl.float32, bitcast=True)
    return tl.where(sb == 255, float("nan"), factor)


@triton.jit
def dequantize(codes, scales):
    """fp32 value of E4M3 bytes ``codes`` (uint8) times E8M0 scale bytes ``scales`` (uint8, broadcast against
    codes): the hardware fp8 conversion (exact; NaN for the bytes 0x7F/0xFF) and one multiply by
    ``e8m0_factor`` (exact: every product is an fp32 number or overflows). ``_decode``'s values with two
    instructions per element (the TLX producer's way); the factors are computed at the scales' shape."""
    return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32) * e8m0_factor(scales)


@triton.jit
def _load_dim(DATA, SCALES, rows, row_mask, offs_d, d_mask, stride_t, stride_st):
    """Dequantized ``[rows, BLOCK_D]`` tile of a D-axis MX operand (DATA, SCALES already at the head;
    element (t, d) has scale ``SCALES[t, d // 32]``); masked entries are 0."""
    mask = row_mask[:, None] & d_mask[None, :]
    codes = tl.load(DATA + rows[:, None] * stride_t + offs_d[None, :], mask=mask, other=0)
    return dequantize(codes, tl.load(SCALES + rows[:, None] * stride_st + (offs_d // 32)[None, :], mask=mask,
                                     other=127))


@triton.jit
def _load_tokens(DATA, SCALES, rows, block_rows, row_mask, offs_d, d_mask, stride_t):
    """Dequantized tile of a token-axis MX operand: element (t, d) has scale ``SCALES[block_rows(t), d]``
    (``block_rows``: the sequence's first scale row plus the local row // 32); data and scales share
    their strides. Masked entries are 0."""
    mask = row_mask[:, None] & d_mask[None, :]
    codes = tl.load(DATA + rows[:, None] * stride_t + offs_d[None, :], mask=mask, other=0)
    return dequantize(codes, tl.load(SCALES + block_rows[:, None] * stride_t + offs_d[None, :], mask=mask,
                                     other=127))


@triton.jit
def _operand(x, DOT: tl.constexpr):
    """A dequantized tile a program keeps across its loop, in the dots' input type (bf16 halves its
    registers; the conversion is exact)."""
    # one return: Triton 3.8 types every return of a function alike, even one a constexpr branch drops
    if DOT == "ieee":
        y = x
    else:
        y = x.to(tl.bfloat16)
    return y


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """``a @ b`` of dequantized fp32 tiles, fp32 result: IEEE fp32, or as bf16 (exact conversions)."""
    if DOT == "ieee":
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))


@triton.jit
def _dot_acc(acc, a, b, DOT: tl.constexpr):
    """``acc + a @ b`` (the dense kernels' ``dot_accumulate`` on the IEEE path)."""
    if DOT == "ieee":
        return dot_accumulate(acc, a, b, "ieee")
    return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)


@triton.jit
def _e4m3_grid(a):
    """``a`` (fp32, finite, 0 <= a <= 512) rounded to the nearest E4M3 value, ties to even, saturating at
    448: the value the quantizer's byte decodes to (``mx_quant._encode_e4m3``). The hardware conversion
    (``cvt.rn.satfinite.e4m3x2.f32`` and back, 3 instructions per 2 elements on sm_89+); the clamp first,
    so the result never depends on how a conversion saturates (tested bitwise against the quantizer on the
    interpreter and the GPU)."""
    return tl.minimum(a, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32)


@triton.jit
def _mx_blocks(x3, RCEIL: tl.constexpr):
    """(q, s, amax) of ``x3`` ``[R, NB, 32]`` fp32 MX-quantized in its blocks of 32 (the last axis): the signed
    element values ``q`` (fp32 on the E4M3 grid, ``[R, NB, 32]``), each block's clamped scale exponent ``s``
    ``[R, NB, 1]`` and the fp32 bits of its largest ``|x|`` ``[R, NB]`` (>= 0x7F800000: the block holds a NaN or an
    infinity). The element bytes are ``q``'s E4M3 codes."""
    bits = x3.to(tl.int32, bitcast=True)
    amax = tl.max(bits & 0x7FFFFFFF, 2)  # fp32 patterns of non-negatives order like the values
    s = _scale_exponent(amax, RCEIL)[:, :, None]
    q = _e4m3_grid(tl.abs(_ldexp(x3, -s)))
    return tl.where(x3 < 0, -q, q), s, amax


@triton.jit
def _mx_values(x3, RCEIL: tl.constexpr):
    """``x3`` ``[R, NB, 32]`` fp32 MX-quantized in its blocks of 32 (the last axis) and dequantized: exactly
    ``_decode`` of ``mx_quant._quantize_tile``'s bytes (tested bitwise), NaN for a block holding a NaN or an
    infinity. Exact in fp32: the scaled values lie below 512 and every E4M3 value times ``2^s`` (s >= -127)
    is an fp32 number."""
    q, s, amax = _mx_blocks(x3, RCEIL)
    val = _ldexp(q, s)
    return tl.where((amax >= 0x7F800000)[:, :, None], float("nan"), val)


@triton.jit
def _mx_round(x, RCEIL: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """``x`` ``[ROWS, COLS]`` fp32 MX-quantized in blocks of 32 consecutive columns and dequantized (fp32)."""
    return tl.reshape(_mx_values(tl.reshape(x, [ROWS, COLS // 32, 32]), RCEIL), [ROWS, COLS])


@triton.jit
def mx_elements(x, RCEIL: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(E4M3 elements ``[ROWS, COLS]``, E8M0 scale bytes ``[ROWS, COLS // 32]``) of ``x`` (fp32) MX-quantized in
    blocks of 32 consecutive columns: the operands of a block-scaled MMA, decoding to ``_mx_round``'s values (a block
    holding a NaN or an infinity: NaN elements and the NaN scale 0xFF)."""
    q, s, amax = _mx_blocks(tl.reshape(x, [ROWS, COLS // 32, 32]), RCEIL)
    nan = amax >= 0x7F800000
    codes = tl.reshape(tl.where(nan[:, :, None], float("nan"), q), [ROWS, COLS]).to(tl.float8e4nv)
    return codes, tl.where(nan, 255, tl.reshape(s, [ROWS, COLS // 32]) + 127).to(tl.uint8)


@triton.jit
def weight_blocks(s, m_i, RCEIL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(q, se, shift, nan, m_new) of one KV chunk of base-2 logits ``s`` (-inf where invisible), the P quantization
    step every MX kernel shares: ``m_new`` the integer running maximum ``max(m_i, ceil(max s))``; per 32-key block
    ``[BLOCK_M, BLOCK_N // 32]`` the E4M3 element values ``q`` (fp32 on the E4M3 grid, ``[.., .., 32]``), the block's
    scale exponent ``se`` and its move ``shift`` to m_new (the weights are ``q 2^(se + shift)``) and ``nan`` (the
    block holds a NaN logit). Each
    block is quantized from ``2^(s - c)``, c the ceil of its own max, then moved by the exact ``2^(c - m_new)``
    (module docstring)."""
    s3 = tl.reshape(s, [BLOCK_M, BLOCK_N // 32, 32])
    c = tl.math.ceil(tl.max(s3, 2))  # [BLOCK_M, blocks]; -inf for a block with no visible key
    c_use = tl.where(c == float("-inf"), 0.0, c)
    p3 = tl.math.exp2(s3 - c_use[:, :, None])  # >= 0, the block's largest in (1/2, 1] (NaN from a NaN logit)
    # _mx_values for non-negative blocks whose largest is at most 1: the scale exponent se <= -7, so 2^-se is
    # one normal factor
    amax = tl.max(p3.to(tl.int32, bitcast=True), 2)
    se = _scale_exponent(amax, RCEIL)
    q = _e4m3_grid(p3 * ((127 - se) << 23).to(tl.float32, bitcast=True)[:, :, None])
    m_new = tl.maximum(m_i, tl.max(c, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    # c - m_new <= 0 is an integer (an all-zero block's shift is irrelevant); below -300 the values are 0
    shift = tl.minimum(tl.maximum(c_use - m_use[:, None], -300.0), 0.0).to(tl.int32)
    return q, se, shift, amax >= 0x7F800000, m_new


@triton.jit
def quantized_weights(s, m_i, RCEIL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(P^, m_new) of one KV chunk of base-2 logits ``s`` (-inf where invisible): ``m_new`` is the integer
    running maximum ``max(m_i, ceil(max s))`` and P^ the chunk's weights ``(2^(s - M))^(keys)``
    dequantized relative to m_new (``weight_blocks``' values). Shared by the TLX Hopper forward."""
    q, se, shift, nan, m_new = weight_blocks(s, m_i, RCEIL, BLOCK_M, BLOCK_N)
    p = tl.where(nan[:, :, None], float("nan"), _ldexp(q, (se + shift)[:, :, None]))
    return tl.reshape(p, [BLOCK_M, BLOCK_N]), m_new


@triton.jit
def pow2_step(m_old, m_new):
    """The exact rescale factor ``2^(m_old - m_new)`` of two integer running maxima (0 for m_old = -inf)."""
    d = tl.minimum(tl.maximum(m_old - m_new, -300.0), 0.0).to(tl.int32)
    return _ldexp(tl.full(m_old.shape, 1.0, tl.float32), d)


@triton.jit
def visible_keys(offs_m, offs_kn, len_k, causal_shift, band_lo, band_hi, CAUSAL: tl.constexpr,
                  WINDOW: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]``: query row i (local) sees key j (local): in range, inside the band or causal."""
    visible = (offs_kn < len_k)[None, :]
    if WINDOW:
        offset = offs_kn[None, :] - offs_m[:, None]
        visible = visible & (offset >= band_lo) & (offset <= band_hi)
    elif CAUSAL:
        visible = visible & (offs_kn[None, :] <= offs_m[:, None] + causal_shift)
    return visible


# ----------------------------------------------------------------------------------------------------
# forward kernel
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _mx_fwd_kv_step(acc, m_i, l_i, q, K, KS, V, VS, k_row0, vb0, n_start, offs_m, offs_n, offs_d, d_mask,
                    stride_kt, stride_kst, len_k, causal_shift, qk_scale, band_lo, band_hi,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, RCEIL: tl.constexpr,
                    DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One KV chunk of the online softmax with MX-quantized weights. MASKED: the causal diagonal, the
    window's band and the sequence's last partial chunk; the bulk chunks are fully visible."""
    offs_kn = n_start + offs_n
    rows = (k_row0 + offs_kn).to(tl.int64)
    n_mask = offs_kn < len_k
    k = _load_dim(K, KS, rows, n_mask, offs_d, d_mask, stride_kt, stride_kst)
    v = _load_tokens(V, VS, rows, vb0 + offs_kn // 32, n_mask, offs_d, d_mask, stride_kt)
    s = _dot(q, tl.trans(k), DOT) * qk_scale
    if MASKED:
        visible = visible_keys(offs_m, offs_kn, len_k, causal_shift, band_lo, band_hi, CAUSAL, WINDOW)
        s = tl.where(visible, s, float("-inf"))
    p, m_new = quantized_weights(s, m_i, RCEIL, BLOCK_M, BLOCK_N)
    alpha = pow2_step(m_i, tl.where(m_new == float("-inf"), 0.0, m_new))
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot_acc(acc * alpha[:, None], p, v, DOT)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])  # per-batch values: no recompiles
def mx_fwd_kernel(
    Q, QS, K, KS, V, VS, VB_OFF, OUT, LSE, CU_Q, CU_K, TILES,
    stride_ot, stride_oh,
    num_seqs, num_heads, num_kv_heads, len_q_bcast, sm_scale, band_lo, band_hi,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr,
    RCEIL: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out, lse of one (query tile, head). Q, K: D-axis MX bytes ``[T, H, D]`` with scales ``[T, H, NB]``;
    V: token-axis bytes with scales ``[rows, H_kv, D]``, sequence b's first scale row ``VB_OFF[b]``."""
    NB: tl.constexpr = (HEAD_DIM + 31) // 32
    pid = tl.program_id(0)
    slot = pid // num_heads
    head = pid % num_heads
    kv_head = head // (num_heads // num_kv_heads)
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:  # a spare slot of the tile list (see jfa.kernels.schedule)
        return
    tile = tl.load(TILES + tl.num_programs(0) // num_heads + slot)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    vb0 = tl.load(VB_OFF + seq).to(tl.int64)

    m_start = tile * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    m_mask = offs_m < len_q

    stride_qt = num_heads * HEAD_DIM
    stride_kt = num_kv_heads * HEAD_DIM
    hq = head.to(tl.int64)
    hk = kv_head.to(tl.int64)
    q = _operand(_load_dim(Q + hq * HEAD_DIM, QS + hq * NB, (q_row0 + offs_m).to(tl.int64), m_mask, offs_d, d_mask,
                           stride_qt, num_heads * NB), DOT)
    K += hk * HEAD_DIM
    KS += hk * NB
    V += hk * HEAD_DIM
    VS += hk * HEAD_DIM

    qk_scale = sm_scale * 1.4426950408889634  # log2(e): the loop works in base 2
    causal_shift = len_k - len_q  # bottom-right alignment: row i sees keys j <= i + Lk - Lq
    lo, hi, kv_begin, bulk_end, kv_end = query_tile_keys(m_start, len_q, len_k, causal_shift, band_lo, band_hi,
                                                         CAUSAL, WINDOW, BLOCK_M, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n_start in range(kv_begin, bulk_end, BLOCK_N):
        acc, m_i, l_i = _mx_fwd_kv_step(acc, m_i, l_i, q, K, KS, V, VS, k_row0, vb0, n_start, offs_m, offs_n,
                                        offs_d, d_mask, stride_kt, num_kv_heads * NB, len_k, causal_shift,
                                        qk_scale, lo, hi, MASKED=False, CAUSAL=CAUSAL, WINDOW=WINDOW, RCEIL=RCEIL,
                                        DOT=DOT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    for n_start in range(bulk_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _mx_fwd_kv_step(acc, m_i, l_i, q, K, KS, V, VS, k_row0, vb0, n_start, offs_m, offs_n,
                                        offs_d, d_mask, stride_kt, num_kv_heads * NB, len_k, causal_shift,
                                        qk_scale, lo, hi, MASKED=True, CAUSAL=CAUSAL, WINDOW=WINDOW, RCEIL=RCEIL,
                                        DOT=DOT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)

    # rows that saw no key: out = 0, lse = -inf (the contract); l_i == 0 exactly there, else l_i >= 1/2
    # (or NaN, from a NaN operand: it reaches out and lse)
    seen = l_i != 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    out_rows = (out_row0 + offs_m).to(tl.int64)
    o_ptrs = OUT + hq * stride_oh + out_rows[:, None] * stride_ot + offs_d[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
    tl.store(LSE + out_rows * num_heads + head, lse, mask=m_mask)


# ----------------------------------------------------------------------------------------------------
# backward kernels
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _mx_dkdv_q_step(dk, dv, k, v, Q, QS, QT, QTS, DO, DOS, DOT_, DOTS, LSE, DELTA, q_row0, out_row0, qb0, ob0,
                    m_start, offs_n, offs_d, d_mask, num_heads, head, len_q, causal_shift, qk_scale,
                    band_lo, band_hi, MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                    RCEIL: tl.constexpr, DOT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """One query tile's contribution to this program's dK, dV (transposed: rows are keys, columns are the
    tile's queries, so P^T and dS^T are quantized along their columns). Q.., DO.. are at the head."""
    NB: tl.constexpr = (HEAD_DIM + 31) // 32
    offs_m = m_start + tl.arange(0, BLOCK_M)
    m_mask = offs_m < len_q
    q_rows = (q_row0 + offs_m).to(tl.int64)
    o_rows = (out_row0 + offs_m).to(tl.int64)
    stride_t = num_heads * HEAD_DIM
    q = _load_dim(Q, QS, q_rows, m_mask, offs_d, d_mask, stride_t, num_heads * NB)
    do = _load_dim(DO, DOS, o_rows, m_mask, offs_d, d_mask, stride_t, num_heads * NB)
    lse = tl.load(LSE + o_rows * num_heads + head, mask=m_mask, other=float("-inf"))
    delta = tl.load(DELTA + o_rows * num_heads + head, mask=m_mask, other=0.0)
    # a row that saw no key has lse = -inf and P = 0: use +inf so exp2(s - lse) is 0, not inf * 0
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    s_t = _dot(k, tl.trans(q), DOT) * qk_scale  # [BLOCK_N, BLOCK_M]
    p_t = tl.math.exp2(s_t - lse2[None, :])
    if MASKED:
        visible = m_mask[None, :]  # keys past the sequence are rows of their own, never stored
        if WINDOW:
            offset = offs_n[:, None] - offs_m[None, :]
            visible = visible & (offset >= band_lo) & (offset <= band_hi)
        elif CAUSAL:
            visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_shift)
        p_t = tl.where(visible, p_t, 0.0)
    do_t = _load_tokens(DOT_, DOTS, o_rows, ob0 + offs_m // 32, m_mask, offs_d, d_mask, stride_t)
    dv = _dot_acc(dv, _mx_round(p_t, RCEIL, BLOCK_N, BLOCK_M), do_t, DOT)
    dp_t = _dot(v, tl.trans(do), DOT)
    ds_t = p_t * (dp_t - delta[None, :])
    q_t = _load_tokens(QT, QTS, q_rows, qb0 + offs_m // 32, m_mask, offs_d, d_mask, stride_t)
    dk = _dot_acc(dk, _mx_round(ds_t, RCEIL, BLOCK_N, BLOCK_M), q_t, DOT)
    return dk, dv


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])  # per-batch values: no recompiles
def mx_dkdv_kernel(
    Q, QS, QT, QTS, QB_OFF, K, KS, V, VS, DO, DOS, DOT_, DOTS, OB_OFF, LSE, DELTA, DK, DV, CU_Q, CU_K, TILES,
    num_seqs, num_heads, num_kv_heads, len_q_bcast, sm_scale, band_lo, band_hi,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr,
    RCEIL: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dK, dV of one (key tile, key/value head): the fp32 sum over the group's query heads (each head's
    P and dS quantized on their own). Q/QS and DO/DOS: D-axis MX; QT/QTS, DOT_/DOTS: token-axis MX
    (queries: the sequence's first scale rows QB_OFF[b], OB_OFF[b]; a broadcast Q has one sequence);
    K/KS, V/VS: D-axis MX. DK, DV: ``[T_k, H_kv, D]`` contiguous."""
    NB: tl.constexpr = (HEAD_DIM + 31) // 32
    pid = tl.program_id(0)
    slot = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    group = num_heads // num_kv_heads
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:  # a spare slot of the tile list
        return
    tile = tl.load(TILES + tl.num_programs(0) // num_kv_heads + slot)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    if BROADCAST_Q:
        qb0 = tl.load(QB_OFF).to(tl.int64)
    else:
        qb0 = tl.load(QB_OFF + seq).to(tl.int64)
    ob0 = tl.load(OB_OFF + seq).to(tl.int64)

    n_start = tile * BLOCK_N
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    n_mask = offs_n < len_k
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k_rows = (k_row0 + offs_n).to(tl.int64)
    hk = kv_head.to(tl.int64)
    stride_kt = num_kv_heads * HEAD_DIM
    k = _operand(_load_dim(K + hk * HEAD_DIM, KS + hk * NB, k_rows, n_mask, offs_d, d_mask, stride_kt,
                           num_kv_heads * NB), DOT)
    v = _operand(_load_dim(V + hk * HEAD_DIM, VS + hk * NB, k_rows, n_mask, offs_d, d_mask, stride_kt,
                           num_kv_heads * NB), DOT)

    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q
    lo, hi, first, diag_end, bulk_end, tail_end = key_tile_queries(n_start, len_q, len_k, causal_shift, band_lo,
                                                                    band_hi, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # the group's query heads as the outer index of one loop level (as the dense kernel): masked tiles
    # (the causal diagonal or the band, and the last partial tile), then the fully visible bulk
    num_diag = diag_end - first
    n_masked = num_diag + tail_end - bulk_end
    for j in range(0, group * n_masked):
        g = j // n_masked
        s = j - g * n_masked
        i = tl.where(s < num_diag, first + s, bulk_end + s - num_diag)
        head = kv_head * group + g
        hq = head.to(tl.int64)
        dk, dv = _mx_dkdv_q_step(dk, dv, k, v, Q + hq * HEAD_DIM, QS + hq * NB, QT + hq * HEAD_DIM,
                                 QTS + hq * HEAD_DIM, DO + hq * HEAD_DIM, DOS + hq * NB, DOT_ + hq * HEAD_DIM,
                                 DOTS + hq * HEAD_DIM, LSE, DELTA, q_row0, out_row0, qb0, ob0, i * BLOCK_M, offs_n,
                                 offs_d, d_mask, num_heads, head, len_q, causal_shift, qk_scale, lo, hi,
                                 MASKED=True, CAUSAL=CAUSAL, WINDOW=WINDOW, RCEIL=RCEIL, DOT=DOT,
                                 HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    n_bulk = bulk_end - diag_end
    for j in range(0, group * n_bulk):
        g = j // n_bulk
        i = diag_end + j - g * n_bulk
        head = kv_head * group + g
        hq = head.to(tl.int64)
        dk, dv = _mx_dkdv_q_step(dk, dv, k, v, Q + hq * HEAD_DIM, QS + hq * NB, QT + hq * HEAD_DIM,
                                 QTS + hq * HEAD_DIM, DO + hq * HEAD_DIM, DOS + hq * NB, DOT_ + hq * HEAD_DIM,
                                 DOTS + hq * HEAD_DIM, LSE, DELTA, q_row0, out_row0, qb0, ob0, i * BLOCK_M, offs_n,
                                 offs_d, d_mask, num_heads, head, len_q, causal_shift, qk_scale, lo, hi,
                                 MASKED=False, CAUSAL=CAUSAL, WINDOW=WINDOW, RCEIL=RCEIL, DOT=DOT,
                                 HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    dk = dk * sm_scale
    ptrs = hk * HEAD_DIM + k_rows[:, None] * stride_kt + offs_d[None, :]
    tl.store(DK + ptrs, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _mx_dq_kv_step(dq, q, do, lse2, delta, K, KS, KT, KTS, V, VS, k_row0, kb0, n_start, offs_m, offs_n, offs_d,
                   d_mask, num_kv_heads, len_k, causal_shift, qk_scale, band_lo, band_hi,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, RCEIL: tl.constexpr,
                   DOT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One KV chunk's contribution to dQ; dS is quantized along the chunk's keys (its columns)."""
    NB: tl.constexpr = (HEAD_DIM + 31) // 32
    offs_kn = n_start + offs_n
    rows = (k_row0 + offs_kn).to(tl.int64)
    n_mask = offs_kn < len_k
    stride_t = num_kv_heads * HEAD_DIM
    k = _load_dim(K, KS, rows, n_mask, offs_d, d_mask, stride_t, num_kv_heads * NB)
    v = _load_dim(V, VS, rows, n_mask, offs_d, d_mask, stride_t, num_kv_heads * NB)
    s = _dot(q, tl.trans(k), DOT) * qk_scale
    p = tl.math.exp2(s - lse2[:, None])
    if MASKED:
        visible = visible_keys(offs_m, offs_kn, len_k, causal_shift, band_lo, band_hi, CAUSAL, WINDOW)
        p = tl.where(visible, p, 0.0)
    dp = _dot(do, tl.trans(v), DOT)
    ds = p * (dp - delta[:, None])
    k_t = _load_tokens(KT, KTS, rows, kb0 + offs_kn // 32, n_mask, offs_d, d_mask, stride_t)
    return _dot_acc(dq, _mx_round(ds, RCEIL, BLOCK_M, BLOCK_N), k_t, DOT)


@triton.jit(do_not_specialize=["num_seqs", "len_q_bcast"])  # per-batch values: no recompiles
def mx_dq_kernel(
    Q, QS, K, KS, KT, KTS, KB_OFF, V, VS, DO, DOS, LSE, DELTA, DQ, CU_Q, CU_K, TILES,
    num_seqs, num_heads, num_kv_heads, len_q_bcast, sm_scale, band_lo, band_hi,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr,
    RCEIL: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dQ of one (query tile, head); DQ rows are output rows ``[rows, H, D]`` contiguous (per-sequence
    partials for a broadcast Q). KT/KTS: K along keys (sequence b's first scale row KB_OFF[b])."""
    NB: tl.constexpr = (HEAD_DIM + 31) // 32
    pid = tl.program_id(0)
    slot = pid // num_heads
    head = pid % num_heads
    seq = tl.load(TILES + slot)
    if seq >= num_seqs:
        return
    tile = tl.load(TILES + tl.num_programs(0) // num_heads + slot)
    q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)
    kb0 = tl.load(KB_OFF + seq).to(tl.int64)

    m_start = tile * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = _head_dim_mask(offs_d, HEAD_DIM, BLOCK_D)
    m_mask = offs_m < len_q
    hq = head.to(tl.int64)
    hk = (head // (num_heads // num_kv_heads)).to(tl.int64)
    stride_t = num_heads * HEAD_DIM
    q_rows = (q_row0 + offs_m).to(tl.int64)
    o_rows = (out_row0 + offs_m).to(tl.int64)
    q = _operand(_load_dim(Q + hq * HEAD_DIM, QS + hq * NB, q_rows, m_mask, offs_d, d_mask, stride_t,
                           num_heads * NB), DOT)
    do = _operand(_load_dim(DO + hq * HEAD_DIM, DOS + hq * NB, o_rows, m_mask, offs_d, d_mask, stride_t,
                            num_heads * NB), DOT)
    lse = tl.load(LSE + o_rows * num_heads + head, mask=m_mask, other=float("-inf"))
    delta = tl.load(DELTA + o_rows * num_heads + head, mask=m_mask, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    K += hk * HEAD_DIM
    KS += hk * NB
    KT += hk * HEAD_DIM
    KTS += hk * HEAD_DIM
    V += hk * HEAD_DIM
    VS += hk * NB

    qk_scale = sm_scale * 1.4426950408889634
    causal_shift = len_k - len_q
    lo, hi, kv_begin, bulk_end, kv_end = query_tile_keys(m_start, len_q, len_k, causal_shift, band_lo, band_hi,
                                                         CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n_start in range(kv_begin, bulk_end, BLOCK_N):
        dq = _mx_dq_kv_step(dq, q, do, lse2, delta, K, KS, KT, KTS, V, VS, k_row0, kb0, n_start, offs_m, offs_n,
                            offs_d, d_mask, num_kv_heads, len_k, causal_shift, qk_scale, lo, hi, MASKED=False,
                            CAUSAL=CAUSAL, WINDOW=WINDOW, RCEIL=RCEIL, DOT=DOT, HEAD_DIM=HEAD_DIM,
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    for n_start in range(bulk_end, kv_end, BLOCK_N):
        dq = _mx_dq_kv_step(dq, q, do, lse2, delta, K, KS, KT, KTS, V, VS, k_row0, kb0, n_start, offs_m, offs_n,
                            offs_d, d_mask, num_kv_heads, len_k, causal_shift, qk_scale, lo, hi, MASKED=True,
                            CAUSAL=CAUSAL, WINDOW=WINDOW, RCEIL=RCEIL, DOT=DOT, HEAD_DIM=HEAD_DIM,
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    dq = dq * sm_scale
    ptrs = DQ + hq * HEAD_DIM + o_rows[:, None] * stride_t + offs_d[None, :]
    tl.store(ptrs, dq.to(DQ.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


# ----------------------------------------------------------------------------------------------------
# launchers
# ----------------------------------------------------------------------------------------------------
# key: the head-dim bucket. Blocks are multiples of 32 (the MX block): a query tile's P (backward: P and
# dS along queries) and a KV chunk's P or dS along keys are quantized inside the tile. The dQ configs of
# D 64 and 128 are the fastest of five timed on the H200 inside the shipped MXFP8 backward
# (``python -m jfa.bench.mx_backward --dq-configs``, NOTES.md session 23); every dQ config tried spills at
# 255 registers, the faster ones more. The others: the largest tiles that build without spilling,
# chosen offline, not timed.
_MX_TABLE: dict[int, Configs] = {
    32: Configs(KernelConfig(64, 64, 8, 2), KernelConfig(64, 64, 8, 2), KernelConfig(64, 64, 8, 2)),
    64: Configs(KernelConfig(64, 64, 8, 2), KernelConfig(32, 64, 8, 2), KernelConfig(64, 64, 4, 2)),
    128: Configs(KernelConfig(64, 32, 8, 2), KernelConfig(32, 64, 8, 2), KernelConfig(128, 64, 8, 2)),
    256: Configs(KernelConfig(32, 32, 8, 1), KernelConfig(32, 32, 8, 1), KernelConfig(32, 32, 8, 1)),
}


def mx_configs(head_dim: int) -> Configs:
    """The MX kernels' launch configs for ``head_dim`` (1..256)."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim: the MX kernels take 1..{MAX_HEAD_DIM}, got {head_dim}")
    return _MX_TABLE[max(32, padded_head_dim(head_dim))]


def _check_config(config: Configs) -> Configs:
    for name in ("forward", "dkdv", "dq"):
        c = getattr(config, name)
        if c.block_m % jmx.BLOCK or c.block_n % jmx.BLOCK or c.block_m <= 0 or c.block_n <= 0:
            raise ValueError(f"config.{name}: block_m and block_n must be positive multiples of {jmx.BLOCK} "
                             f"(the MX block), got {c.block_m} and {c.block_n}")
        if c.block_m & (c.block_m - 1) or c.block_n & (c.block_n - 1):
            raise ValueError(f"config.{name}: block sizes must be powers of two, got {c.block_m} and {c.block_n}")
    return config


def _dot_mode(device: torch.device, dot: Optional[str]) -> str:
    """"ieee" (fp32 dots) on the interpreter, "bf16" (exact conversions of the dequantized tiles) on CUDA."""
    if dot is None:
        return "ieee" if device.type == "cpu" else "bf16"
    if dot not in DOTS:
        raise ValueError(f"dot: must be one of {DOTS} or None, got {dot!r}")
    return dot


def _check_rule(rule: str) -> None:
    if rule not in jmx.RULES:
        raise ValueError(f"rule: must be one of {jmx.RULES}, got {rule!r}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def mx_forward(q: jmx.MXTensor, k: jmx.MXTensor, v: jmx.MXTensor, cu_q, cu_k, *, causal: bool, softmax_scale: float,
               broadcast_q: bool, num_seqs: int, len_q_bcast: int = 0, window=(-1, -1), rule: str = "floor",
               out_dtype=torch.bfloat16, config: Optional[Configs] = None,
               dot: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out ``[rows, H, D]`` out_dtype, lse ``[rows, H]`` fp32), rows = total_q or ``B * Lq`` for a
    broadcast Q (``cu_q`` is then ignored). q, k: ``axis="dim"`` MXTensors; v: ``axis="tokens"``, quantized
    by ``cu_k``. ``rule``: the rule P is quantized with. ``config`` (a ``configs.Configs``; only
    ``forward`` is used): the tile sizes, default :func:`mx_configs`; ``dot``: "ieee" or "bf16" (default:
    ieee on the interpreter, bf16 on CUDA)."""
    _check_rule(rule)
    if q.axis != "dim" or k.axis != "dim" or v.axis != "tokens":
        raise ValueError(f"q, k, v: expected MX axes ('dim', 'dim', 'tokens'), "
                         f"got ({q.axis!r}, {k.axis!r}, {v.axis!r})")
    total_q, num_heads, head_dim = q.shape
    total_k, num_kv_heads, _ = k.shape
    if tuple(v.shape) != tuple(k.shape) or k.shape[2] != head_dim or num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"q, k, v: incompatible shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    cfg = _check_config(config or mx_configs(head_dim)).forward
    out_cu, rows, out, lse = alloc.forward_outputs(q, cu_q, num_seqs, len_q_bcast, broadcast_q, out_dtype)
    if rows == 0 or num_heads == 0:
        return out, lse
    tiles = build_tile_list(out_cu, rows, cfg.block_m, work_offsets=cu_k)
    if tiles.num_slots == 0:
        return out, lse
    causal, band, band_lo, band_hi = window_band(causal, window)
    mx_fwd_kernel[(tiles.num_slots * num_heads,)](
        _bytes(q.data), q.scales.contiguous(), _bytes(k.data), k.scales.contiguous(), _bytes(v.data),
        v.scales.contiguous(), jmx.token_block_offsets(cu_k), out, lse, out_cu, cu_k, tiles.tiles,
        out.stride(0), out.stride(1),
        num_seqs, num_heads, num_kv_heads, len_q_bcast, softmax_scale, band_lo, band_hi,
        HEAD_DIM=head_dim, CAUSAL=causal and not band, WINDOW=band, BROADCAST_Q=broadcast_q,
        RCEIL=rule == "rceil", DOT=_dot_mode(q.device, dot),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=padded_head_dim(head_dim),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out, lse


def mx_backward(q, k, v, out, lse, dout, cu_q, cu_k, *, causal: bool, softmax_scale: float, broadcast_q: bool,
                num_seqs: int, len_q_bcast: int = 0, window=(-1, -1), rule: str = "floor", dlse=None,
                config: Optional[Configs] = None, dot: Optional[str] = None, dkdv=None):
    """(dq, dk, dv) in the inputs' dtypes; dq is ``[Lq, H, D]`` summed over the batch for a broadcast Q.

    q, k, v, dout: the original high-precision tensors; out, lse: the MX forward's. Each operand is
    quantized here (``jfa.mx.encode``, ``rule``) along the axes of docs/mxfp8.md's backward table: Q along
    dim and queries (a broadcast Q's offsets are [0, Lq]), K along dim and keys, V along dim, dout along dim
    and queries (the output rows' offsets). ``dlse`` (optional, ``[rows, H]``) enters as ``delta - dlse``.
    No atomics: bitwise reproducible. ``config``/``dot``: as :func:`mx_forward` (``dkdv`` and ``dq`` used).
    ``dkdv``: another dK/dV launcher in place of this module's kernel (the TLX build,
    ``jfa.kernels.tlx.hopper.backward.mx_dkdv_tlx``), called as ``dkdv(q_dim, q_tok, k_dim, v_dim, do_dim,
    do_tok, lse, delta, dk, dv, out_cu, cu_k, causal=, softmax_scale=, broadcast_q=, num_seqs=, len_q_bcast=,
    rule=)`` with the quantized operands; it writes dk and dv (no window: the caller checked)."""
    _check_rule(rule)
    head_dim, num_heads = q.shape[-1], q.shape[1]
    num_kv_heads = k.shape[1]
    cfgs = _check_config(config or mx_configs(head_dim))
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    rows = out.shape[0]
    dk = alloc.empty(k.shape, k.dtype, k.device)
    dv = alloc.empty(v.shape, v.dtype, v.device)
    if broadcast_q:
        dq_rows = alloc.empty((rows, num_heads, head_dim), torch.float32, q.device)
    else:
        dq_rows = alloc.empty(q.shape, q.dtype, q.device)
    if num_heads == 0:
        return (dq_rows.sum(0).to(q.dtype) if broadcast_q else dq_rows), dk, dv
    if rows == 0 or q.shape[0] == 0 or k.shape[0] == 0:
        # no query row or no key anywhere: every gradient is 0 (no launch on an empty tensor)
        dk.zero_()
        dv.zero_()
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device), dk, dv
    causal, band, band_lo, band_hi = window_band(causal, window)
    common = dict(HEAD_DIM=head_dim, CAUSAL=causal and not band, WINDOW=band, BROADCAST_Q=broadcast_q,
                  RCEIL=rule == "rceil", DOT=_dot_mode(q.device, dot), BLOCK_D=padded_head_dim(head_dim))

    q_cu = torch.tensor([0, q.shape[0]], dtype=torch.int64, device=q.device) if broadcast_q else cu_q
    q_dim, q_tok = jmx.encode(q, "dim", None, rule), jmx.encode(q, "tokens", q_cu, rule)
    k_dim, k_tok = jmx.encode(k, "dim", None, rule), jmx.encode(k, "tokens", cu_k, rule)
    v_dim = jmx.encode(v, "dim", None, rule)
    do_dim, do_tok = jmx.encode(dout, "dim", None, rule), jmx.encode(dout, "tokens", out_cu, rule)
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()  # the delta pre-pass reads rows
    out = out if out.stride(-1) == 1 else out.contiguous()
    delta = row_delta(out, dout, dlse)
    lse = lse.contiguous()

    if dkdv is not None:
        if band:
            raise ValueError("mx_backward: a dkdv launcher takes no sliding window")
        dkdv(q_dim, q_tok, k_dim, v_dim, do_dim, do_tok, lse, delta, dk, dv, out_cu, cu_k, causal=causal,
             softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast,
             rule=rule)
    kv_tiles = None if dkdv is not None else build_tile_list(cu_k, k.shape[0], cfgs.dkdv.block_n,
                                                             work_offsets=None if broadcast_q else cu_q)
    if kv_tiles is not None and kv_tiles.num_slots > 0:
        mx_dkdv_kernel[(kv_tiles.num_slots * num_kv_heads,)](
            _bytes(q_dim.data), q_dim.scales, _bytes(q_tok.data), q_tok.scales, q_tok.block_offsets,
            _bytes(k_dim.data), k_dim.scales, _bytes(v_dim.data), v_dim.scales,
            _bytes(do_dim.data), do_dim.scales, _bytes(do_tok.data), do_tok.scales, do_tok.block_offsets,
            lse, delta, dk, dv, out_cu, cu_k, kv_tiles.tiles,
            num_seqs, num_heads, num_kv_heads, len_q_bcast, softmax_scale, band_lo, band_hi,
            BLOCK_M=cfgs.dkdv.block_m, BLOCK_N=cfgs.dkdv.block_n,
            num_warps=cfgs.dkdv.num_warps, num_stages=cfgs.dkdv.num_stages, **common)

    q_tiles = build_tile_list(out_cu, rows, cfgs.dq.block_m, work_offsets=cu_k)
    if q_tiles.num_slots > 0:
        mx_dq_kernel[(q_tiles.num_slots * num_heads,)](
            _bytes(q_dim.data), q_dim.scales, _bytes(k_dim.data), k_dim.scales, _bytes(k_tok.data), k_tok.scales,
            k_tok.block_offsets, _bytes(v_dim.data), v_dim.scales, _bytes(do_dim.data), do_dim.scales,
            lse, delta, dq_rows, out_cu, cu_k, q_tiles.tiles,
            num_seqs, num_heads, num_kv_heads, len_q_bcast, softmax_scale, band_lo, band_hi,
            BLOCK_M=cfgs.dq.block_m, BLOCK_N=cfgs.dq.block_n,
            num_warps=cfgs.dq.num_warps, num_stages=cfgs.dq.num_stages, **common)
    if broadcast_q:
        # fixed-order fp32 reduction of the per-sequence partials: deterministic, no atomics
        dq = dq_rows.view(num_seqs, len_q_bcast, num_heads, head_dim).sum(0).to(q.dtype)
        return dq, dk, dv
    return dq_rows, dk, dv
