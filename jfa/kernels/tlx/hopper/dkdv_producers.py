"""The Hopper dK/dV kernel's producer (``jfa.kernels.tlx.hopper.backward``, the bf16/fp16 builds; the MXFP8
builds' is ``mx_producers.produce_dkdv_item_mx``): one work item's TMA loads of K and V, each query step's Q, dO
and row statistics, and with the producer's dQ (``dq="producer"``) each step's dQ from the consumers' dS^T and its
TMA reduce-add."""
import triton
import triton.language as tl

from jfa.kernels.tlx.common.device import bufidx_phase, clock64
from jfa.kernels.tlx.common.host import tlx
from jfa.kernels.tlx.hopper.dkdv_steps import (aligned_column, dkdv_item, load_qdo_step, send_staged_dq, stage_dq,
                                                stamp, step_tile)


@triton.jit
def producer_dq_step(s, ds_cnt, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq, dq_row0,
                     dq_col, first, n_lead, n_masked, bulk_end, sm_scale, Q_IDX, SPARSE: tl.constexpr,
                     SUB: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                     CONSUMERS: tl.constexpr):
    """Producer (``dq="producer"``), step s of the item: once both consumers have stored their dS^T, dQ
    over all TILE_N keys (two MMAs, one accumulator), the dS^T slot handed back, the previous step's
    stage sent (``send_staged_dq``) while the MMAs run, and this step's dQ stored to its stage; the
    item's last stage is sent after its loop. ``ds_cnt``: the item's first step's count plus s (the dS^T
    slot and the stage follow it); ``staged_row``: the previous step's row. Returns this step's row."""
    m_start = step_tile(s, first, n_lead, n_masked, bulk_end, Q_IDX, SPARSE, SUB) * BLOCK_M
    buf, phase = bufidx_phase(ds_cnt, NUM_BUFFERS_DS)
    tlx.barrier_wait(ds_fulls[buf], phase)
    dq = tlx.async_dot(tlx.local_trans(ds_tiles[buf * CONSUMERS]), k_tiles[0])
    dq = tlx.async_dot(tlx.local_trans(ds_tiles[buf * CONSUMERS + 1]), k_tiles[1], dq)
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
                       desc_do, desc_stats, desc_dq, k_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, ds_tiles,
                       dq_stages, qdo_fulls, qdo_empties, ds_fulls, ds_empties, Q_IDX, num_heads, col_stride_q,
                       col_stride_do, sm_scale, SPARSE: tl.constexpr, PRODUCER_DQ: tl.constexpr,
                       TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                       NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr, QDO_BYTES: tl.constexpr,
                       CONSUMERS: tl.constexpr, item=0, TIMELINE=None, PROFILE: tl.constexpr = False):
    """Producer, the steps of one query head of an item: per step the query tile's Q, dO and row statistics
    (lse2 and delta rows of the transposed stats tensor). With the producer's dQ (PRODUCER_DQ) also every step's dQ,
    DQ_LAG (= NUM_BUFFERS_DS) steps behind the loads (so that a load is issued DQ_LAG steps before it is
    needed), the last ones flushed before the head's steps end (the next head's dQ goes to other columns, the
    item's K is given up after the last head). Loads and dQ steps are counted by ``qdo_cnt`` alone (returned):
    both advance by the head's steps, so at its start the dQ count equals it (one register less in a producer
    of 72). PROFILE: the head's last load issued (with the producer's dQ: and the dQ step after it) stamped in
    ``item``'s record."""
    SUB: tl.constexpr = TILE_N // BLOCK_M
    # dO's first row as an int32 TMA coordinate (the packed tensors hold < 2**31 rows): one register
    # where the int64 row takes two, in a producer of 72 registers
    out_row0 = out_row0.to(tl.int32)
    n_masked = n_lead + num_q_tiles - bulk_end
    n_steps = num_q_tiles - first
    DQ_LAG: tl.constexpr = NUM_BUFFERS_DS  # the kernel's: the consumers run this many steps ahead at most
    if PRODUCER_DQ:
        dq_row0, dq_col = q_row0, head * HEAD_DIM  # where the head's dQ goes in the (contiguous, q-shaped) accumulator
        for j in tl.range(0, tl.minimum(n_steps, DQ_LAG)):
            qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                    delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0, stats_col0, first,
                                    n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, Q_IDX,
                                    SPARSE, SUB, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
        staged_row = dq_row0  # the row of the step staged and not yet sent
        for j in tl.range(DQ_LAG, n_steps):
            qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                    delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0, stats_col0, first,
                                    n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, Q_IDX,
                                    SPARSE, SUB, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
            staged_row = producer_dq_step(
                j - DQ_LAG, qdo_cnt - DQ_LAG - 1, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties,
                dq_stages, desc_dq, dq_row0, dq_col, first, n_lead, n_masked, bulk_end, sm_scale, Q_IDX, SPARSE, SUB,
                BLOCK_M, NUM_BUFFERS_DS, CONSUMERS)
        if PROFILE:
            stamp(TIMELINE, item, 10, clock64())  # loads_done
        for j in tl.range(tl.maximum(n_steps - DQ_LAG, 0), n_steps):
            staged_row = producer_dq_step(
                j, qdo_cnt - n_steps + j, staged_row, k_tiles, ds_tiles, ds_fulls, ds_empties, dq_stages, desc_dq,
                dq_row0, dq_col, first, n_lead, n_masked, bulk_end, sm_scale, Q_IDX, SPARSE, SUB, BLOCK_M,
                NUM_BUFFERS_DS, CONSUMERS)
        if n_steps > 0:  # the head's last step
            send_staged_dq(dq_stages[(qdo_cnt + 1) & 1], desc_dq, staged_row, dq_col)
    else:
        for j in tl.range(0, n_steps):
            qdo_cnt = load_qdo_step(j, qdo_cnt, desc_q, desc_do, desc_stats, q_tiles, do_tiles, lse_tiles,
                                    delta_tiles, qdo_fulls, qdo_empties, head, q_row0, out_row0, stats_col0, first,
                                    n_lead, n_masked, bulk_end, num_heads, col_stride_q, col_stride_do, Q_IDX,
                                    SPARSE, SUB, BLOCK_M, NUM_BUFFERS_QDO, QDO_BYTES)
        if PROFILE:
            stamp(TIMELINE, item, 10, clock64())  # loads_done
    return qdo_cnt


@triton.jit
def produce_dkdv_item(item, kv_cnt, qdo_cnt, desc_q, desc_k, desc_v, desc_do, desc_stats, desc_dq, k_tiles,
                      v_tiles, q_tiles, do_tiles, lse_tiles, delta_tiles, ds_tiles, dq_stages, kv_fulls, kv_empties,
                      qdo_fulls, qdo_empties, ds_fulls, ds_empties, TILES, CU_Q, CU_K, STATS_CU, COL_OFF, Q_IDX,
                      num_slots, num_heads, num_seqs, len_q_bcast, col_stride_q, col_stride_k, col_stride_v,
                      col_stride_do, sm_scale, band_lo, band_hi, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                      GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, SPARSE: tl.constexpr,
                      PRODUCER_DQ: tl.constexpr, TILE_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                      HEAD_DIM: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr, NUM_BUFFERS_DS: tl.constexpr,
                      KV_BYTES: tl.constexpr, QDO_BYTES: tl.constexpr, CONSUMERS: tl.constexpr, TIMELINE=None,
                      PROFILE: tl.constexpr = False):
    """Producer, one work item: each of the CONSUMERS consumers' K and V half of the item's key/value head, then
    the steps of each of its GROUP query heads in turn (``produce_head_steps``). PROFILE: the producer's phases
    stamped in the item's record (``dkdv_steps.PROFILE_FIELDS``)."""
    if PROFILE:
        stamp(TIMELINE, item, 8, clock64())  # producer_start
    head, q_row0, out_row0, len_q, k_row0, _lk, n_start, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
        dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
                  CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, 0, GROUP)
    stats_col0 = aligned_column(TILES, STATS_CU, item, num_slots, num_heads // GROUP, num_seqs, SPARSE)
    kv_phase = kv_cnt & 1
    for c in tl.static_range(CONSUMERS):
        tlx.barrier_wait(kv_empties[c], kv_phase ^ 1)
        tlx.barrier_expect_bytes(kv_fulls[c], 2 * KV_BYTES)
        row = k_row0 + n_start + c * BLOCK_N
        tlx.async_descriptor_load(desc_k, k_tiles[c], [row, (head // GROUP) * col_stride_k], kv_fulls[c])
        tlx.async_descriptor_load(desc_v, v_tiles[c], [row, (head // GROUP) * col_stride_v], kv_fulls[c])
    if PROFILE:
        stamp(TIMELINE, item, 9, clock64())  # kv_issued
    for g in tl.range(0, GROUP):  # grouped-query attention: the group's query heads in turn, against this K and V
        if GROUP > 1:  # (one head: the item's numbers above are its own)
            head, q_row0, out_row0, _lq, _kr, _lk, _ns, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
                dkdv_item(TILES, CU_Q, CU_K, COL_OFF, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo,
                          band_hi, CAUSAL, WINDOW, BROADCAST_Q, SPARSE, TILE_N, BLOCK_M, g, GROUP)
        qdo_cnt = produce_head_steps(qdo_cnt, head, q_row0, out_row0, stats_col0, first, n_lead, bulk_end,
                                     num_q_tiles, desc_q, desc_do, desc_stats, desc_dq, k_tiles, q_tiles, do_tiles,
                                     lse_tiles, delta_tiles, ds_tiles, dq_stages, qdo_fulls, qdo_empties, ds_fulls,
                                     ds_empties, Q_IDX, num_heads, col_stride_q, col_stride_do, sm_scale, SPARSE,
                                     PRODUCER_DQ, TILE_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO, NUM_BUFFERS_DS,
                                     QDO_BYTES, CONSUMERS, item, TIMELINE, PROFILE)
    if PROFILE:
        stamp(TIMELINE, item, 11, clock64())  # producer_end
    return qdo_cnt
