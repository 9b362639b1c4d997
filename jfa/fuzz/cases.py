"""Problems the harness runs: :class:`Case` (lengths, shapes, dtype, flags, value recipe) and the inputs it
makes (:func:`make_inputs`: fresh random tensors, never zeros, deterministic in the case's seed).

Shared by the test suite, the gate, the fuzzers, the catalogue and the benchmarks; judged by the rule
of :mod:`jfa.fuzz.rule`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    """One jagged attention problem. With ``broadcast_q`` the Q length is ``lengths_q[0]``."""

    lengths_q: tuple
    lengths_k: tuple
    heads: int = 2
    kv_heads: Optional[int] = None  # key/value heads (a divisor of heads: grouped-query attention); None: heads
    head_dim: int = 32
    dtype: str = "bf16"
    causal: bool = False
    broadcast_q: bool = False
    softmax_scale: Optional[float] = None
    window: tuple = (-1, -1)  # window_size=(left, right) of the call, -1 unbounded
    q_scale: float = 1.0  # multiplies Q: large values push the softmax to saturation
    values: str = "normal"  # a recipe of VALUE_RECIPES: how q, k, v are drawn
    strided: bool = False  # q/k/v are slices of one fused [T, 3, H, D] tensor
    dout_layout: str = "contiguous"  # one of DOUT_LAYOUTS: the memory layout the gradient of out arrives in
    offsets_dtype: str = "int32"
    # block-sparse attention: (rule, value, block_size), rule one of SPARSE_RULES; () is dense attention
    sparse: tuple = ()
    seed: int = 0
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or describe(self)


def describe(case: Case) -> str:
    def lens(xs):
        return ",".join(map(str, xs)) if len(xs) <= 6 else f"{len(xs)}seqs"

    heads = f"H{case.heads}" + (f"kv{case.kv_heads}" if case.kv_heads not in (None, case.heads) else "")
    bits = [f"q[{lens(case.lengths_q)}]", f"k[{lens(case.lengths_k)}]", heads, f"D{case.head_dim}", case.dtype]
    bits += [flag for flag, on in (("causal", case.causal), ("bcastq", case.broadcast_q),
                                   ("strided", case.strided)) if on]
    if case.q_scale != 1.0:
        bits.append(f"qx{case.q_scale:g}")
    if case.values != "normal":
        bits.append(case.values)
    if case.dout_layout != "contiguous":
        bits.append(f"dout-{case.dout_layout}")
    if case.softmax_scale is not None:
        bits.append(f"scale{case.softmax_scale:g}")
    if tuple(case.window) != (-1, -1):
        bits.append(f"win{case.window[0]}_{case.window[1]}")
    if case.sparse:
        rule, value, block_size = case.sparse
        bits.append(f"sparse-{rule}{value:g}-bs{block_size}")
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


# How training loops hand the gradient of out to the backward: fresh and contiguous; what out.sum().backward()
# gives (ones expanded: stride 0 everywhere); one row broadcast over the rows (stride 0 on tokens); the head
# dim not contiguous (a transposed view); a slice of a wider tensor (row stride past the head dim).
DOUT_LAYOUTS = ("contiguous", "sum", "expanded", "transposed", "sliced")


def dout_in_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """A [rows, H, D] gradient with ``values``' dtype and device in ``layout`` (DOUT_LAYOUTS); "sum" and
    "expanded" keep only what that layout can hold (all ones; the first row)."""
    rows, heads, head_dim = values.shape
    if layout == "contiguous":
        return values.contiguous()
    if layout == "sum":
        return torch.ones((), dtype=values.dtype, device=values.device).expand(rows, heads, head_dim)
    if layout == "expanded":
        first = values[:1] if rows else torch.ones(1, heads, head_dim, dtype=values.dtype, device=values.device)
        return first.expand(rows, heads, head_dim)
    if layout == "transposed":
        return values.transpose(1, 2).contiguous().transpose(1, 2)  # strides (D * H, 1, H): the head dim is not
    if layout == "sliced":
        wide = torch.zeros(rows, heads, head_dim + 3, dtype=values.dtype, device=values.device)
        wide[..., :head_dim] = values
        return wide[..., :head_dim]
    raise ValueError(f"dout_layout: unknown layout {layout!r}, expected one of {DOUT_LAYOUTS}")


VALUE_RECIPES = ("normal", "near-ties", "constant-keys", "dominant-key", "rising-keys", "denormal")


def _values(recipe: str, randn, rows: int, H: int, D: int, dtype: torch.dtype):
    """float32 q, k, v of ``rows`` tokens drawn by ``recipe`` (callers cut and cast them):

    - normal: independent N(0, 1);
    - near-ties: every key within 1e-3 of one per-head base key, so scores nearly tie;
    - constant-keys: every key equal, so each softmax row is exactly uniform;
    - dominant-key: every 7th key points along a direction all queries share, so it takes almost
      all the probability mass;
    - rising-keys: the keys climb along a direction all queries share, one step every 96 tokens (~3-4 in
      base 2 at D 64-128), so every row's running maximum grows block after block and the online
      softmax's rescale of its accumulator matters at every step;
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
    elif recipe == "rising-keys":
        q = 0.5 * q + 1.0
        steps = torch.arange(rows, dtype=torch.float32).div(96, rounding_mode="floor")
        k = k + 0.25 * steps[:, None, None]
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
    Hk = case.kv_heads or H

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    width = max(total_q, total_k)
    q, k, v = _values(case.values, randn, width, H, D, dtype)
    q[:total_q] *= case.q_scale
    k, v = k[:, :Hk], v[:, :Hk]
    if case.strided:
        # q, k, v as views into one fused projection [T, H + 2 * Hk, D] (token stride (H + 2 Hk) * D)
        fused = torch.cat([q, k, v], dim=1).to(dtype).to(device)
        q, k, v = fused[:total_q, :H], fused[:total_k, H:H + Hk], fused[:total_k, H + Hk:]
    else:
        q, k, v = (t[:n].to(dtype).to(device) for t, n in ((q, total_q), (k, total_k), (v, total_k)))
    off_dtype = torch.int64 if case.offsets_dtype == "int64" else torch.int32
    cu_q = None if case.broadcast_q else offsets(case.lengths_q, off_dtype, device)
    cu_k = offsets(case.lengths_k, off_dtype, device)
    dout = dout_in_layout(randn(rows, H, D).to(dtype).to(device), case.dout_layout)
    dlse = randn(rows, H).to(device)
    return Inputs(q, k, v, cu_q, cu_k, dout, dlse)


# How a block-sparse case gets its lists: "random": each (head, query block) lists each key block it can
# see (causal: none wholly in its future) with probability ``value``, drawn from the case's seed; "topk" and
# "ratio": jfa.select_kv_blocks with topk=value / keep_ratio=value on the case's q and k; "none": no list
# names any block (every row sees nothing).
SPARSE_RULES = ("random", "topk", "ratio", "none")


def block_lists_for(case: Case, inp: Inputs) -> tuple:
    """The exact CSR ``(offsets, indices)`` (int64, on the inputs' device) of a block-sparse case."""
    import jfa
    from jfa.kernels.block_lists import exact_csr

    rule, value, block_size = case.sparse
    device = inp.k.device
    if rule in ("topk", "ratio"):
        selection = dict(topk=int(value)) if rule == "topk" else dict(keep_ratio=float(value))
        lists = jfa.select_kv_blocks(inp.q, inp.k, inp.cu_q, inp.cu_k, block_size=block_size, causal=case.causal,
                                     broadcast_q=case.broadcast_q, **selection)
        len_q = case.lengths_q[0] if case.broadcast_q else 0
        return tuple(t.to(device) for t in exact_csr(lists, inp.cu_q, inp.cu_k, case.broadcast_q, len_q))
    if rule not in SPARSE_RULES:
        raise ValueError(f"sparse: unknown rule {rule!r}, expected one of {SPARSE_RULES}")
    rng = np.random.default_rng(case.seed)
    lengths_q = [case.lengths_q[0]] * len(case.lengths_k) if case.broadcast_q else list(case.lengths_q)
    offsets, indices = [0], []
    for _head in range(case.heads):
        for lq, lk in zip(lengths_q, case.lengths_k):
            for t in range(-(-lq // block_size)):
                visible = -(-lk // block_size)
                if case.causal:
                    last_key = min((t + 1) * block_size, lq) - 1 + lk - lq
                    visible = min(visible, last_key // block_size + 1) if last_key >= 0 else 0
                if rule == "random":
                    indices += np.nonzero(rng.random(visible) < value)[0].tolist()
                offsets.append(len(indices))
    return (torch.tensor(offsets, dtype=torch.int64, device=device),
            torch.tensor(indices, dtype=torch.int64, device=device))


def replace(case: Case, **changes) -> Case:
    return dataclasses.replace(case, **changes)
