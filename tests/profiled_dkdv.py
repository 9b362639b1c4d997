"""Shared by the simulator and GPU tests of the dK/dV kernel's profiling build: the fused-dQ launch run as it
ships and as the profiling build, and what every launch's records must show."""
import contextlib

import torch

from jfa.bench.timeline import columns
from jfa.kernels.tlx.hopper import backward as tlx_backward


def profiled_dkdv(q, k, v, cu, *, causal: bool, launching=contextlib.nullcontext,
                  variant: tlx_backward.BackwardVariant = tlx_backward.SHIPPED) -> torch.Tensor:
    """The profiling build's records of the fused-dQ dK/dV launch on this self-attention batch (random out, lse
    and dout), after asserting that its dK and dV are bitwise the build's without profiling. ``launching``: the
    context each launch runs in (the simulator's); ``variant``: the backward's switches (default: what ships)."""
    out, lse, dout = torch.randn_like(q), torch.randn(q.shape[:2], device=q.device), torch.randn_like(q)
    grads, records = [], None
    for profile in (False, True):
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        with launching():
            records = tlx_backward.jagged_dkdv_tlx(
                q, k, v, dout, lse, None, dk, dv, cu, cu, causal=causal, softmax_scale=q.shape[-1] ** -0.5,
                broadcast_q=False, num_seqs=cu.numel() - 1, dq_accum=tlx_backward.DqAccumulator(q),
                outputs=(out, dout, None), profile=profile, variant=variant)
        grads.append((dk, dv))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1]), "profiling changed dK/dV"
    assert records is not None and records.shape[1] == len(tlx_backward.PROFILE_FIELDS)
    return records.cpu()


def field(records: torch.Tensor, name: str) -> torch.Tensor:
    """Column ``name`` (one of ``PROFILE_FIELDS``) of the dK/dV kernel's profiling records."""
    return columns(records, tlx_backward.PROFILE_FIELDS)[name]


def assert_one_ordered_record_per_item(records: torch.Tensor, grid: int, item_prefetch: bool = False) -> None:
    """Every item recorded (no -1 left), by a CTA of the grid, the consumers' phases and the producer's each in
    order, and each CTA's items one after another (the consumers' and the producer's: the producer starts an
    item once it is done with the previous one; each item's steps counted from where the previous one's end). With ``item_prefetch`` (``BackwardVariant.item_prefetch``) the K and
    V of a CTA's item after its first are issued during the previous item, after that item's last load."""
    (sm, start_ns, start, kv_ready, steps_done, end, cta, steps, producer_start, kv_issued, loads_done,
     producer_end, decoded, first_step) = records.T
    assert (records >= 0).all(), "an item without a record"
    assert (cta < grid).all() and (start_ns > 0).all()
    assert ((start <= decoded) & (decoded <= kv_ready) & (kv_ready <= steps_done) & (steps_done <= end)).all(), \
        "phases out of order"
    # (the K/V issue is stamped after both consumers' loads: consumer 0's may be ready before it)
    assert ((kv_issued <= loads_done) & (producer_start <= loads_done) & (loads_done <= producer_end)).all(), \
        "the producer's phases out of order"
    for c in cta.unique().tolist():
        order = start[cta == c].argsort()
        starts, ends = start[cta == c][order], end[cta == c][order]
        producer_starts, producer_ends = producer_start[cta == c][order], producer_end[cta == c][order]
        assert (starts[1:] >= ends[:-1]).all(), f"CTA {c}'s items overlap"
        assert (producer_starts[1:] >= producer_ends[:-1]).all(), f"CTA {c}'s producer overlaps its items"
        firsts, counts = first_step[cta == c][order], steps[cta == c][order]
        assert firsts[0] == 0 and (firsts[1:] == (firsts + counts)[:-1]).all(), \
            f"CTA {c}: an item's steps do not start where the previous item's end"
        issued, loaded = kv_issued[cta == c][order], loads_done[cta == c][order]
        assert issued[0] >= producer_starts[0], f"CTA {c}'s first K and V issued before its producer started"
        if item_prefetch:
            assert ((issued[1:] >= loaded[:-1]) & (issued[1:] <= producer_starts[1:])).all(), \
                f"CTA {c}: K and V not issued between the previous item's last load and the item's start"
        else:
            assert (issued >= producer_starts).all(), f"CTA {c}: K and V issued before the item's producer started"


def query_steps(lengths, heads: int, head_dim: int) -> int:
    """The query steps of a non-causal self-attention launch: each key tile of a sequence steps over its query
    blocks, once per head."""
    cfg = tlx_backward.config_for(head_dim)
    tile = tlx_backward.NUM_CONSUMERS * cfg.block_n
    return heads * sum(-(-n // tile) * -(-n // cfg.block_m) for n in lengths)
