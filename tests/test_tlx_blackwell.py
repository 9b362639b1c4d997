"""The TLX Blackwell (sm_100a) forward on the CPU simulator (jfa.sim, arch (10, 0)): launched through its own
launcher (``jagged_forward_blackwell``) on NaN-poisoned outputs, judged by the oracle rule against the float64
oracle, and each run asserting the Blackwell kernel ran on the simulator. The catalogue is adversarial for a
jagged kernel: empty and one-token sequences, tails that are no multiple of the blocks, Lq != Lk, causal rows
that see no key, broadcast Q, grouped key/value heads, strided views, a negative scale; head dims 64 and 128,
bf16 and fp16; under the deterministic schedule (copies and MMAs land as late as possible), and seeds 1-3 (random
switches and completion order) on a core of it (``--sim-scope full``, the gate: on six cases). The kernel is
scheduled by cluster launch control: one CTA per work item, of which only SM_COUNT start at once; the others are
claimed by the running CTAs (each run checks that every item was handed out once), so a CTA works several items
and its rings and phases wrap around.
The catalogue is ``jfa.fuzz.catalog.blackwell_cases()``; its mutants are killed in tests/test_mutants.py."""
import pytest
import torch

# the simulator needs Triton's interpreter (TRITON_INTERPRET=1, the CPU suite's setting): elsewhere skip
sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
from jfa.fuzz.cases import Case, make_inputs
from jfa.fuzz.catalog import blackwell_cases
from jfa.fuzz.rule import forward_verdicts, run_forward_launcher
from jfa.kernels.schedule import TileList, build_tile_list
from jfa.kernels.tlx.blackwell import forward as bw

KERNEL = "jagged_fwd_blackwell_kernel"
SM_COUNT = 2
SEEDS = (1, 2, 3)


def _case(name, lengths_q, lengths_k, **kw):
    return Case(tuple(lengths_q), tuple(lengths_k), name=name, **kw)


CATALOGUE = blackwell_cases()
# seeded schedules: the CI suite a core (empty and 1-token sequences; causal rows that see no key), the gate
# (``--sim-scope full``) every one of these
SEEDED_CORE = ("bw-empty-and-one-token-D64-bf16", "bw-causal-lq-gt-lk-D64-fp16")
SEEDED_FULL = SEEDED_CORE + ("bw-causal-lq-lt-lk-D128-fp16", "bw-bcastq-causal-D64-bf16", "bw-gqa-causal-D64-bf16",
                             "bw-many-items-causal-D128-bf16")


def pytest_generate_tests(metafunc):
    if "seeded_case" in metafunc.fixturenames:
        names = SEEDED_FULL if metafunc.config.getoption("--sim-scope") == "full" else SEEDED_CORE
        cases = [c for c in CATALOGUE if c.name in names]
        metafunc.parametrize("seeded_case", cases, ids=[c.name for c in cases])


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")


def _launch(case, inp, schedule, clc=True):
    """(out, lse, session) of the Blackwell forward on ``case``'s inputs, outputs NaN-poisoned; ``clc``: its
    cluster-launch-control build, else the static one (what a GPU runs while the toolchain lowers no CLC)."""
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT, schedule=schedule, clc=clc) as session:
        out, lse = run_forward_launcher(bw.jagged_forward_blackwell, case, inp)
    return out, lse, session


def _clc_accounts_for_every_item(report):
    """Every work item (one CTA of the grid each) was worked once: its CTA ran, or a running CTA claimed it by
    CLC; each item's request was answered and read by every partition (_NEXT_ITEM_READERS)."""
    grid = report.grid[0]
    assert report.ctas + len(set(report.cancelled)) == grid and len(set(report.cancelled)) == len(report.cancelled)
    assert report.op_counts["clc_producer"] == grid
    assert report.op_counts["clc_consumer"] == bw._NEXT_ITEM_READERS.value * grid


def _meets_the_oracle(case, schedule, clc=True):
    inp = make_inputs(case)
    out, lse, session = _launch(case, inp, schedule, clc)
    assert session.kernels() == [KERNEL], session.kernels()  # the Blackwell kernel ran, on the simulator
    report = session.last()
    if clc:
        _clc_accounts_for_every_item(report)
        if schedule.kind == "deterministic" and report.grid[0] > SM_COUNT:  # none starts early: the first claims
            assert report.cancelled == tuple(range(SM_COUNT, report.grid[0])), report.cancelled
    else:  # the static build: at most one CTA per SM, all of them run, no CLC
        assert report.grid[0] <= SM_COUNT and report.ctas == report.grid[0] and "clc_producer" not in report.op_counts
    assert not [w for r in session.reports for w in r.warnings], [r.warnings for r in session.reports]
    verdicts = forward_verdicts(case, inp, out, lse)
    assert all(v.ok for v in verdicts), "\n".join(map(str, verdicts))


@pytest.mark.parametrize("clc", [True, False], ids=["clc", "static"])
@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_blackwell_forward_meets_the_oracle(case, clc):
    """Both persistent schedules: CLC (the simulator's default on sm_100) and the static one a GPU runs while the
    toolchain does not lower CLC (``TOOLCHAIN_LOWERS_CLC``)."""
    _meets_the_oracle(case, sim.Schedule.deterministic(), clc)


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_blackwell_forward_meets_the_oracle_under_seeded_schedules(seeded_case, seed):
    _meets_the_oracle(seeded_case, sim.Schedule.seeded(seed))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["D64", "D128"])
def test_stores_stay_inside_their_own_sequence(head_dim, causal):
    """Launch only one sequence's work items into outputs holding a canary everywhere: every row outside that
    sequence (the neighbours a tile's TMA boxes read into) keeps the canary, and its own rows equal the
    full launch's."""
    lengths = [77, 130, 3, 200]
    case = _case("canary", lengths, lengths, head_dim=head_dim, causal=causal)
    inp = make_inputs(case)
    q, k, v, cu = inp.q, inp.k, inp.v, inp.cu_k
    cfg = bw.config_for(head_dim)
    full = build_tile_list(cu, q.shape[0], bw.NUM_GROUPS * cfg.block_m, work_offsets=cu)
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT) as session:
        reference, _ = bw.jagged_forward_blackwell(q, k, v, cu, cu, causal=causal, softmax_scale=head_dim ** -0.5,
                                                   broadcast_q=False, num_seqs=len(lengths))
        for seq in range(len(lengths)):
            keep = (full.tiles[0] == seq).nonzero().flatten()
            tiles = TileList(full.tiles[:, keep].contiguous(), keep.numel(), full.num_seqs, full.block)
            out = torch.full_like(q, 7.0)
            lse = torch.full(q.shape[:2], 7.0)
            args, kwargs, items = bw.kernel_arguments(q, k, v, out, lse, cu, cu, tiles, causal=causal,
                                                      softmax_scale=head_dim ** -0.5, broadcast_q=False,
                                                      num_seqs=len(lengths), len_q_bcast=0)
            bw.launch_forward(args, kwargs, items, q.device)
            rows = torch.zeros(q.shape[0], dtype=torch.bool)
            rows[int(cu[seq]):int(cu[seq + 1])] = True
            assert (out[~rows] == 7.0).all() and (lse[~rows] == 7.0).all(), f"sequence {seq} wrote outside its rows"
            assert torch.equal(out[rows], reference[rows]), f"sequence {seq} rows differ from the full launch"
    assert session.kernels() == [KERNEL] * (1 + len(lengths))


def test_clc_hands_the_waiting_ctas_items_to_the_running_ones():
    """More work items than SMs: one CTA per item is launched, only SM_COUNT start, and the rest never start:
    the running CTAs claim them by CLC and work their items (the heaviest, the lowest program ids, first)."""
    case = next(c for c in CATALOGUE if c.name == "bw-many-items-causal-D128-bf16")
    inp = make_inputs(case)
    _, _, session = _launch(case, inp, sim.Schedule.deterministic())
    report = session.last()
    assert session.kernels() == [KERNEL] and report.grid[0] > 2 * SM_COUNT
    assert report.ctas == SM_COUNT and report.cancelled == tuple(range(SM_COUNT, report.grid[0]))


@pytest.mark.parametrize("sm_count", [1, 4], ids=["one-sm", "more-sms-than-items"])
def test_a_cancel_after_the_last_item_answers_none(sm_count):
    """One work item per CTA and no CTA left to claim: every CTA's first try_cancel answers -1 (on one SM after
    the CTA has claimed the other item), so each item is worked once and every CTA ends."""
    case = _case("two-items", (100,), (100,), head_dim=64, heads=2)
    inp = make_inputs(case)
    with sim.simulated(arch=(10, 0), sm_count=sm_count) as session:
        out, lse = run_forward_launcher(bw.jagged_forward_blackwell, case, inp)
    report = session.last()
    assert session.kernels() == [KERNEL] and report.grid == (2,)
    _clc_accounts_for_every_item(report)
    assert report.cancelled == ((1,) if sm_count == 1 else ())
    assert all(v.ok for v in forward_verdicts(case, inp, out, lse))


def test_a_batch_with_no_key_launches_nothing_and_every_row_sees_none():
    """No key anywhere (TMA cannot describe an empty tensor): zeros and -inf without a launch."""
    case = _case("no-keys", (5, 3), (0, 0), head_dim=64)
    inp = make_inputs(case)
    out, lse, session = _launch(case, inp, sim.Schedule.deterministic())
    assert session.kernels() == []
    assert (out == 0).all() and (lse == float("-inf")).all()


def test_supports_says_why_not():
    """bf16/fp16 at D 64 and 128 on an sm_100 target only; sliding windows have no build; causal (the window
    (-1, 0)) does. Decided without touching a GPU."""
    q = torch.zeros(4, 2, 128, dtype=torch.bfloat16)
    ok, reason = bw.supports(q, 128, torch.bfloat16)
    assert not ok and "CUDA" in reason  # a CPU tensor with no simulator installed
    with sim.simulated(arch=(9, 0)):
        ok, reason = bw.supports(q, 128, torch.bfloat16)
        assert not ok and "sm_100" in reason
    with sim.simulated(arch=(10, 0)):
        assert bw.supports(q, 128, torch.bfloat16) == (True, "")
        assert bw.supports(q, 128, torch.bfloat16, window=(-1, 0)) == (True, "")
        assert "window" in bw.supports(q, 128, torch.bfloat16, window=(64, 0))[1]
        assert "head_dim" in bw.supports(q[..., :96], 96, torch.bfloat16)[1]
        assert not bw.supports(q.float(), 128, torch.float32)[0]
        with pytest.raises(ValueError, match="jagged_forward_blackwell"):
            bw.jagged_forward_blackwell(q, q, q, torch.tensor([0, 4]), torch.tensor([0, 4]), causal=False,
                                        softmax_scale=0.1, broadcast_q=False, num_seqs=1, window=(8, 8))


def test_the_public_op_dispatches_the_blackwell_kernels_on_sm100():
    """On an sm_100 target the op's TLX dispatch picks the Blackwell forward and backward (``which_kernels``
    says so), runs both; forward and gradients meet the oracle rule against the reference on poisoned
    outputs. A grad of out TMA cannot address is made contiguous for the Blackwell backward."""
    import jfa
    from jfa.fuzz.rule import run_case

    case = _case("dispatch", (77, 0, 130), (64, 9, 130), head_dim=64, causal=True, dout_layout="expanded")
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT) as session:
        q = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
        choice = jfa.which_kernels(q, q, q, backend="tlx")
        assert (choice.forward, choice.backward, choice.reason) == ("tlx-blackwell", "tlx-blackwell", "")
        report = run_case(case, backend="tlx", device="cpu", backward=True)
    assert (report.kernel, report.backward_kernel) == ("tlx-blackwell", "tlx-blackwell"), report.ran
    assert session.kernels() == [KERNEL, "jagged_dkdv_blackwell_kernel"]
    assert report.ok, str(report)
