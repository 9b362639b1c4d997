"""The TLX MXFP8 forward and backward on small ragged problems (empty sequences, tails, causal, broadcast Q,
grouped heads) against the portable MX kernels, for a first GPU run and under compute-sanitizer. Prints one
line per case and pass."""
import torch

import jfa.mx as jmx
from jfa.kernels.schedule import virtual_cu_seqlens
from jfa.kernels.tlx.hopper.backward import mx_backward_tlx
from jfa.kernels.tlx.hopper.forward import mx_forward_tlx
from jfa.kernels.triton.mx_attention import mx_backward, mx_forward

import os
DEV = os.environ.get("DEV", "cuda")
torch.manual_seed(0)
for D, causal, bcast, kv_heads, window in ((64, False, False, 2, (-1, -1)), (128, True, False, 2, (-1, -1)),
                                           (128, True, True, 2, (-1, -1)), (128, False, False, 1, (-1, -1)),
                                           (64, True, True, 1, (-1, -1))):
    lens = [70, 0, 150, 33, 1, 260]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    T, H = int(cu[-1]), 2
    lq = 100 if bcast else 0
    q = torch.randn(lq if bcast else T, H, D, device=DEV)
    k, v = (torch.randn(T, kv_heads, D, device=DEV) for _ in range(2))
    qm, km, vm = jmx.quantize(q, "dim"), jmx.quantize(k, "dim"), jmx.quantize(v, "tokens", cu)
    cu_q = virtual_cu_seqlens(len(lens), lq, DEV) if bcast else cu
    args = dict(causal=causal, softmax_scale=D ** -0.5, broadcast_q=bcast, num_seqs=len(lens), len_q_bcast=lq,
                window=window, out_dtype=torch.float32)
    out, lse = mx_forward_tlx(qm, km, vm, cu_q, cu, **args)
    ref, ref_lse = mx_forward(qm, km, vm, cu_q, cu, **args)
    fin = torch.isfinite(ref_lse)
    print(f"D{D} causal={causal} bcast={bcast} kv_heads={kv_heads} window={window}: "
          f"out max diff {float((out - ref).abs().max()):.3g} (ref max {float(ref.abs().max()):.3g}), "
          f"lse max diff {float((lse[fin] - ref_lse[fin]).abs().max()):.3g}, "
          f"empty rows agree {bool(torch.equal(torch.isinf(lse), torch.isinf(ref_lse)))}", flush=True)
    if window != (-1, -1):
        continue
    dout = torch.randn_like(out)
    grads = dict(causal=causal, softmax_scale=D ** -0.5, broadcast_q=bcast, num_seqs=len(lens), len_q_bcast=lq)
    got = mx_backward_tlx(q, k, v, ref, ref_lse, dout, cu_q, cu, **grads)
    want = mx_backward(q, k, v, ref, ref_lse, dout, cu_q, cu, **grads)
    print("    backward: " + ", ".join(f"{name} max diff {float((a - b).abs().max()):.3g} (ref max "
                                        f"{float(b.abs().max()):.3g})" for name, a, b in zip(("dq", "dk", "dv"), got, want)),
          flush=True)
