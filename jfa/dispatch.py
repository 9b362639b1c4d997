"""What both ops share: argument checks, backend resolution, launcher lookup and the dispatch record.

Every check runs before any kernel: a bad argument raises ``TypeError`` (wrong kind of thing) or
``ValueError`` (right kind, broken rule) naming the argument and the rule (DESIGN.md section 3).
``jfa.api`` (the dense op) and ``jfa.block_sparse`` (the block-sparse op) build on these.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import math
import sys
import threading
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from jfa import knobs
from jfa.kernels.cache import IdentityCache, capturing
from jfa.kernels.triton.configs import MAX_HEAD_DIM

log = logging.getLogger("jfa")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = ("auto", "tlx", "triton", "torch")
PRECISIONS = ("auto", "mxfp8", "mxfp8-rceil")
MX_RULES = {"mxfp8": "floor", "mxfp8-rceil": "rceil"}  # the MXFP8 precisions and their scale rules
# the kernel families a call resolves to, as KernelChoice names them: "tlx" is the Hopper (sm_90) family
KERNEL_NAMES = {"triton": "triton", "tlx": "tlx-hopper", "tlx_blackwell": "tlx-blackwell", "torch": "torch"}


@dataclass(frozen=True)
class Problem:
    """What validation learned about a call; everything a launcher needs besides the offsets."""

    num_seqs: int
    len_q_bcast: int  # Lq of a broadcast Q, else 0
    # the longest query and key sequences (read from the offsets, or the hints when they are trusted; Lq for a
    # broadcast Q's queries)
    longest_q: int
    longest_k: int
    softmax_scale: float
    window: tuple  # (left, right) as the call gave it, -1 unbounded (causal: right 0)
    backend: str  # resolved: "tlx", "triton" or "torch"
    q: torch.Tensor  # q, k, v as the kernels take them: head dim contiguous (copied only if it was not)
    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class KernelChoice:
    """Which kernels a call runs (``jfa.which_kernels``): ``forward`` is "tlx-hopper", "tlx-blackwell",
    "triton" or "torch", ``backward`` "tlx-hopper", "tlx-blackwell", "triton" or "torch"; ``reason`` says why
    either is not a TLX kernel ("" when both are). A TLX backward follows the TLX forward of its own family:
    its dK/dV kernel, with dQ reduced inside it (unless ``deterministic=True``, which takes the portable dQ
    pass)."""

    forward: str
    backward: str
    reason: str


def check_tensor(name: str, t, mx_rule: Optional[str] = None):
    """``t`` itself, or for an MXFP8 call (``mx_rule`` set) an ``jfa.mx.MXTensor``'s fp8 data once its axis
    (q, k along ``dim``, v along ``tokens``) and rule match the call."""
    if mx_rule is not None and type(t).__name__ == "MXTensor":
        axis = "tokens" if name == "v" else "dim"
        if t.axis != axis:
            raise ValueError(f"{name}: an MXTensor quantized along {t.axis!r}; precision='mxfp8' takes {name} "
                             f"along {axis!r} (jfa.mx.quantize(x, {axis!r}{', cu_seqlens_k' if name == 'v' else ''}))")
        if t.rule != mx_rule:
            raise ValueError(f"{name}: quantized with rule {t.rule!r}, the call's precision asks for {mx_rule!r}")
        return t.data
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: dtype must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dim() != 3:
        raise ValueError(f"{name}: expected shape [tokens, heads, head_dim] (3-D), got {tuple(t.shape)}")
    return t


def check_offsets_meta(name: str, cu, device: torch.device) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of offsets, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: offsets must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name}: expected a 1-D tensor of B+1 >= 1 offsets, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name}: must be on the same device as q ({device}), got {cu.device}")


def check_hint(name: str, hint) -> None:
    if hint is None:
        return
    if isinstance(hint, bool) or not isinstance(hint, int):
        raise TypeError(f"{name}: expected an int or None, got {type(hint).__name__}")
    if hint < 0:
        raise ValueError(f"{name}: must be >= 0, got {hint}")


_validated_offsets = IdentityCache()


def check_offsets_values(name: str, cu: torch.Tensor, total: int, hint: Optional[int]) -> int:
    """First 0, non-decreasing, last = total, max length <= hint; returns the longest length. One device
    read per offsets tensor: the layers of a model (and later calls) passing the same unmodified tensor
    reuse the result."""
    longest = _validated_offsets.get_or_build((cu,), (name, total), lambda: read_offsets(name, cu, total))
    if hint is not None and hint < longest:
        hint_name = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
        raise ValueError(f"{hint_name}: hint {hint} is smaller than the longest sequence ({longest})")
    return longest


def read_offsets(name: str, cu: torch.Tensor, total: int) -> int:
    """Validate the offset values (a device read); returns the longest sequence length."""
    if capturing((cu,)):
        raise ValueError(f"{name}: under CUDA-graph capture the offsets cannot be read back to check them; pass both "
                         "max_seqlen_q and max_seqlen_k (max_seqlen_k with broadcast_q) and set JFA_TRUST_OFFSETS=1 "
                         "(jfa.knobs.trust_offsets)")
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


def untraced(fn):
    """``fn``, run eagerly when torch.compile traces the caller (a graph break, whose reason says how to
    avoid it): host logic around a device read, whose errors must stay the ones written (traced, Dynamo
    turns the offsets' ValueError into a TypeError from formatting its message). Plain ``fn`` otherwise:
    ``torch.compiler.disable`` imports Dynamo, which imports triton, and importing jfa must not (Triton's
    CPU interpreter is chosen then)."""
    if not torch.compiler.is_compiling():
        return fn
    torch._dynamo.graph_break(msg=_GRAPH_BREAK_REASON)  # with fullgraph=True, the error names the fix
    return torch.compiler.disable(fn)


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend family a call may use before looking at shapes: "tlx", "triton" or "torch" ("tlx" for
    ``auto`` on CUDA means: the TLX kernel if it supports the call, else the portable one)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
    from jfa.kernels.triton import interpreter_active

    if backend == "tlx" and device.type != "cuda" and not tlx_target_registered(device):
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
        log_fallback_once("jfa: running the PyTorch reference (%s)", f"no CUDA device and no Triton interpreter for "
                           f"{device} tensors; set TRITON_INTERPRET=1 before triton is imported to run the portable "
                           "kernel on CPU")
        return "torch"
    return backend


def mx_backend(backend: str, device: torch.device) -> str:
    """The backend family of an MXFP8 call: "tlx" (the TLX MXFP8 forward where it supports the call,
    ``mx_tlx_or_portable``, and the TLX MXFP8 backward where it does, ``mx_backward_tlx_or_portable``) or
    "triton" (the portable MXFP8 kernels: CUDA, or CPU tensors under the interpreter)."""
    if backend == "torch":
        raise ValueError("backend: 'torch' (the reference) has no MXFP8 path; the MXFP8 oracle is "
                         "jfa.oracle.mx_attention (NumPy)")
    resolved = resolve_backend(backend, device)
    if resolved == "torch":
        raise ValueError("precision: MXFP8 runs the TLX or portable Triton kernels: CUDA tensors, or CPU tensors "
                         "with TRITON_INTERPRET=1 set before triton is imported")
    return resolved


def mx_tlx_kernel(device: torch.device) -> tuple:
    """(family, kernel name, ``mx_supports``) of the TLX MXFP8 forward for ``device``'s launch target: the
    Blackwell build ("tlx_blackwell") on sm_100, else the Hopper one ("tlx")."""
    from jfa.kernels.tlx.common.target import target_for
    from jfa.mx import BLACKWELL_KERNEL_NAME, TLX_KERNEL_NAME

    launch_target = target_for(device)
    if launch_target is not None and launch_target.capability[0] == 10:
        from jfa.kernels.tlx.blackwell.forward import mx_supports

        return "tlx_blackwell", BLACKWELL_KERNEL_NAME, mx_supports
    from jfa.kernels.tlx.hopper.forward import mx_supports

    return "tlx", TLX_KERNEL_NAME, mx_supports


def mx_tlx_or_portable(backend: str, q, k, v, window=(-1, -1)) -> tuple[str, str]:
    """("tlx" (the Hopper MXFP8 forward), "tlx_blackwell" (the sm_100 one) or "triton", why not TLX) for an
    MXFP8 forward on MXTensors q, k, v, by the capability of their launch target (``mx_tlx_kernel``): as
    ``tlx_or_portable`` (an explicit backend='tlx' the kernel cannot run raises; 'auto' falls back, logging the
    reason once)."""
    family, _name, mx_supports = mx_tlx_kernel(q.device)
    resolved, reason = tlx_or_fallback(backend, *mx_supports(q, k, v, window), "MXFP8 call")
    return (family if resolved == "tlx" else resolved), reason


def mx_backward_tlx_or_portable(backend: str, q, k, v, window=(-1, -1)) -> tuple[str, str]:
    """("tlx" (the Hopper MXFP8 dK/dV build), "tlx_blackwell" (the sm_100 one; dQ on the portable MX pass with
    either) or "triton", why not TLX) for the backward of an MXFP8 call on q, k, v (the call's tensors), by the
    capability of their launch target. Never raises: a backward the TLX build cannot run (a window, another head
    dim, no TLX target) runs the portable MXFP8 backward, the reason logged once (an explicit backend='tlx' was held
    to the forward's rules)."""
    if backend == "triton":
        return "triton", "backend='triton' asked for the portable MXFP8 kernels"
    from jfa.kernels.tlx.common.target import target_for

    launch_target = target_for(q.device)
    if launch_target is not None and launch_target.capability[0] == 10:
        from jfa.kernels.tlx.blackwell.backward import mx_backward_supports

        family = "tlx_blackwell"
    else:
        from jfa.kernels.tlx.hopper.backward import mx_backward_supports

        family = "tlx"
    ok, reason = mx_backward_supports(q, k, v, window)
    if ok:
        return family, ""
    reason = f"the TLX MXFP8 backward cannot run it: {reason}"
    log_fallback_once("jfa: no TLX kernel for this MXFP8 backward, running the portable Triton kernels: %s", reason)
    return "triton", reason


def tlx_target_registered(device: torch.device) -> bool:
    """Whether something (the TLX simulator) registered a TLX execution target for ``device``."""
    from jfa.kernels.tlx.common.target import target_for

    return target_for(device) is not None


_fallbacks_logged: set = set()


def log_fallback_once(message: str, reason: str) -> None:
    """Log (INFO, logger "jfa") why a TLX kernel was not used, once per distinct reason."""
    if reason not in _fallbacks_logged:
        _fallbacks_logged.add(reason)
        log.info(message, reason)


def tlx_or_portable(backend: str, q, k, v, window=(-1, -1)) -> tuple[str, str]:
    """("tlx" (the Hopper kernels), "tlx_blackwell" (the sm_100 kernels) or "triton", why not TLX), by the
    capability of the tensors' launch target. An explicit backend='tlx' the kernel cannot run raises; 'auto'
    falls back to the portable kernel and logs the reason once per distinct reason (logger "jfa")."""
    from jfa.kernels.tlx.common.target import target_for

    launch_target = target_for(q.device)
    if launch_target is not None and launch_target.capability[0] == 10:
        from jfa.kernels.tlx.blackwell.forward import supports

        family = "tlx_blackwell"
    else:
        from jfa.kernels.tlx.hopper.forward import supports

        family = "tlx"
    resolved, reason = tlx_or_fallback(backend, *supports(q, q.shape[-1], q.dtype, k=k, v=v, window=window), "call")
    return (family if resolved == "tlx" else resolved), reason


def tlx_or_fallback(backend: str, ok: bool, reason: str, call: str) -> tuple[str, str]:
    """("tlx", "") where the TLX kernel runs ``call`` (``ok``), else ("triton", ``reason``): an explicit
    backend='tlx' raises the reason, 'auto' falls back to the portable kernels and logs it once per
    distinct reason (logger "jfa")."""
    if ok:
        return "tlx", ""
    if backend == "tlx":
        raise ValueError(f"backend: 'tlx' cannot run this {call}: {reason}; use backend='auto' to fall back to "
                         "the portable kernels")
    log_fallback_once(f"jfa: no TLX kernel for this {call}, running the portable Triton kernels: %s", reason)
    return "triton", reason


def check_window(window_size, causal: bool) -> tuple:
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
    """Check every argument against the contract; returns what the launchers need. Runs no kernel. With an
    MXFP8 precision q, k, v may be ``jfa.mx.MXTensor``s (all three or none); the Problem then holds their data."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    mx_rule = MX_RULES.get(precision)
    given = [type(t).__name__ == "MXTensor" for t in (q, k, v)]
    if any(given) and mx_rule is None:
        raise TypeError("q, k, v: MXTensors need precision='mxfp8' or 'mxfp8-rceil' (their scale rule)")
    if any(given) and not all(given):
        raise TypeError("q, k, v: give all three as MXTensors (inference on pre-quantized operands) or none")
    q, k, v = (check_tensor(name, t, mx_rule) for name, t in (("q", q), ("k", k), ("v", v)))
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
    window = check_window(window_size, causal)
    check_hint("max_seqlen_q", max_seqlen_q)
    check_hint("max_seqlen_k", max_seqlen_k)

    if cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k: required (the [B+1] key offsets), unless q, k, v are jagged NestedTensors")
    check_offsets_meta("cu_seqlens_k", cu_seqlens_k, q.device)
    num_seqs = cu_seqlens_k.numel() - 1
    if broadcast_q:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q: must be None when broadcast_q=True (q is one dense sequence)")
        if max_seqlen_q is not None and max_seqlen_q < q.shape[0]:
            raise ValueError(f"max_seqlen_q: hint {max_seqlen_q} is smaller than the broadcast Q length {q.shape[0]}")
    else:
        if cu_seqlens_q is None:
            raise ValueError("cu_seqlens_q: required unless broadcast_q=True")
        check_offsets_meta("cu_seqlens_q", cu_seqlens_q, q.device)
        if cu_seqlens_q.numel() != cu_seqlens_k.numel():
            raise ValueError(f"cu_seqlens_q, cu_seqlens_k: must have the same length B+1, got "
                             f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    resolved = resolve_backend(backend, q.device) if mx_rule is None else mx_backend(backend, q.device)

    hints_given = max_seqlen_k is not None and (broadcast_q or max_seqlen_q is not None)
    if hints_given and knobs.trust_offsets:
        longest_q, longest_k = (q.shape[0] if broadcast_q else max_seqlen_q), max_seqlen_k
    else:
        check = untraced(check_offsets_values)
        longest_k = check("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)
        longest_q = q.shape[0] if broadcast_q else check("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q)
    if resolved != "torch":  # every check passed: the one copy a kernel may need, made once
        q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    if resolved == "tlx" and mx_rule is None:  # (MXFP8: decided on the quantized operands, mx_tlx_or_portable)
        resolved, _ = tlx_or_portable(backend, q, k, v, window)
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    return Problem(num_seqs, q.shape[0] if broadcast_q else 0, longest_q, longest_k, scale, window, resolved, q, k, v)



def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its head dim contiguous (token and head strides are free; every kernel wants the head dim
    itself contiguous). Gradients arrive in any layout: expanded (``out.sum().backward()`` gives stride
    0 everywhere), transposed, sliced. An empty tensor counts as contiguous whatever its strides, so
    ``contiguous()`` keeps a stride-0 head dim there: a fresh tensor then (it holds no value to copy)."""
    if t.stride(-1) == 1:
        return t
    if t.numel() == 0:
        return t.new_empty(t.shape)
    return t.contiguous()


def launcher(module: str, name: str):
    """``module.name``, looked up at each call (tests and measurements replace launchers)."""
    loaded = sys.modules.get(module)
    return getattr(loaded if loaded is not None else importlib.import_module(module), name)



def traced(*tensors) -> bool:
    """Whether a tracer sees this call: torch.compile or torch.export, or tensor subclasses (fake and
    functional tensors of other tracers). The custom ops then, whose schemas and fake kernels they use."""
    return torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in tensors)



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


def record(pass_: str, backend: str, device: torch.device, kernel: Optional[str] = None) -> None:
    """Append (pass, kernel, where) to every open recording_dispatch list; ``kernel`` defaults to the
    backend's name in KERNEL_NAMES."""
    if not _recorders:
        return
    if backend in ("tlx", "tlx_blackwell"):
        from jfa.kernels.tlx.common.target import target_for

        where = getattr(target_for(device), "name", device.type)
    else:
        where = "interpreter" if backend == "triton" and device.type == "cpu" else device.type
    for log in _recorders:
        log.append((pass_, kernel or KERNEL_NAMES[backend], where))

