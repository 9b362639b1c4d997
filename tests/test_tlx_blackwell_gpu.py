"""The TLX Blackwell kernels on a real sm_100 GPU (B200), through the public op. Collected everywhere and
skipped, with the reason, wherever no sm_100 GPU runs the suite (`--device cuda` on a B200 runs them): until
then these kernels are proven on the TLX simulator (tests/test_tlx_blackwell.py) and by the sm_100a compile
gate only. docs/blackwell.md says what a first B200 run must check first."""
import pytest
import torch

import jfa
from jfa.fuzz.catalog import blackwell_cases
from jfa.fuzz.rule import run_case

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def blackwell(device):
    if device != "cuda" or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip("needs an sm_100 (Blackwell) GPU; on other machines the Blackwell kernels run on the TLX "
                    "simulator (tests/test_tlx_blackwell.py)")


CASES = blackwell_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_blackwell_forward_and_its_backward_meet_the_oracle_through_the_op(case):
    """auto on sm_100 runs the Blackwell forward (and the backward that follows it) on NaN-poisoned outputs,
    judged by the oracle rule like every kernel."""
    report = run_case(case, backend="auto", device="cuda", backward=True)
    assert report.kernel == "tlx-blackwell", report.ran
    assert report.ok, str(report)


def test_which_kernels_names_the_blackwell_forward():
    q = torch.zeros(8, 2, 128, device="cuda", dtype=torch.bfloat16)
    assert jfa.which_kernels(q, q, q).forward == "tlx-blackwell"


def test_mxfp8_at_d64_falls_back_on_the_gpu_with_the_reason():
    """The D 64 MXFP8 build runs on the simulator only (its scale tiles have no tcgen05.cp layout in Triton
    3.8): on a B200 the MXFP8 forward at D 64 is the portable one, and which_kernels says why; D 128 is the
    Blackwell MX build."""
    for head_dim, forward in ((64, "triton-mxfp8"), (128, "tlx-blackwell-mxfp8")):
        q = torch.zeros(8, 2, head_dim, device="cuda", dtype=torch.bfloat16)
        choice = jfa.which_kernels(q, q, q, precision="mxfp8")
        assert choice.forward == forward, choice
    assert "tcgen05.cp" in jfa.which_kernels(torch.zeros(8, 2, 64, device="cuda", dtype=torch.bfloat16),
                                             *(torch.zeros(8, 2, 64, device="cuda", dtype=torch.bfloat16),) * 2,
                                             precision="mxfp8").reason


# ---- the MXFP8 backward (the dK/dV kernel's MX build at D 128; D 64 runs the portable backward on the GPU) -------
from test_mx_kernels import BLACKWELL_BACKWARD_CASES  # noqa: E402
from test_mx_kernels import _forward as _mx_forward  # noqa: E402
from test_mx_kernels import _launch_args as _mx_launch_args  # noqa: E402
from test_mx_kernels import _problem as _mx_problem  # noqa: E402
from test_mx_kernels import assert_backward_within_bound_a as _mx_bound_a  # noqa: E402

MX_D128_CASES = [c for c in BLACKWELL_BACKWARD_CASES if c.head_dim == 128]


@pytest.mark.parametrize("case", MX_D128_CASES, ids=[c.name for c in MX_D128_CASES])
def test_blackwell_mx_backward_meets_the_kernel_bound(case, monkeypatch):
    """dq, dk, dv of the Blackwell MX backward within bound (a) of the MX oracle (from the portable forward's out and
    lse), NaN-poisoned outputs; the Blackwell dK/dV kernel launched once, as the MX build (its simulator twin:
    tests/test_mx_kernels.py)."""
    from jfa.kernels import alloc
    from jfa.kernels.tlx.blackwell.backward import mx_backward_blackwell
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
        grads = mx_backward_blackwell(pb.q, pb.k, pb.v, out, lse, pb.dout, pb.cu_q, pb.cu_k, dlse=pb.dlse,
                                      **_mx_launch_args(pb))
    torch.cuda.synchronize()
    assert launches == [("jagged_dkdv_blackwell_kernel", case.rule)], launches
    _mx_bound_a(pb, out, lse, grads)
