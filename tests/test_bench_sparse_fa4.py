"""The block-sparse benchmark's FlashAttention-4 row (``fa4-blocksparse`` in ``jfa.bench.sparse``), on the CPU.

FA4 (flash-attn-4 4.0.0b36, CuTe DSL) cannot run here, so its varlen block-sparse format is read back by a
decoder written from FA4's source, independently of ``fa4_block_sparse``:

* ``flash_attn/cute/block_sparse_utils.py`` ``_get_curr_blocksparse_tensors_varlen``: the count of (head h,
  sequence b, m-block m) is ``mask_block_cnt[h, cu_total_m_blocks[b] + m]``, its list starts at column
  ``cu_block_idx_offsets[b] + m * num_n_blocks`` of ``mask_block_idx[h]`` (the same for ``full_*``), with
  ``num_n_blocks = ceil(seqlen_k_b / tile_n)`` (``seqlen_info.py`` ``SeqlenInfoQK.create``, tile_n 128);
* ``consume_block_sparse_loads`` (sm_90, intra-warpgroup overlap): the mask list is walked from its last entry
  to its first, then the full list likewise; the first block taken from each list is masked at the
  sequence's key end (``mask_seqlen=True``), the others are not; the causal mask (bottom-right) applies to
  every block (``flash_fwd_sm90.py``: ``mask_fn`` binds ``mask_causal=self.is_causal``).

A torch simulation of that forward (keys past a block's sequence are the packed neighbours', as the kernel's
tile loads read them) is checked against jfa's float64 oracle restricted to the same lists.
"""
from __future__ import annotations

import math
import sys
import types
from typing import NamedTuple

import numpy as np
import pytest
import torch

from jfa.bench import runner, sparse, suites
from jfa.bench.sparse import fa4_block_sparse

BS = 128

# jagged batches: (lengths_q, lengths_k); empty sequences, shorter than a block, not multiples of 128, Lq != Lk
CASES = {
    "mixed": ([300, 0, 129, 5, 256, 77], [300, 0, 129, 5, 256, 77]),
    "lq-ne-lk": ([130, 7, 0, 256, 40], [260, 300, 64, 128, 0]),
    "one-long": ([389], [389]),
}


def _ceil(a, b):
    return -(-a // b)


def _random_csr(lengths_q, lengths_k, heads, causal, seed, p=0.5):
    """jfa's exact CSR (row h * NQB + g, ascending key blocks) with each allowed block listed at random."""
    g = torch.Generator().manual_seed(seed)
    offsets, indices = [0], []
    for _h in range(heads):
        for lq, lk in zip(lengths_q, lengths_k):
            for t in range(_ceil(lq, BS)):
                n = _ceil(lk, BS)
                if causal:
                    last = min((t + 1) * BS, lq) - 1 + lk - lq  # the block's last row's last visible key
                    n = min(n, last // BS + 1) if last >= 0 else 0
                keep = (torch.rand(n, generator=g) < p).nonzero().flatten().tolist()
                indices += keep
                offsets.append(len(indices))
    return torch.tensor(offsets, dtype=torch.int64), torch.tensor(indices, dtype=torch.int64)


def _jfa_sets(csr, lengths_q, heads):
    """{(h, b, t): key blocks} of jfa's CSR."""
    offsets, indices = csr
    nqb = sum(_ceil(n, BS) for n in lengths_q)
    out, r = {}, 0
    for h in range(heads):
        for b, lq in enumerate(lengths_q):
            for t in range(_ceil(lq, BS)):
                assert r == h * nqb + sum(_ceil(n, BS) for n in lengths_q[:b]) + t
                out[(h, b, t)] = indices[offsets[r]:offsets[r + 1]].tolist()
                r += 1
    return out


def _decode(f, lengths_q, lengths_k, heads):
    """FA4's varlen block-sparse tensors read as its sm_90 forward reads them (module docstring):
    {(h, b, m): (mask list, full list)}, in stored order. Checks that no list runs past its slots."""
    cu_m, cu_idx = f["cu_total_m_blocks"].tolist(), f["cu_block_idx_offsets"].tolist()
    out = {}
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        num_n_blocks = _ceil(lk, BS)  # SeqlenInfoQK.create, tile_n 128
        for m in range(_ceil(lq, BS)):  # the kernel's m-blocks of the sequence (tile_m 128, q_stage 1)
            for h in range(heads):
                base = cu_idx[b] + m * num_n_blocks
                lists = []
                for kind in ("mask", "full"):
                    cnt = int(f[f"{kind}_block_cnt"][h, cu_m[b] + m])
                    assert 0 <= cnt <= num_n_blocks, (kind, h, b, m, cnt)
                    lists.append(f[f"{kind}_block_idx"][h, base:base + cnt].tolist())
                out[(h, b, m)] = tuple(lists)
    return out


def _convert(name, causal, seed=0, heads=2, p=0.5):
    lq, lk = CASES[name]
    csr = _random_csr(lq, lk, heads, causal, seed, p)
    return lq, lk, csr, fa4_block_sparse(csr, torch.tensor(lq), torch.tensor(lk), heads, BS, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_fa4_tensors_read_back_as_jfas_blocks(name, seed, causal):
    lq, lk, csr, f = _convert(name, causal, seed)
    decoded = _decode(f, lq, lk, 2)
    jfa = _jfa_sets(csr, lq, 2)
    assert decoded.keys() == jfa.keys()
    for key, (mask, full) in decoded.items():
        assert not set(mask) & set(full), key
        assert sorted(mask + full) == jfa[key], key


@pytest.mark.parametrize("name", list(CASES))
def test_fa4_metadata_is_its_varlen_layout(name):
    """cu_total_m_blocks: the prefix sum of each sequence's 128-row m-blocks (interface.py's own
    _compute_tile_cumsum counts the same tiles); cu_block_idx_offsets: the prefix sum of M_b * N_b, as
    compute_block_sparsity.py derives it; int32, contiguous, the varlen 2-D shapes, block_size (128, 128)."""
    lq, lk, csr, f = _convert(name, False)
    m = [_ceil(n, BS) for n in lq]
    n = [_ceil(x, BS) for x in lk]
    assert f["cu_total_m_blocks"].tolist() == np.concatenate([[0], np.cumsum(m)]).tolist()
    assert f["cu_block_idx_offsets"].tolist() == np.concatenate([[0], np.cumsum(np.multiply(m, n))]).tolist()
    for key in ("mask_block_cnt", "full_block_cnt", "mask_block_idx", "full_block_idx", "cu_total_m_blocks",
                "cu_block_idx_offsets"):
        assert f[key].dtype == torch.int32 and f[key].is_contiguous(), key
    assert f["mask_block_cnt"].shape == f["full_block_cnt"].shape == (2, max(1, sum(m)))
    assert f["mask_block_idx"].shape == f["full_block_idx"].shape == (2, max(1, int(np.dot(m, n))))
    assert f["block_size"] == (BS, BS)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", list(CASES))
def test_full_blocks_are_wholly_visible_and_the_rest_masked(name, causal):
    """A listed block is full iff all its (row, key) pairs are inside the sequence and visible (bottom-right
    causal): a key block crossing the sequence end, or the causal diagonal, is in the mask list."""
    lq, lk, csr, f = _convert(name, causal, p=1.0)
    for (h, b, m), (mask, full) in _decode(f, lq, lk, 2).items():
        rows = torch.arange(m * BS, min((m + 1) * BS, lq[b]))
        for kind, blocks in (("mask", mask), ("full", full)):
            for u in blocks:
                keys = torch.arange(u * BS, (u + 1) * BS)  # the whole tile FA4 computes
                vis = (keys[None] < lk[b]).expand(len(rows), -1)
                if causal:
                    vis = vis & (keys[None] <= rows[:, None] + lk[b] - lq[b])
                assert (kind == "full") == bool(vis.all()), (h, b, m, u, kind)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", list(CASES))
def test_lists_ascend_so_fa4_masks_the_sequence_end(name, causal):
    """FA4 masks the key end only on the first block it takes from each list, its last entry: each list
    ascends, and a listed short last key block is the last entry of its list."""
    lq, lk, csr, f = _convert(name, causal, p=0.7)
    for (h, b, m), lists in _decode(f, lq, lk, 2).items():
        for blocks in lists:
            assert blocks == sorted(set(blocks))
            tail = _ceil(lk[b], BS) - 1
            if lk[b] % BS and tail in blocks:
                assert blocks[-1] == tail


def test_empty_lists_give_zero_counts():
    lq, lk = CASES["mixed"]
    nqb = sum(_ceil(n, BS) for n in lq)
    csr = (torch.zeros(2 * nqb + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    f = fa4_block_sparse(csr, torch.tensor(lq), torch.tensor(lk), 2, BS, False)
    assert int(f["mask_block_cnt"].abs().sum()) == int(f["full_block_cnt"].abs().sum()) == 0
    assert all(lists == ([], []) for lists in _decode(f, lq, lk, 2).values())


def test_bad_lists_are_refused():
    lq, lk = [200], [100]
    with pytest.raises(ValueError, match="outside"):
        fa4_block_sparse((torch.tensor([0, 1, 1]), torch.tensor([1])), torch.tensor(lq), torch.tensor(lk), 1)
    with pytest.raises(ValueError, match="ascending"):
        fa4_block_sparse((torch.tensor([0, 2, 2]), torch.tensor([0, 0])), torch.tensor(lq), torch.tensor([300]), 1)
    with pytest.raises(ValueError, match="offsets"):
        fa4_block_sparse((torch.tensor([0, 1]), torch.tensor([0])), torch.tensor(lq), torch.tensor(lk), 1)


# ---------------------------------------------------------------------------------------------------------
# FA4's sm_90 block-sparse forward, simulated (module docstring), and the bench row through a fake FA4
# ---------------------------------------------------------------------------------------------------------


def _fa4_forward_sim(q, k, v, cu_q, cu_k, causal, f, scale):
    """out [total_q, H, D] as FA4's sm_90 varlen block-sparse forward computes it, in q's dtype."""
    heads, total_k = q.shape[1], k.shape[0]
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    lengths_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lengths_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    out = torch.zeros_like(q)
    tile = torch.arange(BS)
    for (h, b, m), (mask, full) in _decode(f, lengths_q, lengths_k, heads).items():
        lq, lk = lengths_q[b], lengths_k[b]
        # the mask list, then the full list, each from its last entry; each list's first block masked at the key end
        steps = [(u, i == 0) for blocks in (mask, full) for i, u in enumerate(reversed(blocks))]
        if not steps:
            continue  # processed_any is False: out = 0
        rows = m * BS + tile
        qt = q[(cu_q[b] + rows).clamp(max=q.shape[0] - 1), h]
        scores, values = [], []
        for u, mask_seqlen in steps:
            keys = u * BS + tile
            packed = cu_k[b] + keys  # the tile's rows of the packed K/V: past the sequence, its neighbours'
            inside = packed < total_k  # past the packed tensor, the tile load reads zeros
            kt = torch.where(inside[:, None], k[packed.clamp(max=total_k - 1), h], 0)
            vt = torch.where(inside[:, None], v[packed.clamp(max=total_k - 1), h], 0)
            s = qt @ kt.T * scale
            if mask_seqlen:
                s = s.masked_fill((keys >= lk)[None], -math.inf)
            if causal:
                s = s.masked_fill(keys[None] > rows[:, None] + lk - lq, -math.inf)
            scores.append(s)
            values.append(vt)
        s = torch.cat(scores, 1)
        mx = s.max(1, keepdim=True).values
        p = torch.exp(s - torch.where(torch.isfinite(mx), mx, 0))
        o = (p @ torch.cat(values)) / p.sum(1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
        n = min(BS, lq - m * BS)
        out[cu_q[b] + m * BS: cu_q[b] + m * BS + n, h] = o[:n].to(out.dtype)
    return out


def _inputs(lq, lk, heads=2, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), heads, d, generator=g, dtype=dtype)
    k = torch.randn(sum(lk), heads, d, generator=g, dtype=dtype)
    v = torch.randn(sum(lk), heads, d, generator=g, dtype=dtype)
    cu = lambda x: torch.tensor([0] + np.cumsum(x).tolist(), dtype=torch.int32)  # noqa: E731
    return q, k, v, cu(lq), cu(lk)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", list(CASES))
def test_simulated_fa4_forward_equals_the_oracle_on_the_lists(name, causal):
    from jfa.oracle import attention_forward

    lq, lk, csr, f = _convert(name, causal, seed=3, p=0.6)
    q, k, v, cu_q, cu_k = _inputs(lq, lk)
    out = _fa4_forward_sim(q, k, v, cu_q, cu_k, causal, f, 8 ** -0.5)
    exact, _ = attention_forward(q.numpy(), k.numpy(), v.numpy(), cu_q.numpy().astype(np.int64),
                                 cu_k.numpy().astype(np.int64), causal=causal, kv_blocks=(*csr, BS))
    np.testing.assert_allclose(out.numpy(), exact, rtol=1e-10, atol=1e-12)


def test_simulated_fa4_forward_catches_descending_lists():
    """The simulation is sensitive to the tail rule: lists stored descending leave the short last key
    block unmasked (FA4 would read the next sequence's keys), and the output moves off the oracle's."""
    from jfa.oracle import attention_forward

    lq, lk = [300, 200], [300, 200]
    csr = _random_csr(lq, lk, 1, False, 0, p=1.0)
    f = fa4_block_sparse(csr, torch.tensor(lq), torch.tensor(lk), 1, BS, False)
    f["mask_block_cnt"].copy_(f["mask_block_cnt"] + f["full_block_cnt"])  # every block in the mask list ...
    f["full_block_cnt"].zero_()
    for b, (a, n) in enumerate(zip(f["cu_block_idx_offsets"].tolist(), (3, 2))):
        for m in range(_ceil(lq[b], BS)):
            f["mask_block_idx"][0, a + m * n: a + (m + 1) * n] = torch.arange(n)  # ... ascending: right
    q, k, v, cu_q, cu_k = _inputs(lq, lk, heads=1)
    exact, _ = attention_forward(q.numpy(), k.numpy(), v.numpy(), cu_q.numpy().astype(np.int64),
                                 cu_k.numpy().astype(np.int64), causal=False, kv_blocks=(*csr, BS))
    np.testing.assert_allclose(_fa4_forward_sim(q, k, v, cu_q, cu_k, False, f, 8 ** -0.5).numpy(), exact, rtol=1e-10)
    for b, (a, n) in enumerate(zip(f["cu_block_idx_offsets"].tolist(), (3, 2))):
        for m in range(_ceil(lq[b], BS)):
            f["mask_block_idx"][0, a + m * n: a + (m + 1) * n] = torch.arange(n).flip(0)  # descending: wrong
    assert not np.allclose(_fa4_forward_sim(q, k, v, cu_q, cu_k, False, f, 8 ** -0.5).numpy(), exact, atol=1e-3)


class _BlockSparseTensorsTorch(NamedTuple):
    """flash_attn/cute/block_sparsity.py's BlockSparseTensorsTorch, field for field."""

    mask_block_cnt: torch.Tensor
    mask_block_idx: torch.Tensor
    full_block_cnt: torch.Tensor | None = None
    full_block_idx: torch.Tensor | None = None
    cu_total_m_blocks: torch.Tensor | None = None
    cu_block_idx_offsets: torch.Tensor | None = None
    block_size: tuple[int, int] | None = None
    dq_write_order: torch.Tensor | None = None
    dq_write_order_full: torch.Tensor | None = None
    spt: bool | None = None


def _fake_fa4(monkeypatch, varlen):
    root, cute, iface, bsp = (types.ModuleType(n) for n in (
        "flash_attn", "flash_attn.cute", "flash_attn.cute.interface", "flash_attn.cute.block_sparsity"))
    iface.flash_attn_varlen_func = varlen
    bsp.BlockSparseTensorsTorch = _BlockSparseTensorsTorch
    cute.interface, cute.block_sparsity, root.cute = iface, bsp, cute
    for mod in (root, cute, iface, bsp):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)


def _bench_batch(causal):
    lengths = torch.tensor([200, 0, 129, 5, 140])
    problem = suites.Problem("t", B=5, H=2, D=16, max_len=200, lengths_fn=lambda g: lengths, dtype=torch.float32,
                             causal=causal)
    return runner.make_batches(problem, lengths, lengths, 1, "cpu")[0], lengths


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_the_bench_row_runs_fa4_on_the_same_blocks(causal, monkeypatch):
    """sparse._prepare("fa4-blocksparse") hands FA4 (here the simulation behind FA4's signature) the
    converted lists with the packed batch, and its output passes the bench's judge on the same lists;
    the row is forward only."""
    seen = {}

    def varlen(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
               causal=False, block_sparse_tensors=None, **kwargs):
        t = block_sparse_tensors
        seen.update(kwargs=set(kwargs), max=(max_seqlen_q, max_seqlen_k), causal=causal, block_size=t.block_size)
        # interface.py: varlen block sparsity needs cu_total_m_blocks, and cu_block_idx_offsets with cu_seqlens_k
        assert t.cu_total_m_blocks is not None and t.cu_block_idx_offsets is not None
        assert all(x.dtype == torch.int32 for x in t[:6])
        f = t._asdict()
        out = _fa4_forward_sim(q.double(), k.double(), v.double(), cu_seqlens_q, cu_seqlens_k, causal, f,
                               q.shape[-1] ** -0.5)
        return out.to(q.dtype), None

    _fake_fa4(monkeypatch, varlen)
    batch, lengths = _bench_batch(causal)
    csr = _random_csr(lengths.tolist(), lengths.tolist(), 2, causal, 5, p=0.5)
    run = sparse._prepare("fa4-blocksparse", batch, 0.5, None, csr, torch.zeros_like(batch.q))
    assert not run.backward and "bwd n/a" in run.note and run.setup_ms >= 0
    seqs = [0, 2, 3, 4]
    assert sparse._Judge(batch, seqs, csr)(run.packed(run.forward(*run.inputs))).ok
    assert not sparse._Judge(batch, seqs)(run.packed(run.forward(*run.inputs))).ok  # not the dense answer
    assert seen == dict(kwargs=set(), max=(batch.max_q, batch.max_k), causal=causal, block_size=(BS, BS))


def test_the_bench_row_is_not_applicable_without_fa4_or_when_it_refuses(monkeypatch):
    from jfa.bench.impls import NotApplicable

    batch, lengths = _bench_batch(False)
    csr = _random_csr(lengths.tolist(), lengths.tolist(), 2, False, 5)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    with pytest.raises(NotApplicable, match="not importable"):
        sparse._prepare("fa4-blocksparse", batch, 0.5, None, csr, batch.q)

    def refuses(q, k, v, block_sparse_tensors=None, **_):
        raise ValueError("Varlen block sparsity requires sparse_block_size[0]=128")

    _fake_fa4(monkeypatch, refuses)
    with pytest.raises(NotApplicable, match="FA4 refuses: ValueError: Varlen block sparsity"):
        sparse._prepare("fa4-blocksparse", batch, 0.5, None, csr, batch.q)


def _sim_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, causal=False, block_sparse_tensors=None, **_):
    out = _fa4_forward_sim(q.double(), k.double(), v.double(), cu_seqlens_q, cu_seqlens_k, causal,
                           block_sparse_tensors._asdict(), q.shape[-1] ** -0.5)
    return out.to(q.dtype), None


def test_the_bench_rows_status_ok_forward_only_or_na(monkeypatch):
    """A row of python -m jfa.bench.sparse (sparse._judged_and_timed): FA4 on the right blocks is ok with a
    forward time and no backward; FA4 missing is n/a with the reason, not an error."""
    monkeypatch.setattr(sparse, "time_ms", lambda fn, warmup, rep: 1.0)
    batch, lengths = _bench_batch(False)
    csr = _random_csr(lengths.tolist(), lengths.tolist(), 2, False, 5)
    judge = sparse._Judge(batch, [0, 2, 4], csr)
    prepare = lambda: sparse._prepare("fa4-blocksparse", batch, 0.5, None, csr, batch.q)  # noqa: E731
    _fake_fa4(monkeypatch, _sim_varlen)
    row = sparse._judged_and_timed(prepare, judge, 2, 0, 1)
    assert row["status"] == "ok" and row["fwd_ms"] == 1.0 and "bwd_ms" not in row and "bwd n/a" in row["note"]
    assert row["fwd_host_us"] is None  # CPU tensors: host time is measured on a GPU only
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    row = sparse._judged_and_timed(prepare, judge, 2, 0, 1)
    assert row["status"] == "n/a" and "flash_attn.cute not importable" in row["note"]


def test_forward_only_rows_time_the_forward_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(sparse, "time_ms", lambda fn, warmup, rep: calls.append(fn) or 1.0)
    x = torch.zeros(3, 1, 2)
    timed = sparse._time(sparse._Run(lambda q, k, v: q, (x, x, x), x, backward=False), 2, 0, 1)
    assert len(calls) == 2 and timed["fwd_ms"] == 1.0 and "bwd_ms" not in timed
    assert "| t | 0.5 | - | fa4-blocksparse | 1.000 | - |" in sparse.table(
        [dict(problem="t", keep=0.5, impl="fa4-blocksparse", status="ok", **timed)])
