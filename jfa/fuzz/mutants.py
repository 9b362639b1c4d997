"""Mutation check: proof that the verification harness catches real kernel bugs.

Each :class:`Mutant` is one realistic bug, written as a single textual replacement in the source of
one of the portable kernel modules (the tile schedule, the Triton forward, the Triton backward).
:func:`applied` makes the public op ``jfa.jagged_attention`` run the mutated kernels for the duration
of a ``with`` block; :func:`kill` runs problems (a list of :class:`jfa.fuzz.cases.Case`, or a hypothesis
strategy of them) against the mutant and says whether, and how fast, the harness noticed.

A mutant's ``find`` text must occur exactly once in the current source of its module; applying a
mutant whose text is gone or ambiguous raises :class:`MutantError`, so the list cannot silently rot
when the kernels change (the test suite applies every mutant).

How a mutant is applied (and why through temporary files): the three modules are executed afresh, in
dependency order (schedule, forward, backward), from a snapshot of their current source, the target's
with the replacement applied, and registered in ``sys.modules`` (and on their parent packages) under
their real names; the API imports the launchers lazily inside its custom ops, so it picks the fresh
modules up, and modules that import names from a mutated one bind the mutated names. Triton does not
run the compiled Python function objects: the interpreter (and ``JITFunction`` on a GPU) re-reads every
``@triton.jit`` function's text with ``inspect.getsourcelines``. Compiling the mutated text under the
real file name would therefore run the UNMUTATED kernels (checked: such a mutant survives everything).
So each snapshot is written to a temporary ``.py`` file and compiled under that path; ``inspect`` then
reads exactly the text that was executed. The originals are put back on exit, also on exceptions.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import types
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

SCHEDULE = "jfa.kernels.schedule"
FORWARD = "jfa.kernels.triton.forward"
BACKWARD = "jfa.kernels.triton.backward"
MODULES = (SCHEDULE, FORWARD, BACKWARD)  # dependency order: each may import from the ones before it


class MutantError(RuntimeError):
    """A mutant no longer fits its module's source (its text is gone or occurs more than once)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # one of MODULES
    find: str  # exact source text; must occur exactly once in the module
    replace: str
    why: str  # one line: the real-world bug it models

    def apply_to(self, source: str) -> str:
        """``source`` with the replacement made; :class:`MutantError` unless ``find`` occurs exactly once."""
        if self.module not in MODULES:
            raise MutantError(f"mutant {self.name!r}: module {self.module!r} is not one of {MODULES}")
        count = source.count(self.find)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise MutantError(
                f"mutant {self.name!r}: its find text {where} in {self.module} (it must occur exactly once); "
                f"the kernel source changed, so update the mutant in jfa/fuzz/mutants.py:\n{self.find}")
        return source.replace(self.find, self.replace, 1)

    def __str__(self) -> str:
        return self.name


MUTANTS: tuple = (
    # --- tile schedule -------------------------------------------------------------------------------
    Mutant("schedule-drops-partial-tile", SCHEDULE,
           "tiles_per_seq = (lengths + block - 1) // block",
           "tiles_per_seq = lengths // block",
           "floor instead of ceil division: the last partial tile of every sequence is never launched"),
    Mutant("schedule-searchsorted-left", SCHEDULE,
           "seq = torch.searchsorted(tile_end, slot, right=True)",
           "seq = torch.searchsorted(tile_end, slot, right=False)",
           "wrong searchsorted side: the first tile of each sequence is assigned to the previous one"),
    # --- forward -------------------------------------------------------------------------------------
    Mutant("fwd-tail-mask-off-by-one", FORWARD,
           "visible = (offs_kn < len_k)[None, :]",
           "visible = (offs_kn <= len_k)[None, :]",
           "off-by-one in the tail mask: the key one past the sequence end enters the softmax"),
    Mutant("fwd-acc-not-rescaled", FORWARD,
           "acc = acc * alpha[:, None] + tl.dot(",
           "acc = acc + tl.dot(",
           "online softmax forgets to rescale the accumulator when the running max grows"),
    Mutant("fwd-no-empty-row-guard", FORWARD,
           "m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)",
           "m_use = m_new",
           "no guard for rows that have seen no key yet: exp2(-inf - -inf) = NaN poisons them"),
    Mutant("k-offsets-from-q", FORWARD,
           "k_row0 = tl.load(CU_K + seq).to(tl.int64)",
           "k_row0 = tl.load(CU_Q + seq).to(tl.int64)",
           "copy-paste: the K start offset is read from cu_seqlens_q (shared by forward and backward)"),
    Mutant("fwd-empty-kv-skips-write", FORWARD,
           "q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)\n",
           "q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)\n"
           "    if len_k == 0:\n"
           "        return\n",
           "early exit for an empty KV sequence leaves its out/lse rows unwritten (garbage, not 0 / -inf)"),
    Mutant("fwd-causal-top-left", FORWARD,
           "causal_shift = len_k - len_q",
           "causal_shift = 0",
           "causal mask aligned top-left instead of bottom-right (differs only when Lq != Lk)"),
    Mutant("fwd-lse-base2", FORWARD,
           ") * 0.6931471805599453, float(\"-inf\"))",
           "), float(\"-inf\"))",
           "lse returned in base 2 (the loop's log2 domain) instead of natural log"),
    Mutant("fwd-diagonal-unmasked", FORWARD,
           "m_start + causal_shift + 1",
           "m_start + BLOCK_M + causal_shift",
           "loop peeling puts the causal diagonal chunk in the unmasked bulk loop"),
    # --- backward ------------------------------------------------------------------------------------
    Mutant("bwd-dkdv-no-delta", BACKWARD,
           "ds_t = p_t * (dp_t - delta[None, :])",
           "ds_t = p_t * dp_t",
           "dS = P * (dP - delta) with the delta (rowsum dO * O) term forgotten in dK"),
    Mutant("bwd-dq-overwritten", BACKWARD,
           "dq += tl.dot(",
           "dq = tl.dot(",
           "dq written instead of accumulated: only the last KV chunk's contribution survives"),
    Mutant("bwd-dk-no-softmax-scale", BACKWARD,
           "dk = dk * sm_scale",
           "dk = dk",
           "the chain-rule factor softmax_scale is left out of dK"),
    Mutant("bwd-dkdv-causal-start-ignores-shift", BACKWARD,
           "tl.maximum(n_start - causal_shift, 0) // BLOCK_M",
           "n_start // BLOCK_M",
           "dK/dV start at the query tile of the diagonal for Lq == Lk: skips tiles that see the keys when Lk > Lq"),
    Mutant("bwd-dkdv-full-tile-floor", BACKWARD,
           "(tl.maximum(n_start + BLOCK_N - 1 - causal_shift, 0) + BLOCK_M - 1) // BLOCK_M",
           "tl.maximum(n_start + BLOCK_N - 1 - causal_shift, 0) // BLOCK_M",
           "floor instead of ceil for the first fully visible query tile: a diagonal tile runs unmasked in dK/dV"),
    Mutant("bwd-dq-diagonal-unmasked", BACKWARD,
           "m_start + causal_shift + 1",
           "m_start + BLOCK_M + causal_shift",
           "dQ loop peeling puts the causal diagonal chunk in the unmasked bulk loop"),
    Mutant("bwd-bcastq-dq-not-summed", BACKWARD,
           ".sum(0).to(q.dtype)",
           "[0].to(q.dtype)",
           "broadcast-Q dq takes the first sequence's partial instead of the sum over the batch"),
    Mutant("bwd-lse-gradient-dropped", BACKWARD,
           "delta = delta - dlse.to(torch.float32)",
           "delta = delta",
           "the gradient reaching the returned lse is ignored by the backward"),
    Mutant("head-dim-mask-off-by-one", FORWARD,
           "mask = offs_d < HEAD_DIM",
           "mask = offs_d <= HEAD_DIM",
           "padded head dims read one element past the head (into the next head's data)"),
)

BY_NAME = {m.name: m for m in MUTANTS}
assert len(BY_NAME) == len(MUTANTS), "mutant names must be unique"


# ----------------------------------------------------------------------------------------------------
# applying a mutant
# ----------------------------------------------------------------------------------------------------
_lock = threading.Lock()  # one mutant at a time per process: sys.modules is process-wide


def original_source(module_name: str) -> str:
    """The current on-disk source of one of :data:`MODULES` (what its loader would import now)."""
    module = sys.modules.get(module_name)
    if module is None:
        module = importlib.import_module(module_name)
    spec = module.__spec__
    source = spec.loader.get_source(module_name) if spec is not None and spec.loader is not None else None
    if source is None:
        raise MutantError(f"cannot read the source of {module_name}")
    return source


def _parent(module_name: str):
    parent_name, _, attr = module_name.rpartition(".")
    return sys.modules[parent_name], attr


_MISSING = object()


def _exec_module(module_name: str, source: str, path: str) -> types.ModuleType:
    """Write ``source`` to ``path`` and execute it as a fresh module registered under ``module_name``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)  # sets __file__ = path, __spec__, __loader__
    # registered before it runs, as the import system does (dataclasses look the module up while it runs)
    sys.modules[module_name] = module
    parent, attr = _parent(module_name)
    setattr(parent, attr, module)
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _forget_interpreted(module: types.ModuleType) -> None:
    """Drop the interpreter's cached rewrites of this module's jit functions (they pin the module)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # pragma: no cover - no interpreter in this triton
        return
    for value in list(vars(module).values()):
        if isinstance(value, InterpretedFunction):
            InterpretedFunction.rewritten_fn.pop(value.fn, None)


@contextlib.contextmanager
def applied(mutant: Mutant):
    """Within the block, ``jfa.jagged_attention`` (backend "triton") runs the kernels with ``mutant``.

    Yields the dict of fresh modules by name. Raises :class:`MutantError` (before touching anything)
    when the mutant does not fit the current source. Not re-entrant: one mutant at a time.
    """
    sources = {name: original_source(name) for name in MODULES}
    sources[mutant.module] = mutant.apply_to(sources[mutant.module])
    if not _lock.acquire(blocking=False):
        raise RuntimeError("jfa.fuzz.mutants.applied is not re-entrant: another mutant is applied")
    saved_modules = {name: sys.modules.get(name, _MISSING) for name in MODULES}
    saved_attrs = {}
    for name in MODULES:
        parent, attr = _parent(name)
        saved_attrs[name] = (parent, attr, getattr(parent, attr, _MISSING))
    tmpdir = tempfile.mkdtemp(prefix=f"jfa-mutant-{mutant.name}-")
    fresh = {}
    try:
        for name in MODULES:
            path = os.path.join(tmpdir, name.rpartition(".")[2] + ".py")
            fresh[name] = _exec_module(name, sources[name], path)
        yield fresh
    finally:
        for name in MODULES:
            if saved_modules[name] is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = saved_modules[name]
            parent, attr, value = saved_attrs[name]
            if value is _MISSING:
                if hasattr(parent, attr):
                    delattr(parent, attr)
            else:
                setattr(parent, attr, value)
        for module in fresh.values():
            _forget_interpreted(module)
        shutil.rmtree(tmpdir, ignore_errors=True)
        _lock.release()


# ----------------------------------------------------------------------------------------------------
# killing a mutant
# ----------------------------------------------------------------------------------------------------
class KillResult(NamedTuple):
    """``killed``: some problem failed the oracle rule (or raised); ``examples``: problems run up to and
    including the first failure (all of them when it survived); ``seconds``: wall time; ``detail``: the
    failing case's report (its first line names the case), or "" when the mutant survived."""

    killed: bool
    examples: int
    seconds: float
    detail: str

    @property
    def case_id(self) -> Optional[str]:
        if not self.killed:
            return None
        first = self.detail.splitlines()[0] if self.detail else ""
        return first.split("] ", 1)[-1] if first.startswith("[") else first


def _check(case, backend: str, device: str) -> Optional[str]:
    """None when ``case`` passes against the current kernels, else the failure text."""
    from jfa.fuzz.rule import run_case

    try:
        report = run_case(case, backend=backend, device=device)
    except Exception as exc:  # a crash is a detected bug too
        tail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return f"[{backend}] {case.id}\n  raised {tail}"
    return None if report.ok else str(report)


def _is_strategy(obj) -> bool:
    try:
        from hypothesis.strategies import SearchStrategy
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, SearchStrategy)


def kill(mutant: Mutant, cases_or_strategy, settings=None, *, backend: str = "triton", device: str = "cpu",
         shrink: bool = False) -> KillResult:
    """Run problems against ``mutant`` until one fails the oracle rule.

    ``cases_or_strategy``: an iterable of :class:`jfa.fuzz.cases.Case` (run in order, stopping at the first
    failing one), or a hypothesis strategy of them, run through ``@given`` under ``settings`` (a
    ``hypothesis.settings``; default: hypothesis's current profile). For a strategy, deadlines are
    switched off (interpreted kernels are slow; timing is not the verdict), the example database is not
    used (so runs are reproducible and no mutant failure is stored), and shrinking only runs with
    ``shrink=True`` (``examples`` counts up to the first failure either way).
    """
    start = time.perf_counter()
    with applied(mutant):
        if _is_strategy(cases_or_strategy):
            killed, examples, detail = _kill_with_strategy(cases_or_strategy, settings, backend, device, shrink)
        else:
            if settings is not None:
                raise TypeError("settings only apply to a hypothesis strategy, not a list of cases")
            killed, examples, detail = _kill_with_cases(cases_or_strategy, backend, device)
    return KillResult(killed, examples, time.perf_counter() - start, detail)


def _kill_with_cases(cases: Iterable, backend: str, device: str):
    examples = 0
    for case in cases:
        examples += 1
        failure = _check(case, backend, device)
        if failure is not None:
            return True, examples, failure
    return False, examples, ""


def _kill_with_strategy(strategy, settings, backend: str, device: str, shrink: bool):
    from hypothesis import Phase, given
    from hypothesis import settings as Settings

    base = settings if settings is not None else Settings()
    phases = tuple(p for p in base.phases if shrink or p not in (Phase.shrink, Phase.explain))
    run_settings = Settings(base, deadline=None, database=None, phases=phases)
    state = {"examples": 0, "first": None, "at": 0}

    @run_settings
    @given(strategy)
    def property_holds(case):
        if state["first"] is None:
            state["examples"] += 1
        failure = _check(case, backend, device)
        if failure is not None:
            if state["first"] is None:
                state["first"], state["at"] = failure, state["examples"]
            raise AssertionError(failure)

    try:
        property_holds()
    except Exception:
        if state["first"] is None:  # hypothesis itself failed (health check, unsatisfiable, ...)
            raise
    if state["first"] is not None:
        return True, state["at"], state["first"]
    return False, state["examples"], ""
