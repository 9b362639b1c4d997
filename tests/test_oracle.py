"""The NumPy float64 oracle, checked against an independent scalar implementation (forward) and
central finite differences (backward). One property per test."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pytest

from jfa.oracle import attention_backward, attention_forward


@dataclass(frozen=True)
class Case:
    lens_q: Optional[Sequence[int]]   # None with broadcast_q
    lens_k: Sequence[int]
    causal: bool = False
    scale: Optional[float] = None
    bcast_lq: Optional[int] = None     # broadcast_q: shared Lq
    H: int = 2
    D: int = 3
    Hk: Optional[int] = None           # key/value heads (None: H); H % Hk == 0 is grouped-query attention
    window: tuple = (-1, -1)           # (left, right), -1 unbounded


FWD_CASES = {
    "plain": Case([3, 5, 2], [3, 5, 2]),
    "plain-lq-ne-lk": Case([2, 4], [5, 3]),
    "causal-lq-eq-lk": Case([3, 4, 1], [3, 4, 1], causal=True),
    "causal-lq-gt-lk-masked-rows": Case([5, 4], [2, 1], causal=True),
    "causal-lq-lt-lk": Case([2, 3], [5, 6], causal=True),
    "empty-leading": Case([0, 3, 2], [0, 3, 2], causal=True),
    "empty-trailing": Case([3, 2, 0], [3, 2, 0]),
    "empty-middle": Case([3, 0, 2], [2, 0, 4]),
    "empty-q-only": Case([2, 0, 1], [2, 3, 1]),
    "empty-k-only": Case([2, 3, 1], [2, 0, 1]),
    "empty-all": Case([0, 0, 0], [0, 0, 0]),
    "batch-zero": Case([], []),
    "explicit-scale": Case([3, 2], [4, 2], causal=True, scale=0.37),
    "broadcast-q": Case(None, [2, 0, 4, 3], bcast_lq=3),
    "broadcast-q-causal": Case(None, [2, 0, 4, 3], causal=True, bcast_lq=3),
    "gqa": Case([3, 5, 2], [4, 5, 2], H=4, Hk=2),
    "mqa-causal": Case([3, 5], [4, 6], H=3, Hk=1, causal=True),
    "window-left": Case([6, 4], [6, 7], window=(2, -1)),
    "window-both": Case([6, 4], [5, 7], window=(1, 2)),
    "window-causal-left": Case([6, 7], [6, 5], causal=True, window=(2, -1)),
    "window-right-only-masked-rows": Case([6, 4], [2, 3], window=(-1, 0)),
    "gqa-window-broadcast-q": Case(None, [3, 0, 6], H=4, Hk=2, window=(1, 1), bcast_lq=4),
}


def _offsets(lens):
    return np.concatenate([[0], np.cumsum(np.asarray(lens, dtype=np.int64))]).astype(np.int64)


def make_inputs(c: Case, seed: int = 0):
    """Random float64 (q, k, v, cu_q, cu_k, kwargs) for a case."""
    rng = np.random.default_rng(seed)
    cu_k = _offsets(c.lens_k)
    if c.bcast_lq is not None:
        tq, cu_q = c.bcast_lq, None
    else:
        cu_q = _offsets(c.lens_q)
        tq = int(cu_q[-1])
    hk = c.Hk or c.H
    q = rng.standard_normal((tq, c.H, c.D))
    k = rng.standard_normal((int(cu_k[-1]), hk, c.D))
    v = rng.standard_normal((int(cu_k[-1]), hk, c.D))
    kw = dict(causal=c.causal, softmax_scale=c.scale, broadcast_q=c.bcast_lq is not None, window=c.window)
    return q, k, v, cu_q, cu_k, kw


def direct_attention(q, k, v, cu_q, cu_k, causal, scale, bcast_lq, window=(-1, -1)):
    """Independent scalar implementation: explicit loops over sequences, rows, heads, keys."""
    H, D = q.shape[1], q.shape[2]
    group = H // k.shape[1]
    left, right = window[0], 0 if causal else window[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    B = len(cu_k) - 1
    rows_out = B * bcast_lq if bcast_lq is not None else int(cu_q[-1])
    out = np.zeros((rows_out, H, D))
    lse = np.full((rows_out, H), -math.inf)
    for b in range(B):
        if bcast_lq is not None:
            q_start, lq, o_start = 0, bcast_lq, b * bcast_lq
        else:
            q_start, lq = int(cu_q[b]), int(cu_q[b + 1] - cu_q[b])
            o_start = q_start
        k_start, lk = int(cu_k[b]), int(cu_k[b + 1] - cu_k[b])
        for i in range(lq):
            keys = [j for j in range(lk) if (right < 0 or j <= i + lk - lq + right) and
                    (left < 0 or j >= i + lk - lq - left)]
            for h in range(H):
                if not keys:
                    continue
                s = [scale * sum(q[q_start + i, h, d] * k[k_start + j, h // group, d] for d in range(D)) for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = sum(w)
                for d in range(D):
                    out[o_start + i, h, d] = sum(wj * v[k_start + j, h // group, d] for wj, j in zip(w, keys)) / z
                lse[o_start + i, h] = m + math.log(z)
    return out, lse


@pytest.mark.parametrize("name", list(FWD_CASES))
def test_forward_matches_direct_softmax(name):
    c = FWD_CASES[name]
    q, k, v, cu_q, cu_k, kw = make_inputs(c)
    out, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    ref_out, ref_lse = direct_attention(q, k, v, cu_q, cu_k, c.causal, c.scale, c.bcast_lq, c.window)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_lse_is_log_sum_exp_of_scaled_scores():
    c = FWD_CASES["causal-lq-lt-lk"]
    q, k, v, cu_q, cu_k, kw = make_inputs(c, seed=3)
    _, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    scale = 1.0 / math.sqrt(c.D)
    for b in range(len(cu_k) - 1):
        lq, lk = int(cu_q[b + 1] - cu_q[b]), int(cu_k[b + 1] - cu_k[b])
        for i in range(lq):
            for h in range(c.H):
                s = [scale * float(np.dot(q[cu_q[b] + i, h], k[cu_k[b] + j, h])) for j in range(lk)
                     if j <= i + lk - lq]
                assert lse[cu_q[b] + i, h] == pytest.approx(math.log(sum(math.exp(x) for x in s)), rel=1e-13)


def test_default_scale_is_inverse_sqrt_head_dim():
    c = Case([3, 2], [2, 4], D=5)
    q, k, v, cu_q, cu_k, _ = make_inputs(c, seed=4)
    a = attention_forward(q, k, v, cu_q, cu_k)
    b = attention_forward(q, k, v, cu_q, cu_k, softmax_scale=1 / math.sqrt(5))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_masked_rows_give_zero_out_neginf_lse_and_zero_dq():
    # Sequence 0: Lq=4, Lk=2, causal -> rows 0, 1 see no key. Sequence 1: Lk=0 -> all rows see none.
    c = Case([4, 2], [2, 0], causal=True)
    q, k, v, cu_q, cu_k, kw = make_inputs(c, seed=5)
    out, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    masked = [0, 1, 4, 5]
    seen = [2, 3]
    assert np.all(out[masked] == 0.0)
    assert np.all(np.isneginf(lse[masked]))
    assert np.all(np.isfinite(lse[seen]))
    dout = np.random.default_rng(6).standard_normal(out.shape)
    dq, dk, dv = attention_backward(q, k, v, out, lse, dout, cu_q, cu_k, **kw)
    assert np.all(dq[masked] == 0.0)
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
    assert np.any(dq[seen] != 0.0)


def test_broadcast_q_with_cu_seqlens_q_raises():
    q, k, v, _, cu_k, _ = make_inputs(FWD_CASES["broadcast-q"])
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention_forward(q, k, v, np.array([0, 3]), cu_k, broadcast_q=True)
    out, lse = attention_forward(q, k, v, None, cu_k, broadcast_q=True)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention_backward(q, k, v, out, lse, out, np.array([0, 3]), cu_k, broadcast_q=True)


def test_broadcast_q_equals_repeated_q():
    c = FWD_CASES["broadcast-q-causal"]
    q, k, v, _, cu_k, kw = make_inputs(c, seed=7)
    B = len(cu_k) - 1
    out, lse = attention_forward(q, k, v, None, cu_k, **kw)
    kw_rep = dict(kw, broadcast_q=False)
    out_r, lse_r = attention_forward(np.tile(q, (B, 1, 1)), k, v, _offsets([c.bcast_lq] * B), cu_k, **kw_rep)
    np.testing.assert_array_equal(out, out_r)
    np.testing.assert_array_equal(lse, lse_r)


# ---------------------------------------------------------------- backward vs finite differences

BWD_CASES = {
    "plain": Case([3, 2], [2, 4]),
    "causal-lq-gt-lk": Case([4, 3], [2, 3], causal=True),
    "causal-lq-lt-lk": Case([2, 3], [4, 5], causal=True),
    "with-empty-sequence": Case([2, 0, 3, 2], [3, 2, 0, 2], causal=True),
    "broadcast-q": Case(None, [2, 0, 3], bcast_lq=3),
    "broadcast-q-causal": Case(None, [2, 0, 4], causal=True, bcast_lq=3),
    "gqa-causal": Case([3, 2], [2, 4], H=4, Hk=2, causal=True),
    "mqa-window": Case([4, 3], [5, 3], H=2, Hk=1, window=(1, 1)),
    "window-causal-left-broadcast-q": Case(None, [3, 0, 4], causal=True, window=(1, -1), bcast_lq=3),
}


def _finite_difference(f, x, eps=1e-6):
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for idx in range(flat.size):
        old = flat[idx]
        flat[idx] = old + eps
        fp = f()
        flat[idx] = old - eps
        fm = f()
        flat[idx] = old
        gflat[idx] = (fp - fm) / (2 * eps)
    return g


@pytest.mark.parametrize("name", list(BWD_CASES))
def test_backward_matches_finite_differences(name):
    c = BWD_CASES[name]
    q, k, v, cu_q, cu_k, kw = make_inputs(c, seed=11)
    out, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    G = np.random.default_rng(12).standard_normal(out.shape)
    dq, dk, dv = attention_backward(q, k, v, out, lse, G, cu_q, cu_k, **kw)

    def loss():
        return float(np.sum(attention_forward(q, k, v, cu_q, cu_k, **kw)[0] * G))

    for label, x, analytic in (("dq", q, dq), ("dk", k, dk), ("dv", v, dv)):
        numeric = _finite_difference(loss, x)
        assert analytic.shape == x.shape, label
        tol = 1e-6 * max(1.0, float(np.max(np.abs(numeric))))
        err = float(np.max(np.abs(analytic - numeric))) if x.size else 0.0
        assert err <= tol, f"{label}: max abs err {err:.3e} > {tol:.3e}"


def test_backward_batch_zero_gives_empty_zero_grads():
    c = Case([], [])
    q, k, v, cu_q, cu_k, kw = make_inputs(c)
    out, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    dq, dk, dv = attention_backward(q, k, v, out, lse, out, cu_q, cu_k, **kw)
    assert dq.shape == (0, 2, 3) and dk.shape == (0, 2, 3) and dv.shape == (0, 2, 3)


def test_lse_gradient_matches_finite_differences():
    """With dlse, the backward is the gradient of sum(out * G) + sum(lse * g) (finite rows only)."""
    rng = np.random.default_rng(7)
    cu_q, cu_k = np.array([0, 6, 6, 15]), np.array([0, 4, 9, 20])
    q, k, v = rng.normal(size=(15, 2, 8)), rng.normal(size=(20, 2, 8)), rng.normal(size=(20, 2, 8))
    G, g = rng.normal(size=(15, 2, 8)), rng.normal(size=(15, 2))
    kw = dict(causal=True)

    def loss(qq):
        o, lse = attention_forward(qq, k, v, cu_q, cu_k, **kw)
        return float((o * G).sum() + np.where(np.isfinite(lse), lse * g, 0.0).sum())

    o, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    dq, _, _ = attention_backward(q, k, v, o, lse, G, cu_q, cu_k, dlse=np.where(np.isfinite(lse), g, 0.0), **kw)
    eps, fd = 1e-6, np.zeros_like(q)
    for idx in np.ndindex(q.shape):
        qp, qm = q.copy(), q.copy()
        qp[idx] += eps
        qm[idx] -= eps
        fd[idx] = (loss(qp) - loss(qm)) / (2 * eps)
    assert np.abs(dq - fd).max() <= 1e-6 * max(1.0, np.abs(fd).max())


def test_backward_magnitudes_bound_every_gradient():
    """The absolute-value products the tolerance floor uses dominate the gradients themselves."""
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(9, 2, 8)), rng.normal(size=(12, 2, 8)), rng.normal(size=(12, 2, 8))
    dout = rng.normal(size=(9, 2, 8))
    cu_q, cu_k = np.array([0, 0, 4, 9]), np.array([0, 3, 3, 12])
    out, lse = attention_forward(q, k, v, cu_q, cu_k, causal=True)
    grads = attention_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=True)
    mags = attention_backward(q, k, v, out, lse, dout, cu_q, cu_k, causal=True, magnitudes=True)
    for grad, mag in zip(grads, mags):
        assert (mag >= np.abs(grad) - 1e-12).all() and (mag >= 0).all()
    assert (mags[2] > np.abs(grads[2]) + 1e-9).any()  # strictly larger where signs cancel


def test_grouped_heads_equal_repeated_key_value_heads():
    """GQA is MHA with each key/value head repeated for its query heads: forward equal, and dk/dv the
    sum of the repeated heads' gradients."""
    c = Case([3, 0, 4], [5, 2, 4], causal=True, H=6, Hk=2, window=(2, -1))
    q, k, v, cu_q, cu_k, kw = make_inputs(c, seed=21)
    out, lse = attention_forward(q, k, v, cu_q, cu_k, **kw)
    rk, rv = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
    out_r, lse_r = attention_forward(q, rk, rv, cu_q, cu_k, **kw)
    np.testing.assert_allclose(out, out_r, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(lse, lse_r)
    dout = np.random.default_rng(2).standard_normal(out.shape)
    dq, dk, dv = attention_backward(q, k, v, out, lse, dout, cu_q, cu_k, **kw)
    dq_r, dk_r, dv_r = attention_backward(q, rk, rv, out, lse, dout, cu_q, cu_k, **kw)
    np.testing.assert_allclose(dq, dq_r, rtol=0, atol=1e-13)
    for got, repeated in ((dk, dk_r), (dv, dv_r)):
        np.testing.assert_allclose(got, repeated.reshape(got.shape[0], 2, 3, -1).sum(2), rtol=0, atol=1e-13)


def test_a_window_spanning_everything_is_full_attention():
    c = Case([3, 5], [6, 4])
    q, k, v, cu_q, cu_k, kw = make_inputs(c, seed=22)
    full = attention_forward(q, k, v, cu_q, cu_k, **kw)
    wide = attention_forward(q, k, v, cu_q, cu_k, **dict(kw, window=(8, 8)))
    for a, b in zip(full, wide):
        np.testing.assert_array_equal(a, b)
