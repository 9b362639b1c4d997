"""The oracle rule (docs/design.md, "What right means") and the case runner every harness shares.

:func:`run_case` builds a :class:`jfa.fuzz.cases.Case`'s inputs, runs a backend with NaN-poisoned outputs,
and judges outputs and gradients against the float64 oracle:

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
- for dq and dk, ``eps(t) / 2 * terms``: the rounding of dS to t before the dQ and dK products (the
  jfa kernels, FlashAttention and the reference all feed dS to that product in t), bounded by t's unit
  roundoff at the magnitude of the summed terms ``|scale| sum_j |dS_ij| |K_j|`` (the oracle's
  magnitudes, not the cruder bound of the fp32 term). Each row of dS sums to zero, so dq is a
  difference of such terms: with near-tied keys the rounding is all that is left of it, and the
  reference's own realisation of the same rounding can be several times smaller (found by jfa fuzz:
  the kernels' dq was 1.18x the rule without this term).

lse must be -inf exactly where the oracle's is, and nothing may be NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from jfa import oracle
from jfa.api import recording_dispatch
from jfa.fuzz.cases import DTYPES, Case, block_lists_for, make_inputs
from jfa.kernels.alloc import poisoned_outputs
from jfa.reference import attention_reference

EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23}


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


def judge(name: str, kernel: torch.Tensor, ref_t: torch.Tensor, exact, dtype: torch.dtype,
          factor: float = 2.0, noise: float = 0.0) -> Verdict:
    """Apply the oracle rule to one tensor; ``noise``: the case-derived parts of the floor beyond
    ``eps(t) * max|oracle| + tiny(t)`` (see the module docstring). ``exact``: the oracle's values, a
    NumPy array or a float64 tensor (the comparison runs on its device; only scalars come back)."""
    exact = torch.as_tensor(exact, dtype=torch.float64)
    got = kernel.detach().to(exact.device, torch.float64)
    ref = ref_t.detach().to(exact.device, torch.float64)
    if got.shape != exact.shape:
        return Verdict(name, math.inf, 0.0, f"shape {tuple(got.shape)} != oracle {tuple(exact.shape)}")
    nans = int(torch.isnan(got).sum())
    if nans:
        return Verdict(name, math.inf, 0.0, f"{nans} NaN values (unwritten or invalid)")
    exact_inf = torch.isinf(exact)
    if bool((torch.isinf(got) != exact_inf).any()) or bool((got[exact_inf] != exact[exact_inf]).any()):
        return Verdict(name, math.inf, 0.0, "infinities differ from the oracle (e.g. lse -inf rows)")
    finite = ~exact_inf
    if not bool(finite.any()):
        return Verdict(name, 0.0, 0.0)
    err = float((got[finite] - exact[finite]).abs().max())
    ref_err = float(torch.nan_to_num((ref[finite] - exact[finite]).abs(), nan=math.inf).max())
    # results within a few smallest-normals of zero are noise: GPUs flush subnormals, and the CPU
    # interpreter's bf16 conversion loses them
    floor = EPS[dtype] * float(exact[finite].abs().max()) + 4 * torch.finfo(dtype).tiny + noise
    return Verdict(name, err, factor * ref_err + floor)


@dataclass
class Report:
    case: Case
    backend: str
    verdicts: list = field(default_factory=list)
    kernel: str = ""  # the forward kernel that ran (jfa.api.recording_dispatch), e.g. "tlx-hopper" or "triton"
    backward_kernel: str = ""  # the backward kernel that ran (gradient cases only)
    ran: list = field(default_factory=list)  # every (pass, kernel, where) the call recorded
    dispatched: object = None  # what jfa.which_kernels said the call would run (a KernelChoice)

    def ran_as_dispatched(self) -> bool:
        """Whether the kernels that ran are the ones dispatch chose (no silent fallback)."""
        choice = self.dispatched
        return (self.kernel == choice.forward and
                (not self.backward_kernel or self.backward_kernel == choice.backward))

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
    """max over (query, key) pairs of |scale| * sum_d |q_d k_d| (NumPy): the magnitude of the terms summed
    into one logit (an upper bound of |logit|; taken over all pairs, also under causal)."""
    peak = 0.0
    q, k = np.abs(q), np.abs(k)
    if k.shape[1] != q.shape[1]:  # grouped heads: each key head serves its query heads
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    for b in range(len(cu_k) - 1):
        ks = k[cu_k[b]:cu_k[b + 1]]
        qs = q if broadcast_q else q[cu_q[b]:cu_q[b + 1]]
        if len(ks) and len(qs):
            logits = qs.transpose(1, 0, 2) @ ks.transpose(1, 2, 0)  # [H, lq, lk] of sum_d |q_d k_d|
            peak = max(peak, float(logits.max()) * scale)
    return peak


def _peak(exact) -> float:
    exact = torch.as_tensor(exact, dtype=torch.float64)
    finite = exact[torch.isfinite(exact)]
    return float(finite.abs().max()) if finite.numel() else 0.0


class _Floor:
    """The case-derived part of the floor (see the module docstring), ``floor(name, exact, shift)`` for
    tensor ``name`` with the oracle's ``exact`` values; ``terms`` holds each tensor's summed-term
    magnitude (the backward raises the gradients' to the oracle's magnitudes once it has them);
    ``logit_terms``: the logits' summed-term magnitude (``_max_logit_terms`` or the twin's)."""

    def __init__(self, q, k, v, dout, softmax_scale, logit_terms: float):
        mag = {name: float(t.detach().abs().max()) if t.numel() else 0.0
               for name, t in (("q", q), ("k", k), ("v", v), ("do", dout))}
        head_dim = q.shape[-1]
        scale = abs(softmax_scale) if softmax_scale is not None else head_dim ** -0.5
        self.root_d = math.sqrt(head_dim)
        self.terms = {"out": mag["v"], "dv": mag["do"], "dq": scale * mag["do"] * mag["v"] * mag["k"] * self.root_d,
                      "dk": scale * mag["do"] * mag["v"] * mag["q"] * self.root_d}
        self.logit_terms = logit_terms

    def __call__(self, name: str, exact, shift: float = 0.0) -> float:
        return EPS[torch.float32] * (self.terms.get(name, 0.0) + self.root_d * self.logit_terms * _peak(exact)) + shift


def _scale(q: torch.Tensor, softmax_scale) -> float:
    return abs(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5


class OutputJudge:
    """The rule for forward outputs of one set of inputs (any device, any implementation): the oracle and
    the PyTorch reference in q's dtype run once, at construction; each call judges one output. The
    benchmarks judge every implementation with it before timing."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q, cu_k, *, causal: bool,
                 softmax_scale=None, broadcast_q: bool = False, window=(-1, -1), kv_blocks=None):
        # kv_blocks: block-sparse attention's exact CSR (offsets, indices, block_size), host tensors
        kwargs = dict(causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q, window=window,
                      kv_blocks=kv_blocks)
        cu_q_np = None if broadcast_q else _np(cu_q).astype(np.int64)
        cu_k_np = _np(cu_k).astype(np.int64)
        self.exact, _ = oracle.attention_forward(_np(q), _np(k), _np(v), cu_q_np, cu_k_np, **kwargs)
        with torch.no_grad():
            self.ref, _ = attention_reference(q, k, v, cu_q, cu_k, **kwargs)
        self.dtype = q.dtype
        terms = _max_logit_terms(_np(q), _np(k), cu_q_np, cu_k_np, _scale(q, softmax_scale), broadcast_q)
        self.noise = _Floor(q, k, v, q[:0], softmax_scale, terms)("out", self.exact)

    def __call__(self, out: torch.Tensor) -> Verdict:
        return judge("out", out, self.ref, self.exact, self.dtype, noise=self.noise)


def judge_output(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q, cu_k, *,
                 causal: bool, softmax_scale=None, broadcast_q: bool = False) -> Verdict:
    """The rule applied to one forward output ``out`` of inputs q, k, v (``OutputJudge`` once)."""
    return OutputJudge(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale,
                       broadcast_q=broadcast_q)(out)


def run_forward_launcher(launcher, case: Case, inp) -> tuple:
    """``(out, lse)`` of a forward launcher with the TLX launchers' contract (``jagged_forward_tlx``,
    ``jagged_forward_blackwell``) called directly on ``case``'s inputs ``inp``, its outputs NaN-poisoned."""
    scale = case.softmax_scale if case.softmax_scale is not None else case.head_dim ** -0.5
    with poisoned_outputs():
        return launcher(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=case.causal, softmax_scale=scale,
                        broadcast_q=case.broadcast_q, num_seqs=len(case.lengths_k),
                        len_q_bcast=case.lengths_q[0] if case.broadcast_q else 0)


def forward_verdicts(case: Case, inp, out: torch.Tensor, lse: torch.Tensor) -> list:
    """The rule applied to a forward ``(out, lse)`` of ``case`` computed from its inputs ``inp`` by a kernel
    launched directly (not through the API): the verdicts :func:`run_case` gives its forward."""
    window = (case.window[0], 0 if case.causal else case.window[1])
    kwargs = dict(causal=case.causal, softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q, window=window)
    exact = oracle_values("numpy", inp, out, kwargs, backward=False)
    with torch.no_grad():
        o_ref, lse_ref = attention_reference(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, **kwargs)
    noise = _Floor(inp.q, inp.k, inp.v, inp.dout, case.softmax_scale, exact.logit_terms)
    return [judge("out", out, o_ref, exact.out, DTYPES[case.dtype], noise=noise("out", exact.out)),
            judge("lse", lse, lse_ref, exact.lse, torch.float32, noise=noise("lse", exact.lse))]


def _gradient_verdicts(exact: "Exact", noise: "_Floor", dtype: torch.dtype, grads, ref_grads, q, k) -> list:
    """The rule applied to a kernel's (dq, dk, dv) against the oracle's, ``ref_grads`` the reference's in
    ``dtype`` (None: no gradient reached that input, zeros)."""
    # rounding scale of each gradient's sums (a key seen by many queries sums many terms)
    summed = {name: _peak(mag_exact) for name, mag_exact in zip(("dq", "dk", "dv"), exact.magnitudes)}
    for name in summed:
        noise.terms[name] = max(noise.terms[name], summed[name])
    factor = 3.0 if dtype == torch.bfloat16 else 2.0
    verdicts = []
    for name, got, ref, grad_exact, shifted in zip(("dq", "dk", "dv"), grads, ref_grads, exact.grads, exact.shifted):
        if got is None:
            got = torch.zeros_like(q if name == "dq" else k)
        if ref is None:
            ref = torch.zeros_like(got)
        grad_exact, shifted = torch.as_tensor(grad_exact), torch.as_tensor(shifted)
        shift = float((shifted - grad_exact).abs().max()) if grad_exact.numel() else 0.0
        ds_rounding = 0.5 * EPS[dtype] * summed[name] if name in ("dq", "dk") else 0.0
        verdicts.append(judge(name, got, ref, grad_exact, dtype, factor,
                              noise=noise(name, grad_exact, shift) + ds_rounding))
    return verdicts


def backward_verdicts(case: Case, inp, out: torch.Tensor, grads) -> list:
    """The rule applied to the gradients ``grads`` = (dq, dk, dv) of ``case`` computed from its inputs ``inp``
    and the forward's ``out`` by a backward launched directly (not through the API): the verdicts
    :func:`run_case` gives its gradients."""
    window = (case.window[0], 0 if case.causal else case.window[1])
    kwargs = dict(causal=case.causal, softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q, window=window)
    exact = oracle_values("numpy", inp, out, kwargs, backward=True)
    rq, rk, rv = (t.detach().requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    o_ref, lse_ref = attention_reference(rq, rk, rv, inp.cu_q, inp.cu_k, **kwargs)
    torch.autograd.backward([o_ref, lse_ref], [inp.dout, inp.dlse.to(lse_ref.dtype)])
    noise = _Floor(inp.q, inp.k, inp.v, inp.dout, case.softmax_scale, exact.logit_terms)
    return _gradient_verdicts(exact, noise, DTYPES[case.dtype], grads, (rq.grad, rk.grad, rv.grad), inp.q, inp.k)


@dataclass
class Exact:
    """What an oracle says about one case: forward values, and for the backward the exact gradients,
    the gradients from the kernel's own output (the delta shift), and the summed-term magnitudes."""

    out: object
    lse: object
    logit_terms: float
    grads: tuple = ()
    shifted: tuple = ()
    magnitudes: tuple = ()


ORACLES = ("numpy", "twin")  # the NumPy oracle (the root of trust), its float64 torch twin on the device


def oracle_values(oracle_name: str, inp, out: torch.Tensor, kwargs: dict, backward: bool) -> Exact:
    """The oracle's values for inputs ``inp`` (a :class:`jfa.fuzz.cases.Inputs`; ``out``: the kernel's
    output, for the shifted gradients; ``kwargs``: causal, softmax_scale, broadcast_q, window): from the
    NumPy oracle on the host, or from the twin (jfa.fuzz.twin) in float64 on the inputs' device."""
    scale = _scale(inp.q, kwargs["softmax_scale"])
    if oracle_name == "twin":
        from jfa.fuzz import twin as impl

        q, k, v, cu_q, cu_k, dout, dlse, out_arg = inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, inp.dout, inp.dlse, out
    elif oracle_name == "numpy":
        impl = oracle
        q, k, v, dout, dlse, out_arg = _np(inp.q), _np(inp.k), _np(inp.v), _np(inp.dout), _np(inp.dlse), _np(out)
        cu_q = None if kwargs["broadcast_q"] else _np(inp.cu_q).astype(np.int64)
        cu_k = _np(inp.cu_k).astype(np.int64)
    else:
        raise ValueError(f"oracle: expected one of {ORACLES}, got {oracle_name!r}")
    o, lse = impl.attention_forward(q, k, v, cu_q, cu_k, **kwargs)
    terms = (impl.max_logit_terms if oracle_name == "twin" else _max_logit_terms)(
        q, k, cu_q, cu_k, scale, kwargs["broadcast_q"])
    if not backward:
        return Exact(o, lse, terms)
    bwd = dict(kwargs, dlse=dlse)
    return Exact(o, lse, terms,
                 grads=impl.attention_backward(q, k, v, o, lse, dout, cu_q, cu_k, **bwd),
                 shifted=impl.attention_backward(q, k, v, out_arg, lse, dout, cu_q, cu_k, **bwd),
                 magnitudes=impl.attention_backward(q, k, v, o, lse, dout, cu_q, cu_k, magnitudes=True, **bwd))


def twin_agreement(twin: Exact, numpy_: Exact) -> list:
    """Verdicts "twin:<tensor>": the twin's values against the NumPy oracle's, within jfa.fuzz.twin.AGREEMENT
    of each tensor's summed-term magnitude, infinities exactly where NumPy has them."""
    from jfa.fuzz.twin import AGREEMENT

    # (name, twin's, NumPy's, the magnitude of what was summed into it)
    pairs = [("out", twin.out, numpy_.out, 0.0), ("lse", twin.lse, numpy_.lse, numpy_.logit_terms)]
    pairs += [(name, t, n, _peak(m)) for name, t, n, m in
              zip(("dq", "dk", "dv"), twin.grads, numpy_.grads, numpy_.magnitudes)]
    pairs += [(f"|{name}|", t, n, 0.0) for name, t, n in zip(("dq", "dk", "dv"), twin.magnitudes, numpy_.magnitudes)]
    verdicts = [Verdict("twin:logit_terms", abs(twin.logit_terms - numpy_.logit_terms),
                        AGREEMENT * numpy_.logit_terms)]
    for name, t, n, summed in pairs:
        t = t.detach().double().cpu()
        n = torch.as_tensor(n, dtype=torch.float64)
        if t.shape != n.shape or bool((torch.isinf(t) != torch.isinf(n)).any()) or bool(torch.isnan(t).any()):
            verdicts.append(Verdict(f"twin:{name}", math.inf, 0.0, "the twin disagrees with the NumPy oracle "
                                    "(shape, infinities or NaN)"))
            continue
        finite = torch.isfinite(n)
        err = float((t[finite] - n[finite]).abs().max()) if bool(finite.any()) else 0.0
        verdicts.append(Verdict(f"twin:{name}", err, AGREEMENT * (_peak(n) + summed)))
    return verdicts


def _ran(ran: list, pass_: str) -> str:
    """The kernel that ran ``pass_`` ("" when none was recorded; "+"-joined where a pass ran several)."""
    kernels = sorted({kernel for p, kernel, _where in ran if p == pass_})
    return "+".join(kernels)


def cannot_run(case: Case, backend: str, device="cpu") -> str:
    """Why ``backend`` cannot run ``case`` at all ("" if it can): only an explicit backend="tlx" refuses
    calls (dtype, head dim, strides, GPU); "auto" falls back instead. Tests skip such cases."""
    import jfa

    if backend != "tlx":
        return ""
    inp = make_inputs(case, device)
    try:
        jfa.which_kernels(inp.q, inp.k, inp.v, backend=backend,
                          window_size=(case.window[0], 0 if case.causal else case.window[1]),
                          block_size=case.sparse[2] if case.sparse else None)
    except ValueError as exc:
        return str(exc)
    return ""


def run_case(case: Case, backend: str = "auto", device="cpu", *, backward: bool = True,
             return_outputs: bool = False, oracle_name: str = "numpy", recheck: bool = False):
    """Run ``case`` on ``backend`` with NaN-poisoned outputs and judge it against the oracle.

    ``oracle_name``: "numpy" (the root of trust, on the host) or "twin" (its float64 torch twin on the
    case's device, for large GPU examples). ``recheck``: with the twin, judge by the NumPy oracle too and
    add "twin:<tensor>" verdicts that fail where the two oracles disagree.
    """
    import jfa

    if oracle_name not in ORACLES:
        raise ValueError(f"oracle_name: expected one of {ORACLES}, got {oracle_name!r}")
    inp = make_inputs(case, device)
    dtype = DTYPES[case.dtype]
    window = (case.window[0], 0 if case.causal else case.window[1])
    kwargs = dict(causal=case.causal, softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q, window=window)
    q, k, v = (t.detach().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))  # keeps strides
    block_size = None
    if case.sparse:
        block_size = case.sparse[2]
        lists = block_lists_for(case, inp)
        kwargs["kv_blocks"] = tuple(t.cpu() for t in lists) + (block_size,)
    with poisoned_outputs(), recording_dispatch() as ran:
        if case.sparse:
            out, lse = jfa.block_sparse_attention(q, k, v, inp.cu_q, inp.cu_k, kv_blocks=lists, block_size=block_size,
                                                  causal=case.causal, softmax_scale=case.softmax_scale,
                                                  broadcast_q=case.broadcast_q, backend=backend, return_lse=True)
        else:
            out, lse = jfa.jagged_attention(q, k, v, inp.cu_q, inp.cu_k, causal=case.causal,
                                            softmax_scale=case.softmax_scale, broadcast_q=case.broadcast_q,
                                            window_size=tuple(case.window), backend=backend, return_lse=True)
        if backward:
            torch.autograd.backward([out, lse], [inp.dout, inp.dlse])

    exact = oracle_values(oracle_name, inp, out, kwargs, backward)
    rq, rk, rv = (t.detach().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))
    o_ref, lse_ref = attention_reference(rq, rk, rv, inp.cu_q, inp.cu_k, **kwargs)
    report = Report(case, backend, kernel=_ran(ran, "forward"), ran=list(ran),
                    dispatched=jfa.which_kernels(inp.q, inp.k, inp.v, backend=backend, window_size=window,
                                                 block_size=block_size))
    if backward:  # (the reference's backward is autograd's own: no kernel dispatch to record)
        report.backward_kernel = "torch" if report.kernel == "torch" else _ran(ran, "backward")
    noise = _Floor(inp.q, inp.k, inp.v, inp.dout, case.softmax_scale, exact.logit_terms)
    report.verdicts.append(judge("out", out, o_ref, exact.out, dtype, noise=noise("out", exact.out)))
    # lse is fp32 whatever t is: its floor is fp32 rounding, the ref_t term carries t's error
    report.verdicts.append(judge("lse", lse, lse_ref, exact.lse, torch.float32, noise=noise("lse", exact.lse)))
    if backward:
        torch.autograd.backward([o_ref, lse_ref], [inp.dout, inp.dlse.to(lse_ref.dtype)])
        report.verdicts += _gradient_verdicts(exact, noise, dtype, (q.grad, k.grad, v.grad),
                                              (rq.grad, rk.grad, rv.grad), q, k)
    if recheck and oracle_name == "twin":
        report.verdicts += twin_agreement(exact, oracle_values("numpy", inp, out, kwargs, backward))
    if return_outputs:
        return report, (out, lse, q.grad, k.grad, v.grad)
    return report
