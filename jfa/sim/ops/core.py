"""TLX ops every NVIDIA architecture shares: shared memory, mbarriers, named barriers, TMA, proxy fences,
and the small helpers (replica id, dtype_of, size_of)."""
from __future__ import annotations

import linecache
import re

import numpy as np
import triton.language as tl

from .. import source
from ..errors import ProtocolError, RaceError, SimError, UnsupportedError
from ..gmem import Descriptor
from ..sched import AsyncOp
from ..smem import SharedAlloc, View
from ..sync import BarrierArray
from ..values import as_bool, as_int, make_tensor, scalar_tensor, unwrap
from . import OpTable

CORE = OpTable("core")
_REDUCES = ("", "add", "min", "max", "and", "or", "xor")
_NAME_RE = re.compile(
    r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=\s*(?:[\w.]+\.)?(local_alloc|alloc_barriers|clc_create_context)\b")


def _alloc_name(cta, site, kind: str) -> str:
    """The variable the kernel assigns the allocation to (``k_tiles = tlx.local_alloc(...)``)."""
    name = None
    if site:
        m = _NAME_RE.match(linecache.getline(site.filename, site.line))
        if m:
            name = m.group(1)
    if name is None:
        name = f"{kind}#{len(cta.smem.allocs) + len(cta.barriers) + 1}"
    base, k = name, 2
    while name in cta.alloc_names:
        name = f"{base}#{k}"
        k += 1
    cta.alloc_names.add(name)
    return cta.prefix + name


def _data(t, what, site):
    """The numpy data of register tensor ``t`` (an async result must have been waited for)."""
    if not isinstance(t, tl.tensor):
        raise ProtocolError(f"{what}: expected a register tensor, got {type(t).__name__}", site=site)
    data = t.handle.data
    pending = getattr(data, "_jfa_group", None)
    if pending is not None:
        raise RaceError(f"{what} uses the result of the async_dot issued at {pending.site.short()} before an "
                        "async_dot_wait retired its group", site=site,
                        hint="wait for it first: x = tlx.async_dot_wait(0, x) (or a count that retires its group)")
    return data


# ---- shared memory -------------------------------------------------------------------------------------
@CORE.op(sync=False)
def local_alloc(cta, shape, dtype, num, storage=None, layout=None, reuse=None):
    site = source.capture(2)
    storage = unwrap(storage)
    if storage is not None and getattr(storage, "name", str(storage)).endswith("tmem"):
        raise UnsupportedError("local_alloc(storage=tmem): tensor memory is Blackwell's (simulate with arch=(10, 0))",
                               site=site)
    return alloc_smem(cta, shape, dtype, num, reuse, site)


def alloc_smem(cta, shape, dtype, num, reuse, site):
    """A shared-memory allocation of ``num`` buffers (the op's work, shared with the Blackwell table's)."""
    if reuse is not None:
        raise UnsupportedError("local_alloc(reuse=...): aliased shared-memory allocations are not simulated yet",
                               site=site)
    shape = [as_int(d, "local_alloc shape") for d in unwrap(shape)]
    dtype = unwrap(dtype)
    num = as_int(num, "local_alloc num")
    if num < 1 or any(d < 1 for d in shape):
        raise ProtocolError(f"local_alloc({shape}, {dtype}, {num}): sizes must be positive", site=site)
    a = cta.smem.alloc(_alloc_name(cta, site, "smem"), shape, dtype, num, site)
    cta.trace(cta.task, "local_alloc", f"{a.name}: {num} x {dtype}{shape}", site)
    return a


@CORE.op(sync=False)
def alloc_barriers(cta, num_barriers, arrive_count=1):
    site = source.capture(2)
    num, count = as_int(num_barriers, "num_barriers"), as_int(arrive_count, "arrive_count")
    if num < 1 or count < 1:
        raise ProtocolError(f"alloc_barriers({num}, arrive_count={count}): both must be at least 1", site=site)
    arr = BarrierArray(cta, _alloc_name(cta, site, "mbarriers"), num, count, site)
    cta.barriers.append(arr)
    cta.trace(cta.task, "alloc_barriers", f"{arr.name}: {num} x arrive_count {count}", site)
    return arr


@CORE.op(sync=False)
def local_view(cta, buf, idx):
    if isinstance(buf, (SharedAlloc, BarrierArray)):
        return buf[idx]
    raise ProtocolError(f"local_view: expected a local_alloc or alloc_barriers result, got {type(buf).__name__}",
                        site=source.capture(2))


@CORE.op(sync=False)
def local_slice(cta, buffer, offset, shape):
    site = source.capture(2)
    view = cta.view(buffer, site, "local_slice")
    return view.sliced([as_int(o, "offset") for o in unwrap(offset)], [as_int(s, "shape") for s in unwrap(shape)],
                       site)


@CORE.op(sync=False)
def local_trans(cta, input, dims=(1, 0)):
    site = source.capture(2)
    view = cta.view(input, site, "local_trans")
    dims = [as_int(d, "dims") for d in unwrap(dims)]
    if sorted(dims) != list(range(len(view.box))):
        raise ProtocolError(f"local_trans(dims={dims}) is not a permutation of {len(view.box)} dims", site=site)
    return view.transposed(dims)


@CORE.op()
def local_load(cta, src, token=None, layout=None, relaxed=False, **_hints):
    site = source.capture(2)
    task = cta.task
    view = cta.view(src, site, "local_load")
    cta.smem.read(view, task, "local_load", site)
    data = view.snapshot()
    cta.trace(task, "local_load", view.name(), site)
    return make_tensor(data, view.dtype)


@CORE.op()
def local_store(cta, dst, src):
    site = source.capture(2)
    task = cta.task
    view = cta.view(dst, site, "local_store")
    data = _data(src, "local_store", site)
    if src.dtype.scalar != view.dtype:
        raise ProtocolError(f"local_store of a {src.dtype.scalar} tensor into the {view.dtype} buffer {view.name()}",
                            site=site)
    shape = list(src.shape) if src.type.is_block() else [1]
    if shape != view.shape:
        raise ProtocolError(f"local_store of a tensor of shape {shape} into {view.name()} of shape {view.shape}",
                            site=site)
    cta.smem.write(view, task.agent, task.vc, task.vc[task.agent], f"local_store by {task.name}", "local_store", site,
                   generic=True)
    view.write(np.broadcast_to(data, view.shape))
    cta.trace(task, "local_store", view.name(), site)


@CORE.op()
def fence_async_shared(cta):
    task = cta.task
    cta.smem.fence(task)
    if cta.tracer is not None:
        cta.trace(task, "fence_async_shared", "", source.capture(2))


@CORE.op()
def fence(cta, scope):
    scope = unwrap(scope)
    if scope == "async_shared":
        cta.smem.fence(cta.task)
    elif scope not in ("gpu", "sys"):
        raise ProtocolError(f"fence scope must be 'gpu', 'sys' or 'async_shared', got {scope!r}",
                            site=source.capture(2))
    if cta.tracer is not None:
        cta.trace(cta.task, "fence", str(scope), source.capture(2))


# ---- mbarriers -----------------------------------------------------------------------------------------
@CORE.op()
def barrier_expect_bytes(cta, bar, size, pred=None):
    site = source.capture(2)
    b = cta.barrier(bar, site, "barrier_expect_bytes")
    if pred is not None and not as_bool(pred):
        cta.trace(cta.task, "barrier_expect_bytes", f"{b.name} (pred false: skipped)", site)
        return
    n = as_int(size, "size")
    b.expect(cta, cta.task, n, site)
    cta.trace(cta.task, "barrier_expect_bytes", f"{b.name} +{n} bytes -> {b.state()}", site)


def remote_barrier(cta, b, rank, site, what):
    """``b`` at the same offset in CTA ``rank`` of the cluster (``mapa.shared::cluster``)."""
    rank = as_int(rank, "remote_cta_rank")
    if cta.cluster is None:
        if rank != 0:
            raise ProtocolError(f"{what}: CTA rank {rank} of a launch without clusters (every CTA is rank 0 of its "
                                "own cluster of one)", site=site)
        return b
    other = cta.cluster.cta_of_rank(cta, rank, what, site)
    return cta.cluster.peer_barrier(b, other, what, site)


def check_alive(cta, b, site, what):
    """A barrier of an exited CTA of the cluster is gone."""
    owner = b.array.cta
    if owner is not cta and getattr(owner, "exited", False):
        raise ProtocolError(f"{what} uses {b.name} of CTA {owner.rank}, which has exited", site=site)


@CORE.op()
def barrier_arrive(cta, bar, arrive_count=1, remote_cta_rank=None):
    site = source.capture(2)
    b = cta.barrier(bar, site, "barrier_arrive")
    if remote_cta_rank is not None:
        b = remote_barrier(cta, b, remote_cta_rank, site, "barrier_arrive(remote_cta_rank=...)")
    check_alive(cta, b, site, "barrier_arrive")
    b.arrive(cta, cta.task, as_int(arrive_count, "arrive_count"), site)
    cta.trace(cta.task, "barrier_arrive", f"{b.name} -> {b.state()}", site)


@CORE.op(sync=False)
def remote_view(cta, local_allocated_buffer, remote_cta_rank):
    """The partner CTA's mbarrier at this one's offset (TLX's remote_view takes mbarriers only)."""
    site = source.capture(2)
    if isinstance(local_allocated_buffer, View):
        raise UnsupportedError("remote_view of a data buffer: TLX maps mbarriers only (remote_shmem_store writes a "
                               "partner's buffer)", site=site)
    b = cta.barrier(local_allocated_buffer, site, "remote_view")
    return remote_barrier(cta, b, remote_cta_rank, site, "remote_view")


@CORE.op()
def cluster_barrier(cta):
    site = source.capture(2)
    if cta.cluster is None:  # a cluster of one: barrier.cluster is a CTA-wide barrier
        raise UnsupportedError("cluster_barrier on a launch without clusters (ctas_per_cga): TLX's compiler refuses "
                               "it (it requires ttg.num-ctas > 1)", site=site)
    cta.cluster.barrier(cta, site)


@CORE.op()
def remote_shmem_store(cta, dst, src, remote_cta_rank):
    """st.shared::cluster: a generic-proxy store into the partner CTA's buffer at ``dst``'s offset."""
    site = source.capture(2)
    task = cta.task
    view = cta.view(dst, site, "remote_shmem_store")
    rank = as_int(remote_cta_rank, "remote_cta_rank")
    other = cta if cta.cluster is None and rank == 0 else None
    if other is None:
        if cta.cluster is None:
            raise ProtocolError(f"remote_shmem_store: CTA rank {rank} of a launch without clusters", site=site)
        other = cta.cluster.cta_of_rank(cta, rank, "remote_shmem_store", site)
        view = cta.cluster.peer_view(view, other, "remote_shmem_store", site)
    data = _data(src, "remote_shmem_store", site)
    shape = list(src.shape) if src.type.is_block() else [1]
    if src.dtype.scalar != view.dtype or shape != view.shape:
        raise ProtocolError(f"remote_shmem_store of a {src.dtype.scalar}{shape} tensor into {view.name()} "
                            f"({view.dtype}{view.shape})", site=site)
    other.smem.write(view, task.agent, task.vc, task.vc[task.agent], f"remote_shmem_store by {task.name}",
                     "remote_shmem_store", site, generic=True)
    view.write(np.broadcast_to(data, view.shape))
    cta.trace(task, "remote_shmem_store", f"{view.name()} (CTA {other.rank})", site)


@CORE.op()
def barrier_wait(cta, bar, phase, pred=None):
    site = source.capture(2)
    b = cta.barrier(bar, site, "barrier_wait")
    if b.array.cta is not cta:
        raise ProtocolError(f"barrier_wait on {b.name}, a barrier of CTA {b.array.cta.rank}: a CTA waits only on its "
                            "own mbarriers (TLX refuses barrier_wait on a remote_view)", site=site)
    if pred is not None and not as_bool(pred):
        cta.trace(cta.task, "barrier_wait", f"{b.name} (pred false: skipped)", site)
        return
    wait_on(cta, b, as_int(phase, "phase") & 1, site)


def wait_on(cta, b, parity: int, site) -> None:
    """The calling task waits until ``b``'s phase of ``parity`` has completed, then acquires what it carries
    (barrier_wait's work, shared with the ops that wait inside, as CLC's)."""
    task = cta.task
    if not b.passed(parity):
        cta.trace(task, "barrier_wait", f"{b.name} parity {parity}: blocks ({b.state()})", site)
        start = b.completed

        def describe():
            s = (f"barrier_wait({b.name}, phase parity {parity}): waits for the phase of parity {parity} to "
                 f"complete; {b.name} is in {b.state()}")
            if b.completed - start >= 2:
                s += (f" -- it completed {b.completed - start} phases while this task waited, so the phase it waited "
                      "for passed unseen (parity aliasing: more arrivals than the protocol expects?)")
            return s

        cta.sched.block(lambda: b.passed(parity), describe, site, on=(b, parity, start))
    task.acquire(b.vc_done)
    cta.trace(task, "barrier_wait", f"{b.name} parity {parity}: passes (phase {b.completed})", site)


@CORE.op()
def named_barrier_arrive(cta, bar, arrive_count):
    site = source.capture(2)
    bar_id, count = as_int(bar, "barrier id"), as_int(arrive_count, "thread count")
    cta.named.arrive(cta.task, bar_id, count, site)
    cta.trace(cta.task, "named_barrier_arrive", f"bar {bar_id} ({count} threads)", site)


@CORE.op()
def named_barrier_wait(cta, bar, arrive_count):
    site = source.capture(2)
    bar_id, count = as_int(bar, "barrier id"), as_int(arrive_count, "thread count")
    cta.trace(cta.task, "named_barrier_wait", f"bar {bar_id} ({count} threads)", site)
    cta.named.wait(cta.task, bar_id, count, site)


# ---- TMA -----------------------------------------------------------------------------------------------
class TmaLoad(AsyncOp):
    kind = "TMA load"
    __slots__ = ("cta", "task", "desc", "offsets", "view", "barrier", "site", "vc", "box", "seq")

    def __init__(self, cta, task, desc, offsets, view, barrier, site, vc, seq):
        self.cta, self.task, self.desc, self.offsets, self.view = cta, task, desc, offsets, view
        self.barrier, self.site, self.vc, self.box, self.seq = barrier, site, vc, view.box, seq

    def describe(self) -> str:
        return f"TMA load #{self.seq} of {self.desc.name}{self.offsets} into {self.view.name()}"

    def touches(self):
        """The CTAs whose memory it writes (its buffer's, its barrier's)."""
        return (self.cta, self.barrier.array.cta)

    def describe_full(self) -> str:
        return (f"{self.describe()}, completing on {self.barrier.name}, issued by {self.task.name} at "
                f"{self.site.format(indent='    ')}")

    def land(self) -> None:
        try:
            self._land()
        except SimError as err:  # found while landing: the copy's issuer is the task to name
            if err.task is None:
                err.task = f"{self.task.name} (its TMA load #{self.seq}, landing)"
            raise

    def _land(self) -> None:
        cta = self.cta
        sh = self.view.alloc.shadows[self.view.index]
        sh.loads.remove(self)
        data = self.desc.load_box(self.offsets, self.site)
        rec = cta.smem.write(self.view, None, self.vc, 0,
                             f"TMA load #{self.seq} of {self.desc.name}{self.offsets} (issued by {self.task.name})",
                             "TMA load", self.site, landing=self)
        self.view.write(data)
        self.barrier.complete_tx(cta, self, self.desc.box_bytes)
        rec.agent, rec.clock = self.barrier.tx_agent, self.barrier.tx_clock
        cta.trace(None, "TMA load lands", f"#{self.seq} {self.view.name()} -> {self.barrier.name}: "
                                          f"{self.barrier.state()}", self.site)


class TmaStore(AsyncOp):
    """A TMA store in flight: it reads its shared-memory source and writes global memory when it lands, or, once
    a ``.read`` wait (``read_only=True``) has retired its source, it has read the source (``source``) and only its
    global write is still in flight: it lands on its own later, or at a full wait of its task."""
    kind = "TMA store"
    __slots__ = ("cta", "task", "desc", "offsets", "view", "reduce", "site", "rec", "landed", "seq", "source")

    def __init__(self, cta, task, desc, offsets, view, reduce, site, seq):
        self.cta, self.task, self.desc, self.offsets, self.view = cta, task, desc, offsets, view
        self.reduce, self.site, self.rec, self.landed, self.seq = reduce, site, None, False, seq
        self.source = None

    def describe(self) -> str:
        red = f" (reduce {self.reduce})" if self.reduce else ""
        return f"TMA store #{self.seq}{red} of {self.view.name()} to {self.desc.name}{self.offsets}"

    def wait_hint(self) -> str:
        return "wait for the store first: tlx.async_descriptor_store_wait(n) with n small enough to cover it"

    def land(self) -> None:
        try:
            self._land()
        except SimError as err:
            if err.task is None:
                err.task = f"{self.task.name} (its TMA store #{self.seq}, landing)"
            raise

    def _land(self) -> None:
        self.landed = True
        data = self.source if self.source is not None else self.view.snapshot()
        self.desc.store_box(self.offsets, data, self.reduce, self.site)
        self.cta.trace(None, "TMA store lands", self.describe(), self.site)


def _tma_check(cta, d: Descriptor, view: View, offsets, what, site):
    if len(offsets) != len(d.block):
        raise ProtocolError(f"{what} of {d.name}: {len(offsets)} coordinates for a {len(d.block)}-d descriptor",
                            site=site)
    if (offsets[-1] * d.itemsize) % 16:
        raise ProtocolError(f"{what} of {d.name} at {offsets}: the innermost coordinate is not 16-byte aligned "
                            f"({offsets[-1]} x {d.itemsize} bytes; the interpreter's TMA rule)", site=site)
    if view.perm is not None:
        raise ProtocolError(f"{what} of {d.name} with the transposed view {view.name()}: TMA moves boxes in the "
                            "descriptor's own layout", site=site)
    if view.shape != d.block:
        raise ProtocolError(f"{what} of {d.name}: its box {d.block} does not match {view.name()} of shape "
                            f"{view.shape}", site=site)
    if view.dtype != d.dtype:
        raise ProtocolError(f"{what} of {d.name} ({d.dtype}) with the {view.dtype} buffer {view.name()}", site=site)


@CORE.op()
def async_descriptor_load(cta, desc, result, offsets, barrier, pred=None, cache_modifier="", eviction_policy="",
                          multicast_targets=None, two_ctas=False):
    site = source.capture(2)
    task = cta.task
    targets = [as_int(r, "multicast target") for r in (unwrap(multicast_targets) or [])]
    two = bool(unwrap(two_ctas))
    d = cta.descriptor(desc, site)
    view = cta.view(result, site, "async_descriptor_load")
    bar = cta.barrier(barrier, site, "async_descriptor_load")
    if pred is not None and not as_bool(pred):
        cta.trace(task, "async_descriptor_load", f"{d.name} (pred false: skipped)", site)
        return
    offs = [as_int(o, "TMA coordinate") for o in unwrap(offsets)]
    _tma_check(cta, d, view, offs, "TMA load", site)
    view.check_index(site, "TMA load")
    d.check_box(offs, "TMA load", site)  # bounds checked at issue; the data is read when it lands
    dests = [(cta, view, bar)]
    if targets or two:
        dests = _cluster_destinations(cta, view, bar, targets, two, site)
    vc = task.release()
    for dcta, dview, dbar in dests:
        check_alive(cta, dbar, site, "async_descriptor_load")
        cta.n_copies += 1
        copy = TmaLoad(dcta, task, d, offs, dview, dbar, site, vc, cta.n_copies)
        dview.alloc.shadows[dview.index].loads.append(copy)
        cta.sched.inflight.append(copy)
        cta.trace(task, "async_descriptor_load", f"#{copy.seq} {d.name}{offs} -> {dview.name()} on {dbar.name} "
                                                 f"({d.box_bytes} bytes)", site)


def _cluster_destinations(cta, view, bar, targets, two, site):
    """Where a multicast / 2-CTA TMA load lands. ``multicast_targets`` (``.multicast::cluster``): the box lands in
    every target CTA's buffer at ``view``'s offset and completes its bytes on that CTA's barrier at ``bar``'s
    offset. ``two_ctas`` (``.cta_group::2``): the box lands in the issuer's buffer and completes on the barrier of
    the pair's leader (the even CTA), as TLX maps it (``remote_view(bar, rank & ~1)``)."""
    cl = cta.cluster
    if cl is None:
        if two or any(r != 0 for r in targets):
            raise ProtocolError("async_descriptor_load with multicast_targets / two_ctas on a launch without "
                                "clusters (ctas_per_cga)", site=site)
        return [(cta, view, bar)]
    if two:
        if targets:
            raise UnsupportedError("async_descriptor_load with both multicast_targets and two_ctas", site=site)
        if cl.size % 2:
            raise ProtocolError(f"async_descriptor_load(two_ctas=True) in a cluster of {cl.size} CTAs: CTA pairs "
                                "need an even cluster size", site=site)
        leader = cl.cta_of_rank(cta, cta.rank & ~1, "async_descriptor_load(two_ctas=True)", site)
        return [(cta, view, cl.peer_barrier(bar, leader, "async_descriptor_load(two_ctas=True)", site))]
    if len(set(targets)) != len(targets):
        raise ProtocolError(f"async_descriptor_load: multicast_targets {targets} name a CTA twice", site=site)
    out = []
    for r in targets:
        other = cl.cta_of_rank(cta, r, "async_descriptor_load(multicast_targets=...)", site)
        out.append((other, cl.peer_view(view, other, "multicast TMA load", site),
                    cl.peer_barrier(bar, other, "multicast TMA load", site)))
    return out


@CORE.op()
def async_descriptor_store(cta, desc, source_buf, offsets, eviction_policy="", store_reduce=""):
    site = source.capture(2)
    task = cta.task
    d = cta.descriptor(desc, site)
    view = cta.view(source_buf, site, "async_descriptor_store")
    reduce = unwrap(store_reduce) or ""
    if reduce not in _REDUCES:
        raise ProtocolError(f"async_descriptor_store(store_reduce={reduce!r}): must be one of {_REDUCES}", site=site)
    offs = [as_int(o, "TMA coordinate") for o in unwrap(offsets)]
    _tma_check(cta, d, view, offs, "TMA store", site)
    cta.n_copies += 1
    store = TmaStore(cta, task, d, offs, view, reduce, site, cta.n_copies)
    store.rec = cta.smem.read(view, task, "TMA store source", site, async_proxy=True, inflight=store)
    d.check_box(offs, "TMA store", site)
    task.stores.append(store)
    cta.sched.inflight.append(store)
    cta.trace(task, "async_descriptor_store", store.describe(), site)


@CORE.op()
def async_descriptor_store_wait(cta, pendings, read_only=True):
    """``cp.async.bulk.wait_group.read`` (``read_only``): the stores but the newest ``pendings`` have read their
    shared memory, their global writes may still be in flight (they land later); without ``.read`` they have
    also written global memory, and so has every earlier store of the task."""
    task = cta.task
    keep = as_int(pendings, "pendings")
    full = not unwrap(read_only)
    n = 0
    site = source.capture(2) if len(task.stores) > keep else None
    while len(task.stores) > keep:
        st = task.stores.pop(0)
        if not st.landed:
            if full:
                cta.sched.land(st)
            else:
                st.source = st.view.snapshot()
        cta.smem.retire(*st.rec, task, "async_descriptor_store_wait", site)
        n += 1
    if full:
        for op in [op for op in cta.sched.inflight if isinstance(op, TmaStore) and op.task is task]:
            if op.source is not None:  # (its source read retired by an earlier .read wait)
                cta.sched.land(op)
    if cta.tracer is not None:
        cta.trace(task, "async_descriptor_store_wait", f"({keep}): {n} store(s) retired, {len(task.stores)} pending",
                  source.capture(2))


# ---- helpers -------------------------------------------------------------------------------------------
@CORE.op(sync=False)
def async_task_replica_id(cta):
    return tl.constexpr(cta.task.replica)


@CORE.op(sync=False)
def dtype_of(cta, v):
    v = unwrap(v)
    if isinstance(v, tl.core.tensor_descriptor_base):
        return v.dtype
    if isinstance(v, View):
        return v.dtype
    if isinstance(v, tl.tensor):
        dt = v.type.element_ty if hasattr(v.type, "element_ty") else v.type
        if dt.is_ptr():
            dt = dt.element_ty
        return dt
    raise ProtocolError(f"dtype_of works on tensors, descriptors and buffers, not {type(v).__name__}",
                        site=source.capture(2))


@CORE.op(sync=False)
def size_of(cta, dtype):
    dtype = unwrap(dtype)
    if not isinstance(dtype, tl.dtype):
        raise ProtocolError(f"size_of expects a dtype, got {type(dtype).__name__}", site=source.capture(2))
    return tl.constexpr(dtype.primitive_bitwidth // 8)


@CORE.op(sync=False)
def cluster_cta_rank(cta):
    return scalar_tensor(cta.rank)  # x % cluster size (0 without clusters)


@CORE.op(sync=False)
def cluster_size_1d(cta):
    return scalar_tensor(cta.cluster.size if cta.cluster is not None else 1)


@CORE.op(sync=False)
def clock64(cta):
    return scalar_tensor(cta.sched.steps, tl.int64)


@CORE.op(sync=False)
def thread_id(cta, axis):
    raise UnsupportedError("tlx.thread_id: a task stands for a whole warpgroup executing uniformly; per-thread "
                           "values are not modelled", site=source.capture(2))
