"""The float64 torch twin of the oracle (jfa/fuzz/twin.py) agrees with the NumPy oracle, the root of trust,
on every family the fuzzer draws (lengths, values, GQA, windows, broadcast-Q, causal, layouts), with its
row chunking forced small so every chunk boundary is crossed; and the agreement check itself fails on a
twin that is wrong."""
import dataclasses
from unittest import mock

import pytest
import torch
from hypothesis import given, settings

from jfa.fuzz.cases import Case, make_inputs
from jfa.fuzz.rule import oracle_values, run_case, twin_agreement
from jfa.fuzz.strategies import problems
from jfa.reference import attention_reference, torch_ref


def _kwargs(case: Case) -> dict:
    window = (case.window[0], 0 if case.causal else case.window[1])
    return dict(causal=case.causal, softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q, window=window)


def _both_oracles(case: Case):
    """(twin's, NumPy's) values for ``case``, the shifted gradients taken from the reference's output."""
    inp = make_inputs(case)
    with torch.no_grad():
        out, _ = attention_reference(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, **_kwargs(case))
    return (oracle_values("twin", inp, out, _kwargs(case), backward=True),
            oracle_values("numpy", inp, out, _kwargs(case), backward=True))


def _assert_agree(case: Case) -> None:
    verdicts = twin_agreement(*_both_oracles(case))
    assert len(verdicts) == 9  # logit terms, out, lse, three gradients, their three magnitudes
    bad = [str(v) for v in verdicts if not v.ok]
    assert not bad, f"{case.id}: " + "; ".join(bad)


@settings(max_examples=60)
@given(case=problems(max_tokens=400))
def test_twin_matches_the_numpy_oracle_on_every_strategy_family(case):
    with mock.patch.object(torch_ref, "CHUNK_BYTES", 512 * 8):  # many row chunks per sequence (float64 scores)
        _assert_agree(case)


@pytest.mark.parametrize("case", [
    Case((300,), (300,), heads=4, kv_heads=1, causal=True, head_dim=16),
    Case((5, 0, 129), (0, 7, 130), heads=3, window=(17, 4), head_dim=8),
    Case((65,), (40, 0, 90), broadcast_q=True, causal=True, head_dim=8, values="dominant-key"),
    Case((64, 64), (64, 64), values="constant-keys", softmax_scale=-0.7, head_dim=8),
], ids=["mqa-causal-long", "window-empty-seqs", "bcastq-causal", "constant-keys-negative-scale"])
def test_twin_matches_the_numpy_oracle_across_chunk_boundaries(case):
    for chunk in (8, 97 * 8, torch_ref.CHUNK_BYTES):
        with mock.patch.object(torch_ref, "CHUNK_BYTES", chunk):
            _assert_agree(case)


def test_agreement_fails_on_a_wrong_twin():
    case = Case((20, 33), (20, 40), causal=True, heads=2)
    twin_values, numpy_values = _both_oracles(case)
    off_by_a_millionth = dataclasses.replace(twin_values, out=twin_values.out * (1 + 1e-6))
    assert {v.name for v in twin_agreement(off_by_a_millionth, numpy_values) if not v.ok} == {"twin:out"}
    case_empty = Case((4,), (0,))
    twin_empty, numpy_empty = _both_oracles(case_empty)
    lost_infinity = dataclasses.replace(twin_empty, lse=torch.zeros_like(twin_empty.lse))
    assert [v.problem for v in twin_agreement(lost_infinity, numpy_empty) if not v.ok], "-inf rows lost unnoticed"


def test_judging_by_the_twin_gives_the_numpy_oracles_verdicts(device):
    """The same case judged with either oracle: the same errors and allowances, tensor by tensor."""
    case = Case((0, 5, 70), (3, 0, 64), causal=True, dtype="fp16", values="near-ties", heads=4, kv_heads=2)
    by_numpy = run_case(case, backend="triton", device=device)
    by_twin = run_case(case, backend="triton", device=device, oracle_name="twin", recheck=True)
    assert by_numpy.ok and by_twin.ok
    for mine in by_numpy.verdicts:
        theirs = next(v for v in by_twin.verdicts if v.name == mine.name)
        assert theirs.error == pytest.approx(mine.error, rel=1e-9, abs=1e-30)
        assert theirs.allowed == pytest.approx(mine.allowed, rel=1e-9)
    assert sum(v.name.startswith("twin:") for v in by_twin.verdicts) == 9
