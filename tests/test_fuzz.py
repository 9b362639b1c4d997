"""Property: every problem the strategies can draw meets the oracle rule, forward and backward.

Runs under the active hypothesis profile (``ci`` by default: derandomised and bounded).
``hypothesis.target`` steers the search toward the largest error/allowed ratio, so it climbs toward
numerical trouble, not only crashes. The size budget follows the device (small in the interpreter).
"""
import json

import pytest
from hypothesis import assume, given, target
from hypothesis import strategies as st

from jfa.fuzz.strategies import CPU_MAX_TOKENS, GPU_MAX_TOKENS, problems
from jfa.fuzz.rule import cannot_run, run_case


@pytest.fixture(scope="session")
def max_tokens(device):
    return CPU_MAX_TOKENS if device == "cpu" else GPU_MAX_TOKENS


@given(data=st.data())
def test_random_problems_meet_the_oracle(data, backend, device, max_tokens):
    case = data.draw(problems(max_tokens=max_tokens), label="case")
    assume(not cannot_run(case, backend, device))  # --backend tlx: only what the TLX kernel takes
    report = run_case(case, backend=backend, device=device)
    target(min(report.worst.ratio, 1e6), label="worst error / allowed")
    assert report.ran_as_dispatched(), report.ran
    assert report.ok, str(report) + "\ncase: " + json.dumps(case.__dict__)
