"""The TLX Hopper kernels on a real GPU: the catalogue's TLX cases through the public op, forward and
backward (fused dQ and deterministic), each asserting the TLX kernels ran; dispatch and its visible
fallbacks; stores that stay inside their own sequence; the reported ablations (bitwise equal to what
ships, or judged by the rule where they round differently); the self-resetting dynamic counter; the
timeline build; the D 128 build's compile setting; torch.compile; CUDA-graph capture of a training step."""
import logging

import pytest
import torch

import jfa
from jfa import knobs
from jfa.api import recording_dispatch
from jfa.bench.timeline import columns
from jfa.fuzz.catalog import tlx_cases
from jfa.fuzz.cases import Case, offsets
from jfa.fuzz.rule import run_case
from jfa.kernels.schedule import TileList, build_tile_list
from jfa.kernels.tlx.common.host import work_counter
from planned_calls import (SPARSE_RULE_IDS, SPARSE_RULES, planned_cases, run_twice, sparse_planned_and_unplanned,
                           spy_on_planned_launchers)
from profiled_dkdv import assert_one_ordered_record_per_item, field, profiled_dkdv, query_steps

pytestmark = pytest.mark.gpu

tlx_forward = pytest.importorskip("jfa.kernels.tlx.hopper.forward")
tlx_backward = pytest.importorskip("jfa.kernels.tlx.hopper.backward")


@pytest.fixture(scope="module", autouse=True)
def hopper(device):
    if device != "cuda" or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 (Hopper) GPU")


def packed(lengths, heads=2, head_dim=128, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    return q, k, v, offsets(lengths, torch.int32, "cuda")


def run(q, k, v, cu, *, causal=False, **kw):
    return tlx_forward.jagged_forward_tlx(q, k, v, cu, cu, causal=causal, softmax_scale=q.shape[-1] ** -0.5,
                                          broadcast_q=False, num_seqs=cu.numel() - 1, **kw)


def _spy_on_fused_dq(monkeypatch) -> list:
    """For each dK/dV launch, whether it got a dQ accumulator (the fused dQ ran, not the portable pass)."""
    launches = []
    original = tlx_backward.jagged_dkdv_tlx

    def spy(*args, **kwargs):
        launches.append(kwargs.get("dq_accum") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(tlx_backward, "jagged_dkdv_tlx", spy)
    return launches


CASES = tlx_cases("gpu")
BACKWARDS = ("fused-dq", "deterministic")


@pytest.mark.parametrize("dq", BACKWARDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tlx_kernels_meet_the_oracle(case, dq, monkeypatch, record_property):
    """The TLX forward, then the TLX backward (its dK/dV kernel with the fused dQ, or with the portable dQ
    pass as deterministic=True runs it), through the public op on NaN-poisoned outputs, judged by the rule."""
    launches = _spy_on_fused_dq(monkeypatch)
    with knobs.scope(tlx_fused_dq=dq == "fused-dq"):
        report = run_case(case, backend="tlx", device="cuda", backward=True)
    tlx = "tlx-hopper-block-sparse" if case.sparse else "tlx-hopper"
    assert (report.kernel, report.backward_kernel) == (tlx, tlx), report.ran
    if case.lengths_k and case.lengths_q and sum(case.lengths_k) and sum(case.lengths_q):
        # the fused dQ runs where the knob asks for it, grouped heads included
        assert launches and all(launch == (dq == "fused-dq") for launch in launches), launches
    record_property("verdicts", str({v.name: [v.error, v.allowed] for v in report.verdicts}))
    assert report.ok, str(report)


PLANNED = planned_cases(CASES)


@pytest.mark.parametrize("case", PLANNED, ids=[c.id for c in PLANNED])
def test_a_planned_call_meets_the_oracle(case, monkeypatch):
    """A call on offsets a call of the same structure had (a model's next layer or step) takes the call
    plan (``jfa.plans``): the launches prepared on the GPU, then judged by the rule."""
    ran = spy_on_planned_launchers(monkeypatch)
    first, second = run_twice(case, "cuda", monkeypatch)
    assert first.ok, str(first)
    assert (second.kernel, second.backward_kernel) == ("tlx-hopper", "tlx-hopper"), second.ran
    assert ran == {"forward": 1, "backward": 1}, "the second call did not take the prepared launches"
    assert second.ok, str(second)


@pytest.mark.parametrize("rule", SPARSE_RULES, ids=SPARSE_RULE_IDS)
def test_a_planned_block_sparse_call_returns_what_an_unplanned_call_returns(rule, monkeypatch):
    """The simulator test of the same name on the GPU: the prepared launch replaces the lists' indices, so a
    call whose values select other blocks returns the unplanned call's out, lse and gradients, bit for bit."""
    ran = spy_on_planned_launchers(monkeypatch)
    planned, unplanned, checks = sparse_planned_and_unplanned(rule, "cuda", monkeypatch)
    assert checks == [1, 0, 1] and ran["forward"] == 1, "the second call was not planned"
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), planned, unplanned):
        assert torch.equal(a, b), f"{name}: the planned call differs from the unplanned one"


ABLATION_CASES = [c for c in CASES if c.name.startswith(("tlx-many-items", "tlx-long-items", "tlx-tails"))
                  and c.dtype == "bf16"]


@pytest.mark.parametrize("case", ABLATION_CASES, ids=[c.id for c in ABLATION_CASES])
def test_the_backward_one_cta_per_item_meets_the_oracle(case):
    """The backward's persistence ablation (one CTA per work item: the K/V phase then comes from a
    one-round count) judged like what ships."""
    with knobs.scope(tlx_bwd_variant="persistent=0"):
        report = run_case(case, backend="tlx", device="cuda", backward=True)
    assert report.backward_kernel == "tlx-hopper" and report.ok, str(report)


PREFETCH_CASES = [c for c in ABLATION_CASES if c.head_dim == 64]


@pytest.mark.parametrize("case", PREFETCH_CASES, ids=[c.id for c in PREFETCH_CASES])
def test_k_and_v_prefetched_for_the_next_item_meet_the_oracle(case):
    """Two K/V slot pairs (``item_prefetch``: the producer's-dQ build at D 64 starts the next item's loads during
    this one) judged like what ships."""
    with knobs.scope(tlx_bwd_variant="item_prefetch=always", tlx_fused_dq=True):
        report = run_case(case, backend="tlx", device="cuda", backward=True)
    assert report.backward_kernel == "tlx-hopper" and report.ok, str(report)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_k_and_v_prefetched_give_bitwise_the_gradients_of_one_slot_pair(causal):
    """dK and dV are the same bits whether the producer starts an item's loads at its start (one K/V slot pair)
    or during the previous item (tails of every kind, sequences spanning several work items, empty ones; static
    and counter schedules)."""
    g = torch.Generator().manual_seed(6)
    lengths = [int(x) for x in torch.randint(0, 700, (60,), generator=g)] + [0, 1, 64, 128, 129]
    q, k, v, cu = packed(lengths, heads=3, head_dim=64)
    out, lse = run(q, k, v, cu, causal=causal)
    dout = torch.randn_like(out)
    kwargs = dict(causal=causal, softmax_scale=64 ** -0.5, broadcast_q=False, num_seqs=len(lengths))
    one_pair, prefetched = (
        tlx_backward.jagged_backward_tlx(q, k, v, out, lse, dout, cu, cu,
                                         variant=tlx_backward.BackwardVariant(item_prefetch=when), **kwargs)
        for when in ("never", "always"))
    for name, a, b in zip(("dk", "dv"), one_pair[1:], prefetched[1:]):
        assert torch.equal(a, b), f"{name} differs with the next item prefetched"
    torch.testing.assert_close(prefetched[0], one_pair[0], rtol=1e-2, atol=1e-2)  # dq: reduce-adds in any order


def test_auto_runs_tlx_for_bf16_and_fp16_d64_d128():
    for dtype in (torch.bfloat16, torch.float16):
        for head_dim in (64, 128):
            q, k, v, cu = packed([5], head_dim=head_dim, dtype=dtype)
            choice = jfa.which_kernels(q, k, v)
            assert (choice.forward, choice.backward, choice.reason) == ("tlx-hopper", "tlx-hopper", "")
            q.requires_grad_()
            with recording_dispatch() as ran:
                jfa.jagged_attention(q, k, v, cu, cu).sum().backward()
            assert ran == [("forward", "tlx-hopper", "cuda"), ("backward", "tlx-hopper", "cuda")]


@pytest.mark.parametrize("dtype, head_dim, words", [(torch.float32, 128, "dtype"), (torch.bfloat16, 96, "head_dim")],
                         ids=["fp32", "D96"])
def test_auto_falls_back_to_portable_visibly(dtype, head_dim, words, caplog):
    q, k, v, cu = packed([5, 9], head_dim=head_dim, dtype=dtype)
    choice = jfa.which_kernels(q, k, v)
    assert choice.forward == "triton" and words in choice.reason
    jfa.dispatch._fallbacks_logged.discard(choice.reason)
    with caplog.at_level(logging.INFO, logger="jfa"), recording_dispatch() as ran:
        jfa.jagged_attention(q, k, v, cu, cu)
        jfa.jagged_attention(q, k, v, cu, cu)
    assert ran == [("forward", "triton", "cuda")] * 2
    logged = [r for r in caplog.records if "portable" in r.getMessage()]
    assert len(logged) == 1 and words in logged[0].getMessage()  # once per distinct reason


def test_explicit_tlx_refuses_what_it_cannot_run():
    q, k, v, cu = packed([5, 9], head_dim=96)
    with pytest.raises(ValueError, match="backend: 'tlx' cannot run this call: head_dim 96"):
        jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["D64", "D128"])
def test_stores_stay_inside_their_own_sequence(head_dim, causal):
    """Launch only the tiles of one sequence into an output that holds a canary everywhere: every row
    outside that sequence (the neighbours a tile's TMA box reads into) must keep the canary."""
    lengths = [77, 130, 3, 200]  # tails of every kind around the chosen sequence
    q, k, v, cu = packed(lengths, head_dim=head_dim)
    cfg = tlx_forward.config_for(head_dim)
    full = build_tile_list(cu, q.shape[0], tlx_forward.NUM_CONSUMERS * cfg.block_m, work_offsets=cu)
    reference, _ = run(q, k, v, cu, causal=causal)
    for seq in range(len(lengths)):
        keep = (full.tiles[0] == seq).nonzero().flatten()
        tiles = TileList(full.tiles[:, keep].contiguous(), keep.numel(), full.num_seqs, full.block)
        out = torch.full_like(q, 7.0)
        lse = torch.full(q.shape[:2], 7.0, device="cuda")
        counter = torch.zeros(2, dtype=torch.int32, device="cuda")
        timeline = torch.zeros(1, 4, dtype=torch.int64, device="cuda")
        args, kwargs, items = tlx_forward.kernel_arguments(
            q, k, v, out, lse, cu, cu, tiles, counter, timeline, causal=causal, softmax_scale=head_dim ** -0.5,
            broadcast_q=False, num_seqs=len(lengths), len_q_bcast=0)
        tlx_forward.jagged_fwd_tlx_kernel[(min(items, 4),)](*args, **kwargs)
        rows = torch.zeros(q.shape[0], dtype=torch.bool, device="cuda")
        rows[int(cu[seq]):int(cu[seq + 1])] = True
        assert (out[~rows] == 7.0).all() and (lse[~rows] == 7.0).all(), f"sequence {seq} wrote outside its rows"
        assert torch.equal(out[rows], reference[rows]), f"sequence {seq} rows differ from the full launch"


VARIANTS = [tlx_forward.Variant(schedule="dynamic"), tlx_forward.Variant(persistent=False),
            tlx_forward.Variant(longest_first=False), tlx_forward.Variant(pingpong=False)]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name() for v in VARIANTS])
def test_schedule_and_ablation_variants_compute_bitwise_the_same(variant):
    """Each work item is computed the same way wherever and whenever it runs: a schedule changes
    which CTA runs it, not one bit of the result."""
    g = torch.Generator().manual_seed(3)
    lengths = [int(x) for x in torch.randint(0, 700, (300,), generator=g)]
    q, k, v, cu = packed(lengths, heads=3)
    for causal in (False, True):
        out, lse = run(q, k, v, cu, causal=causal)
        for _ in range(2):  # twice: the dynamic counter must have reset itself
            got_out, got_lse = run(q, k, v, cu, causal=causal, variant=variant)
            assert torch.equal(got_out, out) and torch.equal(got_lse, lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unpeeled_variant_meets_the_oracle(causal):
    """Peeling off (every block through the masked softmax) rounds differently from the shipped bulk
    loop, so it is judged by the rule, through the API (knobs.tlx_variant), not against the shipped output."""
    case = Case((1000, 129, 128, 127, 0, 64), (1000, 129, 128, 127, 0, 64), heads=2, head_dim=128, dtype="bf16",
                causal=causal, name="tlx-no-peel")
    with knobs.scope(tlx_variant="peel=0"):
        report = run_case(case, backend="tlx", device="cuda", backward=False)
    assert report.kernel == "tlx-hopper" and report.ok, str(report)


@pytest.mark.parametrize("head_dim, switches", [(64, "q_regs=0"), (128, "q_regs=1")],
                         ids=["D64-Q-from-shared-memory", "D128-Q-from-registers"])
def test_the_other_q_operand_meets_the_oracle(head_dim, switches):
    """The bulk loop's Q operand other than the config's (an ablation build) meets the rule through the API."""
    case = Case((1000, 129, 128, 127, 0, 64), (1000, 129, 128, 127, 0, 64), heads=2, head_dim=head_dim, dtype="bf16",
                causal=True, name="tlx-q-operand")
    with knobs.scope(tlx_variant=switches):
        report = run_case(case, backend="tlx", device="cuda", backward=False)
    assert report.kernel == "tlx-hopper" and report.ok, str(report)


def test_dynamic_counter_is_zero_after_each_launch():
    q, k, v, cu = packed([300, 0, 900, 5] * 20)
    run(q, k, v, cu, variant=tlx_forward.Variant(schedule="dynamic"))
    torch.cuda.synchronize()
    assert torch.equal(work_counter(q.device).cpu(), torch.zeros(2, dtype=torch.int32))


def test_long_causal_sequences_take_the_counter_and_compute_bitwise_what_zigzag_computes():
    """Causal launches whose uneven sequences average LONG_CAUSAL_TILES items take the counter (``for_launch``); a
    schedule changes which CTA runs an item, not one bit of it, and the counter is zero after each launch."""
    lengths = [1500, 0, 900, 2000, 5] * 6
    q, k, v, cu = packed(lengths)
    launch = dict(causal=True, window=(-1, -1), rows=sum(lengths), num_seqs=len(lengths), tile_rows=128,
                  longest_rows=max(lengths))
    assert tlx_forward.SHIPPED.for_launch(**launch).dynamic
    zigzag = tlx_forward.Variant(long_causal_schedule="zigzag")
    assert not zigzag.for_launch(**launch).dynamic
    want_out, want_lse = run(q, k, v, cu, causal=True, variant=zigzag, longest_q=max(lengths))
    for _ in range(2):
        out, lse = run(q, k, v, cu, causal=True, variant=tlx_forward.SHIPPED, longest_q=max(lengths))
        torch.cuda.synchronize()
        assert torch.equal(work_counter(q.device).cpu(), torch.zeros(2, dtype=torch.int32))
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_the_block_sparse_backward_leaves_the_dynamic_counter_zero():
    """The block-sparse dK/dV kernel takes its items from the stream's counter (it ships with the dynamic
    schedule): zero again after its launch, so the next launch on the stream starts from item 0."""
    q, k, v, cu = packed([300, 0, 900, 5] * 20)
    q.requires_grad_(True)
    with recording_dispatch() as ran:
        out = jfa.block_sparse_attention(q, k, v, cu, cu, keep_ratio=0.5, causal=True)
        out.float().square().sum().backward()
    torch.cuda.synchronize()
    assert ran[-1] == ("backward", "tlx-hopper-block-sparse", "cuda"), ran
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert torch.equal(work_counter(q.device).cpu(), torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("schedule", tlx_forward.SCHEDULES)
def test_timeline_records_every_item_once(schedule):
    q, k, v, cu = packed([300, 0, 900, 5, 4096] * 8)
    variant = tlx_forward.Variant(schedule=schedule)
    out, lse, timeline = run(q, k, v, cu, variant=variant, profile=True)
    plain_out, _ = run(q, k, v, cu, variant=variant)
    assert torch.equal(out, plain_out)  # the profiling build computes the same
    rec = columns(timeline.records.cpu(), tlx_forward.PROFILE_FIELDS)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert (rec["sm"] >= 0).all() and (rec["sm"] < sms).all(), "an item was never recorded, or a bad SM id"
    assert (rec["end_ns"] >= rec["start_ns"]).all() and (rec["start_ns"] > 0).all()
    assert (rec["cta"] >= 0).all() and (rec["cta"] < timeline.grid).all()
    assert timeline.seq.numel() == timeline.records.shape[0]


@pytest.mark.parametrize("prefetch", ["never", "always"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_dkdv_profiling_build_records_every_item_once(head_dim, causal, prefetch):
    """The dK/dV kernel's profiling build (static schedule, or the counter's under causal; with one K/V slot pair
    or, at D 64, two: ``item_prefetch``) writes the dK and dV bits its build without profiling does and one
    record per item: a real SM, its phases in order on the SM clock, the CTA's items one after another, and
    (without the mask) every query step counted once."""
    lengths = [300, 0, 900, 5, 1024] * 8
    q, k, v, cu = packed(lengths, head_dim=head_dim)
    variant = tlx_backward.BackwardVariant(item_prefetch=prefetch)
    records = profiled_dkdv(q, k, v, cu, causal=causal, variant=variant)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    two_pairs = variant.kv_buffers(tlx_backward.config_for(head_dim, True)) == 2
    assert_one_ordered_record_per_item(records, grid=sms, item_prefetch=two_pairs)
    assert (field(records, "sm") < sms).all()
    if not causal:  # (causal: a key tile's steps start at its diagonal)
        assert int(field(records, "steps").sum()) == query_steps(lengths, q.shape[1], head_dim)


def test_the_step_trace_logs_cta_0s_steps_in_cycle_order():
    """The profiling build with ``trace_steps`` computes what the plain build does and logs CTA 0's steps of
    both consumers, each row's SM clock stamps in order, the consumers' rows for the same steps."""
    q, k, v, cu = packed([4096] * 8)  # 512 items: the zig-zag deals CTA 0 at least two (with 4 sequences, one)
    out, lse, timeline = run(q, k, v, cu, profile=True, trace_steps=64)
    plain_out, plain_lse = run(q, k, v, cu)
    assert torch.equal(out, plain_out) and torch.equal(lse, plain_lse)
    steps = timeline.steps.cpu()
    logged = (steps >= 0).all(-1)
    assert torch.equal(logged, (steps >= 0).any(-1)) and torch.equal(logged[0], logged[1])
    assert logged[0].sum() >= 60, logged  # 32 blocks an item: one peeled block in each of the first two
    stamps = steps[logged]
    assert (stamps[:, 1:] >= stamps[:, :-1]).all(), stamps


def test_d128_fused_backward_runs_the_build_compiled_without_llvm_optimisation(monkeypatch):
    """The D 128 fused backward's launcher asks for its build's LLVM IR to skip LLVM's optimisation
    (HopperDkDvConfig.llvm_o0): after one backward the dK/dV kernel's cache holds a build under that
    setting's key, and such builds spill nothing (with LLVM's optimisation this one spills)."""
    case = Case((300, 0, 77), (300, 0, 77), heads=2, head_dim=128, dtype="bf16", name="d128-fused")
    launches = _spy_on_fused_dq(monkeypatch)
    with knobs.scope(tlx_llvm_o0=None, tlx_fused_dq=True):
        report = run_case(case, backend="tlx", device="cuda", backward=True)
    assert report.ok and report.backward_kernel == "tlx-hopper" and launches and all(launches), str(report)
    kernel_cache = tlx_backward.jagged_dkdv_tlx_kernel.device_caches[torch.cuda.current_device()][0]
    unoptimised = [kernel for key, kernel in kernel_cache.items() if "jfa-llvm-o0-jagged_dkdv_tlx_kernel" in str(key)]
    assert unoptimised, "no dK/dV build was compiled without LLVM's optimisation"
    assert all(kernel.n_spills == 0 for kernel in unoptimised)


def test_deterministic_switches_the_fused_dq_off(monkeypatch):
    """deterministic=True takes dQ from the portable pass (rows written once, fixed order), even when the
    fused reduction is the default: bitwise equal over reruns on a contended broadcast Q."""
    launches = _spy_on_fused_dq(monkeypatch)
    q, k, v, cu = packed([300, 0, 77, 512] * 16, head_dim=64)
    q = q[:128].contiguous()
    dout = torch.randn(cu.numel() - 1, 128, q.shape[1], 64, device="cuda", dtype=q.dtype).flatten(0, 1)
    grads = []
    with knobs.scope(tlx_fused_dq=True):
        for _ in range(3):
            qq = q.detach().requires_grad_()
            jfa.jagged_attention(qq, k, v, None, cu, broadcast_q=True, deterministic=True).backward(dout)
            grads.append(qq.grad)
    assert all(torch.equal(g, grads[0]) for g in grads)
    assert launches and not any(launches)  # every dK/dV launch without the fused dQ


def test_a_grad_tma_cannot_address_is_copied_and_the_tlx_backward_runs():
    """A grad of out whose rows TMA cannot address (odd row stride) is copied to a contiguous one and the
    TLX backward runs on it: bitwise what it gives on that copy."""
    q, k, v, cu = packed([5, 9], head_dim=64)
    q.requires_grad_()
    out = jfa.jagged_attention(q, k, v, cu, cu, deterministic=True)
    wide = torch.randn(out.shape[0], out.shape[1], out.shape[2] + 1, device="cuda", dtype=out.dtype)
    dout = wide[..., :out.shape[2]]  # row stride 2 * 65 elements: not 16-byte aligned
    with recording_dispatch() as ran:
        out.backward(dout)
    assert ran == [("backward", "tlx-hopper", "cuda")]
    q2 = q.detach().clone().requires_grad_()
    jfa.jagged_attention(q2, k, v, cu, cu, deterministic=True).backward(dout.contiguous())
    assert torch.equal(q.grad, q2.grad)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_a_training_step_under_torch_compile_runs_the_tlx_kernels(head_dim):
    """torch.compile traces the TLX custom ops and their autograd formula with fake tensors (the
    backward's kernel is chosen when its op runs): one graph (fullgraph) computes bitwise what the eager
    path does (deterministic dQ). Through jagged_attention the dispatch reads tensor addresses (TMA
    alignment), a graph break, and the result is the same too."""
    from jfa import api

    q, k, v, cu = packed([300, 0, 77, 512], head_dim=head_dim)
    dout = torch.randn_like(q)
    num_seqs = cu.numel() - 1
    assert jfa.which_kernels(q, k, v).backward == "tlx-hopper"

    def ops(q, k, v):
        return api._attention("tlx", q, k, v, cu, cu, True, head_dim ** -0.5, False, num_seqs, 0, 512, -1, -1,
                              True)[0]

    def public(q, k, v):
        return jfa.jagged_attention(q, k, v, cu, cu, causal=True, deterministic=True)

    for step, fullgraph in ((ops, True), (public, False)):
        torch._dynamo.reset()
        results = []
        for fn in (torch.compile(step, backend="aot_eager", fullgraph=fullgraph), step):
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            with recording_dispatch() as ran:
                out = fn(qq, kk, vv)
                out.backward(dout)
            assert [kernel for _, kernel, _ in ran] == ["tlx-hopper", "tlx-hopper"], ran
            results.append((out, qq.grad, kk.grad, vv.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b), step.__name__


def _graphed_training_step(q, k, v, cu, dout, hint: int, deterministic: bool):
    """(graph, out, (dq, dk, dv)): one causal fwd+bwd of the public op captured in a CUDA graph on static
    tensors, after two warm-up steps on a side stream (compilation and allocator warm-up, as capture asks)."""
    def step():
        out = jfa.jagged_attention(q, k, v, cu, cu, hint, hint, causal=True, deterministic=deterministic)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, grads = step()
    return graph, out, grads


@pytest.mark.parametrize("dq", BACKWARDS)
def test_a_cuda_graph_of_a_training_step_replays_right_after_the_offsets_change(dq):
    """A captured fwd+bwd (both max_seqlen hints, trusted offsets) replays correctly when the inputs AND the
    offsets are rewritten in place between replays (same batch size and token count, lengths within the
    hints: what the contract allows): each replay equals an eager call on the same values, bitwise for
    out, dk and dv (and dq when deterministic), dq within the fused reduction's rounding otherwise."""
    heads, head_dim = 2, 128
    batches = ([300, 0, 17, 700, 129], [1, 640, 0, 300, 205], [146, 146, 146, 562, 146])
    total, hint = sum(batches[0]), max(max(b) for b in batches)
    assert all(sum(b) == total for b in batches)
    q, k, v, cu = packed(batches[0], heads=heads, head_dim=head_dim)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    deterministic = dq == "deterministic"
    with knobs.scope(trust_offsets=True):
        graph, out, grads = _graphed_training_step(q, k, v, cu, dout, hint, deterministic)
        for seed, lengths in enumerate(batches[1:] + batches[:1], start=1):
            new_q, new_k, new_v, new_cu = packed(lengths, heads=heads, head_dim=head_dim, seed=seed)
            with torch.no_grad():
                for static, new in ((q, new_q), (k, new_k), (v, new_v), (cu, new_cu), (dout, torch.randn_like(q))):
                    static.copy_(new)
            graph.replay()
            fresh = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            with recording_dispatch() as ran:
                ref = jfa.jagged_attention(*fresh, cu.clone(), cu.clone(), hint, hint, causal=True,
                                           deterministic=deterministic)
                ref_grads = torch.autograd.grad(ref, fresh, dout)
            assert [kernel for _, kernel, _ in ran] == ["tlx-hopper", "tlx-hopper"], ran
            assert torch.equal(out, ref), lengths
            assert torch.equal(grads[1], ref_grads[1]) and torch.equal(grads[2], ref_grads[2]), lengths
            if deterministic:
                assert torch.equal(grads[0], ref_grads[0]), lengths
            else:  # fp32 reduce-adds in another order, then one rounding to bf16: at most an ulp or two
                torch.testing.assert_close(grads[0], ref_grads[0], rtol=2 ** -7, atol=2 ** -7 * float(ref_grads[0].abs().max()))


def test_capturing_a_graph_without_trusted_offsets_says_how_to_fix_it():
    """Under capture the offsets cannot be read back: the error names the hints and the knob."""
    q, k, v, cu = packed([5, 9])
    jfa.jagged_attention(q, k, v, cu, cu)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="JFA_TRUST_OFFSETS"):
        with torch.cuda.graph(graph):
            jfa.jagged_attention(q, k, v, cu, cu)


# ----------------------------------------------------------------------------------------------------
# the TLX MXFP8 backward (MX build of the dK/dV kernel; dQ on the portable MX pass): the simulator's cases
# (tests/test_mx_kernels.py) on the GPU, judged by bound (a) against the MX oracle's backward
# ----------------------------------------------------------------------------------------------------
from dataclasses import replace  # noqa: E402

from test_mx_kernels import TLX_BACKWARD_CASES  # noqa: E402
from test_mx_kernels import _forward as _mx_forward  # noqa: E402
from test_mx_kernels import _launch_args as _mx_launch_args  # noqa: E402
from test_mx_kernels import _problem as _mx_problem  # noqa: E402
from test_mx_kernels import assert_backward_within_bound_a as _mx_bound_a  # noqa: E402


@pytest.mark.parametrize("case", TLX_BACKWARD_CASES, ids=[c.name for c in TLX_BACKWARD_CASES])
def test_tlx_mx_backward_meets_the_kernel_bound(case, monkeypatch):
    """dq, dk, dv of the TLX MX backward within bound (a) of the MX oracle (from the portable forward's out and
    lse), NaN-poisoned outputs; the TLX dK/dV kernel launched once, as the MX build."""
    from jfa.kernels import alloc
    from jfa.kernels.tlx.common import target

    launches = []
    real_launch = target.launch

    def spy(kernel, grid, device, *args, **kwargs):
        launches.append((kernel.fn.__name__, kwargs.get("MX")))
        return real_launch(kernel, grid, device, *args, **kwargs)

    monkeypatch.setattr(target, "launch", spy)
    pb = _mx_problem(case, "cuda", inputs="gauss")
    out, lse = _mx_forward(pb)
    with alloc.poisoned_outputs():
        grads = tlx_backward.mx_backward_tlx(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k, dlse=pb.dlse,
                                             **_mx_launch_args(pb))
    torch.cuda.synchronize()
    assert launches == [("jagged_dkdv_tlx_kernel", case.rule)], launches
    _mx_bound_a(pb, out, lse, grads)


@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_the_op_runs_the_tlx_mx_backward(rule):
    """``jagged_attention(precision="mxfp8")`` on the H200: both passes are the TLX MXFP8 kernels (recorded), as
    ``which_kernels`` says, and the gradients meet bound (a)."""
    case = replace(TLX_BACKWARD_CASES[1], rule=rule, dlse=False)  # causal, Lq != Lk, D 128
    pb = _mx_problem(case, "cuda", inputs="gauss")
    precision = "mxfp8" if rule == "floor" else "mxfp8-rceil"
    leaves = [t.detach().requires_grad_() for t in (pb.q, pb.k, pb.v)]
    with recording_dispatch() as ran:
        out, lse = jfa.jagged_attention(*leaves, pb.cu_q, pb.cu_k, causal=case.causal, softmax_scale=pb.scale,
                                        precision=precision, return_lse=True)
        out.backward(pb.dout)
    torch.cuda.synchronize()
    choice = jfa.which_kernels(pb.q, pb.k, pb.v, precision=precision)
    assert (choice.forward, choice.backward, choice.reason) == ("tlx-hopper-mxfp8", "tlx-hopper-mxfp8", "")
    assert [r[:2] for r in ran] == [("forward", "tlx-hopper-mxfp8"), ("backward", "tlx-hopper-mxfp8")]
    _mx_bound_a(pb, out, lse, [leaf.grad for leaf in leaves])
