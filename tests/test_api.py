"""API behaviour beyond numerics: dispatch, return values, autograd plumbing, reproducibility."""
import pytest
import torch

import jfa
from jfa import knobs
from jfa.fuzz.cases import Case, make_inputs


def _inputs(device, dtype="bf16", causal=False):
    return make_inputs(Case((5, 0, 70), (9, 3, 64), heads=2, head_dim=32, dtype=dtype, causal=causal), device)


def test_return_lse_shapes_and_dtype(device):
    inp = _inputs(device)
    out, lse = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, return_lse=True)
    assert out.shape == inp.q.shape and out.dtype == inp.q.dtype
    assert lse.shape == inp.q.shape[:2] and lse.dtype == torch.float32


def test_broadcast_q_output_rows(device):
    inp = make_inputs(Case((7,), (3, 0, 10), broadcast_q=True), device)
    out = jfa.jagged_attention(inp.q, inp.k, inp.v, None, inp.cu_k, broadcast_q=True)
    assert out.shape == (3 * 7, 2, 32)


def test_auto_backend_on_cpu_follows_the_interpreter():
    from jfa.dispatch import resolve_backend
    from jfa.kernels.triton import interpreter_active

    expected = "triton" if interpreter_active() else "torch"  # --device cpu turns the interpreter on
    assert resolve_backend("auto", torch.device("cpu")) == expected


def test_triton_and_torch_backends_agree_with_each_other(device):
    inp = _inputs(device, "fp32", causal=True)
    a = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=True, backend="triton")
    b = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=True, backend="torch")
    torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_gradients_are_bitwise_reproducible(device):
    inp = _inputs(device)
    grads = []
    for _ in range(3):
        q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
        jfa.jagged_attention(q, k, v, inp.cu_q, inp.cu_k, deterministic=True).backward(inp.dout)
        grads.append((q.grad, k.grad, v.grad))
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            assert torch.equal(a, b)


def test_lse_gradient_flows(device):
    """d(sum lse)/dq from the kernel matches the torch reference (the dlse path of the backward)."""
    inp = _inputs(device, "fp32", causal=True)
    grads = []
    for backend in ("triton", "torch"):
        q = inp.q.detach().requires_grad_()
        out, lse = jfa.jagged_attention(q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=True, backend=backend,
                                        return_lse=True)
        torch.where(torch.isinf(lse), 0.0, lse).sum().backward()
        grads.append(q.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


def test_custom_op_registration_passes_opcheck(device):
    from jfa.api import _triton_forward

    inp = _inputs(device, "fp32")
    args = (inp.q.requires_grad_(), inp.k, inp.v, inp.cu_q, inp.cu_k, False, 0.2, False, 3, 0, 70, 8, -1, False)
    torch.library.opcheck(_triton_forward, args, test_utils=("test_schema", "test_faketensor",
                                                             "test_autograd_registration"))


def test_backward_op_registration_passes_opcheck(device):
    """The backward custom op's schema and fake kernel (torch.compile traces it in a model's backward)."""
    from jfa.api import _triton_backward

    inp = _inputs(device, "fp32")
    out, lse = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, backend="triton", return_lse=True)
    for dlse in (None, torch.randn_like(lse)):
        args = (inp.q, inp.k, inp.v, out, lse, inp.dout.to(out.dtype), dlse, inp.cu_q, inp.cu_k, False, 0.2, False,
                3, 0, 8, -1, True)
        torch.library.opcheck(_triton_backward, args, test_utils=("test_schema", "test_faketensor"))


def test_max_seqlen_hints_need_no_values_read(monkeypatch, device):
    """With trusted offsets (JFA_TRUST_OFFSETS) and both hints, the offsets are not read back to the host."""
    import jfa.dispatch as dispatch

    monkeypatch.setattr(dispatch, "check_offsets_values", lambda *a: pytest.fail("offsets were read"))
    inp = _inputs(device)
    with knobs.scope(trust_offsets=True):
        out = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, 70, 64)
    assert out.shape == inp.q.shape


def _compiled_and_eager(inp, call, fullgraph: bool) -> list:
    """[(out, dq, dk, dv) of ``call(q, k, v)`` compiled by torch.compile (aot_eager: Dynamo and
    AOTAutograd trace it, the ops run their own kernels), the same of the eager call]."""
    torch._dynamo.reset()
    results = []
    for fn in (torch.compile(call, backend="aot_eager", fullgraph=fullgraph), call):
        q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
        out = fn(q, k, v)
        out.backward(inp.dout)
        results.append((out, q.grad, k.grad, v.grad))
    return results


def _portable_call(inp):
    return lambda q, k, v: jfa.jagged_attention(q, k, v, inp.cu_q, inp.cu_k, 70, 64, causal=True, backend="triton")


def test_torch_compile_traces_a_call_into_one_graph_when_the_offsets_are_trusted(device):
    """With both hints and JFA_TRUST_OFFSETS=1 nothing reads a device value: fullgraph=True holds, and
    the compiled call computes bitwise what the eager call does (the same kernels run)."""
    inp = _inputs(device, "fp32", causal=True)
    with knobs.scope(trust_offsets=True):
        compiled, eager = _compiled_and_eager(inp, _portable_call(inp), fullgraph=True)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


def test_torch_compile_with_dynamic_shapes_takes_new_batches_without_recompiling(device):
    """Every training batch has other lengths (token count, batch size, longest sequence): one graph
    serves them all, and each compiled call computes what the eager call does."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()

    def call(q, k, v, cu, longest):
        return jfa.jagged_attention(q, k, v, cu, cu, longest, longest, causal=True, backend="triton")

    compiled = torch.compile(call, backend=counter, fullgraph=True, dynamic=True)
    with knobs.scope(trust_offsets=True):
        for lengths in ((5, 0, 30, 17), (7, 9, 3), (40, 1, 2, 3, 4)):
            inp = make_inputs(Case(lengths, lengths, heads=2, head_dim=32, dtype="fp32", causal=True), device)
            args = (inp.q, inp.k, inp.v, inp.cu_k, max(lengths))
            assert torch.equal(compiled(*args), call(*args))
    assert counter.frame_count == 1


def test_the_tlx_ops_autograd_traces_under_torch_compile(monkeypatch, device):
    """AOTAutograd traces a custom op's autograd formula with fake tensors, which have no data pointer:
    the TLX backward's choice (its TMA layout rules read data_ptr) must wait until the op runs. On CPU,
    the TLX launchers are stood in for by the portable ones and ``supports`` runs only its layout rules;
    the compiled training step must then equal the eager one."""
    if device != "cpu":
        pytest.skip("a CPU stand-in; on the GPU tests/test_tlx_gpu.py compiles the real TLX path")
    from jfa import api
    from jfa.kernels.tlx.common.host import layout_problem
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.tlx.hopper import forward as tlx_forward
    from jfa.kernels.triton import backward as portable_backward
    from jfa.kernels.triton import forward as portable_forward

    def layout_rules_only(*tensors, k=None, v=None):
        named = [(f"t{i}", t) for i, t in enumerate(tensors) if isinstance(t, torch.Tensor)] + [("k", k), ("v", v)]
        problems = [p for p in (layout_problem(n, t) for n, t in named if t is not None) if p]
        return (not problems, problems[0] if problems else "")

    monkeypatch.setattr(tlx_forward, "supports", layout_rules_only)
    monkeypatch.setattr(tlx_backward, "supports", layout_rules_only)
    monkeypatch.setattr(tlx_forward, "jagged_forward_tlx",
                        lambda *args, longest_q, **kwargs: portable_forward.jagged_forward(*args, **kwargs))
    monkeypatch.setattr(tlx_backward, "jagged_backward_tlx",
                        lambda *args, deterministic, **kwargs: portable_backward.jagged_backward(*args, **kwargs))
    # a head dim the TLX backward takes (64), or the choice never reaches the layout rules
    inp = make_inputs(Case((5, 0, 70), (9, 3, 64), heads=2, head_dim=64, dtype="fp32"), device)

    def step(q, k, v):  # compiled: the custom ops; eager: their autograd.Function twin (both: the stand-ins)
        return api._attention("tlx", q, k, v, inp.cu_q, inp.cu_k, False, 0.125, False, 3, 0, 70, -1, -1, False)[0]

    compiled, eager = _compiled_and_eager(inp, step, fullgraph=True)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


def test_eager_calls_skip_the_custom_op_and_traced_calls_use_it(monkeypatch, device):
    """Eager calls run the kernels through an autograd.Function (the custom op's dispatch costs ~150 us
    of host time per call); torch.compile sees the custom ops, whose fake kernels it traces."""
    from jfa import api

    inp = _inputs(device, "fp32", causal=True)
    refuse = lambda *args, **kwargs: pytest.fail("the wrong path was taken")  # noqa: E731
    monkeypatch.setattr(api, "_FORWARD_OPS", {"triton": refuse, "tlx": refuse})
    q = inp.q.detach().requires_grad_()
    jfa.jagged_attention(q, inp.k, inp.v, inp.cu_q, inp.cu_k, backend="triton").backward(inp.dout)
    assert q.grad is not None
    monkeypatch.undo()
    call = _portable_call(inp)
    with knobs.scope(trust_offsets=True):
        eager = call(inp.q, inp.k, inp.v)
        monkeypatch.setattr(api._EagerAttention, "apply", refuse)
        torch._dynamo.reset()
        assert torch.equal(torch.compile(call, backend="aot_eager", fullgraph=True)(inp.q, inp.k, inp.v), eager)


def test_a_call_with_nothing_to_differentiate_skips_autograd_and_returns_the_same(monkeypatch, device):
    """Inference (``torch.no_grad``, or inputs that need no gradient) runs the forward without autograd's
    Function, whose apply is host time per call; out and lse equal a differentiable call's, and a
    differentiable call of the same structure afterwards (the same call plan) still gets its gradients."""
    from jfa import api
    from jfa.plans import plans

    inp = _inputs(device, "fp32", causal=True)
    plans.clear()

    def call(q):
        return jfa.jagged_attention(q, inp.k, inp.v, inp.cu_q, inp.cu_k, causal=True, backend="triton",
                                    deterministic=True, return_lse=True)

    q = inp.q.detach().requires_grad_()
    out, lse = call(q)
    out.backward(inp.dout)
    expected_grad = q.grad.clone()
    monkeypatch.setattr(api._EagerAttention, "apply", lambda *a: pytest.fail("autograd ran for an inference call"))
    with torch.no_grad():
        inference = [call(q)]
    inference.append(call(inp.q.detach()))
    for out_i, lse_i in inference:
        assert out_i.grad_fn is None and not out_i.requires_grad
        assert torch.equal(out_i, out) and torch.equal(lse_i, lse)
    monkeypatch.undo()
    q.grad = None
    again, _ = call(q)
    assert again.grad_fn is not None, "a differentiable call after inference calls lost its autograd node"
    again.backward(inp.dout)
    assert torch.equal(q.grad, expected_grad)


def test_torch_compile_keeps_validating_the_offsets(monkeypatch, device):
    """Untrusted offsets are read back (a graph break, not an error), so a compiled call still refuses
    bad offsets and still computes what the eager call does."""
    inp = _inputs(device, "fp32", causal=True)
    compiled, eager = _compiled_and_eager(inp, _portable_call(inp), fullgraph=False)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
    inp = _inputs(device)
    bad = inp.cu_k.clone()
    bad[-1] += 1  # last offset past the key count
    call = torch.compile(lambda: jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, bad, backend="triton"),
                         backend="aot_eager")
    with pytest.raises(ValueError, match="cu_seqlens_k: last offset must equal the token count"):
        call()


def test_which_kernels_on_cpu_names_the_portable_kernel_and_why(device):
    if device != "cpu":
        pytest.skip("about CPU tensors under the interpreter (the GPU side: tests/test_tlx_gpu.py)")
    q = torch.randn(5, 2, 64, dtype=torch.bfloat16)
    choice = jfa.which_kernels(q, q, q)
    assert (choice.forward, choice.backward) == ("triton", "triton")  # the suite runs under the interpreter
    assert "interpreter" in choice.reason
    assert jfa.which_kernels(q, q, q, backend="torch").forward == "torch"
    with pytest.raises(ValueError, match="'tlx' needs CUDA tensors"):
        jfa.which_kernels(q, q, q, backend="tlx")


def test_tlx_variant_switches_parse_and_reject_typos():
    from jfa.kernels.tlx.hopper.forward import SHIPPED, Variant

    assert Variant.parse("") == SHIPPED
    assert Variant.parse("schedule=dynamic, pingpong=0") == Variant(schedule="dynamic", pingpong=False)
    assert Variant.parse("q_regs=0") == Variant(q_regs=False) and SHIPPED.q_regs is None  # None: the config's
    for bad, words in (("schedul=dynamic", "unknown switch"), ("peel=maybe", "peel: must be 0, 1, true or false"),
                       ("q_regs=maybe", "q_regs: must be 0, 1, true or false"),
                       ("schedule=lifo", "schedule"), ("pingpong", "key=value")):
        with pytest.raises(ValueError, match=words):
            Variant.parse(bad)


def test_tlx_forward_takes_the_counter_on_long_causal_sequences_only():
    from jfa.kernels.tlx.hopper.forward import LONG_CAUSAL_TILES, SHIPPED, Variant

    long_rows = LONG_CAUSAL_TILES * 128 * 3  # three sequences averaging LONG_CAUSAL_TILES items of 128 rows
    launch = dict(rows=long_rows, num_seqs=3, tile_rows=128)
    assert SHIPPED.for_launch(causal=True, window=(-1, -1), **launch).dynamic
    assert SHIPPED.for_launch(causal=False, window=(-1, 0), **launch).dynamic, "the window (-1, 0) is causal"
    assert not SHIPPED.for_launch(causal=True, window=(-1, -1), **dict(launch, rows=long_rows - 1)).dynamic
    assert not SHIPPED.for_launch(causal=False, window=(-1, -1), **launch).dynamic
    assert not SHIPPED.for_launch(causal=True, window=(256, 0), **launch).dynamic, "windows stay zig-zag"
    assert not Variant.parse("long_causal_schedule=zigzag").for_launch(causal=True, window=(-1, -1), **launch).dynamic
    assert Variant.parse("schedule=dynamic").for_launch(causal=False, window=(-1, -1), **launch).dynamic
    with pytest.raises(ValueError, match="long_causal_schedule: must be one of"):
        Variant.parse("long_causal_schedule=static")


def test_validation_learns_the_longest_sequences_from_the_offsets_or_the_trusted_hints(device):
    from jfa.dispatch import validate

    inp = _inputs(device)
    call = dict(causal=False, softmax_scale=None, deterministic=False, precision="auto", backend="auto",
                return_lse=False)
    read = validate(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, None, None, broadcast_q=False, **call)
    assert (read.longest_q, read.longest_k) == (70, 64)
    with knobs.scope(trust_offsets=True):
        hinted = validate(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, 80, 96, broadcast_q=False, **call)
    assert (hinted.longest_q, hinted.longest_k) == (80, 96), "trusted hints stand for the offsets unread"
    bcast = make_inputs(Case((7,), (3, 0, 10), broadcast_q=True), device)
    problem = validate(bcast.q, bcast.k, bcast.v, None, bcast.cu_k, None, None, broadcast_q=True, **call)
    assert (problem.longest_q, problem.longest_k) == (7, 10)


def test_the_tlx_forward_launcher_is_told_the_longest_query_sequence(monkeypatch):
    """The Hopper TLX forward deals long causal launches by how uneven their lengths are: the op passes the
    longest query sequence it validated to that launcher (and to no other, whose signature has no such rule)."""
    from jfa import api
    from jfa.kernels.tlx.hopper import forward as tlx_forward
    from jfa.kernels.triton import forward as portable_forward

    told = {}

    def stand_in(name):  # the launcher's keyword arguments, and the outputs' shapes
        def launch(q, k, v, cu_q, cu_k, **kwargs):
            told[name] = kwargs
            return torch.zeros_like(q), q.new_zeros(q.shape[:2], dtype=torch.float32)
        return launch

    monkeypatch.setattr(tlx_forward, "jagged_forward_tlx", stand_in("tlx"))
    monkeypatch.setattr(portable_forward, "jagged_forward", stand_in("triton"))
    inp = _inputs("cpu", "fp32", causal=True)
    with torch.no_grad():
        for backend in ("tlx", "triton"):
            api._attention(backend, inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, True, 0.125, False, 3, 0, 70, -1, 0,
                           False)
    assert told["tlx"]["longest_q"] == 70 and "longest_q" not in told["triton"]


def test_tlx_forward_deals_long_causal_sequences_of_even_lengths_zigzag_unless_very_long():
    from jfa.kernels.tlx.hopper.forward import (LONG_CAUSAL_TILES, SHIPPED, UNEVEN_LENGTHS,
                                                VERY_LONG_CAUSAL_TILES)

    def dynamic(mean_tiles: int, longest_rows: int) -> bool:
        return SHIPPED.for_launch(causal=True, window=(-1, -1), rows=mean_tiles * 128 * 4, num_seqs=4, tile_rows=128,
                                  longest_rows=longest_rows).dynamic

    mean = LONG_CAUSAL_TILES * 128
    assert not dynamic(LONG_CAUSAL_TILES, mean), "sequences of one length: zig-zag balances them"
    assert not dynamic(LONG_CAUSAL_TILES, int(UNEVEN_LENGTHS * mean) - 1)
    assert dynamic(LONG_CAUSAL_TILES, int(UNEVEN_LENGTHS * mean)), "the longest 1.5x the mean: the counter"
    assert dynamic(LONG_CAUSAL_TILES, None), "lengths unknown: taken as uneven"
    assert not dynamic(VERY_LONG_CAUSAL_TILES - 1, (VERY_LONG_CAUSAL_TILES - 1) * 128)
    assert dynamic(VERY_LONG_CAUSAL_TILES, VERY_LONG_CAUSAL_TILES * 128), "very long sequences: the counter"


def test_tlx_backward_switches_parse_and_reject_typos():
    from jfa.kernels.tlx.hopper.backward import SHIPPED, BackwardVariant

    assert BackwardVariant.parse("") == SHIPPED and SHIPPED.persistent
    assert BackwardVariant.parse("persistent=0") == BackwardVariant(persistent=False)
    assert BackwardVariant.parse("sparse_schedule=static").dynamic(sparse=True) is False
    assert BackwardVariant.parse("dense_schedule=dynamic").dynamic(sparse=False) is True
    assert SHIPPED.dynamic(sparse=True) and not SHIPPED.dynamic(sparse=False)
    # dense causal or windowed builds take their items from the counter (their items' costs differ)
    assert SHIPPED.dynamic(sparse=False, causal=True) and SHIPPED.dynamic(sparse=False, window=True)
    assert BackwardVariant.parse("masked_schedule=static").dynamic(sparse=False, causal=True) is False
    assert not SHIPPED.dynamic(sparse=False, causal=True, mx=True), "the MX builds have no counter"
    for bad, words in (("dq_reduce=atomic", "unknown switch"), ("persistent=2", "persistent: must be 0, 1"),
                       ("sparse_schedule=zigzag", "sparse_schedule: must be one of")):
        with pytest.raises(ValueError, match=words):
            BackwardVariant.parse(bad)


def test_the_next_item_prefetch_is_taken_exactly_where_a_producer_dq_launch_has_short_items():
    """Two K/V slot pairs (``item_prefetch="short"``, what ships) only in the producer's-dQ build (D 64 with the
    fused dQ, never MX) and only where a launch's items average at most PREFETCH_MAX_STEPS query steps (a
    broadcast Q's limit is its own; an estimate that is missing counts as long); "always" and "never" regardless
    of the steps."""
    from jfa.kernels.tlx.hopper.backward import PREFETCH_MAX_STEPS, SHIPPED, BackwardVariant, config_for

    producer_dq, halves, no_dq = config_for(64, True), config_for(128, True), config_for(64, False)
    assert producer_dq.dq == "producer" and SHIPPED.item_prefetch == "short"
    for bcast in (False, True):
        assert SHIPPED.kv_buffers(producer_dq, steps=PREFETCH_MAX_STEPS[bcast], broadcast_q=bcast) == 2
        assert SHIPPED.kv_buffers(producer_dq, steps=PREFETCH_MAX_STEPS[bcast] + 0.5, broadcast_q=bcast) == 1
    assert PREFETCH_MAX_STEPS[True] > PREFETCH_MAX_STEPS[False], "a broadcast Q's steps come from L2"
    assert SHIPPED.kv_buffers(producer_dq) == 1, "no estimate (a window, block-sparse lists): one pair"
    for cfg in (halves, no_dq):
        assert SHIPPED.kv_buffers(cfg, steps=1) == 1 and BackwardVariant(item_prefetch="always").kv_buffers(cfg) == 1
    assert SHIPPED.kv_buffers(producer_dq, mx=True, steps=1) == 1
    assert BackwardVariant.parse("item_prefetch=always").kv_buffers(producer_dq, steps=100) == 2
    assert BackwardVariant.parse("item_prefetch=never").kv_buffers(producer_dq, steps=1) == 1
    with pytest.raises(ValueError, match="item_prefetch: must be one of"):
        BackwardVariant.parse("item_prefetch=1")


def test_a_work_items_query_steps_are_estimated_from_the_calls_structure():
    """``item_steps``: the query heads of an item times a sequence's mean query rows in BLOCK_M tiles (a broadcast
    Q's own length), halved under a causal mask; no sequence at all estimates no steps."""
    from jfa.kernels.tlx.hopper.backward import item_steps

    plain = dict(broadcast_q=False, len_q_bcast=0, group=1, causal=False, block_m=64)
    assert item_steps(4096, 16, **plain) == 4.0
    assert item_steps(4096, 16, **{**plain, "group": 4}) == 16.0
    assert item_steps(4096, 16, **{**plain, "causal": True}) == 2.0
    assert item_steps(64 * 100, 100, **{**plain, "broadcast_q": True, "len_q_bcast": 320}) == 5.0
    assert item_steps(0, 0, **plain) == 0.0


def test_the_ablation_switches_reach_the_launchers_through_the_knobs():
    from jfa.kernels.tlx.hopper import backward, forward

    with knobs.scope(tlx_variant="pingpong=0,schedule=dynamic", tlx_bwd_variant="persistent=0"):
        assert forward.variant_from_knobs() == forward.Variant(schedule="dynamic", pingpong=False)
        assert backward.variant_from_knobs() == backward.BackwardVariant(persistent=False)
    assert forward.variant_from_knobs() == forward.SHIPPED and backward.variant_from_knobs() == backward.SHIPPED


def _nested(lengths, seed=0, requires_grad=True, device="cpu"):
    """A jagged NestedTensor built on ``device`` (a leaf: ``.to(device)`` of one would not be)."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, 2, 16, generator=g) for n in lengths]
    return torch.nested.nested_tensor(seqs, layout=torch.jagged, requires_grad=requires_grad, device=device)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_jagged_nested_tensors_in_give_a_nested_tensor_out_with_gradients(device):
    q, k, v = (_nested((3, 0, 5), seed=s, device=device) for s in (1, 2, 3))
    out = jfa.jagged_attention(q, k, v, causal=True)
    assert out.is_nested and out.layout == torch.jagged and torch.equal(out.offsets().cpu(), q.offsets().cpu())
    out.values().sum().backward()
    packed = [t.values().detach().requires_grad_() for t in (q, k, v)]
    ref = jfa.jagged_attention(*packed, q.offsets(), k.offsets(), causal=True)
    ref.sum().backward()
    assert torch.equal(out.values(), ref)
    for nt, flat in zip((q, k, v), packed):
        assert torch.equal(nt.grad.values(), flat.grad)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nested_tensor_mistakes_say_what_to_do():
    q, k, v = _nested((3, 4)), _nested((3, 4)), _nested((3, 4))
    with pytest.raises(ValueError, match=r"\.transpose\(1, 2\)"):
        jfa.jagged_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    with pytest.raises(TypeError, match="all of them as jagged NestedTensors or none"):
        jfa.jagged_attention(q, k.values(), v.values(), q.offsets(), q.offsets())
    with pytest.raises(ValueError, match="must be None with NestedTensor inputs"):
        jfa.jagged_attention(q, k, v, q.offsets(), q.offsets())
    strided = torch.nested.nested_tensor([torch.randn(3, 2, 16), torch.randn(4, 2, 16)])
    with pytest.raises(TypeError, match="layout=torch.jagged"):
        jfa.jagged_attention(strided, strided, strided)


def test_without_the_interpreter_a_cpu_call_says_it_runs_the_reference(monkeypatch, caplog):
    import logging

    from jfa import dispatch

    monkeypatch.setattr("jfa.kernels.triton.interpreter_active", lambda: False)
    dispatch._fallbacks_logged.clear()
    with caplog.at_level(logging.INFO, logger="jfa"):
        assert dispatch.resolve_backend("auto", torch.device("cpu")) == "torch"
        assert dispatch.resolve_backend("auto", torch.device("cpu")) == "torch"
    messages = [r.getMessage() for r in caplog.records if "PyTorch reference" in r.getMessage()]
    assert len(messages) == 1 and "TRITON_INTERPRET=1" in messages[0]


def test_fullgraph_without_trusted_offsets_names_the_fix(device):
    inp = _inputs(device, "fp32")
    torch._dynamo.reset()
    call = torch.compile(lambda q, k, v: jfa.jagged_attention(q, k, v, inp.cu_q, inp.cu_k, backend="triton"),
                         backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="JFA_TRUST_OFFSETS=1") as caught:
        call(inp.q, inp.k, inp.v)
    assert "max_seqlen_q and max_seqlen_k" in str(caught.value)


def test_the_public_api_is_typed_and_documented():
    import inspect
    from pathlib import Path

    assert (Path(jfa.__file__).parent / "py.typed").exists()
    for fn in (jfa.jagged_attention, jfa.which_kernels):
        sig = inspect.signature(fn)
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), fn.__name__
        assert sig.return_annotation is not inspect.Signature.empty
        assert all(section in fn.__doc__ for section in ("Args:", "Returns:", "Raises:")), fn.__name__
    documented = jfa.jagged_attention.__doc__
    missing = [name for name in inspect.signature(jfa.jagged_attention).parameters if name not in documented]
    assert not missing, missing
