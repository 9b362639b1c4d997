"""Test helpers shared by the test suite, the gate, the fuzzers and the benchmarks.

A :class:`Case` describes one problem (lengths, shapes, dtype, flags, value recipe). :func:`run_case`
builds its inputs, runs a backend with NaN-poisoned outputs, and judges outputs and gradients by the
rule of DESIGN.md section 4 against the float64 oracle:

    max|kernel - oracle| <= factor * max|ref_t - oracle| + floor

where ``ref_t`` is the PyTorch reference computed in the input dtype t on the same inputs; factor is
2, and 3 for bf16 gradients. The floor is rounding noise: ``eps(t) * max|oracle|`` (t's rounding at
the output's magnitude) plus ``eps(fp32) * terms``, fp32 accumulation noise at the magnitude of the
terms summed into each element (for dq: |scale| * max|dO| * max|V| * max|K| * sqrt(D)). The second
part matters only where the exact result cancels to ~0 (e.g. dq of length-1 sequences is exactly 0
while the kernel's dP - delta leaves fp32 noise). lse must be -inf exactly where the oracle's is, and
nothing may be NaN.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from jfa import oracle
from jfa.kernels.alloc import poisoned_outputs
from jfa.reference import attention_reference

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23}


@dataclass(frozen=True)
class Case:
    """One jagged attention problem. With ``broadcast_q`` the Q length is ``lengths_q[0]``."""

    lengths_q: tuple
    lengths_k: tuple
    heads: int = 2
    head_dim: int = 32
    dtype: str = "bf16"
    causal: bool = False
    broadcast_q: bool = False
    softmax_scale: Optional[float] = None
    q_scale: float = 1.0  # multiplies Q: large values push the softmax to saturation
    strided: bool = False  # q/k/v are slices of one fused [T, 3, H, D] tensor
    offsets_dtype: str = "int32"
    seed: int = 0
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or describe(self)


def describe(case: Case) -> str:
    def lens(xs):
        return ",".join(map(str, xs)) if len(xs) <= 6 else f"{len(xs)}seqs"

    bits = [f"q[{lens(case.lengths_q)}]", f"k[{lens(case.lengths_k)}]", f"H{case.heads}", f"D{case.head_dim}",
            case.dtype]
    bits += [flag for flag, on in (("causal", case.causal), ("bcastq", case.broadcast_q),
                                   ("strided", case.strided)) if on]
    if case.q_scale != 1.0:
        bits.append(f"qx{case.q_scale:g}")
    if case.softmax_scale is not None:
        bits.append(f"scale{case.softmax_scale:g}")
    return "-".join(bits)


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: Optional[torch.Tensor]
    cu_k: torch.Tensor
    dout: torch.Tensor


def offsets(lengths: Sequence[int], dtype=torch.int32, device="cpu") -> torch.Tensor:
    return torch.tensor([0] + list(np.cumsum(lengths, dtype=np.int64)), dtype=dtype, device=device)


def make_inputs(case: Case, device="cpu") -> Inputs:
    """Fresh random inputs (never zeros) for ``case``; deterministic in ``case.seed``."""
    g = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[case.dtype]
    total_k = int(sum(case.lengths_k))
    num_seqs = len(case.lengths_k)
    total_q = case.lengths_q[0] if case.broadcast_q else int(sum(case.lengths_q))
    rows = num_seqs * case.lengths_q[0] if case.broadcast_q else total_q
    H, D = case.heads, case.head_dim

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    if case.strided:
        # q, k, v as views into one fused projection [T, 3, H, D] (token stride 3*H*D)
        fused = randn(max(total_q, total_k), 3, H, D)
        fused[:, 0] *= case.q_scale
        fused = fused.to(dtype).to(device)
        q, k, v = fused[:total_q, 0], fused[:total_k, 1], fused[:total_k, 2]
    else:
        q = (randn(total_q, H, D) * case.q_scale).to(dtype).to(device)
        k = randn(total_k, H, D).to(dtype).to(device)
        v = randn(total_k, H, D).to(dtype).to(device)
    off_dtype = torch.int64 if case.offsets_dtype == "int64" else torch.int32
    cu_q = None if case.broadcast_q else offsets(case.lengths_q, off_dtype, device)
    cu_k = offsets(case.lengths_k, off_dtype, device)
    dout = randn(rows, H, D).to(dtype).to(device)
    return Inputs(q, k, v, cu_q, cu_k, dout)


@dataclass
class Verdict:
    """The judgement of one tensor: observed error vs the allowed bound."""

    name: str
    error: float
    allowed: float
    problem: str = ""  # non-empty: failed for a reason other than size (NaN, -inf mismatch, shape)

    @property
    def ok(self) -> bool:
        return not self.problem and self.error <= self.allowed

    @property
    def ratio(self) -> float:
        """error / allowed (0 when both are 0): how close to failing; > 1 fails."""
        if self.problem:
            return math.inf
        if self.allowed == 0:
            return 0.0 if self.error == 0 else math.inf
        return self.error / self.allowed

    def __str__(self) -> str:
        status = "ok" if self.ok else "FAIL"
        extra = f" ({self.problem})" if self.problem else ""
        return f"{self.name}: err {self.error:.3e} allowed {self.allowed:.3e} {status}{extra}"


def judge(name: str, kernel: torch.Tensor, ref_t: torch.Tensor, exact: np.ndarray, dtype: torch.dtype,
          factor: float = 2.0, terms: float = 0.0) -> Verdict:
    """Apply the oracle rule to one tensor (see the module docstring)."""
    got = kernel.detach().double().cpu().numpy()
    ref = ref_t.detach().double().cpu().numpy()
    if got.shape != exact.shape:
        return Verdict(name, math.inf, 0.0, f"shape {got.shape} != oracle {exact.shape}")
    if np.isnan(got).any():
        return Verdict(name, math.inf, 0.0, f"{int(np.isnan(got).sum())} NaN values (unwritten or invalid)")
    exact_inf = np.isinf(exact)
    if (np.isinf(got) != exact_inf).any() or (got[exact_inf] != exact[exact_inf]).any():
        return Verdict(name, math.inf, 0.0, "infinities differ from the oracle (e.g. lse -inf rows)")
    finite = ~exact_inf
    if not finite.any():
        return Verdict(name, 0.0, 0.0)
    err = float(np.abs(got[finite] - exact[finite]).max())
    ref_err = float(np.nan_to_num(np.abs(ref[finite] - exact[finite]), nan=np.inf).max())
    floor = EPS[dtype] * float(np.abs(exact[finite]).max()) + EPS[torch.float32] * terms
    return Verdict(name, err, factor * ref_err + floor)


@dataclass
class Report:
    case: Case
    backend: str
    verdicts: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def worst(self) -> Verdict:
        return max(self.verdicts, key=lambda v: v.ratio)

    def __str__(self) -> str:
        return f"[{self.backend}] {self.case.id}\n  " + "\n  ".join(map(str, self.verdicts))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def run_case(case: Case, backend: str = "triton", device="cpu", *, backward: bool = True,
             return_outputs: bool = False):
    """Run ``case`` on ``backend`` with NaN-poisoned outputs and judge it against the oracle."""
    import jfa

    inp = make_inputs(case, device)
    dtype = DTYPES[case.dtype]
    kwargs = dict(causal=case.causal, softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q)
    q, k, v = (t.detach().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))  # keeps strides
    with poisoned_outputs():
        out, lse = jfa.jagged_attention(q, k, v, inp.cu_q, inp.cu_k, causal=case.causal,
                                        softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q,
                                        backend=backend, return_lse=True)
        if backward:
            out.backward(inp.dout)

    cu_q_np = None if case.broadcast_q else _np(inp.cu_q).astype(np.int64)
    cu_k_np = _np(inp.cu_k).astype(np.int64)
    o_exact, lse_exact = oracle.attention_forward(_np(inp.q), _np(inp.k), _np(inp.v), cu_q_np, cu_k_np, **kwargs)
    rq, rk, rv = (t.detach().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))
    o_ref, lse_ref = attention_reference(rq, rk, rv, inp.cu_q, inp.cu_k, **kwargs)
    report = Report(case, backend)
    mag = {name: float(t.detach().abs().max()) if t.numel() else 0.0
           for name, t in (("q", inp.q), ("k", inp.k), ("v", inp.v), ("do", inp.dout))}
    scale = abs(case.softmax_scale) if case.softmax_scale is not None else case.head_dim ** -0.5
    root_d = math.sqrt(case.head_dim)
    terms = {"out": mag["v"], "dv": mag["do"], "dq": scale * mag["do"] * mag["v"] * mag["k"] * root_d,
             "dk": scale * mag["do"] * mag["v"] * mag["q"] * root_d}
    report.verdicts.append(judge("out", out, o_ref, o_exact, dtype, terms=terms["out"]))
    # lse is fp32 whatever t is: its floor is fp32 rounding, the ref_t term carries t's error
    report.verdicts.append(judge("lse", lse, lse_ref, lse_exact, torch.float32))
    if backward:
        o_ref.backward(inp.dout)
        grads_exact = oracle.attention_backward(_np(inp.q), _np(inp.k), _np(inp.v), o_exact, lse_exact,
                                                _np(inp.dout), cu_q_np, cu_k_np, **kwargs)
        factor = 3.0 if dtype == torch.bfloat16 else 2.0
        for name, got, ref, exact in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), (rq.grad, rk.grad, rv.grad),
                                         grads_exact):
            if got is None:
                got = torch.zeros_like(q if name == "dq" else k)
            if ref is None:
                ref = torch.zeros_like(got)
            report.verdicts.append(judge(name, got, ref, exact, dtype, factor, terms=terms[name]))
    if return_outputs:
        return report, (out, lse, q.grad, k.grad, v.grad)
    return report


def replace(case: Case, **changes) -> Case:
    return dataclasses.replace(case, **changes)
