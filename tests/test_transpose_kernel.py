"""The Triton transpose of block lists (:func:`jfa.kernels.triton.block_transpose.transpose_lists`) against the
torch one (:func:`jfa.kernels.block_lists.transpose_reference`): the same offsets and the same indices up to
``offsets[-1]``, bit for bit, on hand-made lists (random rows, empty rows, one block, every block), on the
selection kernel's lists (top-k and keep ratio, causal or not, broadcast Q, cut at a too-small capacity), on
ragged batches with empty sequences, sequences shorter than a block and no sequence at all, for block sizes
16 to 128 and 1 or 3 heads; the kernel's multi-step path with tiny tiles. Case ids name the shape family."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jfa.kernels import alloc
from jfa.kernels.block_lists import BlockLists, transpose_reference, from_csr, query_blocks
from jfa.kernels.schedule import output_offsets


def _cu(lengths, device) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), dtype=torch.int32, device=device)


def assert_same_transpose(lists: BlockLists, q_blocks, cu_k: torch.Tensor, total_k: int):
    from jfa.kernels.triton.block_transpose import transpose_lists

    want = transpose_reference(lists, q_blocks, cu_k, total_k)
    with alloc.poisoned_outputs():  # outputs start as -1: an entry left unwritten shows up
        got = transpose_lists(lists, q_blocks, cu_k, total_k)
    assert got.num_kv_slots == want.num_kv_slots
    assert got.offsets.dtype == torch.int32 and got.indices.dtype == torch.int32
    assert got.offsets.device == lists.offsets.device and got.indices.device == lists.offsets.device
    assert got.offsets.shape == want.offsets.shape == (lists.num_heads * want.num_kv_slots + 1,)
    assert got.indices.numel() == want.indices.numel() == lists.indices.numel()
    want_off, got_off = want.offsets.cpu(), got.offsets.cpu()
    bad = torch.nonzero(want_off != got_off).flatten()
    assert bad.numel() == 0, f"offsets differ at {bad[:8].tolist()}: want {want_off[bad[:8]].tolist()}, " \
                             f"got {got_off[bad[:8]].tolist()}"
    n = int(want_off[-1])
    want_idx, got_idx = want.indices.cpu()[:n], got.indices.cpu()[:n]
    bad = torch.nonzero(want_idx != got_idx).flatten()
    assert bad.numel() == 0, f"indices differ at {bad[:8].tolist()}: want {want_idx[bad[:8]].tolist()}, " \
                             f"got {got_idx[bad[:8]].tolist()}"
    return want


# --- hand-made lists --------------------------------------------------------------------------------------

ROW_KINDS = ("random", "empty", "one", "all", "first", "last")


def random_rows(lens_q, lens_k, bs: int, heads: int, rng: np.random.Generator, kinds=ROW_KINDS,
                density: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Exact CSR (int64 offsets, int32 indices, the query block count) of ascending rows, each of a random
    kind: a random subset (of ``density``, else a random one per row), empty, one block, every block, the
    first or the last block of the sequence."""
    offsets, indices = [0], []
    nqb = sum(-(-lq // bs) for lq in lens_q)
    for _ in range(heads):
        for lq, lk in zip(lens_q, lens_k):
            nkb = -(-lk // bs)
            for _ in range(-(-lq // bs)):
                kind = kinds[rng.integers(len(kinds))] if nkb else "empty"
                if kind == "random":
                    p = rng.random() if density is None else density
                    row = np.flatnonzero(rng.random(nkb) < p)
                elif kind == "empty":
                    row = np.zeros(0, dtype=np.int64)
                elif kind == "one":
                    row = np.array([rng.integers(nkb)])
                elif kind == "all":
                    row = np.arange(nkb)
                elif kind == "first":
                    row = np.array([0])
                else:
                    row = np.array([nkb - 1])
                indices.extend(row.tolist())
                offsets.append(len(indices))
    return torch.tensor(offsets, dtype=torch.int64), torch.tensor(indices, dtype=torch.int32), nqb


def hand_made(lens_q, lens_k, bs: int, heads: int, device: str, seed: int = 0, *, bcast_lq: Optional[int] = None,
              kinds=ROW_KINDS, density=None, capacity: Optional[int] = None):
    """(lists, q_blocks, cu_k, total_k) of random rows (:func:`random_rows`), slotted by :func:`from_csr`.
    ``bcast_lq``: a broadcast Q of that many rows (``lens_q`` ignored); ``capacity``: indices cut (or padded
    with -1) to that many entries."""
    rng = np.random.default_rng(seed)
    num_seqs = len(lens_k)
    if bcast_lq is not None:
        lens_q = (bcast_lq,) * num_seqs
    offsets, indices, nqb = random_rows(lens_q, lens_k, bs, heads, rng, kinds, density)
    if capacity is not None:
        indices = torch.cat([indices, torch.full((max(capacity - indices.numel(), 0),), -1, dtype=torch.int32)])
        indices = indices[:capacity]
    cu_q = None if bcast_lq is not None else _cu(lens_q, device)
    cu_k = _cu(lens_k, device)
    out_cu = output_offsets(cu_q, num_seqs, bcast_lq or 0, bcast_lq is not None, device)
    rows = num_seqs * bcast_lq if bcast_lq is not None else int(sum(lens_q))
    q_blocks = query_blocks(out_cu, rows, bs)
    lists = from_csr(offsets.to(device), indices.to(device), block_size=bs, num_heads=heads, num_q_blocks=nqb,
                     num_q_slots=q_blocks.num_slots)
    return lists, q_blocks, cu_k, int(sum(lens_k))


@dataclass(frozen=True)
class Hand:
    lens_q: tuple
    lens_k: tuple
    bs: int = 16
    H: int = 1
    bcast_lq: Optional[int] = None
    kinds: tuple = ROW_KINDS
    density: Optional[float] = None
    capacity: Optional[int] = None


HAND = {
    "mixed-rows": Hand((40, 17, 33), (50, 90, 5), H=3),
    "all-empty": Hand((40, 17, 33), (50, 90, 5), H=3, kinds=("empty",)),
    "one-block": Hand((40, 17, 33), (50, 90, 5), kinds=("one",)),
    "dense": Hand((40, 17, 33), (50, 90, 5), H=3, kinds=("all",)),
    "first-blocks": Hand((64, 64), (64, 200), kinds=("first",)),
    "last-blocks": Hand((64, 64), (64, 200), kinds=("last",)),
    "half-density": Hand((100, 3, 70), (120, 40, 1), H=3, kinds=("random",), density=0.5),
    "empty-seqs": Hand((0, 20, 0, 9, 0), (0, 33, 0, 15, 7), H=3),
    "lq-zero-lk-not": Hand((0, 0, 30), (40, 17, 30), H=1, kinds=("all",)),
    "lk-zero-lq-not": Hand((20, 17, 30), (0, 0, 40), H=3, kinds=("all",)),
    "all-k-empty": Hand((20, 17), (0, 0), H=3),
    "all-q-empty": Hand((0, 0), (20, 17), H=3),
    "shorter-than-block": Hand((5, 9, 1), (7, 3, 15), H=3, kinds=("all",)),
    "bs-1-bs-bs+1": Hand((15, 16, 17, 31, 32, 33), (17, 16, 15, 33, 32, 31), H=3),
    "one-sequence-one-block": Hand((1,), (1,), kinds=("all",)),
    "no-sequences": Hand((), (), H=3),
    "block-32": Hand((70, 33, 130), (130, 47, 64), bs=32, H=3),
    "block-64": Hand((70, 300, 1), (200, 130, 64), bs=64, H=3),
    "block-128": Hand((300, 129, 1), (500, 128, 1), bs=128, H=3, kinds=("all", "random", "one")),
    "many-query-blocks": Hand((1100, 20), (80, 300), H=1),  # 69 rows for a key block: several kernel steps
    "many-query-blocks-dense": Hand((700,), (40,), H=3, kinds=("all",)),
    "broadcast": Hand((), (50, 0, 17, 33), H=3, bcast_lq=40),
    "broadcast-dense": Hand((), (50, 0, 17, 33), H=1, bcast_lq=40, kinds=("all",)),
    "broadcast-lq-zero": Hand((), (50, 17), H=3, bcast_lq=0),
    "cut-capacity": Hand((40, 17, 33), (50, 90, 5), H=3, kinds=("all",), capacity=17),
    "cut-capacity-zero": Hand((40, 17, 33), (50, 90, 5), H=3, kinds=("all",), capacity=0),
    "spare-capacity": Hand((40, 17, 33), (50, 90, 5), H=3, capacity=500),
}


@pytest.mark.parametrize("case", HAND.values(), ids=HAND.keys())
def test_hand_made_lists_transpose_identically(case, device):
    parts = hand_made(case.lens_q, case.lens_k, case.bs, case.H, device, bcast_lq=case.bcast_lq, kinds=case.kinds,
                      density=case.density, capacity=case.capacity)
    assert_same_transpose(*parts)


@pytest.mark.parametrize("tiles", [(1, 1), (2, 4), (4, 2), (8, 16)], ids=lambda t: f"c{t[0]}-t{t[1]}")
def test_tiny_tiles_take_the_multi_step_path_identically(tiles, device, monkeypatch):
    from jfa.kernels.triton import block_transpose

    monkeypatch.setattr(block_transpose, "_BLOCK_C", tiles[0])
    monkeypatch.setattr(block_transpose, "_BLOCK_T", tiles[1])
    for seed, case in enumerate((HAND["mixed-rows"], HAND["empty-seqs"], HAND["cut-capacity"], HAND["broadcast"])):
        parts = hand_made(case.lens_q, case.lens_k, case.bs, case.H, device, seed, bcast_lq=case.bcast_lq,
                          capacity=case.capacity)
        assert_same_transpose(*parts)


def test_transposed_rows_hold_the_lists_entries_from_the_key_side(device):
    """Besides agreeing with the torch version: the key-side rows are the lists read column-wise."""
    lists, q_blocks, cu_k, total_k = hand_made((40, 17, 33), (50, 90, 5), 16, 3, device, 3)
    t = assert_same_transpose(lists, q_blocks, cu_k, total_k)
    off, idx = lists.offsets.cpu().tolist(), lists.indices.cpu().tolist()
    seq, tile = q_blocks.tiles.cpu().tolist()
    kb_off = np.concatenate([[0], np.cumsum([-(-n // 16) for n in (50, 90, 5)])]).tolist()
    want = {}
    for h in range(3):
        for g in range(lists.num_q_slots):
            for u in idx[off[h * lists.num_q_slots + g]:off[h * lists.num_q_slots + g + 1]]:
                want.setdefault(h * t.num_kv_slots + kb_off[seq[g]] + u, []).append(tile[g])
    t_off, t_idx = t.offsets.cpu().tolist(), t.indices.cpu().tolist()
    got = {c: t_idx[t_off[c]:t_off[c + 1]] for c in range(len(t_off) - 1) if t_off[c + 1] > t_off[c]}
    assert got == want


def test_no_heads_and_mismatched_tile_lists(device):
    from jfa.kernels.triton.block_transpose import transpose_lists

    cu = _cu((20, 17), device)
    q_blocks = query_blocks(cu, 37, 16)
    empty = BlockLists(torch.zeros(1, dtype=torch.int32, device=device), torch.zeros(0, dtype=torch.int32,
                       device=device), 16, 0, q_blocks.num_slots)
    assert_same_transpose(empty, q_blocks, cu, 37)
    lists, q_blocks, cu_k, total_k = hand_made((20, 17), (30, 30), 16, 1, device)
    with pytest.raises(ValueError, match="does not match"):
        transpose_lists(lists, query_blocks(_cu((20, 17, 5), device), 42, 16), cu_k, total_k)


# --- the selection kernel's lists ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Sel:
    lens_q: Optional[tuple]  # None with broadcast_q
    lens_k: tuple
    bs: int = 16
    topk: Optional[int] = 2
    keep_ratio: Optional[float] = None
    causal: bool = False
    H: int = 3
    Hk: int = 1
    bcast_lq: Optional[int] = None
    max_seqlen_k: Optional[int] = None  # default the longest key sequence; smaller cuts the lists


SEL = {
    "topk": Sel((40, 17, 33), (50, 90, 5)),
    "topk-causal": Sel((40, 17, 33), (50, 90, 5), causal=True),
    "topk-1-causal-gqa": Sel((50, 40, 33), (20, 33, 1), topk=1, causal=True, H=3, Hk=3),
    "keep-ratio-0.3": Sel((40, 33), (80, 150), topk=None, keep_ratio=0.3),
    "keep-ratio-0.5-causal": Sel((20, 100), (150, 90), topk=None, keep_ratio=0.5, causal=True),
    "keep-ratio-1-dense-causal": Sel((40, 33), (47, 80), topk=None, keep_ratio=1.0, causal=True, H=1),
    "empty-seqs-causal": Sel((0, 20, 0, 9), (0, 33, 0, 0), causal=True),
    "block-32": Sel((70, 33), (130, 47), bs=32, topk=2, causal=True),
    "block-64": Sel((70, 130), (130, 200), bs=64, topk=2),
    "block-128": Sel((300, 129), (260, 300), bs=128, topk=1, causal=True),
    "broadcast": Sel(None, (50, 0, 17, 33), bcast_lq=40),
    "broadcast-causal": Sel(None, (50, 0, 17, 70), bcast_lq=40, causal=True, topk=None, keep_ratio=0.4),
    "cut-by-max-seqlen-k": Sel((40, 17, 33), (50, 90, 5), topk=4, max_seqlen_k=20),
    "no-sequences": Sel((), ()),
}


def selected(case: Sel, device: str, seed: int = 0):
    from jfa.kernels.triton.block_select import select_kv_blocks

    gen = torch.Generator().manual_seed(seed)
    num_seqs = len(case.lens_k)
    broadcast_q = case.bcast_lq is not None
    rows_q = case.bcast_lq if broadcast_q else int(sum(case.lens_q))
    q = torch.randn((rows_q, case.H, 8), generator=gen).to(device)
    k = torch.randn((int(sum(case.lens_k)), case.Hk, 8), generator=gen).to(device)
    cu_q = None if broadcast_q else _cu(case.lens_q, device)
    cu_k = _cu(case.lens_k, device)
    longest = max(case.lens_k, default=0) if case.max_seqlen_k is None else case.max_seqlen_k
    lists = select_kv_blocks(q, k, cu_q, cu_k, block_size=case.bs, topk=case.topk, keep_ratio=case.keep_ratio,
                             causal=case.causal, broadcast_q=broadcast_q, max_seqlen_k=longest)
    len_q = case.bcast_lq or 0
    out_cu = output_offsets(cu_q, num_seqs, len_q, broadcast_q, device)
    q_blocks = query_blocks(out_cu, num_seqs * len_q if broadcast_q else rows_q, case.bs)
    return lists, q_blocks, cu_k, k.shape[0]


@pytest.mark.parametrize("case", SEL.values(), ids=SEL.keys())
def test_selected_lists_transpose_identically(case, device):
    assert_same_transpose(*selected(case, device))


# --- random offsets ------------------------------------------------------------------------------------------

@settings(max_examples=30)
@given(lens=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70)), min_size=0, max_size=4),
       bs=st.sampled_from([16, 32, 64, 128]), heads=st.sampled_from([1, 3]), broadcast=st.booleans(),
       kinds=st.sampled_from([ROW_KINDS, ("random",), ("all",), ("empty", "one")]), seed=st.integers(0, 2**16))
def test_random_offsets_transpose_identically(lens, bs, heads, broadcast, kinds, seed, device):
    lens_q, lens_k = tuple(a for a, _ in lens), tuple(b for _, b in lens)
    bcast_lq = (lens_q[0] if lens_q else 0) if broadcast else None
    assert_same_transpose(*hand_made(lens_q, lens_k, bs, heads, device, seed, bcast_lq=bcast_lq, kinds=kinds))


@settings(max_examples=8)
@given(lens=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=3),
       rule=st.sampled_from([("topk", 1), ("topk", 3), ("ratio", 0.4), ("ratio", 1.0)]), causal=st.booleans(),
       bs=st.sampled_from([16, 32]), seed=st.integers(0, 3))
def test_random_selected_lists_transpose_identically(lens, rule, causal, bs, seed, device):
    topk, ratio = (rule[1], None) if rule[0] == "topk" else (None, rule[1])
    case = Sel(tuple(a for a, _ in lens), tuple(b for _, b in lens), bs=bs, topk=topk, keep_ratio=ratio,
               causal=causal, H=1)
    assert_same_transpose(*selected(case, device, seed))
