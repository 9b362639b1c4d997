"""MXFP8 quantize kernels (portable Triton: compiled on CUDA, interpreted on CPU tensors).

The rules are docs/mxfp8.md's "Quantizer": blocks of 32 share one E8M0 scale byte (FLOOR or RCEIL rule,
exponent clamped to [-127, 127], 0x00 for an all-zero block, 0xFF and all-NaN elements for a block
holding a NaN or Inf); elements are E4M3, round-to-nearest-even, saturating at 448.

The scale exponent is integer arithmetic on the fp32 bit pattern of the block's largest magnitude. The
elements are the hardware conversion ``cvt.rn.satfinite.e4m3x2.f32`` (round to nearest even) of ``|x|``
times the normal fp32 factor ``2^-s``, clamped at 448 first, with x's sign bit. The product is exact
wherever it is an fp32 normal (Triton multiplies without flush-to-zero, so a subnormal x scales exactly),
and a product below 2^-126 rounds to 0 in E4M3 (half its smallest subnormal is 2^-10). The bytes equal the NumPy quantizer's (``jfa.oracle.mx``)
bit for bit on the GPU and on the interpreter (whose fp32 -> E4M3 conversion
``jfa.kernels.triton._interpreter`` makes the GPU's); tests/test_mx_quant.py checks every E4M3 value under
the boundary scale bytes, ties, fp32 subnormals, zero and NaN blocks and random layouts on both. The loads
take fp32 as int32 bits and bf16 as int16 bits (widened by a shift: Triton 3.8's interpreter flushes bf16
subnormals in its bf16 -> fp32 cast); fp16 converts to fp32 exactly (its subnormals are fp32 normals).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from jfa.kernels import alloc
from jfa.kernels.triton._interpreter import install_bf16_dot_fix

install_bf16_dot_fix()

BLOCK = 32
DIM_ELEMENTS_PER_PROGRAM = 4096  # elements (tokens x padded head dim) one program of the D-axis kernel quantizes
MAX_TOKEN_COLUMNS = 128  # (head, dim) columns one program of the token-axis kernel quantizes (x 32 tokens)
MAX_GRID_PROGRAMS = 2 ** 31 - 1  # CUDA's grid axis 0
MAX_GRID_Y = 65535  # CUDA's grid axes 1 and 2


@triton.jit
def _fp32_bits(raw, SRC: tl.constexpr):
    """int32 fp32 bit patterns of the loaded values: ``raw`` is int32 bits (fp32), int16 bits (bf16) or fp16."""
    if SRC == "bf16":
        bits = raw.to(tl.int32) << 16  # the sign-extended int16 shifted is the bf16 pattern in the top half
    elif SRC == "fp16":
        bits = raw.to(tl.float32).to(tl.int32, bitcast=True)
    else:
        bits = raw
    return bits


@triton.jit
def _log2_split(mag):
    """(floor(log2 v), the 23 fraction bits of v's normalised significand) for fp32 bits ``mag`` of a
    finite v >= 0 (v = 0 gives a floor below -270 and fraction 0)."""
    e = mag >> 23
    m = mag & 0x7FFFFF
    top = (m.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127  # msb of m (-127 for m = 0)
    log2 = tl.where(e > 0, e - 127, top - 149)
    frac = tl.where(e > 0, m, (m << tl.minimum(23 - top, 23)) & 0x7FFFFF)  # m < 2^(top+1): no overflow
    return log2, frac


@triton.jit
def _scale_exponent(amax, RCEIL: tl.constexpr):
    """Clamped scale exponent of blocks whose largest |x| has fp32 bits ``amax`` (finite or not)."""
    log2, frac = _log2_split(amax)
    s = log2 - 8  # FLOOR: floor(log2 amax) - emax(E4M3)
    if RCEIL:
        s += (frac > 0x600000).to(tl.int32)  # amax > 1.75 * 2^log2 = 448 * 2^s needs one more
    return tl.minimum(tl.maximum(s, -127), 127)


@triton.jit
def _encode_e4m3(bits, s):
    """E4M3 bytes (int32 0..255) of ``x * 2^-s`` for finite x with fp32 bits ``bits``, s in [-127, 121] (every
    exponent ``_scale_exponent`` gives a block with a finite largest magnitude): the module docstring's
    conversion; the sign bit is x's, so -0.0 and negatives that round to 0 keep it."""
    mag = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    scaled = mag * ((127 - s) << 23).to(tl.float32, bitcast=True)
    code = tl.minimum(scaled, 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return code.to(tl.int32) | (((bits >> 31) & 1) << 7)


@triton.jit
def _quantize_tile(bits, AXIS: tl.constexpr, RCEIL: tl.constexpr):
    """(element bytes, scale bytes) of a tile whose blocks lie along ``AXIS``; masked-off entries must be 0."""
    mag = bits & 0x7FFFFFFF
    amax = tl.max(mag, axis=AXIS)  # fp32 bit patterns of non-negatives order like the values; NaN/Inf on top
    not_finite = amax >= 0x7F800000
    s = _scale_exponent(amax, RCEIL)
    codes = _encode_e4m3(bits, tl.expand_dims(s, AXIS))
    codes = tl.where(tl.expand_dims(not_finite, AXIS), 0x7F, codes)
    scales = tl.where(not_finite, 0xFF, s + 127)
    return codes.to(tl.uint8), scales.to(tl.uint8)


@triton.jit
def mx_quant_dim_kernel(X, DATA, SCALES, num_tokens, num_heads, head_dim, token_blocks, stride_t, stride_h, stride_d,
                        SRC: tl.constexpr, RCEIL: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Blocks along D on a 1-D grid of ``token_blocks * num_heads`` programs: program p quantizes tokens
    ``(p % token_blocks)*ROWS ..`` of head ``p // token_blocks``, a ``[ROWS, BLOCK_D]`` tile (``BLOCK_D``: the
    head dim rounded up to a power of two >= 32; columns past it load as 0, so a short tail block is a
    zero-filled one). DATA is contiguous ``[T, H, head_dim]`` uint8, SCALES contiguous
    ``[T, H, ceil(head_dim / 32)]`` uint8. ``head_dim`` is a runtime argument: a constexpr head dim
    miscompiles the 2-element tile on sm_90 (NOTES.md session 25)."""
    p = tl.program_id(0)
    t = (p % token_blocks).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    head = (p // token_blocks).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    row_ok = (t < num_tokens)[:, None]
    mask = row_ok & (d < head_dim)[None, :]
    src = X + t[:, None] * stride_t + head * stride_h + d[None, :] * stride_d
    bits = _fp32_bits(tl.load(src, mask=mask, other=0), SRC)
    codes, scales = _quantize_tile(tl.reshape(bits, [ROWS * (BLOCK_D // 32), 32]), 1, RCEIL)
    row = t * num_heads + head
    tl.store(DATA + row[:, None] * head_dim + d[None, :], tl.reshape(codes, [ROWS, BLOCK_D]), mask=mask)
    dim_blocks = (head_dim + 31) // 32  # not an argument: Triton compiles an int argument equal to 1 as a constant
    blocks = tl.arange(0, BLOCK_D // 32)
    tl.store(SCALES + row[:, None] * dim_blocks + blocks[None, :], tl.reshape(scales, [ROWS, BLOCK_D // 32]),
             mask=row_ok & (blocks < dim_blocks)[None, :])


@triton.jit
def mx_quant_tokens_kernel(X, DATA, SCALES, CU, BLOCK_OFFSETS, ROW_SEQ, num_seqs, num_cols, head_dim,
                           stride_t, stride_h, stride_d,
                           SRC: tl.constexpr, RCEIL: tl.constexpr, COLS: tl.constexpr, COL_BLOCK0: tl.constexpr):
    """Blocks along tokens: program (r, c) quantizes scale row r (block i of sequence ``ROW_SEQ[r]``,
    ``i = r - BLOCK_OFFSETS[seq]``) for columns ``(COL_BLOCK0 + c)*COLS ..`` of the flattened (head, d) pairs.
    Rows past the real block count (``ROW_SEQ[r] == num_seqs``) are left as they are. DATA is contiguous
    ``[T, H, D]``, SCALES contiguous ``[rows, H, D]``. ``COL_BLOCK0`` is a constexpr: 0 for every tensor with
    at most 65535 column blocks folds away, where a runtime first block, one integer add in front of the row's
    dependent loads, costs these short programs 3-5% (``tokens_launches`` splits the larger ones)."""
    r = tl.program_id(0)
    seq = tl.load(ROW_SEQ + r)
    if seq >= num_seqs:
        return
    i = (r - tl.load(BLOCK_OFFSETS + seq)).to(tl.int64)
    t0 = tl.load(CU + seq).to(tl.int64) + 32 * i
    t_end = tl.load(CU + seq + 1).to(tl.int64)
    t = t0 + tl.arange(0, 32)
    col = (tl.program_id(1) + COL_BLOCK0).to(tl.int64) * COLS + tl.arange(0, COLS)
    col_mask = col < num_cols
    mask = (t < t_end)[:, None] & col_mask[None, :]
    src = X + t[:, None] * stride_t + ((col // head_dim) * stride_h + (col % head_dim) * stride_d)[None, :]
    bits = _fp32_bits(tl.load(src, mask=mask, other=0), SRC)
    codes, scales = _quantize_tile(bits, 0, RCEIL)
    tl.store(DATA + t[:, None] * num_cols + col[None, :], codes, mask=mask)
    tl.store(SCALES + r.to(tl.int64) * num_cols + col, scales, mask=col_mask)


def _bytes(shape, poison: int, device) -> torch.Tensor:
    """A uint8 output; inside ``alloc.poisoned_outputs`` filled with ``poison`` (a NaN byte), so an entry
    the kernel never wrote shows up in the comparison."""
    if alloc.poisoning():
        return torch.full(shape, poison, dtype=torch.uint8, device=device)
    return torch.empty(shape, dtype=torch.uint8, device=device)


def _source(x: torch.Tensor):
    """(the tensor the kernel loads, its SRC tag): fp32 and bf16 travel as their integer bits."""
    if x.dtype == torch.float32:
        return x.view(torch.int32), "fp32"
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16), "bf16"
    if x.dtype == torch.float16:
        return x, "fp16"
    raise TypeError(f"x: dtype must be float16, bfloat16 or float32, got {x.dtype}")


class DimLaunch(NamedTuple):
    """One launch of the D-axis kernel: its 1-D grid and tile (``ROWS`` tokens x ``BLOCK_D`` columns)."""

    grid: tuple
    rows: int
    block_d: int
    token_blocks: int  # programs per head


def dim_launch(num_tokens: int, num_heads: int, head_dim: int) -> DimLaunch:
    """The D-axis kernel's launch, one program per (token block, head): the head dim padded to a power of two
    >= 32, as many tokens a program as fit ``DIM_ELEMENTS_PER_PROGRAM`` (at least one), and the heads on grid
    axis 0 (up to 2^31 - 1 programs), never on axes 1 and 2 (65535 on CUDA). Raises ValueError naming ``x``
    for a tensor that would need more programs."""
    block_d = max(BLOCK, triton.next_power_of_2(head_dim))
    rows = max(1, DIM_ELEMENTS_PER_PROGRAM // block_d)
    token_blocks = triton.cdiv(num_tokens, rows)
    programs = token_blocks * num_heads
    if programs > MAX_GRID_PROGRAMS:
        raise ValueError(f"x: shape [{num_tokens}, {num_heads}, {head_dim}] needs {programs} programs of the D-axis "
                         f"quantizer, over the grid's {MAX_GRID_PROGRAMS}; quantize it in chunks of tokens")
    return DimLaunch((programs,), rows, block_d, token_blocks)


def quantize_dim(x: torch.Tensor, rceil: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks along D of ``x`` ``[T, H, D]`` (any strides; a short tail block is zero-filled). Returns
    (element bytes ``[T, H, D]``, scale bytes ``[T, H, ceil(D/32)]``), both contiguous uint8."""
    T, H, D = x.shape
    launch = dim_launch(T, H, D)  # raises before the outputs are allocated
    dim_blocks = triton.cdiv(D, BLOCK)
    data = _bytes((T, H, D), 0x7F, x.device)
    scales = _bytes((T, H, dim_blocks), 0xFF, x.device)
    if T * H * dim_blocks == 0:
        return data, scales
    src, tag = _source(x)
    mx_quant_dim_kernel[launch.grid](src, data, scales, T, H, D, launch.token_blocks, *x.stride(), SRC=tag,
                                     RCEIL=rceil, ROWS=launch.rows, BLOCK_D=launch.block_d)
    return data, scales


class TokensLaunches(NamedTuple):
    """The token-axis kernel's launches: ``COLS`` and, per launch, (grid, first column block)."""

    cols: int
    launches: list


def tokens_launches(rows: int, num_heads: int, head_dim: int) -> TokensLaunches:
    """The token-axis kernel's launches: ``COLS``, the flattened (head, d) columns one program quantizes (x 32
    tokens: the column count padded to a power of two, at most ``MAX_TOKEN_COLUMNS``), one program per scale
    row on axis 0 (up to 2^31 - 1) and per column block on axis 1, at most ``MAX_GRID_Y`` (CUDA's 65535) blocks a
    launch, so one launch unless the flattened (head, d) pairs need more. Raises ValueError naming ``x`` for a
    tensor with more scale rows than axis 0 takes."""
    if rows > MAX_GRID_PROGRAMS:
        raise ValueError(f"x: {rows} scale rows of the token-axis quantizer, over the grid's {MAX_GRID_PROGRAMS}; "
                         "quantize it in chunks of sequences")
    num_cols = num_heads * head_dim
    cols = min(MAX_TOKEN_COLUMNS, triton.next_power_of_2(max(num_cols, 1)))
    col_blocks = triton.cdiv(num_cols, cols)
    return TokensLaunches(cols, [((rows, min(MAX_GRID_Y, col_blocks - first)), first)
                                 for first in range(0, col_blocks, MAX_GRID_Y)])


def quantize_tokens(x: torch.Tensor, cu_seqlens: torch.Tensor, block_offsets: torch.Tensor, rows: int, rceil: bool):
    """Blocks along the tokens of each sequence of packed ``x`` ``[T, H, D]`` (any strides): block i of
    sequence b goes to scale row ``block_offsets[b] + i`` (``block_offsets``: ``[B+1]``, the prefix sum of
    ``ceil(L_b / 32)``; ``rows``: at least ``block_offsets[B]``, which is never read on the host). Returns
    (element bytes ``[T, H, D]``, scale bytes ``[rows, H, D]`` whose rows past the real count hold 0xFF)."""
    T, H, D = x.shape
    launches = tokens_launches(rows, H, D)  # raises before the outputs are allocated
    num_seqs = cu_seqlens.numel() - 1
    data = _bytes((T, H, D), 0x7F, x.device)
    scales = torch.full((rows, H, D), 0xFF, dtype=torch.uint8, device=x.device)
    if rows == 0 or H * D == 0:
        return data, scales
    # the sequence of every scale row (num_seqs past the real count): the last b with offsets[b] <= r
    r = torch.arange(rows, device=x.device, dtype=block_offsets.dtype)
    row_seq = (torch.searchsorted(block_offsets, r, right=True) - 1).to(torch.int32)
    src, tag = _source(x)
    for grid, first in launches.launches:
        mx_quant_tokens_kernel[grid](src, data, scales, cu_seqlens, block_offsets, row_seq, num_seqs, H * D, D,
                                     *x.stride(), SRC=tag, RCEIL=rceil, COLS=launches.cols, COL_BLOCK0=first)
    return data, scales
