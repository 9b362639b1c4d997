"""Block lists of block-sparse attention, shared by every backend (DESIGN.md section 10).

A jagged batch is cut into blocks of ``block_size`` rows per sequence (never straddling sequences; a
sequence's last block may be short). Query block ``t`` of sequence ``b`` has the global index
``g = qb_off[b] + t`` (``qb_off``: exclusive prefix sum of ``ceil(Lq_b / block_size)``), which is its slot in
the unsorted tile list of the output rows (:func:`jfa.kernels.schedule.build_tile_list` with
``block=block_size``). Each (head, query block) has a list of the key blocks it visits, as CSR rows
``r = head * num_q_slots + g`` holding local key block indices (``0 .. ceil(Lk_b / block_size) - 1``), sorted
ascending. ``num_q_slots`` is the tile list's slot count (an upper bound on the query blocks known on the
host without a sync); rows of spare slots are empty, and ``indices`` may hold spare capacity past
``offsets[-1]``.

Everything here is device-side torch work with sizes known on the host: no synchronisation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from jfa.kernels.cache import IdentityCache
from jfa.kernels.schedule import TileList, build_tile_list


@dataclass(frozen=True)
class BlockLists:
    """Per (head, query block) the key blocks block-sparse attention visits (module docstring).

    ``offsets`` int32 ``[num_heads * num_q_slots + 1]`` and ``indices`` int32 ``[capacity]`` on the kernels'
    device; row ``r = head * num_q_slots + g`` lists ``indices[offsets[r]:offsets[r + 1]]``. Read-only: the
    selection shares one ``offsets`` tensor between the lists of every call with the same offsets and rule."""

    offsets: torch.Tensor
    indices: torch.Tensor
    block_size: int
    num_heads: int
    num_q_slots: int
    # the lists keep out of the causal future: no listed block lies wholly past its query block's last
    # visible key (bottom-right causal). Causal calls need such lists (the TLX forward counts on it).
    causal: bool = False

    def row_counts(self) -> torch.Tensor:
        """Listed blocks per row, int64 ``[num_heads, num_q_slots]``."""
        o = self.offsets.to(torch.int64)
        return (o[1:] - o[:-1]).view(self.num_heads, self.num_q_slots)


@dataclass(frozen=True)
class Transposed:
    """The same lists seen from the key side: per (query head, key block slot ``gk``) the local query
    block indices that list key block ``gk``, ascending, as CSR rows ``c = head * num_kv_slots + gk``."""

    offsets: torch.Tensor  # int32 [num_heads * num_kv_slots + 1]
    indices: torch.Tensor  # int32 [capacity]: local query block indices
    num_kv_slots: int


def query_blocks(out_cu: torch.Tensor, rows: int, block_size: int) -> TileList:
    """The unsorted tile list of the output rows in blocks of ``block_size``: slot g is query block g."""
    return build_tile_list(out_cu, rows, block_size)


def key_blocks(cu_k: torch.Tensor, total_k: int, block_size: int) -> TileList:
    """The unsorted tile list of the keys in blocks of ``block_size``: slot gk is key block gk."""
    return build_tile_list(cu_k, total_k, block_size)


_orders = IdentityCache()


def heaviest_first(counts: torch.Tensor, blocks: TileList) -> torch.Tensor:
    """int32 slot order of the slots of ``blocks`` (a tile list in sequence order; ``counts``: [H, slots],
    listed blocks per head and slot): sequences by decreasing listed blocks (over their slots and heads),
    each sequence's slots together and in order. The load balance counts listed blocks, not sequence
    length, and a sequence's blocks run side by side, so its K/V (or Q/dO) blocks are read from L2 by the
    CTAs that share them: ordered block by block on their own counts, the blocks of a sequence scatter
    over the launch (fwd+bwd 12-18% slower at keep 0.5 on the H200, NOTES.md session 15)."""
    per_slot = counts.sum(0)
    seq = blocks.tiles[0].to(torch.int64)
    num_seqs = blocks.num_seqs
    total = torch.zeros(num_seqs + 1, dtype=per_slot.dtype, device=per_slot.device)
    total.scatter_add_(0, seq.clamp(max=num_seqs), per_slot)
    key = torch.where(seq < num_seqs, total[seq.clamp(max=num_seqs)], torch.full_like(per_slot, -1))
    return torch.sort(key, descending=True, stable=True).indices.to(torch.int32).contiguous()


def slot_order(lists: BlockLists, q_blocks: TileList) -> torch.Tensor:
    """:func:`heaviest_first` over ``lists``' rows (``q_blocks``: :func:`query_blocks` of the batch), cached
    per lists."""
    return _orders.get_or_build((lists.offsets,), ("q",), lambda: heaviest_first(lists.row_counts(), q_blocks))


_transposes = IdentityCache()


def transpose(lists: BlockLists, q_blocks: TileList, cu_k: torch.Tensor, total_k: int) -> Transposed:
    """The key-side view of ``lists`` (:class:`Transposed`), built on the device without a sync; cached per
    lists and offsets. ``q_blocks``: :func:`query_blocks` of the same batch. One Triton launch where Triton
    runs (CUDA, or the CPU interpreter: ``jfa.kernels.triton.block_transpose``), else
    :func:`transpose_reference`; both give the same lists."""
    return _transposes.get_or_build(
        (lists.offsets, lists.indices, cu_k), (total_k, lists.block_size),
        lambda: _transpose_on_device(lists, q_blocks, cu_k, total_k))


def _transpose_on_device(lists: BlockLists, q_blocks: TileList, cu_k: torch.Tensor, total_k: int) -> Transposed:
    from jfa.kernels.triton import interpreter_active

    if lists.offsets.is_cuda or (lists.offsets.device.type == "cpu" and interpreter_active()):
        from jfa.kernels.triton.block_transpose import transpose_lists

        return transpose_lists(lists, q_blocks, cu_k, total_k)
    return transpose_reference(lists, q_blocks, cu_k, total_k)


def transpose_reference(lists: BlockLists, q_blocks: TileList, cu_k: torch.Tensor, total_k: int) -> Transposed:
    """:func:`transpose` in ~35 small torch ops (a sort over every entry): for devices without Triton, and
    the reference the Triton kernel is tested against."""
    bs, heads, nqs = lists.block_size, lists.num_heads, lists.num_q_slots
    k_blocks = key_blocks(cu_k, total_k, bs)
    nks = k_blocks.num_slots
    device = lists.offsets.device
    offsets = lists.offsets.to(torch.int64)
    capacity = lists.indices.numel()
    entry = torch.arange(capacity, device=device, dtype=torch.int64)
    valid = entry < offsets[-1]
    row = (torch.searchsorted(offsets, entry, right=True) - 1).clamp(0, heads * nqs - 1) if heads * nqs else entry
    head, g = row // max(nqs, 1), row % max(nqs, 1)
    num_seqs = q_blocks.num_seqs
    seq = q_blocks.tiles[0].to(torch.int64)[g].clamp(max=max(num_seqs - 1, 0)) if nqs else g
    q_tile = q_blocks.tiles[1].to(torch.int64)[g] if nqs else g
    # the first key block slot of each sequence: the prefix sum of its key block counts
    cu = cu_k.to(torch.int64)
    kb_per_seq = (cu[1:] - cu[:-1] + bs - 1) // bs
    kb_off = torch.cumsum(kb_per_seq, 0) - kb_per_seq
    gk = kb_off[seq] + lists.indices.to(torch.int64) if num_seqs else entry
    column = torch.where(valid, head * nks + gk, torch.full_like(gk, heads * nks))
    order = torch.sort(column, stable=True).indices  # within a column, entries keep query block order
    counts = torch.zeros(heads * nks + 1, device=device, dtype=torch.int64)
    counts.scatter_add_(0, column, torch.ones_like(column))
    t_offsets = torch.zeros(heads * nks + 1, device=device, dtype=torch.int64)
    t_offsets[1:] = torch.cumsum(counts[:-1], 0)
    return Transposed(t_offsets.to(torch.int32).contiguous(), q_tile[order].to(torch.int32).contiguous(), nks)


def transposed_counts(t: Transposed, num_heads: int) -> torch.Tensor:
    o = t.offsets.to(torch.int64)
    return (o[1:] - o[:-1]).view(num_heads, t.num_kv_slots)


def from_csr(offsets: torch.Tensor, indices: torch.Tensor, *, block_size: int, num_heads: int,
             num_q_blocks: int, num_q_slots: int, causal: bool = False) -> BlockLists:
    """A caller's exact CSR (``num_heads * num_q_blocks + 1`` offsets, already validated; ``causal``: checked
    to keep out of the causal future) as slotted :class:`BlockLists`: each head's rows padded with empty rows
    up to ``num_q_slots``."""
    device = offsets.device
    o = offsets.to(torch.int64)
    if num_q_slots == num_q_blocks:
        padded = o
    else:
        per_head = o[:-1].view(num_heads, num_q_blocks)
        head_end = o[1:].view(num_heads, num_q_blocks)[:, -1:] if num_q_blocks else o[:1].expand(num_heads, 1)
        pad = head_end.expand(num_heads, num_q_slots - num_q_blocks)
        padded = torch.cat([torch.cat([per_head, pad], 1).reshape(-1), o[-1:]])
    return BlockLists(padded.to(torch.int32).contiguous(), indices.to(device=device, dtype=torch.int32).contiguous(),
                      block_size, num_heads, num_q_slots, causal)


def exact_csr(lists: BlockLists, cu_q: Optional[torch.Tensor], cu_k: torch.Tensor, broadcast_q: bool,
              len_q_bcast: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``lists`` as the exact CSR of the batch (``num_heads * NQB + 1`` int64 offsets, the indices), on the
    host (a device read): what the references and the oracle take."""
    num_seqs = cu_k.numel() - 1
    if broadcast_q:
        lengths = torch.full((num_seqs,), len_q_bcast, dtype=torch.int64)
    else:
        c = cu_q.to(device="cpu", dtype=torch.int64)
        lengths = c[1:] - c[:-1]
    nqb = int(((lengths + lists.block_size - 1) // lists.block_size).sum())
    o = lists.offsets.to(device="cpu", dtype=torch.int64)
    idx = lists.indices.to(device="cpu", dtype=torch.int64)
    heads, nqs = lists.num_heads, lists.num_q_slots
    starts = o[:-1].view(heads, nqs)[:, :nqb].reshape(-1)
    ends = o[1:].view(heads, nqs)[:, :nqb].reshape(-1)
    counts = ends - starts
    offsets = torch.zeros(heads * nqb + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(counts, 0)
    if int(offsets[-1]) == 0:
        return offsets, torch.zeros(0, dtype=torch.int64)
    row = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    entry = starts[row] + torch.arange(int(offsets[-1])) - offsets[:-1][row]
    return offsets, idx[entry]
