"""MXFP8 (OCP Microscaling v1.0) quantizer in NumPy: the root of trust for ``jfa.mx`` and its kernels.

Everything here is exact float64/integer arithmetic, written to be read; docs/mxfp8.md ("Quantizer") is
the same rules in prose. It never imports torch.

Formats
- Element: E4M3 (``torch.float8_e4m3fn``): 1 sign, 4 exponent (bias 7), 3 mantissa bits. Normal values
  ``(1 + m/8) * 2^(e-7)`` for exponent field e in 1..15 (e=15, m=7 is NaN: bytes 0x7F and 0xFF), subnormal
  ``m/8 * 2^-6`` for e = 0. Largest finite 448, smallest subnormal 2^-9; no infinities.
- Scale: E8M0, one unsigned byte b meaning 2^(b-127); b = 0xFF is NaN. Exponents are kept in [-127, 127].

Encoding a real number y to E4M3 (:func:`encode_e4m3`): round to nearest, ties to even, into the
subnormal range as well; saturating: every |y| >= 448 (infinity included) becomes +-448; NaN becomes
0x7F with y's sign bit (0x7F or 0xFF); the sign of zero (and of a value that rounds to zero) is kept.

A block (32 elements, :data:`BLOCK`) with amax = max |x| gets the scale exponent s
- ``rule="floor"`` (OCP): ``s = floor(log2 amax) - 8`` (8 = emax of E4M3). Elements ``x / 2^s`` are below
  512, those above 464 saturate to 448.
- ``rule="rceil"``: ``s = ceil(log2(amax / 448))``, the smallest k with ``amax <= 448 * 2^k``: nothing
  saturates. Equivalently ``s = floor(log2 amax) - 8 + (amax > 1.75 * 2^floor(log2 amax))``: RCEIL is
  FLOOR or FLOOR + 1.
- s is clamped to [-127, 127]; the scale byte is s + 127.
- An all-zero block has amax 0 and gets the smallest scale, byte 0x00 (2^-127; the limit of both rules
  as amax -> 0, where the clamp applies anyway); its elements are 0x00 (0x80 for -0.0).
- A block holding a NaN or an infinity gets scale byte 0xFF (NaN) and every element byte 0x7F (NaN):
  all 32 dequantize to NaN.
- Elements are ``encode_e4m3(x * 2^-s)`` (the product is exact in float64).

Blocking axes (``axis``):
- ``"dim"``: along the last axis of ``x`` (``[T, H, D]`` in jfa): elements ``32j .. 32j+31`` of a row form
  block j. ``D % 32 != 0`` is allowed: the tail block is zero-filled (zeros never change amax).
  Scales have shape ``x.shape[:-1] + (ceil(D / 32),)``.
- ``"tokens"``: along axis 0 within each sequence of a packed ``x`` (``[T, H, D]``) with offsets
  ``cu_seqlens`` (``[B+1]``): block i of sequence b is rows ``cu[b] + 32i .. min(cu[b] + 32(i+1), cu[b+1])``
  (never straddling a sequence; a short tail block is zero-filled), independently for every (h, d).
  Its scales are row ``block_offsets[b] + i`` of a ``[NB, H, D]`` array, where ``block_offsets`` is the
  prefix sum of ``ceil(L_b / 32)`` (:func:`token_block_offsets`) and ``NB = block_offsets[B]``.
  (The device quantizer allocates ``(T + 31 B) // 32 >= NB`` rows so that it needs no host sync; its
  first NB rows are these.)

Inputs are float64 arrays holding the exact values of the bf16/fp16/fp32 tensor (every such value is a
float64); the result is a pair of uint8 arrays (element bytes, scale bytes).
"""
from __future__ import annotations

import numpy as np

from jfa.oracle.offsets import as_offsets

__all__ = [
    "BLOCK", "E4M3_MAX", "E8M0_NAN", "E4M3_NAN", "SCALE_EXP_MIN", "SCALE_EXP_MAX", "RULES", "AXES",
    "encode_e4m3", "decode_e4m3", "decode_e8m0", "scale_exponent", "scale_bits", "token_block_offsets",
    "quantize_mx", "dequantize_mx",
]

BLOCK = 32
E4M3_MAX = 448.0
E4M3_EMAX = 8  # floor(log2(448))
E4M3_EMIN = -6  # exponent of the smallest normal; subnormals are multiples of 2^(EMIN - 3) = 2^-9
E4M3_NAN = 0x7F
E8M0_NAN = 0xFF
SCALE_EXP_MIN, SCALE_EXP_MAX = -127, 127
RULES = ("floor", "rceil")
AXES = ("dim", "tokens")


# ----------------------------------------------------------------------------------------------------
# E4M3 elements
# ----------------------------------------------------------------------------------------------------
def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) exactly for finite a > 0 (frexp: a = m * 2^e with 0.5 <= m < 1)."""
    return np.frexp(a)[1].astype(np.int64) - 1


def encode_e4m3(y) -> np.ndarray:
    """float64 -> E4M3 bytes (uint8): RNE, subnormals exact, saturating to +-448 (infinities too),
    NaN -> 0x7F with the input's sign bit."""
    y = np.asarray(y, dtype=np.float64)
    sign = np.signbit(y).astype(np.uint8) << 7
    nan = np.isnan(y)
    # saturate first (448 is representable and rounding is monotone); NaN is set apart and patched in last
    a = np.where(nan, 0.0, np.minimum(np.abs(y), E4M3_MAX))
    nonzero = a > 0
    # exponent of a's quantum, plus 3: floor(log2 a), but never below the subnormal exponent
    e = np.where(nonzero, _floor_log2(np.where(nonzero, a, 1.0)), E4M3_EMIN)
    e = np.maximum(e, E4M3_EMIN)
    n = np.rint(np.ldexp(a, 3 - e)).astype(np.int64)  # a / 2^(e-3), exact; np.rint is ties-to-even
    # n is 8..16 for a normal result (16: the carry into the next exponent), 0..8 for a subnormal one;
    # the byte is exponent field (e + 7) times 8 plus the mantissa n - 8, which covers both and the carry
    bits = ((e + 7) << 3) + n - 8
    bits = np.where(nan, E4M3_NAN, bits).astype(np.uint8)
    return bits | sign


def decode_e4m3(bits) -> np.ndarray:
    """E4M3 bytes -> float64 (0x7F and 0xFF are NaN)."""
    b = np.asarray(bits).astype(np.int64)
    if np.any((b < 0) | (b > 255)):
        raise ValueError("bits: E4M3 bytes must be in 0..255")
    e = (b >> 3) & 0xF
    m = b & 0x7
    mag = np.where(e == 0, np.ldexp(m.astype(np.float64), -9), np.ldexp((8 + m).astype(np.float64), e - 10))
    mag = np.where((b & 0x7F) == E4M3_NAN, np.nan, mag)
    return np.where(b & 0x80, -mag, mag)


# ----------------------------------------------------------------------------------------------------
# E8M0 scales
# ----------------------------------------------------------------------------------------------------
def decode_e8m0(bits) -> np.ndarray:
    """E8M0 bytes -> float64: 2^(b-127), NaN for 0xFF."""
    b = np.asarray(bits).astype(np.int64)
    return np.where(b == E8M0_NAN, np.nan, np.ldexp(1.0, b - 127))


def _check_rule(rule) -> None:
    if rule not in RULES:
        raise ValueError(f"rule: must be one of {RULES}, got {rule!r}")


def scale_exponent(amax, rule: str) -> np.ndarray:
    """The clamped scale exponent s (int64) of blocks with finite ``amax >= 0`` under ``rule``."""
    _check_rule(rule)
    amax = np.asarray(amax, dtype=np.float64)
    if np.any(~np.isfinite(amax) | (amax < 0)):
        raise ValueError("amax: must be finite and >= 0 (a NaN/Inf block has no exponent: its byte is 0xFF)")
    positive = amax > 0
    safe = np.where(positive, amax, 1.0)
    s = _floor_log2(safe) - E4M3_EMAX  # FLOOR
    if rule == "rceil":
        # ceil(log2(amax / 448)): with amax = f * 2^L, 1 <= f < 2, and 448 = 1.75 * 2^8, it is L - 8 when
        # f <= 1.75 and L - 7 when f > 1.75 (exact: f is amax scaled by a power of two)
        f = np.ldexp(safe, -_floor_log2(safe))
        s = s + (f > 1.75)
    s = np.where(positive, s, SCALE_EXP_MIN)  # an all-zero block: the smallest scale
    return np.clip(s, SCALE_EXP_MIN, SCALE_EXP_MAX)


def scale_bits(amax, rule: str) -> np.ndarray:
    """E8M0 bytes (uint8) of blocks with block maximum |x| ``amax`` (NaN or Inf -> 0xFF)."""
    amax = np.asarray(amax, dtype=np.float64)
    finite = np.isfinite(amax)
    s = scale_exponent(np.where(finite, amax, 0.0), rule)
    return np.where(finite, s + 127, E8M0_NAN).astype(np.uint8)


# ----------------------------------------------------------------------------------------------------
# blocking
# ----------------------------------------------------------------------------------------------------
def token_block_offsets(cu_seqlens) -> np.ndarray:
    """``[B+1]`` int64: entry b is the scale row of sequence b's first block, the prefix sum of
    ``ceil(L_b / 32)``; the last entry is the number of token blocks NB."""
    cu = np.asarray(cu_seqlens).astype(np.int64)
    blocks = (np.diff(cu) + BLOCK - 1) // BLOCK
    return np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)


def _token_rows(cu: np.ndarray, total: int) -> np.ndarray:
    """The scale row of every token row t (``[T]`` int64)."""
    t = np.arange(total, dtype=np.int64)
    seq = np.searchsorted(cu, t, side="right") - 1  # the last b with cu[b] <= t: t's (non-empty) sequence
    return token_block_offsets(cu)[seq] + (t - cu[seq]) // BLOCK


def _check_axis(axis, x: np.ndarray, cu_seqlens) -> None:
    if axis not in AXES:
        raise ValueError(f"axis: must be one of {AXES}, got {axis!r}")
    if x.ndim < 1:
        raise ValueError(f"x: expected at least 1 dimension, got shape {x.shape}")
    if axis == "dim" and cu_seqlens is not None:
        raise ValueError("cu_seqlens: only the 'tokens' axis takes offsets; pass None with axis='dim'")
    if axis == "tokens" and cu_seqlens is None:
        raise ValueError("cu_seqlens: required with axis='tokens' (blocks never straddle sequences)")


def quantize_mx(x, axis: str, cu_seqlens=None, rule: str = "floor") -> tuple[np.ndarray, np.ndarray]:
    """MXFP8-quantize ``x`` (float64 values) in blocks of 32 along ``axis``; returns
    ``(element_bytes, scale_bytes)``, both uint8: elements shaped like ``x``, scales
    ``x.shape[:-1] + (ceil(D/32),)`` for ``axis="dim"`` and ``(NB,) + x.shape[1:]`` for ``axis="tokens"``."""
    x = np.asarray(x, dtype=np.float64)
    _check_axis(axis, x, cu_seqlens)
    _check_rule(rule)
    mag = np.abs(x)  # NaN stays NaN, so a block's amax is NaN or Inf exactly when it holds one
    if axis == "dim":
        d = x.shape[-1]
        nb = -(-d // BLOCK)
        padded = np.zeros(x.shape[:-1] + (nb * BLOCK,))
        padded[..., :d] = mag
        amax = padded.reshape(x.shape[:-1] + (nb, BLOCK)).max(axis=-1, initial=0.0)
        # every element's block is its index along D divided by 32
        expand = lambda per_block: np.repeat(per_block, BLOCK, axis=-1)[..., :d]  # noqa: E731
    else:
        cu = as_offsets(cu_seqlens, "cu_seqlens", x.shape[0])
        rows = _token_rows(cu, x.shape[0])
        amax = np.zeros((int(token_block_offsets(cu)[-1]),) + x.shape[1:])
        np.maximum.at(amax, rows, mag)  # np.maximum propagates NaN
        expand = lambda per_block: per_block[rows]  # noqa: E731
    finite = np.isfinite(amax)
    s = scale_exponent(np.where(finite, amax, 0.0), rule)
    scales = np.where(finite, s + 127, E8M0_NAN).astype(np.uint8)
    elements = encode_e4m3(np.ldexp(x, -expand(s)))
    elements = np.where(expand(finite), elements, E4M3_NAN).astype(np.uint8)
    return elements, scales


def dequantize_mx(element_bits, scale_bits, axis: str, cu_seqlens=None) -> np.ndarray:
    """float64 values of an MXFP8 tensor: ``decode_e4m3(element) * 2^(scale - 127)``, NaN where either
    is NaN. Shapes as :func:`quantize_mx` returns them (extra scale rows past NB, as the device
    quantizer leaves, are ignored)."""
    elements = np.asarray(element_bits)
    scales = np.asarray(scale_bits)
    _check_axis(axis, elements, cu_seqlens)
    if axis == "dim":
        d = elements.shape[-1]
        nb = -(-d // BLOCK)
        if scales.shape != elements.shape[:-1] + (nb,):
            raise ValueError(f"scale_bits: expected shape {elements.shape[:-1] + (nb,)}, got {scales.shape}")
        per_element = np.repeat(scales, BLOCK, axis=-1)[..., :d]
    else:
        cu = as_offsets(cu_seqlens, "cu_seqlens", elements.shape[0])
        nb = int(token_block_offsets(cu)[-1])
        if scales.shape[1:] != elements.shape[1:] or scales.shape[0] < nb:
            raise ValueError(f"scale_bits: expected shape ({nb} or more,) + {elements.shape[1:]}, got {scales.shape}")
        per_element = scales[_token_rows(cu, elements.shape[0])]
    return decode_e4m3(elements) * decode_e8m0(per_element)
