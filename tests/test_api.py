"""API behaviour beyond numerics: dispatch, return values, autograd plumbing, reproducibility."""
import pytest
import torch

import jfa
from jfa.testing import Case, make_inputs


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
    from jfa.api import _resolve_backend
    from jfa.kernels.triton import interpreter_active

    expected = "triton" if interpreter_active() else "torch"  # --device cpu turns the interpreter on
    assert _resolve_backend("auto", torch.device("cpu")) == expected


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
    args = (inp.q.requires_grad_(), inp.k, inp.v, inp.cu_q, inp.cu_k, False, 0.2, False, 3, 0, False)
    torch.library.opcheck(_triton_forward, args, test_utils=("test_schema", "test_faketensor",
                                                             "test_autograd_registration"))


def test_backward_op_registration_passes_opcheck(device):
    """The backward custom op's schema and fake kernel (torch.compile traces it in a model's backward)."""
    from jfa.api import _triton_backward

    inp = _inputs(device, "fp32")
    out, lse = jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, backend="triton", return_lse=True)
    for dlse in (None, torch.randn_like(lse)):
        args = (inp.q, inp.k, inp.v, out, lse, inp.dout.to(out.dtype), dlse, inp.cu_q, inp.cu_k, False, 0.2, False,
                3, 0, True)
        torch.library.opcheck(_triton_backward, args, test_utils=("test_schema", "test_faketensor"))


def test_max_seqlen_hints_need_no_values_read(monkeypatch, device):
    """With JFA_TRUST_OFFSETS=1 and both hints, the offsets are not read back to the host."""
    import jfa.api as api

    monkeypatch.setenv("JFA_TRUST_OFFSETS", "1")
    monkeypatch.setattr(api, "_check_offsets_values", lambda *a: pytest.fail("offsets were read"))
    inp = _inputs(device)
    jfa.jagged_attention(inp.q, inp.k, inp.v, inp.cu_q, inp.cu_k, 70, 64)


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


def test_torch_compile_traces_a_call_into_one_graph_when_the_offsets_are_trusted(monkeypatch, device):
    """With both hints and JFA_TRUST_OFFSETS=1 nothing reads a device value: fullgraph=True holds, and
    the compiled call computes bitwise what the eager call does (the same kernels run)."""
    monkeypatch.setenv("JFA_TRUST_OFFSETS", "1")
    inp = _inputs(device, "fp32", causal=True)
    compiled, eager = _compiled_and_eager(inp, _portable_call(inp), fullgraph=True)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


def test_torch_compile_with_dynamic_shapes_takes_new_batches_without_recompiling(monkeypatch, device):
    """Every training batch has other lengths (token count, batch size, longest sequence): one graph
    serves them all, and each compiled call computes what the eager call does."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    monkeypatch.setenv("JFA_TRUST_OFFSETS", "1")
    counter = CompileCounter()

    def call(q, k, v, cu, longest):
        return jfa.jagged_attention(q, k, v, cu, cu, longest, longest, causal=True, backend="triton")

    compiled = torch.compile(call, backend=counter, fullgraph=True, dynamic=True)
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
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.tlx.hopper import forward as tlx_forward
    from jfa.kernels.triton import backward as portable_backward
    from jfa.kernels.triton import forward as portable_forward

    def layout_rules_only(q, head_dim, dtype, *, k=None, v=None):
        problems = [tlx_forward._layout_problem(n, t) for n, t in (("q", q), ("k", k), ("v", v)) if t is not None]
        problems = [p for p in problems if p]
        return (not problems, problems[0] if problems else "")

    monkeypatch.setattr(tlx_forward, "supports", layout_rules_only)
    monkeypatch.setattr(tlx_forward, "jagged_forward_tlx", portable_forward.jagged_forward)
    monkeypatch.setattr(tlx_backward, "jagged_backward_tlx",
                        lambda *args, deterministic, **kwargs: portable_backward.jagged_backward(*args, **kwargs))
    # a head dim the TLX backward takes (64), or the choice never reaches the layout rules
    inp = make_inputs(Case((5, 0, 70), (9, 3, 64), heads=2, head_dim=64, dtype="fp32"), device)

    def step(q, k, v):  # compiled: the custom ops; eager: their autograd.Function twin (both: the stand-ins)
        return api._attention("tlx", q, k, v, inp.cu_q, inp.cu_k, False, 0.125, False, 3, 0, False)[0]

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
    monkeypatch.setenv("JFA_TRUST_OFFSETS", "1")
    call = _portable_call(inp)
    eager = call(inp.q, inp.k, inp.v)
    monkeypatch.setattr(api._EagerAttention, "apply", refuse)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(call, backend="aot_eager", fullgraph=True)(inp.q, inp.k, inp.v), eager)


def test_torch_compile_keeps_validating_the_offsets(monkeypatch, device):
    """Untrusted offsets are read back (a graph break, not an error), so a compiled call still refuses
    bad offsets and still computes what the eager call does."""
    monkeypatch.delenv("JFA_TRUST_OFFSETS", raising=False)
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
    for bad, words in (("schedul=dynamic", "unknown switch"), ("peel=maybe", "peel: must be 0, 1, true or false"),
                       ("schedule=lifo", "schedule")):
        with pytest.raises(ValueError, match=words):
            Variant.parse(bad)


@pytest.mark.parametrize("name", ["JFA_TLX_FUSED_DQ", "JFA_TLX_OWN_WAITS", "JFA_TRUST_OFFSETS"])
def test_boolean_environment_switches_parse_one_way_and_reject_typos(name, monkeypatch):
    """Every boolean JFA_* switch takes 0/1/true/false (any case) and means its default when unset or
    empty; a typo is a ValueError naming the variable, never a silent "off"."""
    from jfa.flags import env_flag

    monkeypatch.delenv(name, raising=False)
    assert env_flag(name, True) is True and env_flag(name, False) is False
    for text, value in (("1", True), (" TRUE ", True), ("0", False), ("false", False), ("", True)):
        monkeypatch.setenv(name, text)
        assert env_flag(name, True) is value
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=f"{name}: must be 0, 1, true or false"):
        env_flag(name, False)


def test_own_waits_can_name_the_kernels_it_applies_to(monkeypatch):
    """JFA_TLX_OWN_WAITS takes a boolean (every TLX kernel or none) or TLX kernel names, and unset means
    what ships (the dK/dV kernel only); a name that is not a TLX kernel is a ValueError that says what
    the variable takes."""
    from jfa.kernels.tlx import pipeline

    monkeypatch.setenv(pipeline.ENV, "jagged_dkdv_tlx_kernel")
    assert pipeline.enabled("jagged_dkdv_tlx_kernel") and not pipeline.enabled("jagged_fwd_tlx_kernel")
    assert pipeline.enabled()  # some kernel does
    monkeypatch.setenv(pipeline.ENV, " jagged_fwd_tlx_kernel , jagged_dkdv_tlx_kernel ")
    assert all(pipeline.enabled(k) for k in pipeline.KERNELS)
    monkeypatch.setenv(pipeline.ENV, "1")
    assert all(pipeline.enabled(k) for k in pipeline.KERNELS)
    monkeypatch.delenv(pipeline.ENV)  # unset: what ships, own waits for the dK/dV kernel only
    assert pipeline.enabled("jagged_dkdv_tlx_kernel") and not pipeline.enabled("jagged_fwd_tlx_kernel")
    monkeypatch.setenv(pipeline.ENV, "0")
    with pipeline.own_waits(None):
        assert pipeline.enabled("jagged_dkdv_tlx_kernel")
    assert not pipeline.enabled("jagged_dkdv_tlx_kernel")  # restored
    for bad in ("jagged_dkdv_kernel", "jagged_dkdv_tlx_kernel,fwd", ","):
        monkeypatch.setenv(pipeline.ENV, bad)
        with pytest.raises(ValueError, match="JFA_TLX_OWN_WAITS: must be 0, 1, true, false or comma-separated"):
            pipeline.enabled()


def test_the_switches_read_their_variables(monkeypatch):
    """The readers of the boolean switches go through the one parser (a typo raises in each)."""
    from jfa import api
    from jfa.kernels.tlx import pipeline
    from jfa.kernels.tlx.hopper.backward import fused_dq_default

    for name, read in (("JFA_TLX_FUSED_DQ", fused_dq_default), ("JFA_TLX_OWN_WAITS", pipeline.enabled),
                       ("JFA_TRUST_OFFSETS", api._trust_offsets)):
        monkeypatch.setenv(name, "1")
        assert read() is True
        monkeypatch.setenv(name, "0")
        assert read() is False
        monkeypatch.setenv(name, "on")
        with pytest.raises(ValueError, match=name):
            read()


def test_tlx_backward_switches_parse_and_refuse_what_drops_dq(monkeypatch):
    from jfa.kernels.tlx.hopper.backward import SHIPPED, BackwardVariant, default_variant

    assert BackwardVariant.parse("") == SHIPPED
    assert SHIPPED.dq_in_producer
    assert BackwardVariant.parse("dq_in_producer=0, dq_first=1, schedule=round-robin") == BackwardVariant(
        dq_in_producer=False, dq_first=True, schedule="round-robin")
    for bad, words in (("dq_reduce=tma-pair", "dq_reduce"), ("dq-first=2", "dq_first: must be 0, 1, true or false"),
                       ("dq_in_producer=0,dq_reduce=atomic,dq_first=1", "dq_first"), ("fused=1", "unknown switch"),
                       ("dq_reduce=atomic", "consumers' dQ: add dq_in_producer=0"),
                       ("rows64=1,dq_in_producer=0", "rows64: only with the producer's dQ"),
                       ("rows64=1", "rows64=1 needs steps64=0")):
        with pytest.raises(ValueError, match=words):
            BackwardVariant.parse(bad)
    assert SHIPPED.steps64 and SHIPPED.halves_send_late  # D 128 ships the 64-row steps (session 11)
    monkeypatch.setenv("JFA_TLX_BWD_VARIANT", "dq_in_producer=0,dq_reduce=atomic")
    assert default_variant() == BackwardVariant(dq_in_producer=False, dq_reduce="atomic")
    assert BackwardVariant.parse("dq_first=1,dq_send_late=0") == BackwardVariant(dq_first=True, dq_send_late=False)
    for timing_only in ("dq_in_producer=0,dq_reduce=none", "dq_in_producer=0,dq_reduce=stage-only",
                        "dq_reduce=none", "dq_reduce=stage-only"):
        monkeypatch.setenv("JFA_TLX_BWD_VARIANT", timing_only)
        with pytest.raises(ValueError, match="no dQ"):
            default_variant()


def test_the_atomic_dq_has_no_64_row_d128_build_and_says_how_to_reach_one():
    """dq_reduce='atomic' (the consumers' element-wise atomics) exists for the 32-row builds only: at
    D 128 the variant must say steps64=0, and without it the build is refused (before any kernel runs,
    the launcher computes the build's constants first), not compiled without a dQ reduction."""
    from jfa.kernels.tlx.hopper.backward import BackwardVariant, compile_spec

    atomic = BackwardVariant(dq_in_producer=False, dq_reduce="atomic")
    with pytest.raises(ValueError, match="at D 128 add steps64=0"):
        compile_spec("bf16", 128, causal=False, broadcast_q=False, fused_dq=True, variant=atomic)
    for head_dim, variant in ((128, BackwardVariant(steps64=False, dq_in_producer=False, dq_reduce="atomic")),
                              (64, atomic)):
        constants = compile_spec("bf16", head_dim, causal=False, broadcast_q=False, fused_dq=True,
                                 variant=variant)[2]
        assert constants["DQ_REDUCE"] == 1 and not constants["DQ_HALVES"]
