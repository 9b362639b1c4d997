"""Block-sparse attention as users call it (``jfa.block_sparse_attention``, ``jfa.select_kv_blocks``): the
lists a call runs with, their checks, dispatch, autograd and tracing, and the oracle's restriction to
the lists. The kernels' numerics over the adversarial catalogue are judged in test_kernels.py (portable)
and test_tlx_sim.py (TLX on the simulator); the selection's exactness in test_block_select.py."""
import numpy as np
import pytest
import torch

import jfa
from jfa import knobs, oracle
from jfa.api import recording_dispatch
from jfa.fuzz.cases import Case, block_lists_for, make_inputs
from jfa.kernels.block_lists import exact_csr, query_blocks, transpose
from jfa.kernels.schedule import output_offsets
from jfa.reference import attention_reference, torch_ref

CASE = Case((70, 0, 9, 33), (40, 17, 0, 65), heads=2, kv_heads=1, head_dim=16, dtype="fp32", causal=True,
            sparse=("random", 0.5, 16), seed=3)


def _inputs(case=CASE, device="cpu"):
    inp = make_inputs(case, device)
    return inp, block_lists_for(case, inp)


def _np(t):
    return t.detach().cpu().double().numpy()


@pytest.mark.parametrize("chunked", [False, True], ids=["whole-sequences", "row-chunks"])
def test_the_oracle_restriction_agrees_with_the_torch_reference_in_float64(chunked, monkeypatch):
    """Two independent masks from the same lists (NumPy's and torch's) give the same attention: outputs,
    lse and autograd's gradients of the float64 reference against the oracle's analytic backward; also with
    the reference taking each sequence's query rows a few at a time (its chunks of long sequences)."""
    if chunked:
        monkeypatch.setattr(torch_ref, "CHUNK_BYTES", 64 * 8)  # 64 float64 scores
    inp, (offsets, indices) = _inputs()
    kv = (offsets, indices, 16)
    q, k, v = (t.detach().double().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out, lse = attention_reference(q, k, v, inp.cu_q, inp.cu_k, causal=True, kv_blocks=kv)
    out.backward(inp.dout.double())
    o, l = oracle.attention_forward(_np(q), _np(k), _np(v), _np(inp.cu_q).astype(int), _np(inp.cu_k).astype(int),
                                    causal=True, kv_blocks=kv)
    grads = oracle.attention_backward(_np(q), _np(k), _np(v), o, l, _np(inp.dout), _np(inp.cu_q).astype(int),
                                      _np(inp.cu_k).astype(int), causal=True, kv_blocks=kv)
    np.testing.assert_allclose(_np(out), o, atol=1e-12)
    assert np.array_equal(np.isinf(_np(lse)), np.isinf(l))
    for got, want in zip((q.grad, k.grad, v.grad), grads):
        np.testing.assert_allclose(_np(got), want, atol=1e-11)


def test_listing_every_visible_block_is_dense_attention_in_the_oracle():
    """keep_ratio 1.0 lists every block a query block can see: the oracle's restricted attention is then
    the dense one, bit for bit (the same float64 operations on the same visible entries)."""
    case = Case((70, 0, 9, 33), (40, 17, 0, 65), heads=2, head_dim=16, dtype="fp32", causal=True,
                sparse=("ratio", 1.0, 16), seed=4)
    inp, (offsets, indices) = _inputs(case)
    args = (_np(inp.q), _np(inp.k), _np(inp.v), _np(inp.cu_q).astype(int), _np(inp.cu_k).astype(int))
    dense = oracle.attention_forward(*args, causal=True)
    restricted = oracle.attention_forward(*args, causal=True, kv_blocks=(offsets, indices, 16))
    for a, b in zip(dense, restricted):
        assert np.array_equal(a, b)


def test_keep_ratio_one_matches_the_dense_op(device):
    inp, _ = _inputs(device=device)
    dense = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=True)
    sparse = jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, keep_ratio=1.0, block_size=16,
                                        causal=True)
    torch.testing.assert_close(sparse, dense, atol=2e-6, rtol=0)


def test_rows_whose_blocks_are_all_unlisted_give_zero_out_minus_inf_lse_and_zero_gradients(device):
    inp, _ = _inputs(device=device)
    heads, nqb = CASE.heads, sum(-(-n // 16) for n in CASE.lengths_q)
    empty = (torch.zeros(heads * nqb + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out, lse = jfa.block_sparse_attention(q, k, v, inp.cu_q, inp.cu_k, kv_blocks=empty, block_size=16, causal=True,
                                          return_lse=True)
    out.backward(inp.dout)
    assert torch.equal(out, torch.zeros_like(out)) and bool(torch.isneginf(lse).all())
    for grad in (q.grad, k.grad, v.grad):
        assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("rule", [dict(topk=2), dict(keep_ratio=0.5)], ids=["topk2", "ratio0.5"])
def test_a_selection_rule_runs_exactly_the_lists_select_kv_blocks_returns(rule, device):
    inp, _ = _inputs(device=device)
    common = dict(block_size=16, causal=True)
    lists = jfa.select_kv_blocks(inp.q, inp.k, inp.cu_q, inp.cu_k, **common, **rule)
    by_rule = jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, **common, **rule)
    by_lists = jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, kv_blocks=lists, **common)
    by_csr = jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, **common,
                                        kv_blocks=exact_csr(lists, inp.cu_q, inp.cu_k, False, 0))
    assert torch.equal(by_rule, by_lists) and torch.equal(by_rule, by_csr)


def test_the_api_selection_equals_the_oracle_selection_on_exact_inputs(device):
    """Integer-valued q and k: block sums and scores are exact in fp32, so the lists must be identical."""
    g = torch.Generator().manual_seed(5)
    lengths_q, lengths_k = (70, 0, 9, 33), (40, 17, 0, 65)
    q = torch.randint(-3, 4, (sum(lengths_q), 2, 16), generator=g).float()
    k = torch.randint(-3, 4, (sum(lengths_k), 1, 16), generator=g).float()
    cu_q = torch.tensor(np.cumsum((0,) + lengths_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum((0,) + lengths_k), dtype=torch.int32)
    on = [t.to(device) for t in (q, k, cu_q, cu_k)]
    lists = jfa.select_kv_blocks(*on, block_size=16, topk=2, causal=True)
    offsets, indices = exact_csr(lists, on[2], on[3], False, 0)
    want_offsets, want_indices = oracle.select_kv_blocks(q.numpy(), k.numpy(), cu_q.numpy(), cu_k.numpy(),
                                                         block_size=16, topk=2, causal=True)
    assert offsets.tolist() == list(want_offsets) and indices.tolist() == list(want_indices)


def test_the_transposed_lists_name_each_query_block_that_lists_a_key_block(device):
    inp, (offsets, indices) = _inputs(device=device)
    lists = jfa.select_kv_blocks(inp.q, inp.k, inp.cu_q, inp.cu_k, block_size=16, keep_ratio=0.5, causal=True)
    out_cu = output_offsets(inp.cu_q, 4, 0, False, inp.q.device)
    cols = transpose(lists, query_blocks(out_cu, inp.q.shape[0], 16), inp.cu_k, inp.k.shape[0])
    offsets, indices = exact_csr(lists, inp.cu_q, inp.cu_k, False, 0)
    blocks_q = [-(-n // 16) for n in CASE.lengths_q]
    blocks_k = [-(-n // 16) for n in CASE.lengths_k]
    nqb, nks = sum(blocks_q), cols.num_kv_slots
    expected = {}
    for h in range(2):
        g = 0
        for b, (nq, nk) in enumerate(zip(blocks_q, blocks_k)):
            for t in range(nq):
                r = h * nqb + g + t
                for u in indices[offsets[r]:offsets[r + 1]].tolist():
                    expected.setdefault(h * nks + sum(blocks_k[:b]) + u, []).append(t)
            g += nq
    col_offsets, col_indices = cols.offsets.cpu(), cols.indices.cpu()
    got = {c: col_indices[col_offsets[c]:col_offsets[c + 1]].tolist() for c in range(2 * nks)
           if col_offsets[c + 1] > col_offsets[c]}
    assert got == expected


def _call(**overrides):
    inp, lists = _inputs()
    kwargs = dict(kv_blocks=lists, block_size=16, causal=True)
    kwargs.update(overrides)
    return jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, **kwargs)


def _lists(edit):
    inp, (offsets, indices) = _inputs()
    return edit(offsets.clone(), indices.clone())


def _swap_first_two(offsets, indices):
    row = int(torch.nonzero(offsets[1:] - offsets[:-1] >= 2)[0])
    e = int(offsets[row])
    indices[e], indices[e + 1] = indices[e + 1].clone(), indices[e].clone()
    return offsets, indices


def _duplicate_first(offsets, indices):
    row = int(torch.nonzero(offsets[1:] - offsets[:-1] >= 2)[0])
    e = int(offsets[row])
    indices[e + 1] = indices[e]
    return offsets, indices


BAD = [
    (dict(block_size=24), ValueError, "block_size: must be one of"),
    (dict(block_size=16.0), TypeError, "block_size: expected an int"),
    (dict(kv_blocks=None), ValueError, "keep_ratio, topk: give exactly one"),
    (dict(kv_blocks=None, topk=2, keep_ratio=0.5), ValueError, "keep_ratio, topk: give exactly one"),
    (dict(kv_blocks=None, topk=0), ValueError, "topk: must be >= 1"),
    (dict(kv_blocks=None, topk=1.5), TypeError, "topk: expected an int"),
    (dict(kv_blocks=None, keep_ratio=0.0), ValueError, "keep_ratio: must be in (0, 1]"),
    (dict(kv_blocks=None, keep_ratio=1.5), ValueError, "keep_ratio: must be in (0, 1]"),
    (dict(kv_blocks=None, keep_ratio=True), TypeError, "keep_ratio: expected a float"),
    (dict(topk=2), ValueError, "kv_blocks, keep_ratio, topk: give either"),
    (dict(kv_blocks=[1, 2, 3]), TypeError, "kv_blocks: expected (offsets, indices)"),
    (dict(kv_blocks=(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))), ValueError,
     "kv_blocks offsets: expected H * query blocks + 1"),
    (dict(kv_blocks=_lists(lambda o, i: (o.float(), i))), TypeError, "kv_blocks offsets: must be int32 or int64"),
    (dict(kv_blocks=_lists(lambda o, i: (o + 1, i))), ValueError, "kv_blocks offsets: first offset must be 0"),
    (dict(kv_blocks=_lists(lambda o, i: (torch.cat([o[:1], o[2:3], o[1:2], o[3:]]), i))), ValueError,
     "must be non-decreasing"),
    (dict(kv_blocks=_lists(lambda o, i: (o, i[:-1]))), ValueError, "last offset must equal the number of indices"),
    (dict(kv_blocks=_lists(lambda o, i: (o, i + 7))), ValueError, "outside its sequence's"),
    (dict(kv_blocks=_lists(lambda o, i: (o, i - 9))), ValueError, "outside its sequence's"),
    (dict(kv_blocks=_lists(_swap_first_two)), ValueError, "strictly ascending"),
    (dict(kv_blocks=_lists(_duplicate_first)), ValueError, "strictly ascending"),
    (dict(backend="cuda"), ValueError, "backend: must be one of"),
    (dict(backend="tlx"), ValueError, "backend: 'tlx' needs CUDA tensors"),
]


@pytest.mark.parametrize("overrides, exc, words", BAD, ids=[w for _o, _e, w in BAD])
def test_bad_input_is_rejected_with_a_named_rule_before_any_kernel(overrides, exc, words):
    with recording_dispatch() as ran, pytest.raises(exc) as info:
        _call(**overrides)
    assert words in str(info.value)
    assert ran == []


def test_a_listed_block_in_the_causal_future_is_rejected():
    q = torch.randn(48, 2, 16)
    cu = torch.tensor([0, 48], dtype=torch.int32)
    heads, nqb = 2, 3
    offsets = torch.tensor([0, 1] + [1] * (heads * nqb - 1), dtype=torch.int64)
    with pytest.raises(ValueError, match="wholly in its query block's causal future"):
        jfa.block_sparse_attention(q, q, q, cu, cu, kv_blocks=(offsets, torch.tensor([2])), block_size=16, causal=True)
    # the same lists are fine without causal
    jfa.block_sparse_attention(q, q, q, cu, cu, kv_blocks=(offsets, torch.tensor([2])), block_size=16)


def test_lists_selected_for_another_call_are_rejected(device):
    inp, _ = _inputs(device=device)
    lists = jfa.select_kv_blocks(inp.q, inp.k, inp.cu_q, inp.cu_k, block_size=16, topk=1)
    with pytest.raises(ValueError, match="made for block_size 16, the call has 32"):
        jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, kv_blocks=lists, block_size=32)
    with pytest.raises(ValueError, match="selected with causal=False, and this call is causal=True"):
        jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, kv_blocks=lists, block_size=16,
                                   causal=True)
    with pytest.raises(ValueError, match="query block slots"):
        jfa.block_sparse_attention(inp.q[:40], inp.k, inp.v,
                                   torch.tensor([0, 40, 40, 40, 40], dtype=torch.int32, device=inp.q.device),
                                   inp.cu_k, kv_blocks=lists, block_size=16)


def test_which_kernels_names_the_block_sparse_kernels(device):
    inp, _ = _inputs(device=device)
    choice = jfa.which_kernels(inp.q, inp.k, inp.v, block_size=16)
    assert (choice.forward, choice.backward) == ("triton-block-sparse", "triton-block-sparse")


def test_the_tlx_kernels_take_blocks_of_128_and_say_why_not_otherwise():
    sim = pytest.importorskip("jfa.sim", reason="the simulator runs on Triton's CPU interpreter", exc_type=ImportError)
    q = torch.randn(40, 2, 64).bfloat16()
    with sim.simulated(arch=(9, 0)):
        choice = jfa.which_kernels(q, q, q, block_size=128, backend="tlx")
        assert (choice.forward, choice.backward) == ("tlx-hopper-block-sparse", "tlx-hopper-block-sparse")
        with pytest.raises(ValueError, match="'tlx' cannot run this block-sparse call: block_size 64"):
            jfa.which_kernels(q, q, q, block_size=64, backend="tlx")
        with pytest.raises(ValueError, match="'tlx' cannot run this block-sparse call: .*bf16 and fp16 only"):
            jfa.which_kernels(q.float(), q.float(), q.float(), block_size=128, backend="tlx")


def _compiled_and_eager(call, inp):
    torch._dynamo.reset()
    results = []
    for fn in (torch.compile(call, backend="aot_eager", fullgraph=True), call):
        q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
        out = fn(q, k, v)
        out.backward(inp.dout)
        results.append((out, q.grad, k.grad, v.grad))
    return results


@pytest.mark.parametrize("selection", ["lists", "rule"])
def test_torch_compile_traces_a_block_sparse_call_into_one_graph(selection, device):
    """With hints and trusted offsets nothing reads a device value: fullgraph=True holds (the selection is
    a custom op whose fake kernel knows its outputs' sizes), and the compiled call computes bitwise what the
    eager one does."""
    inp, _ = _inputs(device=device)
    lists = jfa.select_kv_blocks(inp.q, inp.k, inp.cu_q, inp.cu_k, block_size=16, topk=2, causal=True)
    rule = dict(kv_blocks=lists) if selection == "lists" else dict(topk=2)

    def call(q, k, v):
        return jfa.block_sparse_attention(q, k, v, inp.cu_q, inp.cu_k, 70, 65, block_size=16, causal=True, **rule)

    with knobs.scope(trust_offsets=True):
        compiled, eager = _compiled_and_eager(call, inp)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


SELECTIONS = [dict(topk=2, causal=True), dict(keep_ratio=0.5), dict(keep_ratio=0.3, causal=True, broadcast_q=True),
              dict(topk=1000)]


@pytest.mark.parametrize("rule", SELECTIONS, ids=lambda r: "-".join(f"{k}{v}" for k, v in r.items()))
def test_the_reference_selection_equals_the_oracle_selection_on_exact_inputs(rule):
    """backend="torch" selects with torch ops (CPU tensors without Triton's interpreter): integer-valued
    inputs make every fp32 score exact, so its lists must be the oracle's."""
    from jfa.reference import select_kv_blocks_reference

    g = torch.Generator().manual_seed(6)
    lengths_q, lengths_k = ((50,), (40, 17, 0, 65)) if rule.get("broadcast_q") else ((70, 0, 9, 33), (40, 17, 0, 65))
    q = torch.randint(-3, 4, (sum(lengths_q), 2, 16), generator=g).float()
    k = torch.randint(-3, 4, (sum(lengths_k), 1, 16), generator=g).float()
    cu_q = None if rule.get("broadcast_q") else torch.tensor(np.cumsum((0,) + lengths_q))
    cu_k = torch.tensor(np.cumsum((0,) + lengths_k))
    got = select_kv_blocks_reference(q, k, cu_q, cu_k, block_size=16, **rule)
    want = oracle.select_kv_blocks(q.numpy(), k.numpy(), None if cu_q is None else cu_q.numpy(), cu_k.numpy(),
                                   block_size=16, **rule)
    assert got[0].tolist() == list(want[0]) and got[1].tolist() == list(want[1])


def test_the_reference_backend_selects_and_attends():
    inp, _ = _inputs()
    with recording_dispatch() as ran:
        out = jfa.block_sparse_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, keep_ratio=1.0, block_size=16,
                                         causal=True, backend="torch")
    dense = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=True, backend="torch")
    assert [kernel for _, kernel, _ in ran] == ["torch"]
    torch.testing.assert_close(out, dense, atol=1e-6, rtol=0)
