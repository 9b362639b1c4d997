"""Conversions between the interpreter's values (``tl.tensor`` over numpy, constexprs) and Python/numpy.

The interpreter keeps bf16 as its uint16 bit patterns and fp8 as uint8; these helpers widen such data
to float32 exactly (as tensor cores read it) and round float32 back to bf16 to nearest even.
"""
from __future__ import annotations

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as _interp
from jfa.kernels.triton._interpreter import e4m3_values

_unwrap = tl.core._unwrap_if_constexpr


def unwrap(x):
    return _unwrap(x)


def as_int(x, what: str = "value") -> int:
    x = _unwrap(x)
    if isinstance(x, tl.tensor):
        data = x.handle.data
        if data.size != 1:
            raise TypeError(f"{what} must be a scalar, got a tensor of shape {list(data.shape)}")
        return int(data.reshape(-1)[0])
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    return int(x)


def as_bool(x) -> bool:
    return bool(as_int(x, "predicate"))


def np_dtype(dtype) -> np.dtype:
    return _interp._get_np_dtype(dtype)


_E4M3 = e4m3_values()  # E4M3's 256 values, the table the interpreter fix decodes with


def e8m0_to_f32(data: np.ndarray) -> np.ndarray:
    """float32 ``2^(b - 127)`` of E8M0 scale bytes (NaN for 0xFF; 2^-127 is an fp32 subnormal)."""
    b = data.astype(np.int64)
    return np.where(b == 255, np.nan, np.ldexp(np.float32(1.0), (b - 127).astype(np.int32))).astype(np.float32)


def to_f32(data: np.ndarray, dtype) -> np.ndarray:
    """The values of ``data`` (stored as the interpreter stores ``dtype``) as float32."""
    if dtype == tl.float32:
        return data
    if dtype == tl.bfloat16:
        return (data.astype(np.uint32) << 16).view(np.float32)
    if dtype == tl.float16 or dtype.is_int():
        return data.astype(np.float32)
    if dtype == tl.float8e4nv:  # E4M3 (OCP): a table of its 256 values, NaN at S.1111.111
        return _E4M3[data.astype(np.uint8)]
    if dtype == tl.float8e5:  # E5M2 is fp16's top byte
        return (data.astype(np.uint16) << 8).view(np.float16).astype(np.float32)
    if dtype.is_floating() and dtype.primitive_bitwidth == 8:  # other fp8: exact through fp16
        return _interp._convert_float(data, dtype, tl.float16, None).view(np.float16).astype(np.float32)
    return data.astype(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, rounded to nearest even (NaN stays a quiet NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0) | ((bits >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)),
                           rounded)
    return rounded


def from_f32(x: np.ndarray, dtype) -> np.ndarray:
    """float32 values -> the interpreter's storage of ``dtype``, rounded to nearest even."""
    if dtype == tl.float32:
        return x.astype(np.float32, copy=False)
    if dtype == tl.bfloat16:
        return f32_to_bf16_bits(x)
    if dtype == tl.float16:
        return x.astype(np.float16)
    raise TypeError(f"no rounding from float32 to {dtype}")


def make_tensor(data: np.ndarray, dtype) -> tl.tensor:
    """A block tensor of the interpreter holding ``data`` (already in ``dtype``'s storage)."""
    return tl.tensor(_interp.TensorHandle(data, dtype), tl.block_type(dtype, list(data.shape)))


def scalar_tensor(value: int, dtype=tl.int32) -> tl.tensor:
    return tl.tensor(_interp.TensorHandle(np.array([value], dtype=np_dtype(dtype)), dtype), dtype)


def poison_value(dtype):
    """What never-written shared memory holds: NaN for floats, a loud pattern for integers."""
    if dtype == tl.bfloat16:
        return np.uint16(0x7FC1)
    if dtype in (tl.float16, tl.float32, tl.float64):
        return np.nan
    if dtype.is_floating():  # fp8 as uint8
        return np.uint8(0x7F)
    if dtype == tl.int1:
        return True
    bits = dtype.primitive_bitwidth
    return np.array(0x5A5A5A5A5A5A5A5A & ((1 << bits) - 1), dtype=np.uint64).astype(np_dtype(dtype))
