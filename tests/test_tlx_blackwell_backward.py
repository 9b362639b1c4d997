"""The TLX Blackwell (sm_100a) backward on the CPU simulator (jfa.sim, arch (10, 0)). Through the public op:
the Blackwell forward, then the Blackwell dK/dV kernel with the fused dQ, on NaN-poisoned outputs, dq, dk, dv
judged by the oracle rule against the float64 oracle, each run asserting both Blackwell kernels ran on the
simulator. The catalogue (``jfa.fuzz.catalog.blackwell_cases()``) is adversarial for a jagged kernel: empty and
one-token sequences, tails, Lq != Lk, causal rows and key tiles that see nothing, broadcast Q (dq sums over the
batch), grouped key/value heads, strided views, a negative scale; D 64 and 128, bf16 and fp16; under the
deterministic schedule (copies and MMAs land as late as possible) and seeds 1-3 on a subset. Fewer CTAs than
work items, so every ring and phase wraps around. ``deterministic=True`` (the portable dQ pass after the dK/dV
kernel) is judged through its launcher and must be bitwise reproducible. ``--sim-scope full`` (the gate) runs
the whole catalogue under every schedule and both backwards; the CI suite a core (about a minute on one core)
that reaches the fused-dQ build at D 64 and 128 (bf16 and fp16, causal or not, broadcast Q) and the
deterministic one at D 64 with grouped heads. Its mutants are killed in tests/test_mutants.py."""
import pytest
import torch

# the simulator needs Triton's interpreter (TRITON_INTERPRET=1, the CPU suite's setting): elsewhere skip
sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
from jfa.fuzz.cases import Case, make_inputs
from jfa.fuzz.catalog import blackwell_cases
from jfa.fuzz.rule import backward_verdicts, run_case
from jfa.kernels.alloc import poisoned_outputs
from jfa.kernels.schedule import TileList, output_offsets
from jfa.kernels.tlx.blackwell import backward as bwb
from jfa.kernels.tlx.blackwell import forward as bwf

FORWARD = "jagged_fwd_blackwell_kernel"
KERNEL = "jagged_dkdv_blackwell_kernel"
SM_COUNT = 2
SEEDS = (1, 2, 3)
CATALOGUE = blackwell_cases()
# the CI core: empty and 1-token sequences, whole items and rows that see no key (Lq > Lk), the diagonal and
# the bulk over several key tiles (Lq < Lk), tails over several query steps, broadcast Q, grouped heads
CORE = ("bw-empty-and-one-token-D64-bf16", "bw-causal-lq-gt-lk-D128-bf16", "bw-causal-lq-lt-lk-D64-bf16",
        "bw-multi-block-tails-D64-fp16", "bw-bcastq-causal-D64-bf16", "bw-bcastq-D128-fp16")
SEEDED_CORE = ("bw-causal-lq-gt-lk-D64-fp16",)
SEEDED_FULL = ("bw-empty-and-one-token-D64-bf16", "bw-causal-lq-gt-lk-D64-fp16", "bw-causal-lq-lt-lk-D128-fp16",
               "bw-bcastq-causal-D64-bf16", "bw-gqa-causal-D64-bf16", "bw-many-items-causal-D128-bf16")
DETERMINISTIC_CORE = ("bw-gqa-causal-D64-bf16",)
# the 2-CTA build (clusters of two CTAs, a pair of adjacent key tiles an item): empty sequences and pairs whose
# second tile is past the keys (odd numbers of key tiles), tails, causal diagonals across the pair, grouped heads,
# broadcast Q, D 64 and 128
PAIR_CORE = ("bw-empty-and-one-token-D128-fp16", "bw-causal-lq-lt-lk-D64-bf16", "bw-multi-block-tails-D128-bf16",
             "bw-gqa-causal-D64-bf16")
PAIR_SEEDED_CORE = ("bw-multi-block-tails-D64-fp16",)
PAIR_SEEDED_FULL = ("bw-empty-and-one-token-D64-bf16", "bw-causal-lq-gt-lk-D64-fp16", "bw-multi-block-tails-D64-fp16",
                    "bw-bcastq-causal-D64-bf16", "bw-gqa-causal-D64-bf16", "bw-many-items-causal-D128-bf16")
PAIR_SM_COUNT = 4  # two clusters of two


def _named(names):
    return [c for c in CATALOGUE if c.name in names]


def pytest_generate_tests(metafunc):
    full = metafunc.config.getoption("--sim-scope") == "full"
    for fixture, core, everything in (("sim_case", _named(CORE), CATALOGUE),
                                      ("seeded_case", _named(SEEDED_CORE), _named(SEEDED_FULL)),
                                      ("deterministic_case", _named(DETERMINISTIC_CORE), CATALOGUE),
                                      ("pair_case", _named(PAIR_CORE), CATALOGUE),
                                      ("pair_seeded_case", _named(PAIR_SEEDED_CORE), _named(PAIR_SEEDED_FULL))):
        if fixture in metafunc.fixturenames:
            cases = everything if full else core
            metafunc.parametrize(fixture, cases, ids=[c.name for c in cases])


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")


def _meets_the_oracle_through_the_op(case, schedule):
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT, schedule=schedule) as session:
        report = run_case(case, backend="tlx", device="cpu", backward=True)
    assert (report.kernel, report.backward_kernel) == ("tlx-blackwell", "tlx-blackwell"), report.ran
    assert all(where == "tlx-sim" for _pass, _kernel, where in report.ran), report.ran
    assert session.kernels() == [FORWARD, KERNEL], session.kernels()  # both ran, on the simulator
    assert not [w for r in session.reports for w in r.warnings], [r.warnings for r in session.reports]
    assert report.ok, str(report)


def test_blackwell_backward_meets_the_oracle(sim_case):
    _meets_the_oracle_through_the_op(sim_case, sim.Schedule.deterministic())


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_blackwell_backward_meets_the_oracle_under_seeded_schedules(seeded_case, seed):
    _meets_the_oracle_through_the_op(seeded_case, sim.Schedule.seeded(seed))


def _pair_meets_the_oracle_through_the_op(case, schedule):
    """The 2-CTA dK/dV build through the public op: it ran in clusters of two CTAs (both CTAs of each cluster
    reached the final cluster barrier), and dq, dk, dv meet the rule."""
    with sim.simulated(arch=(10, 0), sm_count=PAIR_SM_COUNT, schedule=schedule, cta_pair=True) as session:
        report = run_case(case, backend="tlx", device="cpu", backward=True)
    assert (report.kernel, report.backward_kernel) == ("tlx-blackwell", "tlx-blackwell"), report.ran
    assert session.kernels() == [FORWARD, KERNEL], session.kernels()
    bwd = session.reports[-1]
    assert bwd.ctas % 2 == 0 and bwd.op_counts.get("cluster_barrier", 0) == 2 * bwd.ctas, bwd.op_counts
    assert not [w for r in session.reports for w in r.warnings], [r.warnings for r in session.reports]
    assert report.ok, str(report)


def test_two_cta_backward_meets_the_oracle(pair_case):
    _pair_meets_the_oracle_through_the_op(pair_case, sim.Schedule.deterministic())


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s}" for s in SEEDS])
def test_two_cta_backward_meets_the_oracle_under_seeded_schedules(pair_seeded_case, seed):
    _pair_meets_the_oracle_through_the_op(pair_seeded_case, sim.Schedule.seeded(seed))


def test_two_cta_build_without_the_fused_dq_meets_the_oracle():
    """deterministic=True on a simulator asked for the 2-CTA build: the dK/dV kernel's build without the fused dQ
    (dS^T's slot handed back by the pair's dK alone) in clusters of two, then the portable dQ pass."""
    case = next(c for c in CATALOGUE if c.name == "bw-gqa-causal-D64-bf16")
    inp = make_inputs(case)
    scale = case.head_dim ** -0.5
    with sim.simulated(arch=(10, 0), sm_count=PAIR_SM_COUNT, cta_pair=True) as session:
        out, lse = bwf.jagged_forward_blackwell(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=case.causal,
                                                softmax_scale=scale, broadcast_q=False, num_seqs=len(case.lengths_k))
        grads = _backward(case, inp, out, lse, True)
    assert session.kernels() == [FORWARD, KERNEL] and session.reports[-1].op_counts.get("cluster_barrier")
    verdicts = backward_verdicts(case, inp, out, grads)
    assert all(v.ok for v in verdicts), "\n".join(map(str, verdicts))


def test_the_two_cta_build_runs_only_where_a_target_asks_for_it():
    """Dispatch: the 1-CTA build unless the launch target says ``cta_pair_backward`` (a simulator asked for it);
    LaunchTarget's default, which every GPU target keeps, is the 1-CTA build."""
    from jfa.kernels.tlx.common.target import LaunchTarget, TOOLCHAIN_LOWERS_TWO_CTA

    assert LaunchTarget("x", (10, 0), 1, None).cta_pair_backward is False and not TOOLCHAIN_LOWERS_TWO_CTA
    case = next(c for c in CATALOGUE if c.name == "bw-causal-lq-gt-lk-D64-fp16")
    with sim.simulated(arch=(10, 0), sm_count=PAIR_SM_COUNT) as session:
        assert run_case(case, backend="tlx", device="cpu", backward=True).ok
    assert "cluster_barrier" not in session.reports[-1].op_counts


def test_two_cta_backward_matches_the_one_cta_build():
    """The even CTA of a pair computes its key rows' dK and dV exactly as the 1-CTA build does (the same products
    in the same order; the 2-CTA MMA's B halves rejoined), so its rows are equal bit for bit on this non-causal
    case; the odd CTA holds the head dim's halves swapped, so its S^T and dP^T sum the head dim in another order
    and its rows agree to rounding."""
    case = next(c for c in CATALOGUE if c.name == "bw-multi-block-tails-D64-fp16")
    assert not case.causal
    inp = make_inputs(case)
    kw = dict(causal=case.causal, softmax_scale=case.head_dim ** -0.5, broadcast_q=case.broadcast_q,
              num_seqs=len(case.lengths_k))
    with sim.simulated(arch=(10, 0), sm_count=PAIR_SM_COUNT):
        out, lse = bwf.jagged_forward_blackwell(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, **kw)
        one = bwb.jagged_backward_blackwell(inp.q, inp.k, inp.v, out, lse, inp.dout, inp.cu_q, inp.cu_k,
                                            dlse=inp.dlse, cta_pair=False, **kw)
        two = bwb.jagged_backward_blackwell(inp.q, inp.k, inp.v, out, lse, inp.dout, inp.cu_q, inp.cu_k,
                                            dlse=inp.dlse, cta_pair=True, **kw)
    block = bwb.config_for(case.head_dim).block_n
    cu = inp.cu_k.tolist()
    even = torch.zeros(inp.k.shape[0], dtype=torch.bool)
    for start, end in zip(cu[:-1], cu[1:]):
        rows = torch.arange(start, end)
        even[start:end] = ((rows - start) // block) % 2 == 0
    assert even.any() and (~even).any()
    for one_g, two_g in zip(one[1:], two[1:]):
        assert torch.equal(one_g[even], two_g[even])
        torch.testing.assert_close(two_g[~even].float(), one_g[~even].float(), rtol=2e-2, atol=2e-3)


def _backward(case, inp, out, lse, deterministic):
    scale = case.softmax_scale if case.softmax_scale is not None else case.head_dim ** -0.5
    with poisoned_outputs():
        return bwb.jagged_backward_blackwell(
            inp.q, inp.k, inp.v, out, lse, inp.dout, inp.cu_q, inp.cu_k, causal=case.causal, softmax_scale=scale,
            broadcast_q=case.broadcast_q, num_seqs=len(case.lengths_k),
            len_q_bcast=case.lengths_q[0] if case.broadcast_q else 0, dlse=inp.dlse, deterministic=deterministic)


def test_deterministic_backward_meets_the_oracle_and_is_bitwise_reproducible(deterministic_case):
    """deterministic=True: the dK/dV kernel without the fused dQ, then the portable dQ pass; two calls give
    the same bits, and both meet the rule."""
    case = deterministic_case
    inp = make_inputs(case)
    scale = case.softmax_scale if case.softmax_scale is not None else case.head_dim ** -0.5
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT) as session:
        out, lse = bwf.jagged_forward_blackwell(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=case.causal,
                                                softmax_scale=scale, broadcast_q=case.broadcast_q,
                                                num_seqs=len(case.lengths_k),
                                                len_q_bcast=case.lengths_q[0] if case.broadcast_q else 0)
        first = _backward(case, inp, out, lse, True)
        second = _backward(case, inp, out, lse, True)
    assert session.kernels() == [FORWARD, KERNEL, KERNEL], session.kernels()
    assert all(torch.equal(a, b) for a, b in zip(first, second)), "deterministic=True gradients differ between runs"
    verdicts = backward_verdicts(case, inp, out, first)
    assert all(v.ok for v in verdicts), "\n".join(map(str, verdicts))


@pytest.mark.parametrize("head_dim, causal", [(64, False), (128, True)], ids=["D64-full", "D128-causal"])
def test_a_key_tile_stores_stay_inside_its_own_sequence(head_dim, causal, monkeypatch):
    """The dK/dV kernel run on one sequence's key tiles only writes that sequence's dk and dv rows (the
    neighbours its TMA boxes read keep their canary), each as the full launch writes it, and its fused dQ
    reduce-adds change that sequence's dq rows only."""
    lengths = [77, 130, 3, 200]
    case = Case(tuple(lengths), tuple(lengths), name="canary", head_dim=head_dim, causal=causal)
    inp = make_inputs(case)
    q, k, v, dout, cu = inp.q, inp.k, inp.v, inp.dout, inp.cu_k
    out, lse = torch.randn_like(q), torch.randn(q.shape[:2])
    kwargs = dict(causal=causal, softmax_scale=head_dim ** -0.5, broadcast_q=False, num_seqs=len(lengths),
                  outputs=(out, dout, None))
    out_cu = output_offsets(cu, len(lengths), 0, False, q.device)
    full_dk, full_dv = torch.empty_like(k), torch.empty_like(v)
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT):
        bwb.jagged_dkdv_blackwell(q, k, v, dout, lse, None, full_dk, full_dv, out_cu, cu, **kwargs)
    real_build = bwb.build_tile_list
    for seq in range(len(lengths)):
        def one_sequence(cu_seqlens, total, block, *, work_offsets=None, seq=seq):
            full = real_build(cu_seqlens, total, block, work_offsets=work_offsets)
            keep = (full.tiles[0] == seq).nonzero().flatten()
            return TileList(full.tiles[:, keep].contiguous(), keep.numel(), full.num_seqs, full.block)

        monkeypatch.setattr(bwb, "build_tile_list", one_sequence)
        dk, dv = torch.full_like(k, 7.0), torch.full_like(v, 7.0)
        accum = torch.zeros(q.shape, dtype=torch.float32)
        with sim.simulated(arch=(10, 0), sm_count=SM_COUNT) as session:
            bwb.jagged_dkdv_blackwell(q, k, v, dout, lse, None, dk, dv, out_cu, cu, dq_accum=accum, **kwargs)
        assert session.kernels() == [KERNEL]
        rows = torch.zeros(q.shape[0], dtype=torch.bool)
        rows[int(cu[seq]):int(cu[seq + 1])] = True
        assert (dk[~rows] == 7.0).all() and (dv[~rows] == 7.0).all(), f"sequence {seq}: dk/dv outside its rows"
        assert torch.equal(dk[rows], full_dk[rows]) and torch.equal(dv[rows], full_dv[rows]), \
            f"sequence {seq}: its dk/dv rows differ from the full launch's"
        assert (accum[~rows] == 0).all(), f"sequence {seq}: dq reduce-adds outside its rows"
        assert (accum[rows] != 0).any(), f"sequence {seq}: no dq reduce-add reached its rows"


def test_a_batch_with_no_key_launches_nothing_and_every_gradient_is_zero():
    """No key anywhere (TMA cannot describe an empty tensor): zero gradients without a launch."""
    case = Case((5, 3), (0, 0), name="no-keys", head_dim=64)
    inp = make_inputs(case)
    out, lse = torch.zeros_like(inp.q), torch.full(inp.q.shape[:2], float("-inf"))
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT) as session:
        dq, dk, dv = _backward(case, inp, out, lse, False)
    assert session.kernels() == []
    assert (dq == 0).all() and dk.numel() == 0 and dv.numel() == 0


def test_supports_says_why_not():
    """bf16/fp16 at D 64 and 128 on an sm_100 target only, a TMA-readable grad of out; a sliding window is
    refused by name. Decided without touching a GPU."""
    q = torch.zeros(4, 2, 128, dtype=torch.bfloat16)
    ok, reason = bwb.supports(q)
    assert not ok and "CUDA" in reason  # a CPU tensor with no simulator installed
    with sim.simulated(arch=(9, 0)):
        ok, reason = bwb.supports(q)
        assert not ok and "sm_100" in reason
    with sim.simulated(arch=(10, 0)):
        assert bwb.supports(q, q) == (True, "")
        assert "head_dim" in bwb.supports(q[..., :96])[1]
        assert not bwb.supports(q.float())[0]
        assert "grad of out" in bwb.supports(q, q[:1].expand(4, 2, 128))[1]  # what .sum()'s backward gives
        cu = torch.tensor([0, 4])
        with pytest.raises(ValueError, match="jagged_dkdv_blackwell: window_size"):
            bwb.jagged_dkdv_blackwell(q, q, q, q, torch.zeros(4, 2), None, torch.empty_like(q), torch.empty_like(q),
                                      cu, cu, causal=False, softmax_scale=0.1, broadcast_q=False, num_seqs=1,
                                      outputs=(q, q, None), window=(8, 8))
