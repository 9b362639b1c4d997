"""Adapters that turn one packed problem into timed callables, one per implementation.

An adapter has a ``name``, ``available() -> (bool, reason)``,
``applies(causal, broadcast_q, lengths_q, lengths_k) -> (bool, reason)`` and
``prepare(batch, grad) -> Prepared``. ``Prepared.fwd()`` runs the forward pass and returns
the output in the implementation's own layout; ``Prepared.packed(out)`` turns that into the
packed layout (``[total_q, H, D]``, ``[B * Lq, H, D]`` under broadcast-Q), untimed.
``Prepared.fwd_bwd()`` runs forward plus ``out.backward(grad)`` and keeps nothing alive
afterwards. Either is None where the implementation cannot do that pass.

Layout conversions and other per-problem set-up (padding, building a FlexAttention block
mask, the repeated Q of the forward-only call) happen in ``prepare``, outside the timed
callables.

Broadcast-Q: peers without it get Q repeated B times. In ``fwd_bwd`` the repeat is built from
the shared ``[Lq, H, D]`` leaf *inside* the timed autograd graph (:func:`expand_broadcast_q`),
so autograd sums the B copies of dq back into the leaf's gradient, as jfa's backward does: the
peers then do the same work (their "bwd" time includes the repeat copy and that sum). The
forward-only ``fwd`` uses a repeated Q prepared outside timing.

Nothing here imports jfa kernels or touches CUDA at import time.
"""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = [
    "PackedBatch",
    "Prepared",
    "Impl",
    "NotApplicable",
    "JfaImpl",
    "TorchVarlenImpl",
    "FlexDocMaskImpl",
    "PaddedSDPAImpl",
    "NestedSDPAImpl",
    "FA4VarlenImpl",
    "IMPLS",
    "BASELINE",
    "get_impl",
    "varlen_causal_kwargs",
    "repeat_broadcast_q",
    "expand_broadcast_q",
    "find_fa4_varlen",
]

#: Name of the implementation every other one is compared with.
BASELINE = "torch-varlen"
#: flex-docmask is skipped above this many (query, key) token pairs in the packed batch: its
#: block mask is built over the whole T_q x T_k plane. On the H200, 3.5e11 builds in well under
#: a second, while 1.2e13 (sweep L4096 s=0.1, 3.4M tokens) did not finish in 5 minutes.
FLEX_MAX_MASK_ELEMENTS = 2.5e12
#: sdpa-padded is skipped when its padded tensors (q, k, v, grad, out, dq, dk, dv and the mask)
#: would take more than this share of the free GPU memory.
PADDED_MEMORY_FRACTION = 0.5


class NotApplicable(Exception):
    """Raised by ``prepare`` for a problem the implementation does not cover (reported as n/a)."""


@dataclass
class PackedBatch:
    """Packed inputs of one problem (one copy of them, when the runner rotates copies).

    ``q`` is ``[total_q, H, D]`` or, under broadcast-Q, ``[Lq, H, D]`` with ``cu_q = None``.
    ``cu_q``/``cu_k`` are int32 on the device; ``lengths_q``/``lengths_k`` are the same
    lengths as int64 on the CPU (for set-up work that must not sync the device). Under
    broadcast-Q, ``lengths_q`` holds ``Lq`` for every sequence.
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
    window: tuple = (-1, -1)  # the API's window_size (left, right), -1 unbounded

    @property
    def B(self) -> int:
        return self.cu_k.numel() - 1

    @property
    def grouped(self) -> bool:
        """Fewer key/value heads than query heads (grouped-query attention)."""
        return self.k.shape[1] != self.q.shape[1]

    @property
    def windowed(self) -> bool:
        return tuple(self.window) not in ((-1, -1), (-1, 0))

    def plain_only(self, impl: str) -> None:
        """NotApplicable for grouped heads or a sliding window: peers benchmarked on plain attention only."""
        if self.grouped or self.windowed:
            raise NotApplicable(f"{impl} is benchmarked on equal head counts without a window")

    @property
    def Lq(self) -> int:
        """Rows of the shared Q under broadcast-Q."""
        return self.q.shape[0]


@dataclass
class Prepared:
    """Callables produced by an adapter for one batch. ``setup_ms``: untimed set-up cost.

    ``forward(*leaves)`` and ``leaves`` are the autograd graph behind ``fwd_bwd`` (kept so tests
    can inspect gradients); ``to_packed`` converts ``fwd()``'s output to packed layout (None:
    it already is packed).
    """

    fwd: Callable[[], torch.Tensor] | None
    fwd_bwd: Callable[[], None] | None
    setup_ms: float | None = None
    note: str = ""
    to_packed: Callable[[torch.Tensor], torch.Tensor] | None = None
    forward: Callable[..., torch.Tensor] | None = None
    leaves: list = field(default_factory=list)

    def packed(self, out: torch.Tensor) -> torch.Tensor:
        """``fwd()``'s output in packed layout."""
        return out if self.to_packed is None else self.to_packed(out)


def _make_fwd_bwd(forward: Callable[..., torch.Tensor], leaves: list[torch.Tensor],
                  grad: torch.Tensor) -> Callable[[], None]:
    """forward(*leaves) then backward(grad); grads are dropped so nothing survives the call."""

    def run() -> None:
        out = forward(*leaves)
        out.backward(grad)
        for t in leaves:
            t.grad = None

    return run


def _graph(forward: Callable[..., torch.Tensor], leaves: list[torch.Tensor], grad: torch.Tensor) -> dict:
    """Prepared keyword arguments for an autograd graph: fwd_bwd, forward, leaves."""
    return {"fwd_bwd": _make_fwd_bwd(forward, leaves, grad), "forward": forward, "leaves": leaves}


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh autograd leaves sharing storage with ``tensors``."""
    return [t.detach().requires_grad_(True) for t in tensors]


def repeat_broadcast_q(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Q repeated B times and ``cu_q = arange(B+1) * Lq``: the forward-only input of peers.

    Built outside timing, with no autograd history. ``fwd_bwd`` graphs use
    :func:`expand_broadcast_q` on the shared leaf instead, so dq is summed over the repeats.
    """
    q = batch.q.repeat(batch.B, 1, 1)
    cu_q = (torch.arange(batch.B + 1, device=batch.q.device, dtype=torch.int32) * batch.Lq)
    return q, cu_q, batch.Lq


def expand_broadcast_q(q: torch.Tensor, B: int, dim: int = 0) -> torch.Tensor:
    """``q`` repeated ``B`` times along ``dim`` (a copy), differentiable.

    ``[Lq, H, D] -> [B * Lq, H, D]`` for ``dim=0``. Built by ``expand`` + ``reshape`` inside the
    autograd graph, so the backward of the expand sums the B gradient blocks into ``q.grad``:
    a peer's dq is then the sum over the repeats, the same result (and work) as jfa's
    broadcast-Q backward.
    """
    shape = list(q.shape)
    e = q.unsqueeze(dim).expand(*shape[:dim], B, *shape[dim:])
    return e.reshape(*shape[:dim], B * shape[dim], *shape[dim + 1:])


def _lengths_q(batch: PackedBatch) -> torch.Tensor:
    return torch.full_like(batch.lengths_k, batch.Lq) if batch.broadcast_q else batch.lengths_q


class Impl:
    """Base adapter. Subclasses set ``name`` and implement ``available`` and ``prepare``."""

    name: str = "?"

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def applies(self, causal: bool, broadcast_q: bool, lengths_q: torch.Tensor,
                lengths_k: torch.Tensor) -> tuple[bool, str]:
        """Whether this implementation covers such a problem (``False, reason`` gives n/a)."""
        return True, ""

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        raise NotImplementedError

    def clear_cache(self) -> None:
        """Drop per-problem state (called by the runner after each problem)."""


def _cuda_available() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return True, ""


def _cuda_and_import(module: str, names: tuple, label: str) -> tuple[bool, str]:
    """A CUDA GPU, and ``from module import names`` works; else why not (named after ``label``)."""
    ok, why = _cuda_available()
    if not ok:
        return ok, why
    try:
        imported = __import__(module, fromlist=list(names))
        for name in names:
            getattr(imported, name)
    except Exception as e:  # noqa: BLE001 - report whatever broke the import
        return False, f"{label} unavailable: {type(e).__name__}: {e}"
    return True, ""


# ---------------------------------------------------------------------------------------
# jfa
# ---------------------------------------------------------------------------------------

class JfaImpl(Impl):
    """``jfa.jagged_attention`` with a fixed backend ("triton" or "tlx"; "auto" for MXFP8) and precision ("auto":
    the input dtype; "mxfp8": what the op runs for it, the operands quantized inside the call, on sm_90 the TLX
    MXFP8 forward and the backward's TLX dK/dV build beside the portable MX dQ pass, judged by docs/mxfp8.md's
    bounds in the tests, not by the bench's bf16 oracle check)."""

    def __init__(self, backend: str, precision: str = "auto"):
        self.backend = backend
        self.precision = precision
        self.name = f"jfa-{backend}" if precision == "auto" else f"jfa-{precision}"

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
                causal=batch.causal, broadcast_q=batch.broadcast_q, backend=self.backend,
                window_size=tuple(batch.window) if batch.windowed else (-1, -1), precision=self.precision)

        return Prepared(
            fwd=lambda: forward(batch.q, batch.k, batch.v),
            **_graph(forward, _leaves(batch.q, batch.k, batch.v), grad),
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


_BCAST_NOTE = "Q repeated B times (dq summed over the repeats in fwd+bwd)"


class TorchVarlenImpl(Impl):
    """PyTorch's ``varlen_attn`` (FlashAttention-2 underneath).

    Under broadcast-Q it gets Q repeated B times; in ``fwd_bwd`` the repeat is built from the
    shared leaf inside the autograd graph (:func:`expand_broadcast_q`), so its dq is the sum
    over the repeats.
    """

    name = "torch-varlen"

    def available(self) -> tuple[bool, str]:
        return _cuda_and_import("torch.nn.attention.varlen", ("varlen_attn",), "torch.nn.attention.varlen")

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        from torch.nn.attention import varlen as _varlen

        varlen_attn = _varlen.varlen_attn
        kwargs = varlen_causal_kwargs(varlen_attn, batch.causal)
        params = inspect.signature(varlen_attn).parameters
        if batch.windowed:
            if "window_size" not in params:
                raise NotApplicable("this torch's varlen_attn takes no window_size")
            kwargs = {"window_size": (batch.window[0], 0 if batch.causal else batch.window[1])}
        if batch.grouped:
            if "enable_gqa" not in params:
                raise NotApplicable("this torch's varlen_attn takes no enable_gqa")
            kwargs["enable_gqa"] = True
        cu_k, B = batch.cu_k, batch.B
        if batch.broadcast_q:
            q_rep, cu_q, max_q = repeat_broadcast_q(batch)
        else:
            q_rep, cu_q, max_q = batch.q, batch.cu_q, batch.max_q

        def attend(q, k, v):
            return varlen_attn(q, k, v, cu_q, cu_k, max_q, batch.max_k, **kwargs)

        def forward(q, k, v):
            return attend(expand_broadcast_q(q, B) if batch.broadcast_q else q, k, v)

        return Prepared(
            fwd=lambda: attend(q_rep, batch.k, batch.v),
            note=_BCAST_NOTE if batch.broadcast_q else "",
            **_graph(forward, _leaves(batch.q, batch.k, batch.v), grad),
        )


# ---------------------------------------------------------------------------------------
# FlexAttention with a document mask
# ---------------------------------------------------------------------------------------

def _doc_ids(lengths: torch.Tensor, device) -> torch.Tensor:
    """Token -> sequence index for a packed batch with these (CPU) lengths."""
    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return ids.to(device=device, dtype=torch.int32)


def _offsets(lengths: torch.Tensor, device, dtype=torch.int32) -> torch.Tensor:
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lengths, 0)
    return cu.to(device=device, dtype=dtype)


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

    Q repeated under broadcast-Q (summed dq in ``fwd_bwd``, see :func:`expand_broadcast_q`).
    The block mask is built once per problem (shared by the input copies, whose lengths are
    identical); its build time, after a compile warm-up, is reported as ``setup_ms`` and is
    not part of the timed callables.
    """

    name = "flex-docmask"

    def __init__(self):
        self._flex = None
        self._masks: dict = {}

    def available(self) -> tuple[bool, str]:
        return _cuda_and_import("torch.nn.attention.flex_attention", ("create_block_mask", "flex_attention"),
                                "FlexAttention")

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
        batch.plain_only(self.name)
        lengths_q = _lengths_q(batch)
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
        B = batch.B

        def attend(q, k, v):
            return flex(q, k, v, block_mask=mask)

        def forward(q, k, v):
            # Under broadcast-Q the leaf is the shared [1, H, Lq, D]; repeat it along the tokens.
            return attend(expand_broadcast_q(q, B, dim=2) if batch.broadcast_q else q, k, v)

        q_leaf = to_bhtd(batch.q) if batch.broadcast_q else qf
        return Prepared(
            fwd=lambda: attend(qf, kf, vf)[0].transpose(0, 1),
            setup_ms=build_ms,
            note=_BCAST_NOTE if batch.broadcast_q else "",
            **_graph(forward, _leaves(q_leaf, kf, vf), gf),
        )


# ---------------------------------------------------------------------------------------
# Padded SDPA
# ---------------------------------------------------------------------------------------

def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _pad_index(lengths: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position) of every packed row, as int64 on ``device``."""
    lengths = lengths.to(torch.long)
    b = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(int(lengths.sum())) - starts[b]
    return b.to(device), pos.to(device)


def padded_attention_mask(lengths_q: torch.Tensor, lengths_k: torch.Tensor, causal: bool,
                          lq_pad: int, lk_pad: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive SDPA mask (0 / -inf, ``dtype``) for a zero-padded batch; no row is all -inf.

    Non-causal: ``[B, 1, 1, lk_pad]``, a key padding mask (broadcast over the query rows, so it
    needs no ``[B, Lq, Lk]`` memory). Causal: ``[B, 1, lq_pad, lk_pad]``, bottom-right aligned.
    A real query row that sees no key (``Lk = 0``, or causal with ``Lq > Lk``) is pointed at the
    first padding key of its sequence: that key and its value are zero, so the row's output is
    exactly 0 and it contributes no gradient, as the jfa contract asks. Padded query rows see
    every key (their output is discarded and their incoming gradient is zero).
    """
    lq = lengths_q.to(device=device, dtype=torch.long)
    lk = lengths_k.to(device=device, dtype=torch.long)
    j = torch.arange(lk_pad, device=device)
    if not causal:
        vis = (j[None, :] < lk[:, None]) | ((lk[:, None] == 0) & (j[None, :] == 0))
        vis = vis[:, None, None, :]
    else:
        i = torch.arange(lq_pad, device=device)[None, :, None]
        jj = j[None, None, :]
        lq3, lk3 = lq[:, None, None], lk[:, None, None]
        real = i < lq3
        see = (jj < lk3) & (jj <= i + lk3 - lq3)
        blind = real & ~see.any(dim=-1, keepdim=True)
        vis = torch.where(real, see | (blind & (jj == lk3)), torch.ones_like(see))
        vis = vis[:, None]
    mask = torch.zeros(vis.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~vis, float("-inf"))


def padded_sizes(lengths_q: torch.Tensor, lengths_k: torch.Tensor, causal: bool,
                 multiple: int = 8) -> tuple[int, int]:
    """(Lq_pad, Lk_pad) of the padded batch.

    Lk_pad is rounded up to ``multiple`` (8: the memory-efficient kernel copies a mask whose
    strides are not multiples of 8), and leaves one padding column when a sequence of maximal
    key length has a query row that sees no key (its "zero key", see padded_attention_mask).
    """
    lq, lk = lengths_q.to(torch.long), lengths_k.to(torch.long)
    max_q = int(lq.max()) if lq.numel() else 0
    max_k = int(lk.max()) if lk.numel() else 0
    blind = (lq > 0) & ((lk == 0) | (torch.tensor(causal) & (lq > lk)))
    extra = int(bool((blind & (lk == max_k)).any()))
    return max(max_q, 1), _round_up(max(max_k + extra, 1), multiple)


class PaddedSDPAImpl(Impl):
    """``F.scaled_dot_product_attention`` on a zero-padded ``[B, H, Lmax, D]`` copy with a mask.

    What a framework without jagged kernels does. Padding (and the additive key padding /
    causal mask, see :func:`padded_attention_mask`) is done in ``prepare``, outside timing; the
    timed callables run SDPA on the padded tensors (torch picks the kernel: with a mask that is
    the memory-efficient one on an H200, never FlashAttention). ``to_packed`` gathers the output
    back to packed layout, also untimed. The FLOP count stays the jagged one, so padding shows
    as lower TFLOP/s. Under broadcast-Q the shared Q needs no padding; ``fwd_bwd`` repeats it
    from the leaf inside the graph (summed dq, :func:`expand_broadcast_q`). Runs on CPU too.
    """

    name = "sdpa-padded"

    def available(self) -> tuple[bool, str]:
        return _cuda_available()

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        import torch.nn.functional as F

        batch.plain_only(self.name)
        B, H, D = batch.B, batch.k.shape[1], batch.k.shape[2]
        dev, dtype = batch.k.device, batch.k.dtype
        lq, lk = _lengths_q(batch), batch.lengths_k
        if batch.broadcast_q and batch.Lq == 0:
            raise NotApplicable("broadcast-Q with an empty Q")
        lq_pad, lk_pad = padded_sizes(lq, lk, batch.causal)
        if batch.broadcast_q:
            lq_pad = batch.Lq
        if dev.type == "cuda":
            elems = B * H * D * (4 * lq_pad + 4 * lk_pad)
            mask_elems = B * lk_pad * (lq_pad if batch.causal else 1)
            need = (elems + mask_elems) * batch.k.element_size()
            free, _ = torch.cuda.mem_get_info(dev)
            if need > PADDED_MEMORY_FRACTION * free:
                raise RuntimeError(f"padded tensors need {need / 2**30:.1f} GiB, more than "
                                   f"{PADDED_MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB free")

        kb, kpos = _pad_index(lk, dev)

        def pad(x, b, pos, length):
            out = x.new_zeros((B, length, H, D))
            out[b, pos] = x
            return out

        kp, vp = pad(batch.k, kb, kpos, lk_pad), pad(batch.v, kb, kpos, lk_pad)
        if batch.broadcast_q:
            qp = repeat_broadcast_q(batch)[0].view(B, lq_pad, H, D)
            gp = grad.view(B, lq_pad, H, D)

            def to_packed(out):
                return out.transpose(1, 2).reshape(B * lq_pad, H, D)
        else:
            qb, qpos = _pad_index(lq, dev)
            qp, gp = pad(batch.q, qb, qpos, lq_pad), pad(grad, qb, qpos, lq_pad)

            def to_packed(out):
                return out.transpose(1, 2)[qb, qpos]

        mask = padded_attention_mask(lq, lk, batch.causal, lq_pad, lk_pad, dtype, dev)

        def attend(q, k, v):  # [B, L, H, D] each -> [B, H, Lq_pad, D]
            return F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)

        def forward(q, k, v):
            if batch.broadcast_q:  # the shared [Lq, H, D] leaf, repeated inside the graph
                q = expand_broadcast_q(q, B).view(B, lq_pad, H, D)
            return attend(q, k, v)

        q_leaf = batch.q if batch.broadcast_q else qp
        notes = [f"padded to Lq {lq_pad}, Lk {lk_pad}; pad/unpad not timed"]
        if batch.broadcast_q:
            notes.append(_BCAST_NOTE)
        return Prepared(
            fwd=lambda: attend(qp, kp, vp),
            to_packed=to_packed,
            note="; ".join(notes),
            **_graph(forward, _leaves(q_leaf, kp, vp), gp.transpose(1, 2)),
        )


# ---------------------------------------------------------------------------------------
# Nested-tensor (NJT) SDPA
# ---------------------------------------------------------------------------------------

class NestedSDPAImpl(Impl):
    """``F.scaled_dot_product_attention`` on nested tensors (``layout=torch.jagged``).

    The packed ``[T, H, D]`` buffers are the NJT values, so building the nested views costs no
    copy (inside the timed callables; they are views). Sequences with no query and no key are
    dropped from the offsets in ``prepare`` (they produce no rows; torch's fused NJT kernels
    reject length-0 sequences and would fall back to the per-sequence math path). Does not
    apply to causal problems, broadcast-Q, or a sequence with only one of Lq, Lk zero (see
    :meth:`applies`). Runs on CPU too (math path).
    """

    name = "sdpa-njt"

    def available(self) -> tuple[bool, str]:
        ok, why = _cuda_available()
        if not ok:
            return ok, why
        if not hasattr(torch.nested, "nested_tensor_from_jagged"):
            return False, "torch.nested.nested_tensor_from_jagged is missing in this torch"
        return True, ""

    def applies(self, causal, broadcast_q, lengths_q, lengths_k) -> tuple[bool, str]:
        if broadcast_q:
            return False, ("broadcast-Q: NJT SDPA has no shared dense Q; it would need Q repeated "
                           "into a second ragged structure, which the other peers already cover")
        if causal:
            return False, ("causal: torch's NJT SDPA passes is_causal only to its fused CUDA "
                           "kernels (its math path rejects it), and their alignment for unequal "
                           "lengths is not part of torch's contract")
        lq, lk = lengths_q.to(torch.long), lengths_k.to(torch.long)
        if bool(((lq == 0) != (lk == 0)).any()):
            return False, "a sequence with Lq = 0 xor Lk = 0: NJT's fused kernels reject length 0"
        return True, ""

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        import torch.nn.functional as F

        ok, why = self.applies(batch.causal, batch.broadcast_q, batch.lengths_q, batch.lengths_k)
        if not ok:
            raise NotApplicable(why)
        batch.plain_only(self.name)
        lq, lk = batch.lengths_q.to(torch.long), batch.lengths_k.to(torch.long)
        keep = lk > 0
        dropped = int((~keep).sum())
        lq, lk = lq[keep], lk[keep]
        dev = batch.k.device
        off_k = _offsets(lk, dev, torch.long)
        # Same offsets object for Q when the lengths agree: one ragged dimension (self-attention).
        off_q = off_k if torch.equal(lq, lk) else _offsets(lq, dev, torch.long)

        def bounds(lengths):
            return (int(lengths.min()), int(lengths.max())) if lengths.numel() else (0, 0)

        (min_q, max_q), (min_k, max_k) = bounds(lq), bounds(lk)

        def nested(x, off, lo, hi):  # [T, H, D] -> [B, H, j, D] view
            return torch.nested.nested_tensor_from_jagged(
                x, offsets=off, min_seqlen=lo, max_seqlen=hi).transpose(1, 2)

        def forward(q, k, v):
            out = F.scaled_dot_product_attention(
                nested(q, off_q, min_q, max_q), nested(k, off_k, min_k, max_k),
                nested(v, off_k, min_k, max_k))
            return out.transpose(1, 2).values()  # packed [T, H, D] view

        note = f"{dropped} empty sequences dropped from the offsets" if dropped else ""
        return Prepared(
            fwd=lambda: forward(batch.q, batch.k, batch.v),
            note=note,
            **_graph(forward, _leaves(batch.q, batch.k, batch.v), grad),
        )


# ---------------------------------------------------------------------------------------
# FlashAttention-4 (CuTe DSL) varlen
# ---------------------------------------------------------------------------------------

#: Where FA4's varlen entry point has lived: (module, attribute), tried in order.
FA4_LOCATIONS = (
    ("flash_attn.cute.interface", "flash_attn_varlen_func"),
    ("flash_attn.cute", "flash_attn_varlen_func"),
)
_FA4_REQUIRED = ("cu_seqlens_q", "cu_seqlens_k")


def find_fa4_varlen() -> tuple[Callable | None, str]:
    """(FA4's varlen function, where it was found) or (None, why it is not usable).

    Introspects instead of assuming one version: the function must take ``cu_seqlens_q`` and
    ``cu_seqlens_k`` (by name, or through ``**kwargs``).
    """
    try:
        importlib.import_module("flash_attn.cute")
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        return None, f"flash_attn.cute not importable ({type(e).__name__}: {e})"
    tried = []
    for mod_name, attr in FA4_LOCATIONS:
        try:
            fn = getattr(importlib.import_module(mod_name), attr, None)
        except Exception as e:  # noqa: BLE001
            tried.append(f"{mod_name}: {type(e).__name__}: {e}")
            continue
        if fn is None:
            tried.append(f"{mod_name}.{attr} missing")
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return fn, f"{mod_name}.{attr}"
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        missing = [n for n in _FA4_REQUIRED if n not in params]
        if missing and not has_var_kw:
            tried.append(f"{mod_name}.{attr} lacks {', '.join(missing)}")
            continue
        return fn, f"{mod_name}.{attr}"
    return None, "no FA4 varlen function: " + "; ".join(tried)


class FA4VarlenImpl(Impl):
    """FlashAttention-4's varlen function (``flash_attn.cute``), when importable.

    The entry point is found by :func:`find_fa4_varlen`; arguments are passed by keyword where
    the signature names them. A tuple result (``(out, lse)`` in FA4) is reduced to ``out``.
    Causal is FlashAttention's bottom-right alignment, the same as jfa's. Broadcast-Q: Q
    repeated, summed dq in ``fwd_bwd`` (:func:`expand_broadcast_q`). FA4 targets sm90/sm100.
    """

    name = "fa4-varlen"

    def available(self) -> tuple[bool, str]:
        fn, where = find_fa4_varlen()
        ok, why = _cuda_available()
        if fn is None:
            return False, where if ok else f"{why}; {where}"
        if not ok:
            return False, why
        major, minor = torch.cuda.get_device_capability()
        if major not in (9, 10, 11):
            return False, f"FA4 supports sm90/sm100/sm110, this GPU is sm{major}{minor}"
        return True, ""

    def prepare(self, batch: PackedBatch, grad: torch.Tensor) -> Prepared:
        fn, where = find_fa4_varlen()
        if fn is None:
            raise RuntimeError(where)
        try:
            params = inspect.signature(fn).parameters
            names = set(params)
            var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            names, var_kw = set(), True
        B = batch.B
        if batch.broadcast_q:
            q_rep, cu_q, max_q = repeat_broadcast_q(batch)
        else:
            q_rep, cu_q, max_q = batch.q, batch.cu_q, batch.max_q
        wanted = {"cu_seqlens_q": cu_q, "cu_seqlens_k": batch.cu_k,
                  "max_seqlen_q": max_q, "max_seqlen_k": batch.max_k, "causal": batch.causal}
        if batch.windowed:  # FA4 spells an unbounded side None
            left, right = batch.window
            wanted["window_size"] = (None if left < 0 else left, 0 if batch.causal else (None if right < 0 else right))
        kwargs = {n: x for n, x in wanted.items() if var_kw or n in names}
        if batch.causal and "causal" not in kwargs:
            raise NotApplicable(f"{where} takes no causal argument")
        if batch.windowed and "window_size" not in kwargs:
            raise NotApplicable(f"{where} takes no window_size")

        def attend(q, k, v):
            out = fn(q, k, v, **kwargs)
            return out[0] if isinstance(out, (tuple, list)) else out

        def forward(q, k, v):
            return attend(expand_broadcast_q(q, B) if batch.broadcast_q else q, k, v)

        return Prepared(
            fwd=lambda: attend(q_rep, batch.k, batch.v),
            note=_BCAST_NOTE if batch.broadcast_q else "",
            **_graph(forward, _leaves(batch.q, batch.k, batch.v), grad),
        )


# ---------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------

IMPLS: dict[str, Callable[[], Impl]] = {
    "jfa-triton": lambda: JfaImpl("triton"),
    "jfa-tlx": lambda: JfaImpl("tlx"),
    "jfa-mxfp8": lambda: JfaImpl("auto", "mxfp8"),
    "torch-varlen": TorchVarlenImpl,
    "flex-docmask": FlexDocMaskImpl,
    "sdpa-padded": PaddedSDPAImpl,
    "sdpa-njt": NestedSDPAImpl,
    "fa4-varlen": FA4VarlenImpl,
}


def get_impl(name: str) -> Impl:
    """A fresh adapter by name; a ``ValueError`` lists the known names otherwise."""
    try:
        return IMPLS[name]()
    except KeyError:
        raise ValueError(f"unknown impl {name!r}; known: {', '.join(IMPLS)}") from None
