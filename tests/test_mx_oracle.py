"""The MXFP8 attention oracle (jfa.oracle.mx_attention) and its two error bounds (jfa.oracle.mx_bounds),
docs/mxfp8.md sections 2 and 3. One property per test; small seeded NumPy problems; no torch.

- The oracle against exact attention where quantization is exact, against an independent per-head
  re-computation of section 2 written here from quantize_mx, and its invariants (integer-max
  equivariance, convex rows, empty rows).
- Bound (b) (``apriori_bound``): |mx_oracle - exact| <= B on adversarial input families, and not vacuous.
- Bound (a) (``kernel_tolerance``): a float32 emulation of a kernel written here (online softmax over
  64-key chunks with an integer running max, fp32 matmuls/exp2, P and dS quantized from fp32 values) stays
  within it, and one flipped E4M3 rounding of a P element does not.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jfa.oracle.attention import attention_backward, attention_forward
from jfa.oracle.mx import decode_e4m3, dequantize_mx, encode_e4m3, quantize_mx, scale_exponent
from jfa.oracle.mx_attention import mx_backward, mx_forward
from jfa.oracle.mx_bounds import apriori_bound, kernel_tolerance, row_max

RULES = ("floor", "rceil")
LOG2E = math.log2(math.e)
F32 = np.float32


# ----------------------------------------------------------------------------------------------------
# problems
# ----------------------------------------------------------------------------------------------------
def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


# (lq per sequence or None for broadcast Lq, lk per sequence, H, H_kv, D, window)
SHAPES = {
    "plain": ([100, 37, 64], [90, 64, 33], 2, 2, 64, (-1, -1)),
    "gqa-d40": ([70, 0, 45], [70, 20, 0], 4, 2, 40, (-1, -1)),
    "bcast-window": (48, [80, 40, 65], 2, 1, 32, (40, 8)),
}


def _problem(shape: str, seed: int):
    lq, lk, H, hkv, D, window = SHAPES[shape]
    rng = np.random.default_rng(seed)
    bcast = not isinstance(lq, list)
    cu_k = _cu(lk)
    cu_q = None if bcast else _cu(lq)
    tq = lq if bcast else int(cu_q[-1])
    rows = len(lk) * lq if bcast else tq
    x = dict(q=rng.standard_normal((tq, H, D)), k=rng.standard_normal((int(cu_k[-1]), hkv, D)),
             v=rng.standard_normal((int(cu_k[-1]), hkv, D)), dout=rng.standard_normal((rows, H, D)))
    return x, cu_q, cu_k, bcast, window, rng


def _family(name: str, x: dict, cu_k, rng):
    """Adversarial input families (docs/mxfp8.md section 3); returns (inputs, softmax_scale or None)."""
    q, k, v, dout = (x[n].copy() for n in ("q", "k", "v", "dout"))
    D = q.shape[-1]
    scale = None
    if name == "peaked":  # logits 8x the usual spread
        scale = 8.0 / math.sqrt(D)
    elif name == "sink":  # every sequence's first key dominates every row
        u = rng.standard_normal(D)
        q += 1.5 * u
        k[cu_k[:-1][np.diff(cu_k) > 0]] = 6.0 * u
    elif name == "diffuse":  # all keys of a sequence equal: all logits of a row equal
        for b in np.nonzero(np.diff(cu_k))[0]:
            k[cu_k[b]:cu_k[b + 1]] = k[cu_k[b]]
    elif name == "outliers":  # 2% of the entries 100x
        for a in (q, k, v):
            a *= np.where(rng.random(a.shape) < 0.02, 100.0, 1.0)
    elif name == "blockscale":  # a different range per 32-block, along dim and along keys
        j = np.arange(D) // 32
        q *= 2.0 ** (-2 * j)
        k *= 2.0 ** (2 * j)
        v *= 2.0 ** (3 * j)
        dout *= 2.0 ** (-3 * j)
        for b in range(len(cu_k) - 1):
            r = np.arange(cu_k[b + 1] - cu_k[b]) // 32
            v[cu_k[b]:cu_k[b + 1]] *= 2.0 ** (2 * r)[:, None, None]
    return dict(q=q, k=k, v=v, dout=dout), scale


FAMILIES = ("gaussian", "peaked", "sink", "diffuse", "outliers", "blockscale")
# every family under both rules, causal and not, on one of the shapes in turn
CASES = [(f, r, c, list(SHAPES)[(i + 2 * j + n) % 3]) for i, f in enumerate(FAMILIES)
         for j, r in enumerate(RULES) for n, c in enumerate((False, True))]
CASE_IDS = [f"{f}-{r}-{'causal' if c else 'full'}-{s}" for f, r, c, s in CASES]


def _case(family, shape, seed=0):
    x, cu_q, cu_k, bcast, window, rng = _problem(shape, seed)
    x, scale = _family(family, x, cu_k, rng)
    return x, cu_q, cu_k, bcast, window, scale


def _kw(rule, causal, scale, bcast, window):
    return dict(rule=rule, causal=causal, softmax_scale=scale, broadcast_q=bcast, window=window)


def _ratios(err, bound):
    """observed / bound where the bound is positive (the elements that say something)."""
    pos = bound > 0
    assert np.all(err[~pos] == 0)
    return err[pos] / bound[pos]


# ----------------------------------------------------------------------------------------------------
# an independent per-head re-computation of section 2, from quantize_mx
# ----------------------------------------------------------------------------------------------------
def _dq(x2d, along_rows: bool, rule):
    """Dequantized MX of a 2-D array: blocks of 32 along its columns (``along_rows=False``: consecutive
    entries of a row) or along its rows (the tokens axis of one sequence)."""
    x3 = np.asarray(x2d, dtype=np.float64)[:, None, :]
    if along_rows:
        cu = np.array([0, x3.shape[0]])
        return dequantize_mx(*quantize_mx(x3, "tokens", cu, rule), "tokens", cu)[:, 0]
    return dequantize_mx(*quantize_mx(x3, "dim", rule=rule), "dim")[:, 0]


def _visible(lq, lk, causal, window):
    left, right = window
    right = 0 if causal else right
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    vis = np.ones((lq, lk), bool)
    if right >= 0:
        vis &= j <= i + lk - lq + right
    if left >= 0:
        vis &= j >= i + lk - lq - left
    return vis


def _pairs(x, cu_q, cu_k, bcast):
    """(b, h, q rows, output rows, key rows, kv head) of every non-empty (sequence, head)."""
    H, hkv = x["q"].shape[1], x["k"].shape[1]
    lq = x["q"].shape[0]
    for b in range(len(cu_k) - 1):
        qs = slice(0, lq) if bcast else slice(cu_q[b], cu_q[b + 1])
        oq = slice(b * lq, (b + 1) * lq) if bcast else qs
        ks = slice(cu_k[b], cu_k[b + 1])
        if qs.stop > qs.start and ks.stop > ks.start:
            for h in range(H):
                yield qs, oq, ks, h, h // (H // hkv)


def _direct_forward(x, cu_q, cu_k, *, rule, causal, softmax_scale, broadcast_q, window, flip=None):
    """Section 2 "Forward", one (sequence, head) at a time. ``flip=(output row, head, key)``: that P^
    element replaced by the E4M3 value on the other side of p (the rounding flipped)."""
    q, k, v = x["q"], x["k"], x["v"]
    D = q.shape[-1]
    scale = 1 / math.sqrt(D) if softmax_scale is None else softmax_scale
    total = (len(cu_k) - 1) * q.shape[0] if broadcast_q else q.shape[0]
    out, lse = np.zeros((total, q.shape[1], D)), np.full((total, q.shape[1]), -np.inf)
    for qs, oq, ks, h, g in _pairs(x, cu_q, cu_k, broadcast_q):
        qd, kd, vt = _dq(q[qs, h], False, rule), _dq(k[ks, g], False, rule), _dq(v[ks, g], True, rule)
        vis = _visible(qd.shape[0], kd.shape[0], causal, window)
        t = scale * LOG2E * (qd @ kd.T)
        for i in np.nonzero(vis.any(1))[0]:
            m = math.ceil(t[i, vis[i]].max())
            p = np.where(vis[i], np.exp2(np.where(vis[i], t[i] - m, 0.0)), 0.0)
            ph = _dq(p[None], False, rule)[0]
            if flip is not None and flip[:2] == (oq.start + i, h):
                j = flip[2]
                ph[j] = _neighbour(ph[j], ph[j] < p[j], p[j - j % 32:j - j % 32 + 32].max(), rule)
            out[oq.start + i, h] = (ph @ vt) / ph.sum()
            lse[oq.start + i, h] = math.log(2) * (m + math.log2(ph.sum()))
    return out, lse


def _neighbour(value, up, amax, rule):
    """The E4M3 value next to ``value`` (upwards if ``up``) under the block scale of ``amax``."""
    s = int(scale_exponent(amax, rule))
    byte = int(encode_e4m3(value * 2.0 ** -s))
    return float(decode_e4m3(byte + (1 if up else -1))) * 2.0 ** s


def _direct_backward(x, out, lse, cu_q, cu_k, *, rule, causal, softmax_scale, broadcast_q, window, dlse=None):
    """Section 2 "Backward" (the table), one (sequence, head) at a time."""
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    D = q.shape[-1]
    scale = 1 / math.sqrt(D) if softmax_scale is None else softmax_scale
    dlse = np.zeros(lse.shape) if dlse is None else dlse
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for qs, oq, ks, h, g in _pairs(x, cu_q, cu_k, broadcast_q):
        qb, kb, vb, dob = q[qs, h], k[ks, g], v[ks, g], dout[oq, h]
        vis = _visible(qb.shape[0], kb.shape[0], causal, window) & np.isfinite(lse[oq, h])[:, None]
        t = scale * LOG2E * (_dq(qb, False, rule) @ _dq(kb, False, rule).T)
        lse2 = np.where(np.isfinite(lse[oq, h]), lse[oq, h], 0.0)[:, None] / math.log(2)
        p = np.where(vis, np.exp2(np.where(vis, t - lse2, 0.0)), 0.0)
        dv[ks, g] += _dq(p, True, rule).T @ _dq(dob, True, rule)
        dp = _dq(dob, False, rule) @ _dq(vb, False, rule).T
        delta = (dob * out[oq, h]).sum(-1) - dlse[oq, h]
        ds = np.where(vis, p * (dp - delta[:, None]), 0.0)
        dq[qs, h] += scale * _dq(ds, False, rule) @ _dq(kb, True, rule)
        dk[ks, g] += scale * _dq(ds, True, rule).T @ _dq(qb, True, rule)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------
# a float32 kernel, emulated
# ----------------------------------------------------------------------------------------------------
def _bf16(x):
    """float32 -> bfloat16 (round to nearest even), returned as float32."""
    u = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(F32)


def _q32(x32, along_rows, rule):
    return _dq(x32.astype(np.float64), along_rows, rule).astype(F32)


def _kernel_forward(x, cu_q, cu_k, *, rule, causal, softmax_scale, broadcast_q, window, chunk=64):
    """Online softmax over ``chunk``-key tiles: fp32 S, t, exp2, running integer max ``ceil``, P^ of each
    tile quantized from its fp32 values (tile-local blocks), rescaling by exact powers of two; out rounded
    to bf16, lse fp32."""
    q, k, v = x["q"], x["k"], x["v"]
    D = q.shape[-1]
    c = F32((1 / math.sqrt(D) if softmax_scale is None else softmax_scale) * LOG2E)
    total = (len(cu_k) - 1) * q.shape[0] if broadcast_q else q.shape[0]
    out, lse = np.zeros((total, q.shape[1], D), F32), np.full((total, q.shape[1]), -np.inf, F32)
    for qs, oq, ks, h, g in _pairs(x, cu_q, cu_k, broadcast_q):
        qd, kd, vt = _q32(q[qs, h], False, rule), _q32(k[ks, g], False, rule), _q32(v[ks, g], True, rule)
        lq, lk = qd.shape[0], kd.shape[0]
        vis = _visible(lq, lk, causal, window)
        m, l, acc = np.full(lq, -np.inf, F32), np.zeros(lq, F32), np.zeros((lq, D), F32)
        for j0 in range(0, lk, chunk):
            j1 = min(j0 + chunk, lk)
            t = np.where(vis[:, j0:j1], (qd @ kd[j0:j1].T) * c, F32(-np.inf))
            m_new = np.maximum(m, np.ceil(t.max(1)))
            live = np.isfinite(m_new)
            ms = np.where(live, m_new, F32(0))
            alpha = np.where(np.isfinite(m), np.exp2(np.where(np.isfinite(m), m - ms, F32(0))), F32(0))
            on = vis[:, j0:j1] & live[:, None]
            p = np.where(on, np.exp2(np.where(on, t - ms[:, None], F32(0))), F32(0))
            ph = _q32(p, False, rule)
            l = l * alpha + ph.sum(1, dtype=F32)
            acc = acc * alpha[:, None] + ph @ vt[j0:j1]
            m = m_new
        seen = np.isfinite(m)
        out[oq, h] = _bf16(np.where(seen[:, None], acc / np.where(seen, l, F32(1))[:, None], F32(0)))
        lse[oq, h] = np.where(seen, F32(math.log(2)) * (m + np.log2(np.where(seen, l, F32(1)))), F32(-np.inf))
    return out, lse


def _kernel_backward(x, out, lse, cu_q, cu_k, *, rule, causal, softmax_scale, broadcast_q, window):
    """The backward table in fp32 from the kernel's own stored out (bf16) and lse (fp32); gradients
    accumulated in fp32 and rounded to bf16."""
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    D = q.shape[-1]
    sc = F32(1 / math.sqrt(D) if softmax_scale is None else softmax_scale)
    c = F32(float(sc) * LOG2E)
    dq, dk, dv = (np.zeros(a.shape, F32) for a in (q, k, v))
    for qs, oq, ks, h, g in _pairs(x, cu_q, cu_k, broadcast_q):
        qb, kb, vb, dob = q[qs, h], k[ks, g], v[ks, g], dout[oq, h].astype(F32)
        fin = np.isfinite(lse[oq, h])
        vis = _visible(qb.shape[0], kb.shape[0], causal, window) & fin[:, None]
        t = (_q32(qb, False, rule) @ _q32(kb, False, rule).T) * c
        lse2 = np.where(fin, lse[oq, h], F32(0)) * F32(LOG2E)
        p = np.where(vis, np.exp2(np.where(vis, t - lse2[:, None], F32(0))), F32(0))
        dv[ks, g] += _q32(p, True, rule).T @ _q32(dob, True, rule)
        dp = _q32(dob, False, rule) @ _q32(vb, False, rule).T
        delta = (dob * out[oq, h]).sum(-1, dtype=F32)
        ds = np.where(vis, p * (dp - delta[:, None]), F32(0))
        dq[qs, h] += sc * (_q32(ds, False, rule) @ _q32(kb, True, rule))
        dk[ks, g] += sc * (_q32(ds, True, rule).T @ _q32(qb, True, rule))
    return tuple(_bf16(a) for a in (dq, dk, dv))


# ----------------------------------------------------------------------------------------------------
# the oracle
# ----------------------------------------------------------------------------------------------------
def _exact_forward_problem(rng, causal):
    """Inputs on which every quantization is exact: q, k in {0, +-1} with 4 nonzeros per row (integer
    logits |t| <= 4 with c = 1, so p = 2^(t - M) are powers of two within E4M3's range of every block), v in
    {0, +-0.5, +-1, +-1.5, +-2}."""
    lq, lk, H, D = [40, 64, 1], [64, 40, 33], 2, 32
    cu_q, cu_k = _cu(lq), _cu(lk)
    def sparse(n):
        x = np.zeros((n, H, D))
        for r in range(n):
            for h in range(H):
                x[r, h, rng.choice(D, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
        return x
    v = rng.choice([0.0, -0.5, 0.5, -1.0, 1.0, -1.5, 1.5, -2.0, 2.0], (int(cu_k[-1]), H, D))
    return dict(q=sparse(int(cu_q[-1])), k=sparse(int(cu_k[-1])), v=v), cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("rule", RULES)
def test_forward_equals_exact_attention_when_quantization_is_exact(rule, causal):
    x, cu_q, cu_k = _exact_forward_problem(np.random.default_rng(1), causal)
    kw = dict(causal=causal, softmax_scale=1 / LOG2E)
    out, lse = mx_forward(x["q"], x["k"], x["v"], cu_q, cu_k, rule=rule, **kw)
    want_out, want_lse = attention_forward(x["q"], x["k"], x["v"], cu_q, cu_k, **kw)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", RULES)
def test_backward_equals_exact_attention_when_quantization_is_exact(rule):
    """Equal integer logits per row (c = 1) over 32 or 64 keys (P = 1/Lk, a power of two), V in +- pairs
    (out = 0), one-hot dO and q in {+-1, +-2}: dP, dS = P dP and every operand are exact E4M3 block values."""
    rng = np.random.default_rng(2)
    lq, lk, H, D = [20, 33], [32, 64], 2, 32
    cu_q, cu_k = _cu(lq), _cu(lk)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = np.zeros((tq, H, D))
    q[:, :, :8] = rng.choice([-2.0, -1.0, 1.0, 2.0], (tq, H, 8))
    k = np.zeros((tk, H, D))
    k[:, :, 0] = 1.0                                    # q.k = q[0]: equal within a row
    k[:, :, 8:] = rng.choice([0.0, -1.0, 1.0], (tk, H, D - 8))  # orthogonal to every q: dq is not 0
    v = np.zeros((tk, H, D))
    for b in range(2):
        half = rng.choice([0.0, -1.0, 1.0], (lk[b] // 2, H, D))
        v[cu_k[b]:cu_k[b + 1]] = np.concatenate([half, -half])
    dout = np.zeros((tq, H, D))
    dout[np.arange(tq)[:, None], np.arange(H)[None], rng.integers(0, D, (tq, H))] = rng.choice([-1.0, 1.0], (tq, H))
    kw = dict(softmax_scale=1 / LOG2E)
    out, lse = mx_forward(q, k, v, cu_q, cu_k, rule=rule, **kw)
    got = mx_backward(q, k, v, out, lse, dout, cu_q, cu_k, rule=rule, **kw)
    want = attention_backward(q, k, v, *attention_forward(q, k, v, cu_q, cu_k, **kw), dout, cu_q, cu_k, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert np.abs(w).max() > 0.01, name
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("rule", RULES)
def test_integer_logit_shift_leaves_out_unchanged(rule):
    """Adding n (log2 units) to every logit of row i (through a dim block of its own: q[i, 32] = n_i, k[:, 32]
    = 1, c = 1) moves M by n and lse by n ln2, and leaves out as it was; a half-integer shift does not."""
    x, cu_q, cu_k, *_ = _problem("plain", 3)
    q, k, v = x["q"].copy(), x["k"].copy(), x["v"]
    q[:, :, 32:], k[:, :, 32:] = 0.0, 0.0
    k[:, :, 32] = 1.0
    shift = np.random.default_rng(3).integers(-6, 7, q.shape[:2]).astype(np.float64)
    base = mx_forward(q, k, v, cu_q, cu_k, rule=rule, softmax_scale=1 / LOG2E)
    q2 = q.copy()
    q2[:, :, 32] = shift
    moved = mx_forward(q2, k, v, cu_q, cu_k, rule=rule, softmax_scale=1 / LOG2E)
    np.testing.assert_allclose(moved[0], base[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(moved[1], base[1] + shift * math.log(2), rtol=0, atol=1e-12)
    q2[:, :, 32] = shift + 0.5
    assert np.abs(mx_forward(q2, k, v, cu_q, cu_k, rule=rule, softmax_scale=1 / LOG2E)[0] - base[0]).max() > 1e-6


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("rule", RULES)
def test_out_rows_are_convex_combinations_of_quantized_v(rule, shape):
    x, cu_q, cu_k, bcast, window, _ = _problem(shape, 4)
    out, _ = mx_forward(x["q"], x["k"], x["v"], cu_q, cu_k, rule=rule, causal=True, broadcast_q=bcast, window=window)
    vt = dequantize_mx(*quantize_mx(x["v"], "tokens", cu_k, rule), "tokens", cu_k)
    for qs, oq, ks, h, g in _pairs(x, cu_q, cu_k, bcast):
        vis = _visible(qs.stop - qs.start, ks.stop - ks.start, True, window)
        o = out[oq, h]
        for i in np.nonzero(vis.any(1))[0]:
            seen = vt[ks, g][vis[i]]
            assert np.all(seen.min(0) - 1e-12 <= o[i]) and np.all(o[i] <= seen.max(0) + 1e-12)


def test_rows_without_a_visible_key_give_zero_and_minus_inf():
    """Lk = 0 sequences, causal rows before the first key (Lq > Lk) and rows a window leaves empty."""
    rng = np.random.default_rng(5)
    lq, lk, H, D = [5, 12, 6], [0, 4, 6], 2, 32
    cu_q, cu_k = _cu(lq), _cu(lk)
    q, k, v = rng.standard_normal((23, H, D)), rng.standard_normal((10, H, D)), rng.standard_normal((10, H, D))
    for kw in (dict(causal=True), dict(window=(0, -1))):
        out, lse = mx_forward(q, k, v, cu_q, cu_k, **kw)
        _, want = attention_forward(q, k, v, cu_q, cu_k, **kw)
        empty = ~np.isfinite(want)
        assert empty.any() and np.array_equal(~np.isfinite(lse), empty)
        assert np.all(lse[empty] == -np.inf) and np.all(out[empty] == 0)
    empty_window = dict(window=(2, 3))  # rows of the 12-query sequence far from the 4 keys see none
    out, lse = mx_forward(q, k, v, cu_q, cu_k, **empty_window)
    _, want = attention_forward(q, k, v, cu_q, cu_k, **empty_window)
    assert np.array_equal(np.isfinite(lse), np.isfinite(want)) and np.all(out[~np.isfinite(want)] == 0)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("rule", RULES)
def test_oracle_matches_a_direct_per_head_recomputation(rule, causal, shape):
    x, cu_q, cu_k, bcast, window, _ = _problem(shape, 6)
    kw = _kw(rule, causal, None, bcast, window)
    out, lse = mx_forward(x["q"], x["k"], x["v"], cu_q, cu_k, **kw)
    want_out, want_lse = _direct_forward(x, cu_q, cu_k, **kw)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-12)
    dlse = np.random.default_rng(6).standard_normal(lse.shape)
    got = mx_backward(x["q"], x["k"], x["v"], out, lse, x["dout"], cu_q, cu_k, dlse=dlse, **kw)
    want = _direct_backward(x, out, lse, cu_q, cu_k, dlse=dlse, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * max(1.0, np.abs(w).max()), err_msg=name)


# ----------------------------------------------------------------------------------------------------
# bound (b): the MX oracle against exact attention
# ----------------------------------------------------------------------------------------------------
def _mx_and_exact(x, cu_q, cu_k, kw):
    args = (x["q"], x["k"], x["v"])
    ex_kw = {n: kw[n] for n in ("causal", "softmax_scale", "broadcast_q", "window")}
    out, lse = mx_forward(*args, cu_q, cu_k, **kw)
    grads = mx_backward(*args, out, lse, x["dout"], cu_q, cu_k, **kw)
    eout, exact_lse = attention_forward(*args, cu_q, cu_k, **ex_kw)
    egrads = attention_backward(*args, eout, exact_lse, x["dout"], cu_q, cu_k, **ex_kw)
    fin = np.isfinite(exact_lse)
    return (dict(out=out, lse=np.where(fin, lse, 0.0), dq=grads[0], dk=grads[1], dv=grads[2]),
            dict(out=eout, lse=np.where(fin, exact_lse, 0.0), dq=egrads[0], dk=egrads[1], dv=egrads[2]))


@pytest.mark.parametrize("family,rule,causal,shape", CASES, ids=CASE_IDS)
def test_apriori_bound_holds(family, rule, causal, shape):
    x, cu_q, cu_k, bcast, window, scale = _case(family, shape)
    kw = _kw(rule, causal, scale, bcast, window)
    bound = apriori_bound(x["q"], x["k"], x["v"], x["dout"], cu_q, cu_k, **kw)
    mx, exact = _mx_and_exact(x, cu_q, cu_k, kw)
    for name in ("out", "lse", "dq", "dk", "dv"):
        err = np.abs(mx[name] - exact[name])
        bad = err > bound[name]
        assert not bad.any(), f"{name}: {bad.sum()} elements past the bound, worst {(err - bound[name]).max():.3g}"
        assert _ratios(err, bound[name]).max() <= 1


@pytest.mark.parametrize("rule", RULES)
def test_apriori_bound_is_not_vacuous(rule):
    """On gaussian inputs with moderate logits (q, k ~ N(0, 0.3^2), D = 64) the bound on out is below a
    quarter of the trivial convex-hull bound (the range of V), and the lse bound below 0.25; and the MX
    result moved by twice the bound violates it."""
    x, cu_q, cu_k, bcast, window, _ = _problem("plain", 7)
    x["q"] *= 0.3
    x["k"] *= 0.3
    kw = _kw(rule, False, None, bcast, window)
    bound = apriori_bound(x["q"], x["k"], x["v"], x["dout"], cu_q, cu_k, **kw)
    v_range = x["v"].max(0) - x["v"].min(0)                       # [H, D]
    assert np.all(bound["out"] < 0.25 * v_range[None])
    assert bound["lse"].max() < 0.25
    mx, exact = _mx_and_exact(x, cu_q, cu_k, kw)
    for name in ("out", "lse", "dq", "dk", "dv"):
        pos = bound[name] > 0
        moved = mx[name] + 2 * bound[name]
        assert np.all(np.abs(moved - exact[name])[pos] > bound[name][pos]), name


# ----------------------------------------------------------------------------------------------------
# bound (a): a float32 kernel against the MX oracle
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,rule,causal,shape", CASES, ids=CASE_IDS)
def test_kernel_tolerance_holds_for_a_float32_kernel(family, rule, causal, shape):
    x, cu_q, cu_k, bcast, window, scale = _case(family, shape)
    kw = _kw(rule, causal, scale, bcast, window)
    tol = kernel_tolerance(x["q"], x["k"], x["v"], x["dout"], cu_q, cu_k, **kw)
    out, lse = mx_forward(x["q"], x["k"], x["v"], cu_q, cu_k, **kw)
    k_out, k_lse = _kernel_forward(x, cu_q, cu_k, **kw)
    assert np.all(np.abs(k_out - out) <= tol["out"]), "out"
    fin = np.isfinite(lse)
    assert np.array_equal(np.isfinite(k_lse), fin)
    assert np.all(np.abs(k_lse[fin] - lse[fin]) <= tol["lse"][fin]), "lse"
    k_grads = _kernel_backward(x, k_out, k_lse, cu_q, cu_k, **kw)
    for stored in ((out, lse), (k_out.astype(np.float64), k_lse.astype(np.float64))):  # the oracle's, the kernel's
        grads = mx_backward(x["q"], x["k"], x["v"], *stored, x["dout"], cu_q, cu_k, **kw)
        for name, kg, g in zip(("dq", "dk", "dv"), k_grads, grads):
            err = np.abs(kg - g)
            assert np.all(err <= tol[name]), f"{name}: worst excess {(err - tol[name]).max():.3g}"


@pytest.mark.parametrize("rule", RULES)
def test_kernel_tolerance_is_not_vacuous(rule):
    """Far below bound (b) (median ratio < 1e-3 with fp32 outputs), and one P^ element whose rounding is
    flipped (the row's largest p, not near a tie) breaks it."""
    x, cu_q, cu_k, bcast, window, _ = _problem("plain", 8)
    kw = _kw(rule, False, None, bcast, window)
    tol = kernel_tolerance(x["q"], x["k"], x["v"], x["dout"], cu_q, cu_k, out_dtype="float32", **kw)
    bound = apriori_bound(x["q"], x["k"], x["v"], x["dout"], cu_q, cu_k, **kw)
    for name in ("out", "lse", "dq", "dk", "dv"):
        pos = bound[name] > 0
        assert np.median(tol[name][pos] / bound[name][pos]) < 1e-3, name
    out, _ = mx_forward(x["q"], x["k"], x["v"], cu_q, cu_k, **kw)
    qd = dequantize_mx(*quantize_mx(x["q"], "dim", rule=rule), "dim")
    kd = dequantize_mx(*quantize_mx(x["k"], "dim", rule=rule), "dim")
    j = int(np.argmax(qd[0, 0] @ kd[:90, 0].T))  # row 0, head 0 of sequence 0: its largest p
    flipped, _ = _direct_forward(x, cu_q, cu_k, flip=(0, 0, j), **kw)
    assert np.abs(flipped - out)[0, 0].max() > 10 * tol["out"][0, 0].max()
    assert np.abs(flipped - out)[1:].max() < 1e-12


def test_row_max_reduces_over_the_head_dim():
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(row_max(x), x[..., -1])
    np.testing.assert_array_equal(row_max(x[..., 0]), x[..., 0])


# ----------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------
def _valid():
    x, cu_q, cu_k, *_ = _problem("plain", 9)
    return x, cu_q, cu_k


CALLS = {
    "mx_forward": lambda x, cq, ck, **kw: mx_forward(x["q"], x["k"], x["v"], cq, ck, **kw),
    "mx_backward": lambda x, cq, ck, **kw: mx_backward(x["q"], x["k"], x["v"], x["out"], x["lse"], x["dout"], cq, ck,
                                                       **kw),
    "kernel_tolerance": lambda x, cq, ck, **kw: kernel_tolerance(
        x["q"], x["k"], x["v"], x["dout"], cq, ck, **{**dict(rule="floor", causal=False, softmax_scale=None,
                                                           broadcast_q=False), **kw}),
    "apriori_bound": lambda x, cq, ck, **kw: apriori_bound(
        x["q"], x["k"], x["v"], x["dout"], cq, ck, **{**dict(rule="floor", causal=False, softmax_scale=None,
                                                        broadcast_q=False), **kw}),
}
BREAKS = {
    "rule": (lambda x, cq, ck: (x, cq, ck, dict(rule="nearest")), "rule"),
    "shapes": (lambda x, cq, ck: ({**x, "v": x["v"][:, :, :32]}, cq, ck, {}), "k, v"),
    "offsets": (lambda x, cq, ck: (x, cq, ck + 1, {}), "cu_seqlens_k"),
    "float-offsets": (lambda x, cq, ck: (x, cq.astype(float), ck, {}), "cu_seqlens_q"),
    "window": (lambda x, cq, ck: (x, cq, ck, dict(window=(-2, 0))), "window"),
    "bcast-with-cu-q": (lambda x, cq, ck: (x, cq, ck, dict(broadcast_q=True)), "cu_seqlens_q"),
}


@pytest.mark.parametrize("brk", list(BREAKS))
@pytest.mark.parametrize("call", list(CALLS))
def test_bad_input_raises_value_error_naming_the_argument(call, brk):
    x, cq, ck = _valid()
    x = {**x, "out": np.zeros_like(x["dout"]), "lse": np.zeros(x["dout"].shape[:2])}
    make, name = BREAKS[brk]
    x, cq, ck, kw = make(x, cq, ck)
    with pytest.raises(ValueError, match=name):
        CALLS[call](x, cq, ck, **kw)


@pytest.mark.parametrize("call,arg", [("mx_backward", "dout"), ("mx_backward", "lse"), ("kernel_tolerance", "dout"),
                                      ("apriori_bound", "dlse"), ("kernel_tolerance", "out_dtype")])
def test_bad_gradient_inputs_raise_value_error_naming_the_argument(call, arg):
    x, cq, ck = _valid()
    x = {**x, "out": np.zeros_like(x["dout"]), "lse": np.zeros(x["dout"].shape[:2])}
    kw = {}
    if arg in ("dout", "lse"):
        x[arg] = x[arg][:-1]
    elif arg == "dlse":
        kw["dlse"] = np.zeros((3, 3))
    else:
        kw["out_dtype"] = "float8"
    with pytest.raises(ValueError, match=arg):
        CALLS[call](x, cq, ck, **kw)
