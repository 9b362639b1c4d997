"""The Hopper dK/dV kernel's producer (``jfa.kernels.tlx.hopper.backward``, the bf16/fp16 builds; the MXFP8
builds' is ``mx_producers.produce_dkdv_item_mx``): one work item's TMA loads of K and V, each query step's Q, dO
and row statistics, and with the producer's dQ (``dq="producer"``) each step's dQ from the consumers' dS^T and its
TMA reduce-add. With two K/V slot pairs (``BackwardVariant.item_prefetch``) the producer starts the CTA's next item
(its K and V, its first query tiles) while this item's last steps run."""
import triton
import triton.language as tl

from jfa.kernels.tlx.common.device import bufidx_phase, clock64, fetch_item, static_item
from jfa.kernels.tlx.common.host import tlx
from jfa.kernels.tlx.hopper.dkdv_steps import (REC_KV_ISSUED, REC_LOADS_DONE, REC_PRODUCER_END, REC_PRODUCER_START,
                                                aligned_column, dkdv_item, load_qdo_step, send_staged_dq, stage_dq,
                                                stamp, step_tile)


@triton.jit
def producer_dq_step(s, ds_cnt, staged_row, k_tiles, kv_slot, ds_ring, desc_dq,
                     dq_row0, dq_col, first, n_lead, n_masked, bulk_end, sm_scale, Q_IDX, SPARSE: tl.constexpr,
                     SUB: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                     CONSUMERS: tl.constexpr):
    """Producer (``dq="producer"``), step s of the item: once both consumers have stored their dS^T, dQ
    over all TILE_N keys (two MMAs, one accumulator), the dS^T slot handed back, the previous step's
    stage sent (``send_staged_dq``) while the MMAs run, and this step's dQ stored to its stage; the
    item's last stage is sent after its loop. ``ds_cnt``: the item's first step's count plus s (the dS^T
    slot and the stage follow it); ``staged_row``: the previous step's row; ``kv_slot``: the item's first K
    tile in ``k_tiles``; ``ds_ring``: the kernel's dS^T slots and dQ stages. Returns this step's row."""
    ds_tiles, ds_fulls, ds_empties, dq_stages = ds_ring
    m_start = step_tile(s, first, n_lead, n_masked, bulk_end, Q_IDX, SPARSE, SUB) * BLOCK_M
    buf, phase = bufidx_phase(ds_cnt, NUM_BUFFERS_DS)
    tlx.barrier_wait(ds_fulls[buf], phase)
    dq = tlx.async_dot(tlx.local_trans(ds_tiles[buf * CONSUMERS]), k_tiles[kv_slot])
    dq = tlx.async_dot(tlx.local_trans(ds_tiles[buf * CONSUMERS + 1]), k_tiles[kv_slot + 1], dq)
    if s > 0:  # the previous step's stage (the other one), stored a whole step ago
        send_staged_dq(dq_stages[(ds_cnt + 1) & 1], desc_dq, staged_row, dq_col)
    dq = tlx.async_dot_wait(0, dq)
    tlx.barrier_arrive(ds_empties[buf], 1)
    dq_row = dq_row0 + m_start
    tlx.async_descriptor_store_wait(1)  # this stage's reduce-add two steps back has read it
    stage_dq(dq_stages[ds_cnt & 1], dq, sm_scale, False)
    return dq_row


@triton.jit
def produce_head_steps(qdo_cnt, head, q_row0, out_row0, stats_col0, first, n_lead, bulk_end, num_q_tiles, desc_q,
                       desc_do, desc_stats, desc_dq, k_tiles, kv_slot, qdo_ring, ds_ring, Q_IDX, num_heads,
                       col_stride_q, col_stride_do, sm_scale, SPARSE: tl.constexpr, PRODUCER_DQ: tl.constexpr,
                       TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                       NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr, QDO_BYTES: tl.constexpr,
                       CONSUMERS: tl.constexpr, item=0, TIMELINE=None, PROFILE: tl.constexpr = False, loaded=0):
    """Producer, the loads of one query head of an item: per step the query tile's Q, dO and row statistics
    (lse2 and delta rows of the transposed stats tensor). With the producer's dQ (PRODUCER_DQ) also every step's
    dQ but the last DQ_LAG (= NUM_BUFFERS_DS) ones, DQ_LAG steps behind the loads (so that a load is issued
    DQ_LAG steps before it is needed); ``finish_head_dq`` runs those. Loads and dQ steps are counted by
    ``qdo_cnt`` alone: both advance by the head's steps, so at its start the dQ count equals it (one register
    less in a producer of 72). ``loaded``: the head's first steps whose loads the previous item issued
    (``prefetch_next_item``; then ``qdo_cnt`` counts them). PROFILE: the head's last load issued stamped in
    ``item``'s record. Returns (qdo_cnt, the query row of the dQ step staged and not yet sent)."""
    SUB: tl.constexpr = TILE_N // BLOCK_M
    # dO's first row as an int32 TMA coordinate (the packed tensors hold < 2**31 rows): one register
    # where the int64 row takes two, in a producer of 72 registers
    out_row0 = out_row0.to(tl.int32)
    n_masked = n_lead + num_q_tiles - bulk_end
    n_steps = num_q_tiles - first
    DQ_LAG: tl.constexpr = NUM_BUFFERS_DS  # the kernel's: the consumers run this many steps ahead at most
    staged_row = q_row0  # the row of the step staged and not yet sent
    if PRODUCER_DQ:
        dq_col = head * HEAD_DIM  # where the head's dQ goes in the (contiguous, q-shaped) accumulator
        for j in tl.range(loaded, tl.minimum(n_steps, DQ_LAG)):
            qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, qdo_ring, head, q_row0, out_row0,
                                    stats_col0, first, n_lead, n_masked, bulk_end, num_heads, col_stride_q,
                                    col_stride_do, Q_IDX, SPARSE, SUB, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
        for j in tl.range(DQ_LAG, n_steps):
            qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, qdo_ring, head, q_row0, out_row0,
                                    stats_col0, first, n_lead, n_masked, bulk_end, num_heads, col_stride_q,
                                    col_stride_do, Q_IDX, SPARSE, SUB, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
            staged_row = producer_dq_step(
                j - DQ_LAG, qdo_cnt - DQ_LAG - 1, staged_row, k_tiles, kv_slot, ds_ring, desc_dq, q_row0, dq_col, first,
                n_lead, n_masked, bulk_end, sm_scale, Q_IDX, SPARSE, SUB, BLOCK_M, NUM_BUFFERS_DS, CONSUMERS)
    else:
        for j in tl.range(0, n_steps):
            qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, qdo_ring, head, q_row0, out_row0,
                                    stats_col0, first, n_lead, n_masked, bulk_end, num_heads, col_stride_q,
                                    col_stride_do, Q_IDX, SPARSE, SUB, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
    if PROFILE:
        stamp(TIMELINE, item, REC_LOADS_DONE, clock64())
    return qdo_cnt, staged_row


@triton.jit
def finish_head_dq(qdo_cnt, staged_row, head, q_row0, first, n_lead, bulk_end, num_q_tiles, desc_dq, k_tiles,
                   kv_slot, ds_ring, Q_IDX, sm_scale, SPARSE: tl.constexpr,
                   TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                   NUM_BUFFERS_DS: tl.constexpr, CONSUMERS: tl.constexpr):
    """Producer's dQ (after ``produce_head_steps``, ``qdo_cnt`` and ``staged_row`` its results): the head's
    last DQ_LAG steps' dQ, and its last stage sent before the head ends (the next head's dQ goes to other
    columns; the item's K is given up after the last head)."""
    SUB: tl.constexpr = TILE_N // BLOCK_M
    n_masked = n_lead + num_q_tiles - bulk_end
    n_steps = num_q_tiles - first
    DQ_LAG: tl.constexpr = NUM_BUFFERS_DS
    dq_col = head * HEAD_DIM
    for j in tl.range(tl.maximum(n_steps - DQ_LAG, 0), n_steps):
        staged_row = producer_dq_step(
            j, qdo_cnt - n_steps + j, staged_row, k_tiles, kv_slot, ds_ring, desc_dq, q_row0, dq_col, first, n_lead,
            n_masked, bulk_end, sm_scale, Q_IDX, SPARSE, SUB, BLOCK_M, NUM_BUFFERS_DS, CONSUMERS)
    if n_steps > 0:  # the head's last step
        send_staged_dq(ds_ring[3][(qdo_cnt + 1) & 1], desc_dq, staged_row, dq_col)


@triton.jit
def load_kv(kv_cnt, head, k_row0, n_start, desc_k, desc_v, kv, col_stride_k, col_stride_v, BLOCK_N: tl.constexpr,
            GROUP: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, KV_BYTES: tl.constexpr, CONSUMERS: tl.constexpr):
    """K and V of query head ``head``'s key/value head, each consumer's BLOCK_N key rows from key ``n_start`` of the
    sequence whose keys start at packed row ``k_row0``, into the ``kv_cnt``-th use of the K/V slots
    (NUM_BUFFERS_KV pairs of CONSUMERS tiles), once the consumers (or the producer's dQ) have handed each slot
    back."""
    k_tiles, v_tiles, kv_fulls, kv_empties = kv
    buf, phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
    for c in tl.static_range(CONSUMERS):
        slot = buf * CONSUMERS + c
        tlx.barrier_wait(kv_empties[slot], phase ^ 1)
        tlx.barrier_expect_bytes(kv_fulls[slot], 2 * KV_BYTES)
        row = k_row0 + n_start + c * BLOCK_N
        tlx.async_descriptor_load(desc_k, k_tiles[slot], [row, (head // GROUP) * col_stride_k], kv_fulls[slot])
        tlx.async_descriptor_load(desc_v, v_tiles[slot], [row, (head // GROUP) * col_stride_v], kv_fulls[slot])


@triton.jit
def upcoming_item(count, COUNTER, item_bufs, item_fulls, item_empties, pid, num_progs, DYNAMIC: tl.constexpr):
    """The CTA's ``count``-th item: from the global counter (DYNAMIC, handed to the consumers through the
    item ring, ``fetch_item``) or round-robin (``static_item``). >= the launch's item count: no more work."""
    if DYNAMIC:
        item = fetch_item(COUNTER, item_bufs, item_fulls, item_empties, count)
    else:
        item = static_item(count, pid, num_progs, False)
    return item


@triton.jit
def prefetch_next_item(next_item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, kv, qdo_ring, TILES,
                       CU_Q, CU_K, STATS_CU, COL_OFF, Q_IDX, num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q,
                       col_stride_k, col_stride_v, col_stride_do, band_lo, band_hi, CAUSAL: tl.constexpr,
                       WINDOW: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr,
                       TILE_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                       NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, LEAD: tl.constexpr,
                       KV_BYTES: tl.constexpr, QDO_BYTES: tl.constexpr, CONSUMERS: tl.constexpr, TIMELINE=None,
                       PROFILE: tl.constexpr = False):
    """Producer, two K/V slot pairs: the CTA's next item ``next_item`` (its ``kv_cnt``-th) started while the
    consumers run this item's last steps: its K and V into the other slot pair (handed back an item ago) and its
    first query head's first LEAD steps' Q, dO and statistics (``load_qdo_step``; ``produce_dkdv_item`` then
    skips them). Returns qdo_cnt after those loads."""
    head, q_row0, out_row0, _lq, k_row0, _lk, n_start, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
        dkdv_item(TILES, CU_Q, CU_K, COL_OFF, next_item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo,
                  band_hi, CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, 0, GROUP)
    load_kv(kv_cnt, head, k_row0, n_start, desc_k, desc_v, kv, col_stride_k, col_stride_v, BLOCK_N, GROUP,
            NUM_BUFFERS_KV, KV_BYTES, CONSUMERS)
    if PROFILE:
        stamp(TIMELINE, next_item, REC_KV_ISSUED, clock64())
    stats_col0 = aligned_column(TILES, STATS_CU, next_item, num_slots, num_heads // GROUP, num_seqs, SPARSE)
    n_masked = n_lead + num_q_tiles - bulk_end
    for j in tl.range(0, tl.minimum(num_q_tiles - first, LEAD)):
        qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, qdo_ring, head, q_row0, out_row0.to(tl.int32),
                                stats_col0, first, n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do,
                                Q_IDX, SPARSE, TILE_N // BLOCK_M, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
    return qdo_cnt


@triton.jit
def produce_dkdv_item(item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, kv, qdo_ring,
                      ds_ring, TILES, CU_Q, CU_K, STATS_CU, COL_OFF, Q_IDX,
                      num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v,
                      col_stride_do, sm_scale, band_lo, band_hi, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                      GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr,
                      PRODUCER_DQ: tl.constexpr, TILE_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                      HEAD_DIM: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                      KV_BYTES: tl.constexpr, QDO_BYTES: tl.constexpr, CONSUMERS: tl.constexpr, TIMELINE=None,
                      PROFILE: tl.constexpr = False, NUM_BUFFERS_KV: tl.constexpr = 1, num_items=0, COUNTER=None,
                      item_bufs=None, item_fulls=None, item_empties=None, pid=0, num_progs=1,
                      DYNAMIC: tl.constexpr = False):
    """Producer, the CTA's ``kv_cnt``-th work item: each of the CONSUMERS consumers' K and V half of the item's
    key/value head, then the steps of each of its GROUP query heads in turn (``produce_head_steps``,
    ``finish_head_dq``). With two K/V slot pairs (NUM_BUFFERS_KV 2, the producer's dQ) the CTA's previous call
    loaded the item's K and V and its first DQ_LAG steps (the CTA's first item: this call), and this call fetches
    the CTA's next item (``upcoming_item``) and starts it (``prefetch_next_item``) once the last head's loads
    are issued and before the dQ of its last DQ_LAG steps, which waits for the consumers' last dS^T: the
    consumers' next item then finds its K, V and first query tiles loaded. PROFILE: the producer's phases
    stamped in the item's record (``dkdv_steps.PROFILE_FIELDS``; K/V issued in the record of the item they
    belong to). Returns (qdo_cnt, the CTA's next item: with NUM_BUFFERS_KV 2, else -1)."""
    if PROFILE:
        stamp(TIMELINE, item, REC_PRODUCER_START, clock64())
    head, q_row0, out_row0, len_q, k_row0, _lk, n_start, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
        dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
                  CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, 0, GROUP)
    stats_col0 = aligned_column(TILES, STATS_CU, item, num_slots, num_heads // GROUP, num_seqs, SPARSE)
    kv_slot = (kv_cnt % NUM_BUFFERS_KV) * CONSUMERS
    started = False  # by the previous call (two pairs: every item but the CTA's first)
    if NUM_BUFFERS_KV > 1:
        started = kv_cnt > 0
    loaded = 0  # the first head's steps loaded by the previous call
    if started:
        loaded = tl.minimum(num_q_tiles - first, NUM_BUFFERS_DS)
    else:
        load_kv(kv_cnt, head, k_row0, n_start, desc_k, desc_v, kv, col_stride_k, col_stride_v, BLOCK_N, GROUP,
                NUM_BUFFERS_KV, KV_BYTES, CONSUMERS)
        if PROFILE:
            stamp(TIMELINE, item, REC_KV_ISSUED, clock64())
    next_item = -1
    for g in tl.range(0, GROUP):  # grouped-query attention: the group's query heads in turn, against this K and V
        if GROUP > 1:  # (one head: the item's numbers above are its own)
            head, q_row0, out_row0, _lq, _kr, _lk, _ns, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
                dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo,
                          band_hi, CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, g, GROUP)
        qdo_cnt, staged_row = produce_head_steps(
            qdo_cnt, head, q_row0, out_row0, stats_col0, first, n_lead, bulk_end, num_q_tiles, desc_q, desc_do,
            desc_stats, desc_dq, kv[0], kv_slot, qdo_ring, ds_ring, Q_IDX, num_heads, col_stride_q, col_stride_do,
            sm_scale, SPARSE, PRODUCER_DQ, TILE_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS, QDO_BYTES,
            CONSUMERS, item, TIMELINE, PROFILE, loaded)
        loaded = 0
        dq_cnt = qdo_cnt  # the head's loads end here: its last dQ steps count from it
        if NUM_BUFFERS_KV > 1:
            if g == GROUP - 1:
                next_item = upcoming_item(kv_cnt + 1, COUNTER, item_bufs, item_fulls, item_empties, pid, num_progs,
                                          DYNAMIC)
                if next_item < num_items:
                    qdo_cnt = prefetch_next_item(
                        next_item, kv_cnt + 1, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, kv, qdo_ring,
                        TILES, CU_Q, CU_K, STATS_CU, COL_OFF, Q_IDX, num_slots, num_heads, num_seqs, len_q_bcast,
                        col_stride_q, col_stride_k, col_stride_v, col_stride_do, band_lo, band_hi, CAUSAL, WINDOW,
                        GROUP, BROADCAST_Q, SPARSE, TILE_N, BLOCK_N, BLOCK_M, NUM_BUFFERS_QDO, NUM_BUFFERS_KV,
                        NUM_BUFFERS_DS, KV_BYTES, QDO_BYTES, CONSUMERS, TIMELINE, PROFILE)
        if PRODUCER_DQ:
            finish_head_dq(dq_cnt, staged_row, head, q_row0, first, n_lead, bulk_end, num_q_tiles, desc_dq, kv[0],
                           kv_slot, ds_ring, Q_IDX, sm_scale, SPARSE, TILE_N, BLOCK_M,
                           HEAD_DIM, NUM_BUFFERS_DS, CONSUMERS)
    if PROFILE:
        stamp(TIMELINE, item, REC_PRODUCER_END, clock64())
    return qdo_cnt, next_item
