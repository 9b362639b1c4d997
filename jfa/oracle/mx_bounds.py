"""Error bounds for MXFP8 attention (docs/mxfp8.md section 3): interval enclosures in float64 NumPy.

Two bounds, one interval machinery, two error models:

- :func:`kernel_tolerance` (bound (a)): a kernel computes the section 2 semantics from the same quantized
  operands (byte-exact, so points here) with fp32 intermediates. Every kernel intermediate is enclosed in
  an interval around the oracle's: fp32 accumulation, exp2, division, log2 and rounding errors widen it,
  and an intermediate MX quantization (P, dS) maps an interval to the exact range of quantized values over
  every scale a block can get from its amax interval (:func:`_quant_exact`).
- :func:`apriori_bound` (bound (b)): the MX oracle against exact attention on the original inputs. Each
  quantized operand or intermediate lies within the MX rounding model around its unquantized value
  (:func:`_quant_model`); the arithmetic is exact (float64, with slack for this module's own rounding).

An :class:`jfa.oracle.intervals.Iv` is an elementwise enclosure ``[lo, hi]``. Every operation here rounds outward (relative
slack :data:`SLACK` per operation, ``(n + 4) 2^-52`` of the magnitude for an n-term sum), so the
enclosures are rigorous for the float64 arithmetic of this module, the MX oracle's and the exact oracle's.
Everything is computed per sequence and head, on the heads layout ``[H, rows, D]`` of jfa.oracle.attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jfa.oracle.attention import (_as_f64, _heads, _prepare, _rows, _seq_rows, _ungroup, _visible,
                                  attention_backward, attention_forward)
from jfa.oracle.mx import BLOCK, SCALE_EXP_MIN, _check_rule, _floor_log2, decode_e4m3, encode_e4m3, scale_exponent
from jfa.oracle.intervals import F64_U, SLACK, TINY, Iv, exp2, gamma, iv_matmul, row_max
from jfa.oracle.mx_attention import LN2, LOG2E, _window, mx_along, mx_forward

__all__ = ["kernel_tolerance", "apriori_bound", "row_max", "Iv",
           "U_ACC", "U32", "T_REL", "EXP2_REL", "DIV_REL", "LG2_ABS", "LSE_REL", "FLUSH", "MODEL_REL",
           "MODEL_REL_SATURATED", "OUT_DTYPES"]

# ---- the fp32 kernel's error model (bound (a)) ------------------------------------------------------
U_ACC = 2.0 ** -22     # per addition of an fp32 accumulation: 2^-24 with margin for truncating MMA adders
U32 = 2.0 ** -24       # one fp32 round-to-nearest operation (subtraction, product, scale multiply)
T_REL = 2.0 ** -23     # t = c * S in fp32: c's own rounding and the product's
EXP2_REL = 2.0 ** -21  # ex2.approx.f32 (hardware exp2), relative
DIV_REL = 2.0 ** -21   # out = acc / l: a division or rcp.approx and a multiply
LG2_ABS = 2.0 ** -21   # lg2.approx.f32, absolute (log2 units)
LSE_REL = 2.0 ** -22   # the fp32 roundings of M + log2 l, of the ln2 multiply and of lse's storage
FLUSH = 2.0 ** -126    # fp32's smallest normal: a kernel may flush smaller values (FTZ) to 0
# ---- the MX rounding model (bound (b)) --------------------------------------------------------------
MODEL_REL = 2.0 ** -4             # half an E4M3 ulp, relative (normal elements)
MODEL_REL_SATURATED = 2.0 ** -3   # a FLOOR element that may saturate to 448 * 2^s
SAT_FRACTION = 464.0 / 512.0      # FLOOR saturates only elements above 464/512 of the block amax
# the magnitude from which rounding to the output dtype gives +-inf (the largest finite value plus half its ulp)
OVERFLOW = {"bfloat16": 2.0 ** 128 * (1 - 2.0 ** -9), "float16": 65520.0, "float32": 2.0 ** 128 * (1 - 2.0 ** -25),
            "float64": np.inf}
# half an ulp of the output dtype (relative) and half its smallest subnormal (absolute)
OUT_DTYPES = {"bfloat16": (2.0 ** -8, 2.0 ** -134), "float16": (2.0 ** -11, 2.0 ** -25),
              "float32": (2.0 ** -24, 2.0 ** -150), "float64": (0.0, 0.0)}


# ----------------------------------------------------------------------------------------------------
# intervals
# --------------------------------------------------------------------------------------------------------------------
def _blocked(a: np.ndarray, axis: int) -> np.ndarray:
    """``axis`` moved last, zero-padded to whole blocks and split: ``[..., nb, 32]``."""
    a = np.moveaxis(a, axis, -1)
    n = a.shape[-1]
    nb = -(-n // BLOCK)
    pad = np.zeros(a.shape[:-1] + (nb * BLOCK,))
    pad[..., :n] = a
    return pad.reshape(a.shape[:-1] + (nb, BLOCK))


def _unblocked(a: np.ndarray, axis: int, n: int) -> np.ndarray:
    return np.moveaxis(a.reshape(a.shape[:-2] + (-1,))[..., :n], -1, axis)


def _scale_unclamped(amax: np.ndarray, rule: str) -> np.ndarray:
    """The scale exponent the rule gives ``amax > 0`` before E8M0's clamp (``scale_exponent`` on the
    significand, shifted back); ``SCALE_EXP_MIN`` for 0."""
    pos = amax > 0
    e = _floor_log2(np.where(pos, amax, 1.0))
    return np.where(pos, scale_exponent(np.ldexp(np.where(pos, amax, 1.0), -e), rule) + e, SCALE_EXP_MIN)


def _q(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The MX element value of ``x`` under scale exponent ``s`` (saturating RNE E4M3, sign kept)."""
    return np.ldexp(decode_e4m3(encode_e4m3(np.ldexp(x, -s))), s)


def _signed(lo, hi, qlo, qhi) -> Iv:
    """Quantization keeps signs: a non-negative element stays >= 0, a non-positive one <= 0."""
    return Iv(np.where(lo >= 0, np.maximum(qlo, 0.0), qlo), np.where(hi <= 0, np.minimum(qhi, 0.0), qhi))


def _model_terms(x: Iv, axis: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Bound (b)'s rounding model, per element of ``x``: ``(rel, a)`` such that every MX quantization along
    ``axis`` of a member x_ of ``x`` is within ``rel |x_| + a`` of it. ``a = 2^(s - 10)`` (half the subnormal
    quantum) with s the largest scale the block's amax interval allows; rel = 2^-4 (half an ulp), 2^-3 for a
    FLOOR element that may saturate (upper magnitude above 464/512 of the block amax's lower end)."""
    n = x.lo.shape[axis]
    lo, hi = _blocked(x.lo, axis), _blocked(x.hi, axis)
    mag = np.maximum(np.abs(lo), np.abs(hi))
    amax_lo = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi))).max(-1, keepdims=True)
    s_max = np.maximum(_scale_unclamped(mag.max(-1, keepdims=True), rule), SCALE_EXP_MIN)
    rel = np.full(mag.shape, MODEL_REL)
    if rule == "floor":
        rel = np.where(mag > SAT_FRACTION * amax_lo, MODEL_REL_SATURATED, MODEL_REL)
    a = np.broadcast_to(np.ldexp(1.0, s_max - 10), mag.shape)
    return _unblocked(rel, axis, n), _unblocked(a, axis, n)


def _quant_model(x: Iv, axis: int, rule: str) -> Iv:
    """The enclosure of every MX quantization along ``axis`` of a member of ``x`` under the model
    (:func:`_model_terms`; ``x_ - rel |x_|`` is increasing, so the ends map to the ends)."""
    rel, a = _model_terms(x, axis, rule)
    q = _signed(x.lo, x.hi, x.lo - (rel * np.abs(x.lo) + a), x.hi + (rel * np.abs(x.hi) + a))
    return Iv.outward(q.lo, q.hi)


def _quant_exact(x: Iv, axis: int, rule: str, low_unclamped: bool, candidates: int = 4) -> Iv:
    """Bound (a)'s quantization: the exact range of the MX quantization along ``axis`` of every member of
    ``x``. A block's scale lies between the scales of its amax interval's ends (the scale is monotone in
    amax; ``low_unclamped``: the lower end without E8M0's clamp, for P normalized to a reference maximum a
    kernel's own maximum may lie below); for a fixed scale quantization is monotone in the element, so the
    range is [min over candidate scales of quant(lo), max of quant(hi)]. Blocks with more than ``candidates``
    scales (never for fp32 noise) fall back to the model with 2^-3 (sound for any scale at or above the
    rule's). Values below fp32's normal range may be flushed to 0 by a kernel: their range includes 0."""
    n = x.lo.shape[axis]
    lo, hi = _blocked(x.lo, axis), _blocked(x.hi, axis)
    mag = np.maximum(np.abs(lo), np.abs(hi))
    mig = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    s_max = np.maximum(_scale_unclamped(mag.max(-1, keepdims=True), rule), SCALE_EXP_MIN)
    amax_lo = mig.max(-1, keepdims=True)
    s_min = np.where(amax_lo > 0, _scale_unclamped(amax_lo, rule), -(1 << 20))
    if not low_unclamped:
        s_min = np.maximum(s_min, SCALE_EXP_MIN)
    fallback = s_max - s_min >= candidates
    s_min = np.where(fallback, s_max, s_min)
    qlo, qhi = _q(lo, s_min), _q(hi, s_min)
    for k in range(1, candidates):
        s = np.minimum(s_min + k, s_max)
        qlo, qhi = np.minimum(qlo, _q(lo, s)), np.maximum(qhi, _q(hi, s))
    a = np.ldexp(1.0, s_max - 10)
    qlo = np.where(fallback, lo - (MODEL_REL_SATURATED * np.abs(lo) + a), qlo)
    qhi = np.where(fallback, hi + (MODEL_REL_SATURATED * np.abs(hi) + a), qhi)
    qlo = np.where((qlo > 0) & (qlo < FLUSH), 0.0, qlo)
    qhi = np.where((qhi < 0) & (qhi > -FLUSH), 0.0, qhi)
    q = _signed(lo, hi, qlo, qhi)
    return Iv(_unblocked(q.lo, axis, n), _unblocked(q.hi, axis, n))


# ----------------------------------------------------------------------------------------------------
# the two error models
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Model:
    """``fp32=True``: bound (a), a kernel's fp32 arithmetic around byte-exact operands; False: bound (b),
    the MX rounding model around the original values with exact arithmetic."""
    rule: str
    fp32: bool
    out_u: float = 0.0
    out_abs: float = 0.0

    def r(self, rel: float) -> float:
        return rel if self.fp32 else 0.0

    def acc(self, n):
        """Relative error of an n-term accumulation (against the magnitude of its terms)."""
        return gamma(np.asarray(n) + 1, U_ACC) if self.fp32 else 0.0

    def acc_abs(self, n):
        """Absolute error of an n-term accumulation from flushed (FTZ) products and rescales."""
        return np.asarray(n) * 2 * FLUSH if self.fp32 else 0.0

    def operand(self, x: np.ndarray, axis: int) -> Iv:
        """A quantized operand (heads layout ``[H, rows, D]``) along ``axis`` (-1: dim, -2: rows of the
        sequence)."""
        if not self.fp32:
            return _quant_model(Iv(x), axis, self.rule)
        xq = mx_along(x, axis, self.rule)
        tiny = np.abs(xq) < FLUSH
        return Iv(np.where(tiny, np.minimum(xq, 0.0), xq), np.where(tiny, np.maximum(xq, 0.0), xq))

    def quant(self, x: Iv, axis: int, low_unclamped: bool) -> Iv:
        return _quant_exact(x, axis, self.rule, low_unclamped) if self.fp32 else _quant_model(x, axis, self.rule)

    def exp2(self, x: Iv) -> Iv:
        """``2^x`` as a kernel computes it: x's fp32 rounding, ex2's error, FTZ."""
        x = x.widen(self.r(U32))
        p = exp2(x).widen(self.r(EXP2_REL))
        return Iv(np.where(self.fp32 & (p.lo < 2 * FLUSH), 0.0, np.maximum(p.lo, 0.0)), p.hi)

    def matmul(self, a: Iv, b: Iv) -> Iv:
        """A product with its own fp32 accumulation (no further sum)."""
        c, mag = iv_matmul(a, b)
        n = a.lo.shape[-1]
        return c.widen(abs=self.acc(n) * mag + self.acc_abs(n))

    def rounded(self, x: Iv) -> Iv:
        """The final rounding to the output dtype."""
        return x.widen(self.out_u, self.out_abs)


# ----------------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------------
def _weights(p: Iv, g, l_floor) -> tuple[Iv, Iv]:
    """Enclosure of ``w_j = p_j / (sum_k p_k (1 + theta))`` over members ``p >= 0`` of ``p`` and
    ``|theta| <= g`` (the sum's relative error), with the monotone form ``lo_j / (lo_j + sum_{k!=j} hi_k)
    .. hi_j / (hi_j + sum_{k!=j} lo_k)`` and ``w_j <= hi_j / l_floor`` (``l_floor``: a lower bound of the
    sum); and the enclosure of ``sum_j w_j = 1 / (1 + theta)``."""
    n = p.lo.shape[-1]
    e = (n + 4) * F64_U
    ls, hs = p.lo.sum(-1, keepdims=True), p.hi.sum(-1, keepdims=True)
    others_hi = (hs - p.hi) + e * hs
    others_lo = np.maximum((ls - p.lo) - e * ls, 0.0)
    den_lo, den_hi = p.lo + others_hi, p.hi + others_lo
    wlo = np.where(p.lo > 0, p.lo / np.where(den_lo > 0, den_lo, 1.0), 0.0) * (1 - 2 * SLACK) / (1 + g)
    whi = np.where(p.hi > 0, np.minimum(p.hi / np.where(den_hi > 0, den_hi, 1.0), 1.0), 0.0)
    whi = np.minimum(whi, p.hi / l_floor) * (1 + 2 * SLACK) / (1 - g)
    total = Iv((1 - 2 * SLACK) / (1 + g), (1 + 2 * SLACK) / (1 - g))
    return Iv(wlo, whi), total


def _combination(w: Iv, v: Iv, center: np.ndarray, vis, hull: bool) -> tuple[Iv, Iv | None, np.ndarray]:
    """Enclosure of ``sum_j w_j (v_j - center)`` (w >= 0 ``[H, lq, lk]``, v ``[H, lk, D]``, center
    ``[H, lq, D]``) with exact interval products, and ``sum_j w_hi |v_j|``; with ``hull`` also the
    enclosure ``[min_j v_lo, max_j v_hi]`` over row i's visible keys (intersected by the caller)."""
    H, lq, D = center.shape
    lo, hi, mag = np.empty((H, lq, D)), np.empty((H, lq, D)), w.hi @ v.mag
    hlo, hhi = np.empty((H, lq, D)), np.empty((H, lq, D))
    for h in range(H):
        wl, wh = w.lo[h][:, :, None], w.hi[h][:, :, None]
        dlo = v.lo[h][None] - center[h][:, None]
        dhi = v.hi[h][None] - center[h][:, None]
        lo[h] = (np.where(dlo >= 0, wl, wh) * dlo).sum(1)
        hi[h] = (np.where(dhi >= 0, wh, wl) * dhi).sum(1)
        if hull:
            seen = vis[min(h, vis.shape[0] - 1)][:, :, None]
            hlo[h] = np.where(seen, v.lo[h][None], np.inf).min(1)
            hhi[h] = np.where(seen, v.hi[h][None], -np.inf).max(1)
    n = w.lo.shape[-1]
    err = (n + 4) * F64_U * (mag + w.hi.sum(-1, keepdims=True) * np.abs(center))
    return Iv.outward(lo, hi, err), (Iv(hlo, hhi) if hull else None), mag


def _forward_seq(m: _Model, qd: Iv, kd: Iv, vt: Iv, vis: np.ndarray, c: float):
    """Enclosures of (out ``[H, lq, D]``, lse ``[H, lq]``) of one sequence; the operands already quantized
    (intervals), ``vis`` ``[H or 1, lq, lk]``. P is normalized to the reference maximum
    ``M = ceil(max_j t_hi)``: by power-of-two equivariance a kernel's (or the oracle's) P^ with its own
    maximum M' <= M is the normalized one scaled by 2^(M - M'), so out and lse are the same functions of
    it; only the lower clamp of P's scales depends on M', which ``low_unclamped`` leaves open."""
    H, lq, lk = qd.lo.shape[0], qd.lo.shape[1], kd.lo.shape[1]
    vis = np.broadcast_to(vis, (H, lq, lk))
    t = (m.matmul(qd, kd.tr()) * Iv(c)).widen(m.r(T_REL))
    seen = vis.any(-1, keepdims=True)
    mref = np.where(seen, np.ceil(np.where(vis, t.hi, -np.inf).max(-1, keepdims=True, initial=-np.inf)), 0.0)
    mref = np.where(np.isfinite(mref), mref, 0.0)
    # a floor under l that no element interval gives: the row maximum's own P^ is above 0.437 (7/16 less
    # fp32 noise) of 2^(M' - M) for any M' >= ceil(max_j t_lo) (its p exceeds 1/2, an amax element loses
    # at most 2^-3), and the exact sum of p exceeds 2^(max_j t_lo - M)
    mlo = np.ceil(np.where(vis, t.lo, -np.inf).max(-1, keepdims=True, initial=-np.inf))
    l_floor = np.where(seen & np.isfinite(mlo), 0.437 * np.exp2(np.where(seen, mlo - mref, 0.0)), TINY)
    l_floor = np.maximum(l_floor * (1 - 2 * SLACK), TINY)
    x = Iv(np.where(vis, t.lo - mref, 0.0), np.where(vis, np.minimum(t.hi - mref, 0.0), 0.0))
    p = m.exp2(Iv.outward(x.lo, x.hi)).where(vis)
    ph = m.quant(p, -1, low_unclamped=True)
    g = m.acc(lk) + (lk + 4) * F64_U
    w, total = _weights(ph, g, l_floor)
    l_iv = Iv(np.maximum(ph.lo.sum(-1) * (1 - g), l_floor[..., 0] * (1 - g)),
              ph.hi.sum(-1) * (1 + g)).widen(abs=m.acc_abs(lk))
    center = (w.mid @ vt.mid) / np.where(w.mid.sum(-1, keepdims=True) > 0, w.mid.sum(-1, keepdims=True), 1.0)
    comb, hull, mag = _combination(w, vt, center, vis, hull=not m.fp32)
    out = Iv(center) * total + comb
    if m.fp32:  # the kernel's accumulation error (divided by l) and its division
        l_lo = np.maximum(l_iv.lo, TINY)[..., None]
        out = out.widen(abs=m.acc(lk) * mag + m.acc_abs(lk) / l_lo).widen(DIV_REL)
        out = m.rounded(out)
    else:  # every member is a convex combination of V rows
        out = Iv(np.maximum(out.lo, hull.lo), np.minimum(out.hi, hull.hi))
    out = out.where(seen)
    log2l = Iv(np.log2(np.maximum(l_iv.lo, TINY)), np.log2(np.maximum(l_iv.hi, TINY))).widen(abs=TINY)
    lse = (log2l + Iv(mref[..., 0])) * Iv(LN2)
    if m.fp32:
        lse = lse.widen(LSE_REL, LN2 * (LG2_ABS + U32 * log2l.mag))
    lse = Iv(np.where(seen[..., 0], lse.lo, -np.inf), np.where(seen[..., 0], lse.hi, -np.inf))
    return out, lse, {"p": p, "ph": ph, "w": w, "total": total, "l_floor": l_floor}


# ----------------------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------------------
def _intersect(a: Iv, b: Iv) -> Iv:
    return Iv(np.maximum(a.lo, b.lo), np.minimum(a.hi, b.hi))


def _own_softmax(m: _Model, fwd: dict, t: Iv, lse2: Iv) -> Iv:
    """Bound (b), a backward at the oracle's own lse: ``P_j = p_j / (P^_j + R_j)`` (``R_j = sum_{k!=j} P^_k``)
    with ``P^_j`` within the model of ``p_j``: the lower end ``p/(p (1 + rel) + a + R_hi)`` is increasing
    in p; the upper ``p / (R_lo + max(0, p (1 - rel) - a))`` is monotone on either side of its kink, so its
    maximum is at an end or the kink. Widened for the float64 rounding of ``exp2(t - lse/ln2)``."""
    p, ph = fwd["p"], fwd["ph"]
    rel, a = _model_terms(p, -1, m.rule)
    n = p.lo.shape[-1]
    e = (n + 4) * F64_U
    ls, hs = ph.lo.sum(-1, keepdims=True), ph.hi.sum(-1, keepdims=True)
    r_hi = (hs - ph.hi) + e * hs
    r_lo = np.maximum((ls - ph.lo) - e * ls, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lo = np.where(p.lo > 0, p.lo / (p.lo * (1 + rel) + a + r_hi), 0.0)
        kink = np.clip(a / (1 - rel), p.lo, p.hi)
        ups = [np.where(x > 0, x / (r_lo + np.maximum(0.0, x * (1 - rel) - a)), 0.0) for x in (p.lo, p.hi, kink)]
        hi = np.minimum(np.maximum(np.maximum(ups[0], ups[1]), ups[2]),
                        np.where(p.hi > 0, p.hi / np.maximum(ph.lo + r_lo, fwd["l_floor"]), 0.0))
    hi = np.where(np.isnan(hi), np.inf, hi)
    f64 = (t.mag + lse2.mag[..., None] + 8) * 2 * F64_U
    return Iv(lo * (1 - f64 - SLACK), hi * (1 + f64 + SLACK))


def _own_delta(fwd: dict, vt: Iv, dout: np.ndarray, out: Iv) -> Iv:
    """Bound (b): ``Delta_i = dO_i . out_i = sum_j w_ij (dO_i . V^_j)`` at the oracle's own out, enclosed as
    a weighted combination of the scalars ``u_ij = dO_i . V^_j`` (exact interval products, centered)."""
    w, total = fwd["w"], fwd["total"]
    u, umag = iv_matmul(Iv(dout), vt.tr())                                  # [H, lq, lk]
    wsum = w.mid.sum(-1, keepdims=True)
    cu = (w.mid * u.mid).sum(-1, keepdims=True) / np.where(wsum > 0, wsum, 1.0)
    dlo, dhi = u.lo - cu, u.hi - cu
    lo = (np.where(dlo >= 0, w.lo, w.hi) * dlo).sum(-1)
    hi = (np.where(dhi >= 0, w.hi, w.lo) * dhi).sum(-1)
    n, D = w.lo.shape[-1], dout.shape[-1]
    err = (n + D + 8) * F64_U * ((w.hi * umag).sum(-1) + w.hi.sum(-1) * np.abs(cu[..., 0])
                                 + (np.abs(dout) * out.mag).sum(-1))
    return Iv(cu[..., 0]) * total + Iv.outward(lo, hi, err)


def _backward_seq(m: _Model, ops: dict, out: Iv, lse: Iv, dout: np.ndarray, dlse: np.ndarray, vis, c: float,
                  fwd: dict | None):
    """Enclosures of one sequence's per-head products ``(dS^k K^, dS^q^T Q^, P^q^T dO^)`` (heads layout,
    before the softmax scale and the sums over heads/sequences), each with its magnitude. ``out`` and
    ``lse``: enclosures of the forward's stored outputs (``[H, lq, D]``, ``[H, lq]``), ``dout`` and ``dlse``
    the unquantized values. ``fwd`` (bound (b) only): the forward's softmax enclosures, for a backward at
    the oracle's own out and lse (P and Delta then also enclosed through them, intersected)."""
    rows = np.isfinite(lse.lo) & np.isfinite(lse.hi)
    vis = vis & rows[..., None]
    t = (m.matmul(ops["qd"], ops["kd"].tr()) * Iv(c)).widen(m.r(T_REL))
    lse2 = (Iv(np.where(rows, lse.lo, 0.0), np.where(rows, lse.hi, 0.0)) * Iv(LOG2E)).widen(m.r(T_REL))
    x = t - Iv(lse2.lo[..., None], lse2.hi[..., None])
    p = m.exp2(x.where(vis)).where(vis)
    if fwd is not None:
        p = _intersect(p, _own_softmax(m, fwd, t, lse2).where(vis))
    pq = m.quant(p, -2, low_unclamped=False)
    dp = m.matmul(ops["dod"], ops["vd"].tr())
    dmid = (dout * out.mid).sum(-1)
    dmag = (np.abs(dout) * out.mag).sum(-1)
    D = dout.shape[-1]
    delta = Iv.outward(dmid, dmid, (np.abs(dout) * out.rad).sum(-1) * (1 + SLACK) + (D + 4) * F64_U * dmag
                       + m.acc(D + 1) * dmag + m.acc_abs(D))
    if fwd is not None:
        delta = _intersect(delta, _own_delta(fwd, ops["vt"], dout, out))
    delta = (delta - Iv(dlse)).widen(m.r(U32))
    diff = (dp - Iv(delta.lo[..., None], delta.hi[..., None])).widen(m.r(U32))
    ds = (p * diff).widen(m.r(U32), 2 * FLUSH if m.fp32 else 0.0).where(vis)
    dsk, dsq = m.quant(ds, -1, low_unclamped=False), m.quant(ds, -2, low_unclamped=False)
    return iv_matmul(dsk, ops["kt"]), iv_matmul(dsq.tr(), ops["qt"]), iv_matmul(pq.tr(), ops["dot"])


class _Sum:
    """A gradient's enclosure summed over sequences and heads, with the magnitude and the number of product
    terms per row (the fp32 accumulation error of any summation order is relative to both)."""

    def __init__(self, shape):
        self.lo, self.hi, self.mag = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.terms = np.zeros(shape[0])

    def add(self, rows: slice, part: tuple[Iv, np.ndarray], n: int, group: int) -> None:
        iv, mag = part
        self.lo[rows] += _ungroup(_rows(iv.lo), group)
        self.hi[rows] += _ungroup(_rows(iv.hi), group)
        self.mag[rows] += _ungroup(_rows(mag), group)
        self.terms[rows] += n * group

    def result(self, m: _Model, scale: float) -> Iv:
        n = self.terms[:, None, None]
        err = (m.acc(n) + (n + 4) * F64_U) * self.mag + m.acc_abs(n)
        return m.rounded((Iv.outward(self.lo, self.hi, err) * Iv(scale)).widen(m.r(U32)))


# ----------------------------------------------------------------------------------------------------
# both passes over a batch
# ----------------------------------------------------------------------------------------------------
def _enclose(m: _Model, q, k, v, dout, dlse, cu_q, cu_k, lq_bcast, scale, causal, window, backward) -> dict:
    """Enclosures (lo, hi) of out, lse and (``backward``) dq, dk, dv under model ``m``."""
    total_out, H, D = int(cu_q[-1]), q.shape[1], q.shape[2]
    group = H // k.shape[1]
    c = scale * LOG2E
    out_lo, out_hi = np.zeros((total_out, H, D)), np.zeros((total_out, H, D))
    lse_lo, lse_hi = np.full((total_out, H), -np.inf), np.full((total_out, H), -np.inf)
    seqs = []
    for b in range(cu_k.shape[0] - 1):
        qs, oq, ks = _seq_rows(b, cu_q, cu_k, lq_bcast)
        lq, lk = qs.stop - qs.start, ks.stop - ks.start
        if lq == 0 or lk == 0:
            continue
        qh, kh, vh = _heads(q[qs]), _heads(k[ks]), _heads(v[ks])
        ops = {"qd": m.operand(qh, -1), "kd": m.operand(kh, -1).group(group), "vt": m.operand(vh, -2).group(group)}
        vis = _visible(lq, lk, causal, window)[None]
        o, l, fwd = _forward_seq(m, ops["qd"], ops["kd"], ops["vt"], vis, c)
        out_lo[oq], out_hi[oq], lse_lo[oq], lse_hi[oq] = _rows(o.lo), _rows(o.hi), l.lo.T, l.hi.T
        seqs.append((qs, oq, ks, qh, kh, vh, ops, vis, None if m.fp32 else fwd))
    res = {"out": Iv(out_lo, out_hi), "lse": Iv(lse_lo, lse_hi)}
    if not backward:
        return res
    dq, dk, dv = _Sum(q.shape), _Sum(k.shape), _Sum(v.shape)
    for qs, oq, ks, qh, kh, vh, ops, vis, fwd in seqs:
        doh = _heads(dout[oq])
        ops.update(qt=m.operand(qh, -2), kt=m.operand(kh, -2).group(group), vd=m.operand(vh, -1).group(group),
                   dod=m.operand(doh, -1), dot=m.operand(doh, -2))
        o = Iv(_heads(out_lo[oq]), _heads(out_hi[oq]))
        ls = Iv(lse_lo[oq].T, lse_hi[oq].T)
        pq, pk, pv = _backward_seq(m, ops, o, ls, doh, dlse[oq].T, vis, c, fwd)
        lq, lk = qs.stop - qs.start, ks.stop - ks.start
        dq.add(qs, pq, lk, 1)
        dk.add(ks, pk, lq, group)
        dv.add(ks, pv, lq, group)
    res.update(dq=dq.result(m, scale), dk=dk.result(m, scale), dv=dv.result(m, 1.0))
    return res


def _inputs(q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, rule, softmax_scale, broadcast_q, window, backward):
    _check_rule(rule)
    window = _window(window)
    q, k, v, cu_q, cu_k, lq_bcast, scale = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, broadcast_q)
    total_out, H, D = int(cu_q[-1]), q.shape[1], q.shape[2]
    if backward:
        if dout is None:
            raise ValueError("dout: required with backward=True")
        dout = _as_f64(dout, "dout", 3)
        dlse = np.zeros((total_out, H)) if dlse is None else _as_f64(dlse, "dlse", 2)
        for name, a, shape in (("dout", dout, (total_out, H, D)), ("dlse", dlse, (total_out, H))):
            if a.shape != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
    return q, k, v, dout, dlse, cu_q, cu_k, lq_bcast, scale, window


def _about(iv: Iv, center: np.ndarray) -> np.ndarray:
    """The largest distance from ``center`` to a member of ``iv`` (0 where both are -inf: empty rows)."""
    with np.errstate(invalid="ignore"):
        d = np.maximum(iv.hi - center, center - iv.lo)
    return np.where(np.isfinite(center), np.maximum(d, 0.0), 0.0)


def _width(iv: Iv) -> np.ndarray:
    return np.maximum(iv.hi - iv.lo, 0.0)


def kernel_tolerance(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, *, rule, causal, softmax_scale, broadcast_q,
                     out_dtype="bfloat16", window=(-1, -1), dlse=None, backward=True) -> dict[str, np.ndarray]:
    """Bound (a): per-element tolerances for a kernel against the MX oracle (docs/mxfp8.md section 3).

    Guarantee, for a kernel that implements section 2 with fp32 intermediates within the error model of
    this module's constants (from the same original inputs; its outputs and gradients rounded to
    ``out_dtype``, lse stored in fp32):

    - ``|out_kernel - out_mx| <= tol["out"]`` and, on rows with a finite lse, ``|lse_kernel - lse_mx| <=
      tol["lse"]`` (``mx_forward``; both lse are -inf on the other rows, where ``tol`` is 0);
    - ``|dX_kernel - dX_mx| <= tol["dX"]`` for X = q, k, v, where the kernel's backward used its own stored
      out and lse and ``mx_backward`` either the oracle's (``mx_forward``'s) or the kernel's: the tolerance is
      the width of the enclosure of every conforming stored out/lse and backward (so it also covers two
      conforming kernels against each other).

    Keys ``out``, ``lse`` and with ``backward`` ``dq``, ``dk``, ``dv``, shaped like those outputs.
    """
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: must be one of {tuple(OUT_DTYPES)}, got {out_dtype!r}")
    q, k, v, dout, dlse, cu_q, cu_k, lq_bcast, scale, window = _inputs(
        q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, rule, softmax_scale, broadcast_q, window, backward)
    m = _Model(rule, True, *OUT_DTYPES[out_dtype])
    enc = _enclose(m, q, k, v, dout, dlse, cu_q, cu_k, lq_bcast, scale, causal, window, backward)
    out, lse = mx_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, rule=rule, causal=causal, softmax_scale=scale,
                          broadcast_q=broadcast_q, window=window)
    tol = {"out": _about(enc["out"], out), "lse": _about(enc["lse"], lse)}
    if backward:
        tol.update({name: _width(enc[name]) for name in ("dq", "dk", "dv")})
    # an enclosure reaching past the dtype's largest finite value may round to +-inf there (fp16's 65504):
    # an infinite result is then correct rounding, so the tolerance is infinite
    limit = OVERFLOW[out_dtype]
    for name, iv in enc.items():
        if name in tol and name != "lse":
            tol[name] = np.where(np.maximum(np.abs(iv.lo), np.abs(iv.hi)) >= limit, np.inf, tol[name])
    return tol


def apriori_bound(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, *, rule, causal, softmax_scale, broadcast_q,
                  window=(-1, -1), dlse=None, backward=True) -> dict[str, np.ndarray]:
    """Bound (b): per-element bounds on the MX oracle's distance from exact attention (docs/mxfp8.md
    section 3), computed from the inputs with the MX rounding model.

    Guarantee: ``|mx_forward - attention_forward| <= B["out"]`` (and ``lse`` on rows with a finite lse; 0
    elsewhere, both -inf), and ``|mx_backward(out_mx, lse_mx) - attention_backward(out, lse)| <= B["dX"]``
    for X = q, k, v, every function on the original ``q, k, v, dout`` and each backward at its own forward's
    out and lse. ``B`` is the largest distance from the exact value to a member of an enclosure that holds
    every MX oracle result the rounding model allows (the exact one among them).
    """
    q, k, v, dout, dlse, cu_q, cu_k, lq_bcast, scale, window = _inputs(
        q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, rule, softmax_scale, broadcast_q, window, backward)
    m = _Model(rule, False)
    enc = _enclose(m, q, k, v, dout, dlse, cu_q, cu_k, lq_bcast, scale, causal, window, backward)
    kw = dict(causal=causal, softmax_scale=scale, broadcast_q=broadcast_q, window=window)
    out, lse = attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)
    bound = {"out": _about(enc["out"], out), "lse": _about(enc["lse"], lse)}
    if backward:
        grads = attention_backward(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, dlse=dlse, **kw)
        bound.update({name: _about(enc[name], g) for name, g in zip(("dq", "dk", "dv"), grads)})
    return bound
