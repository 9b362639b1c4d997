"""MXFP8 tensors (OCP Microscaling v1.0): E4M3 elements in blocks of 32 sharing one E8M0 scale.

:func:`quantize` runs the device quantizer (``jfa.kernels.triton.mx_quant``: compiled on CUDA, Triton's
interpreter on CPU tensors) and returns an :class:`MXTensor`; docs/mxfp8.md ("Quantizer") states the
rules. Importing this module does not import Triton (the kernel module is loaded by the first call).

Scale layout, per blocking axis (``x`` is ``[T, H, D]``):

- ``axis="dim"`` (Q and K for QK^T): block j of row (t, h) is ``x[t, h, 32j : 32j+32]``; scales are
  ``[T, H, ceil(D/32)]``. A D that is not a multiple of 32 has a zero-filled tail block.
- ``axis="tokens"`` (V and P for PV): block i of sequence b is rows ``cu[b] + 32i ..
  min(cu[b] + 32(i+1), cu[b+1])`` (a short tail block is zero-filled), one block per (h, d). Its scales
  are row ``block_offsets[b] + i`` of ``scales`` ``[rows, H, D]``, where ``block_offsets`` (``[B+1]``,
  :func:`token_block_offsets`) is the prefix sum of ``ceil(L_b/32)``. ``rows = (T + 31 B) // 32``
  (:func:`token_scale_rows`), a bound on the real count ``block_offsets[B]`` known from the shapes, so
  quantizing needs no host sync; the rows past the real count hold 0xFF (a NaN scale: a reader that
  strays past its sequence's blocks produces NaN rather than plausible numbers).

Scales are ``torch.uint8`` E8M0 bytes, not ``torch.float8_e8m0fnu``: every backend (and Triton) takes
uint8 pointers and comparisons, while float8_e8m0fnu supports few ops; :attr:`MXTensor.scales_e8m0` gives
the float8_e8m0fnu view where torch has that dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from jfa import knobs

BLOCK = 32
AXES = ("dim", "tokens")
RULES = ("floor", "rceil")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

__all__ = ["MXTensor", "quantize", "token_block_offsets", "token_scale_rows", "BLOCK", "AXES", "RULES"]


def token_block_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[B+1]`` on cu_seqlens' device and dtype, without a host sync: entry b is the scale row of
    sequence b's first token block (the prefix sum of ``ceil(L_b / 32)``); the last is the block count."""
    blocks = torch.div(cu_seqlens[1:] - cu_seqlens[:-1] + (BLOCK - 1), BLOCK, rounding_mode="floor")
    return torch.cat([cu_seqlens.new_zeros(1), torch.cumsum(blocks, 0).to(cu_seqlens.dtype)])


def token_scale_rows(num_tokens: int, num_seqs: int) -> int:
    """Scale rows a token-axis MXTensor is allocated with: ``(T + 31 B) // 32``, which bounds
    ``sum_b ceil(L_b / 32)`` (each ``ceil(L/32) = (L + 31) // 32``) and never exceeds ``T // 32 + B``."""
    return (num_tokens + (BLOCK - 1) * num_seqs) // BLOCK


def _e8m0_table(device) -> torch.Tensor:
    """fp32 value of every E8M0 byte: 2^(b-127) (b = 0 is the fp32 subnormal 2^-127), NaN for 0xFF."""
    b = torch.arange(256, dtype=torch.int32)
    bits = torch.where(b == 0, torch.tensor(0x00400000, dtype=torch.int32), b << 23)
    bits[255] = 0x7FC00000
    return bits.view(torch.float32).to(device)


@dataclass(frozen=True, eq=False)
class MXTensor:
    """An MXFP8 tensor: ``data`` ``[T, H, D]`` torch.float8_e4m3fn and ``scales`` uint8 E8M0 bytes, laid out
    per ``axis`` as the module docstring says. ``orig_dtype`` is the dtype it was quantized from (the default
    of :meth:`dequantize`); ``cu_seqlens`` and ``block_offsets`` are set for the token axis only."""

    data: torch.Tensor
    scales: torch.Tensor
    axis: str
    rule: str
    orig_dtype: torch.dtype = torch.float32
    cu_seqlens: Optional[torch.Tensor] = None
    block_offsets: Optional[torch.Tensor] = None
    block: int = field(default=BLOCK)

    def __post_init__(self):
        if self.axis not in AXES:
            raise ValueError(f"axis: must be one of {AXES}, got {self.axis!r}")
        if self.rule not in RULES:
            raise ValueError(f"rule: must be one of {RULES}, got {self.rule!r}")
        if self.block != BLOCK:
            raise ValueError(f"block: MXFP8 blocks are {BLOCK} elements, got {self.block}")
        if not isinstance(self.data, torch.Tensor) or self.data.dtype != torch.float8_e4m3fn or self.data.dim() != 3:
            raise TypeError("data: expected a 3-D torch.float8_e4m3fn tensor [T, H, D]")
        if not isinstance(self.scales, torch.Tensor) or self.scales.dtype != torch.uint8 or self.scales.dim() != 3:
            raise TypeError("scales: expected a 3-D torch.uint8 tensor of E8M0 bytes")
        T, H, D = self.data.shape
        if self.axis == "dim":
            if self.cu_seqlens is not None or self.block_offsets is not None:
                raise ValueError("cu_seqlens: only the 'tokens' axis has offsets")
            if tuple(self.scales.shape) != (T, H, -(-D // BLOCK)):
                raise ValueError(f"scales: expected shape {(T, H, -(-D // BLOCK))} for axis='dim', "
                                 f"got {tuple(self.scales.shape)}")
        else:
            if self.cu_seqlens is None or self.block_offsets is None:
                raise ValueError("cu_seqlens: the 'tokens' axis needs cu_seqlens and block_offsets")
            if self.block_offsets.shape != self.cu_seqlens.shape:
                raise ValueError("block_offsets: must have the B+1 entries of cu_seqlens")
            if tuple(self.scales.shape[1:]) != (H, D):
                raise ValueError(f"scales: expected shape [rows, {H}, {D}] for axis='tokens', "
                                 f"got {tuple(self.scales.shape)}")

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def scales_e8m0(self) -> torch.Tensor:
        """``scales`` viewed as torch.float8_e8m0fnu (the same bytes)."""
        return self.scales.view(torch.float8_e8m0fnu)

    def num_blocks(self) -> int:
        """The real number of scale rows (token axis: ``block_offsets[B]``, one device read) or of blocks per
        row (dim axis)."""
        if self.axis == "dim":
            return self.scales.shape[-1]
        return int(self.block_offsets[-1])

    def element_scales(self) -> torch.Tensor:
        """The scale byte of every element, ``[T, H, D]`` uint8 (no host sync)."""
        T, H, D = self.data.shape
        if self.axis == "dim":
            return self.scales.repeat_interleave(BLOCK, dim=-1)[..., :D]
        t = torch.arange(T, device=self.device, dtype=self.cu_seqlens.dtype)
        seq = torch.searchsorted(self.cu_seqlens, t, right=True) - 1  # the last b with cu[b] <= t
        rows = self.block_offsets[seq] + torch.div(t - self.cu_seqlens[seq], BLOCK, rounding_mode="floor")
        return self.scales[rows.long()]

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``element * 2^(scale - 127)`` as ``dtype`` (default: the dtype it was quantized from); NaN where
        the scale byte is 0xFF or the element is NaN. Exact in float32 (the product of an E4M3 value and a
        power of two in [2^-127, 2^127] that came from an fp32 input is an fp32 number), then rounded."""
        dtype = self.orig_dtype if dtype is None else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
        factor = _e8m0_table(self.device)[self.element_scales().long()]
        return (self.data.to(torch.float32) * factor).to(dtype)


# ----------------------------------------------------------------------------------------------------
# quantize
# ----------------------------------------------------------------------------------------------------
def _check_offsets(cu_seqlens, x: torch.Tensor) -> None:
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens: expected a torch.Tensor of offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens: offsets must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens: expected a 1-D tensor of B+1 >= 1 offsets, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens: must be on the same device as x ({x.device}), got {cu_seqlens.device}")
    if knobs.trust_offsets:
        return
    values = cu_seqlens.to(device="cpu", dtype=torch.int64)  # one device read (skipped under trust_offsets)
    if int(values[0]) != 0:
        raise ValueError(f"cu_seqlens: first offset must be 0, got {int(values[0])}")
    steps = values[1:] - values[:-1]
    if steps.numel() and int(steps.min()) < 0:
        b = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"cu_seqlens: offsets must be non-decreasing, but cu_seqlens[{b + 1}] < cu_seqlens[{b}]")
    if int(values[-1]) != x.shape[0]:
        raise ValueError(f"cu_seqlens: last offset must equal the token count {x.shape[0]}, got {int(values[-1])}")


def _check_device(x: torch.Tensor) -> None:
    if x.device.type == "cuda":
        return
    if x.device.type != "cpu":
        raise ValueError(f"x: the MX quantizer runs on CUDA or (interpreted) CPU tensors, got device {x.device}")
    from jfa.kernels.triton import interpreter_active

    if not interpreter_active():
        raise ValueError("x: quantizing CPU tensors needs Triton's interpreter, which is process-wide: set "
                         "TRITON_INTERPRET=1 in the environment before triton is imported (jfa's CLI and tests do)")


def quantize(x: torch.Tensor, axis: str, cu_seqlens: Optional[torch.Tensor] = None, rule: str = "floor") -> MXTensor:
    """MXFP8-quantize ``x`` ``[T, H, D]`` (fp16, bf16 or fp32, any strides) in blocks of 32 along ``axis``:
    ``"dim"`` (along D) or ``"tokens"`` (along the tokens of each sequence of ``cu_seqlens``, ``[B+1]``
    int32/int64 offsets on x's device). ``rule``: ``"floor"`` (OCP) or ``"rceil"`` (never saturates).

    Raises TypeError (not a tensor, wrong dtype) or ValueError (wrong rank, bad offsets, unknown axis or
    rule, unsupported device) naming the argument, before any kernel runs. Offset values are checked with
    one device read unless ``jfa.knobs.trust_offsets`` is set."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x: dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"x: expected shape [tokens, heads, head_dim] (3-D), got {tuple(x.shape)}")
    if not isinstance(axis, str) or axis not in AXES:
        raise ValueError(f"axis: must be one of {AXES}, got {axis!r}")
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"rule: must be one of {RULES}, got {rule!r}")
    if axis == "dim" and cu_seqlens is not None:
        raise ValueError("cu_seqlens: only axis='tokens' takes offsets; pass None with axis='dim'")
    if axis == "tokens":
        if cu_seqlens is None:
            raise ValueError("cu_seqlens: required with axis='tokens' (blocks never straddle sequences)")
        _check_offsets(cu_seqlens, x)
    _check_device(x)
    return encode(x, axis, cu_seqlens, rule)


def encode(x: torch.Tensor, axis: str, cu_seqlens: Optional[torch.Tensor], rule: str) -> MXTensor:
    """:func:`quantize` without its checks (no device read), for callers that checked ``x`` and the offsets
    already: the attention op and its kernels."""
    from jfa.kernels.triton import mx_quant

    if axis == "dim":
        data, scales = mx_quant.quantize_dim(x, rule == "rceil")
        offsets = None
    else:
        offsets = token_block_offsets(cu_seqlens)
        rows = token_scale_rows(x.shape[0], cu_seqlens.numel() - 1)
        data, scales = mx_quant.quantize_tokens(x, cu_seqlens, offsets, rows, rule == "rceil")
    return MXTensor(data=data.view(torch.float8_e4m3fn), scales=scales, axis=axis, rule=rule, orig_dtype=x.dtype,
                    cu_seqlens=cu_seqlens if axis == "tokens" else None, block_offsets=offsets)


# ----------------------------------------------------------------------------------------------------
# MXFP8 attention (docs/mxfp8.md section 2): jfa.jagged_attention(..., precision="mxfp8") runs this
# ----------------------------------------------------------------------------------------------------
KERNEL_NAME = "triton-mxfp8"  # as recording_dispatch and which_kernels name the portable MXFP8 kernels
# the TLX MXFP8 forward and backward (jfa.kernels.tlx.hopper.forward and .backward, MX builds; the backward's dQ
# is the portable MX pass)
TLX_KERNEL_NAME = "tlx-hopper-mxfp8"
# the sm_100 ones (jfa.kernels.tlx.blackwell.forward and .backward, MX builds; the backward's dQ is the portable pass)
BLACKWELL_KERNEL_NAME = "tlx-blackwell-mxfp8"
BACKWARD_KERNEL_NAMES = {"tlx": TLX_KERNEL_NAME, "tlx_blackwell": BLACKWELL_KERNEL_NAME, "triton": KERNEL_NAME}


def _launcher(name: str):
    from jfa.kernels.triton import mx_attention

    return getattr(mx_attention, name)


def _forward(q, k, v, cu_q, cu_k, backend: str, **kw):
    """(out, lse) of the MXFP8 forward on MXTensors, recorded: the TLX MX build where ``backend`` ("auto" or
    "tlx": the call resolved to TLX) allows it and it supports the call, else the portable kernel."""
    from jfa.dispatch import mx_tlx_or_portable, record

    family = mx_tlx_or_portable(backend, q, k, v, kw["window"])[0] if backend in ("auto", "tlx") else "triton"
    if family == "tlx":
        from jfa.kernels.tlx.hopper.forward import mx_forward_tlx

        out, lse = mx_forward_tlx(q, k, v, cu_q, cu_k, **kw)
        record("forward", "tlx", q.device, TLX_KERNEL_NAME)
        return out, lse
    if family == "tlx_blackwell":
        from jfa.kernels.tlx.blackwell.forward import mx_forward_blackwell

        out, lse = mx_forward_blackwell(q, k, v, cu_q, cu_k, **kw)
        record("forward", "tlx_blackwell", q.device, BLACKWELL_KERNEL_NAME)
        return out, lse
    out, lse = _launcher("mx_forward")(q, k, v, cu_q, cu_k, **kw)
    record("forward", "triton", q.device, KERNEL_NAME)
    return out, lse


class _EagerMXAttention(torch.autograd.Function):
    """The MXFP8 forward on q, k, v quantized here, and the straight-through backward of section 2 (each of
    its products quantized from the saved high-precision q, k, v, dout)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, rule, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window,
                backend):
        out, lse = _forward(
            encode(q, "dim", None, rule), encode(k, "dim", None, rule), encode(v, "tokens", cu_k, rule), cu_q, cu_k,
            backend, causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q, num_seqs=num_seqs,
            len_q_bcast=len_q_bcast, window=window, rule=rule, out_dtype=q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (rule, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window, backend)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        from jfa.dispatch import last_dim_contiguous, mx_backward_tlx_or_portable, record

        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        rule, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, window, backend = ctx.args
        dout = last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
        family = mx_backward_tlx_or_portable(backend, q, k, v, window)[0]
        if family == "tlx":
            from jfa.kernels.tlx.hopper.backward import mx_backward_tlx as launcher
        elif family == "tlx_blackwell":
            from jfa.kernels.tlx.blackwell.backward import mx_backward_blackwell as launcher
        else:
            launcher = _launcher("mx_backward")
        dq, dk, dv = launcher(
            q, k, v, out, lse, dout, cu_q, cu_k, causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q,
            num_seqs=num_seqs, len_q_bcast=len_q_bcast, window=window, rule=rule,
            dlse=None if dlse is None else dlse.contiguous())
        record("backward", family, q.device, BACKWARD_KERNEL_NAMES[family])
        return dq, dk, dv, *(None,) * 10


def mx_attention(q, k, v, cu_q, cu_k, *, rule: str, causal: bool, softmax_scale: float, broadcast_q: bool,
                 num_seqs: int, len_q_bcast: int, window, backend: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of section 2 for checked arguments: q, k, v high-precision tensors (quantized here,
    differentiable) or MXTensors (q, k along ``dim``, v along ``tokens`` by ``cu_k``; forward only).
    ``backend``: "triton" (the portable kernels), or "auto" / "tlx" for the TLX MXFP8 forward where it
    supports the call ("auto" falls back to the portable one, "tlx" raises) and the TLX MXFP8 backward where it
    supports it (else the portable one, whatever the backend: ``dispatch.mx_backward_tlx_or_portable``)."""
    if isinstance(q, MXTensor):
        if v.cu_seqlens is not cu_k and not (v.cu_seqlens.shape == cu_k.shape and torch.equal(
                v.cu_seqlens.to(cu_k.dtype), cu_k)):
            raise ValueError("v: an MXTensor quantized along the tokens of other offsets than cu_seqlens_k "
                             "(its blocks must be the call's key sequences)")
        return _forward(q, k, v, cu_q, cu_k, backend, causal=causal, softmax_scale=softmax_scale,
                        broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, window=window,
                        rule=rule, out_dtype=q.orig_dtype)
    return _EagerMXAttention.apply(q, k, v, cu_q, cu_k, rule, causal, softmax_scale, broadcast_q, num_seqs,
                                   len_q_bcast, window, backend)
