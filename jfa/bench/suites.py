"""Benchmark suites as data: problems, their sequence lengths and their FLOP counts.

Everything here runs on the CPU and never touches CUDA, so a suite can be listed
(``jfa bench --dry-run``) on a machine without a GPU.

The ``gem`` suite is DESIGN.md section 6, reproduced exactly: every problem draws its
lengths from a *fresh* ``torch.Generator().manual_seed(1)`` (see :func:`make_lengths`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = [
    "Problem",
    "SUITES",
    "LAB_SUITES",
    "LENGTHS_SEED",
    "get_suite",
    "make_lengths",
    "q_lengths",
    "visible_pairs",
    "flops",
    "sweep_lengths",
    "PASSES",
    "PASS_FACTORS",
]

#: Seed of the fresh generator every problem draws its lengths from (DESIGN.md section 6).
LENGTHS_SEED = 1
#: The timed passes: forward, backward (= fwd_bwd - fwd) and forward+backward.
PASSES = ("fwd", "bwd", "fwd_bwd")
#: FLOPs of each pass in units of the forward FLOPs (DESIGN.md section 6: backward 2.5x).
PASS_FACTORS = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}

LengthsFn = Callable[[torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class Problem:
    """One benchmark shape.

    ``lengths_fn(g)`` returns the B key/value lengths given the fresh generator ``g``.
    Without ``broadcast_q`` the query lengths equal the key lengths (self-attention over
    packed sequences); with it, one dense Q of ``Lq`` rows is shared by all B sequences.
    ``H_kv``: key/value heads (None: H; grouped-query attention when fewer); ``window``: the API's
    ``window_size`` (left, right), -1 unbounded.
    """

    name: str
    B: int
    H: int
    D: int
    max_len: int
    lengths_fn: LengthsFn
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    broadcast_q: bool = False
    Lq: int | None = None
    H_kv: int | None = None
    window: tuple[int, int] = (-1, -1)

    @property
    def kv_heads(self) -> int:
        return self.H if self.H_kv is None else self.H_kv

    def __post_init__(self):
        if self.H % self.kv_heads:
            raise ValueError(f"{self.name}: H_kv={self.H_kv} must divide H={self.H}")
        if self.causal and self.window[1] not in (-1, 0):
            raise ValueError(f"{self.name}: a causal window has right side 0")
        if self.broadcast_q and self.Lq is None:
            raise ValueError(f"{self.name}: broadcast_q needs Lq")
        if not self.broadcast_q and self.Lq is not None:
            raise ValueError(f"{self.name}: Lq is only meaningful with broadcast_q")


# ---------------------------------------------------------------------------------------
# Length recipes. Each returns a function of the generator, so make_lengths can hand it a
# fresh one.
# ---------------------------------------------------------------------------------------

def _uniform(B: int, max_len: int) -> LengthsFn:
    """Lengths uniform in [1, max_len]: ``torch.randint(1, max_len + 1, (B,), generator=g)``."""
    return lambda g: torch.randint(1, max_len + 1, (B,), generator=g)


def _longtail(B: int, max_len: int, zero_every: int = 17) -> LengthsFn:
    """Log-normal lengths around max_len/8, clamped to [0, max_len]; every 17th one is 0."""

    def fn(g: torch.Generator) -> torch.Tensor:
        x = torch.exp(torch.randn(B, generator=g) * 1.2 + math.log(max_len / 8))
        lengths = x.clamp(0, max_len).long()
        lengths[::zero_every] = 0
        return lengths

    return fn


def _full(B: int, length: int) -> LengthsFn:
    """All sequences of the same length (dense sanity shapes)."""
    return lambda g: torch.full((B,), length, dtype=torch.long)


def sweep_lengths(B: int, max_len: int, sparsity: float) -> LengthsFn:
    """Lengths for a target sparsity.

    Sparsity is the fraction of a padded ``[B, max_len]`` batch that is padding:
    ``s = 1 - mean(L) / max_len``. Lengths are drawn uniform in ``[1, hi]`` with
    ``hi = round(2 * (1 - s) * max_len)`` (mean ``(1 - s) * max_len``) and then clamped to
    ``max_len``. For ``s < 0.5`` ``hi`` exceeds ``max_len``, so the clamp shortens the longest
    draws and the realised sparsity is above the nominal one (s=0.1 gives about 0.28, s=0.3
    about 0.34); the dry-run prints the realised value.
    """
    hi = max(1, round(2 * (1 - sparsity) * max_len))
    return lambda g: torch.randint(1, hi + 1, (B,), generator=g).clamp(max=max_len)


# ---------------------------------------------------------------------------------------
# Suites
# ---------------------------------------------------------------------------------------

def _gem() -> tuple[Problem, ...]:
    """DESIGN.md section 6: bf16, non-causal."""
    return (
        Problem("uniform-B512-L1024-H4-D128", B=512, H=4, D=128, max_len=1024,
                lengths_fn=_uniform(512, 1024)),
        Problem("longtail-B256-L4096-H4-D128", B=256, H=4, D=128, max_len=4096,
                lengths_fn=_longtail(256, 4096)),
        Problem("uniform-B1152-L1000-H2-D64", B=1152, H=2, D=64, max_len=1000,
                lengths_fn=_uniform(1152, 1000)),
        Problem("full-B8-L4096-H16-D128", B=8, H=16, D=128, max_len=4096,
                lengths_fn=_full(8, 4096)),
        Problem("bcastq-Lq256-B1152-L1000-H4-D128", B=1152, H=4, D=128, max_len=1000,
                lengths_fn=_uniform(1152, 1000), broadcast_q=True, Lq=256),
    )


def _sweep() -> tuple[Problem, ...]:
    """Sparsity sweep: B=1152, H=4, D=128, max length 1000 and 4096, s = 0.1 .. 0.9."""
    problems = []
    for max_len in (1000, 4096):
        for s in (0.1, 0.3, 0.5, 0.7, 0.9):
            problems.append(Problem(
                f"sweep-L{max_len}-s{s:.1f}-B1152-H4-D128", B=1152, H=4, D=128,
                max_len=max_len, lengths_fn=sweep_lengths(1152, max_len, s)))
    return tuple(problems)


def _dense() -> tuple[Problem, ...]:
    """Small dense set (every sequence full length) to compare against dense FA numbers."""
    return (
        Problem("dense-B4-L2048-H32-D128", B=4, H=32, D=128, max_len=2048,
                lengths_fn=_full(4, 2048)),
        Problem("dense-B1-L8192-H32-D128", B=1, H=32, D=128, max_len=8192,
                lengths_fn=_full(1, 8192)),
        Problem("dense-B4-L8192-H16-D128", B=4, H=16, D=128, max_len=8192,
                lengths_fn=_full(4, 8192)),
        Problem("dense-B4-L8192-H16-D128-causal", B=4, H=16, D=128, max_len=8192,
                lengths_fn=_full(4, 8192), causal=True),
    )


def _gqa() -> tuple[Problem, ...]:
    """Grouped-query attention and sliding windows on jagged batches (the shapes FA4 takes natively)."""
    return (
        Problem("gqa-uniform-B256-L2048-H16-KV4-D128", B=256, H=16, H_kv=4, D=128, max_len=2048,
                lengths_fn=_uniform(256, 2048)),
        Problem("mqa-uniform-B1152-L1000-H8-KV1-D64", B=1152, H=8, H_kv=1, D=64, max_len=1000,
                lengths_fn=_uniform(1152, 1000)),
        Problem("gqa-window-causal-B128-L4096-H16-KV4-D128-W1024", B=128, H=16, H_kv=4, D=128, max_len=4096,
                lengths_fn=_uniform(128, 4096), causal=True, window=(1024, 0)),
        Problem("window-longtail-B256-L4096-H4-D128-W256", B=256, H=4, D=128, max_len=4096,
                lengths_fn=_longtail(256, 4096), window=(256, 256)),
    )


def _causal() -> tuple[Problem, ...]:
    """Causal masks on the gem suite's jagged and dense shapes and on grouped heads at 4096 keys: a key tile's
    backward work depends on where it sits in its sequence, a query tile's forward work too."""
    return (
        Problem("uniform-B512-L1024-H4-D128-causal", B=512, H=4, D=128, max_len=1024,
                lengths_fn=_uniform(512, 1024), causal=True),
        Problem("longtail-B256-L4096-H4-D128-causal", B=256, H=4, D=128, max_len=4096,
                lengths_fn=_longtail(256, 4096), causal=True),
        Problem("full-B8-L4096-H16-D128-causal", B=8, H=16, D=128, max_len=4096,
                lengths_fn=_full(8, 4096), causal=True),
        Problem("gqa-uniform-B128-L4096-H16-KV4-D128-causal", B=128, H=16, H_kv=4, D=128, max_len=4096,
                lengths_fn=_uniform(128, 4096), causal=True),
    )


def _causal_sweep() -> tuple[Problem, ...]:
    """Causal batches of ~262k tokens whose sequences average 512 to 1536 rows, at D 128 (4 heads) and D 64 (2):
    where a causal forward's items are better taken from the counter than dealt zig-zag
    (``jfa.kernels.tlx.hopper.forward.LONG_CAUSAL_TILES``; ``python -m jfa.bench.ablation forward --suite
    causal-sweep --only "dynamic,zig-zag"``). Uniform lengths in [1, L] (mean ~L / 2) and all sequences of L;
    then equal lengths of 2048-4096 keys in batches whose items take few or many rounds of the grid (a makespan
    model, NOTES.md session 39, predicts the counter's gain there from how zig-zag's rounds meet the sequences,
    not from the rows per sequence)."""
    tokens = 1 << 18
    problems = []
    for D, H in ((128, 4), (64, 2)):
        for max_len in (1024, 1280, 1536, 1792, 2048, 3072):
            B = 2 * tokens // max_len
            problems.append(Problem(f"causal-sweep-uniform-B{B}-L{max_len}-H{H}-D{D}", B=B, H=H, D=D, max_len=max_len,
                                    lengths_fn=_uniform(B, max_len), causal=True))
        for length in (512, 640, 768, 896, 1024):
            B = tokens // length
            problems.append(Problem(f"causal-sweep-full-B{B}-L{length}-H{H}-D{D}", B=B, H=H, D=D, max_len=length,
                                    lengths_fn=_full(B, length), causal=True))
    for B, H, length in ((16, 8, 4096), (64, 4, 4096), (32, 4, 2048)):
        problems.append(Problem(f"causal-sweep-full-B{B}-L{length}-H{H}-D128", B=B, H=H, D=128, max_len=length,
                                lengths_fn=_full(B, length), causal=True))
    problems.append(Problem("causal-sweep-uniform-B64-L4096-H4-D128", B=64, H=4, D=128, max_len=4096,
                            lengths_fn=_uniform(64, 4096), causal=True))
    return tuple(problems)


def _bcastq_sweep() -> tuple[Problem, ...]:
    """A broadcast Q of 128 to 512 rows over short (mean ~500) and long (mean ~2048) jagged keys, at D 128 and
    D 64: whether such launches, whose items are few query tiles each streaming one sequence's keys, are better
    taken from the counter than dealt zig-zag (``python -m jfa.bench.ablation forward --suite bcastq-sweep --only
    dynamic``; zig-zag was ahead or within 4% on all twelve, NOTES.md session 41)."""
    problems = []
    for D in (128, 64):
        for len_q in (128, 256, 512):
            for B, max_len in ((1152, 1000), (256, 4096)):
                problems.append(Problem(f"bcastq-sweep-Lq{len_q}-B{B}-L{max_len}-H4-D{D}", B=B, H=4, D=D,
                                        max_len=max_len, lengths_fn=_uniform(B, max_len), broadcast_q=True,
                                        Lq=len_q))
    return tuple(problems)


def _items_sweep() -> tuple[Problem, ...]:
    """D 64 batches (the producer's-dQ build of the backward) whose dK/dV work items run ~2 to ~20 query steps
    each: jagged uniform lengths of mean 128 to 1024 rows (~2^19 tokens, 2 heads; a key tile's item runs its
    sequence's query tiles, so the item-weighted mean is ~2/3 of the longest length over 64 rows), one causal
    batch, and a broadcast Q of 128 to 1024 rows (2 to 16 steps an item): where the next item's K, V and first
    query tiles pay for being loaded during this one (``PREFETCH_MAX_STEPS`` of the backward; ``python -m
    jfa.bench.ablation backward --suite items-sweep --only prefetch``)."""
    tokens = 1 << 19
    problems = [Problem(f"items-sweep-uniform-B{2 * tokens // L}-L{L}-H2-D64", B=2 * tokens // L, H=2, D=64,
                        max_len=L, lengths_fn=_uniform(2 * tokens // L, L)) for L in (256, 384, 512, 1024, 2048)]
    problems.append(Problem("items-sweep-uniform-B2048-L512-H2-D64-causal", B=2048, H=2, D=64, max_len=512,
                            lengths_fn=_uniform(2048, 512), causal=True))
    problems += [Problem(f"items-sweep-bcastq-Lq{len_q}-B1152-L1000-H4-D64", B=1152, H=4, D=64, max_len=1000,
                         lengths_fn=_uniform(1152, 1000), broadcast_q=True, Lq=len_q)
                 for len_q in (128, 256, 512, 1024)]
    return tuple(problems)


SUITES: dict[str, tuple[Problem, ...]] = {
    "gem": _gem(),
    "sweep": _sweep(),
    "dense": _dense(),
    "gqa": _gqa(),
    "causal": _causal(),
    "causal-sweep": _causal_sweep(),
    "bcastq-sweep": _bcastq_sweep(),
    "items-sweep": _items_sweep(),
}
#: Suites that measure one kernel decision (the lab's, run by name): ``--suite all`` leaves them out.
LAB_SUITES = ("causal-sweep", "bcastq-sweep", "items-sweep")


def get_suite(name: str) -> tuple[Problem, ...]:
    """The problems of suite ``name``; a ``ValueError`` lists the known suites otherwise."""
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)}") from None


# ---------------------------------------------------------------------------------------
# Lengths and FLOPs
# ---------------------------------------------------------------------------------------

def make_lengths(problem: Problem) -> torch.Tensor:
    """The B key/value lengths of ``problem`` (int64, CPU), drawn from a fresh generator.

    ``g = torch.Generator().manual_seed(1)`` is created anew on every call, so the lengths
    of a problem never depend on which problems were generated before it.
    """
    g = torch.Generator().manual_seed(LENGTHS_SEED)
    lengths = problem.lengths_fn(g).to(torch.long)
    if lengths.shape != (problem.B,):
        raise AssertionError(f"{problem.name}: lengths shape {tuple(lengths.shape)} != ({problem.B},)")
    if int(lengths.min()) < 0 or int(lengths.max()) > problem.max_len:
        raise AssertionError(f"{problem.name}: lengths outside [0, {problem.max_len}]")
    return lengths


def q_lengths(problem: Problem, lengths_k: torch.Tensor) -> torch.Tensor:
    """Per-sequence query lengths: ``Lq`` for every sequence under broadcast-Q, else ``lengths_k``."""
    if problem.broadcast_q:
        return torch.full_like(lengths_k, problem.Lq)
    return lengths_k.clone()


def visible_pairs(lengths_q: torch.Tensor, lengths_k: torch.Tensor, causal: bool,
                  window: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """Per sequence, the number of (query, key) pairs that are attended (int64).

    Non-causal: ``Lq * Lk``. Causal is bottom-right aligned: query i sees keys
    ``j <= i + Lk - Lq``, i.e. ``max(0, i + a)`` keys with ``a = Lk - Lq + 1`` (never more than
    Lk since ``i <= Lq - 1``). Summing over the queries that see at least one key,
    ``i = s .. Lq-1`` with ``s = max(0, 1 - a)``, gives ``n * (s + a) + n * (n - 1) / 2`` with
    ``n = max(0, Lq - s)``.

    A sliding ``window`` (left, right; -1 unbounded; causal makes right 0) counts per query row i
    the keys j with ``-left <= j - i - (Lk - Lq) <= right`` inside [0, Lk).
    """
    lq = lengths_q.to(torch.long)
    lk = lengths_k.to(torch.long)
    if tuple(window) != (-1, -1) and tuple(window) != (-1, 0):
        return _window_pairs(lq, lk, causal, window)
    causal = causal or tuple(window) == (-1, 0)
    if not causal:
        return lq * lk
    a = lk - lq + 1
    s = (1 - a).clamp(min=0)
    n = (lq - s).clamp(min=0)
    return n * (s + a) + n * (n - 1) // 2


def _window_pairs(lq: torch.Tensor, lk: torch.Tensor, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    left, right = window
    right = 0 if causal else right
    seq = torch.repeat_interleave(torch.arange(lq.numel()), lq)
    first_row = torch.cumsum(lq, 0) - lq
    i = torch.arange(int(lq.sum())) - first_row[seq]
    diag = i + (lk - lq)[seq]  # the key on row i's diagonal
    lo = (diag - left).clamp(min=0) if left >= 0 else torch.zeros_like(diag)
    hi = torch.minimum(diag + right, lk[seq] - 1) if right >= 0 else lk[seq] - 1
    per_row = (hi - lo + 1).clamp(min=0)
    return torch.zeros(lq.numel(), dtype=torch.long).index_add_(0, seq, per_row)


def flops(problem: Problem, lengths_q: torch.Tensor, lengths_k: torch.Tensor, pass_: str) -> float:
    """FLOPs of one pass: forward ``4 * sum_b pairs_b * H * D``; backward 2.5x forward.

    ``pass_`` is "fwd", "bwd" or "fwd_bwd" (= 3.5x forward). Causal problems count visible
    pairs only (:func:`visible_pairs`). The count is the same for every implementation,
    including peers that receive a repeated Q under broadcast-Q.
    """
    pairs = visible_pairs(lengths_q, lengths_k, problem.causal, problem.window)
    fwd = 4.0 * float(pairs.sum()) * problem.H * problem.D
    if pass_ not in PASS_FACTORS:
        raise ValueError(f"pass_ must be one of {sorted(PASS_FACTORS)}, got {pass_!r}")
    return fwd * PASS_FACTORS[pass_]
