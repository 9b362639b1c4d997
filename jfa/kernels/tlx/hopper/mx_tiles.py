"""The MXFP8 producers' tiles (Hopper TLX forward and dK/dV kernels): E4M3 codes and their E8M0 scales loaded
from global memory into registers, and dequantized into a bf16 shared-memory buffer fenced for wgmma (whole, or
CHUNK rows at a time: ``fill_dim_tile``).

Hopper has no block-scaled MMA, so an MX build's producer turns each operand tile into the bf16 tile the
consumers' wgmma reads, exactly (``jfa.kernels.triton.mx_attention.dequantize``, the portable kernel's values).
Loads are masked by the sequence: rows (or keys) past it read nothing and hold zeros, so no value of another
sequence is read (unlike the bf16 builds' TMA boxes).
"""
import triton
import triton.language as tl

from jfa.kernels.tlx.common.host import tlx
from jfa.kernels.triton.mx_attention import dequantize


@triton.jit
def load_dim_tile(DATA, SCALES, row0, rows_valid, col, scale_col, stride_t, scale_stride,
                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """MX producer: (E4M3 bytes ``[ROWS, HEAD_DIM]`` of rows ``row0 ..`` of a D-axis operand at column ``col``,
    their scales ``[ROWS, HEAD_DIM // 32]``), plain vector loads (16 bytes a thread); rows from ``rows_valid``
    on (past the sequence) read nothing and hold zeros."""
    NB: tl.constexpr = HEAD_DIM // 32
    rows = tl.arange(0, ROWS)
    ok = (rows < rows_valid)[:, None]
    r = (row0 + rows).to(tl.int64)[:, None]
    codes = tl.load(DATA + r * stride_t + col + tl.arange(0, HEAD_DIM)[None, :], mask=ok, other=0)
    scales = tl.load(SCALES + r * scale_stride + scale_col + tl.arange(0, NB)[None, :], mask=ok, other=127)
    return codes, scales


@triton.jit
def load_token_tile(DATA, SCALES, row0, n_start, len_k, scale_row0, col, stride_t, ROWS: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
    """MX producer: (E4M3 bytes ``[ROWS, HEAD_DIM]`` of keys ``n_start ..`` of the token-axis V (packed rows
    ``row0 + n_start ..``), their scales ``[ROWS // 32, HEAD_DIM]``: the sequence's 32-key blocks from its first
    scale row ``scale_row0``; n_start is a multiple of 32). Keys from ``len_k`` on read nothing and hold
    zeros; data and scales share their strides."""
    keys = n_start + tl.arange(0, ROWS)
    cols = col + tl.arange(0, HEAD_DIM)[None, :]
    codes = tl.load(DATA + (row0 + keys).to(tl.int64)[:, None] * stride_t + cols, mask=(keys < len_k)[:, None],
                    other=0)
    blocks = n_start // 32 + tl.arange(0, ROWS // 32)
    scales = tl.load(SCALES + (scale_row0 + blocks).to(tl.int64)[:, None] * stride_t + cols,
                     mask=(blocks * 32 < len_k)[:, None], other=127)
    return codes, scales


@triton.jit
def store_dim_tile(tile, codes, scales, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """MX producer: ``tile`` (bf16) = ``codes`` dequantized with their D-axis ``scales`` (one per 32 elements),
    exact in bf16 down to 2^-126 (as the portable kernel's bf16 dots); then fenced for the consumers' wgmma
    (a generic-proxy store read by the async proxy)."""
    NB: tl.constexpr = HEAD_DIM // 32
    x = dequantize(tl.reshape(codes, [ROWS, NB, 32]), scales[:, :, None])
    tlx.local_store(tile, tl.reshape(x, [ROWS, HEAD_DIM]).to(tl.bfloat16))
    tlx.fence_async_shared()


@triton.jit
def store_token_tile(tile, codes, scales, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """MX producer: ``tile`` (bf16) = ``codes`` dequantized with their token-axis ``scales`` (one per 32 keys
    and column), then fenced for the consumers' wgmma."""
    x = dequantize(tl.reshape(codes, [ROWS // 32, 32, HEAD_DIM]), scales[:, None, :])
    tlx.local_store(tile, tl.reshape(x, [ROWS, HEAD_DIM]).to(tl.bfloat16))
    tlx.fence_async_shared()


@triton.jit
def _rows_of(tile, r0, ROWS: tl.constexpr, CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows ``r0 .. r0 + CHUNK`` of a ``[ROWS, HEAD_DIM]`` shared-memory tile (the tile itself if CHUNK = ROWS)."""
    if ROWS == CHUNK:
        part = tile
    else:
        part = tlx.local_slice(tile, [r0, 0], [CHUNK, HEAD_DIM])
    return part


@triton.jit
def fill_dim_tile(tile, DATA, SCALES, row0, rows_valid, head, heads, ROWS: tl.constexpr, CHUNK: tl.constexpr,
                  HEAD_DIM: tl.constexpr):
    """MX producer (dK/dV kernel): ``tile`` (bf16 ``[ROWS, HEAD_DIM]``) = packed rows ``row0 ..`` of head ``head``
    (of ``heads``) of a D-axis MX operand, dequantized and fenced for wgmma, CHUNK rows at a time (registers):
    ``load_dim_tile`` and ``store_dim_tile``'s dequantization, stored here because a call taking a slice of one
    buffer and a whole buffer of the same shape does not compile. Rows from ``rows_valid`` on (past the
    sequence) are 0."""
    NB: tl.constexpr = HEAD_DIM // 32
    for c in tl.static_range(ROWS // CHUNK):
        codes, scales = load_dim_tile(DATA, SCALES, row0 + c * CHUNK, rows_valid - c * CHUNK, head * HEAD_DIM,
                                      head * NB, heads * HEAD_DIM, heads * NB, CHUNK, HEAD_DIM)
        x = dequantize(tl.reshape(codes, [CHUNK, NB, 32]), scales[:, :, None])
        tlx.local_store(_rows_of(tile, c * CHUNK, ROWS, CHUNK, HEAD_DIM),
                        tl.reshape(x, [CHUNK, HEAD_DIM]).to(tl.bfloat16))
    tlx.fence_async_shared()  # generic-proxy stores read by the consumers' wgmma (async proxy)
