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
import triton
import triton.language as tl

import jfa.mx as jmx
from jfa.kernels import alloc
from jfa.kernels.triton import mx_attention as mxa
from jfa.kernels.triton import mx_quant
from jfa.fuzz.mutants import BLACKWELL_MX_BACKWARD_MUTANTS, TLX_MX_BACKWARD_MUTANTS, TLX_MX_MUTANTS
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
@pytest.mark.slow  # ~35 s on 2 cores: the gate runs it
def test_p_quantization_does_not_depend_on_the_tiles(device):
    """The same problem with KV chunks (forward, dQ) of 32, 64, 128 keys and query tiles (forward, dK/dV)
    of 32, 64, 128 rows quantizes the same P and dS blocks: the results agree to fp32 accumulation noise.
    (Inputs on the grid: every dot is exact, so P and dS are the same fp32 numbers in every tiling.)"""
    pb = _problem(Case("tiles", (130, 64), (129, 100), causal=True, seed=8), device, inputs="grid")
    runs = [_run(pb, config=_configs(fwd=(block, block), dkdv=(block, 64), dq=(64, block)))
            for block in (32, 64, 128)]
    for other in runs[1:]:
        _assert_fp32_noise(runs[0], other)


@triton.jit
def _round_both_ways(X, VALUES, DECODED, RCEIL: tl.constexpr, ROWS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = tl.load(X + offs)
    tl.store(VALUES + offs, mxa._mx_round(x, RCEIL, ROWS, 32))
    codes, sb = mx_quant._quantize_tile(x.to(tl.int32, bitcast=True), 1, RCEIL)
    sb = sb.to(tl.int32)
    tl.store(DECODED + offs, mxa._decode(codes.to(tl.int32), (sb - 127)[:, None], (sb == 255)[:, None]))


@triton.jit
def _dequantize_both_ways(CODES, SCALES, FAST, EXACT, ROWS: tl.constexpr):
    # ROWS code bytes a program, each against all 256 scale bytes: one program of all 65536 pairs took ~110 s to
    # compile on the GPU host (offline for sm_90: 404 s, against 4 s for 16 rows)
    offs = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None] * 256 + tl.arange(0, 256)[None, :]
    codes = tl.load(CODES + offs)
    sb = tl.load(SCALES + offs)
    tl.store(FAST + offs, mxa.dequantize(codes, sb))
    tl.store(EXACT + offs, mxa._decode(codes.to(tl.int32), sb.to(tl.int32) - 127, sb.to(tl.int32) == 255))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter, on overflowing products
def test_fast_dequantization_equals_the_exact_decoder(device):
    """``dequantize`` (hardware fp8 conversion, one multiply: the TLX producer's) gives bitwise the integer
    decoder's value for every E4M3 byte under every E8M0 scale byte (NaN where either is NaN)."""
    codes = torch.arange(256, dtype=torch.uint8).repeat_interleave(256).to(device)
    scales = torch.arange(256, dtype=torch.uint8).repeat(256).to(device)
    fast, exact = (torch.full((256 * 256,), fill, device=device) for fill in (1.0, 2.0))  # unwritten: differ
    _dequantize_both_ways[(256 // 16,)](codes, scales, fast, exact, ROWS=16)
    same = (fast.view(torch.int32) == exact.view(torch.int32)) | (fast.isnan() & exact.isnan())
    assert same.all(), f"{int((~same).sum())} differ, e.g. (code, scale) {[(int(codes[i]), int(scales[i])) for i in (~same).nonzero()[:4, 0]]}"


def _rounding_blocks(seed: int) -> torch.Tensor:
    """Blocks of 32 fp32 values that probe every branch of the rounding: a random magnitude per block
    (2^-140 .. 2^120) with signs; blocks whose maximum is 256 * 2^t (FLOOR scale 2^t) holding exact ties
    between adjacent E4M3 values (normal and subnormal, even and odd neighbours below) and their fp32
    neighbours; block maxima on the FLOOR saturation and RCEIL thresholds; fp32 subnormals, zeros, a NaN
    block and an infinity block."""
    g = torch.Generator().manual_seed(seed)
    rows = 256
    t = torch.randint(-140, 110, (rows, 1), generator=g).double()
    x = torch.randn(rows, 32, generator=g, dtype=torch.float64) * torch.pow(2.0, t)
    e = torch.randint(-6, 8, (rows, 32), generator=g).double()
    m = torch.randint(8, 16, (rows, 32), generator=g).double()
    ties = (m + 0.5) * torch.pow(2.0, e - 3)  # halfway between E4M3 normals m and m + 1 (times 2^(e-3))
    sub_ties = (torch.randint(0, 8, (rows, 32), generator=g).double() + 0.5) * 2.0 ** -9
    ties = torch.where(torch.rand(rows, 32, generator=g) < 0.25, sub_ties, ties)
    ties = ties * torch.where(torch.rand(rows, 32, generator=g) < 0.5, -1.0, 1.0)
    ties[:, 0] = 256.0
    ties = (ties * torch.pow(2.0, t.clamp(-100, 100))).float()
    nudged = torch.nextafter(ties, torch.where(torch.rand(rows, 32, generator=g) < 0.5, 0.0, 1e30).float())
    x = x.float()
    x[::3] = ties[::3]
    x[1::6] = nudged[1::6]
    x[2::6, 1:] = nudged[2::6, 1:]
    x[4::17, 0] = 448.0 * 2.0 ** 20  # block maxima on the FLOOR saturation / RCEIL thresholds
    x[5::17, 0] = 464.0 * 2.0 ** -30
    x[7::17, 0] = 480.0
    x[10, :] = 0.0
    x[11, :5] = 1e-42  # fp32 subnormals
    x[13, 7] = float("nan")
    x[14, 1] = float("-inf")
    return x


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter, on the inf block
@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_value_rounding_equals_the_quantizers_bytes(rule, device):
    """The kernels' value-domain MX rounding (``_mx_round``: P in the forward, P and dS in the backward)
    returns bitwise what the quantizer's bytes (``mx_quant._quantize_tile``, tested bit-exact against the
    NumPy quantizer) decode to, on blocks that probe every rounding branch."""
    for seed in range(3):
        x = _rounding_blocks(seed).to(device)
        values, decoded = torch.empty_like(x), torch.empty_like(x)
        _round_both_ways[(1,)](x, values, decoded, RCEIL=rule == "rceil", ROWS=x.shape[0])
        same = (values.view(torch.int32) == decoded.view(torch.int32)) | (values.isnan() & decoded.isnan())
        assert same.all(), f"seed {seed}: {int((~same).sum())} elements differ, first at {(~same).nonzero()[:4].tolist()}"


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


# ----------------------------------------------------------------------------------------------------
# the TLX MXFP8 forward (jfa.kernels.tlx.hopper.forward, MX build) on the CPU simulator
# ----------------------------------------------------------------------------------------------------
TLX_CASES = [
    # an empty query sequence, 1-token sequences, tails off the 64-key blocks and the 128-row tiles
    Case("tlx-ragged", (70, 0, 150, 1), (90, 5, 130, 1), heads=3, kv_heads=3),
    Case("tlx-causal-d128", (100, 7, 45, 130), (60, 0, 130, 130), head_dim=128, causal=True, rule="rceil",
         dtype=torch.bfloat16, seed=1),
    Case("tlx-causal-gqa", (70, 40), (50, 130), kv_heads=1, causal=True, seed=2),
    Case("tlx-bcastq-causal-d128", (45,), (70, 100, 0), head_dim=128, broadcast_q=True, causal=True, seed=3),
    Case("tlx-fp16-causal-gqa-d128", (33, 64), (64, 33), kv_heads=1, head_dim=128, causal=True,
         dtype=torch.float16, seed=12),
]
SIM_SEEDS = (1, 2)


def _tlx_forward(pb: Problem, schedule):
    """(out, lse) of the TLX MX forward on the simulator (3 SMs: CTAs walk several items), poisoned outputs;
    asserts the TLX kernel ran there and the simulator reported nothing."""
    sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    rule = pb.case.rule
    qm, km = jmx.quantize(pb.q, "dim", rule=rule), jmx.quantize(pb.k, "dim", rule=rule)
    vm = jmx.quantize(pb.v, "tokens", pb.cu_k, rule)
    with sim.simulated(arch=(9, 0), sm_count=3, schedule=schedule) as session, alloc.poisoned_outputs():
        out, lse = tlx_forward.mx_forward_tlx(qm, km, vm, pb.cu_q, pb.cu_k, out_dtype=pb.case.dtype,
                                              **_launch_args(pb))
    assert session.kernels() == ["jagged_fwd_tlx_kernel"], session.kernels()
    assert not [w for r in session.reports for w in r.warnings]
    return out, lse


@pytest.mark.parametrize("case", TLX_CASES, ids=[c.name for c in TLX_CASES])
def test_tlx_mx_forward_matches_the_oracle_to_fp32_noise_on_the_simulator(case, device):
    """The TLX MX build (E4M3 staging, dequantization in the producer, P quantized by the consumers) on the
    exact inputs: the portable kernel's tight rule against the MX oracle."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (on a GPU: tools/gpu/mx_smoke.py)")
    _check_tlx_exact(case, device, None)


def _check_tlx_exact(case, device, seed):
    pb = _problem(case, device)
    out, lse = _tlx_forward(pb, _sim_schedule(seed))
    want_out, want_lse = oracle.mx_forward(_np(pb.q), _np(pb.k), _np(pb.v), **_oracle_kw(pb))
    assert out.dtype == case.dtype and lse.dtype == torch.float32
    _assert_within("out", out, want_out, _tight(want_out, case.dtype, device))
    _assert_lse(lse, want_lse, REL * np.abs(want_lse[np.isfinite(want_lse)]).max(initial=0.0))


@pytest.mark.parametrize("seed", SIM_SEEDS)
@pytest.mark.parametrize("case", TLX_CASES[1:3], ids=[c.name for c in TLX_CASES[1:3]])
def test_tlx_mx_forward_meets_the_kernel_bound_under_seeded_schedules(case, seed, device):
    """Gaussian inputs under seeded schedules (random switches and copy order): bound (a) against the MX
    oracle, as the portable kernel is judged."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (on a GPU: tools/gpu/mx_smoke.py)")
    pb = _problem(case, device, inputs="gauss")
    out, lse = _tlx_forward(pb, _sim_schedule(seed))
    q, k, v, dout = _np(pb.q), _np(pb.k), _np(pb.v), _np(pb.dout)
    kw = _oracle_kw(pb)
    tol = mx_bounds.kernel_tolerance(q, k, v, dout, kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k"),
                                     out_dtype=DTYPE_NAMES[case.dtype], **kw)
    want_out, want_lse = oracle.mx_forward(q, k, v, **_oracle_kw(pb))
    _assert_within("out", out, want_out, tol["out"])
    _assert_lse(lse, want_lse, tol["lse"])


def test_tlx_mx_forward_refuses_a_window_and_other_axes(device):
    """What the MX build does not run is refused by name before any launch (the API runs the portable MX
    kernel there): a sliding window, operands blocked along other axes."""
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    pb = _problem(Case("refused", (40,), (40,)), device)
    qm, km = jmx.quantize(pb.q, "dim"), jmx.quantize(pb.k, "dim")
    vm = jmx.quantize(pb.v, "tokens", pb.cu_k)
    with pytest.raises(ValueError, match="window_size"):
        tlx_forward.mx_forward_tlx(qm, km, vm, pb.cu_q, pb.cu_k, causal=False, softmax_scale=0.1,
                                   broadcast_q=False, num_seqs=1, window=(8, 8))
    with pytest.raises(ValueError, match="MX axes"):
        tlx_forward.mx_forward_tlx(qm, km, km, pb.cu_q, pb.cu_k, causal=False, softmax_scale=0.1,
                                   broadcast_q=False, num_seqs=1)


def _sim_schedule(seed):
    import jfa.sim as sim

    return sim.Schedule.deterministic() if seed is None else sim.Schedule.seeded(seed)


# its kill takes ~30 s on 2 cores (the race shows under a seeded schedule only): the gate
SLOW_TO_KILL = frozenset({"tlx-mx-fence-dropped"})


@pytest.mark.parametrize("mutant", [pytest.param(m, id=m.name, marks=pytest.mark.slow) if m.name in SLOW_TO_KILL
                                    else pytest.param(m, id=m.name) for m in TLX_MX_MUTANTS])
def test_simulator_kills(mutant, device, record_property):
    """Each mutant of the TLX MXFP8 forward's own code fails its simulator check on one of the TLX cases
    (the tight rule on exact inputs; the deterministic schedule, then seeded ones): by a wrong value or by the
    simulator's report (a race, an out-of-bounds read)."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import time

    from jfa.fuzz.mutants import applied

    start, killed_by = time.perf_counter(), None
    runs = [(case, seed) for seed in (None, *SIM_SEEDS) for case in TLX_CASES]
    with applied(mutant):
        for examples, (case, seed) in enumerate(runs, 1):
            try:
                _check_tlx_exact(case, device, seed)
            except Exception as exc:  # noqa: BLE001 - an assertion, a race or an out-of-bounds report all kill
                killed_by = f"{case.name} (schedule seed {seed}): {type(exc).__name__}"
                break
    record_property("examples_to_kill", examples)
    record_property("seconds_to_kill", round(time.perf_counter() - start, 2))
    record_property("killed_by", killed_by or "")
    assert killed_by, f"TLX MX mutant {mutant.name} ({mutant.why}) survived every TLX case on the simulator"


# ----------------------------------------------------------------------------------------------------
# the TLX MXFP8 backward (jfa.kernels.tlx.hopper.backward, MX build: dK and dV; dQ on the portable pass) on the
# CPU simulator, judged by bound (a) against the MX oracle's backward
# ----------------------------------------------------------------------------------------------------
TLX_BACKWARD_CASES = [
    # an empty query sequence, an empty key sequence (its rows see no key), sequences shorter than a tile, and
    # tails one row past a query step (65 rows, 64-row steps at D 64) and past a key tile (129 keys, 128-key tiles)
    Case("tlx-bwd-ragged-empty-tails-d64", (65, 0, 5, 129, 3), (129, 7, 0, 1, 130), seed=20),
    # causal with Lq > Lk (rows that see no key) and Lq < Lk, tails one row past 32-row steps, bf16, dlse
    Case("tlx-bwd-causal-lq-ne-lk-d128-rceil", (100, 33, 7), (60, 130, 129), head_dim=128, causal=True,
         rule="rceil", dtype=torch.bfloat16, dlse=True, seed=21),
    # grouped heads (4 query heads per key/value head: fp32 partials summed per group), causal
    Case("tlx-bwd-gqa4-causal-d64-rceil", (70, 40), (50, 130), heads=4, kv_heads=1, causal=True, rule="rceil",
         seed=22),
    Case("tlx-bwd-gqa-causal-d128-fp16", (33, 64), (64, 33), kv_heads=1, head_dim=128, causal=True,
         dtype=torch.float16, seed=23),
    # broadcast Q: Q^(queries) blocks the shared q's rows, dO^(queries) each sequence's output rows
    Case("tlx-bwd-bcastq-causal-d128", (45,), (70, 100, 0), head_dim=128, broadcast_q=True, causal=True, dlse=True,
         seed=24),
]
# the CI suite's seeded runs (the D 64 tails and the D 128 causal case); the others under the gate (``slow``: 2-6 s
# each on 2 cores, 24 s for the six)
TLX_BACKWARD_SEEDED = ("tlx-bwd-ragged-empty-tails-d64", "tlx-bwd-causal-lq-ne-lk-d128-rceil")


def _tlx_backward(pb: Problem, out, lse, schedule):
    """(dq, dk, dv) of the TLX MX backward on the simulator (3 SMs: CTAs walk several items), poisoned outputs;
    asserts the TLX dK/dV kernel ran there (where the problem has keys and query rows) and the simulator
    reported nothing."""
    sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    with sim.simulated(arch=(9, 0), sm_count=3, schedule=schedule) as session, alloc.poisoned_outputs():
        grads = tlx_backward.mx_backward_tlx(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k, dlse=pb.dlse,
                                             **_launch_args(pb))
    assert session.kernels() == ["jagged_dkdv_tlx_kernel"], session.kernels()
    assert not [w for r in session.reports for w in r.warnings]
    return grads


def _check_tlx_backward(case, device, seed, inputs="gauss"):
    """The TLX MX backward's dq, dk, dv from the portable forward's out and lse against the MX oracle's backward
    from the same out and lse, within bound (a) (``kernel_tolerance``: it holds from any conforming out/lse)."""
    pb = _problem(case, device, inputs=inputs)
    out, lse = _forward(pb)
    assert_backward_within_bound_a(pb, out, lse, _tlx_backward(pb, out, lse, _sim_schedule(seed)))


def assert_backward_within_bound_a(pb: Problem, out, lse, grads) -> None:
    """dq, dk, dv (``grads``) have the inputs' dtypes and shapes and lie within bound (a) of the MX oracle's
    backward from the same ``out`` and ``lse`` (``kernel_tolerance``: it holds from any conforming out/lse)."""
    q, k, v, dout = _np(pb.q), _np(pb.k), _np(pb.v), _np(pb.dout)
    dlse = None if pb.dlse is None else _np(pb.dlse)
    kw = _oracle_kw(pb)
    tol = mx_bounds.kernel_tolerance(q, k, v, dout, kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k"),
                                     out_dtype=DTYPE_NAMES[pb.case.dtype], dlse=dlse, **kw)
    want = oracle.mx_backward(q, k, v, _np(out), _np(lse), dout, dlse=dlse, **_oracle_kw(pb))
    for name, g, w, x in zip(("dq", "dk", "dv"), grads, want, (pb.q, pb.k, pb.v)):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        _assert_within(name, g, w, tol[name])


@pytest.mark.parametrize("case", TLX_BACKWARD_CASES, ids=[c.name for c in TLX_BACKWARD_CASES])
def test_tlx_mx_backward_meets_the_kernel_bound_on_the_simulator(case, device):
    """dq, dk, dv of the TLX MX build within bound (a) of the MX oracle, under the deterministic schedule (copies
    land as late as possible), on the adversarial jagged batches."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (on a GPU: tests/test_tlx_gpu.py)")
    _check_tlx_backward(case, device, None)


@pytest.mark.parametrize("seed", SIM_SEEDS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=() if c.name in TLX_BACKWARD_SEEDED else
                                               pytest.mark.slow) for c in TLX_BACKWARD_CASES])
def test_tlx_mx_backward_meets_the_kernel_bound_under_seeded_schedules(case, seed, device):
    """The same under seeded schedules (random task switches and copy order)."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (on a GPU: tests/test_tlx_gpu.py)")
    _check_tlx_backward(case, device, seed)


@pytest.mark.parametrize("case", [pytest.param(TLX_BACKWARD_CASES[0], id=TLX_BACKWARD_CASES[0].name),
                                  pytest.param(TLX_BACKWARD_CASES[4], id=TLX_BACKWARD_CASES[4].name,
                                               marks=pytest.mark.slow)])  # (8 s: the gate)
def test_tlx_mx_backward_equals_the_portable_backward_on_exact_inputs(case, device):
    """On the grid inputs (every dot exact) both kernels compute the same fp32 P and dS, so they quantize the same
    P^ and dS^ blocks: dk and dv agree with the portable MX kernel's to fp32 accumulation noise, dq (the same
    portable pass) bitwise."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (on a GPU: tests/test_tlx_gpu.py)")
    pb = _problem(case, device, inputs="grid")
    out, lse = _forward(pb)
    tlx = _tlx_backward(pb, out, lse, _sim_schedule(None))
    portable = _backward(pb, out, lse)
    assert torch.equal(tlx[0], portable[0])
    for name, x, y in zip(("dk", "dv"), tlx[1:], portable[1:]):
        assert torch.isfinite(x).all() and x.dtype == y.dtype, name
        assert float((x - y).abs().max()) <= 2e-6 * float(y.abs().max()), name


# (launch target, SMs, the name both passes record, the kernels the simulator ran)
OP_TARGETS = {
    "sm90-hopper": ((9, 0), 3, "tlx-hopper-mxfp8", ["jagged_fwd_tlx_kernel", "jagged_dkdv_tlx_kernel"]),
    "sm100-blackwell": ((10, 0), 2, "tlx-blackwell-mxfp8",
                        ["jagged_fwd_blackwell_kernel", "jagged_dkdv_blackwell_kernel"]),
}


@pytest.mark.parametrize("target", sorted(OP_TARGETS))
def test_the_op_runs_the_tlx_mx_kernels_on_the_simulator(target, device):
    """Through ``jfa.jagged_attention(precision="mxfp8", backend="tlx")`` on an sm_90 and an sm_100 target: both
    passes are that target's TLX MXFP8 kernels (recorded where they ran: not the portable fallback), as
    ``which_kernels`` says, and the gradients meet bound (a)."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (on a GPU: tests/test_tlx_gpu.py)")
    arch, sm_count, name, kernels = OP_TARGETS[target]
    import jfa
    import jfa.sim as sim
    from jfa.api import recording_dispatch

    pb = _problem(Case("op", (40, 33), (70, 0), kv_heads=1, causal=True, dtype=torch.bfloat16, seed=25), device,
                  inputs="gauss")
    leaves = [t.detach().requires_grad_() for t in (pb.q, pb.k, pb.v)]
    with sim.simulated(arch=arch, sm_count=sm_count) as session, alloc.poisoned_outputs(), recording_dispatch() as ran:
        choice = jfa.which_kernels(pb.q, pb.k, pb.v, precision="mxfp8", backend="tlx")
        out, lse = jfa.jagged_attention(*leaves, pb.cu_q, pb.cu_k, causal=True, softmax_scale=pb.scale,
                                        precision="mxfp8", backend="tlx", return_lse=True)
        out.backward(pb.dout)
    assert (choice.forward, choice.backward, choice.reason) == (name, name, "")
    assert ran == [("forward", name, "tlx-sim"), ("backward", name, "tlx-sim")]
    assert session.kernels() == kernels, session.kernels()
    q, k, v, dout = _np(pb.q), _np(pb.k), _np(pb.v), _np(pb.dout)
    kw = _oracle_kw(pb)
    tol = mx_bounds.kernel_tolerance(q, k, v, dout, kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k"),
                                     out_dtype="bfloat16", **kw)
    want = oracle.mx_backward(q, k, v, _np(out), _np(lse), dout, **_oracle_kw(pb))
    for grad, leaf, w in zip(("dq", "dk", "dv"), leaves, want):
        _assert_within(grad, leaf.grad, w, tol[grad])


def test_an_mxfp8_backward_the_tlx_build_cannot_run_falls_back_and_says_why(device):
    """On an sm_90 target the backward of a windowed call (no windowed MX build) runs the portable MXFP8 kernels
    under backend "auto" and gives its gradients; ``mx_backward_tlx_or_portable`` names the reason, as it does for
    another head dim, and on sm_100 for the Blackwell build."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import jfa.sim as sim
    from jfa.api import recording_dispatch
    from jfa.dispatch import mx_backward_tlx_or_portable

    pb = _problem(Case("window", (40,), (50,), seed=26), device, inputs="gauss")
    leaves = [t.detach().requires_grad_() for t in (pb.q, pb.k, pb.v)]
    args = dict(_launch_args(pb), window=(8, 8))
    with sim.simulated(arch=(9, 0), sm_count=3), recording_dispatch() as ran:
        assert mx_backward_tlx_or_portable("auto", pb.q, pb.k, pb.v, (8, 8)) == (
            "triton", "the TLX MXFP8 backward cannot run it: window_size (8, 8) (the TLX MXFP8 backward has no "
            "windowed build)")
        assert "head_dim 32" in mx_backward_tlx_or_portable("tlx", pb.q[..., :32], pb.k[..., :32], pb.v[..., :32])[1]
        assert mx_backward_tlx_or_portable("auto", pb.q, pb.k, pb.v) == ("tlx", "")
        out, _ = jmx.mx_attention(*leaves, pb.cu_q, pb.cu_k, backend="auto", **args)
        out.backward(pb.dout)
    assert [r[:2] for r in ran] == [("forward", "triton-mxfp8"), ("backward", "triton-mxfp8")]
    assert all(torch.isfinite(leaf.grad).all() for leaf in leaves)
    with sim.simulated(arch=(10, 0), sm_count=3):  # the Blackwell build: the same rules
        assert mx_backward_tlx_or_portable("auto", pb.q, pb.k, pb.v) == ("tlx_blackwell", "")
        assert mx_backward_tlx_or_portable("auto", pb.q, pb.k, pb.v, (8, 8)) == (
            "triton", "the TLX MXFP8 backward cannot run it: window_size (8, 8) (the TLX Blackwell MXFP8 backward has "
            "no windowed build)")
        assert "head_dim 32" in mx_backward_tlx_or_portable("tlx", pb.q[..., :32], pb.k[..., :32], pb.v[..., :32])[1]


@pytest.mark.parametrize("mutant", TLX_MX_BACKWARD_MUTANTS, ids=[m.name for m in TLX_MX_BACKWARD_MUTANTS])
def test_simulator_kills_tlx_mx_backward_mutants(mutant, device, record_property):
    """Each mutant of the TLX MXFP8 backward's own code fails bound (a) on one of its cases on the simulator (the
    deterministic schedule; the first case that fails stops the search)."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import time

    from jfa.fuzz.mutants import applied

    start, killed_by = time.perf_counter(), None
    with applied(mutant):
        for examples, case in enumerate(TLX_BACKWARD_CASES, 1):
            try:
                _check_tlx_backward(case, device, None)
            except Exception as exc:  # noqa: BLE001 - an assertion or a simulator report both kill
                killed_by = f"{case.name}: {type(exc).__name__}"
                break
    record_property("examples_to_kill", examples)
    record_property("seconds_to_kill", round(time.perf_counter() - start, 2))
    assert killed_by, f"TLX MX backward mutant {mutant.name} ({mutant.why}) survived every case on the simulator"


# ----------------------------------------------------------------------------------------------------
# the TLX Blackwell MXFP8 backward (jfa.kernels.tlx.blackwell.backward, MX build: dK and dV with all four products
# on block-scaled tcgen05 MMAs; dQ on the portable pass) on the CPU simulator (arch (10, 0)), judged by bound (a)
# against the MX oracle's backward
# ----------------------------------------------------------------------------------------------------
# the Hopper build's cases (empty query and key sequences, a 1-key sequence, tails one row past a 128-row step and
# a 128-key tile, causal Lq != Lk both ways, grouped heads, broadcast Q, D 64 and 128, both rules, dlse) and
# one-token query sequences beside a step's tail at D 128
BLACKWELL_BACKWARD_CASES = TLX_BACKWARD_CASES + [
    Case("bw-bwd-one-token-tails-d128", (1, 129, 1, 0), (1, 200, 0, 33), head_dim=128, causal=True, seed=27),
]
# the CI suite's seeded runs: one case per seed (the D 64 tails, the D 128 causal RCEIL case, broadcast Q); the
# other (case, seed) pairs under the gate (``slow``: 4-8 s each on 2 cores)
BLACKWELL_BACKWARD_SEEDED = {1: "tlx-bwd-ragged-empty-tails-d64", 2: "tlx-bwd-causal-lq-ne-lk-d128-rceil",
                             3: "tlx-bwd-bcastq-causal-d128"}
BLACKWELL_DKDV_KERNEL = "jagged_dkdv_blackwell_kernel"


def _blackwell_backward(pb: Problem, out, lse, schedule, launcher=None):
    """(dq, dk, dv) of the Blackwell MX backward (``launcher``: ``mx_backward_blackwell``, or a mutated one) on the
    simulator (2 SMs: CTAs walk several items), poisoned outputs; asserts the Blackwell dK/dV kernel ran there and
    the simulator reported nothing."""
    sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
    if launcher is None:
        from jfa.kernels.tlx.blackwell.backward import mx_backward_blackwell as launcher

    with sim.simulated(arch=(10, 0), sm_count=2, schedule=schedule) as session, alloc.poisoned_outputs():
        grads = launcher(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k, dlse=pb.dlse, **_launch_args(pb))
    assert session.kernels() == [BLACKWELL_DKDV_KERNEL], session.kernels()
    assert not [w for r in session.reports for w in r.warnings]
    return grads


def _check_blackwell_backward(case, device, seed, launcher=None):
    """The Blackwell MX backward's dq, dk, dv from the portable forward's out and lse within bound (a) of the MX
    oracle's backward from the same out and lse."""
    pb = _problem(case, device, inputs="gauss")
    out, lse = _forward(pb)
    assert_backward_within_bound_a(pb, out, lse, _blackwell_backward(pb, out, lse, _sim_schedule(seed), launcher))


@pytest.mark.parametrize("case", BLACKWELL_BACKWARD_CASES, ids=[c.name for c in BLACKWELL_BACKWARD_CASES])
def test_blackwell_mx_backward_meets_the_kernel_bound_on_the_simulator(case, device):
    """dq, dk, dv of the Blackwell MX build within bound (a) of the MX oracle, under the deterministic schedule
    (copies and MMAs land as late as possible), on the adversarial jagged batches."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (no B200 here)")
    _check_blackwell_backward(case, device, None)


@pytest.mark.parametrize("case, seed", [
    pytest.param(c, seed, id=f"{c.name}-seed{seed}",
                 marks=() if BLACKWELL_BACKWARD_SEEDED[seed] == c.name else pytest.mark.slow)
    for seed in sorted(BLACKWELL_BACKWARD_SEEDED) for c in BLACKWELL_BACKWARD_CASES])
def test_blackwell_mx_backward_meets_the_kernel_bound_under_seeded_schedules(case, seed, device):
    """The same under seeded schedules 1-3 (random task switches, copy and MMA completion order)."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (no B200 here)")
    _check_blackwell_backward(case, device, seed)


@pytest.mark.slow  # (10-16 s on 2 cores: the gate)
def test_blackwell_mx_backward_equals_the_portable_backward_on_exact_inputs(device):
    """On the grid inputs (every dot exact) both kernels compute the same fp32 P and dS, so they quantize the same
    P^ and dS^ blocks: dk and dv agree with the portable MX kernel's to fp32 accumulation noise, dq (the same
    portable pass) bitwise. The E4M3 elements and E8M0 scales the block-scaled MMAs get are those blocks."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (no B200 here)")
    pb = _problem(TLX_BACKWARD_CASES[0], device, inputs="grid")
    out, lse = _forward(pb)
    blackwell = _blackwell_backward(pb, out, lse, _sim_schedule(None))
    portable = _backward(pb, out, lse)
    assert torch.equal(blackwell[0], portable[0])
    for name, x, y in zip(("dk", "dv"), blackwell[1:], portable[1:]):
        assert torch.isfinite(x).all() and x.dtype == y.dtype, name
        assert float((x - y).abs().max()) <= 2e-6 * float(y.abs().max()), name


def test_the_blackwell_mx_backward_refuses_a_window_and_other_targets(device):
    """Refused by name before any launch: a sliding window (no windowed build), a launch target that is not sm_100."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (no B200 here)")
    import jfa.sim as sim
    from jfa.kernels.tlx.blackwell.backward import mx_backward_blackwell

    pb = _problem(Case("refused", (40,), (50,), seed=28), device, inputs="gauss")
    out, lse = _forward(pb)
    with sim.simulated(arch=(10, 0), sm_count=2) as session:
        with pytest.raises(ValueError, match="window_size"):
            mx_backward_blackwell(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k,
                                  **dict(_launch_args(pb), window=(8, 8)))
    assert session.kernels() == []
    with sim.simulated(arch=(9, 0), sm_count=2):
        with pytest.raises(ValueError, match="sm_100"):
            mx_backward_blackwell(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k, **_launch_args(pb))


# the CI suite kills the two protocol mutants (a simulator report on the first case); the two that bound (a) kills
# run under the gate (``slow``: 10-12 s each on 2 cores)
BLACKWELL_MX_BACKWARD_SLOW_TO_KILL = frozenset({"bw-mx-bwd-do-scales-a-block-late", "bw-mx-bwd-p-scales-halves-swapped"})


@pytest.mark.parametrize("mutant", [pytest.param(m, id=m.name, marks=pytest.mark.slow)
                                    if m.name in BLACKWELL_MX_BACKWARD_SLOW_TO_KILL else pytest.param(m, id=m.name)
                                    for m in BLACKWELL_MX_BACKWARD_MUTANTS])
def test_simulator_kills_blackwell_mx_backward_mutants(mutant, device, record_property):
    """Each mutant of the Blackwell MXFP8 backward's own code fails bound (a) or a simulator check on one of its
    cases (the deterministic schedule; the first case that fails stops the search); the killing case passes
    without it (the tests above)."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import time

    from jfa.fuzz.mutants import TLX_BLACKWELL_BACKWARD, applied

    start, killed_by = time.perf_counter(), None
    with applied(mutant) as fresh:
        for examples, case in enumerate(BLACKWELL_BACKWARD_CASES, 1):
            try:
                _check_blackwell_backward(case, device, None, fresh[TLX_BLACKWELL_BACKWARD].mx_backward_blackwell)
            except Exception as exc:  # noqa: BLE001 - an assertion or a simulator report both kill
                killed_by = f"{case.name}: {type(exc).__name__}"
                break
    record_property("examples_to_kill", examples)
    record_property("seconds_to_kill", round(time.perf_counter() - start, 2))
    record_property("killed_by", killed_by or "")
    assert killed_by, f"Blackwell MX backward mutant {mutant.name} ({mutant.why}) survived every case on the simulator"
