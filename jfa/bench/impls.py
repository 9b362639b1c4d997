"""Adapters that turn one packed problem into timed callables, one per implementation.

An adapter has a ``name``, ``available() -> (bool, reason)`` and
``prepare(batch, grad) -> Prepared``. ``Prepared.fwd()`` runs the forward pass and returns
the output in packed layout (``[total_q, H, D]``, ``[B * Lq, H, D]`` under broadcast-Q);
``Prepared.fwd_bwd()`` runs forward plus ``out.backward(grad)`` and keeps nothing alive
afterwards. Either is None where the implementation cannot do that pass.

Layout conversions and other per-problem set-up (repeating Q for peers, building a
FlexAttention block mask) happen in ``prepare``, outside the timed callables.
Nothing here imports jfa kernels or touches CUDA at import time.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = [
    "PackedBatch",
    "Prepared",
    "Impl",
    "JfaImpl",
    "TorchVarlenImpl",
    "FlexDocMaskImpl",
    "IMPLS",
    "BASELINE",
    "get_impl",
    "varlen_causal_kwargs",
    "repeat_broadcast_q",
]

#: Name of the implementation every other one is compared with.
BASELINE = "torch-varlen"
#: flex-docmask is skipped above this many (query, key) token pairs in the packed batch: its
#: block mask is built over the whole T_q x T_k plane. On the H200, 3.5e11 builds in well under
#: a second, while 1.2e13 (sweep L4096 s=0.1, 3.4M tokens) did not finish in 5 minutes.
FLEX_MAX_MASK_ELEMENTS = 2.5e12


@dataclass
class PackedBatch:
    """Packed inputs of one problem (one copy of them, when the runner rotates copies).

    ``q`` is ``[total_q, H, D]`` or, under broadcast-Q, ``[Lq, H, D]`` with ``cu_q = None``.
    ``cu_q``/``cu_k`` are int32 on the device; ``lengths_q``/``lengths_k`` are the same
    lengths as int64 on the CPU (for set-up work that must not sync the device).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor | None
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    lengths_q: torch.Tensor
    lengths_k: torch.Tensor
    causal: bool = False
    broadcast_q: bool = False

    @property
    def B(self) -> int:
        return self.cu_k.numel() - 1

    @property
    def Lq(self) -> int:
        """Rows of the shared Q under broadcast-Q."""
        return self.q.shape[0]


@dataclass
class Prepared:
    """Callables produced by an adapter for one batch. ``setup_ms``: untimed set-up cost."""

    fwd: Callable[[], torch.Tensor] | None
    fwd_bwd: Callable[[], None] | None
    setup_ms: float | None = None
    note: str = ""


def _make_fwd_bwd(forward: Callable[..., torch.Tensor], leaves: list[torch.Tensor],
                  grad: torch.Tensor) -> Callable[[], None]:
    """forward(*leaves) then backward(grad); grads are dropped so nothing survives the call."""

    def run() -> None:
        out = forward(*leaves)
        out.backward(grad)
        for t in leaves:
            t.grad = None

    return run


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh autograd leaves sharing storage with ``tensors``."""
    return [t.detach().requires_grad_(True) for t in tensors]


def repeat_broadcast_q(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """What peers without broadcast-Q get: Q repeated B times and ``cu_q = arange(B+1) * Lq``.

    Their dq is then per copy (no sum over b); the FLOP count is the same for everyone.
    """
    q = batch.q.repeat(batch.B, 1, 1)
    cu_q = (torch.arange(batch.B + 1, device=batch.q.device, dtype=torch.int32) * batch.Lq)
    return q, cu_q, batch.Lq


class Impl:
    """Base adapter. Subclasses set ``name`` and implement ``available`` and ``prepare``."""

    name: str = "?"

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        raise NotImplementedError

    def clear_cache(self) -> None:
        """Drop per-problem state (called by the runner after each problem)."""


def _cuda_available() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return True, ""


# ---------------------------------------------------------------------------------------
# jfa
# ---------------------------------------------------------------------------------------

class JfaImpl(Impl):
    """``jfa.jagged_attention`` with a fixed backend ("triton" or "tlx")."""

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"jfa-{backend}"

    def available(self) -> tuple[bool, str]:
        ok, why = _cuda_available()
        if not ok:
            return ok, why
        try:
            import jfa
        except Exception as e:  # noqa: BLE001 - report whatever broke the import
            return False, f"import jfa failed: {type(e).__name__}: {e}"
        if not hasattr(jfa, "jagged_attention"):
            return False, "jfa.jagged_attention is missing"
        return True, ""

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        import jfa

        def forward(q, k, v):
            return jfa.jagged_attention(
                q, k, v, batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
                causal=batch.causal, broadcast_q=batch.broadcast_q, backend=self.backend)

        return Prepared(
            fwd=lambda: forward(batch.q, batch.k, batch.v),
            fwd_bwd=_make_fwd_bwd(forward, _leaves(batch.q, batch.k, batch.v), grad),
        )


# ---------------------------------------------------------------------------------------
# torch.nn.attention.varlen.varlen_attn
# ---------------------------------------------------------------------------------------

def varlen_causal_kwargs(fn: Callable, causal: bool) -> dict:
    """Keyword arguments that select (non-)causal attention in this torch's ``varlen_attn``.

    torch 2.9/2.10 take ``is_causal: bool``; later versions take
    ``window_size=(left, right)`` where ``(-1, 0)`` means causal (bottom-right aligned, as
    FlashAttention). Raises ``NotImplementedError`` for a causal request when neither exists.
    """
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        return {"window_size": (-1, 0)} if causal else {}
    if "is_causal" in params:
        return {"is_causal": causal}
    if causal:
        raise NotImplementedError("varlen_attn has neither window_size nor is_causal")
    return {}


class TorchVarlenImpl(Impl):
    """PyTorch's ``varlen_attn`` (FlashAttention-2 underneath); Q repeated under broadcast-Q."""

    name = "torch-varlen"

    def available(self) -> tuple[bool, str]:
        ok, why = _cuda_available()
        if not ok:
            return ok, why
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"torch.nn.attention.varlen unavailable: {type(e).__name__}: {e}"
        return True, ""

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        from torch.nn.attention.varlen import varlen_attn

        kwargs = varlen_causal_kwargs(varlen_attn, batch.causal)
        if batch.broadcast_q:
            q, cu_q, max_q = repeat_broadcast_q(batch)
        else:
            q, cu_q, max_q = batch.q, batch.cu_q, batch.max_q
        cu_k = batch.cu_k

        def forward(q, k, v):
            return varlen_attn(q, k, v, cu_q, cu_k, max_q, batch.max_k, **kwargs)

        return Prepared(
            fwd=lambda: forward(q, batch.k, batch.v),
            fwd_bwd=_make_fwd_bwd(forward, _leaves(q, batch.k, batch.v), grad),
            note="Q repeated B times" if batch.broadcast_q else "",
        )


# ---------------------------------------------------------------------------------------
# FlexAttention with a document mask
# ---------------------------------------------------------------------------------------

def _doc_ids(lengths: torch.Tensor, device) -> torch.Tensor:
    """Token -> sequence index for a packed batch with these (CPU) lengths."""
    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return ids.to(device=device, dtype=torch.int32)


def _offsets(lengths: torch.Tensor, device) -> torch.Tensor:
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lengths, 0)
    return cu.to(device=device, dtype=torch.int32)


def _doc_mask_mod(lengths_q: torch.Tensor, lengths_k: torch.Tensor, causal: bool, device):
    """A FlexAttention mask_mod: same document, and bottom-right causal if asked."""
    doc_q, doc_k = _doc_ids(lengths_q, device), _doc_ids(lengths_k, device)
    if not causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return doc_q[q_idx] == doc_k[kv_idx]
        return mask_mod

    off_q, off_k = _offsets(lengths_q, device), _offsets(lengths_k, device)
    shift = (lengths_k - lengths_q).to(device=device, dtype=torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        d = doc_q[q_idx]
        same = d == doc_k[kv_idx]
        visible = (kv_idx - off_k[d]) <= (q_idx - off_q[d]) + shift[d]
        return same & visible

    return mask_mod


class FlexDocMaskImpl(Impl):
    """``torch.compile(flex_attention)`` over the packed batch as one sequence with a document mask.

    Q repeated under broadcast-Q. The block mask is built once per problem (shared by the
    input copies, whose lengths are identical); its build time, after a compile warm-up,
    is reported as ``setup_ms`` and is not part of the timed callables.
    """

    name = "flex-docmask"

    def __init__(self):
        self._flex = None
        self._masks: dict = {}

    def available(self) -> tuple[bool, str]:
        ok, why = _cuda_available()
        if not ok:
            return ok, why
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"FlexAttention unavailable: {type(e).__name__}: {e}"
        return True, ""

    def clear_cache(self) -> None:
        """Forget the block masks and compiled graphs of the last problem.

        Every problem has new static shapes, and forward (no grad) and forward+backward compile
        separately; without a reset, dynamo's recompile limit is reached within one suite and
        flex_attention silently falls back to its unfused eager path.
        """
        self._masks.clear()
        self._flex = None
        torch._dynamo.reset()

    def _compiled_flex(self):
        if self._flex is None:
            from torch.nn.attention.flex_attention import flex_attention
            self._flex = torch.compile(flex_attention, dynamic=False)
        return self._flex

    def _block_mask(self, lengths_q, lengths_k, causal, device):
        """(block_mask, build_ms); build_ms is the median of 3 builds after 2 warm-up builds."""
        key = (tuple(lengths_q.tolist()), tuple(lengths_k.tolist()), causal, str(device))
        if key not in self._masks:
            from torch.nn.attention.flex_attention import create_block_mask

            mask_mod = _doc_mask_mod(lengths_q, lengths_k, causal, device)
            tq, tk = int(lengths_q.sum()), int(lengths_k.sum())
            kwargs = {"_compile": True} if "_compile" in inspect.signature(create_block_mask).parameters else {}

            def build():
                return create_block_mask(mask_mod, None, None, tq, tk, device=device, **kwargs)

            for _ in range(2):  # compile / warm up
                build()
            times = []
            for _ in range(3):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                mask = build()
                torch.cuda.synchronize(device)
                times.append((time.perf_counter() - t0) * 1e3)
            self._masks[key] = (mask, sorted(times)[1])
        return self._masks[key]

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        lengths_q = torch.full_like(batch.lengths_k, batch.Lq) if batch.broadcast_q else batch.lengths_q
        plane = float(lengths_q.sum()) * float(batch.lengths_k.sum())
        if plane > FLEX_MAX_MASK_ELEMENTS:
            raise RuntimeError(f"document block mask over {plane:.2g} token pairs exceeds "
                               f"FLEX_MAX_MASK_ELEMENTS={FLEX_MAX_MASK_ELEMENTS:.2g}")
        flex = self._compiled_flex()
        q = repeat_broadcast_q(batch)[0] if batch.broadcast_q else batch.q
        mask, build_ms = self._block_mask(lengths_q, batch.lengths_k, batch.causal, batch.q.device)

        # [T, H, D] -> [1, H, T, D], contiguous, outside the timed region.
        def to_bhtd(t):
            return t.transpose(0, 1).unsqueeze(0).contiguous()

        qf, kf, vf, gf = (to_bhtd(t) for t in (q, batch.k, batch.v, grad))

        def forward(q, k, v):
            return flex(q, k, v, block_mask=mask)

        return Prepared(
            fwd=lambda: forward(qf, kf, vf)[0].transpose(0, 1),
            fwd_bwd=_make_fwd_bwd(forward, _leaves(qf, kf, vf), gf),
            setup_ms=build_ms,
            note="Q repeated B times" if batch.broadcast_q else "",
        )


# ---------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------

IMPLS: dict[str, Callable[[], Impl]] = {
    "jfa-triton": lambda: JfaImpl("triton"),
    "jfa-tlx": lambda: JfaImpl("tlx"),
    "torch-varlen": TorchVarlenImpl,
    "flex-docmask": FlexDocMaskImpl,
}


def get_impl(name: str) -> Impl:
    """A fresh adapter by name; a ``ValueError`` lists the known names otherwise."""
    try:
        return IMPLS[name]()
    except KeyError:
        raise ValueError(f"unknown impl {name!r}; known: {', '.join(IMPLS)}") from None
