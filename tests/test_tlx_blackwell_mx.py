"""The TLX Blackwell MXFP8 forward (``mx_forward_blackwell``: block-scaled tcgen05 MMAs for QK^T and PV, P quantized
by the softmax) on the CPU simulator (jfa.sim, arch (10, 0)), judged by bound (a) of docs/mxfp8.md section 3
(``jfa.oracle.mx_bounds.kernel_tolerance``) against the float64 MX oracle on the same quantized operands.

Every run: NaN-poisoned outputs, the Blackwell kernel asserted to have run on the simulator with no report. The
inputs are the MX fuzzer's adversarial families (``jfa.fuzz.mx``: peaked softmax, attention sink, outliers x100, a
different range per 32-block, rounding midpoints, diffuse rows) on jagged batches: empty and one-token sequences,
tails off the 32-key blocks and the 128-key tiles, Lq != Lk causal (bottom-right), broadcast Q, grouped key/value
heads, head dims 64 and 128, FLOOR and RCEIL, fp32/bf16/fp16 outputs. fp32 outputs make bound (a) tight: one P
element quantized to its other E4M3 neighbour away from a tie violates it (docs/mxfp8.md, "Tightness"). Two SMs,
so CTAs walk several work items and the rings wrap. The deterministic schedule for every case, seeds 1-3 on a
subset."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
import jfa
import jfa.mx as jmx
from jfa.api import recording_dispatch, which_kernels
from jfa.fuzz.mx import MXCase, blackwell_forward_failure, blackwell_mx_cases, make_mx_inputs
from jfa.kernels.tlx.blackwell import forward as bw
from jfa.kernels.triton.mx_attention import _ldexp, quantized_weights

KERNEL = "jagged_fwd_blackwell_kernel"
SM_COUNT = 2
SEEDS = (1, 2, 3)
CASES = [pytest.param(case, id=name) for name, case in blackwell_mx_cases()]
SEEDED = [CASES[1], CASES[3], CASES[6]]


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")


@pytest.mark.parametrize("case", CASES)
def test_mx_forward_meets_bound_a(case):
    failure = blackwell_forward_failure(case, sim.Schedule.deterministic(), sm_count=SM_COUNT)
    assert failure is None, failure


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", SEEDED)
def test_mx_forward_meets_bound_a_under_seeded_schedules(case, seed):
    """Random task switches and completion orders of TMA copies and MMAs."""
    failure = blackwell_forward_failure(case, sim.Schedule.seeded(seed), sm_count=SM_COUNT)
    assert failure is None, failure


# ---- the P quantization step: the elements and scales the PV MMA gets are the portable kernel's P^ ------------
@triton.jit
def _p_both_ways(S, M_IN, VALUES, FROM_BYTES, RCEIL: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    s = tl.load(S + offs)
    m_i = tl.load(M_IN + tl.arange(0, ROWS))
    p, _m = quantized_weights(s, m_i, RCEIL, ROWS, COLS)
    codes, scales, _m2, _l, _a = bw._mx_softmax_update(s, m_i, tl.zeros([ROWS], tl.float32), 0, tl.arange(0, ROWS),
                                                       COLS, 0, 1.0, False, False, RCEIL, ROWS, COLS)
    e = scales.to(tl.int32)
    vals = tl.reshape(codes.to(tl.float32), [ROWS, COLS // 32, 32])
    dec = tl.where((e == 255)[:, :, None], float("nan"), _ldexp(vals, e[:, :, None] - 127))
    tl.store(VALUES + offs, p)
    tl.store(FROM_BYTES + offs, tl.reshape(dec, [ROWS, COLS]))


@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_p_bytes_decode_to_the_portable_kernels_weights(rule):
    """The softmax's E4M3 elements times their E8M0 scales are, bit for bit, the portable kernel's P^
    (``quantized_weights``) on logits with masked keys, NaN blocks, ties and blocks far below the running maximum
    (only blocks under E8M0's range, weights below 448 * 2^-128 of the maximum, are 0 instead)."""
    g = torch.Generator().manual_seed(11)
    rows, cols = 16, 128
    s = torch.randn(rows, cols, generator=g) * torch.tensor([0.5, 4.0, 30.0, 300.0]).repeat(4)[:, None]
    s[1, 5:40] = float("-inf")  # masked keys, a whole block of them
    s[2, 64:96] = torch.round(s[2, 64:96])  # logits on integers: block maxima that are ties of the ceiling
    s[3, 100] = float("nan")
    s[5, 32:64] -= 200.0  # a block far below the row's maximum
    m_in = torch.tensor([float("-inf"), 3.0, 50.0, 0.0] * 4)
    values, from_bytes = torch.empty(rows, cols), torch.empty(rows, cols)
    _p_both_ways[(1,)](s, m_in, values, from_bytes, RCEIL=rule == "rceil", ROWS=rows, COLS=cols)
    flushed = (values != 0) & (values.abs() < 448 * 2.0 ** -128) & (from_bytes == 0)
    same = (values.view(torch.int32) == from_bytes.view(torch.int32)) | (values.isnan() & from_bytes.isnan())
    assert bool((same | flushed).all()), torch.nonzero(~(same | flushed))[:5].tolist()
    assert bool(values[3, 96:128].isnan().all()) and not bool(values[2].isnan().any())


def _quantized(case: MXCase):
    """(the MXTensors a call quantizes from ``case``'s inputs, cu_q, cu_k)."""
    q, k, v, _dout, cu_q, cu_k = make_mx_inputs(case)
    return (jmx.quantize(q, "dim", rule=case.rule), jmx.quantize(k, "dim", rule=case.rule),
            jmx.quantize(v, "tokens", cu_k, case.rule)), cu_q, cu_k


# ---- what the build refuses, dispatch --------------------------------------------------------------------------
def test_mx_forward_refuses_a_window_other_axes_and_other_targets():
    """Refused by name before any launch: a sliding window, operands blocked along other axes, a launch target that
    is not sm_100 (here: Hopper on the simulator)."""
    (qm, km, vm), cu_q, cu_k = _quantized(MXCase((40,), (40,)))
    kw = dict(causal=False, softmax_scale=0.1, broadcast_q=False, num_seqs=1)
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT):
        with pytest.raises(ValueError, match="window_size"):
            bw.mx_forward_blackwell(qm, km, vm, cu_q, cu_k, window=(8, 8), **kw)
        with pytest.raises(ValueError, match="MX axes"):
            bw.mx_forward_blackwell(qm, km, km, cu_q, cu_k, **kw)
    with sim.simulated(arch=(9, 0), sm_count=SM_COUNT):
        with pytest.raises(ValueError, match="sm_100"):
            bw.mx_forward_blackwell(qm, km, vm, cu_q, cu_k, **kw)


def test_mxfp8_calls_on_sm100_run_the_blackwell_mx_forward():
    """``jfa.jagged_attention(precision="mxfp8", backend="tlx")`` on an sm_100 target: which_kernels names the
    Blackwell MX forward and the recorded dispatch shows it ran."""
    case = MXCase((40, 9), (70, 33), family="peaked", dtype="fp32")
    q, k, v, dout, cu_q, cu_k = make_mx_inputs(case)
    with sim.simulated(arch=(10, 0), sm_count=SM_COUNT) as session, recording_dispatch() as ran:
        choice = which_kernels(q, k, v, backend="tlx", precision="mxfp8")
        out = jfa.jagged_attention(q, k, v, cu_q, cu_k, precision="mxfp8", backend="tlx")
    assert choice.forward == "tlx-blackwell-mxfp8", choice
    assert [r[:2] for r in ran] == [("forward", "tlx-blackwell-mxfp8")], ran
    assert session.kernels() == [KERNEL], session.kernels()
    assert out.shape == q.shape and bool(torch.isfinite(out).all())
