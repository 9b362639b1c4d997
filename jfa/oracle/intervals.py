"""Interval enclosures in float64 NumPy: the arithmetic of the MXFP8 error bounds (jfa.oracle.mx_bounds).

An :class:`Iv` is an elementwise enclosure ``[lo, hi]``. Every operation rounds outward (relative slack
:data:`SLACK` per operation, ``(n + 4) 2^-52`` of the magnitude for an n-term sum), so an enclosure computed
here holds the exact value and every float64 evaluation of it.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Iv", "iv_matmul", "exp2", "gamma", "row_max", "SLACK", "F64_U", "TINY"]

SLACK = 2.0 ** -45  # relative widening per float64 operation (float64 rounds at 2^-53)
F64_U = 2.0 ** -52
TINY = 1e-300       # an absolute widening that keeps zero-width enclosures of 0 honest


class Iv:
    """Elementwise enclosure ``lo <= x <= hi`` (float64 arrays broadcast to one shape)."""
    __slots__ = ("lo", "hi")

    def __init__(self, lo, hi=None):
        self.lo = np.asarray(lo, dtype=np.float64)
        self.hi = self.lo if hi is None else np.asarray(hi, dtype=np.float64)

    @staticmethod
    def outward(lo, hi, err=0.0) -> "Iv":
        """``[lo - err, hi + err]`` widened by one float64 rounding."""
        lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
        return Iv(lo - (err + SLACK * np.abs(lo) + TINY), hi + (err + SLACK * np.abs(hi) + TINY))

    @property
    def mid(self):
        return 0.5 * self.lo + 0.5 * self.hi

    @property
    def rad(self):
        m = self.mid
        return np.maximum(self.hi - m, m - self.lo) * (1 + SLACK)

    @property
    def mag(self):
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    def widen(self, rel=0.0, abs=0.0) -> "Iv":
        """Every value within ``rel * |x| + abs`` of a member (``rel`` relative to the interval's magnitude)."""
        return Iv.outward(self.lo, self.hi, rel * self.mag + abs)

    def __add__(self, o) -> "Iv":
        o = o if isinstance(o, Iv) else Iv(o)
        return Iv.outward(self.lo + o.lo, self.hi + o.hi)

    def __sub__(self, o) -> "Iv":
        o = o if isinstance(o, Iv) else Iv(o)
        return Iv.outward(self.lo - o.hi, self.hi - o.lo)

    def __mul__(self, o) -> "Iv":
        o = o if isinstance(o, Iv) else Iv(o)
        c = np.stack(np.broadcast_arrays(self.lo * o.lo, self.lo * o.hi, self.hi * o.lo, self.hi * o.hi))
        return Iv.outward(c.min(0), c.max(0))

    def where(self, mask, other=0.0) -> "Iv":
        return Iv(np.where(mask, self.lo, other), np.where(mask, self.hi, other))

    def tr(self) -> "Iv":
        """The last two axes swapped."""
        return Iv(np.swapaxes(self.lo, -1, -2), np.swapaxes(self.hi, -1, -2))

    def group(self, g: int) -> "Iv":
        """Heads axis 0 repeated ``g`` times per head (GQA)."""
        return Iv(np.repeat(self.lo, g, axis=0), np.repeat(self.hi, g, axis=0)) if g > 1 else self


def iv_matmul(a: Iv, b: Iv) -> tuple[Iv, np.ndarray]:
    """Enclosure of ``a_ @ b_`` for every ``a_`` in ``a`` and ``b_`` in ``b`` (exact arithmetic; midpoint-radius:
    ``|a_mid| b_rad + a_rad |b_mid| + a_rad b_rad``), and the magnitude ``|a| @ |b|`` that bounds
    ``sum_k |a_k b_k|`` (what an accumulation error is relative to)."""
    am, bm, ar, br = a.mid, b.mid, a.rad, b.rad
    mid = am @ bm
    rad = np.zeros(mid.shape)
    if ar.any():
        rad = rad + ar @ np.abs(bm)
    if br.any():
        rad = rad + np.abs(am) @ br + (ar @ br if ar.any() else 0.0)
    mag = a.mag @ b.mag
    n = a.lo.shape[-1]
    return Iv.outward(mid, mid, rad * (1 + SLACK) + (n + 4) * F64_U * mag), mag


def exp2(x: Iv) -> Iv:
    """Enclosure of ``2^x``."""
    return Iv(np.exp2(x.lo) * (1 - SLACK), np.exp2(x.hi) * (1 + SLACK))


def gamma(n, u: float):
    """``n u / (1 - n u)``: the relative error bound of an n-term sum with unit roundoff ``u``."""
    nu = np.asarray(n, dtype=np.float64) * u
    return np.where(nu < 0.5, nu / (1 - nu), np.inf)


def row_max(x) -> np.ndarray:
    """``[rows, H, D] -> [rows, H]``: the maximum over the head dim (e.g. a per-row tolerance)."""
    x = np.asarray(x, dtype=np.float64)
    return x.max(axis=-1, initial=0.0) if x.ndim == 3 else x
