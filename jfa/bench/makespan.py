"""A makespan model of the TLX causal forward's two schedules, to predict where the global counter beats zig-zag.

Each problem's items are its tile list as the launcher builds it (``build_tile_list`` on the query offsets, longest
first; items head fastest); an item's cost is its causal 128-key blocks plus ``per_item`` (blocks). Zig-zag deals
the list as ``common.device.static_item`` does (round r: CTA p takes item r * P + p, or r * P + P - 1 - p in odd
rounds); the counter is greedy list scheduling (each item to the CTA that frees first), each item costing
``counter_cost`` blocks more (the fetch on the producer's path). No L2, no clocks: a model of balance only, fitted to
measured counter / zig-zag ratios (``fit``) and then read on shapes not measured.

    python -m jfa.bench.makespan --suite causal-sweep      # predictions with the constants fitted in NOTES.md

Session 39's constants (``FITTED``): per_item 0, counter_cost 0.55 blocks, fitted on session 38's four measured
causal-suite ratios (rms error 0.012). On session 41's causal sweep it ranks the D 128 problems right (within ~0.05)
but underrates the counter's cost at D 64 (1.07 predicted where 0.89 was measured); the shipped rule
(``Variant.for_launch``) is keyed on that sweep's measurements, not on this model.
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import math
import sys

import numpy as np
import torch

from jfa.bench.suites import Problem, get_suite, make_lengths
from jfa.kernels.schedule import build_tile_list

GRID = 132  # the H200's SMs: one persistent CTA each
BLOCK = 128  # keys per K/V block and query rows per work item of the TLX forward (two 64-row consumers)
FITTED = {"per_item": 0.0, "counter_cost": 0.55}
# session 38's measured counter / zig-zag forward speed (NOTES.md session 38, calls 3 and 6), the fit's data
MEASURED_SESSION_38 = {"uniform-B512-L1024-H4-D128-causal": 0.915, "longtail-B256-L4096-H4-D128-causal": 1.115,
                       "full-B8-L4096-H16-D128-causal": 1.185, "gqa-uniform-B128-L4096-H16-KV4-D128-causal": 1.01}


def item_costs(problem: Problem) -> np.ndarray:
    """The causal forward's work items of ``problem`` (self-attention, Lq == Lk) in launch order, each as its
    number of 128-key blocks (0 for a spare slot)."""
    lengths = make_lengths(problem)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32)
    tiles = build_tile_list(cu, int(cu[-1]), BLOCK, work_offsets=cu)
    seq, tile = tiles.tiles[0].long().numpy(), tiles.tiles[1].long().numpy()
    length = np.concatenate([lengths.numpy(), [0]])[seq]  # the sentinel sequence B has no rows
    kv_end = np.minimum(tile * BLOCK + BLOCK, length)  # keys up to the tile's last real row
    return np.repeat(np.ceil(kv_end / BLOCK), problem.H)


def makespans(costs: np.ndarray, per_item: float = 0.0, counter_cost: float = 0.0,
              grid: int = GRID) -> tuple[float, float]:
    """(zig-zag makespan, counter makespan) of ``costs`` in blocks over ``grid`` CTAs."""
    work = np.where(costs > 0, costs + per_item, 0.0)
    per_cta = np.zeros(grid)
    for r in range(math.ceil(len(work) / grid)):
        lanes = np.arange(grid) if r % 2 == 0 else np.arange(grid)[::-1]
        index = r * grid + lanes
        dealt = index < len(work)
        per_cta[dealt] += work[index[dealt]]
    free_at = [0.0] * grid
    for w in work:
        heapq.heappush(free_at, heapq.heappop(free_at) + w + counter_cost)
    return float(per_cta.max()), float(max(free_at))


def speedup(problem: Problem, per_item: float, counter_cost: float) -> float:
    """The counter's predicted speed over zig-zag on ``problem``."""
    zigzag, counter = makespans(item_costs(problem), per_item, counter_cost)
    return zigzag / counter


def fit(measured: dict, problems: dict) -> tuple[float, float, float]:
    """(per_item, counter_cost, rms error): the grid point (0 to 3 blocks by 0.25, 0 to 1.5 by 0.05) that best
    reproduces ``measured`` {problem name: counter / zig-zag speed}."""
    costs = {name: item_costs(problems[name]) for name in measured}
    best = None
    for per_item, counter_cost in itertools.product(np.arange(0, 3.01, 0.25), np.arange(0, 1.51, 0.05)):
        err = sum((np.divide(*makespans(costs[n], per_item, counter_cost)) - r) ** 2 for n, r in measured.items())
        if best is None or err < best[2]:
            best = (float(per_item), float(counter_cost), err)
    return best[0], best[1], math.sqrt(best[2] / len(measured))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.bench.makespan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="causal-sweep", help="suite whose causal problems to predict")
    parser.add_argument("--refit", action="store_true", help="fit the constants on session 38's measurements first")
    args = parser.parse_args(argv)
    per_item, counter_cost = FITTED["per_item"], FITTED["counter_cost"]
    if args.refit:
        per_item, counter_cost, rms = fit(MEASURED_SESSION_38, {p.name: p for p in get_suite("causal")})
        print(f"fitted: per_item {per_item} blocks, counter_cost {counter_cost:.2f} blocks, rms {rms:.3f}")
    for problem in get_suite(args.suite):
        if problem.causal and not problem.broadcast_q and tuple(problem.window) == (-1, -1):
            print(f"{problem.name:48s} counter / zig-zag {speedup(problem, per_item, counter_cost):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
