"""The simulator's clusters (jfa.sim.cluster): the CTAs of a cluster run concurrently under one schedule;
cluster ranks, remote arrives and stores, the cluster barrier, multicast TMA and the 2-CTA tcgen05 MMA
(cta_group::2), and their misuse reported as the races, deadlocks and protocol errors they are."""
import pytest

import jfa.sim as sim

from cluster_kernels import line_of, run_multicast, run_pair_gemm, run_ranks, run_remote_wait

SCHEDULES = [sim.Schedule.deterministic()] + [sim.Schedule.seeded(s) for s in (1, 2, 3)]
IDS = ["deterministic", "seed1", "seed2", "seed3"]


def test_cluster_ranks_follow_x_within_each_cluster():
    """ctas_per_cga=(2, 1, 1) on a grid of 4 CTAs: two clusters, CTA x has rank x % 2, the cluster size is 2."""
    out, report = run_ranks(grid=4, cluster=2)
    assert out[:, :3].tolist() == [[0, 0, 2], [1, 1, 2], [2, 0, 2], [3, 1, 2]]
    assert report.ctas == 4 and len(report.steps) == 2  # steps are counted per cluster


def test_a_grid_that_is_not_a_whole_number_of_clusters_is_refused():
    with pytest.raises(sim.ProtocolError, match="whole number of clusters"):
        run_ranks(grid=3, cluster=2)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_a_remote_store_is_seen_by_the_partner_after_a_cluster_barrier(schedule):
    """Each CTA stores its rank into its partner's buffer (st.shared::cluster), both pass a cluster barrier,
    and each reads its partner's rank: the cluster barrier orders the remote write before the read."""
    out, _ = run_ranks(grid=4, cluster=2, peer_store=1, schedule=schedule)
    assert out[:, 3].tolist() == [1, 0, 1, 0]


def test_a_remote_store_not_ordered_before_the_partners_read_is_caught():
    with pytest.raises((sim.RaceError, sim.UninitialisedReadError)) as info:
        run_ranks(grid=2, cluster=2, peer_store=2)
    assert info.value.site.line == line_of("rk-read")


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_a_multicast_load_lands_in_every_target_ctas_buffer_and_barrier(schedule):
    """Each CTA multicasts one row block into both CTAs (the box and its bytes on each target's barrier at the
    same offset): both CTAs see both blocks; the partner's box may land before this CTA's expect_tx."""
    err, report = run_multicast(schedule=schedule)
    assert err == 0.0
    assert report.copies == 4 and report.op_counts["async_descriptor_load"] == 2


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_a_multicast_barrier_expecting_one_box_of_two_is_caught(schedule):
    """Two boxes land on each CTA's barrier but it expects one: the phase completes on the first box and the
    read meets the second still in flight (or not yet issued: nothing written), or the second overflows the
    completed phase's tx count."""
    with pytest.raises((sim.RaceError, sim.UninitialisedReadError, sim.ProtocolError)):
        run_multicast("expect_one_box", schedule=schedule)


def test_multicasting_into_a_partner_that_has_not_allocated_yet_is_reported():
    """Without a cluster_barrier after the allocations, CTA 0's multicast reaches CTA 1's buffer (and barrier)
    before CTA 1 has made them."""
    with pytest.raises(sim.ProtocolError, match="has not allocated it yet") as info:
        run_multicast("no_init_barrier")
    assert info.value.site.line == line_of("mc-load")


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_a_two_cta_mma_multiplies_the_pairs_halves(schedule):
    """cta_group::2: CTA r holds its M rows of A and half of B's N columns; the leader issues for both; each CTA's
    accumulator gets its M rows of A times all of B. The pair computes C = A @ B for 2 x M rows."""
    err, report = run_pair_gemm(schedule=schedule)
    assert err < 1e-4, err
    assert report.ctas == 2 and report.warnings == []


def test_the_leader_issuing_before_its_partners_operands_landed_is_caught():
    """Without the wait on the leader's pair_ready barrier (the partner's remote arrive), the MMA reads the
    partner's tiles with no happens-before from their TMA loads."""
    with pytest.raises((sim.RaceError, sim.UninitialisedReadError)) as info:
        run_pair_gemm("no_pair_wait")
    assert info.value.site.line in (line_of("pg-mma"), line_of("pg-last-mma"))
    assert "CTA 1" in str(info.value)


def test_a_one_cta_commit_after_a_two_cta_mma_leaves_the_partner_reading_too_early():
    """tcgen05_commit(two_ctas=False) arrives only on the issuing CTA's barrier (and the partner's own commit,
    with no MMA of its own, arrives at once): the partner reads its accumulator while the MMA writes it."""
    with pytest.raises((sim.RaceError, sim.UninitialisedReadError)) as info:
        run_pair_gemm("commit_own_cta")
    assert info.value.site.line == line_of("pg-read-acc")


def test_a_partner_skipping_a_two_cta_mma_its_leader_issues_is_reported():
    with pytest.raises(sim.ProtocolError, match=r"disagree on their 2-CTA ops.*issued 3.*called it 2 times"):
        run_pair_gemm("peer_skips_mma")


def test_a_cta_exiting_while_its_partners_mma_uses_its_memory_is_reported():
    with pytest.raises(sim.ProtocolError, match="CTA 1 of the cluster exits while tcgen05 MMA"):
        run_pair_gemm("peer_exits_early")


def test_a_cluster_barrier_one_cta_never_reaches_deadlocks_naming_it():
    with pytest.raises(sim.DeadlockError) as info:
        run_pair_gemm("peer_misses_cluster_barrier")
    text = str(info.value)
    assert "the cluster barrier's generation 1 has 1 of 2 arrivals (cta0.main)" in text
    assert f"never arrived: cta1.main (blocked at tests/sim/cluster_kernels.py:{line_of('pg-peer-stuck')}" in text


def test_a_two_cta_mma_needs_cta_pairs():
    """In a cluster of 3 the third CTA has no partner: a 2-CTA MMA there is refused."""
    with pytest.raises(sim.ProtocolError, match="even number of CTAs"):
        run_pair_gemm(ctas_per_cga=(3, 1, 1), grid=3)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_two_cta_loads_complete_on_the_leaders_barrier(schedule):
    """two_ctas=True TMA loads (.cta_group::2): each CTA's box lands in its own buffer and completes on the leader's
    barrier, which expects both CTAs' bytes; the leader then issues with no remote arrive (the partner's box may
    land before the leader's expect)."""
    err, report = run_pair_gemm(two_cta_loads=True, schedule=schedule)
    assert err < 1e-4, err
    assert "barrier_arrive" not in report.op_counts


def test_waiting_on_a_partners_barrier_is_refused():
    with pytest.raises(sim.ProtocolError, match="a CTA waits only on its own mbarriers") as info:
        run_remote_wait(False)
    assert info.value.site.line == line_of("rw-remote-wait")


def test_arriving_on_a_partners_barrier_before_it_is_initialised_is_reported():
    """CTA 1 arrives on CTA 0's barrier with no cluster barrier after the allocations: the seeds that switch to
    CTA 1 before CTA 0 has allocated it report the arrival on an uninitialised mbarrier; the deterministic
    schedule (CTA 0 allocates first) runs through."""
    run_remote_wait(True)
    caught = 0
    for seed in range(1, 9):
        try:
            run_remote_wait(True, schedule=sim.Schedule.seeded(seed, switch_prob=0.5))
        except sim.ProtocolError as err:
            assert "has not initialised it yet" in str(err) and err.site.line == line_of("rw-early-arrive")
            caught += 1
    assert caught > 0


def test_a_two_cta_mma_of_64_rows_a_cta_is_not_simulated():
    """cta_group::2 at M 128 (64 rows a CTA) splits its operands another way than at M 256: refused by name."""
    with pytest.raises(sim.UnsupportedError, match="only 128 a CTA"):
        run_pair_gemm(m=64)
