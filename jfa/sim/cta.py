"""One CTA of a simulated launch: its tasks, scheduler, shared memory and barriers."""
from __future__ import annotations

import triton.language as tl

from . import source
from .errors import ProtocolError
from .sched import NEW, READY, BLOCKED, DONE, Scheduler
from .smem import SharedAlloc, SharedMemory, View
from .sync import BadBarrier, BarrierArray, MBarrier, NamedBarriers
from .values import unwrap


class TaskSpec:
    """One ``with tlx.async_task(...)`` block of an ``async_tasks`` region, as evaluated at run time."""

    __slots__ = ("region", "index", "line", "fn", "default", "num_warps", "replicate")

    def __init__(self, region, index, line, args, kwargs, fn):
        self.region, self.index, self.line, self.fn = region, index, line, fn
        self.default = bool(args) and unwrap(args[0]) == "default"
        nw = unwrap(kwargs.get("num_warps"))
        self.num_warps = int(nw) if nw is not None else None
        rep = unwrap(kwargs.get("replicate", 1))
        self.replicate = int(rep) if rep is not None else 1


class Cta:
    """One CTA. Alone (``cluster`` None) it owns its scheduler; in a cluster of several CTAs
    (``jfa.sim.cluster.Cluster``) it shares the cluster's scheduler and vector-clock agents, so the tasks of
    every CTA of the cluster interleave under one schedule, and ``rank`` is its ``cluster_cta_rank``."""

    def __init__(self, launch, index: tuple, cluster=None, rank: int = 0):
        self.launch = launch
        self.index = index
        self.tracer = launch.tracer
        self.counts = launch.op_counts
        self.cluster, self.rank = cluster, rank
        self.prefix = f"cta{rank}." if cluster is not None else ""  # names of its buffers and barriers in reports
        self.live = 0  # its tasks not finished
        self.exited = False  # every task finished: its shared memory and barriers are gone
        if cluster is None:
            self.sched = Scheduler(launch.schedule.policy(index), max_steps=launch.max_steps,
                                   deadline=launch.deadline, on_task_done=self._task_done,
                                   on_all_done=self._all_done, describe_state=self.describe_state)
        else:
            self.sched = cluster.sched
        self.seeded = self.sched.policy.seeded
        self.smem = SharedMemory(self)
        self.named = NamedBarriers(self)
        self.barriers: list = []
        self.alloc_names: set = set()
        self.agents: list = cluster.agents if cluster is not None else []  # agent id -> name (cluster-wide)
        self.n_copies = 0
        self.regions_run = 0

    # ---- agents, current task, trace -------------------------------------------------------------------
    def new_agent(self, name: str) -> int:
        self.agents.append(name)
        return len(self.agents) - 1

    @property
    def task(self):
        return self.sched.current

    def enter(self, name: str) -> None:
        """The prologue of every synchronising op: a step, the op count, a seeded switch point."""
        s = self.sched
        s.steps += 1
        if s.steps > s.max_steps:
            s._step_limit()
        c = self.counts
        c[name] = c.get(name, 0) + 1
        if self.seeded:
            s.maybe_switch()

    def trace(self, task, op, detail, site) -> None:
        if self.tracer is not None:
            self.tracer.event(self, task, op, detail, site)

    # ---- argument resolution --------------------------------------------------------------------------
    def view(self, x, site, what) -> View:
        if isinstance(x, View):
            return x
        if isinstance(x, SharedAlloc):
            if x.num == 1:
                return x[0]
            raise ProtocolError(f"{what}: {x.name} holds {x.num} buffers; index it (buf[i] or local_view)", site=site)
        raise ProtocolError(f"{what}: expected a shared-memory buffer (local_alloc), got {type(x).__name__}",
                            site=site)

    def barrier(self, x, site, what) -> MBarrier:
        if isinstance(x, MBarrier):
            return x
        if isinstance(x, BadBarrier):
            raise x.error(site, what)
        if isinstance(x, BarrierArray):
            if len(x) == 1:
                return x.bars[0]
            raise ProtocolError(f"{what}: {x.name} holds {len(x)} mbarriers; index it", site=site)
        raise ProtocolError(f"{what}: expected an mbarrier (alloc_barriers), got {type(x).__name__}", site=site)

    def descriptor(self, desc, site):
        if not isinstance(desc, tl.core.tensor_descriptor_base):
            raise ProtocolError(f"expected a TMA tensor descriptor, got {type(desc).__name__}", site=site)
        return self.launch.descriptor(desc.handle, site)

    # ---- tasks ----------------------------------------------------------------------------------------
    def run(self, kernel_fn, call_args: dict) -> None:
        self.sched.run(self.spawn_main(kernel_fn, call_args))

    def _spawn(self, *args):
        t = self.sched.spawn(*args)
        t.cta = self
        self.live += 1
        self.launch.thread_ids.add(t.thread.ident)
        return t

    def spawn_main(self, kernel_fn, call_args: dict):
        """The CTA's main body as a task (a cluster spawns every CTA's, then runs them under one scheduler)."""
        return self._spawn(f"{self.prefix}main", "the CTA's main body", lambda: kernel_fn(**call_args), 0,
                           self.launch.num_warps * 32, self.new_agent(f"{self.prefix}main"))

    def run_tasks(self, specs) -> None:
        """An async_tasks region: spawn its tasks (forked from the current one) and wait for them all."""
        parent = self.task
        self.regions_run += 1
        fork = parent.release()
        spawned = []
        for spec in specs:
            warps = self.launch.num_warps if spec.default else (spec.num_warps or self.launch.num_warps)
            base = "default" if spec.default else f"task{spec.index}"
            for r in range(max(1, spec.replicate)):
                name = base if spec.replicate <= 1 else f"{base}[{r}]"
                if self.regions_run > 1:
                    name = f"r{self.regions_run}.{name}"
                name = self.prefix + name
                label = f"async_task at line {spec.line}" + (f", replica {r}" if spec.replicate > 1 else "")
                t = self._spawn(name, label, spec.fn, r, warps * 32, self.new_agent(name))
                t.acquire(fork)
                spawned.append(t)
        self.trace(parent, "async_tasks", ", ".join(t.name for t in spawned), source.capture(2))
        parent.parked = True
        self.sched.block(lambda: all(t.state == DONE for t in spawned),
                         lambda: "waits for its async tasks to finish: "
                                 + ", ".join(t.name for t in spawned if t.state != DONE), source.capture(2))
        parent.parked = False
        for t in spawned:
            parent.acquire(t.vc)

    def _task_done(self, task) -> None:
        if task.dots:
            self.launch.warn(self, f"task {task.name} finished with {len(task.dots)} async_dot group(s) not retired "
                                   f"(the last issued at {task.dots[-1].site.short()})")
        pending = [s for s in task.stores]
        if pending:
            self.launch.warn(self, f"task {task.name} finished with {len(pending)} TMA store(s) not waited for "
                                   f"(no async_descriptor_store_wait(0) before its end; the last issued at "
                                   f"{pending[-1].site.short()})")
        self.trace(task, "end", "", None)
        if self.cluster is not None:
            self.live -= 1
            if self.live == 0:
                self.cluster.cta_exit(self)

    def _all_done(self) -> None:
        loads = [op for op in self.sched.inflight if op.kind == "TMA load" and op.cta is self]
        if loads:
            raise ProtocolError(
                f"the CTA finished with {len(loads)} TMA load(s) still in flight: nothing waited for them, and they "
                "would land in shared memory after the CTA has gone",
                site=loads[0].site, sections=[("loads in flight", [op.describe_full() for op in loads])],
                hint="every TMA load's barrier phase must be waited for before the CTA ends")
        cancels = [op for op in self.sched.inflight if op.kind == "CLC try_cancel" and op.cta is self]
        if cancels:  # the CTA it may cancel never starts, and nobody would work its tile
            raise ProtocolError(
                f"the CTA finished with {len(cancels)} CLC try_cancel(s) still in flight: nobody reads the answer, "
                "so a CTA it cancels is never run by anyone", site=cancels[0].site,
                sections=[("try_cancels in flight", [op.describe_full() for op in cancels])],
                hint="consume every response (clc_consumer) before the CTA ends")

    # ---- reports --------------------------------------------------------------------------------------
    def diagnose(self) -> list:
        """What the blocked tasks' barriers say about why nobody can go on."""
        out, seen = [], set()
        inflight_bars = {id(op.barrier) for op in self.sched.inflight if hasattr(op, "barrier")}
        for t in self.sched.tasks:
            if t.cta is not self or t.state != BLOCKED or t.wait is None or t.wait.on is None:
                continue
            on = t.wait.on
            if on[0] == "cluster":
                if ("cluster",) not in seen:
                    seen.add(("cluster",))
                    out.append(self.cluster.diagnose_barrier())
                continue
            if on[0] == "named":
                nb = self.named.bars.get(on[1])
                if nb is not None and ("named", on[1]) not in seen:
                    seen.add(("named", on[1]))
                    out.append(f"named barrier {on[1]}: {nb.arrived} of {nb.count} threads arrived; the other "
                               f"{nb.count - nb.arrived} never come (a handshake step missing, or a wrong thread count)")
                continue
            b, parity, start = on
            if b.completed - start >= 2:
                out.append(f"{b.name} completed {b.completed - start} phases while {t.name} waited for one (parity "
                           f"{parity}): the phase it waited for passed unseen -- more arrivals per phase than the "
                           "protocol expects, or an arrive_count lower than its arrivals")
                continue
            if id(b) in seen:
                continue
            seen.add(id(b))
            arrived = b.arrive_count - b.pending
            if b.tx > 0 and b.pending == 0 and id(b) not in inflight_bars:
                out.append(f"{b.name} waits for {b.tx} more tx bytes but no copy in flight lands on it: "
                           "barrier_expect_bytes counts more bytes than the copies deliver (count each whole box)")
            elif 0 < arrived < b.arrive_count:
                out.append(f"{b.name} has {arrived} of its {b.arrive_count} arrivals in this phase: an arrive is "
                           "missing, or its arrive_count is higher than the protocol's arrivals")
            elif arrived == 0 and (b.completed & 1) == parity:
                out.append(f"nobody has arrived on {b.name} in phase {b.completed}, which {t.name} waits for "
                           f"(parity {parity}): either its arrivers are blocked too, or the wait expects the wrong "
                           "parity (a producer's first wait on an empty barrier expects phase ^ 1)")
        return out

    def describe_state(self) -> list:
        sections = []
        lines = []
        for t in self.sched.tasks:
            if t.cta is not self:
                continue
            head = f"{t.name:<12} ({t.label}, {t.num_threads} threads): {t.state}"
            lines.append(head)
            if t.state == BLOCKED and t.wait is not None:
                lines.append(f"    {t.wait.describe()}")
                if t.wait.site:
                    lines.append(f"    at {t.wait.site.format(indent='       ')}")
            elif t.state in (NEW, READY):
                lines.append("    runnable")
            if t.dots:
                lines.append(f"    {len(t.dots)} async_dot group(s) in flight")
            if t.stores:
                lines.append(f"    {len(t.stores)} TMA store(s) not waited for")
        sections.append(("tasks", lines))
        diagnosis = self.diagnose()
        if diagnosis:
            sections.insert(0, ("diagnosis", diagnosis))
        if self.barriers:
            blines = []
            for arr in self.barriers:
                blines.extend(arr.describe())
            sections.append(("mbarriers", blines))
        if self.named.bars:
            sections.append(("named barriers", self.named.describe()))
        inflight = self.sched.inflight
        sections.append(("copies in flight", [op.describe() for op in inflight] or ["none"]))
        if self.smem.allocs:
            sections.append(("shared memory", [a.describe() for a in self.smem.allocs]))
        return sections
