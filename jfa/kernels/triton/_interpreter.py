"""Two fixes for Triton 3.8's CPU interpreter, applied only when the interpreter is in use.

- The interpreter keeps bfloat16 tensors as their uint16 bit patterns and its ``tl.dot`` multiplies
  those integers (it widens only 8-bit floats first), so every bf16 dot returns garbage. The patch
  widens bf16 operands to float32 bit-exactly (shift the 16 bits into the high half) before the
  product, which is what the GPU's tensor cores compute: bf16 products are exact in fp32.
- Its fp32 -> bf16 cast (``x.to(tl.bfloat16)``) truncates instead of rounding to nearest even (the GPU's
  ``cvt.rn.bf16.f32``), and maps fp32 subnormals to wrong values (-1.808e-40 -> -1.139e-38, found by the
  MXFP8 fuzzer). The patch rounds on the bit pattern: add 0x7FFF plus the kept lowest bit, shift (ties to
  even, subnormals and the carry into infinity included), NaN kept quiet.
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

    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    _PATCHED = True
