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


@pytest.mark.parametrize("head_dim", [64, 128])
def test_rising_keys_move_every_rows_maximum_block_after_block(head_dim):
    """The rising-keys recipe is what the rescale of the online softmax is tested with: along one sequence,
    each 128-key block's largest logit (base 2, the kernels' scale) exceeds the previous block's for every
    query, by more than 2 on average (an accumulator rescaled by 1/4 or less a step)."""
    from jfa.fuzz.cases import Case, make_inputs

    case = Case((64,), (512,), heads=1, head_dim=head_dim, values="rising-keys")
    inputs = make_inputs(case)
    logits = (inputs.q[:, 0].float() @ inputs.k[:, 0].float().T) * head_dim ** -0.5 * 1.4426950408889634
    block_max = logits.reshape(64, 4, 128).amax(-1)
    growth = block_max.diff(dim=1)
    assert (growth > 0).all() and growth.mean() > 2.0, growth
