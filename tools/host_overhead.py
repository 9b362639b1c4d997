"""Host (CPU) time of one jagged_attention call with the kernels stubbed out: the cost of validation,
dispatch and autograd alone, which a GPU waits on whenever its kernels are shorter. Runs on a CPU
machine. The launchers are replaced by ones that only allocate their outputs.

    TRITON_INTERPRET=1 python tools/host_overhead.py            # min of 5 x 1000 calls, fwd and fwd+bwd

On a GPU machine `jfa bench` measures the same thing with the real kernels (the host_us column)."""
import time

import torch

import jfa
from jfa.kernels.triton import backward as portable_backward
from jfa.kernels.triton import forward as portable_forward


def main(calls: int = 1000, rounds: int = 5) -> None:
    portable_forward.jagged_forward = lambda q, k, v, cu_q, cu_k, **kw: (torch.empty_like(q), torch.empty(q.shape[:2]))
    portable_backward.jagged_backward = lambda q, k, v, out, lse, dout, cu_q, cu_k, **kw: (
        torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    q, k, v = (torch.randn(8, 4, 64, requires_grad=True) for _ in range(3))
    cu, grad = torch.tensor([0, 3, 8]), torch.randn(8, 4, 64)

    def forward():
        return jfa.jagged_attention(q, k, v, cu, cu, backend="triton")

    def forward_backward():
        forward().backward(grad)

    for name, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for _ in range(100):
            fn()
        best = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best.append((time.perf_counter() - start) / calls * 1e6)
        print(f"{name}: {min(best):.1f} us per call (min of {rounds} x {calls})")


if __name__ == "__main__":
    main()
