"""Sliding windows as a band of visible keys, shared by every backend: the host's description of a call's
window (``window_band``) and the kernels' per-sequence offsets (``band_offsets``).

Row i of a sequence with lengths (Lq, Lk) sees key j iff ``band_lo <= j - i - (Lk - Lq) <= band_hi``
(bottom-right aligned, FlashAttention's ``window_size``): causal is the band ``(-inf, 0]``, a window
``(left, right)`` is ``[-left, right]``, -1 meaning unbounded.
"""
from __future__ import annotations

import triton
import triton.language as tl

UNBOUNDED = 1 << 30  # a window side that is not there (kernels clamp it to the sequence)


def window_band(causal: bool, window) -> tuple[bool, bool, int, int]:
    """(CAUSAL, WINDOW, band_lo, band_hi) of a call: whether it is causal, whether it needs the general
    band (a left window, or a right one that is not the causal diagonal), and the band's offsets: row i
    of a sequence with lengths (Lq, Lk) sees key j iff band_lo <= j - i - (Lk - Lq) <= band_hi (causal:
    band_hi 0; unbounded sides: +-UNBOUNDED). The window (-1, 0), no key past the diagonal and none
    bounded on the left, is causal: it comes back CAUSAL without WINDOW, so it runs the causal kernels."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right == 0:
        return True, False, -UNBOUNDED, 0
    band = left >= 0 or right >= 0
    return causal, band, -left if left >= 0 else -UNBOUNDED, right if right >= 0 else UNBOUNDED


@triton.jit
def band_offsets(len_q, len_k, band_lo, band_hi):
    """(lo, hi): row i sees key j iff lo <= j - i <= hi, for a sequence with lengths (len_q, len_k) and the
    window band of ``window_band`` (bottom-right aligned), clamped to [-len_q - 1, len_k] so that sums
    with row and key indices stay within int32."""
    shift = (len_k - len_q).to(tl.int64)
    lo = tl.minimum(tl.maximum(shift + band_lo, -len_q.to(tl.int64) - 1), len_k.to(tl.int64)).to(tl.int32)
    hi = tl.minimum(tl.maximum(shift + band_hi, -len_q.to(tl.int64) - 1), len_k.to(tl.int64)).to(tl.int32)
    return lo, hi


