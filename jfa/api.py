"""The public op: validation, backend dispatch and autograd (DESIGN.md section 3 is the contract).

Every check runs before any kernel: a bad argument raises ``TypeError`` (wrong kind of thing) or
``ValueError`` (right kind, broken rule) naming the argument and the rule. The kernels are
``torch.library`` custom ops with autograd formulas and fake (meta) kernels, so ``torch.compile``
traces models that call them; eager calls run the same forward and backward through a
``torch.autograd.Function`` twin instead, since the custom op's dispatch costs several times more host
time per call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
import threading
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch

from jfa import knobs
from jfa.kernels.cache import IdentityCache
from jfa.kernels.triton.configs import MAX_HEAD_DIM

log = logging.getLogger("jfa")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = ("auto", "tlx", "triton", "torch")
PRECISIONS = ("auto",)


# ----------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """What validation learned about a call; everything a launcher needs besides the offsets."""

    num_seqs: int
    len_q_bcast: int  # Lq of a broadcast Q, else 0
    softmax_scale: float
    window: tuple  # (left, right) as the call gave it, -1 unbounded (causal: right 0)
    backend: str  # resolved: "tlx", "triton" or "torch"
    q: torch.Tensor  # q, k, v as the kernels take them: head dim contiguous (copied only if it was not)
    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class KernelChoice:
    """Which kernels a call runs (``jfa.which_kernels``): ``forward`` and ``backward`` are each
    "tlx-hopper", "triton" or "torch"; ``reason`` says why either is not the TLX kernel ("" when both
    are). The TLX backward follows only the TLX forward: its dK/dV kernel, with dQ reduced inside it
    (unless ``deterministic=True``, which takes the portable dQ pass)."""

    forward: str
    backward: str
    reason: str


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dim() != 3:
        raise ValueError(f"{name}: expected shape [tokens, heads, head_dim] (3-D), got {tuple(t.shape)}")


def _check_offsets_meta(name: str, cu, device: torch.device) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of offsets, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: offsets must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name}: expected a 1-D tensor of B+1 >= 1 offsets, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name}: must be on the same device as q ({device}), got {cu.device}")


def _check_hint(name: str, hint) -> None:
    if hint is None:
        return
    if isinstance(hint, bool) or not isinstance(hint, int):
        raise TypeError(f"{name}: expected an int or None, got {type(hint).__name__}")
    if hint < 0:
        raise ValueError(f"{name}: must be >= 0, got {hint}")


_validated_offsets = IdentityCache()


def _check_offsets_values(name: str, cu: torch.Tensor, total: int, hint: Optional[int]) -> int:
    """First 0, non-decreasing, last = total, max length <= hint; returns the longest length. One device
    read per offsets tensor: the layers of a model (and later calls) passing the same unmodified tensor
    reuse the result."""
    longest = _validated_offsets.get_or_build((cu,), (name, total), lambda: _read_offsets(name, cu, total))
    if hint is not None and hint < longest:
        hint_name = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
        raise ValueError(f"{hint_name}: hint {hint} is smaller than the longest sequence ({longest})")
    return longest


def _read_offsets(name: str, cu: torch.Tensor, total: int) -> int:
    """Validate the offset values (a device read); returns the longest sequence length."""
    values = cu.to(device="cpu", dtype=torch.int64)
    if int(values[0]) != 0:
        raise ValueError(f"{name}: first offset must be 0, got {int(values[0])}")
    lengths = values[1:] - values[:-1]
    if lengths.numel() and int(lengths.min()) < 0:
        b = int(torch.nonzero(lengths < 0)[0])
        raise ValueError(f"{name}: offsets must be non-decreasing, but {name}[{b + 1}] < {name}[{b}]")
    if int(values[-1]) != total:
        raise ValueError(f"{name}: last offset must equal the token count {total}, got {int(values[-1])}")
    return int(lengths.max()) if lengths.numel() else 0


_GRAPH_BREAK_REASON = ("jfa.jagged_attention checks the offset values with a device read (a graph break); for "
                       "fullgraph=True pass both max_seqlen_q and max_seqlen_k (max_seqlen_k with broadcast_q) and "
                       "set JFA_TRUST_OFFSETS=1 (jfa.knobs.trust_offsets), which skips that read")


def _untraced(fn):
    """``fn``, run eagerly when torch.compile traces the caller (a graph break, whose reason says how to
    avoid it): host logic around a device read, whose errors must stay the ones written (traced, Dynamo
    turns the offsets' ValueError into a TypeError from formatting its message). Plain ``fn`` otherwise:
    ``torch.compiler.disable`` imports Dynamo, which imports triton, and importing jfa must not (Triton's
    CPU interpreter is chosen then)."""
    if not torch.compiler.is_compiling():
        return fn
    torch._dynamo.graph_break(msg=_GRAPH_BREAK_REASON)  # with fullgraph=True, the error names the fix
    return torch.compiler.disable(fn)


def _resolve_backend(backend: str, device: torch.device) -> str:
    """The backend family a call may use before looking at shapes: "tlx", "triton" or "torch" ("tlx" for
    ``auto`` on CUDA means: the TLX kernel if it supports the call, else the portable one)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
    from jfa.kernels.triton import interpreter_active

    if backend == "tlx" and device.type != "cuda" and not _tlx_target_registered(device):
        raise ValueError(f"backend: 'tlx' needs CUDA tensors on a Hopper (sm_90) GPU, got device {device} "
                         "(CPU tensors run the TLX kernels only on the TLX simulator: jfa.sim.simulated()); "
                         "use backend='auto' to run the portable kernel instead")
    if backend == "triton" and device.type == "cpu" and not interpreter_active():
        raise ValueError(
            "backend: 'triton' on CPU tensors needs Triton's interpreter, which is process-wide: set "
            "TRITON_INTERPRET=1 in the environment before triton is imported (jfa's CLI and tests do)")
    if backend == "triton" and device.type not in ("cpu", "cuda"):
        raise ValueError(f"backend: 'triton' runs on CUDA or (interpreted) CPU tensors, got device {device}")
    if backend == "auto":
        if device.type == "cuda":
            return "tlx"
        if device.type == "cpu" and interpreter_active():
            return "triton"
        _log_fallback_once("jfa: running the PyTorch reference (%s)", f"no CUDA device and no Triton interpreter for "
                           f"{device} tensors; set TRITON_INTERPRET=1 before triton is imported to run the portable "
                           "kernel on CPU")
        return "torch"
    return backend


def _tlx_target_registered(device: torch.device) -> bool:
    """Whether something (the TLX simulator) registered a TLX execution target for ``device``."""
    from jfa.kernels.tlx.common.target import target_for

    return target_for(device) is not None


_fallbacks_logged: set = set()


def _log_fallback_once(message: str, reason: str) -> None:
    """Log (INFO, logger "jfa") why a TLX kernel was not used, once per distinct reason."""
    if reason not in _fallbacks_logged:
        _fallbacks_logged.add(reason)
        log.info(message, reason)


def _tlx_or_portable(backend: str, q, k, v, window=(-1, -1)) -> tuple[str, str]:
    """("tlx" or "triton", why not TLX). An explicit backend='tlx' the kernel cannot run raises; 'auto'
    falls back to the portable kernel and logs the reason once per distinct reason (logger "jfa")."""
    from jfa.kernels.tlx.hopper.forward import supports

    ok, reason = supports(q, q.shape[-1], q.dtype, k=k, v=v, window=window)
    if ok:
        return "tlx", ""
    if backend == "tlx":
        raise ValueError(f"backend: 'tlx' cannot run this call: {reason}; use backend='auto' to fall back to "
                         "the portable kernel")
    _log_fallback_once("jfa: TLX forward not used, running the portable Triton kernel: %s", reason)
    return "triton", reason


def _check_window(window_size, causal: bool) -> tuple:
    """The window as (left, right) ints >= -1 (causal: right 0); TypeError/ValueError naming the rule."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or any(
            isinstance(x, bool) or not isinstance(x, int) for x in window_size):
        raise TypeError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each side must be >= 0, or -1 for unbounded, got {tuple(window_size)}")
    if causal and right not in (-1, 0):
        raise ValueError(f"window_size: with causal=True the right side is 0 (no key past the diagonal); got "
                         f"right={right}: pass (left, 0) or (left, -1), or causal=False for a two-sided window")
    return left, 0 if causal else right


def validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, softmax_scale,
             broadcast_q, deterministic, precision, backend, return_lse, window_size=(-1, -1)) -> Problem:
    """Check every argument against the contract; returns what the launchers need. Runs no kernel."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    for name, flag in (("causal", causal), ("broadcast_q", broadcast_q), ("deterministic", deterministic),
                       ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v: must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k, v: shapes must match, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q, k: q's heads must be a multiple of k's (grouped-query attention: H_q % H_kv == 0), "
                         f"got {q.shape[1]} and {k.shape[1]}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q, k: head dims must match, got {q.shape[2]} and {k.shape[2]}")
    if q.shape[1] < 1:
        raise ValueError("q: needs at least one head")
    head_dim = q.shape[2]
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim must be between 1 and {MAX_HEAD_DIM}, got {head_dim}")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale: must be finite, got {softmax_scale}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    window = _check_window(window_size, causal)
    _check_hint("max_seqlen_q", max_seqlen_q)
    _check_hint("max_seqlen_k", max_seqlen_k)

    if cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k: required (the [B+1] key offsets), unless q, k, v are jagged NestedTensors")
    _check_offsets_meta("cu_seqlens_k", cu_seqlens_k, q.device)
    num_seqs = cu_seqlens_k.numel() - 1
    if broadcast_q:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q: must be None when broadcast_q=True (q is one dense sequence)")
        if max_seqlen_q is not None and max_seqlen_q < q.shape[0]:
            raise ValueError(f"max_seqlen_q: hint {max_seqlen_q} is smaller than the broadcast Q length {q.shape[0]}")
    else:
        if cu_seqlens_q is None:
            raise ValueError("cu_seqlens_q: required unless broadcast_q=True")
        _check_offsets_meta("cu_seqlens_q", cu_seqlens_q, q.device)
        if cu_seqlens_q.numel() != cu_seqlens_k.numel():
            raise ValueError(f"cu_seqlens_q, cu_seqlens_k: must have the same length B+1, got "
                             f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    resolved = _resolve_backend(backend, q.device)

    hints_given = max_seqlen_k is not None and (broadcast_q or max_seqlen_q is not None)
    if not (hints_given and knobs.trust_offsets):
        check = _untraced(_check_offsets_values)
        check("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)
        if not broadcast_q:
            check("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q)
    if resolved != "torch":  # every check passed: the one copy a kernel may need, made once
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    if resolved == "tlx":
        resolved, _ = _tlx_or_portable(backend, q, k, v, window)
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    return Problem(num_seqs, q.shape[0] if broadcast_q else 0, scale, window, resolved, q, k, v)


def which_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, backend: str = "auto",
                  window_size: tuple[int, int] = (-1, -1), block_size: Optional[int] = None) -> KernelChoice:
    """Which kernels ``jagged_attention(q, k, v, ..., backend=backend)`` runs, and why (dispatch made
    visible: a call the TLX kernel cannot take runs the portable kernel). Checks only the tensors and
    the backend; runs nothing.

    Args:
        q, k, v: the tensors a call would get (packed; jagged NestedTensors give their values).
        backend, window_size: as for ``jagged_attention``.
        block_size: the kernels of ``block_sparse_attention(..., block_size=block_size)`` instead.

    Returns:
        A :class:`KernelChoice`: the forward and backward kernels and the reason either is not TLX.

    Raises:
        TypeError, ValueError: as the op would for these tensors, or for an explicit backend that cannot
            run here.
    """
    q, k, v = (t.values() if getattr(t, "is_nested", False) else t for t in (q, k, v))
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if block_size is not None:
        resolved, reason = _sparse_backend(backend, q, k, v, _check_block_size(block_size))
        return KernelChoice(*SPARSE_KERNEL_NAMES[resolved], reason)
    resolved = _resolve_backend(backend, q.device)
    reason = {"triton": "backend='triton' asked for the portable kernel" if backend == "triton" else
              "no CUDA device: the portable kernel runs under Triton's interpreter",
              "torch": "the PyTorch reference path" if backend == "torch" else
              "no CUDA device and no Triton interpreter: the PyTorch reference path"}.get(resolved, "")
    if resolved == "tlx":
        resolved, reason = _tlx_or_portable(backend, _last_dim_contiguous(q), _last_dim_contiguous(k),
                                            _last_dim_contiguous(v), _check_window(window_size, False))
    forward = {"tlx": "tlx-hopper"}.get(resolved, resolved)
    backward = "torch" if resolved == "torch" else "triton"
    if resolved == "tlx":
        ok, backward_reason = tlx_backward_supports(q)
        backward = "tlx-hopper" if ok else "triton"
        reason = reason or backward_reason
    return KernelChoice(forward, backward, reason)


# ----------------------------------------------------------------------------------------------------
# the kernels with autograd: custom ops (what tracers see) and their eager twin
# ----------------------------------------------------------------------------------------------------
def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its head dim contiguous (token and head strides are free; every kernel wants the head dim
    itself contiguous). Gradients arrive in any layout: expanded (``out.sum().backward()`` gives stride
    0 everywhere), transposed, sliced. An empty tensor counts as contiguous whatever its strides, so
    ``contiguous()`` keeps a stride-0 head dim there: a fresh tensor then (it holds no value to copy)."""
    if t.stride(-1) == 1:
        return t
    if t.numel() == 0:
        return t.new_empty(t.shape)
    return t.contiguous()


def _launcher(module: str, name: str):
    """``module.name``, looked up at each call (tests and measurements replace launchers)."""
    return getattr(importlib.import_module(module), name)


# the forward launcher of each kernel backend (the backward's is chosen when it runs: _run_backward)
_FORWARD_LAUNCHERS = {"triton": ("jfa.kernels.triton.forward", "jagged_forward"),
                      "tlx": ("jfa.kernels.tlx.hopper.forward", "jagged_forward_tlx")}
KERNEL_NAMES = {"triton": "triton", "tlx": "tlx-hopper", "torch": "torch"}  # as KernelChoice names them

_recorders: tuple = ()  # the lists of the open recording_dispatch blocks; replaced, never mutated
_recorders_lock = threading.Lock()


@contextlib.contextmanager
def recording_dispatch() -> Iterator[list]:
    """Record which kernels run inside the block: yields a list that fills, in launch order, with
    ``(pass, kernel, where)`` triples: pass "forward" or "backward", kernel "tlx-hopper", "triton" or
    "torch" (as :class:`KernelChoice` names them), where the device or execution target ("cuda",
    "interpreter", "tlx-sim", ...). ``which_kernels`` says what a call would choose; this says what ran,
    the proof a test needs that the kernel it names did. Every thread's calls are recorded (autograd runs
    a CUDA backward on a thread of its own)."""
    global _recorders
    log: list = []
    with _recorders_lock:
        _recorders = _recorders + (log,)
    try:
        yield log
    finally:
        with _recorders_lock:
            _recorders = tuple(other for other in _recorders if other is not log)


def _record(pass_: str, backend: str, device: torch.device, kernel: Optional[str] = None) -> None:
    """Append (pass, kernel, where) to every open recording_dispatch list; ``kernel`` defaults to the
    backend's name in KERNEL_NAMES."""
    if not _recorders:
        return
    if backend == "tlx":
        from jfa.kernels.tlx.common.target import target_for

        where = getattr(target_for(device), "name", device.type)
    else:
        where = "interpreter" if backend == "triton" and device.type == "cpu" else device.type
    for log in _recorders:
        log.append((pass_, kernel or KERNEL_NAMES[backend], where))


def _run_forward(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                 window_left, window_right):
    """(out, lse) from ``backend``'s forward kernel. Every forward keeps one out/lse contract, so any
    backward can follow any forward."""
    launch = _launcher(*_FORWARD_LAUNCHERS[backend])
    result = launch(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                    num_seqs=num_seqs, len_q_bcast=len_q_bcast, window=(window_left, window_right))
    _record("forward", backend, q.device)
    return result


def _portable_backward_launcher(q, k, v, dout):
    return "triton", _launcher("jfa.kernels.triton.backward", "jagged_backward"), dout


def _tlx_backward_launcher(q, k, v, dout):
    """("tlx", the TLX backward, dout) where it takes these gradients, else the portable one (each distinct
    reason logged once). A grad of out whose layout TMA cannot address (stride 0 from ``.sum()``, a slice,
    odd strides: what training loops produce) is copied to a contiguous one first: one pass over dout,
    against the portable backward's several. Only reached after the TLX forward accepted q, k, v
    (``_tlx_or_portable``)."""
    ok, reason = tlx_backward_supports(q, dout)
    if not ok and tlx_backward_supports(q)[0]:
        dout = dout.contiguous()
        ok, reason = tlx_backward_supports(q, dout)
    if not ok:
        _log_fallback_once("jfa: TLX backward not used, running the portable Triton backward: %s", reason)
        return _portable_backward_launcher(q, k, v, dout)
    return "tlx", _launcher("jfa.kernels.tlx.hopper.backward", "jagged_backward_tlx"), dout


def _run_backward(backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, causal, softmax_scale, broadcast_q,
                  num_seqs, len_q_bcast, window_left, window_right, deterministic):
    """(dq, dk, dv) after ``backend``'s forward. The kernel is chosen here, on the real tensors: under
    torch.compile this runs when the backward op runs, never while AOTAutograd traces the autograd
    formula with fake tensors (no data pointer there for the TMA layout rules to read)."""
    choose = _tlx_backward_launcher if backend == "tlx" else _portable_backward_launcher
    chosen, launch, dout = choose(q, k, v, dout)
    grads = launch(q, k, v, out, lse, dout, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale,
                   broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dlse=dlse,
                   deterministic=deterministic, window=(window_left, window_right))
    _record("backward", chosen, q.device)
    return grads


def _forward_fake(q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window_left,
                  window_right, deterministic):
    rows = num_seqs * len_q_bcast if broadcast_q else q.shape[0]
    out = q.new_empty((rows, q.shape[1], q.shape[2]))
    return out, q.new_empty((rows, q.shape[1]), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window_left, window_right,
     deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window_left, window_right, deterministic)


_NO_GRADS = (None,) * 10  # for the forward's non-tensor inputs, cu_q .. deterministic


def _grad_inputs(ctx, dout):
    """(q, k, v, out, lse, dout, cu_q, cu_k) for a backward: a missing grad of out is zeros, and the head
    dim is made contiguous (the one layout rule every backward kernel has)."""
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dout = _last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
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
           window_left: int, window_right: int, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # (deterministic: for the backward)
        return _run_forward(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                            window_left, window_right)

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
_FORWARD_OPS = {"triton": _triton_forward, "tlx": _tlx_forward}


class _EagerAttention(torch.autograd.Function):
    """The custom ops' eager twin: the same forward and backward (``_run_forward``, ``_run_backward``)
    without the custom op's dispatch, whose autograd wrapper costs far more host time per call (on the
    CPU machine, launchers stubbed: 174 us a forward call against 22 us; 2026-11-30). Eager calls take
    it; tracers take the custom ops (``_traced``)."""

    # (ctx in forward, not a separate setup_context: that style costs ~55 us more per call in
    # Function.apply, and torch.func transforms cannot run the Triton kernels anyway)
    @staticmethod
    def forward(ctx, backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                window_left, window_right, deterministic):
        out, lse = _run_forward(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs,
                                len_q_bcast, window_left, window_right)
        _setup_context(ctx, (q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                             window_left, window_right, deterministic), (out, lse))
        ctx.backend = backend
        # an unused output's grad stays None (no zeros made): delta - dlse is then delta itself
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, dout, cu_q, cu_k = _grad_inputs(ctx, dout)
        grads = _run_backward(ctx.backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, *ctx.args)
        return (None, *grads) + _NO_GRADS


def _traced(*tensors) -> bool:
    """Whether a tracer sees this call: torch.compile or torch.export, or tensor subclasses (fake and
    functional tensors of other tracers). The custom ops then, whose schemas and fake kernels they use."""
    return torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in tensors)


def _attention(backend, q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
               window_left, window_right, deterministic):
    """(out, lse) of ``backend``'s kernels ("triton" or "tlx"), differentiable in q, k, v."""
    args = (q, k, v, cu_q, cu_k, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window_left,
            window_right, deterministic)
    if _traced(q, k, v):
        return _FORWARD_OPS[backend](*args)
    return _EagerAttention.apply(backend, *args)


def tlx_backward_supports(q: torch.Tensor, dout: Optional[torch.Tensor] = None) -> tuple[bool, str]:
    """(True, "") when the TLX backward takes the gradients of a TLX forward on ``q`` (and ``dout``, when
    known), else (False, why). The TLX forward already accepted q, k, v."""
    from jfa.kernels.tlx.hopper.backward import supports

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
        precision: "auto" (compute in the input dtype, fp32 accumulation).
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
    q, k, v, cu_seqlens_q, cu_seqlens_k, wrap = _unpack_nested(q, k, v, cu_seqlens_q, cu_seqlens_k, broadcast_q)
    problem = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                       softmax_scale=softmax_scale, broadcast_q=broadcast_q, deterministic=deterministic,
                       precision=precision, backend=backend, return_lse=return_lse, window_size=window_size)
    if problem.backend == "torch":
        from jfa.reference import attention_reference

        out, lse = attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                       softmax_scale=problem.softmax_scale, broadcast_q=broadcast_q,
                                       window=problem.window)
        lse = lse.to(torch.float32)
        _record("forward", "torch", q.device)
    else:
        out, lse = _attention(problem.backend, problem.q, problem.k, problem.v, cu_seqlens_q, cu_seqlens_k, causal,
                              problem.softmax_scale, broadcast_q, problem.num_seqs, problem.len_q_bcast,
                              *problem.window, deterministic)
    if wrap is not None:
        out = wrap(out)
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------------------------------
# block-sparse attention (DESIGN.md section 10)
# ----------------------------------------------------------------------------------------------------
SPARSE_BLOCK_SIZES = (16, 32, 64, 128, 256)
# per kernel backend: the forward and backward launchers, as (module, name); the TLX forward's backward is
# the portable one
_SPARSE_LAUNCHERS = {
    "triton": (("jfa.kernels.triton.block_sparse", "block_sparse_forward"),
               ("jfa.kernels.triton.block_sparse", "block_sparse_backward")),
    "tlx": (("jfa.kernels.tlx.hopper.forward", "block_sparse_forward_tlx"),
            ("jfa.kernels.tlx.hopper.backward", "block_sparse_backward_tlx")),
}
# what recording_dispatch and which_kernels call each backend's (forward, backward) block-sparse kernels
SPARSE_KERNEL_NAMES = {"triton": ("triton-block-sparse", "triton-block-sparse"),
                       "tlx": ("tlx-hopper-block-sparse", "tlx-hopper-block-sparse"), "torch": ("torch", "torch")}


def _check_block_size(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size: expected an int, got {type(block_size).__name__}")
    if block_size not in SPARSE_BLOCK_SIZES:
        raise ValueError(f"block_size: must be one of {SPARSE_BLOCK_SIZES} (a power of two the kernels' tiles "
                         f"divide), got {block_size}")
    return block_size


def _check_selection_rule(keep_ratio, topk) -> None:
    if (keep_ratio is None) == (topk is None):
        raise ValueError("keep_ratio, topk: give exactly one selection rule (or kv_blocks, your own lists)")
    if topk is not None:
        if isinstance(topk, bool) or not isinstance(topk, int):
            raise TypeError(f"topk: expected an int, got {type(topk).__name__}")
        if topk < 1:
            raise ValueError(f"topk: must be >= 1 (key blocks kept per query block), got {topk}")
    else:
        if isinstance(keep_ratio, bool) or not isinstance(keep_ratio, (int, float)):
            raise TypeError(f"keep_ratio: expected a float, got {type(keep_ratio).__name__}")
        if not 0.0 < keep_ratio <= 1.0:
            raise ValueError(f"keep_ratio: must be in (0, 1] (the share of visible key blocks kept), got {keep_ratio}")


def _lengths(cu: torch.Tensor) -> list:
    values = cu.to(device="cpu", dtype=torch.int64)
    return (values[1:] - values[:-1]).tolist()


def _check_csr(offsets, indices, lengths_q: list, lengths_k: list, num_heads: int, block_size: int,
               causal: bool) -> int:
    """A caller's CSR lists against the batch (a device read): ``num_heads * NQB + 1`` offsets (NQB: query
    blocks of the batch), first 0, non-decreasing, last = the index count; in each row, key block indices
    strictly ascending (sorted, no duplicates) and inside the row's sequence; under ``causal`` none wholly
    in the causal future of its query block (every row of it would skip the block). Returns NQB."""
    for name, t in (("kv_blocks offsets", offsets), ("kv_blocks indices", indices)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: must be int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(t.shape)}")
    blocks_q = [-(-n // block_size) for n in lengths_q]
    blocks_k = [-(-n // block_size) for n in lengths_k]
    nqb = sum(blocks_q)
    if offsets.numel() != num_heads * nqb + 1:
        raise ValueError(f"kv_blocks offsets: expected H * query blocks + 1 = {num_heads} * {nqb} + 1 = "
                         f"{num_heads * nqb + 1} entries, got {offsets.numel()}")
    o = offsets.to(device="cpu", dtype=torch.int64)
    idx = indices.to(device="cpu", dtype=torch.int64)
    if int(o[0]) != 0:
        raise ValueError(f"kv_blocks offsets: first offset must be 0, got {int(o[0])}")
    counts = o[1:] - o[:-1]
    if counts.numel() and int(counts.min()) < 0:
        r = int(torch.nonzero(counts < 0)[0])
        raise ValueError(f"kv_blocks offsets: must be non-decreasing, but offsets[{r + 1}] < offsets[{r}]")
    if int(o[-1]) != idx.numel():
        raise ValueError(f"kv_blocks offsets: last offset must equal the number of indices ({idx.numel()}), "
                         f"got {int(o[-1])}")
    if idx.numel() == 0:
        return nqb
    row = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    seq_of_block = torch.repeat_interleave(torch.arange(len(blocks_q)), torch.tensor(blocks_q, dtype=torch.int64))
    block = row % nqb
    seq = seq_of_block[block]
    limit = torch.tensor(blocks_k, dtype=torch.int64)[seq]
    bad = (idx < 0) | (idx >= limit)
    if bool(bad.any()):
        e = int(torch.nonzero(bad)[0])
        raise ValueError(f"kv_blocks indices: entry {e} (row {int(row[e])}) is key block {int(idx[e])}, outside its "
                         f"sequence's {int(limit[e])} key blocks of {block_size} keys")
    same_row = row[1:] == row[:-1]
    unsorted = same_row & (idx[1:] <= idx[:-1])
    if bool(unsorted.any()):
        e = int(torch.nonzero(unsorted)[0]) + 1
        raise ValueError(f"kv_blocks indices: each row's key blocks must be strictly ascending (sorted, no "
                         f"duplicates); row {int(row[e])} has {int(idx[e - 1])} then {int(idx[e])}")
    if causal:
        first_block = torch.cumsum(torch.tensor([0] + blocks_q, dtype=torch.int64), 0)[seq]
        len_q = torch.tensor(lengths_q, dtype=torch.int64)[seq]
        last_row = torch.minimum((block - first_block + 1) * block_size, len_q) - 1
        last_key = last_row + torch.tensor(lengths_k, dtype=torch.int64)[seq] - len_q
        future = idx * block_size > last_key
        if bool(future.any()):
            e = int(torch.nonzero(future)[0])
            raise ValueError(f"kv_blocks indices: under causal=True no listed key block may lie wholly in its query "
                             f"block's causal future; entry {e} (row {int(row[e])}) lists key block {int(idx[e])}, "
                             f"whose first key {int(idx[e]) * block_size} is past the block's last visible key "
                             f"{int(last_key[e])}")
    return nqb


@dataclass(frozen=True)
class _SparseCall:
    """What validation of a block-sparse call learned (besides the dense Problem)."""

    lists: object  # jfa.kernels.block_lists.BlockLists on q's device
    block_size: int
    rows: int  # output rows


def _block_lists(q, k, cu_q, cu_k, *, problem: Problem, causal: bool, broadcast_q: bool, block_size: int,
                 keep_ratio, topk, kv_blocks, longest_k: int):
    """The lists a call runs with: the caller's (``BlockLists`` as ``select_kv_blocks`` made them, or an exact
    CSR pair, checked), or the selection kernel's."""
    from jfa.kernels import block_lists as bl
    from jfa.kernels.schedule import num_tile_slots

    rows = problem.num_seqs * problem.len_q_bcast if broadcast_q else q.shape[0]
    slots = num_tile_slots(rows, problem.num_seqs, block_size)
    heads = q.shape[1]
    if kv_blocks is None:
        return _select(q, k, cu_q, cu_k, block_size=block_size, keep_ratio=keep_ratio, topk=topk, causal=causal,
                       broadcast_q=broadcast_q, problem=problem, longest_k=longest_k)
    if keep_ratio is not None or topk is not None:
        raise ValueError("kv_blocks, keep_ratio, topk: give either your own lists (kv_blocks) or a selection rule")
    if isinstance(kv_blocks, bl.BlockLists):
        if kv_blocks.block_size != block_size:
            raise ValueError(f"kv_blocks: made for block_size {kv_blocks.block_size}, the call has {block_size}")
        if kv_blocks.num_heads != heads or kv_blocks.num_q_slots != slots:
            raise ValueError(f"kv_blocks: made for {kv_blocks.num_heads} heads and {kv_blocks.num_q_slots} query block "
                             f"slots, this batch has {heads} and {slots} (lists are per batch: select_kv_blocks)")
        if kv_blocks.offsets.device != q.device:
            raise ValueError(f"kv_blocks: on {kv_blocks.offsets.device}, q on {q.device}")
        if causal and not kv_blocks.causal:
            raise ValueError("kv_blocks: selected with causal=False, and this call is causal=True; select with "
                             "causal=True (causal lists never list a block wholly in the causal future)")
        return kv_blocks
    if not isinstance(kv_blocks, (tuple, list)) or len(kv_blocks) != 2:
        raise TypeError("kv_blocks: expected (offsets, indices) CSR tensors or the BlockLists of "
                        f"jfa.select_kv_blocks, got {type(kv_blocks).__name__}")
    offsets, indices = kv_blocks
    lengths_q = [problem.len_q_bcast] * problem.num_seqs if broadcast_q else _lengths(cu_q)
    nqb = _check_csr(offsets, indices, lengths_q, _lengths(cu_k), heads, block_size, causal)
    return bl.from_csr(offsets.to(q.device), indices.to(q.device), block_size=block_size, num_heads=heads,
                       num_q_blocks=nqb, num_q_slots=slots, causal=causal)


def _run_select(q, k, cu_q, cu_k, block_size, topk, keep_ratio, causal, broadcast_q, len_q, max_seqlen_k):
    from jfa.kernels.triton.block_select import select_kv_blocks as select

    return select(q, k, cu_q, cu_k, block_size=block_size, topk=topk, keep_ratio=keep_ratio, causal=causal,
                  broadcast_q=broadcast_q, len_q=len_q, max_seqlen_k=max_seqlen_k)


# the selection as a custom op (what tracers see; ``topk``/``keep_ratio`` of 0 mean "not this rule"): its
# outputs' sizes follow from the shapes and the max_seqlen_k bound alone, so the fake kernel knows them
@torch.library.custom_op("jfa::select_kv_blocks", mutates_args=())
def _select_op(q: torch.Tensor, k: torch.Tensor, cu_q: Optional[torch.Tensor], cu_k: torch.Tensor, block_size: int,
               topk: int, keep_ratio: float, causal: bool, broadcast_q: bool, len_q: int,
               max_seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    lists = _run_select(q, k, cu_q, cu_k, block_size, topk or None, keep_ratio or None, causal, broadcast_q, len_q,
                        max_seqlen_k)
    return lists.offsets, lists.indices


@_select_op.register_fake
def _(q, k, cu_q, cu_k, block_size, topk, keep_ratio, causal, broadcast_q, len_q, max_seqlen_k):
    from jfa.kernels.schedule import num_tile_slots
    from jfa.kernels.triton.block_select import index_capacity

    num_seqs = cu_k.shape[0] - 1
    rows = num_seqs * len_q if broadcast_q else q.shape[0]
    slots = num_tile_slots(rows, num_seqs, block_size)
    capacity = index_capacity(rows, k.shape[0], num_seqs, q.shape[1], block_size, max_seqlen_k, topk=topk or None,
                              keep_ratio=keep_ratio or None, causal=causal, broadcast_q=broadcast_q, len_q=len_q)
    return (q.new_empty((q.shape[1] * slots + 1,), dtype=torch.int32), q.new_empty((capacity,), dtype=torch.int32))


def _select(q, k, cu_q, cu_k, *, block_size, keep_ratio, topk, causal, broadcast_q, problem, longest_k):
    """The selection kernel's BlockLists (through its custom op when a tracer sees the call); on the
    reference backend (CPU tensors without Triton's interpreter) the reference's selection."""
    if problem.backend == "torch":
        from jfa.kernels import block_lists as bl
        from jfa.kernels.schedule import num_tile_slots
        from jfa.reference import select_kv_blocks_reference

        offsets, indices = select_kv_blocks_reference(q, k, cu_q, cu_k, block_size=block_size, topk=topk,
                                                      keep_ratio=keep_ratio, causal=causal, broadcast_q=broadcast_q)
        rows = problem.num_seqs * problem.len_q_bcast if broadcast_q else q.shape[0]
        return bl.from_csr(offsets.to(q.device), indices.to(q.device), block_size=block_size, num_heads=q.shape[1],
                           num_q_blocks=(offsets.numel() - 1) // max(q.shape[1], 1),
                           num_q_slots=num_tile_slots(rows, problem.num_seqs, block_size), causal=causal)
    if not _traced(q, k):
        return _run_select(q, k, cu_q, cu_k, block_size, topk, keep_ratio, causal, broadcast_q, problem.len_q_bcast,
                           longest_k)
    from jfa.kernels.block_lists import BlockLists
    from jfa.kernels.schedule import num_tile_slots

    offsets, indices = _select_op(q, k, cu_q, cu_k, block_size, topk or 0, float(keep_ratio or 0.0), causal,
                                  broadcast_q, problem.len_q_bcast, longest_k)
    rows = problem.num_seqs * problem.len_q_bcast if broadcast_q else q.shape[0]
    return BlockLists(offsets, indices, block_size, q.shape[1], num_tile_slots(rows, problem.num_seqs, block_size),
                      causal)


def _sparse_backend(backend: str, q, k, v, block_size: int) -> tuple[str, str]:
    """("tlx", "triton" or "torch", why not TLX) for a block-sparse call: the TLX forward where it takes the
    call (sm_90, bf16/fp16, D 64/128, blocks of 128), else the portable kernels; an explicit 'tlx' that
    cannot run raises."""
    resolved = _resolve_backend(backend, q.device)
    if resolved != "tlx":
        return resolved, ""
    from jfa.kernels.tlx.hopper.forward import sparse_supports

    ok, reason = sparse_supports(_last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v),
                                 block_size)
    if ok:
        return "tlx", ""
    if backend == "tlx":
        raise ValueError(f"backend: 'tlx' cannot run this block-sparse call: {reason}; use backend='auto' to fall "
                         "back to the portable kernels")
    _log_fallback_once("jfa: TLX block-sparse forward not used, running the portable Triton kernel: %s", reason)
    return "triton", reason


def _validate_sparse(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, *, causal, softmax_scale, broadcast_q,
                     return_lse, backend, block_size, deterministic=False):
    """The dense op's checks (the same rules and messages) with the backend for block-sparse kernels, and the
    longest key sequence (the selection's capacity bound)."""
    _check_block_size(block_size)
    problem = validate(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                       broadcast_q=broadcast_q, deterministic=deterministic, precision="auto",
                       backend="auto" if backend == "tlx" else backend, return_lse=return_lse)
    if problem.backend != "torch" or backend == "tlx":
        problem = dataclasses.replace(problem, backend=_sparse_backend(backend, q, k, v, block_size)[0])
    if max_seqlen_k is not None and knobs.trust_offsets:
        longest_k = max_seqlen_k
    else:
        longest_k = _untraced(_check_offsets_values)("cu_seqlens_k", cu_k, k.shape[0], max_seqlen_k)
    return problem, longest_k


def _run_sparse_forward(backend, q, k, v, cu_q, cu_k, offsets, indices, block_size, num_q_slots, causal,
                        softmax_scale, broadcast_q, num_seqs, len_q_bcast, deterministic):
    from jfa.kernels.block_lists import BlockLists

    lists = BlockLists(offsets, indices, block_size, q.shape[1], num_q_slots, causal)
    result = _launcher(*_SPARSE_LAUNCHERS[backend][0])(q, k, v, cu_q, cu_k, lists, causal=causal,
                                                       softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                                       num_seqs=num_seqs, len_q_bcast=len_q_bcast)
    _record("forward", backend, q.device, SPARSE_KERNEL_NAMES[backend][0])
    return result


def _sparse_backward_launcher(backend, q, k, v, dout, block_size):
    """(backend whose block-sparse backward runs, its launcher, dout): after the TLX forward the TLX
    backward where it takes the gradient (a layout TMA cannot read copied to a contiguous one first, as for
    the dense op), else the portable one."""
    if backend == "tlx":
        from jfa.kernels.tlx.hopper.backward import sparse_supports

        ok, reason = sparse_supports(q, k, v, dout, block_size)
        if not ok and sparse_supports(q, k, v, None, block_size)[0]:
            dout = dout.contiguous()
            ok, reason = sparse_supports(q, k, v, dout, block_size)
        if ok:
            return "tlx", _launcher(*_SPARSE_LAUNCHERS["tlx"][1]), dout
        _log_fallback_once("jfa: TLX block-sparse backward not used, running the portable Triton backward: %s",
                           reason)
    return "triton", _launcher(*_SPARSE_LAUNCHERS["triton"][1]), dout


def _run_sparse_backward(backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices, block_size,
                         num_q_slots, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, deterministic):
    from jfa.kernels.block_lists import BlockLists

    lists = BlockLists(offsets, indices, block_size, q.shape[1], num_q_slots, causal)
    chosen, launch, dout = _sparse_backward_launcher(backend, q, k, v, dout, block_size)
    grads = launch(q, k, v, out, lse, dout, cu_q, cu_k, lists, causal=causal, softmax_scale=softmax_scale,
                   broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dlse=dlse,
                   deterministic=deterministic)
    _record("backward", chosen, q.device, SPARSE_KERNEL_NAMES[chosen][1])
    return grads


def _sparse_ops(backend: str):
    """The custom ops ``jfa::<backend>_sparse_forward`` / ``_sparse_backward`` (what tracers see)."""

    @torch.library.custom_op(f"jfa::{backend}_sparse_backward", mutates_args=())
    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    dout: torch.Tensor, dlse: Optional[torch.Tensor], cu_q: Optional[torch.Tensor], cu_k: torch.Tensor,
                    offsets: torch.Tensor, indices: torch.Tensor, block_size: int, num_q_slots: int, causal: bool,
                    softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int,
                    deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _run_sparse_backward(backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices, block_size,
                                    num_q_slots, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                                    deterministic)

    @backward_op.register_fake
    def _(q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices, *args):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    @torch.library.custom_op(f"jfa::{backend}_sparse_forward", mutates_args=())
    def forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: Optional[torch.Tensor], cu_k: torch.Tensor,
                   offsets: torch.Tensor, indices: torch.Tensor, block_size: int, num_q_slots: int, causal: bool,
                   softmax_scale: float, broadcast_q: bool, num_seqs: int, len_q_bcast: int,
                   deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return _run_sparse_forward(backend, q, k, v, cu_q, cu_k, offsets, indices, block_size, num_q_slots, causal,
                                   softmax_scale, broadcast_q, num_seqs, len_q_bcast, deterministic)

    @forward_op.register_fake
    def _(q, k, v, cu_q, cu_k, offsets, indices, block_size, num_q_slots, causal, softmax_scale, broadcast_q,
          num_seqs, len_q_bcast, deterministic):
        rows = num_seqs * len_q_bcast if broadcast_q else q.shape[0]
        return q.new_empty((rows, q.shape[1], q.shape[2])), q.new_empty((rows, q.shape[1]), dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, offsets, indices, *args = inputs
        ctx.save_for_backward(q, k, v, *output, cu_q, cu_k, offsets, indices)
        ctx.args = tuple(args)

    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, offsets, indices = ctx.saved_tensors
        dout = _last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
        grads = backward_op(q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices, *ctx.args)
        return tuple(grads) + (None,) * 12

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


_SPARSE_OPS = {"triton": _sparse_ops("triton"), "tlx": _sparse_ops("tlx")}


class _EagerSparseAttention(torch.autograd.Function):
    """The sparse custom ops' eager twin (as ``_EagerAttention`` is the dense ones')."""

    @staticmethod
    def forward(ctx, backend, q, k, v, cu_q, cu_k, offsets, indices, *args):
        out, lse = _run_sparse_forward(backend, q, k, v, cu_q, cu_k, offsets, indices, *args)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, offsets, indices)
        ctx.args, ctx.backend = args, backend
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, offsets, indices = ctx.saved_tensors
        dout = _last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
        grads = _run_sparse_backward(ctx.backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices,
                                     *ctx.args)
        return (None, *grads) + (None,) * 12


def select_kv_blocks(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: torch.Tensor,
    *,
    block_size: int = 128,
    keep_ratio: Optional[float] = None,
    topk: Optional[int] = None,
    causal: bool = False,
    broadcast_q: bool = False,
    max_seqlen_k: Optional[int] = None,
):
    """The key blocks block-sparse attention visits, chosen by scoring (DESIGN.md section 10): per head,
    mean-pooled query and key blocks, ``score = q_block . k_block``, the best-scoring key blocks kept per query
    block (ties to the lower index); under ``causal`` the blocks holding each row's diagonal key are always
    kept and none wholly in the causal future. One device pass, no host sync past validation.

    Args:
        q, k, cu_seqlens_q, cu_seqlens_k, causal, broadcast_q, max_seqlen_k: as for ``jagged_attention``.
        block_size: rows and keys per block (16, 32, 64, 128 or 256), per sequence (the last may be short).
        keep_ratio: keep ``ceil(keep_ratio * n)`` of the ``n`` key blocks a query block can see; or
        topk: keep ``min(topk, n)``.

    Returns:
        ``jfa.kernels.block_lists.BlockLists``: pass it as ``kv_blocks`` to ``block_sparse_attention`` (the
        same batch: the layers of a model can share one selection).

    Raises:
        TypeError, ValueError: as ``jagged_attention`` for the tensors, or a selection rule missing, doubled
            or out of range.
    """
    _check_selection_rule(keep_ratio, topk)
    problem, longest_k = _validate_sparse(q, k, k, cu_seqlens_q, cu_seqlens_k, None, max_seqlen_k, causal=causal,
                                          softmax_scale=None, broadcast_q=broadcast_q, return_lse=False,
                                          backend="auto", block_size=block_size)
    return _select(problem.q, problem.k, cu_seqlens_q, cu_seqlens_k, block_size=block_size, keep_ratio=keep_ratio,
                   topk=topk, causal=causal, broadcast_q=broadcast_q, problem=problem, longest_k=longest_k)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    *,
    keep_ratio: Optional[float] = None,
    topk: Optional[int] = None,
    kv_blocks=None,
    block_size: int = 128,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    broadcast_q: bool = False,
    deterministic: bool = False,
    return_lse: bool = False,
    backend: str = "auto",
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Block-sparse attention over packed variable-length sequences, differentiable in q, k and v: each
    query block attends only to the key blocks of its list, under the conventions of ``jagged_attention``
    (bottom-right causal, broadcast Q, GQA; a row that sees no listed key gives out = 0, lse = -inf and
    zero gradients). Blocks are ``block_size`` rows/keys of one sequence (never straddling; the last may
    be short).

    Args:
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q,
            deterministic, return_lse: as for ``jagged_attention``.
        keep_ratio, topk: a selection rule (``select_kv_blocks``) run on this call's q and k; or
        kv_blocks: the lists to use: ``select_kv_blocks``' result, or a CSR pair ``(offsets, indices)`` of
            int tensors: row ``h * NQB + g`` (query block g of the batch, numbered through the sequences in
            order; NQB query blocks in all) lists ``indices[offsets[r]:offsets[r + 1]]``, the sequence's key
            block numbers (0-based), strictly ascending. Checked (a device read) before any kernel.
        block_size: 16, 32, 64, 128 or 256.
        backend: "auto" (the TLX Hopper kernels where they take the call: sm_90, bf16/fp16, head dim 64 or
            128, block_size 128; the portable Triton kernels elsewhere, Triton's interpreter for CPU tensors),
            "tlx", "triton" or "torch" (the reference). ``which_kernels(..., block_size=...)`` says which.

    Returns:
        ``out`` (and ``lse`` with ``return_lse``), shaped as ``jagged_attention``'s.

    Raises:
        TypeError, ValueError: as ``jagged_attention``, and for a selection rule or lists that break their
            rules (each message names the argument and the rule); nothing is computed then.
    """
    problem, longest_k = _validate_sparse(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                          return_lse=return_lse, backend=backend, block_size=block_size,
                                          deterministic=deterministic)
    if kv_blocks is None:
        _check_selection_rule(keep_ratio, topk)
    lists = _block_lists(problem.q, problem.k, cu_seqlens_q, cu_seqlens_k, problem=problem, causal=causal,
                         broadcast_q=broadcast_q, block_size=block_size, keep_ratio=keep_ratio, topk=topk,
                         kv_blocks=kv_blocks, longest_k=longest_k)
    if problem.backend == "torch":
        from jfa.kernels.block_lists import exact_csr
        from jfa.reference import attention_reference

        out, lse = attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal,
                                       softmax_scale=problem.softmax_scale, broadcast_q=broadcast_q,
                                       kv_blocks=exact_csr(lists, cu_seqlens_q, cu_seqlens_k, broadcast_q,
                                                           problem.len_q_bcast) + (block_size,))
        lse = lse.to(torch.float32)
        _record("forward", "torch", q.device)
    else:
        args = (problem.q, problem.k, problem.v, cu_seqlens_q, cu_seqlens_k, lists.offsets, lists.indices, block_size,
                lists.num_q_slots, causal, problem.softmax_scale, broadcast_q, problem.num_seqs, problem.len_q_bcast,
                deterministic)
        if _traced(problem.q, problem.k, problem.v):
            out, lse = _SPARSE_OPS[problem.backend](*args)
        else:
            out, lse = _EagerSparseAttention.apply(problem.backend, *args)
    return (out, lse) if return_lse else out
