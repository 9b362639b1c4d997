"""The dK/dV kernels' work items and query steps, shared by the Hopper (``hopper.backward``) and Blackwell
(``blackwell.backward``) dK/dV kernels: what an item is (``dkdv_item``), the order its query steps run in
(``step_order``, ``step_tile``), the producer's load of one step (``load_qdo_step``), the staged dQ
reduce-add (``stage_dq``, ``send_staged_dq``) and the Hopper profiling build's record of an item (``stamp``)."""
import triton
import triton.language as tl

from jfa.kernels.bands import band_offsets
from jfa.kernels.tlx.common.device import (bufidx_phase, item_sequence, item_slot_head, record_stamp,
                                           safe_sequence)
from jfa.kernels.tlx.common.host import tlx


@triton.jit
def dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr,
              TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, g=0, GROUP: tl.constexpr = 1):
    """What producer and consumers need about work item ``item`` (computed identically by both).

    Items are (key tile, key/value head) over ``num_heads // GROUP`` key/value heads; ``head`` is query head
    ``g`` of the item's group (``num_heads``: the query heads). With GROUP 1 an item is (key tile, head).

    Returns (head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, n_masked_lead,
    bulk_end, num_q_tiles, lo, hi): query steps run over tiles [first, num_q_tiles); the first
    ``n_masked_lead`` of them straddle the causal diagonal, tiles [first + n_masked_lead, bulk_end)
    are fully visible, the rest (without a window at most one: the sequence's partial last tile) masked
    again. With WINDOW, (lo, hi) is the band (query i sees key j iff lo <= j - i <= hi:
    ``jfa.kernels.bands``), the steps cover the query tiles that see any of the tile's keys, the masked
    lead and tail are the band's two edges and the bulk the tiles that see every key of the tile.

    SPARSE (block-sparse attention, blocks of TILE_N rows; TILES' third row holds each slot's key block):
    the steps are the BLOCK_M-row query tiles of the query blocks that list the item's key block, the
    transposed lists' entries COL_OFF[col] .. COL_OFF[col + 1] (``step_tile``); ``first`` is then that first
    entry, ``bulk_end`` equals it and ``num_q_tiles`` is it plus the step count, so that every step is in
    the masked loop, which decides per step which of the two steps it runs (``sparse_step_masked``)."""
    kv_head, tile, q_row0, out_row0, len_q, k_row0, len_k = item_sequence(
        TILES, CU_Q, CU_K, item, num_slots, num_heads // GROUP, num_seqs, len_q_bcast, BROADCAST_Q, SPARSE)
    head = kv_head * GROUP + g
    n_start = tile * TILE_N
    causal_shift = len_k - len_q  # query i sees key j iff j <= i + shift (bottom-right)
    num_q_tiles = tl.cdiv(len_q, BLOCK_M)
    lo, hi = 0, 0  # (Python ints: folded away where there is no window)
    if SPARSE:
        slot, _kv_head = item_slot_head(item, num_slots, num_heads // GROUP, SPARSE)
        col = head * num_slots + tl.load(TILES + (slot + 2 * num_slots))
        first = tl.load(COL_OFF + col)
        n_listed = tl.where(len_k > 0, tl.load(COL_OFF + col + 1) - first, 0)
        num_q_tiles = first + n_listed * (TILE_N // BLOCK_M)
        diag_end = first
        bulk_end = first
    elif WINDOW:
        lo, hi = band_offsets(len_q, len_k, band_lo, band_hi)
        key_end = tl.minimum(n_start + TILE_N, len_k)
        # query rows [n_start - hi, key_end - lo) see some key of the tile
        first = tl.minimum(tl.maximum(n_start - hi, 0), len_q) // BLOCK_M
        num_q_tiles = tl.maximum(tl.cdiv(tl.minimum(tl.maximum(key_end - lo, 0), len_q), BLOCK_M), first)
        # a whole query tile sees every key of a whole key tile iff its rows lie in
        # [n_start + TILE_N - 1 - hi, n_start - lo]: those tiles are the bulk, the band's edges around it masked
        # (the numerators clamped at 0: integer division of a negative number rounds differently per backend)
        diag_end = tl.minimum(tl.maximum(tl.cdiv(tl.maximum(n_start + TILE_N - 1 - hi, 0), BLOCK_M), first),
                              num_q_tiles)
        bulk_stop = tl.minimum(tl.maximum(n_start - lo + 1, 0) // BLOCK_M, len_q // BLOCK_M)
        bulk_stop = tl.where(n_start + TILE_N <= len_k, bulk_stop, 0)  # a partial key tile: every step masked
        bulk_end = tl.minimum(tl.maximum(bulk_stop, diag_end), num_q_tiles)
    else:
        if CAUSAL:
            first = tl.minimum(tl.maximum(n_start - causal_shift, 0) // BLOCK_M, num_q_tiles)
            first_full = tl.cdiv(tl.maximum(n_start + TILE_N - 1 - causal_shift, 0), BLOCK_M)
            diag_end = tl.maximum(first, tl.minimum(first_full, num_q_tiles))
        else:
            first = tl.zeros((), dtype=tl.int32)
            diag_end = first
        bulk_end = tl.maximum(diag_end, len_q // BLOCK_M)
    return (head, q_row0, out_row0, len_q, k_row0, len_k, n_start, causal_shift, first, diag_end - first,
            bulk_end, num_q_tiles, lo, hi)


@triton.jit
def aligned_column(TILES, STATS_CU, item, num_slots, num_heads, num_seqs, SPARSE: tl.constexpr):
    """The first column of work item ``item``'s sequence in the column-aligned tensors (the row
    statistics: ``row_stats.aligned_columns``); a multiple of its COLUMN_ALIGN."""
    slot, _head = item_slot_head(item, num_slots, num_heads, SPARSE)
    seq, _valid = safe_sequence(tl.load(TILES + slot), num_seqs)
    return tl.load(STATS_CU + seq).to(tl.int32)


@triton.jit
def step_order(s, first, n_lead, n_masked, bulk_end):
    """Query tile of the s-th step of an item, in the order producer and consumers share: the masked
    steps first (the causal diagonal tiles, then the sequence's partial last tile), the fully visible
    bulk after them. The consumer then runs two loops (masked, bulk) instead of three: one inlined copy
    of the step less (registers)."""
    masked_tile = tl.where(s < n_lead, first + s, bulk_end + s - n_lead)
    return tl.where(s < n_masked, masked_tile, first + n_lead + s - n_masked)


@triton.jit
def step_tile(s, first, n_lead, n_masked, bulk_end, Q_IDX, SPARSE: tl.constexpr, SUB: tl.constexpr):
    """Query tile of the s-th step of an item: ``step_order``, or with SPARSE sub-tile ``s % SUB`` of the
    (s // SUB)-th listed query block (``first``: the item's first entry of the transposed lists)."""
    if SPARSE:
        block = s // SUB
        return tl.load(Q_IDX + first + block) * SUB + (s - block * SUB)  # (no % : a loop index may be an int)
    return step_order(s, first, n_lead, n_masked, bulk_end)


@triton.jit
def sparse_step_masked(m_start, n_start, len_q, causal_shift, every_step, CAUSAL: tl.constexpr,
                       TILE_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Whether a block-sparse step needs the masked step: its rows reach past the sequence, or (causal)
    some row misses some key of the tile, or ``every_step`` (the consumer's keys reach past the sequence
    in a fused-dQ build)."""
    masked = (m_start + BLOCK_M > len_q) | every_step
    if CAUSAL:
        masked = masked | (m_start + causal_shift < n_start + TILE_N - 1)
    return masked


@triton.jit
def load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, qdo_ring, head, q_row0, out_row0, stats_col0, first,
                  n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, Q_IDX, SPARSE: tl.constexpr,
                  SUB: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, QDO_BYTES: tl.constexpr):
    """Producer: the j-th step's query tile (Q, dO and its row statistics) into the next slot of ``qdo_ring``
    (``jagged_dkdv_tlx_kernel``'s)."""
    q_tiles, do_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties = qdo_ring
    i = step_tile(j, first, n_lead, n_masked, bulk_end, Q_IDX, SPARSE, SUB)
    buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
    tlx.barrier_wait(qdo_empties[buf], phase ^ 1)
    tlx.barrier_expect_bytes(qdo_fulls[buf], 2 * QDO_BYTES + 2 * BLOCK_M * 4)
    o_row = out_row0 + i * BLOCK_M
    tlx.async_descriptor_load(desc_q, q_tiles[buf], [q_row0 + i * BLOCK_M, head * col_stride_q], qdo_fulls[buf])
    tlx.async_descriptor_load(desc_do, do_tiles[buf], [o_row, head * col_stride_do], qdo_fulls[buf])
    stats_col = stats_col0 + i * BLOCK_M
    tlx.async_descriptor_load(desc_stats, lse_tiles[buf], [head, stats_col], qdo_fulls[buf])
    tlx.async_descriptor_load(desc_stats, delta_tiles[buf], [num_heads + head, stats_col], qdo_fulls[buf])
    return qdo_cnt + 1


@triton.jit
def stage_dq(dq_stage, dq, sm_scale, TRANSPOSED: tl.constexpr):
    """A step's dQ (times the softmax scale) into its fp32 stage. TRANSPOSED: ``dq`` is dQ^T and is
    stored transposed, so that the stage (and the accumulator) stays shaped like q: each thread then
    writes 4-byte words of eight query rows, which the stage's 128-byte swizzle spreads over all 32
    banks (one wavefront per store)."""
    if TRANSPOSED:
        tlx.local_store(tlx.local_trans(dq_stage), dq * sm_scale)
    else:
        tlx.local_store(dq_stage, dq * sm_scale)


@triton.jit
def send_staged_dq(dq_stage, desc_dq, dq_row, dq_col, BARRIER: tl.constexpr = 0):
    """The second half of a staged reduction sent a step late: fence the stage's stores (issued a step
    ago, so the fence no longer waits for them to drain through shared memory, which the consumers'
    wgmma keep busy) and reduce-add it at (``dq_row``, ``dq_col``)."""
    tlx.fence_async_shared()
    # every thread of the writing warpgroup fenced its own stores before the elected one issues the
    # reduce-add. Named barrier 0 with 128 threads is the producer warpgroup's own (Triton's, as the PTX
    # shows); the consumers pass their own.
    tlx.named_barrier_wait(BARRIER, 128)
    tlx.async_descriptor_store(desc_dq, dq_stage, [dq_row, dq_col], store_reduce="add")


# The Hopper dK/dV kernel's profiling build: one record of int64 fields per work item (read by
# ``jfa.bench.timeline.item_phases``). Consumer 0 writes the SM, the start on the global timer (ns), then in SM
# cycles the start, K and V ready, the last step done and the dK/dV stores done, the CTA and the query steps the
# item took; the producer, on the same SM's clock, its start of the item, its K and V loads issued (the item
# decoded and its K/V tiles free), its last Q/dO load issued and its end (with the producer's dQ: the dQ of the
# steps still behind the loads); last, consumer 0's item decoded (before its wait for K and V) and the CTA's query
# steps before the item ("first_step"). The kernel writes the CTA's count after the item into "steps" (a store
# with no load on the consumers' path between items); its launcher turns that into the item's own steps.
PROFILE_FIELDS = ("sm", "start_ns", "start", "kv_ready", "steps_done", "end", "cta", "steps",
                  "producer_start", "kv_issued", "loads_done", "producer_end", "decoded", "first_step")
# the fields' indices, as the kernels name them
(REC_SM, REC_START_NS, REC_START, REC_KV_READY, REC_STEPS_DONE, REC_END, REC_CTA, REC_STEPS, REC_PRODUCER_START,
 REC_KV_ISSUED, REC_LOADS_DONE, REC_PRODUCER_END, REC_DECODED, REC_FIRST_STEP) = (
    tl.constexpr(i) for i in range(len(PROFILE_FIELDS)))
_RECORD = tl.constexpr(len(PROFILE_FIELDS))


@triton.jit
def stamp(TIMELINE, item, FIELD: tl.constexpr, value):
    """Field FIELD (a ``REC_`` index of PROFILE_FIELDS) of ``item``'s record (``record_stamp``)."""
    record_stamp(TIMELINE, item, FIELD, value, _RECORD)
