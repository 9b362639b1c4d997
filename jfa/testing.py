"""Test helpers shared by the test suite, the gate, the fuzzers and the benchmarks.

A :class:`Case` describes one problem (lengths, shapes, dtype, flags, value recipe). :func:`run_case`
builds its inputs, runs a backend with NaN-poisoned outputs, and judges outputs and gradients by the
rule of DESIGN.md section 4 against the float64 oracle:

    max|kernel - oracle| <= factor * max|ref_t - oracle| + floor

``ref_t`` is the PyTorch reference computed in the input dtype t on the same inputs; factor is 2, and
3 for bf16 gradients. The floor is rounding noise, each part derived from the case itself:

- ``eps(t) * max|oracle|``: t's rounding at the output's magnitude, plus 4x t's smallest normal
  (subnormal results are noise; GPUs flush them to zero);
- ``eps(fp32) * (terms + sqrt(D) * L * max|oracle|)``: fp32 accumulation noise at the magnitude of
  the summed terms (for dq: |scale| * max|dO| * max|V| * max|K| * sqrt(D)), and the fp32 rounding of
  each logit's dot product (L = |scale| * max_ij sum_d |q_id k_jd|, its summed terms), which exp turns
  into a relative error of P: the forward and the backward recompute the logits in different orders;
- for dq and dk, the gradient shift caused by computing ``delta = rowsum(dO * O)`` from the output
  the forward stored (in t, and itself within its own rule): the oracle backward run with the
  kernel's output minus the oracle backward. Every FlashAttention-style backward carries it; it is
  what remains when the exact gradient cancels (near-tied or equal keys).

lse must be -inf exactly where the oracle's is, and nothing may be NaN.
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
    values: str = "normal"  # a recipe of VALUE_RECIPES: how q, k, v are drawn
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
    if case.values != "normal":
        bits.append(case.values)
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
    dlse: torch.Tensor  # float32 gradient for the lse output: the backward is checked through both


def offsets(lengths: Sequence[int], dtype=torch.int32, device="cpu") -> torch.Tensor:
    return torch.tensor([0] + list(np.cumsum(lengths, dtype=np.int64)), dtype=dtype, device=device)


VALUE_RECIPES = ("normal", "near-ties", "constant-keys", "dominant-key", "denormal")


def _values(recipe: str, randn, rows: int, H: int, D: int, dtype: torch.dtype):
    """float32 q, k, v of ``rows`` tokens drawn by ``recipe`` (callers cut and cast them):

    - normal: independent N(0, 1);
    - near-ties: every key within 1e-3 of one per-head base key, so scores nearly tie;
    - constant-keys: every key equal, so each softmax row is exactly uniform;
    - dominant-key: every 7th key points along a direction all queries share, so it takes almost
      all the probability mass;
    - denormal: everything scaled into t's subnormal range.
    """
    q, k, v = randn(rows, H, D), randn(rows, H, D), randn(rows, H, D)
    if recipe == "near-ties":
        k = randn(1, H, D) + 1e-3 * k
    elif recipe == "constant-keys":
        k = randn(1, H, D).expand(rows, H, D).clone()
    elif recipe == "dominant-key":
        q = 0.5 * q + 2.0
        k[::7] = 4.0
    elif recipe == "denormal":
        tiny = torch.finfo(dtype).tiny
        q, k, v = q * tiny / 4, k * tiny / 4, v * tiny / 4
    elif recipe != "normal":
        raise ValueError(f"values: unknown recipe {recipe!r}, expected one of {VALUE_RECIPES}")
    return q, k, v


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

    width = max(total_q, total_k)
    q, k, v = _values(case.values, randn, width, H, D, dtype)
    q[:total_q] *= case.q_scale
    if case.strided:
        # q, k, v as views into one fused projection [T, 3, H, D] (token stride 3*H*D)
        fused = torch.stack([q, k, v], dim=1).to(dtype).to(device)
        q, k, v = fused[:total_q, 0], fused[:total_k, 1], fused[:total_k, 2]
    else:
        q, k, v = (t[:n].to(dtype).to(device) for t, n in ((q, total_q), (k, total_k), (v, total_k)))
    off_dtype = torch.int64 if case.offsets_dtype == "int64" else torch.int32
    cu_q = None if case.broadcast_q else offsets(case.lengths_q, off_dtype, device)
    cu_k = offsets(case.lengths_k, off_dtype, device)
    dout = randn(rows, H, D).to(dtype).to(device)
    dlse = randn(rows, H).to(device)
    return Inputs(q, k, v, cu_q, cu_k, dout, dlse)


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
          factor: float = 2.0, noise: float = 0.0) -> Verdict:
    """Apply the oracle rule to one tensor; ``noise``: the case-derived parts of the floor beyond
    ``eps(t) * max|oracle| + tiny(t)`` (see the module docstring)."""
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
    # results within a few smallest-normals of zero are noise: GPUs flush subnormals, and the CPU
    # interpreter's bf16 conversion loses them
    floor = EPS[dtype] * float(np.abs(exact[finite]).max()) + 4 * torch.finfo(dtype).tiny + noise
    return Verdict(name, err, factor * ref_err + floor)


@dataclass
class Report:
    case: Case
    backend: str
    verdicts: list = field(default_factory=list)
    kernel: str = ""  # the forward kernel that ran (jfa.which_kernels), e.g. "tlx-hopper" or "triton"
    backward_kernel: str = ""  # the backward kernel that ran (gradient cases only)

    def worst_per_kernel(self) -> dict:
        """{"fwd <kernel>": worst ratio of out/lse, "bwd <kernel>": worst ratio of the gradients}."""
        out = {}
        for v in self.verdicts:
            grad = v.name in ("dq", "dk", "dv")
            key = f"bwd {self.backward_kernel or self.kernel}" if grad else f"fwd {self.kernel}"
            out[key] = max(out.get(key, 0.0), v.ratio)
        return out

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    @property
    def worst(self) -> Verdict:
        return max(self.verdicts, key=lambda v: v.ratio)

    def __str__(self) -> str:
        ran = f" -> {self.kernel}" if self.kernel and self.kernel != self.backend else ""
        return f"[{self.backend}{ran}] {self.case.id}\n  " + "\n  ".join(map(str, self.verdicts))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _max_logit_terms(q, k, cu_q, cu_k, scale: float, broadcast_q: bool) -> float:
    """max over (query, key) pairs of |scale| * sum_d |q_d k_d|: the magnitude of the terms summed into
    one logit (an upper bound of |logit|; taken over all pairs, also under causal)."""
    peak = 0.0
    q, k = np.abs(q), np.abs(k)
    for b in range(len(cu_k) - 1):
        ks = k[cu_k[b]:cu_k[b + 1]]
        qs = q if broadcast_q else q[cu_q[b]:cu_q[b + 1]]
        if len(ks) and len(qs):
            logits = qs.transpose(1, 0, 2) @ ks.transpose(1, 2, 0)  # [H, lq, lk] of sum_d |q_d k_d|
            peak = max(peak, float(logits.max()) * scale)
    return peak


def cannot_run(case: Case, backend: str, device="cpu") -> str:
    """Why ``backend`` cannot run ``case`` at all ("" if it can): only an explicit backend="tlx" refuses
    calls (dtype, head dim, strides, GPU); "auto" falls back instead. Tests skip such cases."""
    import jfa

    if backend != "tlx":
        return ""
    inp = make_inputs(case, device)
    try:
        jfa.which_kernels(inp.q, inp.k, inp.v, backend=backend)
    except ValueError as exc:
        return str(exc)
    return ""


def run_case(case: Case, backend: str = "auto", device="cpu", *, backward: bool = True,
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
            torch.autograd.backward([out, lse], [inp.dout, inp.dlse])

    cu_q_np = None if case.broadcast_q else _np(inp.cu_q).astype(np.int64)
    cu_k_np = _np(inp.cu_k).astype(np.int64)
    o_exact, lse_exact = oracle.attention_forward(_np(inp.q), _np(inp.k), _np(inp.v), cu_q_np, cu_k_np, **kwargs)
    rq, rk, rv = (t.detach().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))
    o_ref, lse_ref = attention_reference(rq, rk, rv, inp.cu_q, inp.cu_k, **kwargs)
    choice = jfa.which_kernels(q, k, v, backend=backend)
    report = Report(case, backend, kernel=choice.forward, backward_kernel=choice.backward if backward else "")
    mag = {name: float(t.detach().abs().max()) if t.numel() else 0.0
           for name, t in (("q", inp.q), ("k", inp.k), ("v", inp.v), ("do", inp.dout))}
    scale = abs(case.softmax_scale) if case.softmax_scale is not None else case.head_dim ** -0.5
    root_d = math.sqrt(case.head_dim)
    terms = {"out": mag["v"], "dv": mag["do"], "dq": scale * mag["do"] * mag["v"] * mag["k"] * root_d,
             "dk": scale * mag["do"] * mag["v"] * mag["q"] * root_d}
    logit_terms = _max_logit_terms(_np(inp.q), _np(inp.k), cu_q_np, cu_k_np, scale, case.broadcast_q)

    def noise(name, exact, shift=0.0):
        peak = float(np.abs(exact[np.isfinite(exact)]).max()) if np.isfinite(exact).any() else 0.0
        return EPS[torch.float32] * (terms.get(name, 0.0) + root_d * logit_terms * peak) + shift

    report.verdicts.append(judge("out", out, o_ref, o_exact, dtype, noise=noise("out", o_exact)))
    # lse is fp32 whatever t is: its floor is fp32 rounding, the ref_t term carries t's error
    report.verdicts.append(judge("lse", lse, lse_ref, lse_exact, torch.float32, noise=noise("lse", lse_exact)))
    if backward:
        torch.autograd.backward([o_ref, lse_ref], [inp.dout, inp.dlse.to(lse_ref.dtype)])
        args = (_np(inp.q), _np(inp.k), _np(inp.v))
        kwargs["dlse"] = _np(inp.dlse)
        grads_exact = oracle.attention_backward(*args, o_exact, lse_exact, _np(inp.dout), cu_q_np, cu_k_np, **kwargs)
        grads_shifted = oracle.attention_backward(*args, _np(out), lse_exact, _np(inp.dout), cu_q_np, cu_k_np,
                                                  **kwargs)
        # rounding scale of each gradient's sums (a key seen by many queries sums many terms)
        magnitudes = oracle.attention_backward(*args, o_exact, lse_exact, _np(inp.dout), cu_q_np, cu_k_np,
                                               magnitudes=True, **kwargs)
        for name, mag_exact in zip(("dq", "dk", "dv"), magnitudes):
            if mag_exact.size:
                terms[name] = max(terms[name], float(mag_exact.max()))
        factor = 3.0 if dtype == torch.bfloat16 else 2.0
        for name, got, ref, exact, shifted in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                                                  (rq.grad, rk.grad, rv.grad), grads_exact, grads_shifted):
            if got is None:
                got = torch.zeros_like(q if name == "dq" else k)
            if ref is None:
                ref = torch.zeros_like(got)
            shift = float(np.abs(shifted - exact).max()) if exact.size else 0.0
            report.verdicts.append(judge(name, got, ref, exact, dtype, factor, noise=noise(name, exact, shift)))
    if return_outputs:
        return report, (out, lse, q.grad, k.grad, v.grad)
    return report


def replace(case: Case, **changes) -> Case:
    return dataclasses.replace(case, **changes)
