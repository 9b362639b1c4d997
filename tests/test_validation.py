"""Bad input raises TypeError/ValueError naming the argument and the rule, before any kernel runs."""
import pytest
import torch

import jfa
from jfa.kernels import alloc


def good(total=10, lengths=(4, 6), H=2, D=16, dtype=torch.float16):
    q = torch.randn(total, H, D, dtype=dtype)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return dict(q=q, k=q.clone(), v=q.clone(), cu_seqlens_q=cu, cu_seqlens_k=cu.clone())


def call(op=jfa.jagged_attention, **overrides):
    args = good()
    kwargs = {k: overrides.pop(k) for k in list(overrides) if k not in args}
    args.update(overrides)
    return op(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"], **kwargs)


def compiled(*args, **kwargs):
    """The op under torch.compile (aot_eager: traced by Dynamo, run by the op's own kernels)."""
    torch._dynamo.reset()
    return torch.compile(jfa.jagged_attention, backend="aot_eager")(*args, **kwargs)


CU = lambda *xs, dtype=torch.int32: torch.tensor(xs, dtype=dtype)  # noqa: E731

BAD = [
    # id, overrides, exception, words the message must contain
    ("offsets-2d", dict(cu_seqlens_k=CU(0, 4, 10).view(1, 3)), ValueError, ["cu_seqlens_k", "1-D"]),
    ("offsets-float", dict(cu_seqlens_q=torch.tensor([0.0, 4.0, 10.0])), TypeError, ["cu_seqlens_q", "int32 or int64"]),
    ("offsets-int16", dict(cu_seqlens_q=CU(0, 4, 10, dtype=torch.int16)), TypeError, ["cu_seqlens_q", "int32"]),
    ("offsets-not-tensor", dict(cu_seqlens_q=[0, 4, 10]), TypeError, ["cu_seqlens_q", "Tensor"]),
    ("offsets-empty", dict(cu_seqlens_k=CU()), ValueError, ["cu_seqlens_k", "B+1"]),
    ("first-not-zero", dict(cu_seqlens_q=CU(1, 4, 10)), ValueError, ["cu_seqlens_q", "first offset must be 0"]),
    ("decreasing", dict(cu_seqlens_k=CU(0, 6, 4, 10), cu_seqlens_q=CU(0, 4, 4, 10)), ValueError,
     ["cu_seqlens_k", "non-decreasing"]),
    ("last-not-total", dict(cu_seqlens_q=CU(0, 4, 9)), ValueError, ["cu_seqlens_q", "last offset", "10"]),
    ("batch-mismatch", dict(cu_seqlens_q=CU(0, 10)), ValueError, ["cu_seqlens_q, cu_seqlens_k", "same length"]),
    ("q-rank", dict(q=torch.randn(10, 32, dtype=torch.float16)), ValueError, ["q", "3-D"]),
    ("k-rank", dict(k=torch.randn(1, 10, 2, 16, dtype=torch.float16)), ValueError, ["k", "3-D"]),
    ("head-count", dict(k=torch.randn(10, 3, 16, dtype=torch.float16), v=torch.randn(10, 3, 16, dtype=torch.float16)),
     ValueError, ["q, k", "multiple of k's"]),
    ("window-type", dict(window_size=(3,)), TypeError, ["window_size", "pair of ints"]),
    ("window-bool", dict(window_size=(True, 2)), TypeError, ["window_size", "pair of ints"]),
    ("window-negative", dict(window_size=(-2, 4)), ValueError, ["window_size", ">= 0, or -1"]),
    ("window-causal-right", dict(window_size=(4, 2), causal=True), ValueError, ["window_size", "right side is 0"]),
    ("head-dim", dict(k=torch.randn(10, 2, 8, dtype=torch.float16), v=torch.randn(10, 2, 8, dtype=torch.float16)),
     ValueError, ["q, k", "head dims"]),
    ("kv-shape", dict(v=torch.randn(10, 2, 8, dtype=torch.float16)), ValueError, ["k, v", "shapes must match"]),
    ("head-dim-too-big", dict(q=torch.randn(10, 2, 512, dtype=torch.float16), k=torch.randn(10, 2, 512, dtype=torch.float16),
                              v=torch.randn(10, 2, 512, dtype=torch.float16)), ValueError, ["head_dim", "256"]),
    ("dtype-float64", dict(q=torch.randn(10, 2, 16, dtype=torch.float64)), TypeError, ["q", "dtype"]),
    ("dtype-mixed", dict(k=torch.randn(10, 2, 16, dtype=torch.bfloat16)), TypeError, ["q, k, v", "one dtype"]),
    ("dtype-int", dict(v=torch.ones(10, 2, 16, dtype=torch.int32)), TypeError, ["v", "dtype"]),
    ("q-not-tensor", dict(q="q"), TypeError, ["q", "Tensor"]),
    ("hint-too-small", dict(max_seqlen_q=5), ValueError, ["max_seqlen_q", "smaller than the longest", "6"]),
    ("hint-k-too-small", dict(max_seqlen_k=3), ValueError, ["max_seqlen_k", "smaller"]),
    ("hint-not-int", dict(max_seqlen_k=6.0), TypeError, ["max_seqlen_k", "int"]),
    ("hint-negative", dict(max_seqlen_q=-1), ValueError, ["max_seqlen_q", ">= 0"]),
    ("bcastq-with-cu-q", dict(broadcast_q=True), ValueError, ["cu_seqlens_q", "None when broadcast_q"]),
    ("cu-q-missing", dict(cu_seqlens_q=None), ValueError, ["cu_seqlens_q", "required"]),
    ("scale-nan", dict(softmax_scale=float("nan")), ValueError, ["softmax_scale", "finite"]),
    ("scale-str", dict(softmax_scale="0.1"), TypeError, ["softmax_scale"]),
    ("causal-not-bool", dict(causal=1), TypeError, ["causal", "bool"]),
    ("backend-unknown", dict(backend="cuda"), ValueError, ["backend", "one of"]),
    ("backend-tlx-on-cpu", dict(backend="tlx"), ValueError, ["backend", "tlx", "CUDA"]),
    ("precision-unknown", dict(precision="fp8"), ValueError, ["precision", "one of"]),
    ("precision-unknown", dict(precision="fp8"), ValueError, ["precision", "fp8"]),
    ("precision-mxfp8-on-the-reference", dict(precision="mxfp8", backend="torch"), ValueError, ["backend", "MXFP8"]),
]


@pytest.mark.parametrize("op", [jfa.jagged_attention, compiled], ids=["eager", "torch-compile"])
@pytest.mark.parametrize("overrides, exc, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_rejected_with_a_named_rule(overrides, exc, words, op, monkeypatch):
    launched = []
    monkeypatch.setattr(alloc, "empty", lambda *a, **k: launched.append(a) or torch.empty(*a[:1]))
    with pytest.raises(exc) as info:
        call(op, **overrides)
    for word in words:
        assert word in str(info.value), f"message {str(info.value)!r} lacks {word!r}"
    assert not launched, "a kernel output was allocated before validation failed"


def test_devices_must_match():
    meta = torch.empty(10, 2, 16, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="q, k, v: must be on one device"):
        call(k=meta)


def test_offsets_on_another_device_rejected():
    with pytest.raises(ValueError, match="cu_seqlens_k: must be on the same device"):
        call(cu_seqlens_k=torch.tensor([0, 4, 10], dtype=torch.int32, device="meta"))


def test_valid_hints_accepted():
    out = call(max_seqlen_q=6, max_seqlen_k=100)
    assert out.shape == (10, 2, 16)


def test_offsets_are_read_once_per_tensor_and_again_after_a_write(monkeypatch):
    import jfa.dispatch as dispatch

    reads = []
    real = dispatch.read_offsets
    monkeypatch.setattr(dispatch, "read_offsets", lambda *a: reads.append(a[0]) or real(*a))
    args = good()
    for _ in range(3):
        jfa.jagged_attention(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"])
    assert sorted(reads) == ["cu_seqlens_k", "cu_seqlens_q"], "each offsets tensor is read once"
    args["cu_seqlens_k"][1] = 11  # now decreasing: the in-place write must be seen
    with pytest.raises(ValueError, match="non-decreasing"):
        jfa.jagged_attention(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"])
