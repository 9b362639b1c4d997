"""Global memory of a launch: the byte ranges of its tensors, pointer-access checks, and TMA boxes.

Every tensor argument of the launch (and every TMA descriptor's base tensor) is a ``Region``: the
bytes from its first to its last element. A pointer load, store or atomic whose unmasked addresses
leave the union of the regions is an OutOfBoundsError naming the address, the nearest tensor and the
kernel line. TMA boxes are read and written through numpy views of the regions (zero fill past the
descriptor's shape, as TMA does); a box whose in-bounds part leaves the descriptor's tensor is an
OutOfBoundsError too.
"""
from __future__ import annotations

import bisect
import ctypes

import numpy as np
import triton.language as tl

from .errors import OutOfBoundsError, ProtocolError
from .values import f32_to_bf16_bits, np_dtype, to_f32


class Region:
    __slots__ = ("name", "start", "end", "desc", "_buf")

    def __init__(self, name, start, end, desc):
        self.name, self.start, self.end, self.desc = name, start, end, desc
        self._buf = None

    def buffer(self) -> np.ndarray:
        if self._buf is None:
            self._buf = np.ctypeslib.as_array((ctypes.c_uint8 * (self.end - self.start)).from_address(self.start))
        return self._buf


def _tensor_region(name, t) -> Region | None:
    if t.numel() == 0:
        return None
    es = t.element_size()
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    lo = t.data_ptr() + min(0, span) * es
    hi = t.data_ptr() + max(0, span) * es + es
    desc = f"{name} ({str(t.dtype).replace('torch.', '')}{list(t.shape)})"
    return Region(name, lo, hi, desc)


class MemoryMap:
    """The tensors of one launch."""

    def __init__(self, named_tensors):
        self.regions = []
        for name, t in named_tensors:
            r = _tensor_region(name, t)
            if r is not None:
                self.regions.append(r)
        spans = sorted((r.start, r.end) for r in self.regions)
        merged = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self._by_start = sorted(self.regions, key=lambda r: (r.start, -r.end))
        self._by_name = {r.name: r for r in self.regions}

    def region_of(self, addr: int, name: str = None):
        """The region of the tensor ``name`` when it holds ``addr`` (views of one storage, such as q, k and v
        of a fused projection, overlap: the descriptor's own tensor decides), else the smallest one that does."""
        own = self._by_name.get(name)
        if own is not None and own.start <= addr < own.end:
            return own
        best = None
        for r in self.regions:
            if r.start <= addr < r.end and (best is None or r.end - r.start < best.end - best.start):
                best = r
        return best

    def contains(self, lo: int, hi: int) -> bool:
        """Is every byte of [lo, hi) inside one merged run of tensors?"""
        i = bisect.bisect_right(self.starts, lo) - 1
        return i >= 0 and hi <= self.ends[i]

    def describe_address(self, addr: int) -> str:
        if not self.regions:
            return f"0x{addr:x} (the launch has no tensor arguments)"
        best = None
        for r in self.regions:
            d = r.start - addr if addr < r.start else (addr - r.end + 1 if addr >= r.end else 0)
            if best is None or d < best[0]:
                best = (d, r)
        d, r = best
        if addr < r.start:
            rel = f"{r.start - addr} bytes before the start of {r.desc}"
        elif addr >= r.end:
            rel = f"{addr - r.end} bytes past the end of {r.desc}"
        else:
            rel = f"inside {r.desc}"
        return f"0x{addr:x}, {rel} (bytes 0x{r.start:x}..0x{r.end:x})"

    def check(self, addrs: np.ndarray, itemsize: int, what: str, site) -> None:
        """Raise OutOfBoundsError unless every address (already masked) lies inside the launch's tensors."""
        if addrs.size == 0:
            return
        lo = int(addrs.min())
        hi = int(addrs.max()) + itemsize
        if self.contains(lo, hi):
            return
        flat = addrs.reshape(-1).astype(np.uint64)
        starts = np.array(self.starts, dtype=np.uint64)
        ends = np.array(self.ends, dtype=np.uint64)
        k = np.searchsorted(starts, flat, side="right").astype(np.int64) - 1
        ok = (k >= 0) & (flat + np.uint64(itemsize) <= ends[np.maximum(k, 0)])
        if ok.all():
            return
        bad = flat[~ok]
        raise OutOfBoundsError(
            f"{what} touches {bad.size} of {flat.size} unmasked elements outside every tensor of the launch",
            site=site,
            sections=[("first address outside", [self.describe_address(int(bad[0]))]),
                      ("tensors of the launch", [f"{r.desc}: 0x{r.start:x}..0x{r.end:x}" for r in self._by_start])],
            hint="check the offsets and the mask of this access (a row past the sequence, a head past H, ...)")


class Descriptor:
    """A TMA descriptor of the interpreter (``TensorDescHandle``) resolved against the launch's tensors."""

    __slots__ = ("handle", "name", "base", "shape", "strides", "block", "dtype", "np_dtype", "itemsize", "region")

    def __init__(self, handle, name, memory: MemoryMap):
        self.handle, self.name = handle, name
        self.base = int(handle.base.data.item())
        self.shape = [int(s.data.item()) for s in handle.shape]
        self.strides = [int(s.data.item()) if hasattr(s, "data") else int(s) for s in handle.strides]
        self.block = [int(b) for b in handle.block_shape]
        self.dtype = handle.base.dtype.element_ty
        self.np_dtype = np_dtype(self.dtype)
        self.itemsize = max(1, self.dtype.primitive_bitwidth // 8)
        self.region = memory.region_of(self.base, name)

    @property
    def box_bytes(self) -> int:
        return int(np.prod(self.block)) * self.itemsize

    def _inbounds(self, offsets):
        """(per-dim [lo, hi) in the tensor, per-dim [lo, hi) in the box) of the box's in-bounds part."""
        t_rng, b_rng = [], []
        for o, b, n in zip(offsets, self.block, self.shape):
            lo, hi = max(0, o), min(n, o + b)
            if lo >= hi:
                return None
            t_rng.append((lo, hi))
            b_rng.append((lo - o, hi - o))
        return t_rng, b_rng

    def _view(self, t_rng, what, offsets, site) -> np.ndarray:
        first = self.base + sum(lo * st for (lo, _), st in zip(t_rng, self.strides)) * self.itemsize
        last = self.base + sum((hi - 1) * st for (_, hi), st in zip(t_rng, self.strides)) * self.itemsize
        r = self.region
        if r is None or first < r.start or last + self.itemsize > r.end:
            raise OutOfBoundsError(
                f"{what} of {self.name} at {list(offsets)} (box {self.block}) reaches outside the descriptor's tensor",
                site=site,
                sections=[("descriptor", [f"{self.name}: shape {self.shape}, strides {self.strides}, box {self.block}, "
                                          f"base 0x{self.base:x}"]),
                          ("tensor", [r.desc + f": 0x{r.start:x}..0x{r.end:x}" if r else "no tensor of the launch "
                                      "contains the descriptor's base address"]),
                          ("box bytes", [f"0x{first:x}..0x{last + self.itemsize:x}"])])
        shape = [hi - lo for lo, hi in t_rng]
        strides = [st * self.itemsize for st in self.strides]
        return np.ndarray(shape, dtype=self.np_dtype, buffer=r.buffer(), offset=first - r.start, strides=strides)

    def check_box(self, offsets, what, site) -> None:
        """Raise OutOfBoundsError if the in-bounds part of the box at ``offsets`` leaves the tensor."""
        rng = self._inbounds(offsets)
        if rng is not None:
            self._view(rng[0], what, offsets, site)

    def load_box(self, offsets, site) -> np.ndarray:
        """The box at ``offsets`` as TMA delivers it: zeros past the descriptor's shape."""
        box = np.zeros(self.block, dtype=self.np_dtype)
        rng = self._inbounds(offsets)
        if rng is not None:
            t_rng, b_rng = rng
            box[tuple(slice(a, b) for a, b in b_rng)] = self._view(t_rng, "TMA load", offsets, site)
        return box

    def store_box(self, offsets, data: np.ndarray, reduce: str, site) -> None:
        """Write (or reduce into) the in-bounds part of the box at ``offsets``."""
        rng = self._inbounds(offsets)
        if rng is None:
            return
        t_rng, b_rng = rng
        dst = self._view(t_rng, "TMA store", offsets, site)
        src = data[tuple(slice(a, b) for a, b in b_rng)]
        if not reduce:
            dst[...] = src
        else:
            dst[...] = reduce_values(reduce, dst, src, self.dtype, site)


def reduce_values(op: str, dst: np.ndarray, src: np.ndarray, dtype, site) -> np.ndarray:
    """TMA's reduce: ``op`` of the destination and the source, in the destination's type (floats
    computed in float32 and rounded to nearest even: exact for fp32, correctly rounded for fp16 and bf16)."""
    if dtype.is_floating():
        if op not in ("add", "min", "max"):
            raise ProtocolError(f"TMA store_reduce={op!r} is not defined for {dtype}", site=site)
        a, b = to_f32(dst, dtype), to_f32(src, dtype)
        out = a + b if op == "add" else (np.minimum(a, b) if op == "min" else np.maximum(a, b))
        if dtype == tl.float32:
            return out
        if dtype == tl.bfloat16:
            return f32_to_bf16_bits(out)
        if dtype == tl.float16:
            return out.astype(np.float16)
        raise ProtocolError(f"TMA store_reduce on {dtype} is not simulated", site=site)
    fn = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
          "xor": np.bitwise_xor}.get(op)
    if fn is None:
        raise ProtocolError(f"TMA store_reduce={op!r} is not one of add, min, max, and, or, xor", site=site)
    return fn(dst, src).astype(dst.dtype)
