"""The TLX backward's row statistics pass: per output row and head, lse in base 2 and delta =
rowsum(dO * O) - dlse, laid out transposed (``[2H, columns]``) so that one query tile's statistics are
one TMA box of the dK/dV kernel (``jfa.kernels.tlx.hopper.backward``); the same pass can zero the fused
dQ's fp32 accumulator. A plain Triton kernel (it runs in the interpreter too)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from jfa.kernels.cache import IdentityCache
from jfa.kernels.launch import launch, prepare_or_relaunch


@triton.jit(do_not_specialize=["num_rows", "num_seqs", "search_steps"])
def row_stats_kernel(LSE, DELTA, OUT, DOUT, DLSE, OUT_CU, STATS_CU, STATS, DQ_ZERO, num_rows, num_heads, num_seqs,
                     search_steps, stride_stats, stride_ot, stride_oh, stride_dot, stride_doh, stride_zt, stride_zh,
                     FROM_OUTPUTS: tl.constexpr, HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr):
    """One block of BLOCK_T rows and one head: lse * log2(e) (+inf where lse = -inf) and delta into the
    stats tensor, row t of sequence b at column STATS_CU[b] + t - OUT_CU[b]. delta is read (DELTA
    [rows, H]) or, FROM_OUTPUTS, computed here: rowsum(dO * O) in fp32, minus DLSE if HAS_DLSE (the
    backward's pre-pass and the statistics in one pass). With ZERO_DQ the same rows and head of DQ_ZERO
    (the fused dQ's fp32 accumulator, [rows, H, HEAD_DIM]) are zeroed (no memset pass of their own). A
    row's sequence comes from a binary search of OUT_CU (``search_steps`` = ceil(log2(num_seqs))
    halvings): one program per block of rows, not per sequence, so one long sequence does not run on a
    handful of programs. The row's loads and the zero stores are issued before the search, whose
    dependent loads would otherwise come first and leave the pass waiting on latency."""
    head = tl.program_id(1)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = offs_t < num_rows
    rows = offs_t.to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    lse = tl.load(LSE + rows * num_heads + head, mask=ok, other=0.0)
    if FROM_OUTPUTS:
        o = tl.load(OUT + head * stride_oh + rows[:, None] * stride_ot + offs_d[None, :], mask=ok[:, None], other=0.0)
        do = tl.load(DOUT + head * stride_doh + rows[:, None] * stride_dot + offs_d[None, :], mask=ok[:, None],
                     other=0.0)
        if HAS_DLSE:
            dlse = tl.load(DLSE + rows * num_heads + head, mask=ok, other=0.0).to(tl.float32)
    else:
        delta = tl.load(DELTA + rows * num_heads + head, mask=ok, other=0.0)
    if ZERO_DQ:
        tl.store(DQ_ZERO + rows[:, None] * stride_zt + head * stride_zh + offs_d[None, :],
                 tl.zeros([BLOCK_T, HEAD_DIM], dtype=tl.float32), mask=ok[:, None])
    # the largest b with OUT_CU[b] <= t: OUT_CU[lo] <= t < OUT_CU[hi] throughout (empty sequences too)
    lo = tl.zeros([BLOCK_T], dtype=tl.int32)
    hi = tl.zeros([BLOCK_T], dtype=tl.int32) + num_seqs
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        right = tl.load(OUT_CU + mid) <= offs_t
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    cols = tl.load(STATS_CU + lo) + (offs_t - tl.load(OUT_CU + lo))
    if FROM_OUTPUTS:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        if HAS_DLSE:
            delta -= dlse
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    tl.store(STATS + head * stride_stats + cols, lse2, mask=ok)
    tl.store(STATS + (num_heads + head) * stride_stats + cols, delta, mask=ok)


# Sequences start on columns that are multiples of this in the row statistics, whose token axis is
# TMA's innermost: TMA needs a multiple of 4 (16 bytes of fp32, or the copy is an illegal instruction).
# 32 is what the GPU has validated; 4 would save padding columns for short sequences.
COLUMN_ALIGN = 32


_column_layouts = IdentityCache()


def aligned_columns(out_cu: torch.Tensor, num_seqs: int, rows: int) -> tuple[torch.Tensor, int]:
    """The column layout of the row statistics (``row_stats``), whose token axis is TMA's innermost (so
    each sequence must start 16-byte aligned): row t of sequence b sits in column
    ``col_cu[b] + (t - out_cu[b])``, and every ``col_cu[b]`` is a multiple of COLUMN_ALIGN. Returns
    (col_cu [B+1] int64, width: >= col_cu[-1], a multiple of COLUMN_ALIGN, from the sizes alone). No
    host sync. Cached per offsets tensor like the tile lists (``jfa.kernels.cache``): a model's layers
    and later steps on the same batch launch none of its ~7 small kernels again; ``col_cu`` is shared
    between those calls, so nothing may write to it."""
    return _column_layouts.get_or_build((out_cu,), (num_seqs, rows),
                                        lambda: _aligned_columns(out_cu, num_seqs, rows))


def _aligned_columns(out_cu: torch.Tensor, num_seqs: int, rows: int) -> tuple[torch.Tensor, int]:
    lengths = (out_cu[1:] - out_cu[:-1]).to(torch.int64)
    col_cu = torch.zeros(num_seqs + 1, dtype=torch.int64, device=out_cu.device)
    torch.cumsum((lengths + COLUMN_ALIGN - 1) // COLUMN_ALIGN * COLUMN_ALIGN, 0, out=col_cu[1:])
    return col_cu, -(-(rows + (COLUMN_ALIGN - 1) * num_seqs + 1) // COLUMN_ALIGN) * COLUMN_ALIGN


# the parameters a repeat of the statistics' launch replaces (``keep``): every tensor it reads or writes but
# the offsets and the column layout (the plan's key fixes those)
ROW_STATS_REPLACED = ("LSE", "DELTA", "OUT", "DOUT", "DLSE", "STATS", "DQ_ZERO")


def row_stats(lse: torch.Tensor, delta, out_cu: torch.Tensor, num_seqs: int, *, outputs=None, zero=None,
              block_rows: int = None, keep: dict = None):
    """The kernel's per-row statistics, transposed so that a query tile's rows are one TMA box:
    ``stats[h, c] = lse[t, h] * log2(e)`` (+inf for a row that saw no key, so its P is exactly 0) and
    ``stats[H + h, c] = delta[t, h]``, columns as ``aligned_columns``; the gaps hold 0, so a box reaching
    past a sequence reads finite values (the kernel masks them). ``delta``: [rows, H] float32, or None
    with ``outputs=(out, dout, dlse or None)``: then delta = rowsum(dO * O) - dlse is computed in the
    same pass (the portable pre-pass's definition, ``row_delta``). ``zero``: a float32 [rows, H, D]
    tensor (the fused dQ's accumulator, contiguous) that the same pass zeroes (with ``outputs`` only).
    ``block_rows``: rows per program (measurements; default 64 with ``outputs``, 128 without). ``keep``: a
    dict that receives ``"row_stats"``: (the launch prepared for repeats with ``ROW_STATS_REPLACED`` replaced,
    its grid), when a kernel ran. Returns (stats [2H, width] float32, stats_cu [B+1] int64). No host sync."""
    rows, num_heads = lse.shape
    stats_cu, width = aligned_columns(out_cu, num_seqs, rows)
    stats = torch.zeros((2 * num_heads, width), dtype=torch.float32, device=lse.device)
    if zero is not None and (delta is not None or zero.shape[:2] != lse.shape or not zero.is_contiguous()):
        raise ValueError("row_stats: zero must be a contiguous [rows, H, D] tensor, with outputs= (not delta)")
    if not (rows and num_heads and num_seqs):
        if zero is not None:
            zero.zero_()
        return stats, stats_cu
    if delta is None:
        out, dout, dlse = outputs
        dlse = None if dlse is None else dlse.to(torch.float32).contiguous()
        tensors = dict(DELTA=lse, OUT=out, DOUT=dout, DLSE=lse if dlse is None else dlse)
        strides = (out.stride(0), out.stride(1), dout.stride(0), dout.stride(1))
        # 64 rows a program: half the programs of 32, each with one binary search
        head_dim, block_t = out.shape[2], block_rows or 64
    else:
        tensors = dict(DELTA=delta, OUT=lse, DOUT=lse, DLSE=lse)  # OUT, DOUT, DLSE unread
        strides, head_dim, block_t = (0, 0, 0, 0), 16, block_rows or 128
    if zero is not None and zero.shape[2] != head_dim:
        raise ValueError(f"row_stats: zero has head dim {zero.shape[2]}, the outputs {head_dim}")
    grid = (triton.cdiv(rows, block_t), num_heads)
    kwargs = dict(LSE=lse, **tensors, OUT_CU=out_cu, STATS_CU=stats_cu, STATS=stats,
                  DQ_ZERO=stats if zero is None else zero, num_rows=rows, num_heads=num_heads, num_seqs=num_seqs,
                  search_steps=max(1, (num_seqs - 1).bit_length()), stride_stats=stats.stride(0),
                  stride_ot=strides[0], stride_oh=strides[1], stride_dot=strides[2], stride_doh=strides[3],
                  stride_zt=0 if zero is None else zero.stride(0), stride_zh=0 if zero is None else zero.stride(1),
                  FROM_OUTPUTS=delta is None, HAS_DLSE=delta is None and dlse is not None, ZERO_DQ=zero is not None,
                  HEAD_DIM=head_dim, BLOCK_T=block_t)
    launch(row_stats_kernel, grid, **kwargs)
    if keep is not None:
        keep["row_stats"] = (prepare_or_relaunch(row_stats_kernel, (), kwargs, ROW_STATS_REPLACED), grid)
    return stats, stats_cu


def stats_descriptor(stats: torch.Tensor, block_m: int):
    """A TMA descriptor over ``stats`` whose box is one statistic's ``block_m`` consecutive columns."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(stats, shape=list(stats.shape), strides=[stats.stride(0), 1], block_shape=[1, block_m])
