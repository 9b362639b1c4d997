"""jfa.jagged_attention(..., precision="mxfp8"): the op a user calls, against the MX oracle
(jfa.oracle.mx_attention) within bound (a) (jfa.oracle.mx_bounds.kernel_tolerance), autograd included;
pre-quantized MXTensor inputs; the argument rules. The kernels' own properties: tests/test_mx_kernels.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import jfa
import jfa.mx as jmx
from jfa.api import recording_dispatch
from jfa.kernels import alloc
from jfa.oracle import mx_attention as oracle
from jfa.oracle import mx_bounds

DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _batch(lq, lk, device, *, heads=2, kv_heads=2, head_dim=64, dtype=torch.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device=device)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32, device=device)
    make = lambda rows, h: torch.from_numpy(rng.standard_normal((rows, h, head_dim))).to(dtype).to(device)
    return make(sum(lq), heads), make(sum(lk), kv_heads), make(sum(lk), kv_heads), cu_q, cu_k


def _f64(t):
    return t.detach().double().cpu().numpy()


def _assert_within(name, got, want, tol):
    err = np.abs(_f64(got) - want)
    bad = ~(err <= tol)
    assert not bad.any(), f"{name}: {bad.sum()} elements outside bound (a), worst {err[bad].max():.3g}"


@pytest.mark.parametrize("precision,rule", [("mxfp8", "floor"), ("mxfp8-rceil", "rceil")], ids=["floor", "rceil"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_and_backward_meet_bound_a_against_the_mx_oracle(precision, rule, causal, device):
    q, k, v, cu_q, cu_k = _batch((70, 0, 33), (90, 5, 64), device, kv_heads=1, seed=int(causal))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)
    with alloc.poisoned_outputs(), recording_dispatch() as ran:
        out, lse = jfa.jagged_attention(*leaves, cu_q, cu_k, causal=causal, precision=precision, return_lse=True)
        out.backward(dout)
    choice = jfa.which_kernels(q, k, v, precision=precision)  # TLX on sm_90, portable elsewhere
    assert [r[:2] for r in ran] == [("forward", choice.forward), ("backward", choice.backward)]
    args = dict(rule=rule, causal=causal, softmax_scale=64 ** -0.5, broadcast_q=False)
    want_out, want_lse = oracle.mx_forward(_f64(q), _f64(k), _f64(v), cu_q.cpu().numpy(), cu_k.cpu().numpy(), **args)
    want = oracle.mx_backward(_f64(q), _f64(k), _f64(v), _f64(out), _f64(lse), _f64(dout), cu_q.cpu().numpy(),
                              cu_k.cpu().numpy(), **args)
    tol = mx_bounds.kernel_tolerance(_f64(q), _f64(k), _f64(v), _f64(dout), cu_q.cpu().numpy(), cu_k.cpu().numpy(),
                                     out_dtype="bfloat16", **args)
    _assert_within("out", out, want_out, tol["out"])
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(_f64(lse)), finite)
    _assert_within("lse", lse[torch.from_numpy(finite)], want_lse[finite], tol["lse"][finite])
    for name, leaf, w in zip(("dq", "dk", "dv"), leaves, want):
        _assert_within(name, leaf.grad, w, tol[name])


def test_pre_quantized_inputs_give_the_same_output_bitwise(device):
    q, k, v, cu_q, cu_k = _batch((40, 17), (50, 90), device, seed=3)
    out = jfa.jagged_attention(q, k, v, cu_q, cu_k, precision="mxfp8")
    mq, mk, mv = jmx.quantize(q, "dim"), jmx.quantize(k, "dim"), jmx.quantize(v, "tokens", cu_k)
    with recording_dispatch() as ran:
        again = jfa.jagged_attention(mq, mk, mv, cu_q, cu_k, precision="mxfp8")
    assert [r[:2] for r in ran] == [("forward", jfa.which_kernels(q, k, v, precision="mxfp8").forward)]
    assert again.dtype == q.dtype and torch.equal(out, again)


def test_gradients_of_any_layout_are_taken(device):
    """out.sum().backward() gives a stride-0 gradient; the op makes its head dim contiguous."""
    q, k, v, cu_q, cu_k = _batch((20, 9), (30, 11), device, seed=4)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    jfa.jagged_attention(*leaves, cu_q, cu_k, precision="mxfp8").sum().backward()
    assert all(leaf.grad is not None and torch.isfinite(leaf.grad).all() for leaf in leaves)


def test_which_kernels_names_the_mxfp8_kernels(device):
    """The TLX MXFP8 forward and backward on an sm_90 GPU, the portable kernels elsewhere (with the reason),
    and with a sliding window (no TLX MX build), each with its reason."""
    q, k, v, _, _ = _batch((8,), (8,), device)
    choice = jfa.which_kernels(q, k, v, precision="mxfp8")
    on_hopper = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    if on_hopper:
        assert (choice.forward, choice.backward, choice.reason) == ("tlx-hopper-mxfp8", "tlx-hopper-mxfp8", "")
    else:  # (elsewhere, and on sm_100 at this D 64: the portable kernels; no TLX MXFP8 build compiles there)
        assert choice.backward == "triton-mxfp8" and "portable" in choice.reason or "backward" in choice.reason
    windowed = jfa.which_kernels(q, k, v, precision="mxfp8", window_size=(4, 4))
    assert windowed.forward == "triton-mxfp8" and ("window" in windowed.reason or not on_hopper)


def _bad_calls(device):
    q, k, v, cu_q, cu_k = _batch((8, 4), (8, 4), device)
    mq, mk, mv = jmx.quantize(q, "dim"), jmx.quantize(k, "dim"), jmx.quantize(v, "tokens", cu_k)
    other_cu = torch.tensor([0, 6, 12], dtype=torch.int32, device=cu_k.device)
    return {
        "unknown-precision": ((q, k, v, cu_q, cu_k), dict(precision="fp8"), ValueError, "precision: must be one of"),
        "mx-without-mx-precision": ((mq, mk, mv, cu_q, cu_k), {}, TypeError, "need precision='mxfp8'"),
        "mixed-mx-and-tensors": ((mq, k, v, cu_q, cu_k), dict(precision="mxfp8"), TypeError, "all three"),
        "q-along-tokens": ((jmx.quantize(q, "tokens", cu_q), mk, mv, cu_q, cu_k), dict(precision="mxfp8"),
                           ValueError, "q: an MXTensor quantized along 'tokens'"),
        "v-along-dim": ((mq, mk, jmx.quantize(v, "dim"), cu_q, cu_k), dict(precision="mxfp8"), ValueError,
                        "v: an MXTensor quantized along 'dim'"),
        "rule-mismatch": ((mq, mk, mv, cu_q, cu_k), dict(precision="mxfp8-rceil"), ValueError,
                          "q: quantized with rule 'floor'"),
        "v-by-other-offsets": ((mq, mk, jmx.quantize(v, "tokens", other_cu), cu_q, cu_k), dict(precision="mxfp8"),
                               ValueError, "other offsets than cu_seqlens_k"),
        # a window: the TLX MXFP8 forward has no windowed build (and a CPU tensor no TLX kernel at all)
        "tlx-backend": ((q, k, v, cu_q, cu_k), dict(precision="mxfp8", backend="tlx", window_size=(2, 2)), ValueError,
                        "backend: 'tlx'"),
        "torch-backend": ((q, k, v, cu_q, cu_k), dict(precision="mxfp8", backend="torch"), ValueError,
                          "'torch' \\(the reference\\) has no MXFP8 path"),
    }


BAD_CALLS = ("unknown-precision", "mx-without-mx-precision", "mixed-mx-and-tensors", "q-along-tokens", "v-along-dim",
             "rule-mismatch", "v-by-other-offsets", "tlx-backend", "torch-backend")


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_mxfp8_calls_raise_naming_the_rule(name, device):
    args, kwargs, error, message = _bad_calls(device)[name]
    with recording_dispatch() as ran, pytest.raises(error, match=message):
        jfa.jagged_attention(*args, **kwargs)
    assert not ran, "nothing ran"
