"""The tile list covers every tile of every non-empty sequence exactly once, with no host sync."""
import pytest
import torch

from jfa.kernels.schedule import build_tile_list, num_tile_slots

LENGTHS = {
    "mixed": [0, 1, 63, 64, 65, 0, 300, 7],
    "all-empty": [0, 0, 0],
    "single": [1000],
    "exact-multiples": [64, 128, 192],
    "one-giant-many-tiny": [5000] + [1] * 50,
}


def expected_tiles(lengths, block):
    return {(b, t) for b, n in enumerate(lengths) for t in range((n + block - 1) // block)}


@pytest.mark.parametrize("block", [16, 64, 128])
@pytest.mark.parametrize("name", LENGTHS)
def test_every_tile_exactly_once(name, block):
    lengths = LENGTHS[name]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    tl = build_tile_list(cu, sum(lengths), block)
    seqs, tiles = tl.tiles[0].tolist(), tl.tiles[1].tolist()
    real = [(s, t) for s, t in zip(seqs, tiles) if s < len(lengths)]
    assert len(real) == len(set(real)), "a tile appears twice"
    assert set(real) == expected_tiles(lengths, block)
    assert all(s == len(lengths) for s in seqs if s >= len(lengths)), "spare slots must hold the sentinel B"


def test_slot_bound_holds_for_worst_case_lengths():
    for lengths in ([1] * 100, [65] * 7, [0, 129, 1, 64]):
        need = sum((n + 63) // 64 for n in lengths)
        assert num_tile_slots(sum(lengths), len(lengths), 64) >= need


def test_longest_work_first():
    lengths = [10, 10, 10, 10]
    work = torch.tensor([0, 5, 505, 555, 555])  # offsets of the streamed operand: lengths 5, 500, 50, 0
    cu = torch.tensor([0, 10, 20, 30, 40])
    tl = build_tile_list(cu, 40, 16, work_offsets=work)
    seqs = [s for s in tl.tiles[0].tolist() if s < len(lengths)]
    assert seqs == [1, 2, 0, 3]


def test_no_sequences():
    tl = build_tile_list(torch.tensor([0]), 0, 64)
    assert tl.num_slots == 0 and tl.tiles.shape == (2, 0)


def test_cached_list_is_reused_until_the_offsets_change():
    cu = torch.tensor([0, 10, 30])
    first = build_tile_list(cu, 30, 16)
    assert build_tile_list(cu, 30, 16) is first, "same unmodified tensor: the list is reused"
    assert build_tile_list(cu.clone(), 30, 16) is not first, "another tensor: built afresh"
    cu[2] = 40  # in-place write bumps the version counter
    rebuilt = build_tile_list(cu, 40, 16)
    assert rebuilt is not first
    assert rebuilt.tiles[0].tolist().count(1) == 2  # sequence 1 now has 30 rows: two tiles of 16
