"""Offline compile gate for the TLX Hopper kernels (no GPU needed): every shipped forward config (bf16/fp16
x D 64/128 x causal x broadcast-Q), its ablation variants and timeline build, and the dK/dV kernel
(D 64/128) compile for sm_90a with wgmma, no spills, shared memory within the SM, and the structure the design relies on (warp-specialised
partitions with setmaxnreg, TMA loads, mbarrier waits, the pingpong named barriers, no wgmma
serialisation), and each kernel's launcher, bound on CPU tensors, asks for exactly the build compiled
(signature, constants, the dK/dV build's LLVM setting). The compile runs in a child process because this test process has Triton's interpreter
switched on. These tests say it builds as designed; that it is right is the GPU suite's job."""
import itertools
import json
import math


import pytest
import torch

from jfa.fuzz.compile_gate import SM90_SHARED_LIMIT, WGMMA_SERIALISED, tlx_targets

# The CPU suite compiles one build per family, the one with the most live state (causal + broadcast Q,
# windows, grouped heads, the fused dQ, the sparse lists, MX dequantisation, the dynamic schedule and the
# timeline), at both head dims where the configs differ; the gate (``--sim-scope full``, ``jfa
# compile-check``) compiles every target (about 10 s each on 2 cores: all of them would take the suite's budget).
SUITE_TARGETS = (
    "tlx-forward-bf16-D64-causal-bcastq", "tlx-forward-bf16-D128-causal-bcastq",
    "tlx-forward-bf16-D64[schedule=dynamic,profile]", "tlx-forward-bf16-D128-causal-bcastq[schedule=dynamic]",
    "tlx-forward-bf16-D128-causal[pingpong=0]",
    "tlx-forward-bf16-D128-causal-window", "tlx-forward-bf16-D128-gqa4", "tlx-forward-bf16-D128-bcastq-sparse",
    "tlx-forward-mxfloor-bf16-D64-causal", "tlx-forward-mxfloor-bf16-D128-causal-bcastq",
    "tlx-dkdv-bf16-D64-causal", "tlx-dkdv-bf16-D128-bcastq", "tlx-dkdv-bf16-D64-bcastq[fused-dq]",
    "tlx-dkdv-bf16-D128-causal[fused-dq]", "tlx-dkdv-bf16-D128-causal[fused-dq,profile]",
    "tlx-dkdv-bf16-D128-causal-window[fused-dq]", "tlx-dkdv-bf16-D128-gqa4",
    "tlx-dkdv-bf16-D64-causal-sparse[fused-dq]", "tlx-dkdv-bf16-D128-bcastq-sparse[fused-dq]",
    "tlx-dkdv-mxrceil-bf16-D128", "tlx-dkdv-mxfloor-fp32-D128-causal",
)
TARGETS = [pytest.param(t.name, id=t.name, marks=() if t.name in SUITE_TARGETS else pytest.mark.slow)
           for t in tlx_targets()]


@pytest.fixture(scope="module")
def results(device, compile_gate, request):
    if device != "cpu":  # minutes of compiles; on a GPU machine the GPU tests compile and run them
        pytest.skip("the offline compile gate runs in the CPU suite")
    return compile_gate("tlx", () if request.config.getoption("--sim-scope") == "full" else SUITE_TARGETS)


def test_the_suite_compiles_real_targets_of_every_kernel():
    names = {t.name for t in tlx_targets()}
    assert set(SUITE_TARGETS) <= names, sorted(set(SUITE_TARGETS) - names)
    assert {t.kernel for t in tlx_targets() if t.name in SUITE_TARGETS} == {"forward", "dkdv"}


def test_every_shipped_config_is_a_target():
    from jfa.kernels.tlx.hopper.forward import SUPPORTED_HEAD_DIMS

    combos = {(t.dtype, t.head_dim, t.causal, t.broadcast_q) for t in tlx_targets() if not t.mx}
    assert combos == {(dt, d, c, b) for dt in ("bf16", "fp16") for d in SUPPORTED_HEAD_DIMS
                      for c in (False, True) for b in (False, True)}


@pytest.mark.parametrize("name", TARGETS)
def test_tlx_kernel_compiles_for_sm90a_as_designed(name, results, record_property):
    from jfa.kernels.tlx.hopper import backward, forward

    row = results[name]
    details = row["details"]
    target = row["target"]
    record_property("resources", json.dumps({k: row[k] for k in ("registers", "local_bytes", "shared_bytes")}))
    assert row["tensor_core_ops"] > 0, "no wgmma"
    assert row["local_bytes"] == 0 and row["stack_bytes"] == 0, "spills"
    assert details["ptxas_spill_bytes"] == 0, "ptxas reports spill stores"
    assert 0 < row["shared_bytes"] <= SM90_SHARED_LIMIT
    module = backward if target["kernel"] == "dkdv" else forward
    assert details["warp_specialize"] == 1 and details["partitions"] == module.NUM_CONSUMERS
    if target["kernel"] == "dkdv":  # fewer where the producer computes dQ
        regs = backward.config_for(target["head_dim"], target["fused_dq"], target["mx"]).consumer_regs
    else:
        regs = module.config_for(target["head_dim"], target["mx"]).consumer_regs
    assert regs in details["setmaxnreg"]["inc"]
    assert details["setmaxnreg"]["dec"], "the producer never gives registers back"
    if target["mx"]:  # the MXFP8 producer loads E4M3 bytes into registers to dequantize them: no TMA
        assert details["vector_loads"] > 0, "the MX producer's loads are not 16-byte vectors"
    else:
        assert details["tma_loads"] > 0 and details["expect_tx"] > 0, "no TMA loads"
    assert details["mbarrier_waits"] > 0
    assert not set(details["ptxas_warnings"]) & WGMMA_SERIALISED, "ptxas serialises the wgmma pipeline"
    if target["kernel"] == "forward":
        pingpong = "pingpong=0" not in target["switches"]
        assert details["named_barriers"] == ([9, 10] if pingpong else []), "pingpong named barriers wrong"
    assert details["launch_binds_as_compiled"], "a launch would specialise to a different signature"
    assert row["ok"], "; ".join(row["problems"])  # (dK/dV: also the launch's LLVM setting, as compiled)


def test_imports_and_refuses_on_cpu_without_touching_a_gpu():
    from jfa.kernels.tlx.hopper import forward

    q = torch.zeros(4, 2, 128, dtype=torch.bfloat16)
    ok, reason = forward.supports(q, 128, torch.bfloat16)
    assert not ok and "CUDA" in reason
    assert not forward.supports(q.float(), 128, torch.float32)[0]
    assert "head_dim" in forward.supports(q[..., :96], 96, torch.bfloat16)[1]
    with pytest.raises(ValueError, match="jagged_forward_tlx"):
        forward.jagged_forward_tlx(q, q, q, torch.tensor([0, 4]), torch.tensor([0, 4]), causal=False,
                                   softmax_scale=0.1, broadcast_q=False, num_seqs=1)


def test_layout_rules_for_tma():
    from jfa.kernels.tlx.common.host import layout_problem, view_2d

    fused = torch.zeros(10, 3, 4, 64, dtype=torch.bfloat16)  # a [T, 3, H, D] projection: q/k/v are views
    view = view_2d(fused[:, 1])
    assert (view.rows, view.width, view.row_stride, view.col_stride) == (10, 4 * 64, 3 * 4 * 64, 64)
    assert layout_problem("k", fused[:, 1]) is None
    assert "16 bytes" in layout_problem("q", torch.zeros(10, 2, 68, dtype=torch.bfloat16)[..., :60])
    assert "overlap" in layout_problem("q", torch.zeros(10, 64, dtype=torch.bfloat16)[:, None, :].expand(10, 2, 64))


def test_every_mx_forward_build_is_a_target():
    """The MXFP8 forward's builds are compiled by the gate: both head dims, both P rules, the three output
    dtypes, causal, broadcast Q, grouped heads."""
    mx = [t for t in tlx_targets() if t.mx]
    assert {t.head_dim for t in mx} == {64, 128} and {t.mx for t in mx} == {"floor", "rceil"}
    assert {t.dtype for t in mx} == {"bf16", "fp16", "fp32"}
    assert any(t.causal for t in mx) and any(t.broadcast_q for t in mx) and any(t.group > 1 for t in mx)


def test_every_mx_dkdv_build_is_a_target():
    """The MXFP8 dK/dV builds are compiled by the gate: both head dims, both rules, causal, broadcast Q, grouped
    heads (fp32 partials), bf16 and fp32 gradients."""
    mx = [t for t in tlx_targets() if t.mx and t.kernel == "dkdv"]
    assert {t.head_dim for t in mx} == {64, 128} and {t.mx for t in mx} == {"floor", "rceil"}
    assert {t.dtype for t in mx} == {"bf16", "fp32"}
    assert any(t.causal for t in mx) and any(t.broadcast_q for t in mx) and any(t.group > 1 for t in mx)


def test_variants_and_timeline_build_are_targets():
    names = {t.name for t in tlx_targets()}
    for variant in ("schedule=dynamic", "pingpong=0", "peel=0", "profile"):
        assert any(f"[{variant}" in n or f",{variant}]" in n for n in names), variant
    assert {"tlx-dkdv-bf16-D64", "tlx-dkdv-bf16-D64-causal", "tlx-dkdv-bf16-D64-bcastq", "tlx-dkdv-bf16-D128",
            "tlx-dkdv-bf16-D128-causal", "tlx-dkdv-fp16-D128-bcastq"} <= names


def test_every_causal_forward_build_has_its_counter_build_as_a_target():
    """Long causal launches take the counter (``Variant.for_launch``): that build ships too, for every config."""
    targets = tlx_targets()
    names = {t.name for t in targets}
    shipped_causal = [t for t in targets if t.kernel == "forward" and t.causal and not (
        t.switches or t.window or t.sparse or t.mx or t.profile or t.group > 1)]
    assert len(shipped_causal) == 8  # bf16, fp16 x D 64, 128 x broadcast Q or not
    assert all(f"{t.name}[schedule=dynamic]" in names for t in shipped_causal)


@pytest.mark.parametrize("lengths", [(0, 5, 1, 8, 3, 0), (4, 4), (1,), (0,)], ids=["mixed", "aligned", "one", "empty"])
def test_dkdv_row_stats_start_every_sequence_on_an_aligned_column(lengths, device):
    """The dK/dV kernel's TMA-loaded statistics: each sequence's rows at a column that is a multiple of
    COLUMN_ALIGN (TMA's innermost coordinate must be 16-byte aligned), lse in base 2 with +inf for rows
    that saw no key, delta beside it, zeros in the gaps (a box reaching past a sequence must read finite
    values)."""
    cu = torch.tensor((0,) + tuple(itertools.accumulate(lengths)), dtype=torch.int32)
    rows, heads = int(cu[-1]), 3
    g = torch.Generator().manual_seed(0)
    lse = torch.randn(rows, heads, generator=g)
    lse[::3, 1] = float("-inf")
    delta = torch.randn(rows, heads, generator=g)
    from jfa.kernels.tlx.hopper import row_stats as stats_pass

    stats, stats_cu = stats_pass.row_stats(lse.to(device), delta.to(device), cu.to(device), len(lengths))
    stats, stats_cu = stats.cpu(), stats_cu.cpu()
    align = stats_pass.COLUMN_ALIGN
    assert align % 4 == 0
    assert stats.shape[0] == 2 * heads and stats.shape[1] % align == 0 and int(stats_cu[-1]) <= stats.shape[1]
    assert (stats_cu % align == 0).all()
    expected = torch.zeros_like(stats)
    for b, n in enumerate(lengths):
        cols = slice(int(stats_cu[b]), int(stats_cu[b]) + n)
        lse_b = lse[int(cu[b]):int(cu[b + 1])].t()
        expected[:heads, cols] = torch.where(lse_b == float("-inf"), float("inf"), lse_b * math.log2(math.e))
        expected[heads:, cols] = delta[int(cu[b]):int(cu[b + 1])].t()
    torch.testing.assert_close(stats, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("with_dlse", [False, True], ids=["no-dlse", "dlse"])
@pytest.mark.parametrize("lengths", [(0, 5, 1, 40, 3, 0), (70,), (0,)], ids=["mixed", "one", "empty"])
def test_dkdv_row_stats_compute_delta_from_the_outputs(lengths, with_dlse, device):
    """The fused backward's pre-pass: the statistics with delta computed in the same pass from O and dO
    (minus dlse) equal the statistics of the portable pre-pass's delta (``row_delta``): the same fp32
    products, summed in an order that may differ (1e-6 on sums of 64 products of unit normals)."""
    from jfa.kernels.tlx.hopper import row_stats as stats_pass
    from jfa.kernels.triton.backward import row_delta

    cu = torch.tensor((0,) + tuple(itertools.accumulate(lengths)), dtype=torch.int32, device=device)
    rows, heads, head_dim = int(cu[-1]), 2, 64
    g = torch.Generator().manual_seed(1)
    out, dout = (torch.randn(rows, heads, head_dim, generator=g).to(device, torch.bfloat16) for _ in range(2))
    lse = torch.randn(rows, heads, generator=g).to(device)
    dlse = torch.randn(rows, heads, generator=g).to(device) if with_dlse else None
    fused, fused_cu = stats_pass.row_stats(lse, None, cu, len(lengths), outputs=(out, dout, dlse))
    expected, expected_cu = stats_pass.row_stats(lse, row_delta(out, dout, dlse), cu, len(lengths))
    assert torch.equal(fused_cu.cpu(), expected_cu.cpu())
    torch.testing.assert_close(fused.cpu(), expected.cpu(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("lengths", [(0, 5, 1, 70, 3, 0), (1,)], ids=["mixed", "one-row"])
def test_dkdv_row_stats_pass_zeroes_the_dq_accumulator(lengths, device):
    """The fused backward's pre-pass also zeroes the fp32 dQ accumulator (allocated uninitialised): every
    element of every row and head, tail rows of a block included, and the statistics are those of the
    pass without it."""
    from jfa.kernels.tlx.hopper import row_stats as stats_pass

    cu = torch.tensor((0,) + tuple(itertools.accumulate(lengths)), dtype=torch.int32, device=device)
    rows, heads, head_dim = int(cu[-1]), 3, 64
    g = torch.Generator().manual_seed(2)
    out, dout = (torch.randn(rows, heads, head_dim, generator=g).to(device, torch.bfloat16) for _ in range(2))
    lse = torch.randn(rows, heads, generator=g).to(device)
    accum = torch.full((rows, heads, head_dim), float("nan"), device=device)
    stats, stats_cu = stats_pass.row_stats(lse, None, cu, len(lengths), outputs=(out, dout, None), zero=accum)
    expected, expected_cu = stats_pass.row_stats(lse, None, cu, len(lengths), outputs=(out, dout, None))
    assert torch.equal(accum.cpu(), torch.zeros(rows, heads, head_dim))
    assert torch.equal(stats.cpu(), expected.cpu()) and torch.equal(stats_cu.cpu(), expected_cu.cpu())
    with pytest.raises(ValueError, match="row_stats: zero must be"):
        stats_pass.row_stats(lse, lse, cu, len(lengths), zero=accum)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fused_dq_accumulator_reads_back_as_dq(head_dim, device):
    """The fused dQ's fp32 accumulator is shaped like q and starts at zero; its TMA box is one query
    step's rows of one head (half the head dim where dQ is reduced by halves: the D 128 build); it reads
    back as dq in q's dtype and shape."""
    from jfa.kernels.tlx.hopper import backward

    rows, heads = 37, 3
    q = torch.empty(rows, heads, head_dim, dtype=torch.bfloat16, device=device)
    dq = torch.randn(rows, heads, head_dim, generator=torch.Generator().manual_seed(rows)).to(device)
    accum = backward.DqAccumulator(q)
    assert accum.tensor.shape == q.shape and accum.tensor.dtype == torch.float32 and not accum.tensor.any()
    desc = accum.descriptor()
    assert desc.block_shape == [64, 64 if head_dim == 128 else head_dim]
    assert desc.shape == [rows, heads * head_dim] and desc.strides == [heads * head_dim, 1]
    accum.tensor.copy_(dq)
    got = accum.read().cpu()
    assert got.shape == q.shape and got.dtype == q.dtype and got.is_contiguous()
    assert torch.equal(got, dq.cpu().to(torch.bfloat16))


def test_the_compile_switches_are_part_of_the_compilation_cache_key():
    """Own waits change what a TLX compile produces, so the setting must change Triton's cache key (a
    build with the generic pipeliner must never be reused for one without); installing twice is a no-op."""
    from triton import knobs as triton_knobs

    from jfa import knobs
    from jfa.kernels.tlx import pipeline

    pipeline.install()
    hook = triton_knobs.runtime.add_stages_inspection_hook
    pipeline.install()
    assert triton_knobs.runtime.add_stages_inspection_hook is hook
    keys = {}
    for setting in (False, True, "jagged_dkdv_tlx_kernel", None):
        with knobs.scope(tlx_own_waits=setting):
            keys[setting] = hook()
    assert len({keys[False], keys[True], keys["jagged_dkdv_tlx_kernel"]}) == 3
    assert keys[None] == keys["jagged_dkdv_tlx_kernel"]  # the default: what ships, the dK/dV kernel only
    with knobs.scope(tlx_own_waits="jagged_dkdv_tlx_kernel"):
        assert pipeline.enabled("jagged_dkdv_tlx_kernel") and not pipeline.enabled("jagged_fwd_tlx_kernel")


def test_the_compile_switches_are_seen_by_their_own_thread_only():
    """The pipeline's compile-time switches (no generic pipeliner, LLVM at O0) wrap Triton's functions once
    and read a per-context flag: a compile in another thread at the same moment is untouched, and the
    wrappers stay in place after the block (swapping Triton's functions per compile raced)."""
    import threading

    from triton._C.libtriton import llvm, passes

    from jfa.kernels.tlx import pipeline

    pipeline.install()
    optimize, add_pipeline = llvm.optimize_module, passes.ttgpuir.add_pipeline
    assert getattr(optimize, "_jfa_wrapped", False) and getattr(add_pipeline, "_jfa_wrapped", False)
    seen = []
    with pipeline._llvm_at_o0(), pipeline._without_generic_pipeline():
        other = threading.Thread(target=lambda: seen.append((pipeline._in_llvm_o0_compile.get(),
                                                             pipeline._in_own_waits_compile.get())))
        other.start()
        other.join()
        assert pipeline._in_llvm_o0_compile.get() and pipeline._in_own_waits_compile.get()
    assert seen == [(False, False)]
    assert not pipeline._in_llvm_o0_compile.get() and not pipeline._in_own_waits_compile.get()
    assert llvm.optimize_module is optimize and passes.ttgpuir.add_pipeline is add_pipeline


def test_a_build_that_asks_for_llvm_o0_gets_its_own_cache_key_and_the_knob_overrides_it():
    """A launch whose config leaves its LLVM IR to ptxas (``build_llvm_o0``) compiles another build, so it
    must change Triton's cache key; ``knobs.tlx_llvm_o0``, when set, decides instead (False: LLVM
    everywhere). The D 128 fused-dQ config asks for it, no other."""
    from triton import knobs as triton_knobs

    from jfa import knobs
    from jfa.kernels.tlx import pipeline
    from jfa.kernels.tlx.hopper import backward

    pipeline.install()
    hook = triton_knobs.runtime.add_stages_inspection_hook
    with knobs.scope(tlx_llvm_o0=None):
        plain = hook()
        assert not pipeline.llvm_o0("jagged_dkdv_tlx_kernel")
        with pipeline.build_llvm_o0("jagged_dkdv_tlx_kernel", True):
            asked = hook()
            assert pipeline.llvm_o0("jagged_dkdv_tlx_kernel") and not pipeline.llvm_o0("jagged_fwd_tlx_kernel")
            with knobs.scope(tlx_llvm_o0=False):  # the knob wins over the build
                assert not pipeline.llvm_o0("jagged_dkdv_tlx_kernel") and hook() != asked
        assert asked[0] != plain[0] and asked[1] != plain[1]
        assert not pipeline.llvm_o0("jagged_dkdv_tlx_kernel") and hook() == plain  # restored
        with pipeline.build_llvm_o0("jagged_dkdv_tlx_kernel", False):
            assert hook() == plain
        with knobs.scope(tlx_llvm_o0="jagged_dkdv_tlx_kernel"):
            assert hook() == asked
    configs = {(d, f): backward.config_for(d, f) for d in (64, 128) for f in (True, False)}
    assert [key for key, c in configs.items() if c.llvm_o0] == [(128, True)]


def test_blackwell_builds_keep_the_partition_registers_their_source_states():
    """On sm_100 Triton's optimize_partition_warps overwrites the ``registers=`` of a TLX source's partitions
    (the Blackwell forward's softmax warpgroups asked for 192 and got 88): inside a TLX ttgir compile the
    wrapped pass adds nothing, outside it (and in another thread) it runs, and the cache key says so."""
    import threading

    from triton import knobs as triton_knobs
    from triton._C.libtriton import passes

    from jfa.kernels.tlx import pipeline

    pipeline.install()
    add = passes.ttgpuir.add_optimize_partition_warps
    assert getattr(add, "_jfa_wrapped", False)
    seen = []
    with pipeline._own_partition_registers():
        assert add(None) is None  # skipped: never touches the (absent) pass manager
        other = threading.Thread(target=lambda: seen.append(pipeline._in_tlx_ttgir_compile.get()))
        other.start()
        other.join()
    assert seen == [False] and not pipeline._in_tlx_ttgir_compile.get()
    with pytest.raises(TypeError):  # outside: the real pass, which needs a real pass manager
        add(None)
    key, digest = triton_knobs.runtime.add_stages_inspection_hook()
    assert "jfa-own-partition-registers" in key and "jfa-own-partition-registers" in digest


# The TLX Blackwell forward for sm_100a: two builds in the suite (one per head dim, between them causal,
# broadcast Q, grouped heads, bf16 and fp16; about 10 s each), every shipped build in the gate
# (``jfa compile-check --backend blackwell``). The dK/dV kernel: its fullest build (D 128 with the fused dQ:
# all 512 TMEM columns, shared memory closest to the limit; about 18 s), the others in the gate.
BLACKWELL_SUITE = ("blackwell-forward-bf16-D128-causal-gqa4", "blackwell-forward-fp16-D64-bcastq")
BLACKWELL_BACKWARD_SUITE = ("blackwell-dkdv-bf16-D128-causal[fused-dq]",)


@pytest.fixture(scope="module")
def blackwell_results(device):
    if device != "cpu":
        pytest.skip("the offline compile gate runs in the CPU suite")
    from jfa.fuzz.compile_gate import run_out_of_process

    return run_out_of_process("blackwell", only=BLACKWELL_SUITE + BLACKWELL_BACKWARD_SUITE, jobs=1)


def test_every_shipped_blackwell_config_is_a_gate_target():
    from jfa.fuzz.compile_gate import blackwell_targets
    from jfa.kernels.tlx.blackwell.backward import SUPPORTED_HEAD_DIMS as BACKWARD_HEAD_DIMS
    from jfa.kernels.tlx.blackwell.forward import SUPPORTED_HEAD_DIMS

    targets = blackwell_targets()
    assert {(t.dtype, t.head_dim, t.causal, t.broadcast_q) for t in targets if t.kernel == "forward"} == {
        (dt, d, c, b) for dt in ("bf16", "fp16") for d in SUPPORTED_HEAD_DIMS for c in (False, True)
        for b in (False, True)}
    # the dK/dV kernel: with the fused dQ and without it (the deterministic backward's), causal or not
    assert {(t.dtype, t.head_dim, t.causal, t.fused_dq) for t in targets if t.kernel == "dkdv"} == {
        (dt, d, c, f) for dt in ("bf16", "fp16") for d in BACKWARD_HEAD_DIMS for c in (False, True)
        for f in (True, False)}
    assert all(t.arch == 100 for t in targets)
    assert set(BLACKWELL_SUITE + BLACKWELL_BACKWARD_SUITE) <= {t.name for t in targets}


def _compiles_offline(backend: str, targets) -> tuple:
    """(whether the one target of ``targets()`` passes the compile gate's ``backend``, why not, its result row or
    None where the compiler died)."""
    from jfa.fuzz.compile_gate import run_out_of_process

    (name,) = [t.name for t in targets()]
    try:
        row = run_out_of_process(backend, jobs=1)[name]
    except RuntimeError as exc:  # the compiler died
        return False, str(exc), None
    return row["ok"], "; ".join(row["problems"]), row


def test_the_toolchain_lowers_cluster_launch_control_exactly_where_the_launchers_say(device):
    """The Blackwell forward's CLC build compiles for sm_100a (with clusterlaunchcontrol.try_cancel and its query in
    the PTX) exactly when ``TOOLCHAIN_LOWERS_CLC`` says so: a GPU launch then runs it. Triton 3.8 with uTLX
    3.8.0.post16 registers neither CLC op (the compile crashes after saying so): when a toolchain lowers them this
    fails, and the switch is to be turned on."""
    if device != "cpu":
        pytest.skip("the offline compile gate runs in the CPU suite")
    from jfa.fuzz.compile_gate import blackwell_clc_targets
    from jfa.kernels.tlx.common.target import TOOLCHAIN_LOWERS_CLC

    lowers, why, _row = _compiles_offline("blackwell-clc", blackwell_clc_targets)
    assert lowers == TOOLCHAIN_LOWERS_CLC, why
    if not lowers:
        assert "'ttng.async_clc_try_cancel' is not registered" in why, why


def test_the_toolchain_builds_the_two_cta_backward_exactly_where_the_launchers_say(device):
    """The Blackwell dK/dV kernel's 2-CTA build compiles for sm_100a (with tcgen05.mma.cta_group::2 in the PTX)
    exactly when ``TOOLCHAIN_LOWERS_TWO_CTA`` says so. Triton 3.8 with uTLX 3.8.0.post16 cannot build it: the
    first wall is ``tlx.remote_view`` (every remote arrive), which raises NotImplementedError (no
    mapa.shared::cluster upstream); behind it, uTLX's 2-CTA async_dot shapes disagree with Triton 3.8's
    tc_gen5_mma verifier and cluster_barrier does not parse. When a toolchain builds it this fails: then turn the
    switch on and decide the dispatch (docs/blackwell.md)."""
    if device != "cpu":
        pytest.skip("the offline compile gate runs in the CPU suite")
    from jfa.fuzz.compile_gate import blackwell_two_cta_targets
    from jfa.kernels.tlx.common.target import TOOLCHAIN_LOWERS_TWO_CTA

    builds, why, row = _compiles_offline("blackwell-2cta", blackwell_two_cta_targets)
    assert builds == TOOLCHAIN_LOWERS_TWO_CTA, why
    if builds:
        assert row["details"]["two_cta_mmas"] > 0
    else:
        assert "tlx.remote_view needs ttng.map_to_remote_buffer" in why, why


_TWO_CTA_MMA_PROBE = r"""
import re, sys
import triton, triton.language as tl
import triton.language.extra.tlx as tlx
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def pair_mma(a_desc, b_desc, c_ptr):
    # TLX's per-CTA shapes for cta_group::2: A [128, 64] (this CTA's rows), B [64, 64] (half of N), acc [128, 128]
    rank = tlx.cluster_cta_rank()
    a = tlx.local_alloc((128, 64), tl.bfloat16, 1)
    b = tlx.local_alloc((64, 64), tl.bfloat16, 1)
    bars = tlx.alloc_barriers(2)
    acc = tlx.local_alloc((128, 128), tl.float32, 1, tlx.storage_kind.tmem)
    tlx.barrier_expect_bytes(bars[0], 2 * (128 * 64 + 64 * 64))
    tlx.async_descriptor_load(a_desc, a[0], [rank * 128, 0], bars[0])
    tlx.async_descriptor_load(b_desc, b[0], [0, rank * 64], bars[0])
    tlx.barrier_wait(bars[0], 0)
    tlx.async_dot(a[0], b[0], acc[0], use_acc=False, two_ctas=True)
    tlx.tcgen05_commit(bars[1], two_ctas=True)
    tlx.barrier_wait(bars[1], 0)
    offs = tl.arange(0, 128)
    tl.store(c_ptr + (rank * 128 + offs[:, None]) * 128 + offs[None, :], tlx.local_load(acc[0]))

sig = {"a_desc": "tensordesc<bf16[128, 64]>", "b_desc": "tensordesc<bf16[64, 64]>", "c_ptr": "*fp32"}
try:
    c = triton.compile(ASTSource(pair_mma, sig, {}, {}), target=GPUTarget("cuda", 100, 32),
                       options={"num_warps": 4, "num_ctas": 2})
    print("BUILT", len(re.findall(r"tcgen05\.mma\.cta_group::2", c.asm["ptx"])))
except Exception as exc:
    print("FAILED", type(exc).__name__)
"""


def test_a_lone_two_cta_mma_does_not_build_with_this_toolchain(device, tmp_path):
    """Behind remote_view, the second wall of the 2-CTA build: uTLX's async_dot(two_ctas=True) takes TLX's
    per-CTA shapes (B holds N / 2 of the accumulator's N columns) and Triton 3.8's tc_gen5_mma verifier wants the
    accumulator's N equal to B's, so even a lone 2-CTA MMA (no remote arrive, no cluster barrier) fails to build
    for sm_100a with num_ctas=2. When it builds (its PTX then holds tcgen05.mma.cta_group::2) this fails: check the
    other walls (test_the_toolchain_builds_the_two_cta_backward_exactly_where_the_launchers_say)."""
    if device != "cpu":
        pytest.skip("the offline compile runs in the CPU suite")
    import os
    import subprocess
    import sys

    script = tmp_path / "pair_mma.py"
    script.write_text(_TWO_CTA_MMA_PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    verdict = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert verdict.startswith("FAILED"), run.stdout + run.stderr
    assert "expected the output shape to be the concatenation" in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize("name", BLACKWELL_SUITE)
def test_blackwell_forward_compiles_for_sm100a_as_designed(name, blackwell_results, record_property):
    """tcgen05 MMAs with commits and TMEM loads, tensor memory within 512 columns, shared memory within
    sm_100's 227 KB, five partitions (the default one, two softmax warpgroups, the MMA and load warps) with
    the registers the source states, TMA loads and mbarrier waits, no local memory and no spill beyond the
    thread indices Triton computes at the entry for every partition, and a launch that binds to this build."""
    from jfa.fuzz.compile_gate import SM100_ENTRY_SPILL_BYTES, SM100_SHARED_LIMIT, SM100_TMEM_COLUMNS
    from jfa.kernels.tlx.blackwell import forward
    from jfa.kernels.tlx.common.target import TOOLCHAIN_LOWERS_CLC

    row = blackwell_results[name]
    details = row["details"]
    record_property("resources", json.dumps({k: row[k] for k in ("registers", "stack_bytes", "shared_bytes")}
                                            | {"tmem_columns": details["tmem_columns"]}))
    assert row["tensor_core_ops"] > 0, "no tcgen05.mma"
    assert details["tcgen05_commits"] > 0 and details["tcgen05_loads"] > 0
    assert 0 < details["tmem_columns"] <= SM100_TMEM_COLUMNS
    assert 0 < row["shared_bytes"] <= SM100_SHARED_LIMIT
    assert row["local_bytes"] == 0 and row["stack_bytes"] <= SM100_ENTRY_SPILL_BYTES, "spills"
    assert 0 <= details["ptxas_spill_bytes"] <= SM100_ENTRY_SPILL_BYTES, "ptxas reports spill stores"
    assert details["warp_specialize"] == 1 and details["partitions"] == forward.NUM_GROUPS + 2
    regs = forward.config_for(row["target"]["head_dim"]).softmax_regs
    assert details["requested_registers"] == [regs] * forward.NUM_GROUPS + [forward.ISSUER_REGS.value] * 2
    assert regs in details["setmaxnreg"]["inc"]
    assert details["tma_loads"] > 0 and details["expect_tx"] > 0 and details["mbarrier_waits"] > 0
    assert details["launch_binds_as_compiled"], "a launch would specialise to a different signature"
    # the schedule a GPU launch runs: CLC requests and answers exactly in the CLC build
    assert (details["clc_try_cancels"] > 0) == (details["clc_queries"] > 0) == TOOLCHAIN_LOWERS_CLC
    assert row["ok"], "; ".join(row["problems"])  # (also: the launch's LLVM setting and grid, as compiled)


@pytest.mark.parametrize("name", BLACKWELL_BACKWARD_SUITE)
def test_blackwell_backward_compiles_for_sm100a_as_designed(name, blackwell_results, record_property):
    """The dK/dV kernel: tcgen05 MMAs with commits and TMEM loads, tensor memory within 512 columns, shared
    memory within sm_100's 227 KB, four partitions (the default dQ warpgroup, the compute warpgroup, the MMA
    and load warps) with the registers the source states, TMA loads and dQ reduce-adds, mbarrier waits, no
    local memory and no spill beyond the entry's thread indices, and a launch that binds to this build."""
    from jfa.fuzz.compile_gate import SM100_ENTRY_SPILL_BYTES, SM100_SHARED_LIMIT, SM100_TMEM_COLUMNS
    from jfa.kernels.tlx.blackwell import backward

    row = blackwell_results[name]
    details = row["details"]
    record_property("resources", json.dumps({k: row[k] for k in ("registers", "stack_bytes", "shared_bytes")}
                                            | {"tmem_columns": details["tmem_columns"]}))
    assert row["tensor_core_ops"] > 0, "no tcgen05.mma"
    assert details["tcgen05_commits"] > 0 and details["tcgen05_loads"] > 0
    assert 0 < details["tmem_columns"] <= SM100_TMEM_COLUMNS
    assert 0 < row["shared_bytes"] <= SM100_SHARED_LIMIT
    assert row["local_bytes"] == 0 and row["stack_bytes"] <= SM100_ENTRY_SPILL_BYTES, "spills"
    assert 0 <= details["ptxas_spill_bytes"] <= SM100_ENTRY_SPILL_BYTES, "ptxas reports spill stores"
    assert details["warp_specialize"] == 1 and details["partitions"] == 3
    regs = backward.config_for(row["target"]["head_dim"]).compute_regs
    assert details["requested_registers"] == [regs] + [backward.ISSUER_REGS.value] * 2
    assert regs in details["setmaxnreg"]["inc"]
    assert details["tma_loads"] > 0 and details["tma_reduce_adds"] > 0 and details["mbarrier_waits"] > 0
    assert details["launch_binds_as_compiled"], "a launch would specialise to a different signature"
    assert row["ok"], "; ".join(row["problems"])  # (also: the launch's LLVM setting, as compiled)


# The TLX Blackwell MXFP8 build (E4M3 operands, block-scaled tcgen05 MMAs) for sm_100a: one build in the suite, every
# compilable one (D 128) in the gate (``jfa compile-check --backend blackwell-mx``). The MXFP8 dK/dV build: its
# causal FLOOR build in the suite (about 15 s), the others in the gate.
BLACKWELL_MX_SUITE = ("blackwell-mx-rceil-bf16-D128-causal-bcastq",)
BLACKWELL_MX_BACKWARD_SUITE = ("blackwell-dkdv-mxfloor-bf16-D128-causal",)


@pytest.fixture(scope="module")
def blackwell_mx_results(device):
    if device != "cpu":
        pytest.skip("the offline compile gate runs in the CPU suite")
    from jfa.fuzz.compile_gate import run_out_of_process

    return run_out_of_process("blackwell-mx", only=BLACKWELL_MX_SUITE + BLACKWELL_MX_BACKWARD_SUITE, jobs=1)


def _assert_sm100_mx_resources(row: dict, record_property) -> dict:
    """Asserts what every Blackwell MXFP8 build must be (every tensor-core op block-scaled; tensor memory, shared
    memory and spill within sm_100's limits) and records its resources; returns the row's details."""
    from jfa.fuzz.compile_gate import SM100_ENTRY_SPILL_BYTES, SM100_SHARED_LIMIT, SM100_TMEM_COLUMNS

    details = row["details"]
    record_property("resources", json.dumps({k: row[k] for k in ("registers", "stack_bytes", "shared_bytes")}
                                            | {"tmem_columns": details["tmem_columns"]}))
    assert row["tensor_core_ops"] > 0 and details["block_scaled_mmas"] == row["tensor_core_ops"]
    assert 0 < details["tmem_columns"] <= SM100_TMEM_COLUMNS
    assert 0 < row["shared_bytes"] <= SM100_SHARED_LIMIT
    assert row["local_bytes"] == 0 and row["stack_bytes"] <= SM100_ENTRY_SPILL_BYTES, "spills"
    return details


@pytest.mark.parametrize("name", BLACKWELL_MX_SUITE)
def test_blackwell_mx_forward_compiles_for_sm100a_as_designed(name, blackwell_mx_results, record_property):
    """Every MMA block-scaled (kind::mxf8f6f4 .block_scale), the E8M0 scales copied into tensor memory by tcgen05.cp,
    tensor memory within 512 columns (one S both groups take turns in, beside Triton's scale tiles), shared memory
    within sm_100's 227 KB, spill no worse than the bf16 build's allowance, the partitions' stated registers, and a
    launch of ``mx_forward_blackwell`` that binds to this build."""
    from jfa.kernels.tlx.blackwell import forward

    row = blackwell_mx_results[name]
    details = _assert_sm100_mx_resources(row, record_property)
    regs = forward.config_for(row["target"]["head_dim"], row["target"]["mx"]).softmax_regs
    assert details["requested_registers"] == [regs] * forward.NUM_GROUPS + [forward.ISSUER_REGS.value] * 2
    assert details["launch_binds_as_compiled"], "a launch would specialise to a different signature"
    assert row["ok"], "; ".join(row["problems"])  # (also: tcgen05.cp, TMA loads, the launch's LLVM setting)


@pytest.mark.parametrize("name", BLACKWELL_MX_BACKWARD_SUITE)
def test_blackwell_mx_backward_compiles_for_sm100a_as_designed(name, blackwell_mx_results, record_property):
    """The MXFP8 dK/dV build: all four products block-scaled (kind::mxf8f6f4 .block_scale), the E8M0 scales copied
    into tensor memory by tcgen05.cp, tensor memory within 512 columns (S^T and dP^T taking turns in one tile beside
    dK, dV and Triton's scale tiles), shared memory within sm_100's 227 KB, spill no worse than the bf16 builds'
    allowance, the partitions' stated registers, no dQ reduce-add (dQ is the portable pass), and a launch of
    ``mx_dkdv_blackwell`` that binds to this build."""
    from jfa.kernels.tlx.blackwell import backward

    row = blackwell_mx_results[name]
    details = _assert_sm100_mx_resources(row, record_property)
    regs = backward.config_for(row["target"]["head_dim"], mx=row["target"]["mx"]).compute_regs
    assert details["requested_registers"] == [regs] + [backward.ISSUER_REGS.value] * 2
    assert details["tma_reduce_adds"] == 0
    assert details["launch_binds_as_compiled"], "a launch would specialise to a different signature"
    assert row["ok"], "; ".join(row["problems"])  # (also: tcgen05.cp, TMA loads, the launch's LLVM setting)


def test_every_compilable_blackwell_mx_backward_build_is_a_gate_target():
    """The gate holds both rules of the MXFP8 dK/dV build at every head dim whose scale tiles tcgen05.cp can copy;
    D 64's cannot (its D-axis scale tiles have 2 columns): that build runs on the simulator only, and a GPU call at
    D 64 runs the portable backward (``mx_backward_supports``)."""
    from jfa.fuzz.compile_gate import blackwell_mx_backward_targets
    from jfa.kernels.tlx.blackwell import backward
    from jfa.kernels.tlx.common.scaled_mma import SCALE_TILE

    compilable = {d for d in backward.SUPPORTED_HEAD_DIMS
                  if backward.mx_scale_tiles(backward.config_for(d, mx="floor"), d) == {SCALE_TILE}}
    assert compilable == {128}
    targets = blackwell_mx_backward_targets()
    assert {(t.head_dim, t.mx) for t in targets} == {(d, r) for d in compilable for r in backward.MX_RULES}
    assert set(BLACKWELL_MX_BACKWARD_SUITE) <= {t.name for t in targets}
    assert all(t.arch == 100 and t.kernel == "dkdv" for t in targets)


def test_every_compilable_blackwell_mx_build_is_a_gate_target():
    """The gate holds both rules at every head dim whose scale tiles tcgen05.cp can copy; D 64's cannot (its Q and K
    scale tiles have 2 columns, V's 64 rows): that build runs on the simulator only."""
    from jfa.fuzz.compile_gate import blackwell_mx_targets
    from jfa.kernels.tlx.blackwell import forward
    from jfa.kernels.tlx.common.scaled_mma import SCALE_TILE

    compilable = {d for d in forward.SUPPORTED_HEAD_DIMS
                  if forward.mx_scale_tiles(forward.config_for(d, "floor"), d) == {SCALE_TILE}}
    assert compilable == {128}
    targets = [t for t in blackwell_mx_targets() if t.kernel == "forward"]
    assert {(t.head_dim, t.mx) for t in targets} == {(d, r) for d in compilable for r in forward.MX_RULES}
    assert set(BLACKWELL_MX_SUITE) <= {t.name for t in targets} and all(t.arch == 100 for t in targets)
