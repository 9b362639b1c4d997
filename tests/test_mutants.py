"""Mutation check: the verification harness catches realistic kernel bugs (jfa/fuzz/mutants.py).

Every mutant must still fit the current kernel source (so the list cannot rot), applying one must put
the original modules back afterwards, and the hand-written adversarial catalogue must kill every
portable mutant; a second kill test runs the hypothesis strategy ``jfa.fuzz.strategies.problems()``
under the ``ci`` profile against every portable mutant. The TLX mutants (protocol and numeric bugs of the
shipped TLX kernels) must each be killed on the CPU by the TLX catalogue on the simulator.
"""
import importlib
import inspect
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from jfa.fuzz.catalog import default_suite
from jfa.fuzz.mutants import (
    BLACKWELL_BACKWARD_MUTANTS,
    BLACKWELL_MUTANTS,
    BLACKWELL_MX_BACKWARD_MUTANTS,
    BLACKWELL_MX_MUTANTS,
    BLACKWELL_PAIR_BACKWARD_MUTANTS,
    MX_MUTANTS,
    TLX_MX_BACKWARD_MUTANTS,
    TLX_MX_MUTANTS,
    BACKWARD,
    BLOCK_SPARSE,
    BY_NAME,
    FORWARD,
    MODULES,
    MUTANTS,
    SCHEDULE,
    TLX_MODULES,
    Mutant,
    MutantError,
    applied,
    kill,
    kill_blackwell_mx_on_simulator,
    kill_blackwell_on_simulator,
    kill_on_simulator,
    original_source,
    tlx_kill_set,
)
from jfa.fuzz.cases import Case
from jfa.fuzz.rule import run_case

# mutants produce NaN/inf on purpose: numpy's warnings from inside the interpreter are expected noise
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

# the killing set: the whole hand-written catalogue (structure per dtype, every head dim); stops at the first kill
KILL_SET = default_suite()
CASES_BY_ID = {c.id: c for c in KILL_SET}
IDS = [m.name for m in MUTANTS]
PORTABLE = [m for m in MUTANTS if m.module not in TLX_MODULES]
TLX = [m for m in MUTANTS if m.module in TLX_MODULES]

# a quick case with empty sequences, Lq != Lk and a partial tile (fails under several mutants)
QUICK = Case((0, 17, 40), (0, 23, 40), causal=True, dtype="fp32", head_dim=32, name="quick-empty-leading")

# a mutant that changes nothing: the control that swapping the modules in is not itself a "kill"
IDENTITY = Mutant("identity", FORWARD, "causal_shift = len_k - len_q", "causal_shift = len_k - len_q",
                  "no bug: control for the module swap")


@pytest.fixture(autouse=True)
def _triton_backend_only(backend):
    # "auto" runs the portable kernels on the CPU (interpreter); on a GPU it runs the TLX forward instead
    if backend not in ("triton", "auto"):
        pytest.skip(f"mutants change the portable Triton kernels; --backend {backend} does not run them")


def _originals():
    return {name: importlib.import_module(name) for name in MODULES}


def _assert_restored(originals):
    for name, module in originals.items():
        assert sys.modules[name] is module, f"{name} was not restored in sys.modules"
        parent_name, _, attr = name.rpartition(".")
        assert getattr(sys.modules[parent_name], attr) is module, f"{parent_name}.{attr} was not restored"


ALL_MUTANTS = (MUTANTS + MX_MUTANTS + TLX_MX_MUTANTS + TLX_MX_BACKWARD_MUTANTS + BLACKWELL_MUTANTS
               + BLACKWELL_BACKWARD_MUTANTS + BLACKWELL_PAIR_BACKWARD_MUTANTS + BLACKWELL_MX_MUTANTS
               + BLACKWELL_MX_BACKWARD_MUTANTS)


# ----------------------------------------------------------------------------------------------------
# the mutants fit the source, apply, and are undone
# ----------------------------------------------------------------------------------------------------
def test_mutant_names_and_count():
    assert len(MUTANTS) >= 12
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.module for m in ALL_MUTANTS} == set(MODULES)
    names = [m.name for m in ALL_MUTANTS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("mutant", ALL_MUTANTS, ids=[m.name for m in ALL_MUTANTS])
def test_mutant_applies_and_is_restored(mutant, device):
    source = original_source(mutant.module)
    mutated = mutant.apply_to(source)  # raises MutantError unless the find text occurs exactly once
    assert mutated != source
    compile(mutated, f"<mutant {mutant.name}>", "exec")
    originals = _originals()
    with applied(mutant) as fresh:
        target = fresh[mutant.module]
        for name in MODULES:
            assert sys.modules[name] is fresh[name] is not originals[name]
        # Triton re-reads jit functions with inspect: it must see the mutated text, not the file on disk
        assert inspect.getsource(target) == mutated
        jit_fns = [v.fn for v in vars(target).values()
                   if inspect.isfunction(getattr(v, "fn", None)) and v.fn.__module__ == mutant.module]
        assert jit_fns or mutant.module == SCHEDULE, "no jit function found in the mutated module"
        for fn in jit_fns:
            assert inspect.getsourcefile(fn) == target.__file__
            lines, first = inspect.getsourcelines(fn)
            assert "".join(lines) == "".join(mutated.splitlines(True)[first - 1:first - 1 + len(lines)])
    _assert_restored(originals)
    report = run_case(QUICK, backend="triton", device=device)
    assert report.ok, str(report)


def test_restored_after_exception():
    originals = _originals()
    with pytest.raises(ZeroDivisionError):
        with applied(BY_NAME["fwd-lse-base2"]):
            1 / 0
    _assert_restored(originals)


def test_stale_mutants_are_rejected():
    originals = _originals()
    gone = Mutant("gone", FORWARD, "this text is not in the kernel", "x", "stale")
    with pytest.raises(MutantError, match="does not occur"):
        with applied(gone):
            pass
    twice = Mutant("twice", BACKWARD, "causal_shift = len_k - len_q", "causal_shift = 0", "ambiguous")
    with pytest.raises(MutantError, match="occurs 2 times"):
        with applied(twice):
            pass
    _assert_restored(originals)


def test_not_reentrant():
    originals = _originals()
    with applied(IDENTITY):
        with pytest.raises(RuntimeError, match="not re-entrant"):
            with applied(BY_NAME["fwd-lse-base2"]):
                pass
    _assert_restored(originals)


# ----------------------------------------------------------------------------------------------------
# kill(): controls and the strategy path
# ----------------------------------------------------------------------------------------------------
CONTROL_CASES = [CASES_BY_ID[i] for i in ("empty-leading-bf16-D32", "causal-lq-lt-lk-bf16-D32",
                                          "bcastq-lq1-bf16-D32", "tails-32-causal-fp32-D64")]


def test_identity_mutant_survives(device):
    result = kill(IDENTITY, CONTROL_CASES, device=device)
    assert not result.killed, result.detail
    assert result.examples == len(CONTROL_CASES)


def test_kill_with_a_strategy(device):
    cases = [CASES_BY_ID["empty-leading-bf16-D32"], CASES_BY_ID["causal-lq-gt-lk-bf16-D32"]]
    strategy = st.sampled_from(cases)
    quick = settings(max_examples=10, derandomize=True)
    result = kill(BY_NAME["fwd-causal-top-left"], strategy, quick, device=device)
    assert result.killed
    assert result.case_id == "causal-lq-gt-lk-bf16-D32"
    assert 1 <= result.examples <= 10
    survived = kill(IDENTITY, strategy, quick, device=device)
    assert not survived.killed and survived.examples >= 1


# ----------------------------------------------------------------------------------------------------
# the suites kill every mutant
# ----------------------------------------------------------------------------------------------------
def _on_cpu_only(device):
    if device != "cpu":
        # a mutant may read out of bounds; on a GPU that faults the CUDA context of the process, failing every
        # later test in it. The suite's power is a property of the suite: the interpreter proves it.
        pytest.skip("mutants run on the CPU interpreter (an out-of-bounds mutant would fault the GPU context)")


# the portable mutants whose kill takes minutes on 2 cores (100-240 s each, 2026-12-02: the catalogue and the
# fuzzer reach their one killing shape late): the gate kills them, the CPU suite leaves them out
SLOW_TO_KILL = frozenset({"head-dim-mask-off-by-one", "sparse-bulk-bound-of-last-row",
                          "sparse-dkdv-skips-partly-visible-chunks", "sparse-dkdv-tail-chunk-unmasked"})
PORTABLE_KILLS = [pytest.param(m, id=m.name, marks=pytest.mark.slow) if m.name in SLOW_TO_KILL else
                  pytest.param(m, id=m.name) for m in PORTABLE]


@pytest.mark.parametrize("mutant", PORTABLE_KILLS)
def test_catalog_kills(mutant, device, record_property):
    _on_cpu_only(device)
    result = kill(mutant, KILL_SET, device=device)
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, (f"mutant {mutant.name} ({mutant.why}) survived all {result.examples} catalog cases: "
                           f"a gap in the adversarial suite")
    # the same case passes once the mutant is gone: the kill was the mutation, and it was undone
    report = run_case(CASES_BY_ID[result.case_id], backend="triton", device=device)
    assert report.ok, str(report)


@pytest.mark.slow  # the fuzzer's power over the portable kernels: the gate (the catalogue's kills stay in CI)
@pytest.mark.parametrize("mutant", PORTABLE, ids=[m.name for m in PORTABLE])
def test_fuzzer_kills(mutant, device, record_property):
    _on_cpu_only(device)
    strategies = pytest.importorskip("jfa.fuzz.strategies")
    try:
        profile = settings.get_profile("ci")
    except Exception:
        pytest.skip("no hypothesis profile 'ci' registered")
    # each kernel family's mutants against the strategy's draws of that family (a campaign draws both)
    share = 1.0 if mutant.module == BLOCK_SPARSE else 0.0
    result = kill(mutant, strategies.problems(sparse_share=share), profile, device=device)
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, (f"mutant {mutant.name} ({mutant.why}) survived {result.examples} generated problems "
                           f"(hypothesis profile 'ci')")


def test_the_gate_only_kills_name_real_mutants():
    assert SLOW_TO_KILL <= {m.name for m in PORTABLE} and SLOW_ON_SIMULATOR <= {m.name for m in TLX}


def test_at_least_twelve_tlx_mutants_and_the_mx_ones_cover_every_tlx_module():
    """The MX producers (``mx_tiles``, ``mx_producers``) are covered by the TLX MX mutants (killed in
    test_mx_kernels)."""
    mx = {m.module for m in TLX_MX_MUTANTS + TLX_MX_BACKWARD_MUTANTS}
    assert len(TLX) >= 12 and {m.module for m in TLX} | mx == set(TLX_MODULES)


# the TLX mutants whose kill takes longest on the simulator (25-55 s each on 2 cores, 2026-12-02): the gate
SLOW_ON_SIMULATOR = frozenset({"tlx-sparse-bulk-miscounted", "tlx-sparse-bwd-diagonal-unmasked",
                               "tlx-wrong-sequence-offsets", "tlx-bwd-window-first-tile-late",
                               "tlx-fwd-gqa-key-head-of-query-head", "tlx-fwd-window-band-off-by-one",
                               "tlx-bwd-gqa-group-not-summed", "tlx-dynamic-item-ring-wrong-phase",
                               # 16-37 s (2026-12-03); the suite keeps the ring's tlx-fwd-item-ring-read-early
                               "tlx-fwd-item-ring-consumer-bulk-swapped"})


@pytest.mark.parametrize("mutant", [pytest.param(m, id=m.name, marks=pytest.mark.slow) if m.name in SLOW_ON_SIMULATOR
                                    else pytest.param(m, id=m.name) for m in TLX])
def test_simulator_kills(mutant, device, record_property):
    """The TLX catalogue on the simulator (deterministic schedule, then three seeds) kills every TLX mutant;
    the killing case passes once the mutant is gone."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import jfa.sim as sim

    result = kill_on_simulator(mutant, tlx_kill_set())
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, f"TLX mutant {mutant.name} ({mutant.why}) survived {result.examples} simulated cases"
    case = next(c for c in tlx_kill_set() if c.id == result.case_id)
    with sim.simulated(sm_count=3):
        report = run_case(case, backend="tlx", device="cpu")
    assert report.ok, str(report)


@pytest.mark.parametrize("mutant", BLACKWELL_MUTANTS, ids=[m.name for m in BLACKWELL_MUTANTS])
def test_simulator_kills_blackwell_mutants(mutant, device, record_property):
    """The Blackwell catalogue on the simulator (deterministic schedule, then three seeds) kills every mutant
    of the TLX Blackwell forward; the killing case passes once the mutant is gone."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import jfa.sim as sim
    from jfa.fuzz.catalog import blackwell_cases
    from jfa.fuzz.cases import make_inputs
    from jfa.fuzz.rule import forward_verdicts, run_forward_launcher
    from jfa.kernels.tlx.blackwell import forward as bw

    result = kill_blackwell_on_simulator(mutant, blackwell_cases())
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, f"Blackwell mutant {mutant.name} ({mutant.why}) survived {result.examples} simulated cases"
    case = next(c for c in blackwell_cases() if c.id == result.case_id)
    inp = make_inputs(case)
    with sim.simulated(arch=(10, 0), sm_count=2):
        out, lse = run_forward_launcher(bw.jagged_forward_blackwell, case, inp)
    verdicts = forward_verdicts(case, inp, out, lse)
    assert all(v.ok for v in verdicts), "\n".join(map(str, verdicts))


@pytest.mark.parametrize("mutant", BLACKWELL_BACKWARD_MUTANTS, ids=[m.name for m in BLACKWELL_BACKWARD_MUTANTS])
def test_simulator_kills_blackwell_backward_mutants(mutant, device, record_property):
    """The Blackwell catalogue through the public op on the simulator (deterministic schedule, then three
    seeds) kills every mutant of the TLX Blackwell backward; the killing case passes once the mutant is gone."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import jfa.sim as sim
    from jfa.fuzz.catalog import blackwell_cases

    result = kill_on_simulator(mutant, blackwell_cases(), sm_count=2, arch=(10, 0))
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, f"Blackwell mutant {mutant.name} ({mutant.why}) survived {result.examples} simulated cases"
    case = next(c for c in blackwell_cases() if c.id == result.case_id)
    with sim.simulated(arch=(10, 0), sm_count=2):
        report = run_case(case, backend="tlx", device="cpu")
    assert report.backward_kernel == "tlx-blackwell", report.ran
    assert report.ok, str(report)


# the 2-CTA build's catalogue cases: a pair with both tiles in one sequence, an odd number of key tiles, causal
PAIR_KILL_CASES = ("bw-causal-lq-lt-lk-D64-bf16", "bw-multi-block-tails-D64-fp16", "bw-gqa-causal-D64-bf16")


@pytest.mark.parametrize("mutant", BLACKWELL_PAIR_BACKWARD_MUTANTS,
                         ids=[m.name for m in BLACKWELL_PAIR_BACKWARD_MUTANTS])
def test_simulator_kills_blackwell_pair_backward_mutants(mutant, device, record_property):
    """The 2-CTA dK/dV build (clusters of two CTAs on the simulator) through the public op: every mutant of its
    cluster protocol is killed (deterministic schedule, then three seeds); the killing case passes without it."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    import jfa.sim as sim
    from jfa.fuzz.catalog import blackwell_cases

    cases = [c for c in blackwell_cases() if c.name in PAIR_KILL_CASES]
    result = kill_on_simulator(mutant, cases, sm_count=4, arch=(10, 0), cta_pair=True)
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, f"2-CTA mutant {mutant.name} ({mutant.why}) survived {result.examples} simulated cases"
    case = next(c for c in cases if c.id == result.case_id)
    with sim.simulated(arch=(10, 0), sm_count=4, cta_pair=True) as session:
        report = run_case(case, backend="tlx", device="cpu")
    assert any(r.op_counts.get("cluster_barrier") for r in session.reports), "the 2-CTA build did not run"
    assert report.ok, str(report)


@pytest.mark.parametrize("mutant", BLACKWELL_MX_MUTANTS, ids=[m.name for m in BLACKWELL_MX_MUTANTS])
def test_simulator_kills_blackwell_mx_mutants(mutant, device, record_property):
    """The Blackwell MXFP8 catalogue on the simulator, judged by bound (a) (deterministic schedule, then three
    seeds), kills every mutant of the Blackwell MX build; the killing case passes once the mutant is gone."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    from jfa.fuzz.mx import blackwell_forward_failure, blackwell_mx_cases

    result = kill_blackwell_mx_on_simulator(mutant, blackwell_mx_cases())
    record_property("examples_to_kill", result.examples)
    record_property("seconds_to_kill", round(result.seconds, 2))
    record_property("killed_by", result.case_id or "")
    assert result.killed, f"Blackwell MX mutant {mutant.name} ({mutant.why}) survived {result.examples} cases"
    case = dict(blackwell_mx_cases())[result.case_id]
    assert blackwell_forward_failure(case) is None


@pytest.mark.parametrize("mutant", MX_MUTANTS, ids=[m.name for m in MX_MUTANTS])
def test_mx_fuzzer_kills(mutant, device, record_property):
    """The MXFP8 fuzzer (bounds (a) and (b), jfa.fuzz.mx) kills every MXFP8 kernel mutant within 40 examples."""
    _on_cpu_only(device)
    import time

    from jfa.fuzz import mx

    start, killed_by, examples = time.perf_counter(), None, 0
    with applied(mutant):
        for i in range(40):
            examples += 1
            case = mx.sample_case(0, i)
            if not mx.check_mx_case(case, device).ok:
                killed_by = case.describe()
                break
    record_property("examples_to_kill", examples)
    record_property("seconds_to_kill", round(time.perf_counter() - start, 2))
    record_property("killed_by", killed_by or "")
    assert killed_by is not None, f"MX mutant {mutant.name} ({mutant.why}) survived {examples} MX fuzz examples"
    assert mx.check_mx_case(mx.sample_case(0, examples - 1), device).ok, "the killing example passes unmutated"
