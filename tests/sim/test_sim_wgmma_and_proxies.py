"""wgmma (async_dot) groups, the async/generic proxy split, TMA stores with reduce-add, named barriers,
and reads of never-written shared memory."""
import pytest
import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.tools.tensor_descriptor import TensorDescriptor

import jfa.sim as sim
from sim_kernels import line_of, run_mma, run_pingpong, run_reduce_add, run_store_then_load, uninitialised_read_kernel


@pytest.mark.parametrize("schedule", [sim.Schedule.deterministic(), sim.Schedule.seeded(4)], ids=lambda s: s.describe())
def test_the_correct_wgmma_ring_computes_the_product(schedule):
    err, report = run_mma("none", schedule=schedule)
    assert err < 1e-3  # bf16 operands, fp32 accumulation
    assert report.op_counts["async_dot"] == 4 and report.op_counts["async_dot_wait"] == 4


def test_handing_operands_back_before_the_wgmma_retires_is_a_race():
    with pytest.raises(sim.RaceError) as info:
        run_mma("release_before_retire")
    text = str(info.value)
    assert f"sim_kernels.py:{line_of('mma-dot')}" in text  # the wgmma read
    assert f"sim_kernels.py:{line_of('mma-late-wait')}" in text  # where that read ended


def test_computing_with_an_async_dot_result_before_its_wait_is_a_race():
    with pytest.raises(sim.RaceError, match="before an async_dot_wait retired its group") as info:
        run_mma("use_before_wait")
    assert info.value.site.line == line_of("mma-use-before-wait")
    assert f"sim_kernels.py:{line_of('mma-dot')}" in str(info.value)


def test_a_local_store_read_by_wgmma_without_a_fence_is_a_proxy_race():
    with pytest.raises(sim.ProxyRaceError, match="no fence_async_shared") as info:
        run_mma("missing_fence")
    assert info.value.site.line == line_of("mma-unfenced-dot")
    assert f"sim_kernels.py:{line_of('mma-generic-store')}" in str(info.value)


def test_a_local_store_read_by_a_tma_store_without_a_fence_is_a_proxy_race():
    with pytest.raises(sim.ProxyRaceError) as info:
        run_reduce_add(torch.float32, fence=False)
    assert info.value.site.line == line_of("reduce-store")
    assert f"sim_kernels.py:{line_of('reduce-stage')}" in str(info.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_tma_store_reduce_add_rounds_each_sum_to_the_destination_type(dtype):
    out, expected, report = run_reduce_add(dtype)
    assert torch.equal(out, expected)
    assert report.op_counts["async_descriptor_store"] == 4


def test_after_a_full_store_wait_the_task_loads_what_its_tma_store_wrote():
    x, _before, out, seen = run_store_then_load(full_wait=True)
    assert torch.equal(seen, x) and torch.equal(out, x)


def test_after_a_read_wait_a_tma_stores_global_write_is_still_in_flight():
    """``cp.async.bulk.wait_group.read`` frees the store's shared memory, not its global write: a load right after
    it may see the old values (the deterministic schedule lands the write only when nothing else can run), and the
    write that lands later carries the source as it was read, not what the task stored there after the wait."""
    x, before, out, seen = run_store_then_load(full_wait=False, schedule=sim.Schedule.deterministic())
    assert torch.equal(seen, before)
    assert torch.equal(out, x)


def test_the_pingpong_handshake_alternates_the_consumers():
    out, report = run_pingpong("none", turns=3, schedule=sim.Schedule.seeded(9))
    assert out.tolist() == [3, 3]
    assert report.op_counts["named_barrier_wait"] == 6


def test_a_dropped_named_barrier_handshake_deadlocks_naming_both_waits():
    with pytest.raises(sim.DeadlockError) as info:
        run_pingpong("dropped_first_turn")
    text = str(info.value)
    assert "named barrier 9: 128 of 256 threads arrived" in text
    assert f"sim_kernels.py:{line_of('pp-wait-0')}" in text and f"sim_kernels.py:{line_of('pp-wait-1')}" in text


def test_named_barrier_participants_must_agree_on_the_thread_count():
    with pytest.raises(sim.ProtocolError, match="named barrier 10"):
        run_pingpong("thread_count_mismatch")


def test_reading_shared_memory_nothing_wrote_is_reported():
    with pytest.raises(sim.UninitialisedReadError, match=r"buf\[1\]") as info:
        sim.launch(uninitialised_read_kernel, (1,), torch.zeros(16, 32), D=32)
    assert info.value.site.line == line_of("uninit-read")


def test_a_tma_box_whose_inner_coordinate_is_not_16_byte_aligned_is_refused():
    @triton.jit
    def misaligned(desc):
        buf = tlx.local_alloc((16, 16), tl.float32, 1)
        bar = tlx.alloc_barriers(1)
        tlx.barrier_expect_bytes(bar[0], 16 * 16 * 4)
        tlx.async_descriptor_load(desc, buf[0], [0, 2], bar[0])
        tlx.barrier_wait(bar[0], 0)

    x = torch.zeros(16, 32)
    with pytest.raises(sim.ProtocolError, match="innermost coordinate is not 16-byte aligned"):
        sim.launch(misaligned, (1,), TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 16]))
