"""CTA dispatch: which CTAs of a launch's grid have started, which are still waiting, which were cancelled.

The simulator owns CTA launch, as the GPU's work distributor does. It starts the grid's CTAs in launch
order (x outer, z inner); ``sm_count`` of them are resident from the start (one CTA per SM: the kernels
that use cluster launch control fill an SM), and each time a CTA ends the next waiting one starts on the
freed SM. The simulator runs the started CTAs one after another, which is one legal timing of CTAs whose
only interaction is this dispatch (global-memory ordering between CTAs is not modelled). A launch in clusters
of N CTAs dispatches clusters: each entry is a cluster's first CTA, and its N CTAs run together
(``cluster.Cluster``); ``sm_count`` then counts CTAs (``sm_count // N`` clusters resident).

Cluster launch control's try_cancel (:meth:`Dispatch.try_cancel`) atomically claims the first CTA that has
not started: it never starts, and its x coordinate is the answer; when every CTA has started or been
claimed the answer is -1. Under a seeded schedule the hardware may start more waiting CTAs before a
try_cancel is answered (another SM freed up meanwhile), so seeds vary which CTAs get claimed and which run
on their own; the deterministic schedule starts none early.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Optional

from .errors import UnsupportedError


class Dispatch:
    """The CTAs of one launch's grid, by state: started (waiting for their turn on the simulator), not yet
    started, and cancelled (claimed by a try_cancel: never started)."""

    def __init__(self, grid3: tuple, sm_count: int, rng: Optional[random.Random], early_start_prob: float,
                 cluster: int = 1):
        gx, gy, gz = grid3
        self.grid3 = grid3
        self.cluster = cluster  # clusters start as units: the first CTA's index stands for its cluster
        self.waiting = deque((x, y, z) for x in range(0, gx, cluster) for y in range(gy) for z in range(gz))
        sm_count = max(1, sm_count // cluster)
        self.started: deque = deque()
        self.cancelled: list = []  # x coordinates, in the order they were claimed
        self.rng, self.early_start_prob = rng, early_start_prob
        for _ in range(min(max(1, sm_count), len(self.waiting))):
            self.started.append(self.waiting.popleft())

    def next_cta(self) -> Optional[tuple]:
        """The next started CTA to run, or None when the grid is done."""
        return self.started.popleft() if self.started else None

    def cta_done(self) -> None:
        """A CTA ended: its SM is free, so the first waiting CTA starts."""
        if self.waiting:
            self.started.append(self.waiting.popleft())

    def try_cancel(self) -> int:
        """Answer one try_cancel: claim the first CTA that has not started and return its x coordinate (it will
        never start), or -1 when none is left. Under a seeded schedule, waiting CTAs may start first."""
        if self.cluster != 1:
            raise UnsupportedError("cluster launch control on a launch of multi-CTA clusters is not simulated")
        if self.grid3[1] * self.grid3[2] != 1:
            raise UnsupportedError("cluster launch control on a grid of more than one dimension is not simulated")
        while self.rng is not None and self.waiting and self.rng.random() < self.early_start_prob:
            self.started.append(self.waiting.popleft())
        if not self.waiting:
            return -1
        x = self.waiting.popleft()[0]
        self.cancelled.append(x)
        return x
