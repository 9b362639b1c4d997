"""Block-sparse jagged attention (DESIGN.md section 10): the op, its selection and their dispatch.

``block_sparse_attention`` runs attention restricted to per-query-block lists of key blocks, made by
``select_kv_blocks`` (a keep ratio or top-k over pooled scores) or given by the caller (CSR, checked
before any kernel). Like ``jfa.jagged_attention``, the kernels are custom ops with fake kernels
(``torch.compile`` traces them) and an eager ``torch.autograd.Function`` twin.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

import torch

from jfa.plans import call_key, plans
from jfa.dispatch import (Problem, last_dim_contiguous, launcher,
                          log_fallback_once, record, resolve_backend, tlx_or_fallback, traced, validate)

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


def check_block_size(block_size) -> int:
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
    if not traced(q, k):
        return _run_select(q, k, cu_q, cu_k, block_size, topk, keep_ratio, causal, broadcast_q, problem.len_q_bcast,
                           longest_k)
    from jfa.kernels.block_lists import BlockLists
    from jfa.kernels.schedule import num_tile_slots

    offsets, indices = _select_op(q, k, cu_q, cu_k, block_size, topk or 0, float(keep_ratio or 0.0), causal,
                                  broadcast_q, problem.len_q_bcast, longest_k)
    rows = problem.num_seqs * problem.len_q_bcast if broadcast_q else q.shape[0]
    return BlockLists(offsets, indices, block_size, q.shape[1], num_tile_slots(rows, problem.num_seqs, block_size),
                      causal)


def sparse_backend(backend: str, q, k, v, block_size: int) -> tuple[str, str]:
    """("tlx", "triton" or "torch", why not TLX) for a block-sparse call: the TLX forward where it takes the
    call (sm_90, bf16/fp16, D 64/128, blocks of 128), else the portable kernels; an explicit 'tlx' that
    cannot run raises."""
    resolved = resolve_backend(backend, q.device)
    if resolved != "tlx":
        return resolved, ""
    from jfa.kernels.tlx.hopper.forward import sparse_supports

    return tlx_or_fallback(backend, *sparse_supports(last_dim_contiguous(q), last_dim_contiguous(k),
                                                     last_dim_contiguous(v), block_size), "block-sparse call")


def _validate_sparse(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, *, causal, softmax_scale, broadcast_q,
                     return_lse, backend, block_size, deterministic=False):
    """The dense op's checks (the same rules and messages) with the backend for block-sparse kernels, and the
    longest key sequence (the selection's capacity bound)."""
    check_block_size(block_size)
    problem = validate(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                       broadcast_q=broadcast_q, deterministic=deterministic, precision="auto",
                       backend="auto" if backend == "tlx" else backend, return_lse=return_lse)
    if problem.backend != "torch" or backend == "tlx":
        problem = dataclasses.replace(problem, backend=sparse_backend(backend, q, k, v, block_size)[0])
    return problem, problem.longest_k


def _run_sparse_forward(backend, q, k, v, cu_q, cu_k, offsets, indices, block_size, num_q_slots, causal,
                        softmax_scale, broadcast_q, num_seqs, len_q_bcast, deterministic, plan=None):
    """(out, lse) of ``backend``'s block-sparse forward. ``plan``: the call's plan (``jfa.plans``), for the
    launchers that keep a prepared launch in it (the TLX one)."""
    from jfa.kernels.block_lists import BlockLists

    lists = BlockLists(offsets, indices, block_size, q.shape[1], num_q_slots, causal)
    planned = {"plan": plan} if plan is not None and backend == "tlx" else {}
    result = launcher(*_SPARSE_LAUNCHERS[backend][0])(q, k, v, cu_q, cu_k, lists, causal=causal,
                                                       softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                                       num_seqs=num_seqs, len_q_bcast=len_q_bcast, **planned)
    record("forward", backend, q.device, SPARSE_KERNEL_NAMES[backend][0])
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
            return "tlx", launcher(*_SPARSE_LAUNCHERS["tlx"][1]), dout
        log_fallback_once("jfa: TLX block-sparse backward not used, running the portable Triton backward: %s",
                           reason)
    return "triton", launcher(*_SPARSE_LAUNCHERS["triton"][1]), dout


def _run_sparse_backward(backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices, block_size,
                         num_q_slots, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast, deterministic):
    from jfa.kernels.block_lists import BlockLists

    lists = BlockLists(offsets, indices, block_size, q.shape[1], num_q_slots, causal)
    chosen, launch, dout = _sparse_backward_launcher(backend, q, k, v, dout, block_size)
    grads = launch(q, k, v, out, lse, dout, cu_q, cu_k, lists, causal=causal, softmax_scale=softmax_scale,
                   broadcast_q=broadcast_q, num_seqs=num_seqs, len_q_bcast=len_q_bcast, dlse=dlse,
                   deterministic=deterministic)
    record("backward", chosen, q.device, SPARSE_KERNEL_NAMES[chosen][1])
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
        dout = last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
        grads = backward_op(q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices, *ctx.args)
        return tuple(grads) + (None,) * 12

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op


_SPARSE_OPS = {"triton": _sparse_ops("triton"), "tlx": _sparse_ops("tlx")}


class _EagerSparseAttention(torch.autograd.Function):
    """The sparse custom ops' eager twin (as ``_EagerAttention`` is the dense ones')."""

    @staticmethod
    def forward(ctx, backend, plan, q, k, v, cu_q, cu_k, offsets, indices, *args):
        out, lse = _run_sparse_forward(backend, q, k, v, cu_q, cu_k, offsets, indices, *args, plan=plan)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, offsets, indices)
        ctx.args, ctx.backend = args, backend
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, offsets, indices = ctx.saved_tensors
        dout = last_dim_contiguous(torch.zeros_like(out) if dout is None else dout)
        grads = _run_sparse_backward(ctx.backend, q, k, v, out, lse, dout, dlse, cu_q, cu_k, offsets, indices,
                                     *ctx.args)
        return (None, None, *grads) + (None,) * 12


def _sparse_attention(backend, q, k, v, cu_q, cu_k, lists, causal, softmax_scale, broadcast_q, num_seqs, len_q_bcast,
                      deterministic, plan=None):
    """(out, lse) of ``backend``'s block-sparse kernels over ``lists``, differentiable in q, k, v: the custom ops
    when a tracer sees the call, the forward alone when nothing needs a gradient, else the eager Function."""
    args = (q, k, v, cu_q, cu_k, lists.offsets, lists.indices, lists.block_size, lists.num_q_slots, causal,
            softmax_scale, broadcast_q, num_seqs, len_q_bcast, deterministic)
    if traced(q, k, v):
        return _SPARSE_OPS[backend](*args)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return _run_sparse_forward(backend, *args, plan=plan)
    return _EagerSparseAttention.apply(backend, plan, *args)


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
    # a call with a selection rule whose structure passed every check before (jfa.plans): the selection and
    # the kernels run on this call's values, nothing is checked again (lists given by the caller are checked
    # every call: their values are the caller's)
    key = call_key(q, k, v, cu_seqlens_q, cu_seqlens_k, (
        "block_sparse", max_seqlen_q, max_seqlen_k, causal, softmax_scale, broadcast_q, deterministic, backend,
        return_lse, block_size, keep_ratio, topk)) if kv_blocks is None else None
    offsets = (cu_seqlens_q, cu_seqlens_k)
    plan = plans.get(key, offsets)
    if plan is not None:
        kernels, scale, num_seqs, len_q_bcast, longest_k = plan.problem
        lists = _run_select(q, k, cu_seqlens_q, cu_seqlens_k, block_size, topk, keep_ratio, causal, broadcast_q,
                            len_q_bcast, longest_k)
        out, lse = _sparse_attention(kernels, q, k, v, cu_seqlens_q, cu_seqlens_k, lists, causal, scale, broadcast_q,
                                     num_seqs, len_q_bcast, deterministic, plan)
        return (out, lse) if return_lse else out
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
        record("forward", "torch", q.device)
    else:
        # (not for a copied input: the key names the original)
        if kv_blocks is None and problem.q is q and problem.k is k and problem.v is v:
            plan = plans.make(key, offsets, (problem.backend, problem.softmax_scale, problem.num_seqs,
                                             problem.len_q_bcast, longest_k))
        out, lse = _sparse_attention(problem.backend, problem.q, problem.k, problem.v, cu_seqlens_q, cu_seqlens_k,
                                     lists, causal, problem.softmax_scale, broadcast_q, problem.num_seqs,
                                     problem.len_q_bcast, deterministic, plan)
    return (out, lse) if return_lse else out

