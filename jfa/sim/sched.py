"""Tasks and the scheduler of one CTA.

A task is one ``async_task`` region instance (one warpgroup, executing uniformly), or the CTA's main
body. Each runs in its own Python thread, but exactly one runs at a time: the running task holds the
baton and hands it on only at a TLX synchronisation point (a wait that cannot pass, its end, or in a
seeded schedule a random TLX op). The thread that gives the baton up makes the scheduling decision
itself (which task runs next, or which in-flight copy lands first), so a switch costs one thread
hand-off. Asynchronous copies (TMA loads and stores; later tcgen05 completions) are ``AsyncOp``s in
the scheduler's in-flight list; they land when the schedule says so.

Schedules (``Schedule``): *deterministic*: each task runs until it blocks, then the next runnable task
in round-robin order; copies land only when no task can run, oldest first (the latest possible
moment: the widest window for a read that is not ordered after its copy). *seeded*: at every TLX op
the running task may be switched out (``switch_prob``), the next task is drawn at random, and at every
decision an in-flight copy may land (``land_prob``), drawn at random: random interleavings, copy
order and latency, reproducible from the seed (each CTA's generator is seeded from (seed, CTA)).

Limits: ``max_steps`` per CTA (TLX ops, pointer accesses and ``tl.range`` iterations) ends a livelock
or a runaway loop with StepLimitError; a wall-clock limit per launch ends anything else (a Python loop
with no op at all) by raising into the running task's thread.
"""
from __future__ import annotations

import ctypes
import random
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

from . import source
from .errors import DeadlockError, SimError, StepLimitError

NEW, READY, RUNNING, BLOCKED, DONE = "new", "ready", "running", "blocked", "done"


class _Abort(BaseException):
    """Unwinds a parked task's thread when its CTA is aborted (never seen by kernel code)."""


class _WallClock(_Abort):
    """Raised asynchronously into the running task's thread when the launch exceeds its time limit."""


@dataclass(frozen=True)
class Schedule:
    """How the tasks of a CTA interleave. ``Schedule.deterministic()`` or ``Schedule.seeded(seed)``."""

    kind: str = "deterministic"
    seed: Optional[int] = None
    switch_prob: float = 0.25  # seeded: chance of a switch at each TLX op
    land_prob: float = 0.3  # seeded: chance that a scheduling decision lands an in-flight copy

    @classmethod
    def deterministic(cls) -> "Schedule":
        return cls("deterministic")

    @classmethod
    def seeded(cls, seed: int, *, switch_prob: float = 0.25, land_prob: float = 0.3) -> "Schedule":
        if not 0.0 <= switch_prob <= 1.0 or not 0.0 <= land_prob <= 1.0:
            raise ValueError("Schedule.seeded: probabilities must lie in [0, 1]")
        return cls("seeded", int(seed), float(switch_prob), float(land_prob))

    def __post_init__(self):
        if self.kind not in ("deterministic", "seeded"):
            raise ValueError(f"Schedule: kind must be 'deterministic' or 'seeded', got {self.kind!r}")
        if self.kind == "seeded" and self.seed is None:
            raise ValueError("Schedule: a seeded schedule needs a seed")

    def describe(self) -> str:
        return "deterministic" if self.kind == "deterministic" else f"seeded({self.seed})"

    def dispatch_rng(self) -> Optional[random.Random]:
        """The generator of the launch's CTA dispatch (which waiting CTAs start early), None when deterministic."""
        if self.kind == "deterministic":
            return None
        return random.Random(f"jfa.sim:{self.seed}:dispatch")

    def policy(self, cta_index: tuple) -> "_Policy":
        if self.kind == "deterministic":
            return _Deterministic()
        # a string seed is hashed with SHA-512 by random.Random: stable across Python versions
        return _Seeded(random.Random(f"jfa.sim:{self.seed}:{':'.join(map(str, cta_index))}"), self.switch_prob,
                       self.land_prob)


class _Policy:
    seeded = False

    def switch_here(self) -> bool:
        return False

    def pick(self, sched, cur, runnable):
        raise NotImplementedError


class _Deterministic(_Policy):

    def pick(self, sched, cur, runnable):
        if runnable:
            n = len(sched.tasks)
            start = cur.index + 1 if cur is not None else 0
            best = None
            for t in runnable:  # round robin: the first runnable task after the current one
                key = (t.index - start) % n
                if best is None or key < best[0]:
                    best = (key, t)
            return best[1]
        if sched.inflight:
            return sched.inflight[0]
        return None


class _Seeded(_Policy):
    seeded = True

    def __init__(self, rng, switch_prob, land_prob):
        self.rng, self.switch_prob, self.land_prob = rng, switch_prob, land_prob

    def switch_here(self) -> bool:
        return self.rng.random() < self.switch_prob

    def pick(self, sched, cur, runnable):
        inflight = sched.inflight
        if inflight and (not runnable or self.rng.random() < self.land_prob):
            return inflight[self.rng.randrange(len(inflight))]
        if runnable:
            return runnable[self.rng.randrange(len(runnable))]
        return None


class AsyncOp:
    """Something in flight that completes on its own (a TMA copy): ``land()`` performs its effect."""

    kind = "async"
    __slots__ = ("sched",)

    def land(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class Wait:
    """What a blocked task waits for: ``pred()`` says whether it may pass, ``describe()`` why not."""

    __slots__ = ("pred", "describe", "site", "on")

    def __init__(self, pred, describe, site, on=None):
        self.pred, self.describe, self.site, self.on = pred, describe, site, on  # on: what it waits on


class Task:
    """One warpgroup-uniform task of a CTA (or the CTA's main body)."""

    def __init__(self, sched, index, name, label, fn, replica, num_threads, agent):
        self.sched, self.index, self.name, self.label = sched, index, name, label
        self.fn, self.replica, self.num_threads = fn, replica, num_threads
        self.state = NEW
        self.wait: Optional[Wait] = None
        self.agent = agent  # vector-clock agent id
        self.cta = None  # the CTA it belongs to (set by the CTA that spawns it)
        self.parked = False  # waiting in an async_tasks region for its tasks (they stand for its threads)
        self.vc = {agent: 1}
        self.dots: list = []  # issued wgmma groups not yet retired (oldest first)
        self.stores: list = []  # issued TMA stores not yet waited for (oldest first)
        self.go = threading.Lock()
        self.go.acquire()
        self.thread = threading.Thread(target=self._main, name=f"jfa.sim {name}", daemon=True)

    # ---- vector clock -------------------------------------------------------------------------------
    def release(self) -> dict:
        """A release: the clock as of now (everything this task did so far), then a new epoch."""
        snap = dict(self.vc)
        self.vc[self.agent] += 1
        return snap

    def acquire(self, vc: dict) -> None:
        mine = self.vc
        for k, v in vc.items():
            if mine.get(k, 0) < v:
                mine[k] = v

    # ---- thread ---------------------------------------------------------------------------------------
    def _main(self):
        sched = self.sched
        self.go.acquire()
        if sched.aborted:
            return
        try:
            self.fn()
        except _Abort:
            return
        except BaseException as exc:  # noqa: BLE001 - reported by the launching thread
            sched.fail(exc, self)
            return
        try:
            sched.task_done(self)
        except _Abort:
            return
        except BaseException as exc:  # noqa: BLE001
            sched.fail(exc, self)


class Scheduler:
    """Runs the tasks of one CTA, one at a time, as the policy says."""

    def __init__(self, policy: _Policy, *, max_steps: int, deadline: float, on_task_done=None,
                 on_all_done=None, describe_state=None, on_switch=None):
        self.policy = policy
        self.max_steps = max_steps
        self.deadline = deadline
        self.tasks: list = []
        self.inflight: list = []
        self.current: Optional[Task] = None
        self.switches = 0
        self.steps = 0
        self.landed = 0
        self.error: Optional[BaseException] = None
        self.error_task: Optional[Task] = None
        self.aborted = False
        self.finished = threading.Lock()
        self.finished.acquire()
        self.on_task_done = on_task_done  # hook(task): checks at a task's end (may raise)
        self.on_all_done = on_all_done  # hook(): checks when every task has finished (may raise)
        self.describe_state = describe_state  # () -> list of sections, for deadlock/step-limit reports
        self.on_switch = on_switch  # hook(task): the task about to run (a cluster's CTAs share one scheduler)
        self.live = 0  # tasks not finished
        self._end_checked = False

    # ---- from the CTA (any task thread) --------------------------------------------------------------
    def spawn(self, name, label, fn, replica, num_threads, agent) -> Task:
        t = Task(self, len(self.tasks), name, label, fn, replica, num_threads, agent)
        self.tasks.append(t)
        self.live += 1
        t.thread.start()  # it parks until handed the baton
        return t

    def _step_limit(self):
        err = StepLimitError(f"the CTA ran past its step limit of {self.max_steps} steps (TLX ops, pointer "
                             "accesses and tl.range iterations): a livelock or a runaway loop",
                             site=source.capture(3),
                             hint="raise max_steps if the kernel really needs more; otherwise look for a loop "
                                  "whose bound never stops it, or tasks that keep each other busy without "
                                  "progress")
        self._add_state(err)
        raise err

    def _add_state(self, err: SimError) -> None:
        if self.describe_state is not None:
            for title, lines in self.describe_state():
                err.add_section(title, lines)

    def maybe_switch(self) -> None:
        """A seeded schedule's switch point (every TLX op)."""
        if self.policy.switch_here():
            cur = self.current
            cur.state = READY
            self._reschedule(cur)
            cur.state = RUNNING

    def block(self, pred, describe, site=None, on=None) -> None:
        """Block the running task until ``pred()`` holds (``on``: the barrier it waits on, for reports)."""
        if pred():
            return
        cur = self.current
        cur.state = BLOCKED
        cur.wait = Wait(pred, describe, site if site is not None else source.capture(3), on)
        self._reschedule(cur)
        cur.state = RUNNING
        cur.wait = None

    def task_done(self, task: Task) -> None:
        if self.on_task_done is not None:
            self.on_task_done(task)
        task.state = DONE
        self.live -= 1
        self._reschedule(task)

    def land(self, op: AsyncOp) -> None:
        self.inflight.remove(op)
        self.landed += 1
        op.land()

    def _runnable(self):
        out = []
        for t in self.tasks:
            st = t.state
            if st == READY or st == NEW:
                out.append(t)
            elif st == BLOCKED and t.wait.pred():
                out.append(t)
        return out

    def _reschedule(self, cur: Task) -> None:
        """Run in ``cur``'s thread: decide what happens next; return when ``cur`` runs again."""
        while True:
            if self.aborted:
                raise _Abort()
            if self.live == 0:  # every task has finished: the CTA's end
                if not self._end_checked:
                    self._end_checked = True
                    if self.on_all_done is not None:
                        self.on_all_done()  # may raise (a load still in flight), may leave stores to land
                if self.inflight:
                    self.land(self.inflight[0])
                    continue
                self.finished.release()
                return
            runnable = self._runnable()
            choice = self.policy.pick(self, cur, runnable)
            if choice is None:
                self._deadlock()
            if isinstance(choice, AsyncOp):
                self.land(choice)
                continue
            if choice is cur:
                return
            self.switches += 1
            self.current = choice
            if self.on_switch is not None:
                self.on_switch(choice)
            choice.state = RUNNING
            choice.go.release()
            if cur.state == DONE:
                return
            cur.go.acquire()
            if self.aborted:
                raise _Abort()
            return

    def _deadlock(self):
        live = [t for t in self.tasks if t.state != DONE]
        err = DeadlockError(f"no task can run and no copy is in flight: {len(live)} of {len(self.tasks)} tasks "
                            "are blocked for ever", site=None,
                            hint="each blocked task waits for a barrier phase nobody will complete: check the phase "
                                 "(parity) each wait expects, the arrive counts, the expect-tx bytes against the "
                                 "copies, and that every handshake's partner arrives")
        self._add_state(err)
        raise err

    def fail(self, exc: BaseException, task: Optional[Task] = None) -> None:
        if self.error is None:
            self.error, self.error_task = exc, task
        self.aborted = True
        try:
            self.finished.release()
        except RuntimeError:
            pass

    # ---- from the launching thread -------------------------------------------------------------------
    def run(self, main: Task) -> None:
        """Hand the baton to ``main`` and wait until every task has finished or something failed."""
        self.current = main
        if self.on_switch is not None:
            self.on_switch(main)
        main.state = RUNNING
        main.go.release()
        timed_out = False
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if self.finished.acquire(timeout=min(remaining, 5.0)):
                break
        if timed_out:
            self._wall_clock()
        self._shutdown()
        if self.error is not None:
            raise self.error

    def _wall_clock(self):
        cur = self.current
        frame = sys._current_frames().get(cur.thread.ident) if cur is not None and cur.thread.ident else None
        site = source.capture_frame(frame) if frame is not None else None
        err = StepLimitError("the launch ran past its wall-clock limit (a loop that never reaches a TLX op, or "
                             "a very long kernel)", site=site,
                             hint="raise timeout_s if the kernel really needs longer; the site is where the "
                                  "running task was when the limit struck")
        self._add_state(err)
        if self.error is None:
            self.error, self.error_task = err, cur
        self.aborted = True
        if cur is not None and cur.thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(cur.thread.ident),
                                                       ctypes.py_object(_WallClock))

    def _shutdown(self):
        """Unwind every parked task thread (after a failure) and join them all."""
        if self.aborted:
            for t in self.tasks:
                if t.state != DONE:
                    try:
                        t.go.release()
                    except RuntimeError:
                        pass
        for t in self.tasks:
            t.thread.join(timeout=10.0)
