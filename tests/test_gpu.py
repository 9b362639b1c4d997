"""Checks that need a real GPU: index arithmetic past 2**31 elements, bitwise reproducibility under
real concurrency. Skipped, with the reason, on CPU-only machines."""
import numpy as np
import pytest
import torch

import jfa
from jfa import oracle

pytestmark = pytest.mark.gpu


def test_offsets_past_int32_elements(device):
    """total_tokens * H * D > 2**31: the last sequences sit past the int32 element range."""
    H, D, L = 1, 128, 64
    total = (2 ** 31) // (H * D) + 3 * L  # ~16.8M tokens
    B = total // L
    total = B * L
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.arange(B + 1, device="cuda", dtype=torch.int32) * L
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = jfa.jagged_attention(q, k, v, cu, cu, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    rows = slice(total - 2 * L, total)  # the last two sequences: element offsets > 2**31
    assert (total - 2 * L) * H * D > 2 ** 31
    f = lambda t: t[rows].detach().double().cpu().numpy()  # noqa: E731
    cu_tail = np.array([0, L, 2 * L])
    o_ref, lse_ref = oracle.attention_forward(f(q), f(k), f(v), cu_tail, cu_tail, causal=True)
    dq_ref, dk_ref, dv_ref = oracle.attention_backward(f(q), f(k), f(v), o_ref, lse_ref, f(dout), cu_tail, cu_tail,
                                                       causal=True)
    for got, ref in ((out, o_ref), (q.grad, dq_ref), (k.grad, dk_ref), (v.grad, dv_ref)):
        assert np.abs(f(got) - ref).max() < 0.05


def test_grads_bitwise_reproducible_over_20_runs_on_contended_broadcast_q(device):
    g = torch.Generator(device="cuda").manual_seed(1)
    B, Lq, H, D = 256, 128, 4, 64
    lengths = torch.randint(1, 300, (B,), generator=torch.Generator().manual_seed(0))
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to("cuda")
    total = int(lengths.sum())
    q = torch.randn(Lq, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(B * Lq, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    first = None
    for _ in range(20):
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        jfa.jagged_attention(qq, kk, vv, None, cu, broadcast_q=True, deterministic=True).backward(dout)
        grads = (qq.grad, kk.grad, vv.grad)
        if first is None:
            first = tuple(g.clone() for g in grads)
        for name, got, want in zip("qkv", grads, first):
            assert torch.equal(got, want), f"d{name} changed between runs"
