"""Mutation check: proof that the verification harness catches real kernel bugs.

Each :class:`Mutant` is one realistic bug, written as a single textual replacement in the source of
one of the kernel modules (the tile schedule, the portable forward, backward and block-sparse kernels, the
TLX kernels).
:func:`applied` makes the public op ``jfa.jagged_attention`` run the mutated kernels for the duration
of a ``with`` block; :func:`kill` runs problems (a list of :class:`jfa.fuzz.cases.Case`, or a hypothesis
strategy of them) against the mutant and says whether, and how fast, the harness noticed.

A mutant's ``find`` text must occur exactly once in the current source of its module; applying a
mutant whose text is gone or ambiguous raises :class:`MutantError`, so the list cannot silently rot
when the kernels change (the test suite applies every mutant).

How a mutant is applied (and why through temporary files): the modules are executed afresh, in
dependency order (schedule, forward, backward), from a snapshot of their current source, the target's
with the replacement applied, and registered in ``sys.modules`` (and on their parent packages) under
their real names; the API imports the launchers lazily inside its custom ops, so it picks the fresh
modules up, and modules that import names from a mutated one bind the mutated names. Triton does not
run the compiled Python function objects: the interpreter (and ``JITFunction`` on a GPU) re-reads every
``@triton.jit`` function's text with ``inspect.getsourcelines``. Compiling the mutated text under the
real file name would therefore run the UNMUTATED kernels (checked: such a mutant survives everything).
So each snapshot is written to a temporary ``.py`` file and compiled under that path; ``inspect`` then
reads exactly the text that was executed. The originals are put back on exit, also on exceptions.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import types
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

SCHEDULE = "jfa.kernels.schedule"
FORWARD = "jfa.kernels.triton.forward"
BACKWARD = "jfa.kernels.triton.backward"
BLOCK_SPARSE = "jfa.kernels.triton.block_sparse"
TLX_COMMON = "jfa.kernels.tlx.common.device"
TLX_BLACKWELL = "jfa.kernels.tlx.blackwell.forward"
TLX_BLACKWELL_BACKWARD = "jfa.kernels.tlx.blackwell.backward"
TLX_MX_TILES = "jfa.kernels.tlx.hopper.mx_tiles"
TLX_MX_PRODUCERS = "jfa.kernels.tlx.hopper.mx_producers"
TLX_DKDV_PRODUCERS = "jfa.kernels.tlx.hopper.dkdv_producers"
TLX_ITEM_RING = "jfa.kernels.tlx.hopper.item_ring"
TLX_FORWARD = "jfa.kernels.tlx.hopper.forward"
TLX_DKDV_STEPS = "jfa.kernels.tlx.hopper.dkdv_steps"
TLX_BACKWARD = "jfa.kernels.tlx.hopper.backward"
MX_ATTENTION = "jfa.kernels.triton.mx_attention"
# dependency order: each may import from the ones before it
MODULES = (SCHEDULE, FORWARD, BACKWARD, BLOCK_SPARSE, MX_ATTENTION, TLX_COMMON, TLX_BLACKWELL, TLX_MX_TILES,
           TLX_ITEM_RING, TLX_DKDV_STEPS, TLX_MX_PRODUCERS, TLX_DKDV_PRODUCERS, TLX_FORWARD, TLX_BACKWARD,
           TLX_BLACKWELL_BACKWARD)
# their mutants run on the TLX simulator
TLX_MODULES = (TLX_COMMON, TLX_MX_TILES, TLX_ITEM_RING, TLX_DKDV_STEPS, TLX_MX_PRODUCERS, TLX_DKDV_PRODUCERS,
               TLX_FORWARD, TLX_BACKWARD)


class MutantError(RuntimeError):
    """A mutant no longer fits its module's source (its text is gone or occurs more than once)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # one of MODULES
    find: str  # exact source text; must occur exactly once in the module
    replace: str
    why: str  # one line: the real-world bug it models

    def apply_to(self, source: str) -> str:
        """``source`` with the replacement made; :class:`MutantError` unless ``find`` occurs exactly once."""
        if self.module not in MODULES:
            raise MutantError(f"mutant {self.name!r}: module {self.module!r} is not one of {MODULES}")
        count = source.count(self.find)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise MutantError(
                f"mutant {self.name!r}: its find text {where} in {self.module} (it must occur exactly once); "
                f"the kernel source changed, so update the mutant in jfa/fuzz/mutants.py:\n{self.find}")
        return source.replace(self.find, self.replace, 1)

    def __str__(self) -> str:
        return self.name


MUTANTS: tuple = (
    # --- tile schedule -------------------------------------------------------------------------------
    Mutant("schedule-drops-partial-tile", SCHEDULE,
           "tiles_per_seq = (lengths + block - 1) // block",
           "tiles_per_seq = lengths // block",
           "floor instead of ceil division: the last partial tile of every sequence is never launched"),
    Mutant("schedule-searchsorted-left", SCHEDULE,
           "seq = torch.searchsorted(tile_end, slot, right=True)",
           "seq = torch.searchsorted(tile_end, slot, right=False)",
           "wrong searchsorted side: the first tile of each sequence is assigned to the previous one"),
    # --- forward -------------------------------------------------------------------------------------
    Mutant("fwd-tail-mask-off-by-one", FORWARD,
           "visible = (offs_kn < len_k)[None, :]",
           "visible = (offs_kn <= len_k)[None, :]",
           "off-by-one in the tail mask: the key one past the sequence end enters the softmax"),
    Mutant("fwd-acc-not-rescaled", FORWARD,
           "acc = dot_accumulate(acc * alpha[:, None], ",
           "acc = dot_accumulate(acc, ",
           "online softmax forgets to rescale the accumulator when the running max grows"),
    Mutant("fwd-no-empty-row-guard", FORWARD,
           "m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)",
           "m_use = m_new",
           "no guard for rows that have seen no key yet: exp2(-inf - -inf) = NaN poisons them"),
    Mutant("k-offsets-from-q", FORWARD,
           "k_row0 = tl.load(CU_K + seq).to(tl.int64)",
           "k_row0 = tl.load(CU_Q + seq).to(tl.int64)",
           "copy-paste: the K start offset is read from cu_seqlens_q (shared by forward and backward)"),
    Mutant("fwd-empty-kv-skips-write", FORWARD,
           "q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)\n",
           "q_row0, out_row0, len_q, k_row0, len_k = _seq_bounds(CU_Q, CU_K, seq, len_q_bcast, BROADCAST_Q)\n"
           "    if len_k == 0:\n"
           "        return\n",
           "early exit for an empty KV sequence leaves its out/lse rows unwritten (garbage, not 0 / -inf)"),
    Mutant("fwd-causal-top-left", FORWARD,
           "causal_shift = len_k - len_q",
           "causal_shift = 0",
           "causal mask aligned top-left instead of bottom-right (differs only when Lq != Lk)"),
    Mutant("fwd-lse-base2", FORWARD,
           ") * 0.6931471805599453, float(\"-inf\"))",
           "), float(\"-inf\"))",
           "lse returned in base 2 (the loop's log2 domain) instead of natural log"),
    Mutant("fwd-diagonal-unmasked", FORWARD,
           "m_start + causal_shift + 1",
           "m_start + BLOCK_M + causal_shift",
           "loop peeling puts the causal diagonal chunk in the unmasked bulk loop (forward and dQ pass share it)"),
    # --- backward ------------------------------------------------------------------------------------
    Mutant("bwd-dkdv-no-delta", BACKWARD,
           "ds_t = p_t * (dp_t - delta[None, :])",
           "ds_t = p_t * dp_t",
           "dS = P * (dP - delta) with the delta (rowsum dO * O) term forgotten in dK"),
    Mutant("bwd-dq-overwritten", BACKWARD,
           "dq = dot_accumulate(dq, ",
           "dq = dot_accumulate(tl.zeros_like(dq), ",
           "dq written instead of accumulated: only the last KV chunk's contribution survives"),
    Mutant("bwd-dk-no-softmax-scale", BACKWARD,
           "dk = dk * sm_scale",
           "dk = dk",
           "the chain-rule factor softmax_scale is left out of dK"),
    Mutant("bwd-dkdv-causal-start-ignores-shift", BACKWARD,
           "tl.maximum(n_start - causal_shift, 0) // BLOCK_M",
           "n_start // BLOCK_M",
           "dK/dV start at the query tile of the diagonal for Lq == Lk: skips tiles that see the keys when Lk > Lq"),
    Mutant("bwd-dkdv-full-tile-floor", BACKWARD,
           "(tl.maximum(n_start + BLOCK_N - 1 - causal_shift, 0) + BLOCK_M - 1) // BLOCK_M",
           "tl.maximum(n_start + BLOCK_N - 1 - causal_shift, 0) // BLOCK_M",
           "floor instead of ceil for the first fully visible query tile: a diagonal tile runs unmasked in dK/dV"),
    Mutant("bwd-bcastq-dq-not-summed", BACKWARD,
           ".sum(0).to(q.dtype)",
           "[0].to(q.dtype)",
           "broadcast-Q dq takes the first sequence's partial instead of the sum over the batch"),
    Mutant("bwd-lse-gradient-dropped", BACKWARD,
           "delta = delta - dlse.to(torch.float32)",
           "delta = delta",
           "the gradient reaching the returned lse is ignored by the backward"),
    Mutant("head-dim-mask-off-by-one", FORWARD,
           "mask = offs_d < HEAD_DIM",
           "mask = offs_d <= HEAD_DIM",
           "padded head dims read one element past the head (into the next head's data)"),
    # --- block-sparse (portable) ------------------------------------------------------------------------
    Mutant("sparse-bulk-bound-of-last-row", BLOCK_SPARSE,
           "full_limit = tl.minimum(len_k, tl.maximum(m_start + shift + 1, 0))",
           "full_limit = tl.minimum(len_k, tl.maximum(m_start + BLOCK_M + shift, 0))",
           "the unmasked bound taken from the sub-tile's last row: its first rows see keys past their diagonal"),
    Mutant("sparse-dkdv-skips-partly-visible-chunks", BLOCK_SPARSE,
           "live = live & (m_start + BLOCK_M - 1 + causal_shift >= n_start)",
           "live = live & (m_start + causal_shift >= n_start)",
           "dK/dV skip a query chunk whose first row misses the key tile though its later rows see it"),
    Mutant("sparse-dkdv-tail-chunk-unmasked", BLOCK_SPARSE,
           "full = m_start + BLOCK_M <= len_q\n",
           "full = m_start < len_q\n",
           "dK/dV run a sequence's last partial query chunk unmasked: rows past the sequence add to dK, dV"),
    # --- TLX forward (run on the simulator: protocol bugs show as deadlocks, races, bounds errors) --------
    Mutant("tlx-fwd-empty-wait-wrong-parity", TLX_FORWARD,
           "tlx.barrier_wait(k_empties[kv_buf], kv_phase ^ 1)\n            tlx.barrier_expect_bytes(k_fulls[kv_buf]",
           "tlx.barrier_wait(k_empties[kv_buf], kv_phase)\n            tlx.barrier_expect_bytes(k_fulls[kv_buf]",
           "the producer waits for the wrong phase of a K slot's empty barrier: a slot refilled while read"),
    Mutant("tlx-fwd-expect-bytes-off", TLX_FORWARD,
           "tlx.barrier_expect_bytes(v_fulls[kv_buf], KV_BYTES)",
           "tlx.barrier_expect_bytes(v_fulls[kv_buf], KV_BYTES // 2)",
           "expect-tx of a V block counts half its bytes: the phase completes with the copy half landed"),
    Mutant("tlx-fwd-v-released-before-pv-retired", TLX_FORWARD,
           "    acc = tlx.async_dot_wait(0, acc)\n    if TRACE_STEPS > 0:\n        _log_step(STEP_LOG, pid, CID, kv_cnt, "
           "TRACE_STEPS, t_start, t_issued, t_v, clock64())\n    tlx.barrier_arrive(v_empties[v_buf], 1)\n",
           "    tlx.barrier_arrive(v_empties[v_buf], 1)\n    acc = tlx.async_dot_wait(0, acc)\n",
           "a V buffer handed back to the producer while the PV wgmma reading it may still run"),
    Mutant("tlx-fwd-missing-q-full-wait", TLX_FORWARD,
           "        tlx.barrier_wait(q_fulls[cid * NUM_BUFFERS_Q + q_buf], q_phase)\n",
           "",
           "a consumer reads its Q tile without waiting for the TMA load to land"),
    Mutant("tlx-fwd-kv-arrive-count-off", TLX_FORWARD,
           "k_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=_CONSUMERS)",
           "k_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)",
           "a K slot's empty barrier completes on one consumer's arrival: refilled while the other still reads"),
    Mutant("tlx-fwd-pingpong-handshake-dropped", TLX_FORWARD,
           "tlx.named_barrier_arrive(BAR_TO_C0, PINGPONG_THREADS)  # lets consumer 0 issue the first QK^T",
           "pass",
           "the first pingpong turn is never handed to consumer 0: both consumers wait for each other"),
    Mutant("tlx-fwd-store-mask-dropped", TLX_FORWARD,
           "tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None])",
           "tl.store(o_ptrs, out.to(OUT.dtype.element_ty))",
           "the epilogue stores a tile's rows past its sequence: into the next sequence, or past the tensor"),
    Mutant("tlx-fwd-tail-mask-off-by-one", TLX_COMMON,
           "visible = (offs_n < len_k)[None, :]",
           "visible = (offs_n <= len_k)[None, :]",
           "off-by-one in the tail mask: the key one past the sequence (the next sequence's) enters the softmax"),
    Mutant("tlx-fwd-window-band-off-by-one", TLX_COMMON,
           "last_key = tl.minimum(offs_m + hi, len_k - 1)",
           "last_key = tl.minimum(offs_m + hi + 1, len_k - 1)",
           "off-by-one in a sliding window's right edge: one key past the band enters the softmax"),
    Mutant("tlx-fwd-window-bulk-from-first-row", TLX_FORWARD,
           "first_whole = tl.cdiv(tl.maximum(m_start + TILE_M - 1 + lo, 0), BLOCK_N)",
           "first_whole = tl.cdiv(tl.maximum(m_start + lo, 0), BLOCK_N)",
           "a window's unmasked bulk starts at the left edge of the tile's first row: later rows see keys left "
           "of their band"),
    Mutant("tlx-fwd-window-bulk-past-right-edge", TLX_FORWARD,
           "whole_end = tl.minimum(tl.maximum(m_start + c * BLOCK_M + hi + 1, 0), len_k) // BLOCK_N",
           "whole_end = tl.minimum(tl.maximum(m_start + c * BLOCK_M + hi + 1, 0), len_k) // BLOCK_N + 1",
           "a window's unmasked bulk takes one block more: the block on the band's right edge runs unmasked"),
    Mutant("tlx-fwd-gqa-key-head-of-query-head", TLX_FORWARD,
           "k_col = (head // GROUP) * col_stride_k",
           "k_col = head * col_stride_k",
           "grouped-query attention reads the key head numbered like the query head (not its group's)"),
    Mutant("tlx-fwd-item-ring-read-early", TLX_ITEM_RING,
           "    buf, phase = bufidx_phase(count, ITEM_BUFFERS)\n    tlx.barrier_wait(fulls[buf], phase)\n",
           "    buf, phase = bufidx_phase(count, ITEM_BUFFERS)\n    tlx.barrier_wait(fulls[buf], phase ^ 1)\n",
           "the consumers read a work item from the ring before the producer published it"),
    Mutant("tlx-fwd-item-ring-never-ends", TLX_FORWARD,
           "            publish_end(ring, ring_fulls, ring_empties, count, num_items, WINDOW)\n",
           "",
           "the producer never tells the consumers the items are done: they wait forever"),
    Mutant("tlx-fwd-item-ring-consumer-bulk-swapped", TLX_ITEM_RING,
           "n_bulk = _get(ring, base + F_N_BULK + cid)",
           "n_bulk = _get(ring, base + F_N_BULK + 1 - cid)",
           "each consumer takes the other's count of unmasked blocks: a causal diagonal block runs unmasked"),
    Mutant("tlx-sparse-bulk-miscounted", TLX_FORWARD,
           "for back in tl.static_range(3):",
           "for back in tl.static_range(1):",
           "block-sparse: only the last listed block counted as masked; a second diagonal block runs unmasked"),
    Mutant("tlx-wrong-sequence-offsets", TLX_COMMON,
           "k_row0 = tl.load(CU_K + s).to(tl.int32)",
           "k_row0 = tl.load(CU_Q + s).to(tl.int32)",
           "copy-paste: a work item's key rows start at its query offset"),
    Mutant("tlx-tile-list-item-skipped", TLX_COMMON,
           "return round * num_progs + lane",
           "return round * num_progs + lane + (round > 0)",
           "the static schedule skips an item of every round after the first (and runs one twice)"),
    Mutant("tlx-dynamic-item-ring-wrong-phase", TLX_COMMON,
           "    tlx.barrier_wait(item_fulls[buf], phase)\n",
           "    tlx.barrier_wait(item_fulls[buf], phase ^ 1)\n",
           "under the dynamic schedule the consumers read an item slot before the producer filled it"),
    # --- TLX backward --------------------------------------------------------------------------------------
    Mutant("tlx-bwd-ds-fence-dropped", TLX_BACKWARD,
           "    tlx.fence_async_shared()  # generic-proxy stores made visible to the readers' wgmma (async proxy)\n",
           "",
           "dS^T stored by generic stores is read by another warpgroup's wgmma (async proxy) with no fence"),
    Mutant("tlx-bwd-dq-stage-reused-early", TLX_DKDV_PRODUCERS,
           "tlx.async_descriptor_store_wait(1)  # this stage's reduce-add two steps back has read it",
           "tlx.async_descriptor_store_wait(2)",
           "a dQ stage rewritten while the TMA reduce-add of its last contents may still read it"),
    Mutant("tlx-bwd-ds-slot-released-before-dq-retired", TLX_DKDV_PRODUCERS,
           "    dq = tlx.async_dot_wait(0, dq)\n    tlx.barrier_arrive(ds_empties[buf], 1)\n",
           "    tlx.barrier_arrive(ds_empties[buf], 1)\n    dq = tlx.async_dot_wait(0, dq)\n",
           "the producer hands a dS^T slot back before its dQ MMAs reading it retired"),
    Mutant("tlx-bwd-expect-bytes-without-stats", TLX_DKDV_STEPS,
           "2 * QDO_BYTES + 2 * BLOCK_M * 4",
           "2 * QDO_BYTES",
           "a query step's expect-tx leaves out the row statistics' bytes"),
    Mutant("tlx-bwd-kv-arrive-count-off", TLX_BACKWARD,
           "kv_empties = tlx.alloc_barriers(num_barriers=_CONSUMERS * NUM_BUFFERS_KV,\n"
           "                                    arrive_count=_CONSUMERS if DQ == DQ_HALVES else 1)",
           "kv_empties = tlx.alloc_barriers(num_barriers=_CONSUMERS * NUM_BUFFERS_KV, arrive_count=1)",
           "with dQ halves a K half is read by both consumers, but one arrival hands it back"),
    Mutant("tlx-bwd-dk-store-mask-dropped", TLX_BACKWARD,
           "(dk * sm_scale).to(DK.dtype.element_ty), mask=row_ok[:, None])",
           "(dk * sm_scale).to(DK.dtype.element_ty))",
           "dK of key rows past the sequence stored: into the next sequence's rows, or past the tensor"),
    Mutant("tlx-bwd-causal-first-tile-skipped", TLX_DKDV_STEPS,
           "first = tl.minimum(tl.maximum(n_start - causal_shift, 0) // BLOCK_M, num_q_tiles)",
           "first = tl.minimum(tl.maximum(n_start - causal_shift, 0) // BLOCK_M + 1, num_q_tiles)",
           "causal dK/dV start one query tile late: the diagonal tile's rows never reach dK and dV"),
    Mutant("tlx-bwd-window-first-tile-late", TLX_DKDV_STEPS,
           "first = tl.minimum(tl.maximum(n_start - hi, 0), len_q) // BLOCK_M",
           "first = tl.minimum(tl.maximum(n_start - hi, 0) + BLOCK_M, len_q) // BLOCK_M",
           "a sliding window's dK/dV start one query tile late: the band's first rows never reach dK and dV"),
    Mutant("tlx-bwd-window-bulk-from-first-key", TLX_DKDV_STEPS,
           "tl.cdiv(tl.maximum(n_start + TILE_N - 1 - hi, 0), BLOCK_M)",
           "tl.cdiv(tl.maximum(n_start - hi, 0), BLOCK_M)",
           "a window's unmasked dK/dV steps start at the right edge of the item's first key: the tile's later "
           "keys take rows before their band"),
    Mutant("tlx-bwd-window-bulk-past-left-edge", TLX_DKDV_STEPS,
           "bulk_stop = tl.minimum(tl.maximum(n_start - lo + 1, 0) // BLOCK_M, len_q // BLOCK_M)",
           "bulk_stop = tl.minimum(tl.maximum(n_start - lo + 1, 0) // BLOCK_M + 1, len_q // BLOCK_M)",
           "a window's unmasked dK/dV steps take one query tile more: the tile on the band's left edge runs "
           "unmasked"),
    Mutant("tlx-sparse-bwd-diagonal-unmasked", TLX_DKDV_STEPS,
           "masked = masked | (m_start + causal_shift < n_start + TILE_N - 1)",
           "masked = masked | (m_start + causal_shift < n_start)",
           "block-sparse dK/dV: a step on the causal diagonal runs the unmasked step"),
    Mutant("tlx-bwd-gqa-group-not-summed", TLX_BACKWARD,
           "dK and dV summed in the accumulators\n    for g in tl.range(0, GROUP):\n",
           "dK and dV summed in the accumulators\n    for g in tl.range(0, GROUP):\n        dk = dk * 0.0\n",
           "grouped-query dK keeps the group's last query head instead of the group's sum"),
)

# MXFP8 kernels: judged by the MX bounds (jfa.fuzz.mx), not the bf16 rule, so killed by the MX fuzzer
MX_MUTANTS: tuple = (
    Mutant("mx-dv-p-unquantized", MX_ATTENTION,
           "dv = _dot_acc(dv, _mx_round(p_t, RCEIL, BLOCK_N, BLOCK_M), do_t, DOT)",
           "dv = _dot_acc(dv, p_t, do_t, DOT)",
           "dV multiplies the unquantized P: the backward is not the MX product the semantics define"),
    Mutant("mx-fwd-block-shift-dropped", MX_ATTENTION,
           "_ldexp(q, (se + shift)[:, :, None]))",
           "_ldexp(q, se[:, :, None]))",
           "P^ blocks quantized against their own maxima are not rescaled to the running maximum"),
    Mutant("mx-dq-ds-unquantized", MX_ATTENTION,
           "return _dot_acc(dq, _mx_round(ds, RCEIL, BLOCK_M, BLOCK_N), k_t, DOT)",
           "return _dot_acc(dq, ds, k_t, DOT)",
           "dQ multiplies the unquantized dS"),
)

# The TLX MXFP8 forward's own code (its producer: loads, dequantization, fences); killed by its simulator
# tests (tests/test_mx_kernels.py, test_simulator_kills), which run it against the MX oracle.
TLX_MX_MUTANTS: tuple = (
    Mutant("tlx-mx-fence-dropped", TLX_MX_TILES,
           "    tlx.local_store(tile, tl.reshape(x, [ROWS, HEAD_DIM]).to(tl.bfloat16))\n    tlx.fence_async_shared()\n\n\n"
           "@triton.jit\ndef store_token_tile",
           "    tlx.local_store(tile, tl.reshape(x, [ROWS, HEAD_DIM]).to(tl.bfloat16))\n\n\n"
           "@triton.jit\ndef store_token_tile",
           "the dequantized Q/K tiles are stored without the proxy fence: wgmma may read them before the stores land"),
    Mutant("tlx-mx-v-rows-unmasked", TLX_MX_TILES,
           "codes = tl.load(DATA + (row0 + keys).to(tl.int64)[:, None] * stride_t + cols, mask=(keys < len_k)[:, None],\n"
           "                    other=0)",
           "codes = tl.load(DATA + (row0 + keys).to(tl.int64)[:, None] * stride_t + cols)",
           "V rows past the sequence are read: the next sequence's, or past the tensor"),
    Mutant("tlx-mx-k-scales-of-query-head", TLX_MX_PRODUCERS,
           "store_dim_tile(k_tiles[kv_buf], k_codes, k_scales, BLOCK_N, HEAD_DIM)",
           "store_dim_tile(k_tiles[kv_buf], k_codes, tl.flip(k_scales, 1), BLOCK_N, HEAD_DIM)",
           "K's scales applied to the wrong 32-element blocks of D"),
)

# The TLX MXFP8 backward's own numeric bugs (its MX build of the Hopper dK/dV kernel), each killed on the simulator by
# bound (a) on one of its cases (tests/test_mx_kernels.py, ``test_simulator_kills_tlx_mx_backward_mutants``).
TLX_MX_BACKWARD_MUTANTS: tuple = (
    Mutant("tlx-mx-bwd-p-along-keys", TLX_BACKWARD,
           "_mx_round(p_t, MX == \"rceil\", BLOCK_N, BLOCK_M)",
           "tl.trans(_mx_round(tl.trans(p_t), MX == \"rceil\", BLOCK_M, BLOCK_N))",
           "dV's P quantized along keys (the forward's axis) instead of along queries"),
    Mutant("tlx-mx-bwd-dk-with-q-along-dim", TLX_BACKWARD,
           "_mx_round(ds_t, MX == \"rceil\", BLOCK_N, BLOCK_M).to(DTYPE), qt_tile, dk)",
           "_mx_round(ds_t, MX == \"rceil\", BLOCK_N, BLOCK_M).to(DTYPE), q_tile, dk)",
           "dK multiplies Q^(dim), the S operand, instead of Q quantized along queries"),
    Mutant("tlx-mx-bwd-do-scales-of-sequence-0", TLX_MX_PRODUCERS,
           "load_token_tile(DOT_, DOTS, out_row0, m_start, len_q, ob0,",
           "load_token_tile(DOT_, DOTS, out_row0, m_start, len_q, 0,",
           "dO^(queries) dequantized with the first sequence's scale rows (its block offsets dropped)"),
    Mutant("tlx-mx-bwd-ds-not-quantized", TLX_BACKWARD,
           "_mx_round(ds_t, MX == \"rceil\", BLOCK_N, BLOCK_M).to(DTYPE), qt_tile, dk)",
           "ds_t.to(DTYPE), qt_tile, dk)",
           "dS^T left unquantized (bf16) before dK += dS^T Q"),
)

# The TLX Blackwell forward's protocol bugs, each killed on the simulator (arch (10, 0)) by the Blackwell catalogue
# (``kill_blackwell_on_simulator``: its launcher called directly, so a mutant is judged on the forward alone).
BLACKWELL_MUTANTS: tuple = (
    Mutant("bw-fwd-o-read-before-pv-completes", TLX_BLACKWELL,
           "    tlx.barrier_wait(pv_dones[g], pv_cnt & 1)\n    tlx.barrier_wait(scale_fulls[g], pv_cnt & 1)\n"
           "    alpha = ",
           "    tlx.barrier_wait(scale_fulls[g], pv_cnt & 1)\n    alpha = ",
           "the correction rescales the TMEM accumulator without waiting for the PV MMA's barrier: it reads and "
           "writes O while the tensor core still accumulates into it"),
    Mutant("bw-fwd-k-slot-released-at-issue", TLX_BLACKWELL,
           "                          mBarriers=[s_fulls[g], kv_empties[k_buf]])\n",
           "                          mBarriers=[s_fulls[g]])\n            tlx.barrier_arrive(kv_empties[k_buf], 1)\n",
           "a K slot handed back to the load partition when its QK^T MMA is issued instead of when it completes: "
           "TMA refills it while the tensor core still reads it"),
    Mutant("bw-fwd-p-store-not-fenced", TLX_BLACKWELL,
           "    tlx.fence_async_shared()  # generic-proxy stores, read by the tensor core (async proxy)\n",
           "",
           "P stored to shared memory by the softmax and read by the PV MMA (async proxy) with no proxy fence"),
    Mutant("bw-fwd-s-empty-wait-wrong-parity", TLX_BLACKWELL,
           "tlx.barrier_wait(s_empties[g], s_phase ^ 1)",
           "tlx.barrier_wait(s_empties[g], s_phase)",
           "the MMA waits for the wrong phase of S's empty barrier (a consumer's parity for a producer's wait)"),
    Mutant("bw-fwd-clc-consumer-wrong-phase", TLX_BLACKWELL,
           "    claimed = tlx.clc_consumer(clc, rounds & 1)\n",
           "    claimed = tlx.clc_consumer(clc, (rounds & 1) ^ 1)\n",
           "every partition waits for the wrong phase of CLC's full barrier (a producer's parity for a consumer's "
           "wait): it reads the next work item before the try_cancel has answered"),
)

# The TLX Blackwell backward's protocol bugs, each killed on the simulator (arch (10, 0)) by the Blackwell
# catalogue through the public op (``kill_on_simulator(..., arch=(10, 0))``: the Blackwell forward, then this
# backward).
BLACKWELL_BACKWARD_MUTANTS: tuple = (
    Mutant("bw-bwd-dkdv-read-before-their-mmas-complete", TLX_BLACKWELL_BACKWARD,
           "        tlx.barrier_wait(dkdv_fulls[acc_buf], acc_phase)  # the item's last MMA has completed\n",
           "",
           "the epilogue reads dK and dV from tensor memory without waiting for the commit after the item's last "
           "MMA: the tensor core may still accumulate into them"),
    Mutant("bw-bwd-qdo-slot-released-at-issue", TLX_BLACKWELL_BACKWARD,
           "        tlx.async_dot(ds_tiles[0], q_tiles[buf], dk_tile, use_acc=use_acc, mBarriers=[qdo_empties[buf]])\n",
           "        tlx.async_dot(ds_tiles[0], q_tiles[buf], dk_tile, use_acc=use_acc)\n"
           "        tlx.barrier_arrive(qdo_empties[buf], 1)\n",
           "a Q/dO ring slot handed back to the load warp when its dK MMA is issued instead of when it completes: TMA "
           "refills Q while the tensor core still reads it"),
    Mutant("bw-bwd-dq-reduced-before-its-mma-completes", TLX_BLACKWELL_BACKWARD,
           "        tlx.barrier_wait(dq_fulls[0], cnt & 1)\n",
           "",
           "the dQ warpgroup reads dQ from tensor memory and reduce-adds it without waiting for the dQ MMA's barrier"),
    Mutant("bw-bwd-ds-store-not-fenced", TLX_BLACKWELL_BACKWARD,
           "    tlx.local_store(ds_tiles[0], ds_t.to(DTYPE))\n    tlx.fence_async_shared()\n",
           "    tlx.local_store(ds_tiles[0], ds_t.to(DTYPE))\n",
           "dS^T stored to shared memory by the compute warpgroup and read by the dK and dQ MMAs (async proxy) with "
           "no proxy fence"),
)

# The 2-CTA build of the TLX Blackwell backward (``cta_pair``): its cluster protocol's bugs, each killed on the
# simulator (``kill_on_simulator(..., arch=(10, 0), cta_pair=True)``: clusters of two CTAs run concurrently).
BLACKWELL_PAIR_BACKWARD_MUTANTS: tuple = (
    Mutant("bw-bwd-2cta-partner-barrier-skipped", TLX_BLACKWELL_BACKWARD,
           "        tlx.barrier_wait(pairs[0], cnt & 1, pred=rank % 2 == 0)\n",
           "",
           "the pair's leader issues the 2-CTA dK/dV MMA without waiting for its partner's remote arrive: the MMA "
           "reads the partner's P^T / dS^T before (or while) the partner's compute stores them"),
    Mutant("bw-bwd-2cta-commit-on-one-cta", TLX_BLACKWELL_BACKWARD,
           "        tlx.tcgen05_commit(dkdv_fulls[acc_buf], two_ctas=PAIR)\n",
           "        tlx.tcgen05_commit(dkdv_fulls[acc_buf])\n",
           "dK/dV handed to the epilogue by a 1-CTA commit: the partner's own commit (it issued no dK/dV MMA) arrives "
           "at once, and its epilogue reads dK and dV while the leader's 2-CTA MMAs still write them"),
)

# The TLX Blackwell MXFP8 build's own code (scale layouts, P's block exponents), each killed on the simulator by
# the Blackwell MX catalogue judged by bound (a) (``kill_blackwell_mx_on_simulator``).
BLACKWELL_MX_MUTANTS: tuple = (
    Mutant("bw-mx-k-scales-flipped-along-d", TLX_BLACKWELL,
           "kv_cnt = _fill_scales(ks_tiles, kvs_fulls, kv_empties, kv_cnt, scales, NUM_BUFFERS_KV)",
           "kv_cnt = _fill_scales(ks_tiles, kvs_fulls, kv_empties, kv_cnt, tl.flip(scales, 1), NUM_BUFFERS_KV)",
           "K's E8M0 scales laid out against the wrong 32-element blocks of D (the B-operand scale layout of QK^T)"),
    Mutant("bw-mx-v-scales-off-by-one-block", TLX_BLACKWELL,
           "    blocks = n_start // 32 + tl.arange(0, BLOCK_N // 32)\n    cols = tl.arange(0, HEAD_DIM)",
           "    blocks = n_start // 32 + 1 + tl.arange(0, BLOCK_N // 32)\n    cols = tl.arange(0, HEAD_DIM)",
           "V's token scales taken one 32-key block late: each key block of PV scaled by its neighbour's scale"),
    Mutant("bw-mx-p-scales-not-moved-to-running-max", TLX_BLACKWELL,
           "    e = se + shift  # the block's exponent relative to m_new",
           "    e = se",
           "P's E8M0 scales relative to each block's own maximum, not moved to the running maximum"),
    Mutant("bw-mx-qk-ignores-k-scale-barrier", TLX_BLACKWELL,
           "    if MX != \"\":\n        tlx.barrier_wait(kvs_fulls[k_buf], k_phase)\n",
           "",
           "QK^T issued once K's bytes have landed but not its scales: the MMA reads the scale slot while the "
           "correction partition still writes it (or the previous fill's scales)"),
)

# The TLX Blackwell MXFP8 backward's own code (its scale tiles, the S^T / dP^T tensor memory it shares), each killed on
# the simulator by its catalogue judged by bound (a) (tests/test_mx_kernels.py, the Blackwell MX backward's cases).
BLACKWELL_MX_BACKWARD_MUTANTS: tuple = (
    Mutant("bw-mx-bwd-do-scales-a-block-late", TLX_BLACKWELL_BACKWARD,
           "dots = _token_scales(DOTS, ob0, m_start,",
           "dots = _token_scales(DOTS, ob0 + 1, m_start,",
           "dO^(queries)'s E8M0 scales taken one 32-row query block late (dV's B operand scaled by its neighbour's)"),
    Mutant("bw-mx-bwd-p-scales-halves-swapped", TLX_BLACKWELL_BACKWARD,
           "p_scales = _join_columns(p_scales, scales, BLOCK_N, HALF // 32)",
           "p_scales = _join_columns(scales, p_scales, BLOCK_N, HALF // 32)",
           "P^T's scales laid against the wrong query blocks (the step's two halves swapped)"),
    Mutant("bw-mx-bwd-mma-ignores-qdo-scale-barrier", TLX_BLACKWELL_BACKWARD,
           "                tlx.barrier_wait(qdos_fulls[buf], phase)\n",
           "",
           "S^T, dP^T, dV and dK issued once the slot's bytes have landed but not its scales: the MMAs read the scale "
           "tiles while the scales partition still writes them"),
    Mutant("bw-mx-bwd-dp-overwrites-unread-s", TLX_BLACKWELL_BACKWARD,
           "                tlx.barrier_wait(s_empties[0], cnt & 1)  # S^T(s) is read: dP^T(s) takes its tensor memory\n",
           "",
           "dP^T issued into the tensor memory it shares with S^T before the compute has read S^T"),
)

BY_NAME = {m.name: m for m in MUTANTS}
assert len(BY_NAME) == len(MUTANTS), "mutant names must be unique"


# ----------------------------------------------------------------------------------------------------
# applying a mutant
# ----------------------------------------------------------------------------------------------------
_lock = threading.Lock()  # one mutant at a time per process: sys.modules is process-wide


def original_source(module_name: str) -> str:
    """The current on-disk source of one of :data:`MODULES` (what its loader would import now)."""
    module = sys.modules.get(module_name)
    if module is None:
        module = importlib.import_module(module_name)
    spec = module.__spec__
    source = spec.loader.get_source(module_name) if spec is not None and spec.loader is not None else None
    if source is None:
        raise MutantError(f"cannot read the source of {module_name}")
    return source


def _parent(module_name: str):
    parent_name, _, attr = module_name.rpartition(".")
    return sys.modules[parent_name], attr


_MISSING = object()


def _exec_module(module_name: str, source: str, path: str) -> types.ModuleType:
    """Write ``source`` to ``path`` and execute it as a fresh module registered under ``module_name``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)  # sets __file__ = path, __spec__, __loader__
    # registered before it runs, as the import system does (dataclasses look the module up while it runs)
    sys.modules[module_name] = module
    parent, attr = _parent(module_name)
    setattr(parent, attr, module)
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _forget_interpreted(module: types.ModuleType) -> None:
    """Drop the interpreter's cached rewrites of this module's jit functions (they pin the module)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # pragma: no cover - no interpreter in this triton
        return
    for value in list(vars(module).values()):
        if isinstance(value, InterpretedFunction):
            InterpretedFunction.rewritten_fn.pop(value.fn, None)


@contextlib.contextmanager
def applied(mutant: Mutant):
    """Within the block, ``jfa.jagged_attention`` runs the kernels with ``mutant`` (the portable ones, and the
    TLX ones wherever they run: the GPU, or the simulator).

    Yields the dict of fresh modules by name. Raises :class:`MutantError` (before touching anything)
    when the mutant does not fit the current source. Not re-entrant: one mutant at a time.
    """
    sources = {name: original_source(name) for name in MODULES}
    sources[mutant.module] = mutant.apply_to(sources[mutant.module])
    if not _lock.acquire(blocking=False):
        raise RuntimeError("jfa.fuzz.mutants.applied is not re-entrant: another mutant is applied")
    saved_modules = {name: sys.modules.get(name, _MISSING) for name in MODULES}
    saved_attrs = {}
    for name in MODULES:
        parent, attr = _parent(name)
        saved_attrs[name] = (parent, attr, getattr(parent, attr, _MISSING))
    tmpdir = tempfile.mkdtemp(prefix=f"jfa-mutant-{mutant.name}-")
    fresh = {}
    try:
        for name in MODULES:
            path = os.path.join(tmpdir, name.replace(".", "_") + ".py")  # one file a module (two are forward.py)
            fresh[name] = _exec_module(name, sources[name], path)
        yield fresh
    finally:
        for name in MODULES:
            if saved_modules[name] is _MISSING:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = saved_modules[name]
            parent, attr, value = saved_attrs[name]
            if value is _MISSING:
                if hasattr(parent, attr):
                    delattr(parent, attr)
            else:
                setattr(parent, attr, value)
        for module in fresh.values():
            _forget_interpreted(module)
        shutil.rmtree(tmpdir, ignore_errors=True)
        _lock.release()


# ----------------------------------------------------------------------------------------------------
# killing a mutant
# ----------------------------------------------------------------------------------------------------
class KillResult(NamedTuple):
    """``killed``: some problem failed the oracle rule (or raised); ``examples``: problems run up to and
    including the first failure (all of them when it survived); ``seconds``: wall time; ``detail``: the
    failing case's report (its first line names the case), or "" when the mutant survived."""

    killed: bool
    examples: int
    seconds: float
    detail: str

    @property
    def case_id(self) -> Optional[str]:
        if not self.killed:
            return None
        first = self.detail.splitlines()[0] if self.detail else ""
        return first.split("] ", 1)[-1] if first.startswith("[") else first


def _check(case, backend: str, device: str) -> Optional[str]:
    """None when ``case`` passes against the current kernels, else the failure text."""
    from jfa.fuzz.rule import run_case

    try:
        report = run_case(case, backend=backend, device=device)
    except Exception as exc:  # a crash is a detected bug too
        tail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return f"[{backend}] {case.id}\n  raised {tail}"
    return None if report.ok else str(report)


def _is_strategy(obj) -> bool:
    try:
        from hypothesis.strategies import SearchStrategy
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, SearchStrategy)


def kill(mutant: Mutant, cases_or_strategy, settings=None, *, backend: str = "triton", device: str = "cpu",
         shrink: bool = False) -> KillResult:
    """Run problems against ``mutant`` until one fails the oracle rule.

    ``cases_or_strategy``: an iterable of :class:`jfa.fuzz.cases.Case` (run in order, stopping at the first
    failing one), or a hypothesis strategy of them, run through ``@given`` under ``settings`` (a
    ``hypothesis.settings``; default: hypothesis's current profile). For a strategy, deadlines are
    switched off (interpreted kernels are slow; timing is not the verdict), the example database is not
    used (so runs are reproducible and no mutant failure is stored), and shrinking only runs with
    ``shrink=True`` (``examples`` counts up to the first failure either way).
    """
    start = time.perf_counter()
    with applied(mutant):
        if _is_strategy(cases_or_strategy):
            killed, examples, detail = _kill_with_strategy(cases_or_strategy, settings, backend, device, shrink)
        else:
            if settings is not None:
                raise TypeError("settings only apply to a hypothesis strategy, not a list of cases")
            killed, examples, detail = _kill_with_cases(cases_or_strategy, backend, device)
    return KillResult(killed, examples, time.perf_counter() - start, detail)


TLX_SENTINELS = ("tlx-many-items-causal-bf16-D64", "tlx-many-items-causal-bf16-D128", "tlx-long-items-causal-D128",
                 "tlx-long-items-D64", "tlx-tails-128-bf16-D128", "bcastq-causal-bf16-D64", "tlx-keyless-between-items",
                 "mqa-window-bcastq-causal-bf16-D128", "gqa-causal-bf16-D64", "window-both-bf16-D64",
                 "tlx-sparse-causal-lq-gt-lk-random0.6-bs128-bf16-D64", "tlx-sparse-causal-lq-lt-lk-random0.4-bs128-bf16-D128",
                 "tlx-wide-window-causal-gqa-bf16-D64", "tlx-long-causal-counter-D64")


def tlx_kill_set() -> list:
    """The TLX catalogue at the simulator's scale (``jfa.fuzz.catalog.tlx_cases("sim")``), ordered to kill
    fast: a few sentinels that reach every build and many items per CTA first, then the rest."""
    from jfa.fuzz.catalog import tlx_cases

    cases = tlx_cases("sim")
    first = [c for name in TLX_SENTINELS for c in cases if c.name.startswith(name)]
    return first + [c for c in cases if c not in first]


def kill_on_simulator(mutant: Mutant, cases: Iterable, schedules=None, sm_count: int = 3,
                      arch: tuple = (9, 0), cta_pair: bool = False) -> KillResult:
    """Run the TLX kernels with ``mutant`` on the simulator (``jfa.sim``, as an ``arch`` GPU: the Hopper or
    the Blackwell kernels) over ``cases`` (backend "tlx", CPU tensors), under each schedule in turn (default:
    the deterministic one, then seeds 1, 2, 3), until a case fails the oracle rule or the simulator reports a
    protocol error (deadlock, race, bounds). ``cta_pair``: the Blackwell backward's 2-CTA build."""
    import jfa.sim as sim

    schedules = schedules or (sim.Schedule.deterministic(), *(sim.Schedule.seeded(s) for s in (1, 2, 3)))
    start = time.perf_counter()
    cases = list(cases)
    examples = 0
    with applied(mutant):
        for schedule in schedules:
            for case in cases:
                examples += 1
                with sim.simulated(arch=arch, sm_count=sm_count, schedule=schedule, cta_pair=cta_pair):
                    failure = _check(case, "tlx", "cpu")
                if failure is not None:
                    detail = f"{failure}\n  (schedule {schedule.describe()})"
                    return KillResult(True, examples, time.perf_counter() - start, detail)
    return KillResult(False, examples, time.perf_counter() - start, "")


def kill_blackwell_on_simulator(mutant: Mutant, cases: Iterable, schedules=None, sm_count: int = 2) -> KillResult:
    """Run the TLX Blackwell forward with ``mutant`` on the simulator (arch (10, 0)) over ``cases``, its
    launcher called directly, under each schedule in turn (default: the deterministic one, then seeds 1, 2,
    3), until a case fails the oracle rule or the simulator reports a protocol error (deadlock, race,
    proxy race, bounds)."""
    import jfa.sim as sim
    from jfa.fuzz.cases import make_inputs
    from jfa.fuzz.rule import forward_verdicts, run_forward_launcher

    schedules = schedules or (sim.Schedule.deterministic(), *(sim.Schedule.seeded(s) for s in (1, 2, 3)))
    start = time.perf_counter()
    cases = list(cases)
    examples = 0
    with applied(mutant) as fresh:
        launcher = fresh[TLX_BLACKWELL].jagged_forward_blackwell
        for schedule in schedules:
            for case in cases:
                examples += 1
                inp = make_inputs(case)
                try:
                    with sim.simulated(arch=(10, 0), sm_count=sm_count, schedule=schedule):
                        out, lse = run_forward_launcher(launcher, case, inp)
                    failed = [str(v) for v in forward_verdicts(case, inp, out, lse) if not v.ok]
                except Exception as exc:  # a protocol error the simulator reports is a detected bug
                    failed = ["raised " + "".join(traceback.format_exception_only(type(exc), exc)).strip()]
                if failed:
                    detail = f"[tlx-blackwell] {case.id}\n  " + "\n  ".join(failed) + \
                        f"\n  (schedule {schedule.describe()})"
                    return KillResult(True, examples, time.perf_counter() - start, detail)
    return KillResult(False, examples, time.perf_counter() - start, "")


def kill_blackwell_mx_on_simulator(mutant: Mutant, cases: Iterable, schedules=None, sm_count: int = 2) -> KillResult:
    """Run the TLX Blackwell MXFP8 forward with ``mutant`` on the simulator over ``cases`` ((name, MXCase) pairs,
    ``jfa.fuzz.mx.blackwell_mx_cases``), its launcher called directly, under each schedule in turn (default: the
    deterministic one, then seeds 1, 2, 3), until a case fails bound (a) or the simulator reports a protocol
    error."""
    import jfa.sim as sim
    from jfa.fuzz.mx import blackwell_forward_failure

    schedules = schedules or (sim.Schedule.deterministic(), *(sim.Schedule.seeded(s) for s in (1, 2, 3)))
    start = time.perf_counter()
    cases = list(cases)
    examples = 0
    with applied(mutant) as fresh:
        launcher = fresh[TLX_BLACKWELL].mx_forward_blackwell
        for schedule in schedules:
            for name, case in cases:
                examples += 1
                try:
                    failure = blackwell_forward_failure(case, schedule, launcher, sm_count)
                except Exception as exc:  # a protocol error the simulator reports is a detected bug
                    failure = "raised " + "".join(traceback.format_exception_only(type(exc), exc)).strip()
                if failure:
                    detail = f"[tlx-blackwell-mxfp8] {name}\n  {failure}\n  (schedule {schedule.describe()})"
                    return KillResult(True, examples, time.perf_counter() - start, detail)
    return KillResult(False, examples, time.perf_counter() - start, "")


def _kill_with_cases(cases: Iterable, backend: str, device: str):
    examples = 0
    for case in cases:
        examples += 1
        failure = _check(case, backend, device)
        if failure is not None:
            return True, examples, failure
    return False, examples, ""


def _kill_with_strategy(strategy, settings, backend: str, device: str, shrink: bool):
    from hypothesis import Phase, given
    from hypothesis import settings as Settings

    base = settings if settings is not None else Settings()
    phases = tuple(p for p in base.phases if shrink or p not in (Phase.shrink, Phase.explain))
    run_settings = Settings(base, deadline=None, database=None, phases=phases)
    state = {"examples": 0, "first": None, "at": 0}

    @run_settings
    @given(strategy)
    def property_holds(case):
        if state["first"] is None:
            state["examples"] += 1
        failure = _check(case, backend, device)
        if failure is not None:
            if state["first"] is None:
                state["first"], state["at"] = failure, state["examples"]
            raise AssertionError(failure)

    try:
        property_holds()
    except Exception:
        if state["first"] is None:  # hypothesis itself failed (health check, unsatisfiable, ...)
            raise
    if state["first"] is not None:
        return True, state["at"], state["first"]
    return False, state["examples"], ""
