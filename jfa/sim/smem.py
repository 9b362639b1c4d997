"""Shared memory: allocations, views, and the shadow state that checks every access.

``tlx.local_alloc(shape, dtype, num)`` is a ``SharedAlloc`` of ``num`` buffers (slots). Indexing,
``local_view``, ``local_slice`` and ``local_trans`` make ``View``s: a slot, a box inside it (half-open
ranges per dimension, in the slot's own coordinates) and a dimension permutation. An out-of-range slot
index forms a view (an address is legal to compute) that raises OutOfBoundsError when touched.

Each slot keeps its shadow: which elements have ever been written, the access records since the last
covering write, and the TMA loads in flight into it. Every access is checked against them:

* read:  no TMA load in flight into the box; every overlapping write happens-before the reader
         (RaceError); the async proxy (wgmma, TMA store) reads no generic-proxy store that no
         ``fence_async_shared`` ordered (ProxyRaceError); every element has been written
         (UninitialisedReadError);
* write: no overlapping async read in flight (a wgmma or TMA store still reading); every overlapping
         read and write happens-before the writer (RaceError); no other TMA load in flight into it.

A write that covers earlier records retires them (they were checked against it, and happens-before is
transitive), so the record lists stay short.
"""
from __future__ import annotations

import numpy as np

from . import source
from .errors import OutOfBoundsError, ProtocolError, ProxyRaceError, RaceError, UninitialisedReadError
from .sync import hb
from .values import as_int, np_dtype, poison_value


def _overlap(a, b) -> bool:
    for (a0, a1), (b0, b1) in zip(a, b):
        if a0 >= b1 or b0 >= a1:
            return False
    return True


def _covers(outer, inner) -> bool:
    for (o0, o1), (i0, i1) in zip(outer, inner):
        if i0 < o0 or i1 > o1:
            return False
    return True


def _box_str(box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


class Access:
    """One access record: who (agent, clock, label) did what, where, and whether it is still in flight."""

    __slots__ = ("box", "agent", "clock", "label", "what", "site", "inflight", "generic", "fenced", "retired")

    def __init__(self, box, agent, clock, label, what, site, inflight=None, generic=False):
        self.box, self.agent, self.clock, self.label, self.what, self.site = box, agent, clock, label, what, site
        self.inflight = inflight  # the async op (wgmma group, TMA store) still reading, or None
        self.generic = generic  # a generic-proxy write (local_store) ...
        self.fenced = not generic  # ... not yet ordered for the async proxy by fence_async_shared
        self.retired = None  # (what, site) of the wait that ended an async read

    def describe(self) -> str:
        where = self.site.format(indent="    ") if self.site else "?"
        s = f"{self.label} at {where}"
        if self.retired is not None:
            what, site = self.retired
            s += f"\n    (an async read: it ended at the {what} at {site.short() if site else '?'})"
        return s


class SlotShadow:
    __slots__ = ("written", "writes", "reads", "loads")

    def __init__(self):
        self.written = None  # None: nothing written; True: every element; else a boolean mask
        self.writes: list = []
        self.reads: list = []
        self.loads: list = []  # TMA loads in flight into this slot


class SharedAlloc:
    """``num`` buffers of ``shape`` x ``dtype`` in shared memory."""

    def __init__(self, cta, name, shape, dtype, num, site):
        self.cta, self.name, self.shape, self.dtype, self.num, self.site = cta, name, tuple(shape), dtype, num, site
        self.np_dtype = np_dtype(dtype)
        self.itemsize = max(1, dtype.primitive_bitwidth // 8)
        self.data = np.empty((num,) + self.shape, dtype=self.np_dtype)
        self.data[...] = poison_value(dtype)
        self.shadows = [SlotShadow() for _ in range(num)]
        self.full_box = tuple((0, d) for d in self.shape)

    def __getitem__(self, idx):
        i = as_int(idx, "buffer index")
        v = View(self, i, self.full_box, None)
        if not 0 <= i < self.num:
            v.bad = source.capture(2)
        return v

    def describe(self) -> str:
        return (f"{self.name}: {self.num} x {self.dtype}{list(self.shape)} "
                f"({self.num * int(np.prod(self.shape)) * self.itemsize} bytes), allocated at {self.site.short()}")


class View:
    """A box of one slot of a SharedAlloc, optionally with permuted dimensions (local_trans)."""

    __slots__ = ("alloc", "index", "box", "perm", "bad")

    def __init__(self, alloc, index, box, perm, bad=None):
        self.alloc, self.index, self.box, self.perm, self.bad = alloc, index, box, perm, bad

    # ---- geometry -------------------------------------------------------------------------------------
    @property
    def dtype(self):
        return self.alloc.dtype

    @property
    def base_shape(self):
        return [b - a for a, b in self.box]

    @property
    def shape(self):
        s = self.base_shape
        return s if self.perm is None else [s[p] for p in self.perm]

    @property
    def type(self):  # duck-typing for tlx.dtype_of and friends
        return self

    @property
    def element_ty(self):
        return self.alloc.dtype

    def name(self) -> str:
        s = f"{self.alloc.name}[{self.index}]"
        if self.box != self.alloc.full_box:
            s += _box_str(self.box)
        if self.perm is not None:
            s += ".T" if len(self.perm) == 2 else f".permute{tuple(self.perm)}"
        return s

    def nbytes(self) -> int:
        return int(np.prod(self.base_shape)) * self.alloc.itemsize

    def check_index(self, use_site, what):
        if self.bad is not None:
            raise OutOfBoundsError(
                f"{what} uses {self.alloc.name}[{self.index}], but {self.alloc.name} has only {self.alloc.num} "
                f"buffers (valid indices 0..{self.alloc.num - 1})", site=use_site,
                sections=[("the out-of-range view was formed at", [self.bad.format(indent="  ")]),
                          ("allocated at", [self.alloc.site.short()])])

    def sliced(self, offsets, sizes, site) -> "View":
        if len(offsets) != len(self.box) or len(sizes) != len(self.box):
            raise ProtocolError(f"local_slice of {self.name()}: {len(offsets)} offsets and {len(sizes)} sizes for a "
                                f"{len(self.box)}-d buffer", site=site)
        box = list(self.box)
        shape = self.shape
        for vd, (o, s) in enumerate(zip(offsets, sizes)):
            d = vd if self.perm is None else self.perm[vd]
            if o < 0 or s <= 0 or o + s > shape[vd]:
                raise OutOfBoundsError(f"local_slice(offset={list(offsets)}, shape={list(sizes)}) reaches outside "
                                       f"{self.name()} of shape {shape}", site=site)
            box[d] = (self.box[d][0] + o, self.box[d][0] + o + s)
        return View(self.alloc, self.index, tuple(box), self.perm, self.bad)

    def transposed(self, dims) -> "View":
        dims = [int(d) for d in dims]
        cur = self.perm if self.perm is not None else list(range(len(self.box)))
        perm = [cur[d] for d in dims]
        return View(self.alloc, self.index, self.box, None if perm == sorted(perm) else perm, self.bad)

    # ---- data -----------------------------------------------------------------------------------------
    def _slices(self):
        return (self.index,) + tuple(slice(a, b) for a, b in self.box)

    def read(self) -> np.ndarray:
        """The view's elements as a NumPy view of the buffer: later writes show through it."""
        a = self.alloc.data[self._slices()]
        return a if self.perm is None else a.transpose(self.perm)

    def snapshot(self) -> np.ndarray:
        """A copy of the view's elements as they are now (what an asynchronous operation read at its issue or
        landing), unchanged by later writes."""
        return np.array(self.read())

    def write(self, data: np.ndarray) -> None:
        if self.perm is not None:
            inv = np.argsort(self.perm)
            data = data.transpose(inv)
        self.alloc.data[self._slices()] = data


def _queued_after(op, other) -> bool:
    """Whether async op ``op`` executes after ``other`` by construction (one issuer's tcgen05 MMAs run in
    order), so neither races with the other."""
    follows = getattr(op, "follows", None)
    return other is not None and follows is not None and follows(other)


class SharedMemory:
    """The shared memory of one CTA: its allocations and the access checks."""

    def __init__(self, cta):
        self.cta = cta
        self.allocs: list = []
        self.unfenced: list = []  # generic-proxy write records not yet fenced

    def alloc(self, name, shape, dtype, num, site) -> SharedAlloc:
        a = SharedAlloc(self.cta, name, shape, dtype, num, site)
        self.allocs.append(a)
        return a

    # ---- checks ---------------------------------------------------------------------------------------
    def read(self, view: View, task, what: str, site, *, async_proxy=False, inflight=None):
        """Check a read of ``view`` by ``task`` and record it; returns ``(slot shadow, record)``."""
        view.check_index(site, what)
        sh = view.alloc.shadows[view.index]
        box = view.box
        vc = task.vc
        for ld in sh.loads:
            if _overlap(ld.box, box) and not (inflight is not None and _queued_after(inflight, ld)):
                raise RaceError(
                    f"{what} by {task.name} reads {view.name()} while a {ld.kind} into it is still in flight",
                    site=site,
                    sections=[(f"the {ld.kind}", [ld.describe_full()]),
                              ("the read", [f"{what} by {task.name} at {site.format(indent='    ')}"])],
                    hint=f"wait on {ld.barrier.name} for the phase it completes before reading the buffer")
        for w in sh.writes:
            if _overlap(w.box, box):
                if not hb(w.agent, w.clock, vc):
                    raise RaceError(
                        f"{what} by {task.name} reads {view.name()}, but the write it reads is not ordered before "
                        f"the read", site=site,
                        sections=[("the write", [w.describe()]),
                                  ("the read", [f"{what} by {task.name} at {site.format(indent='    ')}"])],
                        hint=_race_hint_read(w))
                if async_proxy and not w.fenced:
                    raise ProxyRaceError(
                        f"{what} by {task.name} reads {view.name()} through the async proxy, but it was last written "
                        f"through the generic proxy (local_store) with no fence_async_shared in between",
                        site=site,
                        sections=[("the generic-proxy write", [w.describe()]),
                                  ("the async-proxy read", [f"{what} by {task.name} at {site.format(indent='    ')}"])],
                        hint="call tlx.fence_async_shared() after the local_store and before the wgmma / TMA store "
                             "(or before the barrier_arrive that hands the buffer over)")
        written = sh.written
        if written is not True:
            if written is None or not written[tuple(slice(a, b) for a, b in box)].all():
                part = "any element" if written is None else "every element"
                raise UninitialisedReadError(
                    f"{what} by {task.name} reads {view.name()}, but nothing has written {part} of it yet",
                    site=site, sections=[("buffer", [view.alloc.describe()])],
                    hint="shared memory starts undefined: load or store the buffer before reading it (or the read "
                         "comes before the wait for the copy that fills it)")
        if inflight is None:
            r = _same_reader(sh, task.agent, box)
            if r is not None:  # a later read by the same task supersedes (program order)
                r.clock, r.what, r.label, r.site, r.retired = task.vc[task.agent], what, f"{what} by {task.name}", site, None
                return sh, r
        rec = Access(box, task.agent, task.vc[task.agent], f"{what} by {task.name}", what, site, inflight)
        sh.reads.append(rec)
        return sh, rec

    def write(self, view: View, agent: int, vc: dict, clock: int, actor: str, what: str, site, *, generic=False,
              landing=None) -> Access:
        """Check a write of ``view`` by ``agent`` (whose knowledge is ``vc``) and record it."""
        view.check_index(site, what)
        sh = view.alloc.shadows[view.index]
        box = view.box
        for ld in sh.loads:
            if ld is not landing and _overlap(ld.box, box) and not _queued_after(ld, landing):
                raise RaceError(f"{actor} writes {view.name()} while a {ld.kind} into it is still in flight",
                                site=site, sections=[(f"the {ld.kind} in flight", [ld.describe_full()]),
                                                     ("the write", [f"{actor} at {_fmt(site)}"])],
                                hint=f"wait on {ld.barrier.name} for its phase before reusing the buffer")
        for r in sh.reads:
            if not _overlap(r.box, box):
                continue
            if r.inflight is not None:
                raise RaceError(
                    f"{actor} overwrites {view.name()} while {r.inflight.describe()} still reads it",
                    site=site, sections=[("the read in flight", [r.describe()]),
                                         ("the write", [f"{actor} at {_fmt(site)}"])],
                    hint=r.inflight.wait_hint())
            if r.agent != agent and not hb(r.agent, r.clock, vc):
                raise RaceError(
                    f"{actor} overwrites {view.name()}, but the read before it is not ordered before the "
                    f"write: the buffer was released before it was consumed", site=site,
                    sections=[("the read", [r.describe()]), ("the write", [f"{actor} at {_fmt(site)}"])],
                    hint="the reader must finish reading (for wgmma: async_dot_wait) before the arrive that hands the "
                         "buffer back, and the writer must wait for that arrive's phase")
        for w in sh.writes:
            if _overlap(w.box, box) and w.agent != agent and not hb(w.agent, w.clock, vc):
                raise RaceError(
                    f"{actor} overwrites {view.name()}, but the previous write is not ordered before it",
                    site=site, sections=[("the previous write", [w.describe()]),
                                         ("the write", [f"{actor} at {_fmt(site)}"])])
        sh.reads = [r for r in sh.reads if not _covers(box, r.box)]
        sh.writes = [w for w in sh.writes if not _covers(box, w.box)]
        rec = Access(box, agent, clock, actor, what, site, None, generic)
        sh.writes.append(rec)
        if generic:
            self.unfenced.append(rec)
        if box == view.alloc.full_box:
            sh.written = True
        elif sh.written is not True:
            if sh.written is None:
                sh.written = np.zeros(view.alloc.shape, dtype=bool)
            sh.written[tuple(slice(a, b) for a, b in box)] = True
            if sh.written.all():
                sh.written = True
        return rec

    def fence(self, task) -> None:
        """fence.proxy.async: every generic write ordered before ``task`` now is visible to the async proxy."""
        keep = []
        vc = task.vc
        for rec in self.unfenced:
            if hb(rec.agent, rec.clock, vc):
                rec.fenced = True
            else:
                keep.append(rec)
        self.unfenced = keep

    def retire(self, shadow: SlotShadow, rec: Access, task, what: str, site) -> None:
        """An in-flight async read completed (its wait passed): it now counts as a read at this point (and
        supersedes an earlier finished read of the same box by the same task)."""
        rec.inflight = None
        rec.clock = task.vc[task.agent]
        rec.retired = (what, site)
        if rec in shadow.reads:
            other = _same_reader(shadow, rec.agent, rec.box, exclude=rec)
            if other is not None:
                shadow.reads.remove(other)


def _same_reader(sh: SlotShadow, agent, box, exclude=None):
    for r in sh.reads:
        if r.agent == agent and r.inflight is None and r.box == box and r is not exclude:
            return r
    return None


def _fmt(site) -> str:
    return site.format(indent="    ") if site else "?"


def _race_hint_read(w: Access) -> str:
    if w.what.startswith("TMA load"):
        return "the reader must wait on the copy's barrier (barrier_wait with the phase that copy completes) first"
    return "the writer must arrive on a barrier after the write and the reader wait for that phase before reading"
