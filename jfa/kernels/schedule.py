"""Host-side tile lists for jagged kernels, shared by every backend.

A jagged batch is cut into tiles of ``block`` rows, tile ``t`` of sequence ``b`` covering rows
``[t * block, min((t + 1) * block, L_b))`` of that sequence. Kernels launch one program per
(tile, head) and read their (sequence, tile) pair from the list, so no program ever works on padding.

The list is built with device-side torch ops only: its length is an upper bound known on the host
(``total // block + B``), never a value read back from the GPU, so building it forces no host sync.
Slots past the real tile count hold the sentinel sequence index ``B``; a kernel that reads the
sentinel returns at once (at most ``B`` such programs, each a couple of loads). Lists are cached per
offsets tensor (``jfa.kernels.cache``): the layers of a model and the backward reuse one build.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from jfa.kernels.cache import IdentityCache

_tile_lists = IdentityCache()

@dataclass(frozen=True)
class TileList:
    """``tiles[0, i]`` is the sequence of slot ``i`` (``num_seqs`` = empty slot), ``tiles[1, i]`` its tile index."""

    tiles: torch.Tensor  # int32 [2, num_slots], contiguous
    num_slots: int
    num_seqs: int
    block: int


def num_tile_slots(total: int, num_seqs: int, block: int) -> int:
    """An upper bound on sum_b ceil(L_b / block) given only sum_b L_b = total (no sync needed)."""
    # sum_b ceil(L_b / k) = sum_b floor(L_b / k) + #{b : k does not divide L_b} <= total // k + B
    return total // block + num_seqs if num_seqs > 0 else 0


def build_tile_list(
    cu_seqlens: torch.Tensor,
    total: int,
    block: int,
    *,
    work_offsets: torch.Tensor | None = None,
) -> TileList:
    """Tiles of every non-empty sequence in ``cu_seqlens`` (``[B+1]``, on the kernel's device).

    ``work_offsets`` (``[B+1]``, optional): offsets of the operand one tile streams over (e.g. the key
    offsets for a query tile); tiles are then ordered by decreasing work so the longest start first
    (a device-side stable sort: no host sync). Empty sequences yield no tile. Cached per tensors.
    """
    tensors = (cu_seqlens,) if work_offsets is None else (cu_seqlens, work_offsets)
    return _tile_lists.get_or_build(
        tensors, (total, block, work_offsets is None),
        lambda: _build_tile_list(cu_seqlens, total, block,
                                 None if work_offsets is None else work_offsets[1:] - work_offsets[:-1]))


def _build_tile_list(
    cu_seqlens: torch.Tensor,
    total: int,
    block: int,
    work_lengths: torch.Tensor | None = None,
) -> TileList:
    num_seqs = cu_seqlens.numel() - 1
    slots = num_tile_slots(total, num_seqs, block)
    device = cu_seqlens.device
    if slots == 0:
        return TileList(torch.empty((2, 0), dtype=torch.int32, device=device), 0, num_seqs, block)
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    tiles_per_seq = (lengths + block - 1) // block
    tile_end = torch.cumsum(tiles_per_seq, 0)
    slot = torch.arange(slots, device=device, dtype=torch.int64)
    seq = torch.searchsorted(tile_end, slot, right=True)  # in [0, B]; B marks an empty slot
    seq_clamped = seq.clamp(max=num_seqs - 1)
    tile = slot - (tile_end[seq_clamped] - tiles_per_seq[seq_clamped])
    if work_lengths is not None:
        work = work_lengths.to(torch.int64)[seq_clamped]
        work = torch.where(seq < num_seqs, work, torch.full_like(work, -1))
        order = torch.sort(work, descending=True, stable=True).indices
        seq, tile = seq[order], tile[order]
    tiles = torch.stack([seq, tile]).to(torch.int32).contiguous()
    return TileList(tiles, slots, num_seqs, block)


@functools.lru_cache(maxsize=16)
def virtual_cu_seqlens(num_seqs: int, len_q: int, device) -> torch.Tensor:
    """Offsets of the output rows of a broadcast Q: sequence b owns rows [b * Lq, (b + 1) * Lq).
    Cached (never written to), so the tile lists built from it are cached too."""
    return torch.arange(num_seqs + 1, device=device, dtype=torch.int64) * len_q


def output_offsets(cu_q, num_seqs: int, len_q_bcast: int, broadcast_q: bool, device):
    """Offsets of the output (and lse, dout) rows: ``cu_q``, or for a broadcast Q the virtual ones."""
    return virtual_cu_seqlens(num_seqs, len_q_bcast, device) if broadcast_q else cu_q
