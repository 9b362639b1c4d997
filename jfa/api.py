"""The public op: validation, backend dispatch and autograd (DESIGN.md section 3 is the contract).

Every check runs before any kernel (``jfa.dispatch``): a bad argument raises ``TypeError`` (wrong kind of
thing) or ``ValueError`` (right kind, broken rule) naming the argument and the rule. The kernels are
``torch.library`` custom ops with autograd formulas and fake (meta) kernels, so ``torch.compile``
traces models that call them; eager calls run the same forward and backward through a
``torch.autograd.Function`` twin instead, since the custom op's dispatch costs several times more host
time per call. The block-sparse op lives in ``jfa.block_sparse``.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from jfa.block_sparse import (SPARSE_KERNEL_NAMES, block_sparse_attention, check_block_size, select_kv_blocks,
                              sparse_backend)
from jfa.plans import call_key, gradient_key, plans
from jfa.dispatch import (KERNEL_NAMES, MX_RULES, PRECISIONS, KernelChoice, check_tensor, check_window, last_dim_contiguous, launcher, log_fallback_once,
                          mx_backend, mx_backward_tlx_or_portable, mx_tlx_kernel, record, recording_dispatch, resolve_backend, tlx_or_portable, traced, validate)

__all__ = ["jagged_attention", "block_sparse_attention", "select_kv_blocks", "which_kernels", "KernelChoice",
           "recording_dispatch", "tlx_backward_supports"]


def which_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: str = "auto",
                  window_size: tuple[int, int] = (-1, -1), block_size: Optional[int] = None,
                  precision: str = "auto") -> KernelChoice:
    """Which kernels ``jagged_attention(q, k, v, ..., backend=backend)`` runs, and why (dispatch made
    visible: a call the TLX kernel cannot take runs the portable kernel). Checks only the tensors and
    the backend; runs nothing.

    Args:
        q, k, v: the tensors a call would get (packed; jagged NestedTensors give their values).
        backend, window_size: as for ``jagged_attention``.
        block_size: the kernels of ``block_sparse_attention(..., block_size=block_size)`` instead.
        precision: as for ``jagged_attention`` ("mxfp8": the TLX MXFP8 forward on sm_90 or sm_100 or the portable one,
            the TLX MXFP8 backward on sm_90 (dQ on the portable MX pass) or the portable one, and why).

    Returns:
        A :class:`KernelChoice`: the forward and backward kernels and the reason either is not TLX.

    Raises:
        TypeError, ValueError: as the op would for these tensors, or for an explicit backend that cannot
            run here.
    """
    q, k, v = (t.values() if getattr(t, "is_nested", False) else t for t in (q, k, v))
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, MX_RULES.get(precision))
    if precision in MX_RULES:
        if block_size is not None:
            raise ValueError("precision: block-sparse attention has no MXFP8 kernels")
        if mx_backend(backend, q.device) == "tlx":
            _family, forward, mx_supports = mx_tlx_kernel(q.device)  # the Hopper or the Blackwell (sm_100) build
            window = check_window(window_size, False)
            ok, reason = mx_supports(q, k, v, window)
            if ok:
                from jfa.mx import BACKWARD_KERNEL_NAMES

                resolved, reason = mx_backward_tlx_or_portable(backend, q, k, v, window)
                return KernelChoice(forward, BACKWARD_KERNEL_NAMES[resolved], reason)
            if backend == "tlx":
                raise ValueError(f"backend: 'tlx' cannot run this MXFP8 call: {reason}")
            return KernelChoice("triton-mxfp8", "triton-mxfp8", f"the TLX MXFP8 forward cannot run it: {reason}")
        return KernelChoice("triton-mxfp8", "triton-mxfp8", "backend='triton' asked for the portable MXFP8 kernels"
                            if backend == "triton" else "no CUDA device: the portable MXFP8 kernels run under "
                            "Triton's interpreter")
    if block_size is not None:
        resolved, reason = sparse_backend(backend, q, k, v, check_block_size(block_size))
        return KernelChoice(*SPARSE_KERNEL_NAMES[resolved], reason)
    resolved = resolve_backend(backend, q.device)
    reason = {"triton": "backend='triton' asked for the portable kernel" if backend == "triton" else
              "no CUDA device: the portable kernel runs under Triton's interpreter",
              "torch": "the PyTorch reference path" if backend == "torch" else
              "no CUDA device and no Triton interpreter: the PyTorch reference path"}.get(resolved, "")
    if resolved == "tlx":
        resolved, reason = tlx_or_portable(backend, last_dim_contiguous(q), last_dim_contiguous(k),
                                            last_dim_contiguous(v), check_window(window_size, False))
    forward = KERNEL_NAMES[resolved]
    backward = "torch" if resolved == "torch" else "triton"
    if resolved in _TLX_BACKWARDS:
        ok, backward_reason = tlx_backward_supports(q, backend=resolved)
        backward = KERNEL_NAMES[resolved] if ok else "triton"
        reason = reason or backward_reason
    return KernelChoice(forward, backward, reason)




# ----------------------------------------------------------------------------------------------------
# the kernels with autograd: custom ops (what tracers see) and their eager twin
# ----------------------------------------------------------------------------------------------------
# the forward launcher of each kernel backend (the backward's is chosen when it runs: _run_backward)
_FORWARD_LAUNCHERS = {"triton": ("jfa.kernels.triton.forward", "jagged_forward"),
                      "tlx": ("jfa.kernels.tlx.hopper.forward", "jagged_forward_tlx"),
                      "tlx_blackwell": ("jfa.kernels.tlx.blackwell.forward", "jagged_forward_blackwell")}
# the launchers that keep prepared launches in a call plan (``plan=``; jfa.plans): the Hopper TLX kernels
_PLANNED = frozenset({"tlx"})
# the forward launchers that deal their items by how the sequences' lengths spread (``longest_q=``): the Hopper TLX one
_LENGTH_SCHEDULED = frozenset({"tlx"})


def _run_forward(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                 longest_q, window_left, window_right, plan=None):
    """(out, lse) from ``backend``'s forward kernel. Every forward keeps one out/lse contract, so any
    backward can follow any forward. ``longest_q``: the longest query sequence's rows (``Problem.longest_q``).
    ``plan``: the call's plan (``jfa.plans``), for the launchers that use one."""
    launch = launcher(*_FORWARD_LAUNCHERS[backend])
    extra = {"plan": plan} if plan is not None and backend in _PLANNED else {}
    if backend in _LENGTH_SCHEDULED:
        extra["longest_q"] = longest_q
    result = launch(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                    num_seqs=num_seqs, len_q_bcast=len_q_bcast, window=(window_left, window_right), **extra)
    record("forward", backend, q.device)
    return result


def _portable_backward_launcher(q, k, v, dout):
    return "triton", launcher("jfa.kernels.triton.backward", "jagged_backward"), dout


# the TLX backward after each TLX forward: (its module, its launcher); the module has its ``supports``
_TLX_BACKWARDS = {"tlx": ("jfa.kernels.tlx.hopper.backward", "jagged_backward_tlx"),
                  "tlx_blackwell": ("jfa.kernels.tlx.blackwell.backward", "jagged_backward_blackwell")}


def _tlx_backward_launcher(q, k, v, dout, backend: str = "tlx"):
    """(``backend``, its TLX backward, dout) where it takes these gradients, else the portable one (each
    distinct reason logged once). A grad of out whose layout TMA cannot address (stride 0 from ``.sum()``, a
    slice, odd strides: what training loops produce) is copied to a contiguous one first: one pass over dout,
    against the portable backward's several. Only reached after the TLX forward of ``backend`` accepted q, k,
    v (``tlx_or_portable``)."""
    ok, reason = tlx_backward_supports(q, dout, backend=backend)
    if not ok and tlx_backward_supports(q, backend=backend)[0]:
        dout = dout.contiguous()
        ok, reason = tlx_backward_supports(q, dout, backend=backend)
    if not ok:
        log_fallback_once("jfa: TLX backward not used, running the portable Triton backward: %s", reason)
        return _portable_backward_launcher(q, k, v, dout)
    return backend, launcher(*_TLX_BACKWARDS[backend]), dout


def _run_backward(backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, causal, softmax_scale, broadcast_q,
                  num_seqs, len_q_bcast, window_left, window_right, deterministic, plan=None):
    """(dq, dk, dv) after ``backend``'s forward. The kernel is chosen here, on the real tensors: under
    torch.compile this runs when the backward op runs, never while AOTAutograd traces the autograd
    formula with fake tensors (no data pointer there for the TMA layout rules to read). With a ``plan``
    the choice is made once per layout of dout (what it depends on: q, k, v are the plan's)."""
    choice_key = plan is not None and gradient_key("backward", dout)
    choice = plan.memo.get(choice_key) if plan is not None else None
    if choice is not None:
        chosen, copied = choice
        dout = dout.contiguous() if copied else dout
        launch = launcher(*_TLX_BACKWARDS[chosen]) if chosen in _TLX_BACKWARDS else _portable_backward_launcher(
            q, k, v, dout)[1]
    else:
        given = dout
        if backend in _TLX_BACKWARDS:
            chosen, launch, dout = _tlx_backward_launcher(q, k, v, dout, backend)
        else:
            chosen, launch, dout = _portable_backward_launcher(q, k, v, dout)
        if plan is not None:
            plan.memo[choice_key] = (chosen, dout is not given)
    planned = {"plan": plan} if plan is not None and chosen in _PLANNED else {}
    grads = launch(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale,
                   broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dlse=dlse,
                   deterministic=deterministic, window=(window_left, window_right), **planned)
    record("backward", chosen, q.device)
    return grads


def _forward_fake(q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, longest_q,
                  window_left, window_right, deterministic):
    rows = num_seqs * len_q_bcast if broadcast_q else q.shape[0]
    out = q.new_empty((rows, q.shape[1], q.shape[2]))
    return out, q.new_empty((rows, q.shape[1]), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, _longest_q, window_left,
     window_right, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window_left, window_right, deterministic)


_NO_GRADS = (None,) * 11  # for the forward's non-tensor inputs, cu_q .. deterministic


def _grad_inputs(ctx, dout):
    """(q, k, v, out, lse, dout, cu_q, cu_k) for a backward: a missing grad of out is zeros, and the head
    dim is made contiguous (the one layout rule every backward kernel has)."""
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dout = last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
    return q, k, v, out, lse, dout, cu_q, cu_k


def _backward_op(backend: str):
    """The custom op ``jfa::<backend>_backward``: (dq, dk, dv) like (q, k, v), by ``_run_backward``."""

    @torch.library.custom_op(f"jfa::{backend}_backward", mutates_args=())
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
           dout: torch.Tensor, dlse: Optional[torch.Tensor], cu_q: Optional[torch.Tensor], cu_k: torch.Tensor,
           causal: bool, softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int,
           window_left: int, window_right: int,
           deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _run_backward(backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, causal, softmax_scale,
                             broadcast_q, num_seqs, len_q_bcast, window_left, window_right, deterministic)

    @op.register_fake
    def _(q, k, v, out, lse, dout, dlse, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
          window_left, window_right, deterministic):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    return op


def _forward_op(backend: str, backward_op):
    """The custom op ``jfa::<backend>_forward`` (``_run_forward``), with the shared fake kernel and an
    autograd formula that calls ``backward_op``."""

    @torch.library.custom_op(f"jfa::{backend}_forward", mutates_args=())
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: Optional[torch.Tensor], cu_k: torch.Tensor,
           causal: bool, softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int,
           longest_q: int, window_left: int, window_right: int,
           deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # (deterministic: for the backward)
        return _run_forward(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                            longest_q, window_left, window_right)

    def backward(ctx, dout, dlse):
        q, k, v, out, lse, dout, cu_q, cu_k = _grad_inputs(ctx, dout)
        return tuple(backward_op(q, k, v, out, lse, dout, dlse, cu_q, cu_k, *ctx.args)) + _NO_GRADS

    op.register_fake(_forward_fake)
    op.register_autograd(backward, setup_context=_setup_context)
    return op


_triton_backward = _backward_op("triton")
_tlx_backward = _backward_op("tlx")
_triton_forward = _forward_op("triton", _triton_backward)
_tlx_forward = _forward_op("tlx", _tlx_backward)
_tlx_blackwell_backward = _backward_op("tlx_blackwell")
_tlx_blackwell_forward = _forward_op("tlx_blackwell", _tlx_blackwell_backward)
_FORWARD_OPS = {"triton": _triton_forward, "tlx": _tlx_forward, "tlx_blackwell": _tlx_blackwell_forward}


class _EagerAttention(torch.autograd.Function):
    """The custom ops' eager twin: the same forward and backward (``_run_forward``, ``_run_backward``)
    without the custom op's dispatch, whose autograd wrapper costs far more host time per call (on the
    CPU machine, launchers stubbed: 174 us a forward call against 22 us; 2026-11-30). Eager calls take
    it; tracers take the custom ops (``traced``)."""

    # (ctx in forward, not a separate setup_context: that style costs ~55 us more per call in
    # Function.apply, and torch.func transforms cannot run the Triton kernels anyway; the arguments that
    # are not q, k, v travel as one tuple: apply's own work grows with the number of arguments)
    @staticmethod
    def forward(ctx, q, k, v, call):
        """``call``: (backend, plan, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
        longest_q, window_left, window_right, deterministic)."""
        backend, plan, cu_q, cu_k, *args = call
        out, lse = _run_forward(backend, q, k, v, cu_q, cu_k, *args[:-1], plan)
        _setup_context(ctx, (q, k, v, cu_q, cu_k, *args), (out, lse))
        ctx.backend, ctx.plan = backend, plan
        # an unused output's grad stays None (no zeros made): delta - dlse is then delta itself
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, dout, cu_q, cu_k = _grad_inputs(ctx, dout)
        grads = _run_backward(ctx.backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, *ctx.args, plan=ctx.plan)
        return (*grads, None)


def _attention(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
               longest_q, window_left, window_right, deterministic, plan=None):
    """(out, lse) of ``backend``'s kernels ("triton" or "tlx"), differentiable in q, k, v. ``plan``: the
    call's plan (``jfa.plans``; eager calls only)."""
    args = (q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, longest_q, window_left,
            window_right, deterministic)
    if traced(q, k, v):
        return _FORWARD_OPS[backend](*args)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # nothing to differentiate (inference, no_grad): autograd's Function.apply would only add host time
        return _run_forward(backend, *args[:-1], plan)
    return _EagerAttention.apply(q, k, v, (backend, plan, *args[3:]))


def tlx_backward_supports(q: torch.Tensor, dout: Optional[torch.Tensor] = None, *,
                          backend: str = "tlx") -> tuple[bool, str]:
    """(True, "") when the TLX backward takes the gradients of a TLX forward on ``q`` (and ``dout``, when
    known), else (False, why). The TLX forward already accepted q, k, v. ``backend``: the forward's family,
    "tlx" (Hopper) or "tlx_blackwell"."""
    supports = launcher(_TLX_BACKWARDS[backend][0], "supports")
    ok, reason = supports(q, dout)
    return ok, "" if ok else f"TLX backward: {reason}"


# ----------------------------------------------------------------------------------------------------
# the public entry point
# ----------------------------------------------------------------------------------------------------
def _ragged_dims(t) -> list:
    """The dims of a jagged NestedTensor whose size varies per sequence."""
    return [i for i, size in enumerate(t.shape) if not isinstance(size, int)]


def _unpack_nested(q, k, v, cu_seqlens_q, cu_seqlens_k, broadcast_q: bool):
    """(q, k, v, cu_q, cu_k, wrap) for jagged NestedTensor inputs: their packed values and offsets, and
    ``wrap(out)`` turning the packed output back into a NestedTensor with q's offsets (k's for a
    broadcast Q, whose q stays dense). Plain tensors pass through with ``wrap`` the identity."""
    nested = {name: t for name, t in (("q", q), ("k", k), ("v", v)) if getattr(t, "is_nested", False)}
    if not nested:
        return q, k, v, cu_seqlens_q, cu_seqlens_k, None
    expected = {"k", "v"} if broadcast_q else {"q", "k", "v"}
    if set(nested) != expected:
        raise TypeError(f"{', '.join(sorted(expected))}: pass all of them as jagged NestedTensors or none "
                        f"(got NestedTensors for {', '.join(sorted(nested))}"
                        f"{'; with broadcast_q, q is one dense [Lq, H, D] tensor' if broadcast_q else ''})")
    for name, t in nested.items():
        if t.layout != torch.jagged:
            raise TypeError(f"{name}: a NestedTensor must have layout=torch.jagged (got {t.layout}); build it with "
                            "torch.nested.nested_tensor(..., layout=torch.jagged)")
        if t.dim() != 4 or _ragged_dims(t) != [1]:
            raise ValueError(f"{name}: a jagged NestedTensor must be [B, seq, H, D] with the sequence dim ragged, "
                             f"got shape {tuple(t.shape)} (an SDPA-style [B, H, seq, D] one: .transpose(1, 2))")
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_q, cu_seqlens_k: must be None with NestedTensor inputs (their offsets are used)")
    if nested["k"].offsets() is not nested["v"].offsets() and not torch.equal(nested["k"].offsets(),
                                                                             nested["v"].offsets()):
        raise ValueError("k, v: jagged NestedTensors with different offsets (every key needs its value)")
    cu_k = nested["k"].offsets()
    cu_q = None if broadcast_q else nested["q"].offsets()
    qv = q if broadcast_q else q.values()
    # output rows: q's offsets, or b * Lq for a broadcast Q
    out_offsets = torch.arange(cu_k.numel(), device=cu_k.device, dtype=cu_k.dtype) * q.shape[0] if broadcast_q else cu_q

    def wrap(out):
        return torch.nested.nested_tensor_from_jagged(out, out_offsets)

    return qv, k.values(), v.values(), cu_q, cu_k, wrap


def jagged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softmax_scale: Optional[float] = None,
    broadcast_q: bool = False,
    deterministic: bool = False,
    precision: str = "auto",
    backend: str = "auto",
    return_lse: bool = False,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Attention over packed variable-length sequences, differentiable in q, k and v.

    Sequence b owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``; lengths may be 0. Causal masks are bottom-right aligned:
    query i of a sequence with lengths (Lq, Lk) sees keys j <= i + Lk - Lq (FlashAttention >= 2.1). A
    row that sees no key gives out = 0, lse = -inf and zero gradients.

    Args:
        q: ``[total_q, H, D]`` (with ``broadcast_q``: ``[Lq, H, D]``, shared by every sequence), fp16,
            bf16 or fp32; strided views (e.g. slices of a fused ``[T, 3, H, D]`` projection) are fine. Or a
            jagged NestedTensor ``[B, seq, H, D]`` (``layout=torch.jagged``), with k and v too: the offsets
            are taken from them and the output is a NestedTensor.
        k, v: ``[total_k, H_kv, D]``, q's dtype and device; ``H_kv`` divides q's heads H (grouped-query
            attention: query head h reads key/value head ``h // (H / H_kv)``; ``H_kv = 1`` is MQA), and dk, dv
            sum over each key/value head's query heads.
        cu_seqlens_q: ``[B + 1]`` int32/int64 offsets of q (first 0, non-decreasing, last = total_q);
            None with ``broadcast_q`` or NestedTensor inputs.
        cu_seqlens_k: ``[B + 1]`` offsets of k and v; None with NestedTensor inputs.
        max_seqlen_q, max_seqlen_k: optional hints of the longest sequence (an error if smaller than it);
            with both (``max_seqlen_k`` alone for a broadcast Q) and ``JFA_TRUST_OFFSETS=1``
            (``jfa.knobs.trust_offsets``) the offsets are not read back to the host: CUDA-graph capture
            and ``torch.compile(fullgraph=True)``.
        causal: bottom-right aligned causal mask.
        window_size: ``(left, right)`` sliding window (FlashAttention's convention; -1: unbounded): query i
            sees keys ``i + Lk - Lq - left <= j <= i + Lk - Lq + right``; with ``causal`` right must be 0 or -1.
        softmax_scale: the scale of q.k (default ``1 / sqrt(D)``).
        broadcast_q: q is one dense sequence shared by all B sequences of k/v; out is ``[B * Lq, H, D]``
            (row ``b * Lq + i``) and dq sums over b.
        deterministic: bitwise reproducible gradients (the TLX backward then takes dQ from the portable
            pass instead of its fused reduce-adds).
        precision: "auto" (compute in the input dtype, fp32 accumulation), or "mxfp8" / "mxfp8-rceil":
            OCP MXFP8 (E4M3 elements, E8M0 scales per 32 elements; FLOOR or RCEIL scale rule) with the
            semantics of docs/mxfp8.md section 2 (q, k, v, P and the backward's operands quantized along
            their products' reduction axes; a straight-through backward). q, k, v may then be
            ``jfa.mx.MXTensor``s quantized beforehand (q, k ``axis="dim"``, v ``axis="tokens"`` by
            cu_seqlens_k; forward only). The MXFP8 forward and backward run the TLX kernels on sm_90 (no
            sliding window; the backward's dQ pass is portable), the portable Triton kernels elsewhere.
        backend: "auto" (the TLX Hopper kernels where they apply on an sm_90 GPU, the portable Triton
            kernel elsewhere, Triton's interpreter for CPU tensors), "tlx", "triton" or "torch" (the
            reference). ``jfa.which_kernels`` says which kernel a call gets and why.
        return_lse: also return the log-sum-exp of each row's scores.

    Returns:
        ``out`` ``[total_q, H, D]`` (``[B * Lq, H, D]`` with ``broadcast_q``) in q's dtype, or
        ``(out, lse)`` with ``return_lse``: lse ``[total_q, H]`` float32, natural log (FA2/FA3's varlen
        ``softmax_lse`` is ``[H, total_q]``: ``lse.t()``), -inf for rows that see no key.

    Raises:
        TypeError: an argument of the wrong kind (not a tensor, a dtype outside fp16/bf16/fp32, offsets
            that are not int32/int64, a non-bool flag).
        ValueError: a broken rule (shapes, devices, offset values, a hint below the longest sequence, a
            backend that cannot run here); nothing is computed then.
    """
    key = call_key(q, k, v, cu_seqlens_q, cu_seqlens_k, (max_seqlen_q, max_seqlen_k, causal, window_size,
                   softmax_scale, broadcast_q, deterministic, backend, return_lse)) if precision == "auto" else None
    offsets = (cu_seqlens_q, cu_seqlens_k)
    plan = plans.get(key, offsets)
    if plan is not None:  # this call's structure passed every check before (jfa.plans)
        out, lse = _attention(plan.problem[0], q, k, v, cu_seqlens_q, cu_seqlens_k, causal, *plan.problem[1:],
                              deterministic, plan)
        return (out, lse) if return_lse else out
    q, k, v, cu_seqlens_q, cu_seqlens_k, wrap = _unpack_nested(q, k, v, cu_seqlens_q, cu_seqlens_k, broadcast_q)
    problem = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                       softmax_scale=softmax_scale, broadcast_q=broadcast_q, deterministic=deterministic,
                       precision=precision, backend=backend, return_lse=return_lse, window_size=window_size)
    if precision in MX_RULES:
        from jfa.mx import mx_attention

        out, lse = mx_attention(*(t if type(t).__name__ == "MXTensor" else p for t, p in
                                  ((q, problem.q), (k, problem.k), (v, problem.v))),
                                cu_seqlens_q, cu_seqlens_k, rule=MX_RULES[precision], causal=causal,
                                softmax_scale=problem.softmax_scale, broadcast_q=broadcast_q,
                                num_seqs=problem.num_seqs, len_q_bcast=problem.len_q_bcast, window=problem.window,
                                backend=backend if problem.backend == "tlx" else "triton")
    elif problem.backend == "torch":
        from jfa.reference import attention_reference

        out, lse = attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                       softmax_scale=problem.softmax_scale, broadcast_q=broadcast_q,
                                       window=problem.window)
        lse = lse.to(torch.float32)
        record("forward", "torch", q.device)
    else:
        if problem.q is q and problem.k is k and problem.v is v:  # (a copied input: its key names the original)
            plan = plans.make(key, offsets, (problem.backend, problem.softmax_scale, broadcast_q, problem.num_seqs,
                                             problem.len_q_bcast, problem.longest_q, *problem.window))
        out, lse = _attention(problem.backend, problem.q, problem.k, problem.v, cu_seqlens_q, cu_seqlens_k, causal,
                              problem.softmax_scale, broadcast_q, problem.num_seqs, problem.len_q_bcast,
                              problem.longest_q, *problem.window, deterministic, plan)
    if wrap is not None:
        out = wrap(out)
    return (out, lse) if return_lse else out


