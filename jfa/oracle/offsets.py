"""The oracle's one check of offset arrays (NumPy; shared by attention, block selection and the MX
quantizer)."""
from __future__ import annotations

from typing import Optional

import numpy as np


def as_offsets(cu, name: str, total: Optional[int] = None) -> np.ndarray:
    """``cu`` as int64 offsets: 1-D with B+1 >= 1 integer entries, first 0, non-decreasing, and (with
    ``total``) last equal to it; else a ValueError naming ``name`` and the rule."""
    a = np.asarray(cu)
    if a.ndim != 1 or a.shape[0] < 1:
        raise ValueError(f"{name}: expected a 1-D array of B+1 >= 1 offsets, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name}: offsets must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a[0] != 0:
        raise ValueError(f"{name}: first offset must be 0, got {int(a[0])}")
    if np.any(np.diff(a) < 0):
        raise ValueError(f"{name}: offsets must be non-decreasing")
    if total is not None and a[-1] != total:
        raise ValueError(f"{name}: last offset must equal the token count {total}, got {int(a[-1])}")
    return a
