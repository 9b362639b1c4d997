"""The mbarrier / TMA ring protocol: the correct ring passes under every schedule; each injected bug is
reported as its own error, naming the kernel line at fault."""
import pytest

import jfa.sim as sim
import os

from sim_kernels import line_of, run_ring, run_word_ring

WORD_RING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "word_ring.py")

SCHEDULES = [sim.Schedule.deterministic(), sim.Schedule.seeded(1), sim.Schedule.seeded(2), sim.Schedule.seeded(3)]


def names_line(err, marker) -> bool:
    return f"sim_kernels.py:{line_of(marker)}" in str(err)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.describe())
def test_the_correct_ring_sums_every_tile(schedule):
    err, report = run_ring("none", schedule=schedule)
    assert err == 0.0
    assert report.ctas == 1 and report.copies == 5 and report.op_counts["async_descriptor_load"] == 5


def test_a_deeper_ring_and_more_tiles_pass_too():
    err, _ = run_ring("none", n_tiles=9, num_buf=3, schedule=sim.Schedule.seeded(5))
    assert err == 0.0


@pytest.mark.parametrize("schedule", SCHEDULES[:2], ids=lambda s: s.describe())
def test_waiting_for_the_wrong_parity_deadlocks_at_that_wait(schedule):
    with pytest.raises(sim.DeadlockError) as info:
        run_ring("producer_wrong_parity", schedule=schedule)
    err = info.value
    assert names_line(err, "ring-wrong-parity")
    assert "empties[0]" in str(err) and "parity 0" in str(err)


def test_expecting_more_bytes_than_land_deadlocks_with_the_bytes_outstanding():
    with pytest.raises(sim.DeadlockError) as info:
        run_ring("expect_too_many_bytes")
    assert "2048 more tx bytes but no copy in flight" in str(info.value)
    assert names_line(info.value, "ring-wait-full")


def test_expecting_fewer_bytes_than_land_is_a_tx_underflow_at_the_load():
    with pytest.raises(sim.ProtocolError, match="tx-count underflow on fulls") as info:
        run_ring("expect_too_few_bytes")
    assert info.value.site.line == line_of("ring-load")


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.describe())
def test_releasing_a_buffer_before_reading_it_is_a_race_naming_both_accesses(schedule):
    with pytest.raises(sim.RaceError) as info:
        run_ring("release_before_read", schedule=schedule)
    assert names_line(info.value, "ring-late-read")
    assert names_line(info.value, "ring-load")


def test_reading_without_waiting_for_the_copy_is_a_race():
    with pytest.raises(sim.RaceError, match="still in flight") as info:
        run_ring("missing_full_wait")
    assert info.value.site.line == line_of("ring-read")
    assert names_line(info.value, "ring-load")


def test_a_buffer_index_out_of_range_is_reported_where_it_is_used():
    with pytest.raises(sim.OutOfBoundsError, match=r"bufs\[2\], but bufs has only 2 buffers") as info:
        run_ring("buffer_index_out_of_range")
    assert info.value.site.line == line_of("ring-bad-buffer")


def test_a_barrier_index_out_of_range_is_reported_where_it_is_used():
    with pytest.raises(sim.OutOfBoundsError, match=r"fulls\[2\], but fulls has only 2 barriers") as info:
        run_ring("barrier_index_out_of_range")
    assert info.value.site.line == line_of("ring-bad-barrier")


def test_a_store_past_the_output_names_the_address_and_the_tensor():
    with pytest.raises(sim.OutOfBoundsError) as info:
        run_ring("store_out_of_bounds")
    err = info.value
    assert err.site.line == line_of("ring-store")
    assert "past the end of OUT (float32[16, 32])" in str(err)


def test_an_arrive_count_higher_than_the_arrivals_deadlocks():
    with pytest.raises(sim.DeadlockError, match="blocked for ever") as info:
        run_ring("arrive_count_too_high")
    assert "empties[0] has 1 of its 2 arrivals" in str(info.value)


def test_arriving_more_often_than_the_arrive_count_is_an_over_arrival():
    with pytest.raises(sim.ProtocolError, match="over-arrival on empties") as info:
        run_ring("over_arrival")
    assert info.value.site.line == line_of("ring-over-arrival")


def test_arrivals_that_complete_phases_unseen_are_diagnosed_in_the_deadlock():
    with pytest.raises(sim.DeadlockError) as info:
        run_ring("double_arrive")
    assert "passed unseen" in str(info.value) and names_line(info.value, "ring-wait-empty")


def test_a_runaway_loop_ends_at_the_step_limit_naming_the_loop():
    with pytest.raises(sim.StepLimitError, match="step limit of 5000") as info:
        run_ring("runaway_loop", max_steps=5000)
    assert info.value.site.line in (line_of("ring-consumer-loop"), line_of("ring-spin-op"))


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.describe())
def test_words_handed_over_by_mbarriers_alone_arrive_whole(schedule):
    """Generic shared-memory stores ordered before generic loads by an mbarrier arrive/wait pair (the
    forward's item ring): every consumer sees every item's words, and the simulator reports no race."""
    counted, report = run_word_ring("none", schedule=schedule)
    assert counted == [7] * 4
    assert report.ctas == 2


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.describe())
def test_a_word_slot_released_before_its_words_are_read_is_a_race(schedule):
    with pytest.raises(sim.RaceError) as info:
        run_word_ring("release_before_read", schedule=schedule)
    assert f"word_ring.py:{line_of('word-read', WORD_RING)}" in str(info.value)
    assert f"word_ring.py:{line_of('word-store', WORD_RING)}" in str(info.value)
