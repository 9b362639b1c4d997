"""The MXFP8 fuzzer (jfa.fuzz.mx): every fuzzed problem meets bound (a) (kernel vs the MX oracle), bound (b)
(MX oracle vs exact attention) and the kernel meets (a) + (b) against exact attention (DESIGN.md section 4,
issue 23); every input family under both rules; the checker fails a kernel that is off; the CLI writes its
report."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import jfa.kernels.triton.mx_attention as mx_kernels
from jfa.fuzz import mx
from jfa.fuzz.mx import FAMILIES, RULES, MXCase, check_mx_case, mx_problems
from jfa.oracle.mx_bounds import kernel_tolerance

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy inside the interpreter (masked exp2)


def _explain(report) -> str:
    return f"{report}\nreproduce: jfa.fuzz.mx.check_mx_case({report.case!r})"


@pytest.mark.slow  # ~50 s on 2 cores: the gate runs it (the suite keeps each family, test below)
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=mx_problems())
def test_fuzzed_problems_meet_both_bounds(case, device):
    report = check_mx_case(case, device)
    assert report.ok, _explain(report)


def _family_case(family: str, rule: str) -> MXCase:
    """Small, ragged, GQA, causal with Lq != Lk, a tail dim block (D = 48) under FLOOR, two under RCEIL."""
    return MXCase((37, 0, 20), (45, 3, 20), heads=2, kv_heads=1, head_dim=48 if rule == "floor" else 64,
                  dtype="bf16", causal=True, rule=rule, family=family, seed=3)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_meets_both_bounds(family, rule, device):
    report = check_mx_case(_family_case(family, rule), device)
    assert report.kernel_ran, "the triton-mxfp8 kernels did not run"
    assert all(s.bounded > 0 for s in report.stats["a"].values()), "a check with nothing to check"
    assert report.ok, _explain(report)


def _fp32_case() -> MXCase:
    return MXCase((37, 20), (45, 20), heads=2, kv_heads=1, head_dim=48, dtype="fp32", causal=True, seed=3)


def test_a_kernel_off_by_three_tolerances_fails(device, monkeypatch):
    """out moved by 3x bound (a) (fp32: no output rounding, no interpreter slack) violates (a) everywhere
    the tolerance is positive, and the kernel-vs-exact check sees it too where (a) dominates."""
    case = _fp32_case()
    q, k, v, dout, cu_q, cu_k = mx.make_mx_inputs(case, device)
    f64 = lambda t: t.double().cpu().numpy()
    tol = kernel_tolerance(f64(q), f64(k), f64(v), f64(dout), cu_q.cpu().numpy(), cu_k.cpu().numpy(),
                           rule=case.rule, causal=case.causal, softmax_scale=None, broadcast_q=False,
                           out_dtype="float32")["out"]
    original = mx_kernels.mx_forward

    def off(*args, **kwargs):
        out, lse = original(*args, **kwargs)
        return out + torch.from_numpy(3 * tol).to(out), lse

    monkeypatch.setattr(mx_kernels, "mx_forward", off)
    report = check_mx_case(case, device)
    assert report.kernel_ran and not report.ok
    s = report.stats["a"]["out"]
    assert s.violations == s.bounded and s.ratio > 2, str(report)
    assert all(report.stats["b"][n].ok for n in mx.OUTPUTS), "bound (b) is about the oracle: untouched"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_kernel_with_the_other_rule_for_p_fails(dtype, device, monkeypatch):
    """The forward quantizing P with the other scale rule (q, k, v quantized right) violates bound (a)."""
    original = mx_kernels.mx_forward

    def swapped(*args, rule="floor", **kwargs):
        return original(*args, rule="rceil" if rule == "floor" else "floor", **kwargs)

    monkeypatch.setattr(mx_kernels, "mx_forward", swapped)
    report = check_mx_case(dataclasses.replace(_fp32_case(), dtype=dtype), device)
    assert report.kernel_ran and not report.ok
    assert not report.stats["a"]["out"].ok and not report.stats["a"]["lse"].ok, str(report)


def test_compare_treats_zero_bounds_nan_and_infinities_strictly():
    want = np.array([1.0, 0.0, -np.inf, 2.0, 3.0])
    bound = np.array([0.5, 0.0, 0.0, 1.0, 1.0])
    assert mx.compare(want, want, bound).ok
    got = np.array([1.25, 0.0, -np.inf, 2.0, 3.0])
    s = mx.compare(got, want, bound)
    assert s.ok and s.ratio == 0.5 and s.bounded == 3
    for i, bad in ((1, 1e-300), (2, 0.0), (3, np.nan), (4, np.inf)):
        g = want.copy()
        g[i] = bad
        s = mx.compare(g, want, bound)
        assert not s.ok and s.ratio == np.inf and s.worst_at == (i,), (i, bad)


def test_cli_writes_json_and_markdown(tmp_path, device):
    assert mx.main(["--examples", "2", "--seed", "5", "--device", device, "--out", str(tmp_path), "--quiet"]) == 0
    data = json.loads((tmp_path / "mx-fuzz.json").read_text())
    assert data["failing"] == 0 and len(data["records"]) == 2
    assert all(r["ok"] and r["kernel_ran"] and set(r["stats"]) == set(mx.CHECKS) for r in data["records"])
    table = (tmp_path / "mx-fuzz.md").read_text()
    assert "| family | rule |" in table and "| all | both | 2 |" in table
    assert [r["describe"] for r in data["records"]] == [mx.sample_case(5, i).describe() for i in range(2)]


def test_sampler_covers_every_family_and_rule_and_is_reproducible():
    cases = [mx.sample_case(1, i) for i in range(2 * len(FAMILIES))]
    assert {(c.family, c.rule) for c in cases} == {(f, r) for f in FAMILIES for r in RULES}
    assert cases == [mx.sample_case(1, i) for i in range(2 * len(FAMILIES))]
    assert all(c.rows + sum(c.lengths_k) <= mx.MAX_TOKENS for c in cases)


@pytest.mark.parametrize("family", ["gaussian", "peaked", "blockscale", "outliers"])
def test_the_tlx_forward_on_the_simulator_meets_both_bounds(family, device):
    """The fuzzer's simulator leg: the TLX MXFP8 forward and backward (run on the TLX simulator under a seeded
    schedule, asserted to be the kernels that ran; the backward's dQ pass is portable) meet (a), (b) and
    kernel-vs-exact."""
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")
    case = MXCase((37, 0, 70), (45, 3, 70), heads=2, kv_heads=1, head_dim=64, dtype="bf16", causal=True,
                  rule="rceil" if family == "peaked" else "floor", family=family, seed=5)
    assert mx.tlx_eligible(case)
    report = check_mx_case(case, device, simulate=1)
    assert report.kernel_ran, "the TLX MXFP8 forward and backward did not run on the simulator"
    assert report.ok, _explain(report)
