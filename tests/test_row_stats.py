"""The TLX backward's statistics pass (a plain Triton kernel: on CPU it runs in the interpreter) against a
torch reference: lse in base 2 (+inf for rows that saw no key), delta = rowsum(dO * O) - dlse, each
sequence on its aligned columns with zeros in the gaps, and the fused dQ accumulator zeroed."""
import math

import pytest
import torch

from jfa.kernels.tlx.hopper.row_stats import COLUMN_ALIGN, aligned_columns, row_stats
from jfa.fuzz.cases import offsets

HEADS, HEAD_DIM = 3, 64
LENGTHS = {
    "tails-and-empties": [5, 0, 70, 1, 0, 33],
    "one-long": [300],
    "all-empty": [0, 0],
    "aligned": [COLUMN_ALIGN, 2 * COLUMN_ALIGN],
}


def _problem(lengths, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = sum(lengths)
    out, dout = (torch.randn(rows, HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    lse = torch.randn(rows, HEADS, generator=g)
    lse[::7, 1] = -math.inf  # rows that saw no key
    return out, dout, lse.to(device), torch.randn(rows, HEADS, generator=g).to(device), offsets(lengths, torch.int64, device)


def reference(lse, delta, out_cu):
    """stats [2H, width] as the pass lays them out, from per-row lse and delta."""
    num_seqs = out_cu.numel() - 1
    col_cu, width = aligned_columns(out_cu, num_seqs, lse.shape[0])
    stats = torch.zeros(2 * HEADS, width)
    lse2 = torch.where(lse == -math.inf, torch.full_like(lse, math.inf), lse * 1.4426950408889634)
    for b in range(num_seqs):
        r0, r1, c0 = int(out_cu[b]), int(out_cu[b + 1]), int(col_cu[b])
        stats[:HEADS, c0:c0 + r1 - r0] = lse2[r0:r1].T.cpu()
        stats[HEADS:, c0:c0 + r1 - r0] = delta[r0:r1].T.cpu()
    return stats


@pytest.mark.parametrize("name", LENGTHS)
def test_statistics_from_the_outputs_match_the_reference(name, device):
    out, dout, lse, dlse, out_cu = _problem(LENGTHS[name], device)
    num_seqs = out_cu.numel() - 1
    rowsum = (out.float() * dout.float()).sum(-1)
    for grad_of_lse in (None, dlse):
        stats, stats_cu = row_stats(lse, None, out_cu, num_seqs, outputs=(out, dout, grad_of_lse))
        want = reference(lse, rowsum if grad_of_lse is None else rowsum - grad_of_lse, out_cu)
        torch.testing.assert_close(stats[:HEADS].cpu(), want[:HEADS], rtol=0, atol=0)  # lse: exact
        torch.testing.assert_close(stats[HEADS:].cpu(), want[HEADS:], rtol=1e-5, atol=1e-5)  # a sum's order
        assert torch.equal(stats_cu, aligned_columns(out_cu, num_seqs, lse.shape[0])[0])


def test_a_zero_grad_of_lse_gives_bitwise_the_statistics_of_none(device):
    """Eager calls pass no grad of lse where none flows; traced ones a zero tensor: the same statistics."""
    out, dout, lse, _, out_cu = _problem(LENGTHS["tails-and-empties"], device)
    num_seqs = out_cu.numel() - 1
    without, _ = row_stats(lse, None, out_cu, num_seqs, outputs=(out, dout, None))
    with_zero, _ = row_stats(lse, None, out_cu, num_seqs, outputs=(out, dout, torch.zeros_like(lse)))
    assert torch.equal(without, with_zero)


def test_statistics_from_a_given_delta_match_the_reference(device):
    out, dout, lse, delta, out_cu = _problem(LENGTHS["tails-and-empties"], device, seed=1)
    stats, _ = row_stats(lse, delta, out_cu, out_cu.numel() - 1)
    torch.testing.assert_close(stats.cpu(), reference(lse, delta, out_cu), rtol=0, atol=0)


def test_the_pass_zeroes_the_fused_dq_accumulator(device):
    out, dout, lse, _, out_cu = _problem(LENGTHS["tails-and-empties"], device, seed=2)
    accumulator = torch.full((lse.shape[0], HEADS, HEAD_DIM), float("nan"), device=device)
    row_stats(lse, None, out_cu, out_cu.numel() - 1, outputs=(out, dout, None), zero=accumulator)
    assert torch.equal(accumulator, torch.zeros_like(accumulator))
