"""Fuzzing the MXFP8 attention kernels (``jfa.jagged_attention(..., precision="mxfp8" | "mxfp8-rceil")``)
against both bounds of docs/mxfp8.md section 3 (DESIGN.md section 4, issue 23).

Every example runs the kernels forward and backward (poisoned outputs, the dispatch recorded) and must
satisfy

- bound (a), ``jfa.oracle.mx_bounds.kernel_tolerance``: kernel against the float64 MX oracle
  (``jfa.oracle.mx_attention``; its backward at the kernel's stored out and lse);
- bound (b), ``jfa.oracle.mx_bounds.apriori_bound``: the MX oracle (its backward at its own out and lse)
  against exact attention (``jfa.oracle.attention``);
- and, what a user relies on, the kernel against exact attention within (a) + (b).

The input families (:data:`FAMILIES`) are the ones that break low precision: peaked softmax, attention
sinks, diffuse mass, outliers x100, a different value range per 32-block, and significands just past the
E4M3 rounding midpoints. The problems (:func:`mx_problems` for hypothesis, :func:`sample_case` for a seeded
sampler over the same space) are small enough for the CPU interpreter (about a second an example).

The dense fuzzer (``jfa.fuzz.strategies`` / ``rule`` / ``cases``) judges the bf16 kernels by its own rule;
this module is separate from it.

    python -m jfa.fuzz.mx --examples 40 --seed 1 --device cpu --out /tmp/mxfuzz

writes ``mx-fuzz.json`` (one record per example) and ``mx-fuzz.md`` (per family and rule: violations and
the tightness observed / bound per output) and exits 1 on any violation.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

DTYPES = ("bf16", "fp16", "fp32")
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # mx_bounds' out_dtype names
RULES = ("floor", "rceil")
PRECISION = {"floor": "mxfp8", "rceil": "mxfp8-rceil"}
KERNEL = "triton-mxfp8"  # the portable MXFP8 kernels (off sm_90, and where the TLX builds do not apply)
TLX_KERNEL = "tlx-hopper-mxfp8"  # the TLX MXFP8 forward and backward, where backend="auto" picks them
OUTPUTS = ("out", "lse", "dq", "dk", "dv")
CHECKS = ("a", "b", "kernel_vs_exact")
MAX_TOKENS = 200  # output rows + key rows of one problem: about a second on the CPU interpreter


# ----------------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MXCase:
    """One MXFP8 attention problem. With ``broadcast_q`` the shared Q has ``lengths_q[0]`` rows."""

    lengths_q: tuple
    lengths_k: tuple
    heads: int = 2
    kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "bf16"  # one of DTYPES
    causal: bool = False
    window: tuple = (-1, -1)  # window_size=(left, right), -1 unbounded
    broadcast_q: bool = False
    rule: str = "floor"  # one of RULES: precision "mxfp8" (floor) or "mxfp8-rceil"
    family: str = "gaussian"  # a key of FAMILIES
    seed: int = 0
    softmax_scale: Optional[float] = None  # None: 1 / sqrt(head_dim)

    def describe(self) -> str:
        def lens(xs):
            return ",".join(map(str, xs))

        bits = [f"mx-{self.rule}", self.family, f"q[{lens(self.lengths_q)}]", f"k[{lens(self.lengths_k)}]",
                f"H{self.heads}" + (f"kv{self.kv_heads}" if self.kv_heads != self.heads else ""),
                f"D{self.head_dim}", self.dtype]
        bits += [flag for flag, on in (("causal", self.causal), ("bcastq", self.broadcast_q)) if on]
        if tuple(self.window) != (-1, -1):
            bits.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softmax_scale is not None:
            bits.append(f"scale{self.softmax_scale:g}")
        bits.append(f"seed{self.seed}")
        return "-".join(bits)

    @property
    def rows(self) -> int:
        """Output rows: total_q, or B * Lq with a broadcast Q."""
        return len(self.lengths_k) * self.lengths_q[0] if self.broadcast_q else int(sum(self.lengths_q))


def _cu(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int64)


# ----------------------------------------------------------------------------------------------------
# input families: float64 q, k, v, dout (N(0, 1) to start with) changed in place
# ----------------------------------------------------------------------------------------------------
@dataclass
class _Layout:
    cu_k: np.ndarray       # key sequences
    cu_q_own: np.ndarray   # the rows q is quantized along (a broadcast Q: one sequence)
    cu_out: np.ndarray     # the output rows (dout's sequences)
    head_dim: int


def _per_token_block(x: np.ndarray, cu: np.ndarray, exponents: Callable[[int], np.ndarray]) -> None:
    """Multiply each 32-row block of each sequence of ``x`` by 2^e, e drawn per block."""
    for b in range(len(cu) - 1):
        n = int(cu[b + 1] - cu[b])
        if n:
            e = exponents((n + 31) // 32)
            x[cu[b]:cu[b + 1]] *= (2.0 ** np.repeat(e, 32)[:n])[:, None, None]


def _gaussian(x, lay, rng):
    pass


def _peaked(x, lay, rng):
    x["q"] *= 8.0  # a power of two: the MX bytes of q are unchanged, its scales move by 3


def _sink(x, lay, rng):
    u = rng.standard_normal((x["k"].shape[1], lay.head_dim))
    x["q"] += 1.5 * np.repeat(u, x["q"].shape[1] // x["k"].shape[1], axis=0)[None]
    first = lay.cu_k[:-1][np.diff(lay.cu_k) > 0]
    x["k"][first] = 6.0 * u[None]


def _diffuse(x, lay, rng):
    for b in np.nonzero(np.diff(lay.cu_k))[0]:
        x["k"][lay.cu_k[b]:lay.cu_k[b + 1]] = x["k"][lay.cu_k[b]]


def _outliers(x, lay, rng):
    for name in ("q", "k", "v", "dout"):
        x[name] *= np.where(rng.random(x[name].shape) < 0.02, 100.0, 1.0)


def _blockscale(x, lay, rng):
    nd = (lay.head_dim + 31) // 32
    dim_exp = lambda lo, hi: 2.0 ** np.repeat(rng.integers(lo, hi + 1, nd), 32)[:lay.head_dim]
    e = rng.integers(-4, 5, nd)
    x["q"] *= 2.0 ** np.repeat(e, 32)[:lay.head_dim]
    x["k"] *= 2.0 ** np.repeat(-e, 32)[:lay.head_dim]  # the logits keep their usual size
    x["v"] *= dim_exp(-4, 4)
    x["dout"] *= dim_exp(-4, 4)
    _per_token_block(x["v"], lay.cu_k, lambda n: rng.integers(-4, 5, n))
    _per_token_block(x["dout"], lay.cu_out, lambda n: rng.integers(-4, 5, n))
    _per_token_block(x["k"], lay.cu_k, lambda n: rng.integers(-1, 2, n))
    _per_token_block(x["q"], lay.cu_q_own, lambda n: rng.integers(-1, 2, n))


def _midpoints(x, lay, rng):
    for name in ("q", "k", "v", "dout"):
        shape = x[name].shape
        significand = 1.0 + (2 * rng.integers(0, 8, shape) + 1) / 16.0 + 2.0 ** -7  # exact in bf16/fp16/fp32
        magnitude = significand * 2.0 ** rng.integers(-2, 1, shape)
        sign = 1.0 if name in ("q", "k") else np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        x[name] = sign * magnitude


# name -> (builder, what it stresses)
FAMILIES: dict[str, tuple[Callable, str]] = {
    "gaussian": (_gaussian, "N(0, 1) q, k, v, dout: the baseline"),
    "peaked": (_peaked, "q x8 (logits 8x the usual spread): one key dominates a row, FLOOR saturates its P^ block"),
    "sink": (_sink, "each sequence's first key aligned with every query, logits far above the rest: one P^ ~ 1, "
                    "the rest tiny (subnormal E4M3, the E8M0 clamp)"),
    "diffuse": (_diffuse, "all keys of a sequence equal: uniform rows, mass spread over every key"),
    "outliers": (_outliers, "2% of q, k, v, dout entries x100: one element sets a block's scale, the other 31 "
                            "lose precision"),
    "blockscale": (_blockscale, "each 32-block along dim and along tokens at its own range 2^e, e in [-4, 4] "
                                "(k: -e of q's, logits stay moderate)"),
    "midpoints": (_midpoints, "significands just past E4M3 rounding midpoints, q and k positive: every "
                              "quantization error of a logit has the same sign (bound (b)'s worst case)"),
}


def make_mx_inputs(case: MXCase, device="cpu"):
    """``(q, k, v, dout, cu_q, cu_k)`` for ``case``: torch tensors in the case's dtype on ``device``
    (``cu_q`` None with a broadcast Q; offsets int32), deterministic in ``case.seed`` and ``case.family``."""
    import torch

    from jfa.fuzz.cases import DTYPES as TORCH_DTYPES

    if case.family not in FAMILIES:
        raise ValueError(f"family: unknown {case.family!r}, expected one of {tuple(FAMILIES)}")
    rng = np.random.default_rng(case.seed)
    H, Hk, D = case.heads, case.kv_heads, case.head_dim
    cu_k = _cu(case.lengths_k)
    if case.broadcast_q:
        lq = case.lengths_q[0]
        tq, cu_q_own, cu_out = lq, _cu([lq]), _cu([lq] * len(case.lengths_k))
    else:
        cu_q_own = cu_out = _cu(case.lengths_q)
        tq = int(cu_q_own[-1])
    tk = int(cu_k[-1])
    x = dict(q=rng.standard_normal((tq, H, D)), k=rng.standard_normal((tk, Hk, D)),
             v=rng.standard_normal((tk, Hk, D)), dout=rng.standard_normal((case.rows, H, D)))
    FAMILIES[case.family][0](x, _Layout(cu_k, cu_q_own, cu_out, D), rng)
    dtype = TORCH_DTYPES[case.dtype]
    q, k, v, dout = (torch.from_numpy(np.ascontiguousarray(x[n])).to(dtype).to(device) for n in ("q", "k", "v", "dout"))
    as_cu = lambda a: torch.from_numpy(a.astype(np.int32)).to(device)
    return q, k, v, dout, (None if case.broadcast_q else as_cu(cu_q_own)), as_cu(cu_k)


# ----------------------------------------------------------------------------------------------------
# the space of problems: one description, drawn by hypothesis (shrinking) or by a seeded RNG
# ----------------------------------------------------------------------------------------------------
class _HypothesisPick:
    def __init__(self, draw):
        self._draw = draw

    def choice(self, options):
        from hypothesis import strategies as st

        return self._draw(st.sampled_from(options))

    def integer(self, lo, hi):
        from hypothesis import strategies as st

        return self._draw(st.integers(lo, hi))


class _RandomPick:
    def __init__(self, rng: random.Random):
        self._rng = rng

    def choice(self, options):
        return options[self._rng.randrange(len(options))]

    def integer(self, lo, hi):
        return self._rng.randint(lo, hi)


BOUNDARY_LENGTHS = (1, 0, 31, 32, 33, 63, 64, 65)  # empty, one, and around the 32-row quantization blocks


def _length(pick, at_least: int = 0) -> int:
    kind = pick.choice(("uniform", "boundary", "empty"))
    if kind == "uniform":
        n = pick.integer(0, 100)
    elif kind == "boundary":
        n = pick.choice(BOUNDARY_LENGTHS)
    else:
        n = 0
    return max(n, at_least)


def _fit(lengths_q: list, lengths_k: list, broadcast_q: bool, max_tokens: int) -> None:
    """Halve the longest sequence (q or k side) until output rows + key rows fit ``max_tokens``."""
    cost = lambda: (len(lengths_k) * lengths_q[0] if broadcast_q else sum(lengths_q)) + sum(lengths_k)
    while cost() > max_tokens:
        q_weight = len(lengths_k) if broadcast_q else 1
        iq = max(range(len(lengths_q)), key=lengths_q.__getitem__)
        ik = max(range(len(lengths_k)), key=lengths_k.__getitem__)
        if lengths_q[iq] * q_weight >= lengths_k[ik]:
            lengths_q[iq] //= 2
        else:
            lengths_k[ik] //= 2


def _draw_case(pick, family: Optional[str] = None, rule: Optional[str] = None,
               max_tokens: int = MAX_TOKENS) -> MXCase:
    batch = pick.integer(1, 3)
    lengths_k = [_length(pick, at_least=1 if b == 0 else 0) for b in range(batch)]  # some key: a problem
    broadcast_q = pick.choice((False, False, True))
    causal = pick.choice((False, True))
    if broadcast_q:
        lengths_q = [_length(pick, at_least=1)]
    else:
        relation = pick.choice(("same", "independent", "shorter", "longer"))  # Lq != Lk, causal or not
        if relation == "same":
            lengths_q = list(lengths_k)
        elif relation == "independent":
            lengths_q = [_length(pick, at_least=1 if b == 0 else 0) for b in range(batch)]
        else:
            delta = pick.integer(1, 40)
            lengths_q = [max(0, n - delta) if relation == "shorter" else n + delta for n in lengths_k]
    _fit(lengths_q, lengths_k, broadcast_q, max_tokens)
    heads, kv_heads = pick.choice(((1, 1), (2, 1), (2, 2)))
    head_dim = pick.choice((32, 48, 64))
    dtype = pick.choice(DTYPES)
    window = (-1, -1)
    if pick.choice(("none", "none", "window")) == "window":
        left = pick.choice((-1, 0, 1, 8, 31, 40))
        right = pick.choice((-1, 0)) if causal else pick.choice((-1, 0, 3, 20))
        window = (left, right)
    rule = rule if rule is not None else pick.choice(RULES)
    family = family if family is not None else pick.choice(tuple(FAMILIES))
    softmax_scale = pick.choice((None, None, 0.0625, 0.25))
    seed = pick.integer(0, 2 ** 20)
    return MXCase(tuple(lengths_q), tuple(lengths_k), heads, kv_heads, head_dim, dtype, causal, window, broadcast_q,
                  rule, family, seed, softmax_scale)


def mx_problems(max_tokens: int = MAX_TOKENS):
    """Hypothesis strategy of :class:`MXCase`: 1-3 ragged sequences (empty ones, lengths around and off the
    32-row blocks, Lq != Lk causal or not), broadcast-Q, GQA/MQA, windows, D in {32, 48, 64}, bf16/fp16/fp32,
    both rules, every family, explicit softmax scales; output rows + key rows <= ``max_tokens``. Shrinks
    towards one short gaussian floor sequence."""
    from hypothesis import strategies as st

    return st.composite(lambda draw: _draw_case(_HypothesisPick(draw), max_tokens=max_tokens))()


def sample_case(seed: int, index: int, max_tokens: int = MAX_TOKENS) -> MXCase:
    """Example ``index`` of the seeded sampler over :func:`mx_problems`' space: the family and rule cycle
    (every family under both rules in each 2 x len(FAMILIES) examples), the rest is drawn from
    ``random.Random`` seeded by (seed, index): reproducible one example at a time."""
    families = tuple(FAMILIES)
    family = families[index % len(families)]
    rule = RULES[(index // len(families)) % len(RULES)]
    return _draw_case(_RandomPick(random.Random(seed * 1_000_003 + index)), family, rule, max_tokens)


# ----------------------------------------------------------------------------------------------------
# the check
# ----------------------------------------------------------------------------------------------------
@dataclass
class Stat:
    """Observed / bound over one output: ``ratio`` the largest (inf where a zero bound is not met exactly,
    or for NaN / a wrong infinity); ``median`` over the elements with a positive bound; ``violations`` the
    elements past the bound; ``bounded`` the elements with a positive bound."""

    ratio: float
    median: float
    violations: int
    bounded: int
    worst_at: Optional[tuple] = None  # index of the worst element when violated

    @property
    def ok(self) -> bool:
        return self.violations == 0


def _ratios(got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> tuple:
    got, want, bound = (np.asarray(a, dtype=np.float64) for a in (got, want, bound))
    with np.errstate(invalid="ignore"):
        err = np.where(got == want, 0.0, np.abs(got - want))
    err = np.where(np.isnan(err), np.inf, err)
    pos = bound > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(pos, err / np.where(pos, bound, 1.0), np.where(err == 0, 0.0, np.inf))
    ratio = np.where(np.isinf(bound) & ~np.isnan(got), 0.0, ratio)  # an infinite bound admits any number, inf too
    return ratio, pos


def compare(got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> Stat:
    """Elementwise ``|got - want| <= bound``. Equal values (both -inf included) have error 0; NaN or a
    mismatched infinity has error inf; a zero bound must be met exactly."""
    ratio, pos = _ratios(got, want, bound)
    bad = ratio > 1
    worst = None
    if bad.any():
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    return Stat(ratio=float(ratio.max()) if ratio.size else 0.0,
                median=float(np.median(ratio[pos])) if pos.any() else 0.0,
                violations=int(bad.sum()), bounded=int(pos.sum()), worst_at=worst)


FINITE_MAX = {"bf16": 3.3895313892515355e38, "fp16": 65504.0, "fp32": 3.4028234663852886e38}


def diagnose(got: np.ndarray, want: np.ndarray, bound: np.ndarray, dtype: str, cpu: bool) -> Optional[str]:
    """How many violating elements of one check are overflows (the kernel's value +-inf, of ``want``'s sign,
    where ``|want| + bound`` passes the dtype's largest finite value) and how many are not; the verdict stays
    a violation either way. (Bound (a) admits +-inf where its enclosure reaches the rounding-to-inf limit, so
    an overflow reported here means the enclosure missed it.) ``cpu`` is unused, kept for the report format."""
    ratio, _ = _ratios(got, want, bound)
    bad = ratio > 1
    if not bad.any():
        return None
    g, w = np.asarray(got, np.float64)[bad], np.asarray(want, np.float64)[bad]
    reach = np.abs(w) + np.broadcast_to(np.asarray(bound, np.float64), bad.shape)[bad]
    overflow = (reach > FINITE_MAX[dtype]) & np.isinf(g) & (np.sign(g) == np.sign(w))
    parts = []
    if overflow.any():
        parts.append(f"{int(overflow.sum())} overflow (kernel +-inf, |want| + bound > {FINITE_MAX[dtype]:g})")
    rest = int(bad.sum() - overflow.sum())
    if rest:
        parts.append(f"{rest} unexplained")
    return ", ".join(parts)


@dataclass
class MXReport:
    """The verdict on one :class:`MXCase`: ``stats[check][output]`` for check in CHECKS ("a": kernel vs MX
    oracle within kernel_tolerance; "b": MX oracle vs exact within apriori_bound; "kernel_vs_exact": kernel
    vs exact within both), ``kernel_ran`` (forward and backward of the triton-mxfp8 kernels were recorded),
    ``nan`` (kernel NaNs where the oracle is finite), ``error`` (an exception the run raised)."""

    case: MXCase
    stats: dict = field(default_factory=dict)
    kernel_ran: bool = False
    nan: int = 0
    seconds: float = 0.0
    error: Optional[str] = None
    notes: dict = field(default_factory=dict)  # "check/output" -> diagnose() of its violations

    @property
    def ok(self) -> bool:
        return (self.error is None and self.kernel_ran and self.nan == 0
                and all(s.ok for check in self.stats.values() for s in check.values()))

    def violations(self) -> list:
        """``"check/output: n elements, worst ratio r at index"`` for every violated bound."""
        def note(key):
            return f" [{self.notes[key]}]" if self.notes.get(key) else ""

        return [f"{check}/{name}: {s.violations} elements past the bound, worst {s.ratio:.3g}x at {s.worst_at}"
                + note(f"{check}/{name}") for check, by in self.stats.items() for name, s in by.items() if not s.ok]

    def __str__(self) -> str:
        if self.ok:
            return f"ok {self.case.describe()}"
        why = ([self.error] if self.error else []) + ([] if self.kernel_ran or self.error else
                                                       [f"the {KERNEL} kernels did not run"])
        why += [f"{self.nan} NaN where the oracle is finite"] if self.nan else []
        return f"FAIL {self.case.describe()}: " + "; ".join(why + self.violations()) + f"\n  {self.case!r}"

    def record(self) -> dict:
        return dict(case=dataclasses.asdict(self.case), describe=self.case.describe(), ok=self.ok,
                    kernel_ran=self.kernel_ran, nan=self.nan, seconds=round(self.seconds, 3), error=self.error,
                    notes=self.notes,
                    stats={c: {n: dataclasses.asdict(s) for n, s in by.items()} for c, by in self.stats.items()})


def _f64(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _finite_lse(lse: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(like), lse, 0.0)


def tlx_eligible(case: MXCase) -> bool:
    """Whether the TLX MXFP8 forward (and backward) has a build for ``case`` (head dim 64 or 128, no sliding
    window)."""
    return case.head_dim in (64, 128) and tuple(case.window) in ((-1, -1), (-1, 0))


def blackwell_mx_cases() -> list:
    """(name, case) of the TLX Blackwell MXFP8 forward's simulator catalogue: every adversarial family on jagged
    batches (empty and one-token sequences, tails off the 32-key blocks and the 128-key tiles, Lq != Lk causal,
    broadcast Q, grouped heads, more work items than SMs), head dims 64 and 128, both rules, fp32 outputs (where
    bound (a) is tight) and bf16/fp16 ones."""
    c = MXCase
    return [
        ("peaked-ragged-empty-D64-floor-fp32", c((70, 0, 33), (90, 5, 64), family="peaked", dtype="fp32")),
        ("outliers-causal-lq-gt-lk-D64-rceil-bf16", c((100, 7, 45), (60, 0, 130), family="outliers", causal=True,
                                                      rule="rceil", dtype="bf16", seed=1)),
        ("blockscale-causal-lq-lt-lk-D128-floor-fp32", c((33, 64), (64, 300), family="blockscale", head_dim=128,
                                                         causal=True, dtype="fp32", seed=2)),
        ("blockscale-bcastq-causal-D64-rceil-fp16", c((45,), (70, 100, 0), family="blockscale", broadcast_q=True,
                                                      causal=True, rule="rceil", dtype="fp16", seed=3)),
        ("sink-gqa4-D128-floor-fp32", c((70, 40), (50, 130), heads=4, kv_heads=1, head_dim=128, family="sink",
                                        dtype="fp32", seed=4)),
        ("gaussian-one-token-and-empty-D64-rceil-fp32", c((1, 0, 1, 5), (1, 3, 0, 1), rule="rceil", dtype="fp32",
                                                          seed=5)),
        ("midpoints-many-items-causal-D64-floor-fp32", c((300, 1, 257), (200, 1, 400), heads=1, kv_heads=1,
                                                         family="midpoints", causal=True, dtype="fp32", seed=6)),
        ("diffuse-bcastq-D128-rceil-bf16", c((20,), (33, 0, 97), family="diffuse", head_dim=128, broadcast_q=True,
                                             rule="rceil", dtype="bf16", seed=7)),
    ]


def blackwell_forward_failure(case: MXCase, schedule=None, launcher=None, sm_count: int = 2) -> Optional[str]:
    """Why the TLX Blackwell MXFP8 forward fails ``case`` on the simulator (arch (10, 0), ``schedule``, default the
    deterministic one), or None: its out and lse against the MX oracle within bound (a), NaN-poisoned outputs,
    the Blackwell kernel run there with no simulator report. ``launcher``: ``mx_forward_blackwell`` (default) or a
    mutated one. A protocol error the simulator raises propagates."""
    import torch

    import jfa.mx as jmx
    import jfa.sim as sim
    from jfa.kernels import alloc
    from jfa.kernels.tlx.blackwell.forward import mx_forward_blackwell
    from jfa.oracle.mx_attention import mx_forward
    from jfa.oracle.mx_bounds import kernel_tolerance

    launcher = launcher or mx_forward_blackwell
    q, k, v, _dout, cu_q, cu_k = make_mx_inputs(case)
    qm, km = jmx.quantize(q, "dim", rule=case.rule), jmx.quantize(k, "dim", rule=case.rule)
    vm = jmx.quantize(v, "tokens", cu_k, case.rule)
    scale = case.softmax_scale if case.softmax_scale is not None else case.head_dim ** -0.5
    with sim.simulated(arch=(10, 0), sm_count=sm_count, schedule=schedule or sim.Schedule.deterministic()) as session, \
            alloc.poisoned_outputs():
        out, lse = launcher(qm, km, vm, cu_q, cu_k, causal=case.causal, softmax_scale=scale,
                            broadcast_q=case.broadcast_q, num_seqs=len(case.lengths_k),
                            len_q_bcast=case.lengths_q[0] if case.broadcast_q else 0, rule=case.rule,
                            out_dtype=q.dtype)
    if session.kernels() != ["jagged_fwd_blackwell_kernel"]:
        return f"the Blackwell kernel did not run on the simulator (ran: {session.kernels()})"
    warnings = [w for r in session.reports for w in r.warnings]
    if warnings:
        return f"simulator report: {warnings}"
    if out.dtype != q.dtype or lse.dtype != torch.float32:
        return f"dtypes out {out.dtype}, lse {lse.dtype}"
    xq, xk, xv = (_f64(t) for t in (q, k, v))
    cq = None if case.broadcast_q else _f64(cu_q).astype(np.int64)
    ck = _f64(cu_k).astype(np.int64)
    kw = dict(rule=case.rule, causal=case.causal, softmax_scale=scale, broadcast_q=case.broadcast_q)
    want = dict(zip(("out", "lse"), mx_forward(xq, xk, xv, cq, ck, **kw)))
    tol = kernel_tolerance(xq, xk, xv, np.zeros(want["out"].shape), cq, ck, out_dtype=DTYPE_NAMES[case.dtype],
                           backward=False, **kw)
    failures = []
    for name, got in (("out", _f64(out)), ("lse", _f64(lse))):
        if got.shape != want[name].shape:
            failures.append(f"{name}: shape {got.shape} != {want[name].shape}")
            continue
        stat = compare(got, want[name], tol[name])
        if not stat.ok:
            failures.append(f"{name}: {stat.violations} elements over bound (a), worst {stat.ratio:.3g}x at "
                            f"{stat.worst_at}")
    return "; ".join(failures) or None


def check_mx_case(case: MXCase, device="cpu", simulate: Optional[int] = None) -> MXReport:
    """Run ``case`` through ``jfa.jagged_attention`` (forward and backward, poisoned outputs) and judge it by
    bounds (a) and (b) and the kernel against exact attention (module docstring). ``simulate`` (CPU only): run
    the TLX MXFP8 forward and backward on the TLX simulator with this schedule seed (0: the deterministic schedule)
    where they have a build for the case, which must then be the kernels that ran (the backward's dQ pass is
    portable)."""
    import contextlib

    import torch

    import jfa
    from jfa.api import recording_dispatch
    from jfa.kernels import alloc
    from jfa.oracle.attention import attention_backward, attention_forward
    from jfa.oracle.mx_attention import mx_backward, mx_forward
    from jfa.oracle.mx_bounds import apriori_bound, kernel_tolerance

    start = time.perf_counter()
    q, k, v, dout, cu_q, cu_k = make_mx_inputs(case, device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    on_simulator = simulate is not None and tlx_eligible(case)
    if on_simulator:
        import jfa.sim as sim

        schedule = sim.Schedule.seeded(simulate) if simulate else sim.Schedule.deterministic()
        scope = sim.simulated(arch=(9, 0), sm_count=3, schedule=schedule)
    else:
        scope = contextlib.nullcontext()
    with scope, alloc.poisoned_outputs(), recording_dispatch() as ran:
        out, lse = jfa.jagged_attention(*leaves, cu_q, cu_k, causal=case.causal, window_size=tuple(case.window),
                                        softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q,
                                        precision=PRECISION[case.rule], return_lse=True,
                                        backend="tlx" if on_simulator else "auto")
        out.backward(dout)
    passes = {r[:2] for r in ran}
    forwards = {("forward", TLX_KERNEL)} if on_simulator else {("forward", KERNEL), ("forward", TLX_KERNEL)}
    backwards = {("backward", TLX_KERNEL)} if on_simulator else {("backward", KERNEL), ("backward", TLX_KERNEL)}
    kernel_ran = bool(forwards & passes) and bool(backwards & passes)
    got = dict(out=_f64(out), lse=_f64(lse))
    for name, leaf in zip(("dq", "dk", "dv"), leaves):
        got[name] = _f64(leaf.grad) if leaf.grad is not None else np.zeros(tuple(leaf.shape))

    xq, xk, xv, xdo = (_f64(t) for t in (q, k, v, dout))
    cq = None if case.broadcast_q else cu_q.cpu().numpy().astype(np.int64)
    ck = cu_k.cpu().numpy().astype(np.int64)
    kw = dict(causal=case.causal, softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q,
              window=tuple(case.window))
    mkw = dict(rule=case.rule, **kw)
    mx_out, mx_lse = mx_forward(xq, xk, xv, cq, ck, **mkw)
    mx_at_kernel = mx_backward(xq, xk, xv, got["out"], got["lse"], xdo, cq, ck, **mkw)  # for (a)
    mx_own = mx_backward(xq, xk, xv, mx_out, mx_lse, xdo, cq, ck, **mkw)                # for (b)
    ex_out, ex_lse = attention_forward(xq, xk, xv, cq, ck, **kw)
    ex_grads = attention_backward(xq, xk, xv, ex_out, ex_lse, xdo, cq, ck, **kw)
    tol = kernel_tolerance(xq, xk, xv, xdo, cq, ck, out_dtype=DTYPE_NAMES[case.dtype], **mkw)
    bound = apriori_bound(xq, xk, xv, xdo, cq, ck, **mkw)

    mx_a = dict(out=mx_out, lse=mx_lse, **dict(zip(("dq", "dk", "dv"), mx_at_kernel)))
    mx_b = dict(out=mx_out, lse=mx_lse, **dict(zip(("dq", "dk", "dv"), mx_own)))
    exact = dict(out=ex_out, lse=ex_lse, **dict(zip(("dq", "dk", "dv"), ex_grads)))
    cpu = torch.device(device).type == "cpu"
    stats, notes = {c: {} for c in CHECKS}, {}
    for name in OUTPUTS:
        tol_a = tol[name]
        judged = {"a": (got[name], mx_a[name], tol_a), "b": (mx_b[name], exact[name], bound[name]),
                  "kernel_vs_exact": (got[name], exact[name], bound[name] + tol_a)}
        for check, (x, want, allowed) in judged.items():
            stats[check][name] = compare(x, want, allowed)
            if not stats[check][name].ok:
                notes[f"{check}/{name}"] = diagnose(x, want, allowed, "fp32" if name == "lse" else case.dtype, cpu)
    finite = {n: np.isfinite(mx_a[n]) for n in OUTPUTS}
    nan = sum(int((np.isnan(got[n]) & finite[n]).sum()) for n in OUTPUTS)
    return MXReport(case, stats, kernel_ran, nan, time.perf_counter() - start, notes=notes)


def run_mx_fuzz(examples: int, seed: int, device="cpu", progress: Optional[Callable[[MXReport], None]] = None,
                deadline: Optional[float] = None, simulate: bool = False) -> list:
    """:func:`check_mx_case` on examples ``0 .. examples - 1`` of :func:`sample_case` (seed ``seed``), stopping
    early once ``time.perf_counter()`` passes ``deadline``; an example that raises becomes a failed report
    naming the exception. ``simulate``: the TLX MXFP8 forward on the simulator where it applies, example i
    under schedule seed i (0: deterministic)."""
    reports = []
    for i in range(examples):
        if deadline is not None and time.perf_counter() > deadline:
            break
        case = sample_case(seed, i)
        start = time.perf_counter()
        try:
            report = check_mx_case(case, device, simulate=i if simulate else None)
        except Exception as e:  # noqa: BLE001 - a crash is a finding, reported with the case
            report = MXReport(case, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - start)
        reports.append(report)
        if progress is not None:
            progress(report)
    return reports


# ----------------------------------------------------------------------------------------------------
# reports
# ----------------------------------------------------------------------------------------------------
def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.2g}" if x >= 0.01 else f"{x:.1e}"


def _tightness(reports: Sequence[MXReport], check: str, name: str) -> str:
    """median over the examples of each example's median observed/bound, and the largest observed/bound."""
    stats = [r.stats[check][name] for r in reports if r.stats and r.stats[check][name].bounded]
    if not stats:
        return "-"
    return f"{_fmt(float(np.median([s.median for s in stats])))} / {_fmt(max(s.ratio for s in stats))}"


def _violating(reports: Sequence[MXReport], check: str) -> int:
    return sum(1 for r in reports if r.stats and not all(s.ok for s in r.stats[check].values()))


def markdown(reports: Sequence[MXReport], *, seed: int, device: str) -> str:
    groups = [(f, rule) for f in FAMILIES for rule in RULES]
    lines = [f"# MXFP8 fuzz: {len(reports)} examples, seed {seed}, device {device}", "",
             f"{sum(not r.ok for r in reports)} failing examples. Counts are examples that violate the check; "
             "tightness is observed / bound, \"median / max\": the median over the examples of each example's "
             "median (over elements with a positive bound) and the largest over all elements.", "",
             "Checks: (a) kernel vs the MX oracle within `kernel_tolerance`; (b) MX oracle vs exact attention within `apriori_bound`; k-x: kernel vs exact "
             "within (a) + (b).", ""]
    head = (["family", "rule", "n", "viol (a)", "viol (b)", "viol k-x", "errors"]
            + [f"(a) {n}" for n in OUTPUTS] + [f"(b) {n}" for n in OUTPUTS])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, sel in ([(g, [r for r in reports if (r.case.family, r.case.rule) == g]) for g in groups]
                       + [(("all", "both"), list(reports))]):
        if not sel:
            continue
        row = [label[0], label[1], str(len(sel)), *(str(_violating(sel, c)) for c in CHECKS),
               str(sum(1 for r in sel if r.error or (r.stats and not r.kernel_ran) or r.nan))]
        row += [_tightness(sel, "a", n) for n in OUTPUTS] + [_tightness(sel, "b", n) for n in OUTPUTS]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Families:", ""] + [f"- `{n}`: {doc}" for n, (_, doc) in FAMILIES.items()]
    failing = [r for r in reports if not r.ok]
    if failing:
        lines += ["", "## Failing examples", ""] + [f"- {r}".replace("\n", "\n  ") for r in failing]
    return "\n".join(lines) + "\n"


def _prepare_device(device: str) -> None:
    if device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--device cpu needs Triton's interpreter: set TRITON_INTERPRET=1 before triton is "
                             "imported")
        os.environ["TRITON_INTERPRET"] = "1"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.fuzz.mx", description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", type=Path, default=Path("mx-fuzz"), help="directory for mx-fuzz.json and mx-fuzz.md")
    parser.add_argument("--minutes", type=float, default=None, help="stop starting examples after this long")
    parser.add_argument("--simulate", action="store_true",
                        help="CPU: the TLX MXFP8 forward on the TLX simulator wherever it has a build")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.simulate and args.device != "cpu":
        parser.error("--simulate: the TLX simulator runs on the CPU interpreter (use --device cpu)")
    _prepare_device(args.device)
    started = time.perf_counter()
    show = None if args.quiet else (lambda r: print(f"{r.seconds:6.2f}s {r}", flush=True))
    deadline = None if args.minutes is None else started + 60 * args.minutes
    reports = run_mx_fuzz(args.examples, args.seed, args.device, progress=show, deadline=deadline,
                          simulate=args.simulate)
    args.out.mkdir(parents=True, exist_ok=True)
    failing = sum(not r.ok for r in reports)
    (args.out / "mx-fuzz.json").write_text(json.dumps(
        dict(seed=args.seed, examples=len(reports), device=args.device, failing=failing,
             seconds=round(time.perf_counter() - started, 1), records=[r.record() for r in reports]),
        indent=1, allow_nan=True) + "\n")
    (args.out / "mx-fuzz.md").write_text(markdown(reports, seed=args.seed, device=args.device))
    print(f"{len(reports)} examples, {failing} failing; wrote {args.out / 'mx-fuzz.json'} and "
          f"{args.out / 'mx-fuzz.md'}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
