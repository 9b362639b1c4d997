"""The PyTorch reference (jfa.reference) against the float64 NumPy oracle (jfa.oracle).

float64: forward and autograd backward agree with the oracle to 1e-10. bf16/fp16: error vs the oracle
is small but non-zero (it really computes in that dtype). Masked rows never produce NaN gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pytest
import torch

from jfa.oracle import attention_backward, attention_forward
from jfa.reference import attention_reference, torch_ref


@dataclass(frozen=True)
class Case:
    lens_q: Optional[Sequence[int]]   # None with broadcast_q
    lens_k: Sequence[int]
    causal: bool = False
    scale: Optional[float] = None
    bcast_lq: Optional[int] = None
    H: int = 2
    D: int = 8
    Hk: Optional[int] = None  # key/value heads (grouped-query attention); None: H
    window: tuple = (-1, -1)


CASES = {
    "plain": Case([3, 5, 2], [3, 5, 2]),
    "plain-lq-ne-lk": Case([2, 4], [5, 3]),
    "causal-lq-eq-lk": Case([3, 4, 1], [3, 4, 1], causal=True),
    "causal-lq-gt-lk-masked-rows": Case([5, 4], [2, 1], causal=True),
    "causal-lq-lt-lk": Case([2, 3], [5, 6], causal=True),
    "empty-leading": Case([0, 3, 2], [0, 3, 2], causal=True),
    "empty-trailing": Case([3, 2, 0], [3, 2, 0]),
    "empty-middle": Case([3, 0, 2], [2, 0, 4]),
    "empty-q-only": Case([2, 0, 1], [2, 3, 1]),
    "empty-k-only": Case([2, 3, 1], [2, 0, 1], causal=True),
    "empty-all": Case([0, 0, 0], [0, 0, 0]),
    "empty-k-all": Case([2, 3], [0, 0]),
    "batch-zero": Case([], []),
    "explicit-scale": Case([3, 2], [4, 2], causal=True, scale=0.37),
    "broadcast-q": Case(None, [2, 0, 4, 3], bcast_lq=3),
    "broadcast-q-causal": Case(None, [2, 0, 4, 3], causal=True, bcast_lq=3),
    "broadcast-q-batch-zero": Case(None, [], bcast_lq=3),
    "gqa-causal": Case([3, 5, 2], [4, 5, 2], causal=True, H=4, Hk=2),
    "mqa": Case([3, 5], [4, 6], H=3, Hk=1),
    "window-both": Case([6, 4], [5, 7], window=(1, 2)),
    "window-causal-left-masked-rows": Case([6, 7], [2, 5], causal=True, window=(1, -1)),
    "gqa-window-broadcast-q": Case(None, [3, 0, 6], H=4, Hk=2, window=(2, 0), bcast_lq=4),
}


def _offsets(lens):
    return torch.tensor([0] + list(np.cumsum(lens, dtype=np.int64)), dtype=torch.int32)


def make_inputs(c: Case, dtype=torch.float64, seed: int = 0, strided: bool = False):
    """(q, k, v, cu_q, cu_k, kwargs); leaf tensors requiring grad. ``strided``: q/k/v are slices
    of fused ``[T, 3, H, D]`` projections (non-contiguous views)."""
    g = torch.Generator().manual_seed(seed)
    cu_k = _offsets(list(c.lens_k))
    if c.bcast_lq is not None:
        tq, cu_q = c.bcast_lq, None
    else:
        cu_q = _offsets(list(c.lens_q))
        tq = int(cu_q[-1])
    tk = int(cu_k[-1])
    hk = c.Hk or c.H
    if strided:
        fq = torch.randn(tq, 3, c.H, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        fkv = torch.randn(tk, 3, hk, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        q, k, v = fq[:, 0], fkv[:, 1], fkv[:, 2]
        leaves = (fq, fkv)
    else:
        q = torch.randn(tq, c.H, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        k = torch.randn(tk, hk, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        v = torch.randn(tk, hk, c.D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        leaves = (q, k, v)
    kw = dict(causal=c.causal, softmax_scale=c.scale, broadcast_q=c.bcast_lq is not None, window=c.window)
    return q, k, v, cu_q, cu_k, kw, leaves


def _np(t):
    return t.detach().to(torch.float64).numpy()


def _oracle(q, k, v, cu_q, cu_k, kw, dout):
    a = [_np(x) for x in (q, k, v)]
    cq = None if cu_q is None else cu_q.numpy()
    out, lse = attention_forward(*a, cq, cu_k.numpy(), **kw)
    grads = attention_backward(*a, out, lse, _np(dout), cq, cu_k.numpy(), **kw)
    return out, lse, grads


def _check_float64(c: Case, strided: bool):
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(c, strided=strided)
    out, lse = attention_reference(q, k, v, cu_q, cu_k, **kw)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    o_out, o_lse, (o_dq, o_dk, o_dv) = _oracle(q, k, v, cu_q, cu_k, kw, dout)
    assert tuple(out.shape) == o_out.shape and tuple(lse.shape) == o_lse.shape
    np.testing.assert_allclose(_np(out), o_out, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(np.isneginf(_np(lse)), np.isneginf(o_lse))
    np.testing.assert_allclose(_np(lse), o_lse, rtol=0, atol=1e-10)
    for name, got, want in (("dq", dq, o_dq), ("dk", dk, o_dk), ("dv", dv, o_dv)):
        assert tuple(got.shape) == want.shape, name
        np.testing.assert_allclose(_np(got), want, rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_float64_matches_oracle(name):
    _check_float64(CASES[name], strided=False)


@pytest.mark.parametrize("name", ["plain", "causal-lq-gt-lk-masked-rows", "empty-middle", "broadcast-q-causal"])
def test_float64_strided_inputs_match_oracle(name):
    _check_float64(CASES[name], strided=True)


@pytest.mark.parametrize("name", ["plain-lq-ne-lk", "causal-lq-gt-lk-masked-rows", "causal-lq-lt-lk", "empty-middle",
                                  "broadcast-q-causal", "gqa-causal", "window-both", "window-causal-left-masked-rows",
                                  "gqa-window-broadcast-q"])
def test_float64_in_row_chunks_matches_oracle(name, monkeypatch):
    """A sequence whose scores exceed CHUNK_BYTES is taken a few query rows at a time (here one to three):
    the same forward and autograd gradients as the oracle's, masks and windows offset to each chunk's rows."""
    monkeypatch.setattr(torch_ref, "CHUNK_BYTES", 12 * 8)  # 12 float64 scores
    _check_float64(CASES[name], strided=False)


def _causal_lists(heads: int, blocks: int) -> tuple:
    """Block-sparse lists of one sequence of ``blocks`` 16-row blocks: every query block lists the key blocks up to
    its own (the causally visible ones), for every head."""
    lists = [list(range(t + 1)) for _ in range(heads) for t in range(blocks)]
    offsets = torch.tensor([0] + list(np.cumsum([len(r) for r in lists])))
    return offsets, torch.tensor([u for r in lists for u in r]), 16


def _largest_saved(chunk_scores: int, monkeypatch, sparse: bool = False) -> int:
    """The most elements of any tensor autograd keeps for the backward of one long causal sequence (2 heads,
    256 rows: 131072 scores) with the reference's chunk of ``chunk_scores`` float64 scores; ``sparse``: as
    block-sparse attention listing every causally visible 16-key block."""
    monkeypatch.setattr(torch_ref, "CHUNK_BYTES", chunk_scores * 8)
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(Case([256], [256], causal=True, H=2, D=8))
    if sparse:
        kw = dict(kw, kv_blocks=_causal_lists(2, 16))
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, lse = attention_reference(q, k, v, cu_q, cu_k, **kw)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    return max(sizes)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "block-sparse"])
def test_a_long_sequence_keeps_no_score_matrix_for_the_backward(sparse, monkeypatch):
    """Autograd keeps nothing the size of a chunk's scores or of the sequence's block-sparse mask (each chunk's
    scores and mask are recomputed in the backward); without chunking it keeps the whole sequence's scores,
    which is what runs a GPU out of memory."""
    assert _largest_saved(2 * 256 * 16, monkeypatch, sparse) <= 256 * 2 * 8  # q, k, v's size at most
    assert _largest_saved(1 << 25, monkeypatch, sparse) >= 2 * 256 * 256


def test_strided_inputs_are_really_strided():
    q, k, v, *_ = make_inputs(CASES["plain"], strided=True)
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()


@pytest.mark.parametrize("name", ["batch-zero", "empty-all", "empty-k-all", "broadcast-q-batch-zero"])
def test_degenerate_batches_support_backward_with_zero_grads(name):
    """Nothing visible anywhere: outputs still in the autograd graph, .backward() gives zero grads."""
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(CASES[name])
    out, lse = attention_reference(q, k, v, cu_q, cu_k, **kw)
    assert out.requires_grad and lse.requires_grad
    (out.sum() + lse[torch.isfinite(lse)].sum()).backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape
        assert torch.all(t.grad == 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["plain", "causal-lq-gt-lk-masked-rows", "broadcast-q-causal"])
def test_low_precision_error_small_but_nonzero(name, dtype):
    c = CASES[name]
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(c, dtype=dtype, seed=2)
    out, lse = attention_reference(q, k, v, cu_q, cu_k, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    o_out, o_lse, o_grads = _oracle(q, k, v, cu_q, cu_k, kw, dout)
    eps = torch.finfo(dtype).eps
    err = np.max(np.abs(_np(out) - o_out))
    assert 0 < err < 8 * eps * max(1.0, np.max(np.abs(o_out)))
    finite = np.isfinite(o_lse)
    np.testing.assert_array_equal(np.isfinite(_np(lse)), finite)
    assert np.max(np.abs(_np(lse)[finite] - o_lse[finite])) < 8 * eps * max(1.0, np.max(np.abs(o_lse[finite])))
    for g, o in zip(grads, o_grads):
        assert g.dtype == dtype
        gerr = np.max(np.abs(_np(g) - o))
        assert 0 < gerr < 32 * eps * max(1.0, np.max(np.abs(o)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp64", "fp32", "bf16", "fp16"])
def test_fully_masked_rows_have_zero_out_neginf_lse_and_no_nan_grads(dtype):
    c = CASES["causal-lq-gt-lk-masked-rows"]  # seq 0: Lq=5, Lk=2 -> rows 0..2 masked; seq 1: rows 5..7
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(c, dtype=dtype, seed=4)
    out, lse = attention_reference(q, k, v, cu_q, cu_k, **kw)
    masked = [0, 1, 2, 5, 6, 7]
    assert torch.all(out[masked] == 0)
    assert torch.all(torch.isneginf(lse[masked]))
    # Also backpropagate through the finite lse entries (lse is differentiable too).
    loss = (out.float() ** 2).sum() + lse[torch.isfinite(lse)].sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    for g in (dq, dk, dv):
        assert not torch.isnan(g).any()
    assert torch.all(dq[masked] == 0)


def test_lse_gradient_matches_softmax_weights():
    """d lse_i / d q_i = scale * sum_j P_ij k_j, i.e. scale * (oracle out with v := k)."""
    c = CASES["causal-lq-lt-lk"]
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(c, seed=5)
    _, lse = attention_reference(q, k, v, cu_q, cu_k, **kw)
    (dq,) = torch.autograd.grad(lse.sum(), (q,))
    o_out, _ = attention_forward(_np(q), _np(k), _np(k), cu_q.numpy(), cu_k.numpy(), **kw)
    scale = 1 / np.sqrt(c.D)
    np.testing.assert_allclose(_np(dq), scale * o_out, rtol=0, atol=1e-10)


def test_broadcast_q_with_cu_seqlens_q_raises():
    q, k, v, _, cu_k, _, _ = make_inputs(CASES["broadcast-q"])
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attention_reference(q, k, v, _offsets([3]), cu_k, broadcast_q=True)


def test_compute_dtype_float64_from_float32_inputs():
    c = CASES["causal-lq-gt-lk-masked-rows"]
    q, k, v, cu_q, cu_k, kw, _ = make_inputs(c, dtype=torch.float32, seed=6)
    out, lse = attention_reference(q, k, v, cu_q, cu_k, compute_dtype=torch.float64, **kw)
    assert out.dtype == torch.float32 and lse.dtype == torch.float64
    o_out, o_lse = attention_forward(_np(q), _np(k), _np(v), cu_q.numpy(), cu_k.numpy(), **kw)
    np.testing.assert_allclose(_np(out), o_out, rtol=0, atol=1e-6)
    np.testing.assert_allclose(_np(lse), o_lse, rtol=0, atol=1e-12)
