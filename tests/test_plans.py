"""Call plans (``jfa.plans``): a call whose structure was seen before skips the checks and reuses the
launchers' prepared launches; it still meets the oracle, still raises what an unplanned call raises, and
no plan is reused once anything its key names has changed."""
import pytest
import torch

import jfa
from jfa import api, knobs
from jfa.fuzz.catalog import tlx_cases
from jfa.fuzz.cases import offsets
from jfa.plans import CallPlan, PlanCache, call_key, plans

sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
from planned_calls import (SPARSE_RULE_IDS, SPARSE_RULES, planned_cases, run_twice,  # noqa: E402
                           sparse_planned_and_unplanned, spy_on_planned_launchers)

CASES = planned_cases(tlx_cases("sim"))


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter (plans on the GPU: tests/test_tlx_gpu.py)")


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield
    plans.clear()


@pytest.fixture
def planned_runs(monkeypatch):
    return spy_on_planned_launchers(monkeypatch)


@pytest.fixture
def validations(monkeypatch):
    calls = []
    validate = api.validate

    def spy(*args, **kwargs):
        calls.append(1)
        return validate(*args, **kwargs)

    monkeypatch.setattr(api, "validate", spy)
    return calls


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_planned_call_meets_the_oracle(case, planned_runs, validations, monkeypatch):
    with sim.simulated(arch=(9, 0), sm_count=3):
        first, second = run_twice(case, "cpu", monkeypatch)
    assert first.ok, str(first)
    assert report_ran_tlx(second) and second.ok, str(second)
    assert len(validations) == 1, "the second call of one structure ran the checks again"
    assert planned_runs == {"forward": 1, "backward": 1}, "the second call did not take the prepared launches"


def report_ran_tlx(report) -> bool:
    return (report.kernel, report.backward_kernel) == ("tlx-hopper", "tlx-hopper")


def _small(lengths=(3, 0, 9), heads=2, head_dim=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, generator=g, dtype=dtype) for _ in range(3))
    return q, k, v, offsets(list(lengths), torch.int32)


def test_offsets_written_in_place_are_checked_again(validations):
    q, k, v, cu = _small()
    jfa.jagged_attention(q, k, v, cu, cu, backend="triton")
    jfa.jagged_attention(q, k, v, cu, cu, backend="triton")
    assert len(validations) == 1
    cu[-1] += 1  # (an in-place write bumps the version the key holds)
    with pytest.raises(ValueError, match="cu_seqlens_k: last offset must equal the token count"):
        jfa.jagged_attention(q, k, v, cu, cu, backend="triton")


def test_new_offsets_tensors_get_their_own_plan(validations):
    q, k, v, cu = _small()
    jfa.jagged_attention(q, k, v, cu, cu, backend="triton")
    other = cu.clone()
    jfa.jagged_attention(q, k, v, other, other, backend="triton")
    assert len(validations) == 2 and len(plans) == 2


@pytest.mark.parametrize("bad, error", [(dict(causal=1), TypeError), (dict(window_size=(True, -1)), TypeError),
                                        (dict(softmax_scale=float("nan")), ValueError)],
                         ids=["causal-int", "window-bool", "scale-nan"])
def test_an_argument_a_plan_was_not_made_for_still_raises(bad, error):
    q, k, v, cu = _small()
    good = dict(causal=True, window_size=(1, -1), softmax_scale=0.5)
    for _ in range(2):
        jfa.jagged_attention(q, k, v, cu, cu, backend="triton", **good)
    with pytest.raises(error):
        jfa.jagged_attention(q, k, v, cu, cu, backend="triton", **{**good, **bad})


def test_an_input_tma_cannot_read_is_checked_again():
    """Same shape and strides, but a base 2 bytes off 16-byte alignment: the plan of the aligned call
    must not carry it to the TLX kernel."""
    q, k, v, cu = _small(head_dim=64, dtype=torch.bfloat16)
    with sim.simulated(arch=(9, 0), sm_count=2):
        jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")
        shifted = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
        shifted.copy_(q)
        with pytest.raises(ValueError, match="16-byte aligned base"):
            jfa.jagged_attention(shifted, k, v, cu, cu, backend="tlx")


def test_a_setting_changed_by_a_scope_makes_a_new_plan(planned_runs):
    """A plan made under one setting never serves a call under another (a scope's start and end both make
    new keys: ``knobs.fingerprint``)."""
    q, k, v, cu = _small(head_dim=64, dtype=torch.bfloat16)
    with sim.simulated(arch=(9, 0), sm_count=2):
        jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")
        with knobs.scope(tlx_variant="peel=0"):
            jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")
            assert planned_runs["forward"] == 0 and len(plans) == 2
            jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")
            assert planned_runs["forward"] == 1
        jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")
    assert planned_runs["forward"] == 1 and len(plans) == 3


def test_a_plan_holds_only_its_own_offsets_tensors():
    cu = offsets([1, 2], torch.int32)
    cache = PlanCache()
    cache.make(("key",), (None, cu), ("triton",))
    assert isinstance(cache.get(("key",), (None, cu)), CallPlan)
    assert cache.get(("key",), (None, cu.clone())) is None


def test_no_plan_for_what_a_tracer_or_another_precision_sees(monkeypatch):
    q, k, v, cu = _small()
    nested = torch.nested.nested_tensor([q[:3], q[3:]], layout=torch.jagged)
    assert call_key(q, k, v, cu, cu, ()) is not None
    assert call_key(nested, k, v, cu, cu, ()) is None
    unhashable = call_key(q, k, v, cu, cu, ([1, -1],))  # a list window: no plan, the checks run every time
    assert plans.make(unhashable, (cu, cu), ("triton",)) is None and plans.get(unhashable, (cu, cu)) is None
    q32, k32, v32, cu32 = _small(head_dim=32)
    jfa.jagged_attention(q32, k32, v32, cu32, cu32, precision="mxfp8", backend="triton")
    assert len(plans) == 0
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert call_key(q, k, v, cu, cu, ()) is None


def test_knob_fingerprint_follows_scopes_process_settings_and_the_environment(monkeypatch):
    before = knobs.fingerprint()
    with knobs.scope(tlx_fused_dq=False):
        inside = knobs.fingerprint()
    assert len({before, inside, knobs.fingerprint()}) == 3
    monkeypatch.setenv("JFA_TLX_FUSED_DQ", "0")
    assert knobs.fingerprint()[1:] != before[1:]


def test_a_backward_under_other_settings_than_its_forward_takes_them(planned_runs, monkeypatch):
    """The backward of a planned forward, run under ``tlx_fused_dq=False``, takes the portable dQ pass
    even after fused backwards of that structure made their prepared launches."""
    from jfa.kernels.triton import backward as portable

    portable_passes = []
    original = portable.jagged_backward
    monkeypatch.setattr(portable, "jagged_backward", lambda *a, **k: portable_passes.append(1) or original(*a, **k))
    q, k, v, cu = _small(head_dim=64, dtype=torch.bfloat16)
    q.requires_grad_(True)
    with sim.simulated(arch=(9, 0), sm_count=2):
        for _ in range(2):
            jfa.jagged_attention(q, k, v, cu, cu, backend="tlx").sum().backward()
        assert planned_runs["backward"] == 1 and not portable_passes
        out = jfa.jagged_attention(q, k, v, cu, cu, backend="tlx")
        with knobs.scope(tlx_fused_dq=False):
            out.sum().backward()
    assert planned_runs["backward"] == 1 and portable_passes == [1]



@pytest.mark.parametrize("rule", SPARSE_RULES, ids=SPARSE_RULE_IDS)
def test_a_planned_block_sparse_call_returns_what_an_unplanned_call_returns(rule, planned_runs, monkeypatch):
    """A block-sparse call with a selection rule, its structure seen before (the same offsets tensors, new
    values): no check runs again and the forward takes the prepared launch; the selection runs on this call's
    q and k, so out, lse and the gradients are the unplanned call's on the same values, bit for bit."""
    with sim.simulated(arch=(9, 0), sm_count=3):
        planned, unplanned, checks = sparse_planned_and_unplanned(rule, "cpu", monkeypatch)
    assert checks == [1, 0, 1] and planned_runs["forward"] == 1, "the second call was not planned"
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), planned, unplanned):
        assert torch.equal(a, b), f"{name}: the planned call differs from the unplanned one"
