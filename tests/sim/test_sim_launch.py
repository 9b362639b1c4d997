"""The simulator's launch API: reports, traces, schedules, limits, the launch target, the environment
checks, and that a launch leaves Triton's interpreter as it found it."""
import threading

import pytest
import torch
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.runtime import interpreter

import jfa.sim as sim
from jfa.kernels.tlx.common import target
from jfa.sim import _env
from sim_kernels import line_of, ring_kernel, run_mma, run_ring, spin_kernel


def test_a_launch_report_says_what_ran():
    _, report = run_ring("none", n_tiles=4)
    assert report.kernel == "ring_kernel" and report.grid == (1,) and report.ctas == 1
    assert report.schedule == "deterministic"
    assert report.op_counts["barrier_wait"] == 8 and report.copies == 4
    assert report.task_switches > 0 and len(report.steps) == 1 and report.steps[0] > 0
    assert report.seconds > 0 and report.warnings == []
    assert "ring_kernel grid (1,)" in report.summary()


def test_a_seeded_schedule_is_reproducible_from_its_seed():
    runs = [run_ring("none", n_tiles=6, schedule=sim.Schedule.seeded(s), trace=True)[1] for s in (11, 11, 12)]
    assert runs[0].render_trace(0) == runs[1].render_trace(0)
    assert runs[0].render_trace(0) != runs[2].render_trace(0)


def test_the_trace_records_ops_with_their_lines():
    _, report = run_ring("none", n_tiles=2, trace=True)
    text = report.render_trace(last=100)
    assert "async_descriptor_load" in text and "TMA load lands" in text and "completes phase" in text
    assert f"sim_kernels.py:{line_of('ring-load')}" in text


def test_a_failure_with_tracing_on_shows_the_events_before_it():
    with pytest.raises(sim.RaceError) as info:
        run_ring("missing_full_wait", trace=True)
    assert info.value.events and "async_descriptor_load" in "\n".join(info.value.events)
    assert "events (oldest first)" in str(info.value)


def test_a_trace_ring_keeps_only_its_last_events():
    _, report = run_ring("none", n_tiles=8, trace=32)
    assert len(report.tracer) == 32


def test_a_loop_without_any_op_stops_at_the_wall_clock_limit():
    before = threading.active_count()
    with pytest.raises(sim.StepLimitError, match="wall-clock limit") as info:
        sim.launch(spin_kernel, (1,), torch.zeros(1, dtype=torch.int32), 5, timeout_s=0.5)
    assert info.value.site.line in (line_of("spin-loop"), line_of("spin-body"))  # wherever the limit struck
    assert threading.active_count() <= before  # the task thread was unwound


def test_every_interpreter_patch_is_undone_also_after_a_failure():
    names = ("barrier_wait", "async_dot", "local_alloc", "tcgen05_commit")
    before = {n: getattr(tlx, n) for n in names}
    call = interpreter.InterpretedFunction.__call__
    tl_range, tl_zeros = tl.range, tl.zeros
    builder = vars(interpreter.interpreter_builder).copy()
    sem = vars(interpreter.interpreter_semantic).copy()
    module_fns = (interpreter._get_np_dtype, interpreter._convert_float)
    tensor_init, threads = tl.tensor.__init__, torch.get_num_threads()
    with pytest.raises(sim.DeadlockError):
        run_ring("producer_wrong_parity")
    run_ring("none")
    assert {n: getattr(tlx, n) for n in names} == before
    assert interpreter.InterpretedFunction.__call__ is call
    assert tl.range is tl_range and tl.zeros is tl_zeros
    assert vars(interpreter.interpreter_builder).keys() == builder.keys()
    assert vars(interpreter.interpreter_semantic).keys() == sem.keys()
    assert (interpreter._get_np_dtype, interpreter._convert_float) == module_fns
    assert tl.tensor.__init__ is tensor_init and torch.get_num_threads() == threads


def test_an_op_the_simulator_does_not_model_is_named():
    import triton

    @triton.jit
    def uses_tmem(OUT):
        tlx.tcgen05_commit(None)

    with pytest.raises(sim.UnsupportedError, match="tlx.tcgen05_commit is not simulated on sm_90"):
        sim.launch(uses_tmem, (1,), torch.zeros(1))


def test_an_architecture_without_an_op_table_is_refused_at_launch():
    with pytest.raises(sim.UnsupportedError, match="sm_120 is not simulated"):
        run_ring("none", arch=(12, 0))


def test_blackwell_runs_the_shared_ops_and_refuses_hopper_mma():
    """sm_100 keeps TMA, mbarriers and shared memory (the ring runs) but has no wgmma: an MMA into registers
    is refused with the rule (tcgen05 accumulates in tensor memory)."""
    err, _ = run_ring("none", arch=(10, 0))
    assert err < 1e-5
    with pytest.raises(sim.ProtocolError, match="tensor memory"):
        run_mma("none", arch=(10, 0))


def test_a_kernel_decorated_without_the_interpreter_is_refused():
    with pytest.raises(sim.UnsupportedError, match="TRITON_INTERPRET=1"):
        sim.launch(ring_kernel.fn, (1,))


def test_simulated_registers_the_cpu_target_and_restores_the_previous_one():
    cpu = torch.device("cpu")
    before = target.target_for(cpu)
    with sim.simulated(arch=(9, 0), sm_count=5) as session:
        t = target.target_for(cpu)
        assert (t.name, t.capability, t.sm_count) == ("tlx-sim", (9, 0), 5)
        assert session.launches == 0
    assert target.target_for(cpu) is before


def test_a_launch_through_the_target_is_recorded_in_the_session():
    x = torch.randn(32, 32)
    out = torch.zeros(16, 32)
    from triton.tools.tensor_descriptor import TensorDescriptor
    desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 32])
    with sim.simulated(schedule=sim.Schedule.seeded(3)) as session:
        target.launch(ring_kernel, (1,), torch.device("cpu"), desc, out, 2, BLOCK=16, D=32, NUM_BUF=2, BUG=0)
    assert session.kernels() == ["ring_kernel"] and session.last().schedule == "seeded(3)"
    assert torch.allclose(out, x.view(2, 16, 32).sum(0))


def test_the_target_is_restored_when_the_block_raises():
    cpu = torch.device("cpu")
    before = target.target_for(cpu)
    with pytest.raises(RuntimeError):
        with sim.simulated():
            raise RuntimeError("boom")
    assert target.target_for(cpu) is before


def test_install_makes_the_simulator_the_cpu_target_until_uninstall():
    cpu = torch.device("cpu")
    before = target.target_for(cpu)
    session = sim.install(sm_count=2)
    try:
        assert target.target_for(cpu) is session.target
    finally:
        sim.uninstall()
        target.register_target("cpu", before)
    assert target.target_for(cpu) is before


def test_a_wrong_triton_version_is_refused_naming_both_versions(monkeypatch):
    monkeypatch.setattr(_env.metadata, "version", lambda dist: "3.7.1" if dist == "triton" else "3.8.0.post16")
    with pytest.raises(sim.SimSetupError, match=r"triton==3\.8\.0 is needed, found 3\.7\.1"):
        _env.check_versions()


def test_a_missing_utlx_is_refused(monkeypatch):
    def version(dist):
        if dist == "triton-utlx":
            raise _env.metadata.PackageNotFoundError(dist)
        return "3.8.0"
    monkeypatch.setattr(_env.metadata, "version", version)
    with pytest.raises(sim.SimSetupError, match=r"triton-utlx==3\.8\.0\.post16 is needed, it is not installed"):
        _env.check_versions()


def test_the_interpreter_must_be_on(monkeypatch):
    from triton import knobs
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not knobs.runtime.interpret
    with pytest.raises(sim.SimSetupError, match="TRITON_INTERPRET=1"):
        _env.check_interpreter()


def test_a_load_masked_off_entirely_reads_nothing_even_past_every_tensor():
    """A mask of integers 0/1 (``bool & bool`` in the interpreter) selects like a boolean one: a row past
    the tensor with the mask all off is no out-of-bounds read, the same row with it on is."""
    from sim_kernels import masked_gather_kernel

    x, out = torch.arange(4 * 32, dtype=torch.float32).reshape(4, 32), torch.full((32,), -1.0)
    sim.launch(masked_gather_kernel, (1,), x, out, 1000, 4, D=32)
    assert (out == 0).all()
    with pytest.raises(sim.OutOfBoundsError, match="tl.load"):
        sim.launch(masked_gather_kernel, (1,), x, out, 1000, 1001, D=32)


def _cast_inputs():
    """fp32 values where rounding to 16 bits is hard: ties to even both ways, the largest finite values and
    past them, subnormals of both formats, signed zeros, infinities, NaN, and random values."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x477FF000, 0x477FEFFF, 0x00000001,
                         0x33800000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x387FC000, 0xB3C00000],
                        dtype=torch.int64).to(torch.int32)
    special = bits.view(torch.float32)
    rand = torch.randn(256 - special.numel(), generator=torch.Generator().manual_seed(0)) * 1e3
    return torch.cat([special, rand])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_paired_16_bit_conversion_is_the_cast_bit_for_bit(dtype):
    """``to_16bit_pairs`` (two fp32 values per cvt.rn.*x2.f32) simulates as the cast, each element in its
    own place: round to nearest even, overflow to infinity, NaN stays NaN."""
    from sim_kernels import pair_cast_kernel

    x = _cast_inputs()
    out = torch.zeros(x.numel(), dtype=dtype)
    sim.launch(pair_cast_kernel, (1,), x, out, N=x.numel(), DTYPE=tl.bfloat16 if dtype == torch.bfloat16 else
               tl.float16, ASM="")
    expected = x.to(dtype)
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out.view(torch.int16)[~expected.isnan()], expected.view(torch.int16)[~expected.isnan()])


@pytest.mark.parametrize("asm", ["cvt.rn.bf16x2.f32 $0, $2, $1;", "cvt.rz.f16x2.f32 $0, $2, $1;",
                                 "cvt.rn.f16x2.f32 $0, $1, $2;"], ids=["format-mismatch", "round-to-zero", "swapped"])
def test_a_conversion_asm_the_simulator_cannot_model_is_refused(asm):
    """Only the paired conversion ``to_16bit_pairs`` emits is simulated: another rounding, the other operand
    order, or a format other than the result's is refused at its line, not computed as a cast."""
    from sim_kernels import pair_cast_kernel

    x = _cast_inputs()
    with pytest.raises(sim.UnsupportedError, match="inline asm") as info:
        sim.launch(pair_cast_kernel, (1,), x, torch.zeros(x.numel(), dtype=torch.float16), N=x.numel(),
                   DTYPE=tl.float16, ASM=asm)
    assert info.value.site.line == line_of("raw-asm")
