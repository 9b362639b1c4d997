"""A thread-block cluster: the CTAs of one cluster run concurrently, under one scheduler.

A launch with ``ctas_per_cga=(N, 1, 1)`` (TLX's convention: the grid counts CTAs) or ``num_ctas=N``
(upstream's: the grid counts clusters) groups N consecutive CTAs along x into a cluster; CTA ``x`` has
``cluster_cta_rank() == x % N``. The cluster's CTAs are dispatched together (one unit of the launch's
dispatch) and their tasks are tasks of one scheduler: the deterministic schedule round-robins over all of
them, a seeded one draws among all of them, so the CTAs of a cluster interleave exactly as the tasks of one
CTA do. Each CTA keeps its own shared memory, tensor memory and barriers; vector-clock agents are
cluster-wide, so happens-before runs across CTAs through remote arrives, multicast copies, 2-CTA MMAs and
the cluster barrier.

What one CTA can reach in another (``peer_alloc`` / ``peer_view`` / ``peer_barrier``): the allocation at
the same position of its allocation order (the kernel is SPMD: the same ``local_alloc`` / ``alloc_barriers``
calls in every CTA give the same shared-memory offsets), the same buffer, box and transposition. Reaching a
CTA that has not made that allocation yet (an mbarrier a partner never initialised) or a CTA that has exited
is a ProtocolError, as is a CTA exiting while something of its partner's is still in flight into its
memory (a multicast copy, a 2-CTA MMA reading its operands or writing its accumulator).

The cluster barrier (``tlx.cluster_barrier``: ``barrier.cluster.arrive`` + ``wait``) completes a generation
when every task of the cluster that has not finished has arrived (PTX: every non-exited thread of the
cluster); a task waiting in an ``async_tasks`` region for its tasks does not count (its tasks are its
threads). Arriving releases, passing acquires every arrival of the generation.
"""
from __future__ import annotations

from .cta import Cta
from .errors import ProtocolError
from .sched import DONE, Scheduler
from .sync import join


class Cluster:
    def __init__(self, launch, indices: list):
        first = indices[0]
        self.launch = launch
        self.size = len(indices)
        self.agents: list = []
        self.sched = Scheduler(launch.schedule.policy(first + ("cluster",)), max_steps=launch.max_steps,
                               deadline=launch.deadline, on_task_done=self._task_done, on_all_done=self._all_done,
                               describe_state=self.describe_state, on_switch=self._switch)
        self.ctas = [Cta(launch, idx, self, rank) for rank, idx in enumerate(indices)]
        # the cluster barrier: generation, who arrived in it (task ids), the clocks they released
        self.cb_gen = 0
        self.cb_arrived: dict = {}
        self.cb_acc: dict = {}
        self.cb_done: dict = {}
        # 2-CTA ops each CTA of a pair asked for, per task: (leader's issues, the peer's calls) must agree
        self.pair_calls: dict = {}

    # ---- running ------------------------------------------------------------------------------------------
    def _switch(self, task) -> None:
        from triton.runtime import interpreter as _interp
        cta = task.cta
        if self.launch.cta is not cta:
            self.launch.cta = cta
            _interp.interpreter_builder.set_grid_idx(*cta.index)

    def run(self, kernel_fn, call_args: dict) -> None:
        mains = [cta.spawn_main(kernel_fn, call_args) for cta in self.ctas]
        self.sched.run(mains[0])

    def _task_done(self, task) -> None:
        task.cta._task_done(task)

    def cta_exit(self, cta) -> None:
        """Every task of ``cta`` finished: its end checks, then nothing may reach its memory any more."""
        for op in self.sched.inflight:
            targets = getattr(op, "touches", None)
            if targets is not None and cta in targets() and op.task.cta is not cta:
                raise ProtocolError(
                    f"CTA {cta.rank} of the cluster exits while {op.describe()} (issued by {op.task.name}) is still "
                    f"in flight into its shared or tensor memory", site=op.site,
                    sections=[("in flight", [op.describe_full() if hasattr(op, "describe_full") else op.describe()])],
                    hint="a CTA's shared memory is gone when it exits: its partner must be done with it first (wait "
                         "for the op's barrier, then a cluster_barrier or a remote arrive the exiting CTA waits for)")
        cta._all_done()
        cta.exited = True
        cta.trace(None, "CTA exits", f"cluster rank {cta.rank}", None)

    def _all_done(self) -> None:
        for key, counts in self.pair_calls.items():
            leader, peer = counts
            if leader != peer:
                (pair, task, what) = key
                raise ProtocolError(
                    f"the CTA pair ({pair}, {pair + 1}) disagree on their 2-CTA ops: the leader's {task} issued "
                    f"{leader} {what}(two_ctas=True), its partner's called it {peer} times",
                    site=None,
                    hint="in a CTA pair both CTAs run the same 2-CTA MMA/commit sequence (the even CTA issues it for "
                         "both); a predicate or a branch that differs between them loses or invents an MMA")

    # ---- reaching the partner ------------------------------------------------------------------------------
    def cta_of_rank(self, cta, rank: int, what: str, site) -> Cta:
        if not 0 <= rank < self.size:
            raise ProtocolError(f"{what}: CTA rank {rank} outside the cluster of {self.size} CTAs", site=site)
        other = self.ctas[rank]
        if other.exited and other is not cta:
            raise ProtocolError(f"{what} reaches CTA {rank} of the cluster, which has exited: its shared memory and "
                                "barriers are gone", site=site,
                                hint="keep every CTA of the cluster alive while its partners use its memory (a "
                                     "cluster_barrier before the end)")
        return other

    def peer_alloc(self, alloc, other: Cta, what: str, site):
        """The allocation of ``other`` at the position ``alloc`` has in its own CTA's allocation order."""
        own = alloc.cta.smem.allocs
        pos = next(i for i, a in enumerate(own) if a is alloc)
        if pos >= len(other.smem.allocs):
            raise ProtocolError(f"{what} reaches {alloc.name.split('.', 1)[-1]} in CTA {other.rank}, which has not "
                                f"allocated it yet", site=site,
                                hint="allocate first, then cluster_barrier, then reach into the partner")
        peer = other.smem.allocs[pos]
        if peer.shape != alloc.shape or peer.dtype != alloc.dtype or getattr(peer, "storage", "smem") != getattr(
                alloc, "storage", "smem"):
            raise ProtocolError(f"{what}: CTA {other.rank}'s allocation #{pos} ({peer.describe()}) is not "
                                f"{alloc.describe()}: the CTAs of a cluster allocate differently", site=site)
        return peer

    def peer_view(self, view, other: Cta, what: str, site):
        from .smem import View
        if view.alloc.cta is other:
            return view
        return View(self.peer_alloc(view.alloc, other, what, site), view.index, view.box, view.perm, view.bad)

    def peer_barrier(self, bar, other: Cta, what: str, site):
        """The mbarrier of ``other`` at ``bar``'s offset (``mapa.shared::cluster``)."""
        arr = bar.array
        if arr.cta is other:
            return bar
        own = arr.cta.barriers
        pos = next(i for i, a in enumerate(own) if a is arr)
        if pos >= len(other.barriers):
            raise ProtocolError(f"{what} reaches {bar.name} in CTA {other.rank}, which has not initialised it yet "
                                "(alloc_barriers): the arrival would land on an uninitialised mbarrier", site=site,
                                hint="initialise the barriers, then cluster_barrier, before any CTA arrives on a "
                                     "partner's barrier")
        return other.barriers[pos].bars[bar.index]

    # ---- the cluster barrier -------------------------------------------------------------------------------
    def _participants(self) -> list:
        return [t for t in self.sched.tasks if t.state != DONE and not t.parked]

    def _cb_try_complete(self) -> bool:
        parts = self._participants()
        if parts and all(id(t) in self.cb_arrived for t in parts):
            self.cb_done = dict(self.cb_acc)
            self.cb_gen += 1
            self.cb_arrived = {}
            return True
        return False

    def barrier(self, cta, site) -> None:
        task = cta.task
        gen = self.cb_gen
        self.cb_arrived[id(task)] = task
        join(self.cb_acc, task.release())
        cta.trace(task, "cluster_barrier", f"arrives (generation {gen})", site)
        self._cb_try_complete()

        def passed():
            return self.cb_gen > gen or self._cb_try_complete()

        self.sched.block(passed, lambda: f"cluster_barrier (generation {gen}): "
                                         + self.diagnose_barrier(), site, on=("cluster", gen))
        task.acquire(self.cb_done)
        cta.trace(task, "cluster_barrier", f"passes (generation {gen})", site)

    def diagnose_barrier(self) -> str:
        parts = self._participants()
        missing = [t for t in parts if id(t) not in self.cb_arrived]
        arrived = [t.name for t in parts if id(t) in self.cb_arrived]
        lines = []
        for t in missing:
            where = f" (blocked at {t.wait.site.short()})" if t.wait is not None and t.wait.site else ""
            lines.append(f"{t.name}{where}")
        return (f"the cluster barrier's generation {self.cb_gen} has {len(arrived)} of {len(parts)} arrivals "
                f"({', '.join(arrived) or 'none'}); never arrived: {', '.join(lines) or 'none'}")

    # ---- reports ----------------------------------------------------------------------------------------------
    def describe_state(self) -> list:
        sections = []
        for cta in self.ctas:
            state = "exited" if cta.exited else "running"
            for title, lines in cta.describe_state():
                if title == "copies in flight":
                    continue
                sections.append((f"CTA {cta.rank} (x={cta.index[0]}, {state}): {title}", lines))
        sections.append(("copies in flight", [op.describe() for op in self.sched.inflight] or ["none"]))
        return sections
