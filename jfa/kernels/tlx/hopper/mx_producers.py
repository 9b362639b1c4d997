"""The MXFP8 builds' producers of the Hopper TLX kernels: one work item's fills of the bf16 kernels' buffers,
made from E4M3 bytes and E8M0 scales (``mx_tiles``) instead of TMA copies, with the same barriers in the same order,
so the consumers are the bf16 builds' own (``jfa.kernels.tlx.hopper.forward``, ``jfa.kernels.tlx.hopper.backward``:
each kernel calls its producer here where ``MX`` is set).
"""
import triton
import triton.language as tl

from jfa.kernels.tlx.common.device import bufidx_phase, mx_scale_rows
from jfa.kernels.tlx.common.host import tlx
from jfa.kernels.tlx.hopper.dkdv_steps import aligned_column, dkdv_item, step_tile
from jfa.kernels.tlx.hopper.mx_tiles import (fill_dim_tile, load_dim_tile, load_token_tile, store_dim_tile,
                                            store_token_tile)


@triton.jit
def produce_forward_item_mx(item, head, q_row0, m_start, len_q, k_row0, len_k, j0, n_blocks, q_cnt, kv_cnt, Q8, K8,
                            V8, QS, KS, VS, VB_OFF, q_tiles, k_tiles, v_tiles, q_fulls, q_empties, k_fulls, k_empties,
                            v_fulls, v_empties, TILES, num_heads, CONSUMERS: tl.constexpr, GROUP: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr):
    """The forward's MX producer (``jfa.kernels.tlx.hopper.forward``), one decoded work item of CONSUMERS query
    halves: the bf16 kernel's fills (same buffers, same barriers, same order),
    each made from E4M3 bytes and scales loaded straight into registers (coalesced 16-byte loads; rows past the
    sequence are masked, so nothing of another sequence is read) and dequantized into the bf16 buffer.
    Software-pipelined by hand: V(j) is loaded before K(j) is stored, K(j + 1) before V(j) is stored, so
    each tile's load latency hides behind the other's conversion. The operands are contiguous: a token's
    row stride is heads x HEAD_DIM bytes. Returns the advanced (q_cnt, kv_cnt)."""
    NB: tl.constexpr = HEAD_DIM // 32
    if n_blocks > 0:
        kv_head = head // GROUP
        num_kv_heads = num_heads // GROUP
        q_buf, q_phase = bufidx_phase(q_cnt, NUM_BUFFERS_Q)
        for c in tl.static_range(CONSUMERS):
            codes, scales = load_dim_tile(Q8, QS, q_row0 + m_start + c * BLOCK_M, len_q - m_start - c * BLOCK_M,
                                          head * HEAD_DIM, head * NB, num_heads * HEAD_DIM, num_heads * NB, BLOCK_M,
                                          HEAD_DIM)
            tlx.barrier_wait(q_empties[c * NUM_BUFFERS_Q + q_buf], q_phase ^ 1)
            store_dim_tile(q_tiles[c * NUM_BUFFERS_Q + q_buf], codes, scales, BLOCK_M, HEAD_DIM)
            tlx.barrier_arrive(q_fulls[c * NUM_BUFFERS_Q + q_buf], 1)
        scale_row0 = tl.load(VB_OFF + tl.load(TILES + item // num_heads))  # V's first scale row of the sequence
        k_codes, k_scales = load_dim_tile(K8, KS, k_row0 + j0 * BLOCK_N, len_k - j0 * BLOCK_N, kv_head * HEAD_DIM,
                                          kv_head * NB, num_kv_heads * HEAD_DIM, num_kv_heads * NB, BLOCK_N, HEAD_DIM)
        for j in tl.range(0, n_blocks):
            n_start = (j0 + j) * BLOCK_N
            kv_buf, kv_phase = bufidx_phase(kv_cnt, NUM_BUFFERS_KV)
            v_codes, v_scales = load_token_tile(V8, VS, k_row0, n_start, len_k, scale_row0, kv_head * HEAD_DIM,
                                                num_kv_heads * HEAD_DIM, BLOCK_N, HEAD_DIM)
            tlx.barrier_wait(k_empties[kv_buf], kv_phase ^ 1)
            store_dim_tile(k_tiles[kv_buf], k_codes, k_scales, BLOCK_N, HEAD_DIM)
            tlx.barrier_arrive(k_fulls[kv_buf], 1)
            # the next block's K (none past the item's last block: its rows are all masked)
            k_codes, k_scales = load_dim_tile(K8, KS, k_row0 + n_start + BLOCK_N,
                                              tl.where(j + 1 < n_blocks, len_k - n_start - BLOCK_N, 0),
                                              kv_head * HEAD_DIM, kv_head * NB, num_kv_heads * HEAD_DIM,
                                              num_kv_heads * NB, BLOCK_N, HEAD_DIM)
            tlx.barrier_wait(v_empties[kv_buf], kv_phase ^ 1)
            store_token_tile(v_tiles[kv_buf], v_codes, v_scales, BLOCK_N, HEAD_DIM)
            tlx.barrier_arrive(v_fulls[kv_buf], 1)
            kv_cnt += 1
        q_cnt += 1
    return q_cnt, kv_cnt


@triton.jit
def _produce_head_steps_mx(qdo_cnt, head, q_row0, out_row0, len_q, stats_col0, qb0, ob0, first, n_lead, bulk_end,
                           num_q_tiles, Q8, DO8, desc_stats, QS, QT, QTS, DOS, DOT_, DOTS, q_tiles, qt_tiles, do_tiles,
                           dot_tiles, lse_tiles, delta_tiles, qdo_fulls, qdo_empties, num_heads, TILE_N: tl.constexpr,
                           BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_BUFFERS_QDO: tl.constexpr):
    """MX producer, the steps of one query head of an item (``produce_dkdv_item_mx``). Returns the advanced
    qdo_cnt."""
    SUB: tl.constexpr = TILE_N // BLOCK_M
    n_masked = n_lead + num_q_tiles - bulk_end
    NB: tl.constexpr = HEAD_DIM // 32
    for j in tl.range(0, num_q_tiles - first):
        m_start = step_tile(j, first, n_lead, n_masked, bulk_end, None, False, SUB) * BLOCK_M
        buf, phase = bufidx_phase(qdo_cnt, NUM_BUFFERS_QDO)
        # the step's four tiles (4 KB of bytes each) loaded together, before the slot is free: one load
        # latency per step, not four
        q_codes, q_scales = load_dim_tile(Q8, QS, q_row0 + m_start, len_q - m_start, head * HEAD_DIM, head * NB,
                                          num_heads * HEAD_DIM, num_heads * NB, BLOCK_M, HEAD_DIM)
        qt_codes, qt_scales = load_token_tile(QT, QTS, q_row0, m_start, len_q, qb0, head * HEAD_DIM,
                                              num_heads * HEAD_DIM, BLOCK_M, HEAD_DIM)
        do_codes, do_scales = load_dim_tile(DO8, DOS, out_row0 + m_start, len_q - m_start, head * HEAD_DIM,
                                            head * NB, num_heads * HEAD_DIM, num_heads * NB, BLOCK_M, HEAD_DIM)
        dot_codes, dot_scales = load_token_tile(DOT_, DOTS, out_row0, m_start, len_q, ob0, head * HEAD_DIM,
                                                num_heads * HEAD_DIM, BLOCK_M, HEAD_DIM)
        tlx.barrier_wait(qdo_empties[buf], phase ^ 1)
        store_dim_tile(q_tiles[buf], q_codes, q_scales, BLOCK_M, HEAD_DIM)
        store_token_tile(qt_tiles[buf], qt_codes, qt_scales, BLOCK_M, HEAD_DIM)
        store_dim_tile(do_tiles[buf], do_codes, do_scales, BLOCK_M, HEAD_DIM)
        store_token_tile(dot_tiles[buf], dot_codes, dot_scales, BLOCK_M, HEAD_DIM)
        tlx.barrier_expect_bytes(qdo_fulls[buf], 2 * BLOCK_M * 4)  # (the arrival: after every fenced store)
        stats_col = stats_col0 + m_start
        tlx.async_descriptor_load(desc_stats, lse_tiles[buf], [head, stats_col], qdo_fulls[buf])
        tlx.async_descriptor_load(desc_stats, delta_tiles[buf], [num_heads + head, stats_col], qdo_fulls[buf])
        qdo_cnt += 1
    return qdo_cnt


@triton.jit
def produce_dkdv_item_mx(item, kv_cnt, qdo_cnt, Q8, K8, V8, DO8, desc_stats, QS, QT, QTS, QB_OFF, KS, VS, DOS, DOT_,
                         DOTS, OB_OFF, k_tiles, v_tiles, q_tiles, qt_tiles, do_tiles, dot_tiles, lse_tiles,
                         delta_tiles, kv_fulls, kv_empties, qdo_fulls, qdo_empties, TILES, CU_Q, CU_K, STATS_CU,
                         num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi, CAUSAL: tl.constexpr,
                         CONSUMERS: tl.constexpr, GROUP: tl.constexpr, BROADCAST_Q: tl.constexpr, TILE_N: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                         NUM_BUFFERS_QDO: tl.constexpr):
    """The dK/dV kernel's MX producer (``jfa.kernels.tlx.hopper.backward``), one work item of CONSUMERS key
    halves: the TMA producer's fills (same buffers, barriers and step order), each tile
    loaded as E4M3 bytes and E8M0 scales (rows past the sequence masked: nothing of another sequence is read)
    and dequantized into its bf16 buffer (``mx_tiles``): K and V along D
    (S^T, dP^T); per step Q and dO along D and along the sequence's 32-row query blocks (Q^(queries) of a
    broadcast Q: the shared q's own blocks; dO^(queries): the output rows' blocks), all four loaded before the
    wait for the slot, and the row statistics by TMA on the slot's full barrier, whose expect-bytes arrival
    follows the fenced stores. Q8, K8, V8, DO8: D-axis bytes; QT, DOT_: query-axis bytes (QB_OFF,
    OB_OFF: each sequence's first scale row). The group's query heads take their steps in turn
    (``_produce_head_steps_mx``). Returns the advanced qdo_cnt."""
    head, q_row0, out_row0, len_q, k_row0, len_k, n_start, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
        dkdv_item(TILES, CU_Q, CU_K, TILES, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo, band_hi,
                  CAUSAL, False, BROADCAST_Q, False, TILE_N, BLOCK_M, 0, GROUP)
    CHUNK: tl.constexpr = 4096 // HEAD_DIM  # rows dequantized at a time (registers): 4 KB of bytes, 32 a thread
    stats_col0 = aligned_column(TILES, STATS_CU, item, num_slots, num_heads // GROUP, num_seqs, False)
    qb0, ob0 = mx_scale_rows(TILES, QB_OFF, OB_OFF, item, num_slots, num_heads // GROUP, num_seqs, BROADCAST_Q)
    kv_head = head // GROUP
    num_kv_heads = num_heads // GROUP
    for c in tl.static_range(CONSUMERS):
        tlx.barrier_wait(kv_empties[c], (kv_cnt & 1) ^ 1)
        rows = n_start + c * BLOCK_N
        fill_dim_tile(k_tiles[c], K8, KS, k_row0 + rows, len_k - rows, kv_head, num_kv_heads, BLOCK_N, CHUNK,
                      HEAD_DIM)
        fill_dim_tile(v_tiles[c], V8, VS, k_row0 + rows, len_k - rows, kv_head, num_kv_heads, BLOCK_N, CHUNK,
                      HEAD_DIM)
        tlx.barrier_arrive(kv_fulls[c], 1)
    for g in tl.range(0, GROUP):  # grouped-query attention: the group's query heads in turn, against this K and V
        if GROUP > 1:  # (one head: the item's numbers above are its own)
            head, q_row0, out_row0, len_q, _kr, _lk, _ns, _cs, first, n_lead, bulk_end, num_q_tiles, _lo, _hi = \
                dkdv_item(TILES, CU_Q, CU_K, TILES, item, num_slots, num_heads, num_seqs, len_q_bcast, band_lo,
                          band_hi, CAUSAL, False, BROADCAST_Q, False, TILE_N, BLOCK_M, g, GROUP)
        qdo_cnt = _produce_head_steps_mx(qdo_cnt, head, q_row0, out_row0, len_q, stats_col0, qb0, ob0, first, n_lead,
                                         bulk_end, num_q_tiles, Q8, DO8, desc_stats, QS, QT, QTS, DOS, DOT_, DOTS,
                                         q_tiles, qt_tiles, do_tiles, dot_tiles, lse_tiles, delta_tiles, qdo_fulls,
                                         qdo_empties, num_heads, TILE_N, BLOCK_M, HEAD_DIM, NUM_BUFFERS_QDO)
    return qdo_cnt
