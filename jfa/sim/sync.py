"""Synchronisation objects of a CTA: mbarriers and named barriers, with the vector clocks of
happens-before.

Happens-before (``hb``): every task is an agent with a vector clock. An arrive (mbarrier or named
barrier) *releases*: the barrier joins the arriver's clock. A wait that passes *acquires* the clock the
barrier had when it completed the phase the waiter observed. mbarrier clocks are cumulative over
phases (a completion carries every earlier arrival and copy: one barrier word, one chain of
read-modify-writes). Each copy into shared memory is an agent of its own: its write is ordered after
whatever its issuer had seen when it issued it, and before whoever acquires a completion of the
barrier it landed on. All copies landing on one barrier share one agent (``tx_agent``) whose clock
counts them in landing order: with cumulative barriers that is exact.
"""
from __future__ import annotations

from .errors import OutOfBoundsError, ProtocolError

NUM_NAMED_BARRIERS = 16  # bar.sync ids 0-15 (Hopper)


def hb(agent: int, clock: int, vc: dict) -> bool:
    """Is the event (agent, clock) ordered before whoever holds the vector clock ``vc``?"""
    return vc.get(agent, 0) >= clock


def join(into: dict, other: dict) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class MBarrier:
    """One mbarrier: a phase completes when its pending arrival count reaches 0 and its transaction
    count (expect-tx bytes not yet delivered) is 0; then the phase counter advances (its parity bit
    flips) and the arrival count resets."""

    __slots__ = ("array", "index", "arrive_count", "pending", "tx", "completed", "vc_acc", "vc_done",
                 "tx_agent", "tx_clock", "arrivals", "expected", "landed")

    def __init__(self, array, index: int, arrive_count: int):
        self.array, self.index, self.arrive_count = array, index, arrive_count
        self.pending = arrive_count
        self.tx = 0
        self.completed = 0  # phases completed; the current phase's parity is completed & 1
        self.vc_acc: dict = {}
        self.vc_done: dict = {}
        self.tx_agent = None
        self.tx_clock = 0
        self.arrivals: list = []  # (who, site) of this phase's arrivals
        self.expected = 0  # this phase's expect-tx bytes so far
        self.landed = 0  # this phase's landed bytes so far

    @property
    def name(self) -> str:
        return f"{self.array.name}[{self.index}]"

    def state(self) -> str:
        s = (f"phase {self.completed} (parity {self.completed & 1}), "
             f"{self.arrive_count - self.pending} of {self.arrive_count} arrivals")
        if self.expected or self.tx:
            s += f", tx {self.landed} of {self.expected} bytes landed ({self.tx} outstanding)"
        return s

    def _complete_if_done(self, cta) -> None:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.arrive_count
            self.vc_done = dict(self.vc_acc)
            self.arrivals = []
            self.expected = self.landed = 0
            if cta.tracer is not None:
                cta.tracer.event(cta, None, "phase", f"{self.name} completes phase {self.completed - 1}", None)

    def arrive(self, cta, task, count: int, site) -> None:
        if count < 1:
            raise ProtocolError(f"barrier_arrive({self.name}, {count}): the arrive count must be at least 1", site=site)
        if count > self.pending:
            raise ProtocolError(
                f"over-arrival on {self.name}: {task.name} arrives {count} time(s) but only {self.pending} of "
                f"{self.arrive_count} arrivals are pending in this phase",
                site=site,
                sections=[("barrier", [f"{self.name}: {self.state()}"]),
                          ("arrivals in this phase", [f"{who} at {s.short()}" for who, s in self.arrivals] or ["none"])],
                hint=("an arrival arrived while the phase waits only for its tx bytes: more arrivals than the "
                      "barrier's arrive_count (alloc_barriers(arrive_count=...)) per phase") if self.pending == 0 else
                     "more arrivals than the barrier's arrive_count per phase")
        join(self.vc_acc, task.release())
        self.pending -= count
        self.arrivals.append((task.name, site))
        self._complete_if_done(cta)

    def expect(self, cta, task, nbytes: int, site) -> None:
        """mbarrier.arrive.expect_tx: raise the tx count by ``nbytes``, then arrive once."""
        if nbytes < 0:
            raise ProtocolError(f"barrier_expect_bytes({self.name}, {nbytes}): negative byte count", site=site)
        if self.pending < 1:
            raise ProtocolError(
                f"over-arrival on {self.name}: barrier_expect_bytes arrives, but no arrival is pending in this phase "
                f"({self.state()})", site=site,
                sections=[("arrivals in this phase", [f"{who} at {s.short()}" for who, s in self.arrivals] or ["none"])])
        self.tx += nbytes
        self.expected += nbytes
        self.arrive(cta, task, 1, site)

    def complete_tx(self, cta, copy, nbytes: int) -> None:
        """A copy of ``nbytes`` landed on this barrier (its own agent releases into it)."""
        # a partner CTA's copy (multicast, 2-CTA) may land before this CTA's expect_tx: the tx-count is signed,
        # and the phase cannot complete while the expect's own arrival is still pending
        early = getattr(copy.task, "cta", None) is not self.array.cta and self.pending > 0
        if nbytes > self.tx and not early:
            raise ProtocolError(
                f"tx-count underflow on {self.name}: {copy.describe()} delivers {nbytes} bytes but only {self.tx} "
                f"are expected ({self.state()})",
                site=copy.site,
                hint="barrier_expect_bytes must count every byte of every box that lands on the barrier in the "
                     "phase (the whole box, its zero-filled part included)")
        if self.tx_agent is None:
            self.tx_agent = cta.new_agent(f"copies into {self.name}")
        self.tx_clock += 1
        join(self.vc_acc, copy.vc)
        self.vc_acc[self.tx_agent] = self.tx_clock
        self.tx -= nbytes
        self.landed += nbytes
        self._complete_if_done(cta)

    def passed(self, parity: int) -> bool:
        # try_wait.parity(P) succeeds once the phase of parity P has completed, i.e. while the current
        # (incomplete) phase has the other parity
        return (self.completed & 1) != parity


class BadBarrier:
    """An out-of-range element of a barrier array: legal to form (an address), an error to use."""

    __slots__ = ("array", "index", "site")

    def __init__(self, array, index, site):
        self.array, self.index, self.site = array, index, site

    @property
    def name(self) -> str:
        return f"{self.array.name}[{self.index}]"

    def error(self, use_site, what) -> OutOfBoundsError:
        return OutOfBoundsError(
            f"{what} uses {self.name}, but {self.array.name} has only {len(self.array.bars)} barriers "
            f"(valid indices 0..{len(self.array.bars) - 1})",
            site=use_site,
            sections=[("the out-of-range element was formed at", [self.site.format(indent="  ")]),
                      ("allocated at", [self.array.site.short()])])


class BarrierArray:
    """``tlx.alloc_barriers``: ``num`` mbarriers of one arrive count."""

    def __init__(self, cta, name, num: int, arrive_count: int, site):
        self.cta, self.name, self.site = cta, name, site
        self.arrive_count = arrive_count
        self.bars = [MBarrier(self, i, arrive_count) for i in range(num)]

    def __getitem__(self, idx):
        from .values import as_int
        i = as_int(idx, "barrier index")
        if 0 <= i < len(self.bars):
            return self.bars[i]
        from . import source
        return BadBarrier(self, i, source.capture(2))

    def __len__(self):
        return len(self.bars)

    def describe(self) -> list:
        lines = [f"{self.name}: {len(self.bars)} x mbarrier(arrive_count={self.arrive_count}), "
                 f"allocated at {self.site.short()}"]
        for b in self.bars:
            lines.append(f"  [{b.index}] {b.state()}")
        return lines


class _Named:
    __slots__ = ("count", "arrived", "who", "vc_acc", "generation", "done_vc")

    def __init__(self):
        self.count = None
        self.arrived = 0
        self.who: list = []  # (task name, waits?, site) of this generation
        self.vc_acc: dict = {}
        self.generation = 0
        self.done_vc: dict = {}


class NamedBarriers:
    """bar.sync / bar.arrive: barrier ``id`` completes a generation once ``count`` threads have arrived or
    waited there (a task contributes its num_warps * 32 threads)."""

    def __init__(self, cta):
        self.cta = cta
        self.bars: dict = {}

    def _arrive(self, task, bar_id, count, waits, site):
        if not 0 <= bar_id < NUM_NAMED_BARRIERS:
            raise OutOfBoundsError(f"named barrier id {bar_id} is out of range (0..{NUM_NAMED_BARRIERS - 1})",
                                   site=site)
        if count <= 0 or count % 32:
            raise ProtocolError(f"named barrier {bar_id}: thread count {count} is not a positive multiple of 32 "
                                "(a warp arrives as a whole)", site=site)
        nb = self.bars.get(bar_id)
        if nb is None:
            nb = self.bars[bar_id] = _Named()
        if nb.arrived and nb.count != count:
            raise ProtocolError(
                f"named barrier {bar_id}: {task.name} arrives with a thread count of {count}, but this generation's "
                f"other participants said {nb.count}", site=site,
                sections=[("participants so far", [f"{w} ({'waits' if wt else 'arrives'}) at {s.short()}"
                                                   for w, wt, s in nb.who])])
        if any(w == task.name for w, _wt, _s in nb.who):
            raise ProtocolError(
                f"named barrier {bar_id}: {task.name} arrives a second time before the barrier completed "
                f"({nb.arrived} of {nb.count} threads arrived)", site=site,
                sections=[("participants so far", [f"{w} ({'waits' if wt else 'arrives'}) at {s.short()}"
                                                   for w, wt, s in nb.who])],
                hint="a handshake step is missing: the partner that should complete this generation never came")
        nb.count = count
        nb.arrived += task.num_threads
        nb.who.append((task.name, waits, site))
        join(nb.vc_acc, task.release())
        gen = nb.generation
        if nb.arrived > count:
            raise ProtocolError(
                f"named barrier {bar_id}: {nb.arrived} threads arrived, more than its count of {count} "
                f"({task.name} brings {task.num_threads})", site=site,
                sections=[("participants", [f"{w} ({'waits' if wt else 'arrives'}) at {s.short()}"
                                            for w, wt, s in nb.who])])
        if nb.arrived == count:
            nb.done_vc[gen] = nb.vc_acc
            nb.done_vc.pop(gen - 8, None)
            nb.vc_acc = {}
            nb.arrived = 0
            nb.who = []
            nb.count = None
            nb.generation += 1
        return nb, gen

    def arrive(self, task, bar_id, count, site) -> None:
        self._arrive(task, bar_id, count, False, site)

    def wait(self, task, bar_id, count, site) -> None:
        nb, gen = self._arrive(task, bar_id, count, True, site)
        if nb.generation <= gen:
            self.cta.sched.block(lambda: nb.generation > gen,
                                 lambda: f"named_barrier_wait({bar_id}, {count}): {nb.arrived} of {count} threads "
                                         f"arrived", site, on=("named", bar_id))
        task.acquire(nb.done_vc[gen])

    def describe(self) -> list:
        lines = []
        for bar_id in sorted(self.bars):
            nb = self.bars[bar_id]
            if nb.arrived:
                who = ", ".join(f"{w} {'waiting' if wt else 'arrived'} at {s.short()}" for w, wt, s in nb.who)
                lines.append(f"{bar_id}: {nb.arrived} of {nb.count} threads arrived "
                             f"(generation {nb.generation}): {who}")
            else:
                lines.append(f"{bar_id}: idle (generation {nb.generation})")
        return lines
