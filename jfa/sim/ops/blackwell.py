"""Blackwell (sm_100) ops: tensor memory and tcgen05 MMA completing on mbarriers.

- ``local_alloc(..., storage=tmem)``: a TMEM allocation (lanes x 32-bit columns); the CTA's 512 columns are
  a budget checked at allocation. Its buffers are views like shared memory's, so ``local_load``,
  ``local_store`` and ``local_slice`` (core) work on them, with the same shadow checks; ``subslice`` is
  TLX's column slice of a TMEM buffer (a slice past its columns is an ``OutOfBoundsError``).
- ``async_dot`` (tcgen05.mma): A from shared or tensor memory, B from shared memory, the accumulator in
  tensor memory. It runs asynchronously: issued, it reads its operands and writes the accumulator when it
  lands (the scheduler decides when), then arrives once on each of its ``mBarriers``. Until then the
  accumulator reads as a write in flight (reading it is a race) and its shared-memory operands as reads
  in flight (overwriting them is a race); what waits on a barrier it arrives on sees its result. One
  issuer's MMAs land in issue order (the tensor core executes them so: an accumulation chain is exact).
- ``async_dot_scaled`` (tcgen05.mma block-scaled, E4M3/E5M2 operands): the same, with one E8M0 scale per 32
  elements along K for each row of A (``A_scale [M, K/32]``) and each column of B (``B_scale [N, K/32]``),
  from shared or tensor memory.
- ``tmem_copy(src, dst)`` (tcgen05.cp, shared memory into TMEM): asynchronous, in the issuer's tcgen05 order
  (an MMA issued after it reads the copy), its source read in flight until it lands.
- ``tcgen05_commit(bar)``: one arrival on ``bar`` once every MMA its task issued so far has landed.
- Cluster launch control (``clc_create_context``, ``clc_producer``, ``clc_consumer``; single-CTA clusters):
  the producer's try_cancel is answered when it lands: the launch's dispatch (``jfa.sim.dispatch``) claims
  the first CTA that has not started (it never starts) and the answer is its x, or -1 once every CTA has
  started or been claimed. The answer is written, as the hardware's 16-byte response, into a shared-memory
  slot by the async proxy, with its bytes completing the full barrier; the consumer reads the slot after
  waiting on that barrier (a read not ordered after the answer's landing is a race, a read of a slot never
  answered an uninitialised read) and arrives on the empty one. A try_cancel issued after the CTA has read a
  -1 is a ProtocolError (undefined behaviour in PTX).
"""
from __future__ import annotations

import numpy as np
import triton.language as tl

from .. import source
from ..errors import ProtocolError, UnsupportedError
from ..sched import AsyncOp
from ..sync import BarrierArray, join
from ..values import as_bool, as_int, e8m0_to_f32, scalar_tensor, to_f32, unwrap
from . import OpTable, core
from .hopper import _matmul

BLACKWELL = OpTable("blackwell", core.CORE)
TMEM_LANES = 128
TMEM_COLUMNS = 512  # 32-bit columns per lane, per SM (a CTA's allocations share them)


def _is_tmem(storage) -> bool:
    return storage is not None and getattr(storage, "name", str(storage)).endswith("tmem")


def _in_tmem(view) -> bool:
    return getattr(view.alloc, "storage", "smem") == "tmem"


@BLACKWELL.op(sync=False)
def local_alloc(cta, shape, dtype, num, storage=None, layout=None, reuse=None):
    storage = unwrap(storage)
    site = source.capture(2)
    if not _is_tmem(storage):
        return core.alloc_smem(cta, shape, dtype, num, reuse, site)
    if reuse is not None:
        raise UnsupportedError("local_alloc(storage=tmem, reuse=...): aliased TMEM is not simulated yet", site=site)
    dims = [as_int(d, "local_alloc shape") for d in unwrap(shape)]
    dtype, num = unwrap(dtype), as_int(num, "local_alloc num")
    if len(dims) != 2 or dims[0] > TMEM_LANES or min(dims) < 1 or num < 1:
        raise ProtocolError(f"local_alloc({dims}, {dtype}, {num}, tmem): TMEM holds 2-d buffers of at most "
                            f"{TMEM_LANES} rows (lanes)", site=site)
    if dtype not in (tl.float32, tl.uint8):
        raise UnsupportedError(f"local_alloc({dims}, {dtype}, tmem): TMEM is simulated for fp32 accumulators and "
                               "uint8 E8M0 scales", site=site)
    columns = num * -(-dims[1] * dtype.primitive_bitwidth // 32)
    used = getattr(cta, "tmem_columns", 0) + columns
    if used > TMEM_COLUMNS:
        raise ProtocolError(f"local_alloc({dims}, {dtype}, {num}, tmem) needs {columns} TMEM columns; with the "
                            f"CTA's earlier allocations that is {used} of the SM's {TMEM_COLUMNS}", site=site)
    cta.tmem_columns = used
    a = cta.smem.alloc(core._alloc_name(cta, site, "tmem"), dims, dtype, num, site)
    a.storage = "tmem"
    cta.trace(cta.task, "local_alloc", f"{a.name}: {num} x {dtype}{dims} in TMEM ({columns} columns)", site)
    return a


@BLACKWELL.op(sync=False)
def subslice(cta, local_allocated_buffer, offset, size):
    """``tlx.subslice``: columns ``[offset, offset + size)`` of a TMEM buffer, a view like ``local_slice``'s."""
    site = source.capture(2)
    view = cta.view(local_allocated_buffer, site, "subslice")
    if not _in_tmem(view):
        raise ProtocolError(f"subslice of {view.name()}: slices tensor memory along its columns (shared memory "
                            "takes local_slice)", site=site)
    rows, cols = view.shape
    return view.sliced([0, as_int(offset, "offset")], [rows, as_int(size, "size")], site)


class Tcgen05Mma(AsyncOp):
    """One tcgen05.mma in flight: ``acc (+)= A @ B`` when it lands, then an arrival on each barrier."""

    kind = "tcgen05 MMA"
    __slots__ = ("cta", "task", "a", "b", "acc", "use_acc", "barriers", "site", "vc", "seq", "prev", "landed",
                 "reads", "box", "barrier", "scales", "peer", "peer_a", "peer_b", "peer_acc")

    def __init__(self, cta, task, a, b, acc, use_acc, barriers, site, vc, seq, prev):
        self.cta, self.task, self.a, self.b, self.acc, self.use_acc = cta, task, a, b, acc, use_acc
        self.barriers, self.site, self.vc, self.seq, self.prev = barriers, site, vc, seq, prev
        self.landed, self.reads, self.box, self.scales = False, [], acc.box, None
        self.barrier = barriers[0] if barriers else _Uncommitted()  # what a reader must wait on (hints)
        self.peer = self.peer_a = self.peer_b = self.peer_acc = None  # a 2-CTA MMA's partner CTA and its views

    def describe(self) -> str:
        pair = f" (2-CTA, with CTA {self.peer.rank}'s {self.peer_acc.name()})" if self.peer is not None else ""
        return f"tcgen05 MMA #{self.seq} into {self.acc.name()}{pair}"

    def touches(self):
        return (self.cta,) if self.peer is None else (self.cta, self.peer)

    def describe_full(self) -> str:
        on = ", ".join(b.name for b in self.barriers) or "no barrier (tcgen05_commit)"
        return f"{self.describe()}, arriving on {on}, issued by {self.task.name} at {self.site.format(indent='    ')}"

    def follows(self, other) -> bool:
        """Whether this MMA was issued after ``other`` by the same task (it then executes after it)."""
        p = self.prev
        while p is not None:
            if p is other:
                return True
            p = p.prev
        return False

    def wait_hint(self) -> str:
        return (f"wait on {self.barrier.name} (the barrier the MMA arrives on, or a tcgen05_commit's) before "
                "reusing its operands")

    def land(self) -> None:
        while self.prev is not None and not self.prev.landed:  # one issuer's MMAs land in issue order
            self.cta.sched.land(self.prev)
        self.landed = True
        cta, task = self.cta, self.task
        a = to_f32(self.a.snapshot(), self.a.dtype)
        b = to_f32(self.b.snapshot(), self.b.dtype)
        if self.peer is not None:  # cta_group::2: B is the pair's two halves of N side by side
            b = np.concatenate([b, to_f32(self.peer_b.snapshot(), self.peer_b.dtype)], axis=1)
        if self.scales is not None:  # block-scaled: one E8M0 scale per 32 elements along K, per row / column
            sa, sb = (e8m0_to_f32(v.snapshot()) for v in self.scales)
            a = a * np.repeat(sa, 32, axis=1)
            b = b * np.repeat(sb, 32, axis=1).T
        out = _matmul(a, b)
        if self.use_acc:
            out = out + to_f32(self.acc.snapshot(), self.acc.dtype)
        agent = _mma_agent(cta)  # the tensor core: one agent, its MMAs ordered by its clock
        cta.tcgen05_clock = clock = getattr(cta, "tcgen05_clock", 0) + 1
        vc = dict(self.vc)
        vc[agent] = clock
        sh = self.acc.alloc.shadows[self.acc.index]
        sh.loads.remove(self)
        cta.smem.write(self.acc, agent, vc, clock, f"{self.describe()} (issued by {task.name})",
                       "tcgen05 MMA", self.site, landing=self)
        self.acc.write(out.astype(np.float32))
        if self.peer is not None:  # the partner's rows of A times the same B, into its own accumulator
            out_p = _matmul(to_f32(self.peer_a.snapshot(), self.peer_a.dtype), b)
            if self.use_acc:
                out_p = out_p + to_f32(self.peer_acc.snapshot(), self.peer_acc.dtype)
            self.peer_acc.alloc.shadows[self.peer_acc.index].loads.remove(self)
            self.peer.smem.write(self.peer_acc, agent, vc, clock, f"{self.describe()} (issued by {task.name})",
                                 "tcgen05 MMA", self.site, landing=self)
            self.peer_acc.write(out_p.astype(np.float32))
        for r in self.reads:  # its operand reads end now: ordered before whatever waits for the arrival
            r.inflight, r.agent, r.clock = None, agent, clock
        for bar in self.barriers:
            _arrive_async(cta, bar, vc, self.describe(), self.site)
        cta.trace(None, "tcgen05 MMA lands", f"#{self.seq} {self.acc.name()}", self.site)


class Tcgen05Copy(AsyncOp):
    """tcgen05.cp in flight: ``dst`` (TMEM) = ``src`` (shared memory) when it lands; in the issuer's tcgen05
    order, so an MMA issued after it reads what it copied."""

    kind = "tcgen05 copy"
    __slots__ = ("cta", "task", "src", "dst", "site", "vc", "seq", "prev", "landed", "read", "box", "barrier")

    def __init__(self, cta, task, src, dst, site, vc, seq, prev):
        self.cta, self.task, self.src, self.dst, self.site, self.vc, self.seq = cta, task, src, dst, site, vc, seq
        self.prev, self.landed, self.read, self.box, self.barrier = prev, False, None, dst.box, _Uncommitted()

    def describe(self) -> str:
        return f"tcgen05 copy #{self.seq} of {self.src.name()} into {self.dst.name()}"

    def describe_full(self) -> str:
        return f"{self.describe()}, issued by {self.task.name} at {self.site.format(indent='    ')}"

    def follows(self, other) -> bool:
        return Tcgen05Mma.follows(self, other)

    def wait_hint(self) -> str:
        return "wait for a tcgen05_commit issued after the copy before reusing its source"

    def land(self) -> None:
        while self.prev is not None and not self.prev.landed:
            self.cta.sched.land(self.prev)
        self.landed = True
        cta = self.cta
        agent = _mma_agent(cta)
        cta.tcgen05_clock = clock = getattr(cta, "tcgen05_clock", 0) + 1
        vc = dict(self.vc)
        vc[agent] = clock
        self.dst.alloc.shadows[self.dst.index].loads.remove(self)
        cta.smem.write(self.dst, agent, vc, clock, f"{self.describe()} (issued by {self.task.name})",
                       "tcgen05 copy", self.site, landing=self)
        self.dst.write(self.src.snapshot())
        self.read.inflight, self.read.agent, self.read.clock = None, agent, clock


class _Uncommitted:
    name = "the barrier of a later tcgen05_commit"


class Tcgen05Commit(AsyncOp):
    """tcgen05.commit: one arrival on ``barrier`` once every MMA issued before it (by its task) has landed."""

    kind = "tcgen05 commit"
    __slots__ = ("cta", "task", "barrier", "barriers", "last", "site", "vc", "landed")

    def __init__(self, cta, task, barrier, last, site, vc, barriers=None):
        self.cta, self.task, self.barrier, self.last, self.site, self.vc = cta, task, barrier, last, site, vc
        self.barriers = barriers or [barrier]  # a 2-CTA commit multicasts to the pair's barriers at one offset
        self.landed = False

    def describe(self) -> str:
        return f"tcgen05_commit on {', '.join(b.name for b in self.barriers)} by {self.task.name}"

    def touches(self):
        return tuple(b.array.cta for b in self.barriers)

    def land(self) -> None:
        if self.last is not None and not self.last.landed:
            self.cta.sched.land(self.last)
        self.landed = True
        vc = dict(self.vc)
        if self.last is not None:
            vc[_mma_agent(self.cta)] = getattr(self.cta, "tcgen05_clock", 0)
        for bar in self.barriers:
            _arrive_async(self.cta, bar, vc, self.describe(), self.site)


def _mma_agent(cta) -> int:
    if getattr(cta, "tcgen05_agent", None) is None:
        cta.tcgen05_agent = cta.new_agent("tcgen05 MMAs")
    return cta.tcgen05_agent


def _arrive_async(cta, bar, vc: dict, who: str, site) -> None:
    """One arrival on ``bar`` by an asynchronous unit whose knowledge is ``vc``."""
    if bar.pending < 1:
        raise ProtocolError(f"over-arrival on {bar.name}: {who} arrives, but no arrival is pending in this phase "
                            f"({bar.state()})", site=site)
    join(bar.vc_acc, vc)
    bar.pending -= 1
    bar.arrivals.append((who, site))
    bar._complete_if_done(cta)


def _smem_or_tmem(cta, x, which, task, op, site, tmem_ok):
    if not hasattr(x, "alloc") and not hasattr(x, "shadows"):
        raise ProtocolError(f"async_dot: operand {which} must be in shared{' or tensor' if tmem_ok else ''} memory "
                            f"on Blackwell (tcgen05 reads no registers), got {type(x).__name__}", site=site)
    view = cta.view(x, site, f"async_dot operand {which}")
    if _in_tmem(view) and not tmem_ok:
        raise ProtocolError(f"async_dot: operand {which} ({view.name()}) is in tensor memory; tcgen05 reads it from "
                            "shared memory", site=site)
    _sh, rec = cta.smem.read(view, task, f"tcgen05 MMA operand {which}", site, async_proxy=not _in_tmem(view),
                             inflight=op)
    op.reads.append(rec)
    return view


def _issue(cta, A, B, acc, use_acc, pred, mBarriers, two_ctas, scales, what):
    site = source.capture(3)
    task = cta.task
    two = bool(unwrap(two_ctas))
    if two and scales is not None:
        raise UnsupportedError(f"{what}(two_ctas=True): block-scaled 2-CTA MMA is not simulated (Triton's lowering "
                               "asserts it away too)", site=site)
    if acc is None or isinstance(acc, tl.tensor):
        raise ProtocolError(f"{what} on Blackwell needs acc: a tensor memory accumulator (tcgen05 writes TMEM; "
                            f"got {'none' if acc is None else 'a register tensor, as wgmma (Hopper) takes'})",
                            site=site)
    acc_view = cta.view(acc, site, f"{what} acc")
    if not _in_tmem(acc_view) or acc_view.dtype != tl.float32:
        raise ProtocolError(f"{what}: the accumulator {acc_view.name()} must be fp32 in tensor memory on Blackwell",
                            site=site)
    if pred is not None and not as_bool(pred):
        cta.trace(task, what, f"tcgen05 MMA into {acc_view.name()} (pred false: skipped)", site)
        return acc
    bars = [cta.barrier(b, site, f"{what} mBarriers") for b in (unwrap(mBarriers) or [])]
    peer = None
    if two:
        peer = _pair_call(cta, task, site, what)
        if peer is None:  # the odd CTA: its leader issues the MMA for both (the lowering predicates it off here)
            cta.trace(task, what, f"2-CTA MMA into {acc_view.name()}: issued by CTA {cta.rank - 1} for the pair", site)
            return acc
        bars = bars + [cta.cluster.peer_barrier(b, peer, f"{what}(two_ctas=True) mBarriers", site) for b in bars]
    cta.n_tcgen05 = seq = getattr(cta, "n_tcgen05", 0) + 1
    last = getattr(task, "last_tcgen05", None)
    op = Tcgen05Mma(cta, task, None, None, acc_view, True if use_acc is None else as_bool(use_acc), bars, site,
                    task.release(), seq, last)
    op.a = _smem_or_tmem(cta, A, "A", task, op, site, True)
    op.b = _smem_or_tmem(cta, B, "B", task, op, site, False)
    (m, k), (k2, n) = op.a.shape, op.b.shape
    if peer is not None:  # each CTA holds its M rows of A, its half of B's N columns, its M rows of the result
        cl = cta.cluster
        op.peer = peer
        op.peer_a = _peer_operand(cl, peer, op.a, "A", task, op, site)
        op.peer_b = _peer_operand(cl, peer, op.b, "B", task, op, site)
        op.peer_acc = cl.peer_view(acc_view, peer, f"{what}(two_ctas=True) acc", site)
        n = 2 * n
    if k != k2 or list(acc_view.shape) != [m, n]:
        halves = " (B: the pair's two halves)" if peer is not None else ""
        raise ProtocolError(f"{what}: shapes {[m, k]} x {[k2, n]}{halves} into {list(acc_view.shape)} do not chain",
                            site=site)
    if peer is not None and m != 128:  # cta_group::2 at M 128 (64 rows a CTA) splits A, B and D another way
        raise UnsupportedError(f"{what}(two_ctas=True) with {m} rows of A a CTA: only 128 a CTA (M 256) is simulated",
                               site=site)
    if m not in (64, 128) or k < 16 or n < 8 or n > 256:
        raise ProtocolError(f"{what} of [{m}, {k}] x [{k}, {n}]: tcgen05 takes M 64 or 128, K >= 16, N 8..256",
                            site=site)
    if op.a.dtype != op.b.dtype:
        raise ProtocolError(f"{what}: operands of different types ({op.a.dtype}, {op.b.dtype})", site=site)
    if scales is not None:
        views = tuple(_smem_or_tmem(cta, x, name, task, op, site, True) for x, name in zip(scales, ("A_scale",
                                                                                                    "B_scale")))
        for v, rows, name in zip(views, (m, n), ("A_scale", "B_scale")):
            if v.dtype != tl.uint8 or list(v.shape) != [rows, k // 32]:
                raise ProtocolError(f"{what}: {name} {v.name()} must be uint8 E8M0 [{rows}, {k // 32}] (one scale "
                                    f"per 32 elements along K), got {v.dtype}{list(v.shape)}", site=site)
        op.scales = views
    acc_view.alloc.shadows[acc_view.index].loads.append(op)
    if peer is not None:
        op.peer_acc.alloc.shadows[op.peer_acc.index].loads.append(op)
    task.last_tcgen05 = op
    cta.sched.inflight.append(op)
    cta.trace(task, what, f"tcgen05 MMA #{seq} [{m}x{k}]x[{k}x{n}] {op.a.name()} x {op.b.name()} -> "
                          f"{acc_view.name()}{' +acc' if op.use_acc else ''}, arrives on "
                          f"{', '.join(b.name for b in bars) or 'nothing (commit)'}", site)
    return acc


@BLACKWELL.op()
def async_dot(cta, A, B, acc=None, use_acc=None, pred=None, mBarriers=None, two_ctas=False, force_async=False,
              input_precision=None, out_dtype=tl.float32):
    return _issue(cta, A, B, acc, use_acc, pred, mBarriers, two_ctas, None, "async_dot")


SCALED_FORMATS = {"e4m3": tl.float8e4nv, "e5m2": tl.float8e5}


@BLACKWELL.op()
def async_dot_scaled(cta, A, B, acc, A_scale, A_format, B_scale, B_format, use_acc=None, pred=None, mBarriers=None,
                     two_ctas=False, force_async=False, out_dtype=tl.float32):
    site = source.capture(2)
    for x, fmt, name in ((A, A_format, "A"), (B, B_format, "B")):
        fmt = unwrap(fmt)
        if fmt not in SCALED_FORMATS:
            raise UnsupportedError(f"async_dot_scaled: {name}_format {fmt!r} (simulated: {sorted(SCALED_FORMATS)}; "
                                   "e2m1 is not)", site=site)
        dtype = cta.view(x, site, f"async_dot_scaled {name}").dtype
        if dtype != SCALED_FORMATS[fmt]:
            raise ProtocolError(f"async_dot_scaled: {name} holds {dtype}, its format says {fmt}", site=site)
    return _issue(cta, A, B, acc, use_acc, pred, mBarriers, two_ctas, (A_scale, B_scale), "async_dot_scaled")


def _pair_call(cta, task, site, what):
    """A 2-CTA op called by ``cta``: its partner CTA when ``cta`` is the pair's leader (the even CTA issues for
    both: TLX's lowering predicates the op on ``cluster_cta_rank % 2 == 0``), None when it is the odd CTA. Each
    call is counted per pair and task: at the cluster's end both CTAs must have called it as often."""
    cl = cta.cluster
    if cl is None or cl.size % 2:
        raise ProtocolError(f"{what}(two_ctas=True) needs a launch in clusters of an even number of CTAs "
                            f"(ctas_per_cga=(2, 1, 1)); this one has {cl.size if cl else 1}", site=site)
    key = (cta.rank & ~1, task.name[len(cta.prefix):], what)
    counts = cl.pair_calls.setdefault(key, [0, 0])
    counts[cta.rank & 1] += 1
    if cta.rank & 1:
        return None
    return cl.cta_of_rank(cta, cta.rank + 1, f"{what}(two_ctas=True)", site)


def _peer_operand(cl, peer, view, which, task, op, site):
    """The partner's operand of a 2-CTA MMA (the same buffer in its shared or tensor memory), read in flight."""
    pv = cl.peer_view(view, peer, f"2-CTA MMA operand {which}", site)
    _sh, rec = peer.smem.read(pv, task, f"tcgen05 MMA operand {which} (2-CTA, CTA {peer.rank}'s half)", site,
                              async_proxy=not _in_tmem(pv), inflight=op)
    op.reads.append(rec)
    return pv


@BLACKWELL.op()
def tcgen05_commit(cta, mBarrier, two_ctas=False):
    site = source.capture(2)
    task = cta.task
    bar = cta.barrier(mBarrier, site, "tcgen05_commit")
    bars = None
    if unwrap(two_ctas):  # the leader commits for the pair: one arrival on both CTAs' barriers at bar's offset
        peer = _pair_call(cta, task, site, "tcgen05_commit")
        if peer is None:
            cta.trace(task, "tcgen05_commit", f"{bar.name}: committed by CTA {cta.rank - 1} for the pair", site)
            return mBarrier
        bars = [bar, cta.cluster.peer_barrier(bar, peer, "tcgen05_commit(two_ctas=True)", site)]
    commit = Tcgen05Commit(cta, task, bar, getattr(task, "last_tcgen05", None), site, task.release(), bars)
    cta.sched.inflight.append(commit)
    cta.trace(task, "tcgen05_commit", f"{bar.name} after the MMAs issued so far", site)
    return mBarrier


# ---- cluster launch control ----------------------------------------------------------------------------
class ClcContext:
    """The pipeline of CLC responses: ``num_stages`` response slots (16 bytes of shared memory each), a full
    barrier each (the response's 16 bytes land on it) and an empty barrier each (``num_consumers`` arrivals
    hand the slot back)."""

    def __init__(self, cta, num_consumers: int, num_stages: int, site):
        name = core._alloc_name(cta, site, "clc")  # the context's variable: clc.full[k], clc.empty[k], ...
        self.fulls = BarrierArray(cta, f"{name}.full", num_stages, 1, site)
        self.empties = BarrierArray(cta, f"{name}.empty", num_stages, num_consumers, site)
        cta.barriers += [self.fulls, self.empties]
        self.responses = cta.smem.alloc(f"{name}.response", (4,), tl.int32, num_stages, site)


class ClcResponse(AsyncOp):
    """A try_cancel in flight: answered when it lands (the scheduler decides when, as the hardware's)."""

    kind = "CLC try_cancel"
    __slots__ = ("cta", "task", "context", "k", "site", "vc", "seq", "barrier", "box")

    def __init__(self, cta, task, context, k, site, vc, seq):
        self.cta, self.task, self.context, self.k, self.site, self.vc, self.seq = cta, task, context, k, site, vc, seq
        self.barrier = context.fulls[k]
        self.box = context.responses.full_box

    def describe(self) -> str:
        return f"CLC try_cancel #{self.seq} (response slot {self.k})"

    def describe_full(self) -> str:
        return (f"{self.describe()}, completing on {self.barrier.name}, issued by {self.task.name} at "
                f"{self.site.format(indent='    ')}")

    def land(self) -> None:
        cta = self.cta
        view = self.context.responses[self.k]
        view.alloc.shadows[self.k].loads.remove(self)
        answer = cta.launch.dispatch.try_cancel()
        rec = cta.smem.write(view, None, self.vc, 0, f"CLC try_cancel #{self.seq} (issued by {self.task.name})",
                             "CLC response", self.site, landing=self)
        view.write(np.array([answer, 0, 0, 0], dtype=np.int32))
        self.barrier.complete_tx(cta, self, 16)
        rec.agent, rec.clock = self.barrier.tx_agent, self.barrier.tx_clock
        cta.trace(None, "CLC response lands", f"#{self.seq}: {answer}", self.site)


def _clc_slot(context, k, multi_ctas, site, what) -> int:
    """The response slot ``k`` of ``context`` a single-CTA CLC op uses (refusing clusters and bad slots)."""
    if unwrap(multi_ctas):
        raise UnsupportedError(f"{what}(multi_ctas=True): clusters are not simulated yet", site=site)
    if not isinstance(context, ClcContext):
        raise ProtocolError(f"{what}: expected a clc_create_context() result, got {type(context).__name__}",
                            site=site)
    k = as_int(k, "k")
    if not 0 <= k < context.responses.num:
        raise ProtocolError(f"{what}: response slot {k} of a context with {context.responses.num}", site=site)
    return k


@BLACKWELL.op(sync=False)
def clc_create_context(cta, num_consumers, num_stages=1):
    site = source.capture(2)
    return ClcContext(cta, as_int(num_consumers, "num_consumers"), as_int(num_stages, "num_stages"), site)


@BLACKWELL.op()
def clc_producer(cta, context, p_producer=None, multi_ctas=False, k=0):
    site = source.capture(2)
    k = _clc_slot(context, k, multi_ctas, site, "clc_producer")
    task = cta.task
    core.wait_on(cta, context.empties[k], as_int(p_producer, "p_producer") & 1, site)
    failed = getattr(cta, "clc_failed", None)
    if failed is not None:
        raise ProtocolError(f"clc_producer: a try_cancel after this CTA observed a failed one (-1, read by "
                            f"{failed[0]} at {failed[1].short()}): undefined behaviour in PTX", site=site,
                            hint="stop asking once a response says no CTA is left (the loop's exit on -1)")
    context.fulls[k].expect(cta, task, 16, site)
    cta.n_copies += 1
    op = ClcResponse(cta, task, context, k, site, task.release(), cta.n_copies)
    context.responses.shadows[k].loads.append(op)
    cta.sched.inflight.append(op)
    cta.trace(task, "clc_producer", f"try_cancel #{op.seq} into slot {k}", site)


@BLACKWELL.op()
def clc_consumer(cta, context, p_consumer=None, multi_ctas=False, k=0):
    site = source.capture(2)
    k = _clc_slot(context, k, multi_ctas, site, "clc_consumer")
    task = cta.task
    core.wait_on(cta, context.fulls[k], as_int(p_consumer, "p_consumer") & 1, site)
    view = context.responses[k]
    cta.smem.read(view, task, "clc_consumer (the CLC response)", site)
    tile = int(view.read()[0])
    if tile == -1 and getattr(cta, "clc_failed", None) is None:
        cta.clc_failed = (task.name, site)
    context.empties[k].arrive(cta, task, 1, site)
    cta.trace(task, "clc_consumer", f"slot {k}: {tile}", site)
    return scalar_tensor(tile, tl.int32)


@BLACKWELL.op()
def tmem_copy(cta, src, dst):
    site = source.capture(2)
    task = cta.task
    src_view, dst_view = cta.view(src, site, "tmem_copy source"), cta.view(dst, site, "tmem_copy destination")
    if _in_tmem(src_view) or not _in_tmem(dst_view):
        raise ProtocolError(f"tmem_copy: copies shared memory ({src_view.name()}) into tensor memory "
                            f"({dst_view.name()})", site=site)
    if list(src_view.shape) != list(dst_view.shape) or src_view.dtype != dst_view.dtype:
        raise ProtocolError(f"tmem_copy: {src_view.dtype}{list(src_view.shape)} into "
                            f"{dst_view.dtype}{list(dst_view.shape)}", site=site)
    cta.n_tcgen05 = seq = getattr(cta, "n_tcgen05", 0) + 1
    op = Tcgen05Copy(cta, task, src_view, dst_view, site, task.release(), seq, getattr(task, "last_tcgen05", None))
    _sh, op.read = cta.smem.read(src_view, task, "tcgen05 copy source", site, async_proxy=True, inflight=op)
    dst_view.alloc.shadows[dst_view.index].loads.append(op)
    task.last_tcgen05 = op
    cta.sched.inflight.append(op)
    cta.trace(task, "tmem_copy", op.describe(), site)
