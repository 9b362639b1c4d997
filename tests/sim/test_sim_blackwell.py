"""The simulator's Blackwell ops (jfa.sim.ops.blackwell): TMEM allocations, tcgen05 MMA completing on
mbarriers, tcgen05_commit; their protocol bugs reported as the races, deadlocks and resource errors they are."""
import pytest

import jfa.sim as sim
import torch

from sim_kernels import line_of, run_clc, run_tcgen05, run_tcgen05_scaled, run_tmem_subslice

SCHEDULES = [sim.Schedule.deterministic()] + [sim.Schedule.seeded(s) for s in (1, 2, 3)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["deterministic", "seed1", "seed2", "seed3"])
@pytest.mark.parametrize("bug", ["none", "commit"], ids=["mma-barriers", "tcgen05-commit"])
def test_an_accumulation_chain_in_tmem_gives_the_product_sum(bug, schedule):
    """Four MMAs into one TMEM accumulator (use_acc after the first), their completion seen through the
    barriers they arrive on, or a tcgen05_commit: the epilogue reads sum_i A_i B_i (fp32 of bf16 products)."""
    err, report = run_tcgen05(bug, schedule=schedule)
    assert err < 1e-4, err
    assert report.op_counts["async_dot"] == 4 and report.warnings == []


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["deterministic", "seed1", "seed2", "seed3"])
def test_reading_the_accumulator_before_the_mma_completes_is_caught(schedule):
    """Without the wait on ``done`` the epilogue reads TMEM no MMA has written yet (uninitialised) or one is
    still writing (a race with the MMA in flight), whichever the schedule makes happen."""
    with pytest.raises((sim.RaceError, sim.UninitialisedReadError)) as info:
        run_tcgen05("read_before_done", schedule=schedule)
    assert info.value.site.line == line_of("tc-read-acc")
    if isinstance(info.value, sim.RaceError):
        assert "tcgen05 MMA" in str(info.value)


def test_a_barrier_nothing_arrives_on_deadlocks():
    with pytest.raises(sim.DeadlockError, match="done"):
        run_tcgen05("no_commit")


def test_handing_the_tiles_back_at_issue_lets_tma_overwrite_an_operand_in_use():
    """The MMA still reads its shared-memory operands until it completes: the producer's next TMA load into
    the released slot is a race (seeded schedules land the copy before the MMA)."""
    with pytest.raises(sim.RaceError, match="tcgen05 MMA"):
        for seed in range(1, 6):
            run_tcgen05("release_at_issue", n_steps=6, schedule=sim.Schedule.seeded(seed))


def test_tmem_has_512_columns():
    with pytest.raises(sim.ProtocolError, match="512") as info:
        run_tcgen05("none", n=256, tmem_buffers=3)  # 768 columns
    assert info.value.site.line == line_of("tc-tmem-alloc")


@pytest.mark.parametrize("copy", [0, 1], ids=["scales-stored", "scales-tmem-copied"])
def test_a_block_scaled_mma_multiplies_the_dequantized_operands(copy):
    """async_dot_scaled with E4M3 operands and E8M0 scales per 32 along K (A's in TMEM, stored there or
    copied there by tmem_copy; B's in shared memory) gives (A x 2^(sa-127)) (B x 2^(sb-127))^T."""
    got, want = run_tcgen05_scaled(copy=copy)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_overwriting_a_tmem_copy_source_before_its_commit_is_a_race():
    with pytest.raises(sim.RaceError, match="tcgen05 copy") as info:
        run_tcgen05_scaled(copy=2)
    assert info.value.site.line == line_of("tcs-overwrite-copy-source")


def test_a_scale_tensor_of_the_wrong_shape_is_refused_at_the_mma():
    with pytest.raises(sim.ProtocolError, match="one scale per 32 elements along K") as info:
        run_tcgen05_scaled(scale_cols=1)
    assert info.value.site.line == line_of("tcs-mma")


@pytest.mark.parametrize("sm_count", [1, 3])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=["deterministic", "seed1", "seed2", "seed3"])
def test_cluster_launch_control_hands_out_every_tile_once(schedule, sm_count):
    """A CTA that asks for more work gets the tile of a CTA that has not started (which then never starts);
    after the last one it gets -1: every tile is worked exactly once, a cancelled CTA's by the CTA that claimed it,
    every other by its own CTA."""
    out, who, report = run_clc(schedule=schedule, sm_count=sm_count)
    assert out.tolist() == [1] * 7
    cancelled = set(report.cancelled)
    assert report.cancelled and report.ctas + len(cancelled) == 7 and len(cancelled) == len(report.cancelled)
    assert not cancelled & set(range(sm_count))  # the resident CTAs had started: none can be cancelled
    for x, w in enumerate(who.tolist()):
        assert (w != x and w not in cancelled) if x in cancelled else w == x


def test_the_deterministic_dispatch_cancels_the_first_waiting_ctas_in_launch_order():
    """sm_count CTAs start at once; the first CTA to ask claims every later one, in launch order."""
    _, who, report = run_clc(sm_count=3)
    assert report.cancelled == (3, 4, 5, 6) and report.ctas == 3
    assert who.tolist() == [0, 1, 2, 0, 0, 0, 0]


def test_seeds_start_ctas_early_so_different_ctas_get_cancelled():
    """Under seeded schedules the hardware may start waiting CTAs before a try_cancel is answered: the seeds
    explore different splits between CTAs that run and CTAs that are claimed."""
    splits = {run_clc(schedule=sim.Schedule.seeded(seed))[2].cancelled for seed in range(1, 9)}
    assert len(splits) > 1, splits


def test_a_cancel_after_the_last_tile_answers_none():
    """With one CTA in the grid nothing is left to claim: the first try_cancel answers -1 and the CTA ends."""
    out, who, report = run_clc(grid=1)
    assert out.tolist() == [1] and who.tolist() == [0]
    assert report.cancelled == () and report.ctas == 1 and report.op_counts["clc_consumer"] == 1


def test_a_clc_producer_waiting_on_the_wrong_phase_deadlocks():
    with pytest.raises(sim.DeadlockError) as info:
        run_clc("wrong_phase")
    assert "ctx.empty[0]" in str(info.value)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["deterministic", "seed1", "seed2", "seed3"])
def test_a_clc_consumer_waiting_on_the_wrong_phase_reads_a_response_not_yet_written(schedule):
    """A fresh full barrier passes a wait for parity 1, so the consumer reads the response slot before any
    try_cancel has answered into it (a race with the answer in flight, or an uninitialised read); where the
    schedule lands the answer first, the wait is for a phase that has passed and the CTA deadlocks."""
    with pytest.raises((sim.RaceError, sim.UninitialisedReadError, sim.DeadlockError)) as info:
        run_clc("consumer_wrong_phase", schedule=schedule)
    if isinstance(info.value, sim.DeadlockError):
        assert "ctx.full[0]" in str(info.value)
    else:
        assert "ctx.response[0]" in str(info.value) and info.value.site.line == line_of("clc-consumer-wrong-phase")


def test_a_try_cancel_after_an_observed_failure_is_refused():
    with pytest.raises(sim.ProtocolError, match="observed a failed one") as info:
        run_clc("ask_after_failure")
    assert info.value.site.line == line_of("clc-ask-after-failure")


def test_a_cta_ending_with_a_try_cancel_in_flight_is_refused():
    """The answer nobody reads may have cancelled a CTA: its tile would be lost."""
    with pytest.raises(sim.ProtocolError, match="try_cancel.*still in flight") as info:
        run_clc("drop_last_answer")
    assert info.value.site.line == line_of("clc-producer")


def test_a_cancelled_tile_nobody_works_is_lost():
    """The CLC contract: a cancelled CTA never starts, so a kernel that drops the tile it was handed loses it."""
    out, _, report = run_clc("stop_after_first")
    assert out.tolist() == [1, 0, 1, 0, 1, 0, 1] and report.ctas == 4 and report.cancelled == (1, 3, 5)


@pytest.mark.parametrize("slices", [1, 2, 4])
def test_tmem_column_slices_are_views_of_the_accumulator(slices):
    """tlx.subslice: each slice's load and store reach exactly its columns of the TMEM accumulator."""
    got, want = run_tmem_subslice(slices=slices)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_tmem_column_slice_past_the_buffer_is_out_of_bounds():
    with pytest.raises(sim.OutOfBoundsError, match="reaches outside") as info:
        run_tmem_subslice(slices=2, offset=16)
    assert info.value.site.line == line_of("tmem-subslice")
