"""Four fixes for Triton 3.8's CPU interpreter, applied only when the interpreter is in use.

- The interpreter keeps bfloat16 tensors as their uint16 bit patterns and its ``tl.dot`` multiplies
  those integers (it widens only 8-bit floats first), so every bf16 dot returns garbage. The patch
  widens bf16 operands to float32 bit-exactly (shift the 16 bits into the high half) before the
  product, which is what the GPU's tensor cores compute: bf16 products are exact in fp32.
- Its fp32 -> bf16 cast (``x.to(tl.bfloat16)``) truncates instead of rounding to nearest even (the GPU's
  ``cvt.rn.bf16.f32``), and maps fp32 subnormals to wrong values (-1.808e-40 -> -1.139e-38, found by the
  MXFP8 fuzzer). The patch rounds on the bit pattern: add 0x7FFF plus the kept lowest bit, shift (ties to
  even, subnormals and the carry into infinity included), NaN kept quiet.
- Its E4M3 (``tl.float8e4nv``) -> fp32 conversion decodes the NaN bytes 0x7F and 0xFF as +-480 (E4M3 without
  NaN); the GPU's ``cvt`` gives NaN. The patch decodes through a table of the 256 exact values.
- Its fp32 -> E4M3 conversion rounds half up on one cut-off bit (not ties to even) and mishandles
  subnormal results; the GPU's ``cvt.rn.satfinite.e4m3x2.f32`` rounds to nearest even, saturates finite
  values at +-448 and keeps NaN. The patch does that (torch's conversion after the saturation).
"""
from __future__ import annotations

import numpy as np

_PATCHED = False


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bit patterns of float32 ``x``, rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((u >> 16) | 0x40).astype(np.uint16), rounded)


def _f32_to_e4m3_bits(x: np.ndarray) -> np.ndarray:
    """E4M3 bytes of float32 ``x`` as ``cvt.rn.satfinite`` makes them: nearest even, finite values saturated
    at +-448, NaN kept (0x7F, sign kept)."""
    import torch

    x = np.ascontiguousarray(x, dtype=np.float32)
    clamped = np.where(np.isnan(x), x, np.clip(x, -448.0, 448.0))
    return torch.from_numpy(clamped).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def e4m3_values() -> np.ndarray:
    """float32 value of every E4M3 byte (OCP: bias 7, subnormals at exponent 0, NaN at S.1111.111)."""
    b = np.arange(256)
    e, m = (b >> 3) & 15, b & 7
    mag = np.where(e > 0, (8 + m) * 2.0 ** (e - 10), m * 2.0 ** -9)
    values = np.where(b & 0x80, -mag, mag).astype(np.float32)
    values[(b & 0x7F) == 0x7F] = np.nan
    return values


def install_bf16_dot_fix() -> None:
    """Idempotent; harmless when the interpreter is not in use."""
    global _PATCHED
    if _PATCHED:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = _bf16_bits_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32)
            b_data = _bf16_bits_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32)
            out = np.matmul(a_data, b_data, dtype=d.data.dtype) + d.data
            return interpreter.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    original_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
        return original_cast(self, src, dst_type)

    original_fp_to_fp = interpreter.InterpreterBuilder.create_fp_to_fp
    e4m3 = e4m3_values()

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float8e4nv and dst_type.scalar == tl.float32:
            return interpreter.TensorHandle(e4m3[src.data.astype(np.uint8)], tl.float32)
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            return interpreter.TensorHandle(_f32_to_e4m3_bits(src.data), tl.float8e4nv)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    _PATCHED = True
