"""A fix for Triton 3.8's CPU interpreter, applied only when the interpreter is in use.

The interpreter keeps bfloat16 tensors as their uint16 bit patterns and its ``tl.dot`` multiplies
those integers (it widens only 8-bit floats first), so every bf16 dot returns garbage. The patch
widens bf16 operands to float32 bit-exactly (shift the 16 bits into the high half) before the
product, which is what the GPU's tensor cores compute: bf16 products are exact in fp32.
"""
from __future__ import annotations

import numpy as np

_PATCHED = False


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


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

    interpreter.InterpreterBuilder.create_dot = create_dot
    _PATCHED = True
