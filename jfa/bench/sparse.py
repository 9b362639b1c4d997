"""The block-sparse benchmark (DESIGN.md section 10): jfa's block-sparse kernels beside jfa's dense TLX
kernels and FlexAttention's block mask over the same blocks, in one process on one GPU.

``python -m jfa.bench.sparse --out DIR [--keep 0.25,0.5,0.75] [--repeats 3] [--causal] [--only NAME]
[--impls jfa-dense,jfa-sparse-lists,fa4-blocksparse]``

Problems: the gem suite's longtail-B256-L4096-H4-D128 and full-B8-L4096-H16-D128 (bf16), non-causal
(``--causal``: also their causal versions). Per keep ratio the lists are ``jfa.select_kv_blocks`` at block
128 on the problem's inputs. Every implementation's forward output is judged by the oracle rule before
it is timed, on a subsample of sequences and two heads (the sparse ones restricted to the same lists).

* ``jfa-dense``: ``jfa.jagged_attention(backend="tlx")``, the baseline;
* ``jfa-sparse``: ``jfa.block_sparse_attention(keep_ratio=...)``, the selection inside the timed call;
* ``jfa-sparse-lists``: the same with the lists made beforehand (the selection's cost is the difference);
* ``flex-blockmask``: ``torch.compile(flex_attention)`` over the packed batch as one sequence, with
  ``create_block_mask`` of "same sequence, listed block (and causal)": FlexAttention visits the 128-blocks of
  the packed batch that meet a listed block, masking within them; the mask's build is ``setup_ms``;
* ``fa4-blocksparse``: FlashAttention-4's varlen forward (``flash_attn.cute``, CuTe DSL) with its varlen
  block-sparse tensors made from the same lists (``fa4_block_sparse``; the conversion is ``setup_ms``).
  Forward only: FA4's varlen function takes no backward block lists. n/a (with FA4's message) when FA4 is not
  importable or refuses the configuration.

Timings are ``triton.testing.do_bench`` medians (L2 flushed) of fwd and fwd+bwd, bwd their difference, the
median over ``--repeats`` (a forward-only row: fwd alone). Writes ``sparse.json`` and ``sparse.md`` to
``--out``. Row status: ok, wrong (fails the rule), error (raised), n/a (does not apply; not a failure).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch

from jfa.bench.runner import check_indices, host_us, make_batches, profiled_calls, time_ms
from jfa.bench.suites import get_suite, make_lengths, q_lengths, visible_pairs

PROBLEMS = ("longtail-B256-L4096-H4-D128", "full-B8-L4096-H16-D128")
KEEPS = (0.25, 0.5, 0.75)
BLOCK = 128
CHECK_HEADS = 2
IMPLS = ("jfa-dense", "jfa-sparse", "jfa-sparse-lists", "flex-blockmask", "fa4-blocksparse")
# why the FA4 row has no backward: flash_attn_varlen_func takes no block_sparse_tensors_bwd (flash_attn_func
# does), and FlashAttnVarlenFunc.backward calls _flash_attn_bwd without block sparsity, so its gradients would
# be those of dense attention
FA4_NO_BWD = ("bwd n/a: FA4's flash_attn_varlen_func takes no block_sparse_tensors_bwd, its backward ignores the "
              "blocks")


def _problems(causal: bool, only: str = "") -> list:
    gem = {p.name: p for p in get_suite("gem")}
    out = [gem[name] for name in PROBLEMS if only in name]
    if causal:
        out += [replace(p, name=p.name + "-causal", causal=True) for p in out]
    return out


def _sub_lists(offsets, indices, blocks_q: list, seqs: list, heads: int) -> tuple:
    """The exact CSR of sequences ``seqs`` and the first ``heads`` heads, out of a batch's exact CSR
    (``blocks_q``: query blocks per sequence)."""
    nqb = sum(blocks_q)
    first = [sum(blocks_q[:b]) for b in range(len(blocks_q))]
    new_offsets, new_indices = [0], []
    for h in range(heads):
        for b in seqs:
            for t in range(blocks_q[b]):
                r = h * nqb + first[b] + t
                new_indices += indices[offsets[r]:offsets[r + 1]].tolist()
                new_offsets.append(len(new_indices))
    return torch.tensor(new_offsets, dtype=torch.int64), torch.tensor(new_indices, dtype=torch.int64)


class _Judge:
    """The oracle rule on sequences ``seqs`` and the first CHECK_HEADS heads of one batch; with ``csr`` (the
    batch's exact lists) restricted to them."""

    def __init__(self, batch, seqs: list, csr=None):
        from jfa.fuzz.rule import OutputJudge

        lq, lk = batch.lengths_q.tolist(), batch.lengths_k.tolist()
        oq, ok = [0], [0]
        for a, b in zip(lq, lk):
            oq.append(oq[-1] + a)
            ok.append(ok[-1] + b)
        device = batch.q.device
        self.rows = torch.cat([torch.arange(oq[b], oq[b + 1]) for b in seqs]).to(device)
        keys = torch.cat([torch.arange(ok[b], ok[b + 1]) for b in seqs]).to(device)
        heads = slice(0, CHECK_HEADS)
        self.heads = heads

        def cu(lengths):
            return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)

        kv_blocks = None
        if csr is not None:
            kv_blocks = _sub_lists(*csr, [-(-n // BLOCK) for n in lq], seqs, CHECK_HEADS) + (BLOCK,)
        self.judge = OutputJudge(batch.q[self.rows, heads], batch.k[keys, heads], batch.v[keys, heads],
                                 cu([lq[b] for b in seqs]), cu([lk[b] for b in seqs]), causal=batch.causal,
                                 kv_blocks=kv_blocks)

    def __call__(self, out):
        return self.judge(out[self.rows, self.heads])


def _flex_block_mask(batch, csr, heads: int):
    """FlexAttention's BlockMask over the packed batch (one sequence) for "same sequence, listed block,
    causal if asked", and its build milliseconds (median of 3 after a warm-up)."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = batch.q.device
    lq, lk = batch.lengths_q, batch.lengths_k
    doc_q = torch.repeat_interleave(torch.arange(lq.numel()), lq).to(device)
    doc_k = torch.repeat_interleave(torch.arange(lk.numel()), lk).to(device)
    off_q = torch.cat([torch.zeros(1, dtype=torch.long), lq.cumsum(0)]).to(device)
    off_k = torch.cat([torch.zeros(1, dtype=torch.long), lk.cumsum(0)]).to(device)
    blocks_q = (lq + BLOCK - 1) // BLOCK
    qb_off = torch.cat([torch.zeros(1, dtype=torch.long), blocks_q.cumsum(0)]).to(device)
    nqb = int(blocks_q.sum())
    max_kb = int(((lk + BLOCK - 1) // BLOCK).max())
    offsets, indices = csr
    listed = torch.zeros((heads * nqb, max_kb), dtype=torch.bool)
    rows = torch.repeat_interleave(torch.arange(heads * nqb), offsets[1:] - offsets[:-1])
    listed[rows, indices] = True
    listed = listed.view(heads, nqb, max_kb).to(device)
    shift = (lk - lq).to(device)
    causal = batch.causal

    def mask_mod(b, h, q_idx, kv_idx):
        d = doc_q[q_idx]
        i = q_idx - off_q[d]
        j = kv_idx - off_k[d]
        # (another sequence's key: its block number is clamped only to keep the lookup in bounds)
        keep = (d == doc_k[kv_idx]) & listed[h, qb_off[d] + i // BLOCK, (j // BLOCK).clamp(0, max_kb - 1)]
        if causal:
            keep = keep & (j <= i + shift[d])
        return keep

    total_q, total_k = int(lq.sum()), int(lk.sum())

    def build():
        return create_block_mask(mask_mod, None, heads, total_q, total_k, device=device, BLOCK_SIZE=BLOCK,
                                 _compile=True)

    build()
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        mask = build()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return mask, statistics.median(times)


class _Run:
    """What one implementation times: ``forward(*inputs)`` and the gradient ``grad`` of its output (in its
    layout), ``packed(out)`` its output as [rows, H, D]; ``setup_ms`` untimed set-up."""

    def __init__(self, forward, inputs, grad, packed=None, setup_ms=None, note="", backward=True):
        self.forward, self.inputs, self.grad = forward, inputs, grad
        self.packed = packed or (lambda out: out)
        self.setup_ms, self.note = setup_ms, note
        self.backward = backward  # False: forward only (fwd_ms alone is timed)


def fa4_block_sparse(csr, lengths_q, lengths_k, num_heads: int, block_size: int = BLOCK, causal: bool = False,
                     device=None) -> dict:
    """jfa's exact CSR lists (``csr = (offsets, indices)``, row ``h * NQB + g``, key block numbers within the
    sequence, strictly ascending) as FlashAttention-4's varlen block-sparse tensors: the fields of
    ``flash_attn.cute.block_sparsity.BlockSparseTensorsTorch`` as a dict (torch only, no FA4 import).

    FA4's varlen layout (``block_sparse_utils._get_curr_blocksparse_tensors_varlen``, ``SeqlenInfoQK.create``):
    counts ``[H, total_m_blocks]`` at column ``cu_total_m_blocks[b] + m`` (m: the sequence's m-block, 128 rows
    from its start), indices ``[H, total_n_blocks]`` with the list of (b, m) at columns
    ``cu_block_idx_offsets[b] + m * ceil(Lk_b / 128) + i``, ``i < count``, key block numbers within the sequence.
    So ``cu_total_m_blocks`` is jfa's query-block prefix sum (column = jfa's ``g``) and
    ``cu_block_idx_offsets`` the prefix sum of ``ceil(Lq_b / bs) * ceil(Lk_b / bs)``.

    Each listed block goes to the "full" list when every (row, key) pair in it is visible to the sequence's
    rows (wholly inside the sequence's keys and, under ``causal``, wholly at or before the first row's
    bottom-right diagonal), else to the "mask" list (a sequence's short last key block, the causal diagonal's
    blocks). Both lists keep jfa's ascending order: FA4 walks a list from its last entry and masks the
    sequence end (``mask_seqlen``) on the first block it takes from each list, which is then the sequence's
    last key block whenever that block is listed. Without a mask_mod FA4 computes both lists alike (the causal
    mask on every block, the sequence end on each list's first); the split only says which blocks need masks.
    Unused index slots are 0 (FA4 reads entries ``< count`` only); both widths are at least 1.
    """
    bs = int(block_size)
    lq = torch.as_tensor(lengths_q, dtype=torch.int64).cpu()
    lk = torch.as_tensor(lengths_k, dtype=torch.int64).cpu()
    if lq.shape != lk.shape or lq.dim() != 1:
        raise ValueError(f"lengths_q and lengths_k: one length per sequence, got {tuple(lq.shape)} and "
                         f"{tuple(lk.shape)}")
    heads = int(num_heads)
    bq, bk = (lq + bs - 1) // bs, (lk + bs - 1) // bs
    cu_m = torch.zeros(lq.numel() + 1, dtype=torch.int64)
    cu_m[1:] = torch.cumsum(bq, 0)
    cu_idx = torch.zeros(lq.numel() + 1, dtype=torch.int64)
    cu_idx[1:] = torch.cumsum(bq * bk, 0)
    nqb, ntot = int(cu_m[-1]), int(cu_idx[-1])
    offsets, indices = csr
    o = torch.as_tensor(offsets).to(device="cpu", dtype=torch.int64)
    u = torch.as_tensor(indices).to(device="cpu", dtype=torch.int64)
    if o.numel() != heads * nqb + 1 or int(o[0]) != 0 or int(o[-1]) != u.numel():
        raise ValueError(f"csr: expected {heads} * {nqb} + 1 offsets from 0 to the {u.numel()} indices, got "
                         f"{o.numel()} offsets")
    counts = o[1:] - o[:-1]
    if counts.numel() and int(counts.min()) < 0:
        raise ValueError("csr: offsets must be non-decreasing")
    row = torch.repeat_interleave(torch.arange(heads * nqb), counts)
    h, g = row // max(nqb, 1), row % max(nqb, 1)
    seq = torch.repeat_interleave(torch.arange(lq.numel()), bq)[g]
    t = g - cu_m[seq]
    if bool(((u < 0) | (u >= bk[seq])).any()):
        raise ValueError("csr: a key block index outside its sequence")
    if bool(((row[1:] == row[:-1]) & (u[1:] <= u[:-1])).any()):
        raise ValueError("csr: each row's key blocks must be strictly ascending")
    full = (u + 1) * bs <= lk[seq]
    if causal:
        full &= (u + 1) * bs - 1 <= t * bs + lk[seq] - lq[seq]
    mask_cnt = torch.zeros((heads, max(nqb, 1)), dtype=torch.int32)
    full_cnt = torch.zeros((heads, max(nqb, 1)), dtype=torch.int32)
    mask_idx = torch.zeros((heads, max(ntot, 1)), dtype=torch.int32)
    full_idx = torch.zeros((heads, max(ntot, 1)), dtype=torch.int32)
    for cls, cnt, idx in ((full, full_cnt, full_idx), (~full, mask_cnt, mask_idx)):
        c = cls.to(torch.int64)
        before = torch.cumsum(c, 0) - c  # entries of this class before each entry
        pos = before - before[o[row]]  # rank within the row's list of this class (o[row]: the row's first entry)
        col = cu_idx[seq] + t * bk[seq] + pos
        idx[h[cls], col[cls]] = u[cls].to(torch.int32)
        cnt.index_put_((h[cls], g[cls]), torch.ones(int(cls.sum()), dtype=torch.int32), accumulate=True)
    fields = dict(mask_block_cnt=mask_cnt, mask_block_idx=mask_idx, full_block_cnt=full_cnt, full_block_idx=full_idx,
                  cu_total_m_blocks=cu_m.to(torch.int32), cu_block_idx_offsets=cu_idx.to(torch.int32))
    fields = {k: v.to(device).contiguous() if device is not None else v.contiguous() for k, v in fields.items()}
    fields["block_size"] = (bs, bs)
    return fields


def _fa4_blocksparse(batch, csr, grad) -> _Run:
    """FA4's varlen forward with the lists as its block-sparse tensors; NotApplicable (FA4's message) when FA4
    is missing, lacks block sparsity or refuses the configuration on its first call."""
    import inspect

    from jfa.bench.impls import NotApplicable, find_fa4_varlen

    fn, where = find_fa4_varlen()
    if fn is None:
        raise NotApplicable(where)
    try:
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
        raise NotApplicable(f"flash_attn.cute.block_sparsity not importable ({type(exc).__name__}: {exc})") from exc
    try:
        params = inspect.signature(fn).parameters
        if "block_sparse_tensors" not in params and not any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            raise NotApplicable(f"{where} takes no block_sparse_tensors")
    except (TypeError, ValueError):
        pass
    if batch.cu_q is None or batch.k.shape[1] != batch.q.shape[1]:
        raise NotApplicable("fa4-blocksparse is benchmarked on packed Q with equal head counts")
    if torch.cuda.is_available() and batch.q.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    tensors = BlockSparseTensorsTorch(**fa4_block_sparse(csr, batch.lengths_q, batch.lengths_k, batch.q.shape[1],
                                                         BLOCK, batch.causal, batch.q.device))
    if torch.cuda.is_available() and batch.q.is_cuda:
        torch.cuda.synchronize()
    setup_ms = (time.perf_counter() - start) * 1e3

    def forward(q, k, v):
        out = fn(q, k, v, cu_seqlens_q=batch.cu_q, cu_seqlens_k=batch.cu_k, max_seqlen_q=batch.max_q,
                 max_seqlen_k=batch.max_k, causal=batch.causal, block_sparse_tensors=tensors)
        return out[0] if isinstance(out, (tuple, list)) else out

    try:  # the first call validates and compiles: FA4's refusals are its asserts, ValueErrors and not-implementeds
        with torch.no_grad():
            forward(batch.q, batch.k, batch.v)
    except Exception as exc:  # noqa: BLE001 - anything else (a DSL compile error, a CUDA fault) is an error row
        refusal = (AssertionError, ValueError, NotImplementedError, TypeError)
        if isinstance(exc, refusal) or type(exc).__name__ == "DSLNotImplemented":
            raise NotApplicable(f"FA4 refuses: {type(exc).__name__}: {str(exc)[:300]}") from exc
        raise
    return _Run(forward, (batch.q, batch.k, batch.v), grad, setup_ms=setup_ms, backward=False,
                note=f"the blocks of jfa's lists, {where}; conversion excluded; {FA4_NO_BWD}")


def _prepare(name: str, batch, keep: float, lists, csr, grad) -> _Run:
    import jfa

    inputs = (batch.q, batch.k, batch.v)
    args = (batch.cu_q, batch.cu_k, batch.max_q, batch.max_k)
    if name == "jfa-dense":
        return _Run(lambda q, k, v: jfa.jagged_attention(q, k, v, *args, causal=batch.causal, backend="tlx"),
                    inputs, grad)
    if name == "jfa-sparse":
        return _Run(lambda q, k, v: jfa.block_sparse_attention(q, k, v, *args, keep_ratio=keep, block_size=BLOCK,
                                                               causal=batch.causal, backend="tlx"),
                    inputs, grad, note="selection timed")
    if name == "jfa-sparse-lists":
        return _Run(lambda q, k, v: jfa.block_sparse_attention(q, k, v, *args, kv_blocks=lists, block_size=BLOCK,
                                                               causal=batch.causal, backend="tlx"),
                    inputs, grad, note="lists made beforehand")
    if name == "flex-blockmask":
        from torch.nn.attention.flex_attention import flex_attention

        mask, build_ms = _flex_block_mask(batch, csr, batch.q.shape[1])
        flex = torch.compile(flex_attention, dynamic=False)

        def bhtd(t):  # [T, H, D] -> [1, H, T, D], contiguous, outside the timed calls
            return t.transpose(0, 1).unsqueeze(0).contiguous()

        return _Run(lambda q, k, v: flex(q, k, v, block_mask=mask), tuple(bhtd(t) for t in inputs), bhtd(grad),
                    packed=lambda out: out[0].transpose(0, 1), setup_ms=build_ms,
                    note="the blocks of jfa's lists; mask build excluded")
    if name == "fa4-blocksparse":
        return _fa4_blocksparse(batch, csr, grad)
    raise ValueError(f"unknown impl {name!r}; known: {', '.join(IMPLS)}")


def _time(run: _Run, repeats: int, warmup: int, rep: int) -> dict:
    leaves = [t.detach().requires_grad_() for t in run.inputs]
    forward, grad = run.forward, run.grad

    def fwd():
        with torch.no_grad():
            return forward(*run.inputs)

    def fwd_bwd():
        out = forward(*leaves)
        out.backward(grad)
        for t in leaves:
            t.grad = None

    runs = {"fwd_ms": [], "fwd_bwd_ms": []}
    for _ in range(repeats):
        runs["fwd_ms"].append(time_ms(fwd, warmup, rep))
        if run.backward:
            runs["fwd_bwd_ms"].append(time_ms(fwd_bwd, warmup, rep))
    if not run.backward:
        return dict(fwd_ms=statistics.median(runs["fwd_ms"]), runs=runs)
    fwd_ms, fwd_bwd_ms = statistics.median(runs["fwd_ms"]), statistics.median(runs["fwd_bwd_ms"])
    return dict(fwd_ms=fwd_ms, fwd_bwd_ms=fwd_bwd_ms, bwd_ms=max(fwd_bwd_ms - fwd_ms, 0.0), runs=runs)


def _judged_and_timed(prepare, judge, repeats: int, warmup: int, rep: int) -> dict:
    """One row's outcome: ``prepare()``'s run judged by ``judge`` on its forward output, then timed if it
    passes; status ok, wrong, n/a (``NotApplicable``, with its message) or error (any other exception: one
    implementation failing must not stop the run)."""
    from jfa.bench.impls import NotApplicable

    row = {}
    try:
        prepared = prepare()
        with torch.no_grad():
            verdict = judge(prepared.packed(prepared.forward(*prepared.inputs)))
        row.update(setup_ms=prepared.setup_ms, note=prepared.note, err=verdict.error, allowed=verdict.allowed)
        if not verdict.ok:
            row.update(status="wrong", note=f"fails the oracle rule: {verdict}")
        else:
            row.update(status="ok", **_time(prepared, repeats, warmup, rep))
            # the caller's (CPU) time of one forward: where it exceeds the kernels' time, the GPU waits on it
            # and fwd_ms measures the host, not the kernels
            with torch.no_grad():
                row["fwd_host_us"] = host_us(lambda: prepared.forward(*prepared.inputs), prepared.inputs[0].device)
    except NotApplicable as exc:
        row.update(status="n/a", note=str(exc)[:400])
    except Exception as exc:  # noqa: BLE001
        row.update(status="error", note=f"{type(exc).__name__}: {str(exc)[:300]}")
    return row


def run(out_dir: str, keeps=KEEPS, impls=IMPLS, repeats: int = 3, causal: bool = False, warmup: int = 25,
        rep: int = 100, log=print, only: str = "") -> list:
    """Every (problem, keep, impl) row; also written to ``out_dir``/sparse.json and .md."""
    import jfa
    from jfa.kernels.block_lists import exact_csr

    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for problem in _problems(causal, only):
        lengths_k = make_lengths(problem)
        lengths_q = q_lengths(problem, lengths_k)
        batch = make_batches(problem, lengths_q, lengths_k, 1, device)[0]
        grad = torch.randn_like(batch.q)
        seqs = check_indices(lengths_q, lengths_k)
        pairs = float(visible_pairs(lengths_q, lengths_k, problem.causal).sum())
        for keep in keeps:
            lists = jfa.select_kv_blocks(batch.q, batch.k, batch.cu_q, batch.cu_k, block_size=BLOCK, keep_ratio=keep,
                                         causal=problem.causal, max_seqlen_k=batch.max_k)
            csr = exact_csr(lists, batch.cu_q, batch.cu_k, False, 0)
            listed_share = _listed_share(csr, lengths_q, lengths_k, problem.H, problem.causal)
            judges = {"dense": _Judge(batch, seqs), "sparse": _Judge(batch, seqs, csr)}
            for name in impls:
                if name == "jfa-dense" and keep != keeps[0]:
                    continue  # one dense row per problem
                row = dict(problem=problem.name, keep=None if name == "jfa-dense" else keep, impl=name,
                           listed_block_share=None if name == "jfa-dense" else listed_share, pairs=pairs)
                row.update(_judged_and_timed(functools.partial(_prepare, name, batch, keep, lists, csr, grad),
                                             judges["dense" if name == "jfa-dense" else "sparse"], repeats, warmup,
                                             rep))
                rows.append(row)
                log(json.dumps({k: v for k, v in row.items() if k != "runs"}))
                torch.cuda.empty_cache()
        torch._dynamo.reset()  # a new problem: new static shapes for FlexAttention's compiled graphs
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "sparse.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(out_dir, "sparse.md"), "w") as f:
        f.write(table(rows))
    return rows


def _listed_share(csr, lengths_q, lengths_k, heads: int, causal: bool) -> float:
    """Listed blocks over the blocks the query blocks can see (1.0: dense)."""
    offsets, _ = csr
    visible = 0
    for lq, lk in zip(lengths_q.tolist(), lengths_k.tolist()):
        for t in range(-(-lq // BLOCK)):
            n = -(-lk // BLOCK)
            if causal:
                last = min((t + 1) * BLOCK, lq) - 1 + lk - lq
                n = min(n, last // BLOCK + 1) if last >= 0 else 0
            visible += n
    return float(offsets[-1]) / max(1, visible * heads)


def table(rows: list) -> str:
    """Markdown: per problem and keep ratio, each implementation's fwd and bwd ms and its speed-up over
    jfa's dense kernels."""
    dense = {r["problem"]: r for r in rows if r["impl"] == "jfa-dense" and r.get("status") == "ok"}
    lines = ["| problem | keep | listed | impl | fwd ms | bwd ms | fwd x dense | bwd x dense | fwd host us | status |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = dense.get(r["problem"])
        ok = r.get("status") == "ok"

        def ratio(key):
            return f"{base[key] / r[key]:.2f}" if ok and base and r.get(key) else "-"

        def ms(key):
            return f"{r[key]:.3f}" if ok and r.get(key) is not None else "-"

        host = f"{r['fwd_host_us']:.0f}" if r.get("fwd_host_us") is not None else "-"
        keep = "-" if r["keep"] is None else f"{r['keep']:g}"
        listed = "-" if r.get("listed_block_share") is None else f"{r['listed_block_share']:.2f}"
        lines.append(f"| {r['problem']} | {keep} | {listed} | {r['impl']} | {ms('fwd_ms')} | {ms('bwd_ms')} | "
                     f"{ratio('fwd_ms')} | {ratio('bwd_ms')} | {host} | {r.get('status')} {r.get('note', '')} |")
    return "\n".join(lines) + "\n"


def profile(out_dir: str, keep: float = 0.5, causal: bool = False, calls: int = 5, log=print) -> None:
    """torch.profiler tables (GPU kernels and host ops, by total CUDA time) of the selection, the
    block-sparse fwd+bwd with the lists made beforehand, and the dense fwd+bwd, per problem at ``keep``:
    where the time of each goes. Written to ``out_dir``/profile-<problem>.txt."""
    import jfa

    device = torch.device("cuda", torch.cuda.current_device())
    os.makedirs(out_dir, exist_ok=True)
    for problem in _problems(causal):
        lengths_k = make_lengths(problem)
        batch = make_batches(problem, q_lengths(problem, lengths_k), lengths_k, 1, device)[0]
        grad = torch.randn_like(batch.q)
        leaves = [t.detach().requires_grad_() for t in (batch.q, batch.k, batch.v)]
        args = (batch.cu_q, batch.cu_k, batch.max_q, batch.max_k)
        lists = jfa.select_kv_blocks(batch.q, batch.k, batch.cu_q, batch.cu_k, block_size=BLOCK, keep_ratio=keep,
                                     causal=problem.causal, max_seqlen_k=batch.max_k)
        steps = {
            "select": lambda: jfa.select_kv_blocks(batch.q, batch.k, batch.cu_q, batch.cu_k, block_size=BLOCK,
                                                   keep_ratio=keep, causal=problem.causal, max_seqlen_k=batch.max_k),
            "sparse-fwd-bwd": lambda: jfa.block_sparse_attention(*leaves, *args, kv_blocks=lists, block_size=BLOCK,
                                                                 causal=problem.causal).backward(grad),
            "dense-fwd-bwd": lambda: jfa.jagged_attention(*leaves, *args, causal=problem.causal).backward(grad),
        }
        with open(os.path.join(out_dir, f"profile-{problem.name}.txt"), "w") as f:
            for name, step in steps.items():
                text = profiled_calls(step, calls, warmups=3, host=True).key_averages().table(
                    sort_by="cuda_time_total", row_limit=14)
                f.write(f"## {name} ({calls} calls, keep {keep})\n{text}\n")
                log(f"## {problem.name} {name}\n{text}")


def pool_sweep(out_dir: str, keep: float = 0.5, log=print) -> dict:
    """Microseconds of the selection's pooling (q and k) under each pooling launch (rows per step, heads per
    program, warps) and of the whole selection as it ships, per problem; ``out_dir``/pool-sweep.json."""
    import jfa
    from jfa.kernels.schedule import build_tile_list
    from jfa.kernels.triton import block_select as sel

    device = torch.device("cuda", torch.cuda.current_device())
    os.makedirs(out_dir, exist_ok=True)
    result = {}
    for problem in _problems(False):
        lengths_k = make_lengths(problem)
        b = make_batches(problem, q_lengths(problem, lengths_k), lengths_k, 1, device)[0]
        tiles_q = build_tile_list(b.cu_q, b.q.shape[0], BLOCK)
        tiles_k = build_tile_list(b.cu_k, b.k.shape[0], BLOCK)
        block_d = b.q.shape[2]
        row = {"select (shipped)": 1e3 * time_ms(lambda: jfa.select_kv_blocks(
            b.q, b.k, b.cu_q, b.cu_k, block_size=BLOCK, keep_ratio=keep, max_seqlen_k=b.max_k), 25, 200)}
        for cfg in sel.POOL_CANDIDATES:
            row[f"pool rows={cfg.rows} heads={cfg.heads} warps={cfg.warps}"] = 1e3 * time_ms(
                lambda: (sel.pool_blocks(b.q, b.cu_q, tiles_q, BLOCK, block_d, cfg),
                         sel.pool_blocks(b.k, b.cu_k, tiles_k, BLOCK, block_d, cfg)), 25, 200)
        result[problem.name] = {k: round(v, 1) for k, v in row.items()}
        best = min((v, k) for k, v in row.items() if k.startswith("pool"))
        shipped = f"pool rows={sel.POOL.rows} heads={sel.POOL.heads} warps={sel.POOL.warps}"
        log(f"{problem.name}: select {row['select (shipped)']:.1f} us; pooling as shipped ({shipped}) "
            f"{row[shipped]:.1f} us, best {best[0]:.1f} us ({best[1]})")
    with open(os.path.join(out_dir, "pool-sweep.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jfa.bench.sparse", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for sparse.json and sparse.md")
    ap.add_argument("--keep", default=",".join(map(str, KEEPS)), help="comma-separated keep ratios")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, from: {', '.join(IMPLS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--causal", action="store_true", help="also the causal versions of the problems")
    ap.add_argument("--only", default="", help="only the problems whose name contains this")
    ap.add_argument("--profile", action="store_true", help="instead: torch.profiler tables at keep 0.5 (profile)")
    ap.add_argument("--pool-sweep", action="store_true", help="instead: the selection's pooling launches timed")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the sparse benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.profile:
        profile(args.out, causal=args.causal)
        return 0
    if args.pool_sweep:
        pool_sweep(args.out)
        return 0
    impls = [x for x in args.impls.split(",") if x]
    for name in impls:
        if name not in IMPLS:
            ap.error(f"unknown impl {name!r}; known: {', '.join(IMPLS)}")
    rows = run(args.out, tuple(float(x) for x in args.keep.split(",")), impls, args.repeats, args.causal,
               only=args.only)
    print(table(rows))
    return 1 if any(r.get("status") in ("wrong", "error") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
