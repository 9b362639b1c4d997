"""The TLX Blackwell (sm_100a) forward on the CPU simulator (jfa.sim, arch (10, 0)): launched through its own
launcher (``jagged_forward_blackwell``) on NaN-poisoned outputs, judged by the oracle rule against the float64
oracle, and each run asserting the Blackwell kernel ran on the simulator. The catalogue is adversarial for a
jagged kernel: empty and one-token sequences, tails that are no multiple of the blocks, Lq != Lk, causal rows
that see no key, broadcast Q, grouped key/value heads, strided views, a negative scale; head dims 64 and 128,
bf16 and fp16; under the deterministic schedule (copies and MMAs land as late as possible), and seeds 1-3 (random
switches and completion order) on a core of it (``--sim-scope full``, the gate: on six cases). Fewer CTAs than
work items, so every CTA's rings and phases wrap around.
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
from jfa.kernels.tlx.common import target

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


def _launch(case, inp, schedule):
    """(out, lse, session) of the Blackwell forward on ``case``'s inputs, outputs NaN-poisoned."""
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT, schedule=schedule) as session:
        out, lse = run_forward_launcher(bw.jagged_forward_blackwell, case, inp)
    return out, lse, session


def _meets_the_oracle(case, schedule):
    inp = make_inputs(case)
    out, lse, session = _launch(case, inp, schedule)
    assert session.kernels() == [KERNEL], session.kernels()  # the Blackwell kernel ran, on the simulator
    assert not [w for r in session.reports for w in r.warnings], [r.warnings for r in session.reports]
    verdicts = forward_verdicts(case, inp, out, lse)
    assert all(v.ok for v in verdicts), "\n".join(map(str, verdicts))


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_blackwell_forward_meets_the_oracle(case):
    _meets_the_oracle(case, sim.Schedule.deterministic())


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
            target.launch(bw.jagged_fwd_blackwell_kernel, (min(items, SM_COUNT),), q.device, *args, **kwargs)
            rows = torch.zeros(q.shape[0], dtype=torch.bool)
            rows[int(cu[seq]):int(cu[seq + 1])] = True
            assert (out[~rows] == 7.0).all() and (lse[~rows] == 7.0).all(), f"sequence {seq} wrote outside its rows"
            assert torch.equal(out[rows], reference[rows]), f"sequence {seq} rows differ from the full launch"
    assert session.kernels() == [KERNEL] * (1 + len(lengths))


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
