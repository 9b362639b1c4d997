"""The portable MXFP8 attention kernels (jfa.kernels.triton.mx_attention) against the float64 MX oracle
(jfa.oracle.mx_attention, docs/mxfp8.md section 2), forward and backward, with NaN-poisoned outputs.

Two comparisons, because the fp32 kernel and the float64 oracle may round an intermediate MX quantization
apart: where an exact P or dS element lies within fp32 rounding of an E4M3 rounding midpoint (or a
block's amax of a scale threshold), one flips, a 1e-3..1e-2 relative change of the result (seen: 2 of 30
random problems of these sizes flip in the backward).

- Forward, tight: ``|kernel - oracle| <= 1e-5 max|oracle| + u |oracle|`` (u the output dtype's unit
  roundoff, 2^-24 fp32, 2^-11 fp16, 2^-8 bf16; lse ``1e-5 max|lse|``, -inf exactly where the oracle's is), on inputs that
  rule flips out: Q and K hold small multiples of powers of two (one per 32-element D block), which MX
  represents exactly and whose dot products are exact in fp32 in any order, and the softmax scale makes
  ``c = softmax_scale log2(e)`` exactly 1/2 in float64 and fp32, so every logit is an exact multiple of
  2^-7 and every ``2^(t - c)`` at least 8.6e-5 (relative) from any E4M3 midpoint or scale threshold, while
  the kernel's exp2 errs by ~1e-7. The kernels' own error is fp32 accumulation noise (~1e-7).
- Backward (and the forward again), on Gaussian inputs: the rigorous per-element bound of
  ``jfa.oracle.mx_bounds.kernel_tolerance`` (docs/mxfp8.md section 3, bound (a)), which encloses every
  quantization an fp32 kernel may reach (flips included).

Q^(queries) and Q^(dim) (K^(keys), K^(dim)) agree for elements in E4M3's normal range except where FLOOR
saturates a block maximum, so the exact inputs plant such maxima in one column of Q and of K (where the
other operand is 0): a kernel that multiplies dS with the wrong quantization of Q or K fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

import jfa.mx as jmx
from jfa.kernels import alloc
from jfa.kernels.triton import mx_attention as mxa
from jfa.kernels.triton.configs import Configs, KernelConfig
from jfa.oracle import mx_attention as oracle
from jfa.oracle import mx_bounds

LOG2E = math.log2(math.e)
EXACT_SCALE = 0.5 / LOG2E  # c = softmax_scale * log2(e) = 1/2 exactly (test_the_exact_scale_is_exact)
REL = 1e-5
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class Case:
    name: str
    lq: tuple  # query lengths per sequence (broadcast Q: one length, shared)
    lk: tuple
    heads: int = 2
    kv_heads: int = 2
    head_dim: int = 64
    causal: bool = False
    window: tuple = (-1, -1)
    broadcast_q: bool = False
    rule: str = "floor"
    dtype: torch.dtype = torch.float32
    dlse: bool = False
    seed: int = 0


CASES = [
    # an empty query sequence, a 5-key sequence (one partial block), tails off the 32-row blocks and the tiles
    Case("ragged", (70, 0, 33), (90, 5, 64)),
    # Lq > Lk (rows that see no key), Lq < Lk, an empty key sequence; bf16 in and out
    Case("causal", (100, 7, 45), (60, 0, 130), causal=True, rule="rceil", dtype=torch.bfloat16, dlse=True, seed=1),
    Case("window-gqa", (70, 40), (50, 130), kv_heads=1, head_dim=32, window=(20, 5), seed=2),
    Case("bcastq-causal", (45,), (70, 100, 0), broadcast_q=True, causal=True, rule="rceil", dlse=True, seed=3),
    Case("bcastq-window-gqa", (61,), (33, 90), broadcast_q=True, kv_heads=1, head_dim=32, window=(8, 24), seed=4),
    Case("fp16-causal-gqa", (33, 64), (64, 33), kv_heads=1, causal=True, dtype=torch.float16, seed=12),
    # a head dim that is not a multiple of 32: a short D-axis scale block, padded registers
    Case("d48-causal-window", (50,), (80,), head_dim=48, causal=True, window=(40, -1), rule="rceil", seed=5),
]


@dataclass
class Problem:
    case: Case
    scale: float
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    dlse: object
    cu_q: torch.Tensor
    cu_k: torch.Tensor


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------
def _offsets(lengths, device) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)


def _grid(rng, shape, dtype) -> torch.Tensor:
    """Values ``i/4 * 2^r``, i in -3..3, r in -1..1 per 32-element block of D: MX-exact, exact dots."""
    T, H, D = shape
    r = rng.integers(-1, 2, (T, H, -(-D // 32)))
    scale = np.repeat(2.0 ** r, 32, axis=-1)[..., :D]
    return torch.from_numpy(rng.integers(-3, 4, shape) / 4.0 * scale).to(dtype)


def _gauss(rng, shape, dtype) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def _plant(x: torch.Tensor, lengths, column: int) -> None:
    """Make ``x[:, :, column]`` MX-inexact along tokens under FLOOR but exact along dim: the first row of
    every 32-row block of every sequence gets 3.75 there (the block's maximum, significand 1.875 > 1.8125:
    FLOOR saturates it to 3.5) and 4.0 in the next column (its D block's maximum, so along D 3.75 stays)."""
    starts = np.concatenate([np.arange(0, n, 32) + off for n, off in zip(lengths, np.cumsum([0, *lengths[:-1]]))])
    rows = torch.from_numpy(starts.astype(np.int64))
    x[rows, :, column] = 3.75
    x[rows, :, column + 1] = 4.0


def _problem(case: Case, device, inputs: str = "exact") -> Problem:
    """``inputs``: "exact" (Q, K exact on a grid with planted FLOOR maxima, V and dO Gaussian; the softmax
    scale makes the logits exact), "grid" (all four on the grid: every dot exact) or "gauss" (Gaussian,
    softmax scale D^-1/2)."""
    rng = np.random.default_rng(case.seed)
    B = len(case.lk)
    cu_q = _offsets(case.lq * B if case.broadcast_q else case.lq, device)
    cu_k = _offsets(case.lk, device)
    total_q = case.lq[0] if case.broadcast_q else int(sum(case.lq))
    total_k = int(sum(case.lk))
    rows = int(cu_q[-1])
    H, Hkv, D = case.heads, case.kv_heads, case.head_dim
    if inputs == "gauss":
        q, k = _gauss(rng, (total_q, H, D), case.dtype), _gauss(rng, (total_k, Hkv, D), case.dtype)
    else:
        q, k = _grid(rng, (total_q, H, D), case.dtype), _grid(rng, (total_k, Hkv, D), case.dtype)
        # Q^(queries) != Q^(dim) in column 0, K^(keys) != K^(dim) in column 32 (FLOOR), where the other
        # operand is 0: the logits stay exact
        k[:, :, 0:2] = 0
        _plant(q, case.lq, 0)
        if D > 33:
            q[:, :, 32:34] = 0
            _plant(k, case.lk, 32)
    make = _grid if inputs == "grid" else _gauss
    v, dout = make(rng, (total_k, Hkv, D), case.dtype), make(rng, (rows, H, D), case.dtype)
    dlse = _gauss(rng, (rows, H), torch.float32).to(device) if case.dlse else None
    scale = D ** -0.5 if inputs == "gauss" else EXACT_SCALE
    return Problem(case, scale, q.to(device), k.to(device), v.to(device), dout.to(device), dlse, cu_q, cu_k)


def _launch_args(pb: Problem) -> dict:
    c = pb.case
    return dict(causal=c.causal, softmax_scale=pb.scale, broadcast_q=c.broadcast_q, num_seqs=len(c.lk),
                len_q_bcast=c.lq[0] if c.broadcast_q else 0, window=c.window, rule=c.rule)


def _forward(pb: Problem, **kw):
    rule = pb.case.rule
    qm, km = jmx.quantize(pb.q, "dim", rule=rule), jmx.quantize(pb.k, "dim", rule=rule)
    vm = jmx.quantize(pb.v, "tokens", pb.cu_k, rule)
    with alloc.poisoned_outputs():
        return mxa.mx_forward(qm, km, vm, pb.cu_q, pb.cu_k, out_dtype=pb.case.dtype, **_launch_args(pb), **kw)


def _backward(pb: Problem, out, lse, **kw):
    with alloc.poisoned_outputs():
        return mxa.mx_backward(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k, dlse=pb.dlse,
                               **_launch_args(pb), **kw)


def _run(pb: Problem, **kw) -> tuple:
    """(out, lse, dq, dk, dv) of the kernels."""
    out, lse = _forward(pb, **kw)
    return (out, lse, *_backward(pb, out, lse, **kw))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _oracle_kw(pb: Problem) -> dict:
    c = pb.case
    return dict(cu_seqlens_q=None if c.broadcast_q else _np(pb.cu_q).astype(np.int64),
                cu_seqlens_k=_np(pb.cu_k).astype(np.int64), rule=c.rule, causal=c.causal,
                softmax_scale=pb.scale, broadcast_q=c.broadcast_q, window=c.window)


def _assert_within(name: str, got: torch.Tensor, want: np.ndarray, allowed: np.ndarray) -> None:
    g = _np(got)
    assert g.shape == want.shape, f"{name}: shape {g.shape} != {want.shape}"
    if want.size == 0:
        return
    assert np.isfinite(g).all(), f"{name}: {int((~np.isfinite(g)).sum())} entries not finite (unwritten rows?)"
    err = np.abs(g - want)
    bad = np.argwhere(err > allowed)
    worst = float((err / np.maximum(allowed, 1e-300)).max())
    assert bad.size == 0, (f"{name}: {len(bad)} entries over the bound (worst {worst:.3g}x); first at "
                           f"{[tuple(int(j) for j in i) for i in bad[:4]]}: got {g[tuple(bad[0])]!r}, "
                           f"want {want[tuple(bad[0])]!r}, allowed {allowed[tuple(bad[0])]!r}")


def _tight(want: np.ndarray, dtype: torch.dtype, device) -> np.ndarray:
    scale = np.abs(want).max() if want.size else 0.0
    return REL * scale + UNIT_ROUNDOFF[dtype] * np.abs(want)


def _assert_lse(got: torch.Tensor, want: np.ndarray, allowed) -> None:
    g = _np(got)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(g), finite), "lse: finite where the oracle's is -inf, or the reverse"
    assert (g[~finite] == -np.inf).all(), "lse: rows that see no key must be -inf"
    err = np.abs(np.where(finite, g, 0.0) - np.where(finite, want, 0.0))
    assert (err <= allowed).all(), f"lse: error {float(err.max()):.3g}"


def _assert_fp32_noise(a: tuple, b: tuple) -> None:
    """(out, lse, dq, dk, dv) of two runs agree to 2e-6 of each tensor's largest finite magnitude; the
    lse of rows that see no key is -inf in both."""
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, b):
        finite = torch.isfinite(x)
        assert torch.equal(finite, torch.isfinite(y)) and torch.equal(x[~finite], y[~finite]), name
        if finite.any():
            assert float((x[finite] - y[finite]).abs().max()) <= 2e-6 * float(x[finite].abs().max()), name


def _configs(fwd=(64, 64), dkdv=(64, 64), dq=(64, 64)) -> Configs:
    return Configs(*(KernelConfig(m, n, 4, 1) for m, n in (fwd, dkdv, dq)))


# ----------------------------------------------------------------------------------------------------
# kernel against the oracle
# ----------------------------------------------------------------------------------------------------
def test_the_exact_scale_is_exact():
    """c = softmax_scale * log2(e) is 1/2 in the oracle's float64 and in the kernel's fp32 product."""
    assert EXACT_SCALE * LOG2E == 0.5
    assert np.float32(EXACT_SCALE) * np.float32(1.4426950408889634) == np.float32(0.5)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forward_matches_the_oracle_to_fp32_noise(case, device):
    pb = _problem(case, device)
    out, lse = _forward(pb)
    want_out, want_lse = oracle.mx_forward(_np(pb.q), _np(pb.k), _np(pb.v), **_oracle_kw(pb))
    assert out.dtype == case.dtype and lse.dtype == torch.float32
    _assert_within("out", out, want_out, _tight(want_out, case.dtype, device))
    _assert_lse(lse, want_lse, REL * np.abs(want_lse[np.isfinite(want_lse)]).max(initial=0.0))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backward_matches_the_oracle_within_the_kernel_bound(case, device):
    """Gaussian inputs, the kernels' own out and lse into the oracle's backward, mx_bounds' tolerance."""
    pb = _problem(case, device, inputs="gauss")
    out, lse, *grads = _run(pb)
    q, k, v, dout = _np(pb.q), _np(pb.k), _np(pb.v), _np(pb.dout)
    dlse = None if pb.dlse is None else _np(pb.dlse)
    kw = _oracle_kw(pb)
    tol = mx_bounds.kernel_tolerance(q, k, v, dout, kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k"),
                                     out_dtype=DTYPE_NAMES[case.dtype], dlse=dlse, **kw)
    want_out, want_lse = oracle.mx_forward(q, k, v, **_oracle_kw(pb))
    _assert_within("out", out, want_out, tol["out"])
    _assert_lse(lse, want_lse, tol["lse"])
    want = oracle.mx_backward(q, k, v, _np(out), _np(lse), dout, dlse=dlse, **_oracle_kw(pb))
    for name, g, w, x in zip(("dq", "dk", "dv"), grads, want, (pb.q, pb.k, pb.v)):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        _assert_within(name, g, w, tol[name])


def test_rows_without_keys_are_zero_and_every_row_is_written(device):
    """Poisoned outputs: rows of sequences with no keys (and causal rows before the first key) are exactly
    0 with lse -inf, and so are their dq rows; every other entry is written (finite)."""
    pb = _problem(Case("empty", (40, 3, 20), (0, 70, 10), causal=True, seed=6), device)
    out, lse, dq, dk, dv = _run(pb)
    assert (out[:40] == 0).all() and (lse[:40] == -math.inf).all()  # sequence 0 has no keys
    assert (out[43:53] == 0).all() and (lse[43:53] == -math.inf).all()  # causal: Lq 20 > Lk 10
    assert (dq[:40] == 0).all() and (dq[43:53] == 0).all()
    assert all(torch.isfinite(x).all() for x in (out, dq, dk, dv)) and not torch.isnan(lse).any()


def test_single_key_rows_return_v_exactly(device):
    """A row with one visible key outputs that key's V^ row bit for bit (P^ / l = 1): the in-kernel
    dequantization of V along keys, its scale rows per sequence included, is exact."""
    pb = _problem(Case("one-key", (5, 1, 33), (1, 1, 1), kv_heads=1, seed=7), device)
    pb.v = pb.v * torch.logspace(-20, 20, pb.v.shape[-1], base=2.0, device=device)  # scales far from 1
    out, _ = _forward(pb)
    exact = jmx.quantize(pb.v, "tokens", pb.cu_k).dequantize(torch.float32)
    seq = torch.from_numpy(np.repeat(np.arange(3), pb.case.lq)).to(device)
    want = exact[seq].expand(-1, 2, -1)
    if torch.device(device).type == "cpu":
        assert torch.equal(out, want)
    else:  # out = (P^ V^) / l: the GPU's fp32 division (div.full.f32) is within 2 ulp, not correctly rounded
        torch.testing.assert_close(out, want, rtol=2.0 ** -21, atol=0.0)


# ----------------------------------------------------------------------------------------------------
# properties of the kernels
# ----------------------------------------------------------------------------------------------------
def test_p_quantization_does_not_depend_on_the_tiles(device):
    """The same problem with KV chunks (forward, dQ) of 32, 64, 128 keys and query tiles (forward, dK/dV)
    of 32, 64, 128 rows quantizes the same P and dS blocks: the results agree to fp32 accumulation noise.
    (Inputs on the grid: every dot is exact, so P and dS are the same fp32 numbers in every tiling.)"""
    pb = _problem(Case("tiles", (130, 64), (129, 100), causal=True, seed=8), device, inputs="grid")
    runs = [_run(pb, config=_configs(fwd=(block, block), dkdv=(block, 64), dq=(64, block)))
            for block in (32, 64, 128)]
    for other in runs[1:]:
        _assert_fp32_noise(runs[0], other)


def test_bf16_dots_equal_fp32_dots(device):
    """The GPU's dot path (dequantized tiles as bf16, exact) gives the fp32 path's results."""
    pb = _problem(Case("bf16-dots", (70, 33), (90, 64), kv_heads=1, causal=True, seed=9), device, inputs="grid")
    _assert_fp32_noise(_run(pb, dot="ieee"), _run(pb, dot="bf16"))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter, on the NaN row
def test_nan_scale_and_nan_elements_dequantize_to_nan(device):
    """A V scale byte 0xFF makes every row that sees its block NaN in that column (and nothing else); a Q
    element byte 0x7F makes its row NaN, lse included."""
    pb = _problem(Case("nan", (40, 40), (40, 40), seed=10), device)
    qm, km = jmx.quantize(pb.q, "dim"), jmx.quantize(pb.k, "dim")
    vm = jmx.quantize(pb.v, "tokens", pb.cu_k)
    scales = vm.scales.clone()
    scales[1, 0, 5] = 0xFF  # sequence 0's second key block (keys 32..39), head 0, d 5
    data = qm.data.view(torch.uint8).clone()
    data[60, 1, 3] = 0x7F  # sequence 1's row 20, head 1
    qm, vm = replace(qm, data=data.view(torch.float8_e4m3fn)), replace(vm, scales=scales)
    with alloc.poisoned_outputs():
        out, lse = mxa.mx_forward(qm, km, vm, pb.cu_q, pb.cu_k, out_dtype=torch.float32, **_launch_args(pb))
    nan = torch.isnan(out)
    assert nan[:40, 0, 5].all() and nan[60, 1].all() and int(nan.sum()) == 40 + 64
    assert torch.isnan(lse[60, 1]) and int(torch.isnan(lse).sum()) == 1  # lse does not read V


def test_the_mx_kernels_ran(monkeypatch, device):
    """Each launcher launches its kernel once (no silent fallback), over the expected grid."""
    grids = {}

    class Spy:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            grids.setdefault(self.name, []).append(grid)
            return self.kernel[grid]

    for name in ("mx_fwd_kernel", "mx_dkdv_kernel", "mx_dq_kernel"):
        monkeypatch.setattr(mxa, name, Spy(name, getattr(mxa, name)))
    pb = _problem(Case("spy", (70, 33), (90, 5), kv_heads=1, seed=11), device)
    _run(pb, config=_configs())
    # tile lists hold total // block + B slots: 103 // 64 + 2 query tiles (x 2 heads), 95 // 64 + 2 key tiles
    assert grids == {"mx_fwd_kernel": [(3 * 2,)], "mx_dkdv_kernel": [(3 * 1,)], "mx_dq_kernel": [(3 * 2,)]}


def test_no_query_or_no_key_launches_nothing(monkeypatch, device):
    def fail(*args, **kwargs):
        raise AssertionError("a kernel was launched on an empty problem")

    pb = _problem(Case("void", (4,), (0,)), device)
    out, lse = _forward(pb)
    assert (out == 0).all() and (lse == -math.inf).all()
    for name in ("mx_dkdv_kernel", "mx_dq_kernel"):
        monkeypatch.setattr(mxa, name, fail)
    dq, dk, dv = _backward(pb, out, lse)
    assert (dq == 0).all() and dk.shape == (0, 2, 64) and dv.shape == (0, 2, 64)


def test_bad_arguments_are_rejected(device):
    pb = _problem(Case("args", (8,), (8,)), device)
    qm, km, vm = jmx.quantize(pb.q, "dim"), jmx.quantize(pb.k, "dim"), jmx.quantize(pb.v, "tokens", pb.cu_k)
    args, cu = _launch_args(pb), (pb.cu_q, pb.cu_k)
    with pytest.raises(ValueError, match="multiples of 32"):
        mxa.mx_forward(qm, km, vm, *cu, config=_configs(fwd=(64, 16)), **args)
    with pytest.raises(ValueError, match="multiples of 32"):
        mxa.mx_backward(pb.q, pb.k, pb.v, pb.q, pb.q[:, :, 0], pb.dout, *cu, config=_configs(dq=(48, 64)), **args)
    with pytest.raises(ValueError, match="axes"):
        mxa.mx_forward(qm, km, km, *cu, **args)
    with pytest.raises(ValueError, match="rule"):
        mxa.mx_forward(qm, km, vm, *cu, **{**args, "rule": "nearest"})
    with pytest.raises(ValueError, match="dot"):
        mxa.mx_forward(qm, km, vm, *cu, dot="tf32", **args)
