"""Fuzz campaigns (jfa/fuzz/runner.py, report.py, cores.py): shards that never repeat each other and merge
into one report, a watch that turns a hung or dead worker into a case file and a restart, the time to find
a planted bug, the production mix, the cores and each GPU's memory shared out."""
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jfa.fuzz import runner
from jfa.fuzz.cases import Case
from jfa.fuzz.cores import THREAD_VARIABLES, share_cores, threads_per_worker
from jfa.fuzz.report import CAMPAIGN_KEYS, merge, MergeError, read_logs
from jfa.fuzz.strategies import PRODUCTION_SHARE, TLX_HEAD_DIMS, mixed_problems

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def cpu_only(device, backend):
    if device != "cpu" or backend not in ("auto", "triton"):
        pytest.skip("runs CPU interpreter campaigns")


# ----------------------------------------------------------------------------------------------------
# seeds and shards
# ----------------------------------------------------------------------------------------------------
@settings(max_examples=200)
@given(a=st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 2), st.integers(0, 4)),
       b=st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 2), st.integers(0, 4)))
def test_round_seeds_differ_for_every_shard_worker_restart_and_round(a, b):
    if a != b:
        assert runner.round_seed(7, *a) != runner.round_seed(7, *b)


def test_round_seed_fields_out_of_range_are_refused():
    with pytest.raises(ValueError, match="slot"):
        runner.round_seed(1, 0, 1 << 12, 0, 0)


def _fuzz(out, *args, minutes="0.2"):
    return subprocess.Popen([sys.executable, "-m", "jfa.cli", "fuzz", "--device", "cpu", "--workers", "1",
                             "--minutes", minutes, "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_shards_merge_into_one_report_with_failures_deduplicated(tmp_path, cpu_only):
    shards = [_fuzz(tmp_path / f"s{i}", "--shard", f"{i}/2", "--seed", "11", "--max-tokens", "160") for i in range(2)]
    for p in shards:
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, output
    summaries = [json.loads((tmp_path / f"s{i}" / "summary.json").read_text()) for i in range(2)]
    assert [s["shard"] for s in summaries] == ["0/2", "1/2"] and all(s["examples"] > 0 for s in summaries)
    # the same shrunk case found by both shards is one case file (named by the case's hash)
    same = Case((3,), (5,), name="found twice")
    for i in range(2):
        (tmp_path / f"s{i}" / "failures" / runner.case_filename(same)).write_text(json.dumps(runner.case_record(same)))
    merged = merge([tmp_path / "s0", tmp_path / "s1"], tmp_path / "m")
    assert merged["examples"] == sum(s["examples"] for s in summaries)
    assert len(list((tmp_path / "m" / "failures").glob("*.json"))) == 1
    assert [r["shard"] for r in merged["shard_rows"]] == ["0/2", "1/2"]
    assert "2 shard outputs merged" in (tmp_path / "m" / "summary.md").read_text()
    assert runner.cmd_merge([str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m2")]) == 1


def _summary(path: Path, **changes) -> Path:
    path.mkdir(parents=True)
    meta = {key: None for key in CAMPAIGN_KEYS} | {"seed": 1, "shards": 2, "shard": "0/2", "seconds": 1.0,
                                                    "examples": 0, "workers": 1}
    (path / "summary.json").write_text(json.dumps(meta | changes))
    return path


@pytest.mark.parametrize("changes, message", [
    ({"seed": 2, "shard": "1/2"}, "seed = 2"),
    ({"max_tokens": 99, "shard": "1/2"}, "max_tokens = 99"),
    ({}, "the same shard appears twice"),
], ids=["another-seed", "other-settings", "same-shard-twice"])
def test_merge_refuses_what_is_not_one_campaign(tmp_path, changes, message):
    a, b = _summary(tmp_path / "a"), _summary(tmp_path / "b", **changes)
    with pytest.raises(MergeError, match=message):
        merge([a, b], tmp_path / "m")
    assert runner.cmd_merge([str(a), str(b), "--out", str(tmp_path / "m")]) == 2


def test_merge_refuses_a_directory_without_a_summary(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(MergeError, match="no summary.json"):
        merge([_summary(tmp_path / "a"), tmp_path / "half"], tmp_path / "m")


def test_shards_without_a_common_seed_are_refused(capsys):
    assert runner.cmd_fuzz(["--device", "cpu", "--shard", "1/4", "--minutes", "1"]) == 2
    assert "same --seed" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------
# the parent's watch: hangs, dead contexts, crashes
# ----------------------------------------------------------------------------------------------------
HUNG_CASE = Case((70,), (70,), causal=True, name="hangs")


def _stand_in(behaviour: str):
    """A worker_command that starts a stand-in worker: it logs the start of HUNG_CASE, then sleeps
    ("hang") or exits with the given code."""
    def command(ws):
        log = str(Path(ws.out_dir) / f"worker-{ws.slot}.jsonl")
        fields = json.dumps(json.dumps(dataclasses.asdict(HUNG_CASE)))
        then = "time.sleep(120)" if behaviour == "hang" else f"sys.exit({behaviour})"
        code = (f"import json, sys, time\nf = open({log!r}, 'a')\n"
                f"f.write(json.dumps({{'t': time.time(), 'start': json.loads({fields}), 'case': 'hangs'}}) + '\\n')\n"
                f"f.flush()\n{then}\n")
        return [sys.executable, "-c", code]
    return command


def test_a_hung_worker_is_killed_its_case_written_and_the_worker_restarted(tmp_path, monkeypatch, cpu_only):
    monkeypatch.setattr(runner, "worker_command", _stand_in("hang"))
    start = time.time()
    code = runner.cmd_fuzz(["--device", "cpu", "--workers", "1", "--minutes", "0.15", "--hang-seconds", "1",
                            "--out", str(tmp_path)])
    assert code == 1 and time.time() - start < 40
    record = json.loads((tmp_path / "failures" / runner.case_filename(HUNG_CASE)).read_text())
    assert record["kind"] == "hang" and runner.load_case(tmp_path / "failures" / runner.case_filename(HUNG_CASE))[0] == HUNG_CASE
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["restarts"] >= 1 and summary["failures"] >= 2  # hung again after the restart
    assert summary["crashes"] == []


@pytest.mark.parametrize("exit_code, crash", [(runner.EXIT_CONTEXT_LOST, False), (1, True)],
                         ids=["context-lost-restarts", "crash-is-reported"])
def test_a_worker_that_dies_is_restarted(tmp_path, monkeypatch, exit_code, crash, cpu_only):
    monkeypatch.setattr(runner, "worker_command", _stand_in(str(exit_code)))
    code = runner.cmd_fuzz(["--device", "cpu", "--workers", "1", "--minutes", "0.15", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["restarts"] == 2  # three quick deaths in a row: the slot is given up
    assert bool(summary["crashes"]) == crash
    assert code == (1 if crash else 2)  # no example ran (exit 2) unless the crashes make it a failure


# ----------------------------------------------------------------------------------------------------
# time to find a planted bug
# ----------------------------------------------------------------------------------------------------
def test_until_found_stops_at_the_first_failure_and_times_it(tmp_path, cpu_only):
    p = _fuzz(tmp_path, "--mutant", "fwd-lse-base2", "--until-found", "--seed", "3", minutes="2")
    output, _ = p.communicate(timeout=240)
    assert p.returncode == 1, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mutant"] == "fwd-lse-base2" and summary["seconds"] < 100
    assert 0 < summary["seconds_to_first_failure"] <= summary["seconds"]
    record = json.loads(next((tmp_path / "failures").glob("*.json")).read_text())
    assert record["mutant"] == "fwd-lse-base2" and record["ok"] is False


@pytest.mark.parametrize("argument, value, message", [
    ("--max-tokens", "-5", "must be >= 0"), ("--round-examples", "0", "must be >= 1"),
    ("--round-examples", "many", "expected an integer")], ids=["negative-tokens", "no-examples", "not-a-number"])
def test_sizes_that_cannot_run_are_usage_errors(capsys, argument, value, message):
    with pytest.raises(SystemExit) as exit_:
        runner.cmd_fuzz(["--device", "cpu", argument, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and argument in err and message in err


def test_an_unknown_mutant_is_a_usage_error(capsys):
    assert runner.cmd_fuzz(["--device", "cpu", "--mutant", "no-such-bug", "--minutes", "1"]) == 2
    assert "--mutant: no mutant 'no-such-bug'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------
# what is drawn, how it is judged, the cores
# ----------------------------------------------------------------------------------------------------
def test_the_production_mix_draws_mostly_what_the_tlx_kernels_take():
    drawn = []

    # 1000 draws: hypothesis's first few hundred lean to its simplest examples, whose share wanders
    @settings(max_examples=1000, derandomize=True, database=None)
    @given(case=mixed_problems("production", max_tokens=200))
    def draw(case):
        drawn.append(case)

    draw()
    production = sum(c.head_dim in TLX_HEAD_DIMS and c.dtype in ("bf16", "fp16") for c in drawn)
    assert production / len(drawn) >= PRODUCTION_SHARE - 0.05


def test_the_recheck_sample_is_a_function_of_the_case():
    cases = [Case((n,), (n + 1,), seed=n) for n in range(400)]
    picked = [runner._sampled(c, 5, 0.25) for c in cases]
    assert picked == [runner._sampled(c, 5, 0.25) for c in cases]  # a replay while shrinking agrees
    assert 60 <= sum(picked) <= 140
    assert not any(runner._sampled(c, 5, 0.0) for c in cases) and all(runner._sampled(c, 5, 1.0) for c in cases)


def test_worker_logs_count_production_and_rechecked_examples(tmp_path):
    rows = [{"t": 1, "start": {}, "case": "a"},
            {"t": 2, "case": "a", "ok": True, "ratio": 0.2, "tensor": "out", "kernel": "tlx-hopper", "rechecked": True},
            {"t": 3, "case": "b", "ok": True, "ratio": 0.1, "tensor": "dq", "kernel": "triton", "rechecked": False},
            {"t": 4, "first_failure": "x", "case": "c"}, {"t": 9, "failure": "x", "case": "c", "kind": "rule"}]
    (tmp_path / "worker-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"t": 10, "case": "half')
    stats = read_logs(tmp_path)
    assert (stats["examples"], stats["production_examples"], stats["rechecked"]) == (2, 1, 1)
    assert stats["failures"] == 1 and stats["first_failure_t"] == 4


def test_cores_are_shared_between_workers_and_explicit_settings_win():
    assert threads_per_worker(8, cores=16) == 2 and threads_per_worker(16, cores=16) == 1
    assert threads_per_worker(32, cores=16) == 1
    env = {"OMP_NUM_THREADS": "5"}
    assert share_cores(env, 4, cores=16) == 4
    assert env == {"OMP_NUM_THREADS": "5"} | {name: "4" for name in THREAD_VARIABLES[1:]}
    with pytest.raises(ValueError, match="workers"):
        threads_per_worker(0)


GIB = 2 ** 30


@pytest.mark.parametrize("gpus, memory, workers", [(1, int(79.6 * GIB), 9), (1, 139 * GIB, 16),
                                                   (2, int(79.6 * GIB), 16), (1, 0, 16), (4, 8 * GIB, 4)],
                         ids=["h100", "h200", "two-h100", "memory-unknown", "small-gpus"])
def test_gpu_workers_are_as_many_as_cores_and_the_gpus_memory_allow(gpus, memory, workers, monkeypatch):
    """One worker a core, but no more on a GPU than its memory gives GPU_WORKER_MEMORY (and the overhead) each: the
    16 workers of the H200's cores, 9 on the 80 GB H100 (16 exhausted it), at least one a GPU."""
    monkeypatch.setattr("jfa.fuzz.cores.usable_cores", lambda: 16)
    assert runner._default_workers("cuda", gpus, memory) == workers


@pytest.mark.parametrize("memory, workers", [(int(79.6 * GIB), 9), (139 * GIB, 16), (int(79.6 * GIB), 16)])
def test_each_gpu_workers_allocator_gets_an_equal_share_of_what_the_overheads_leave(memory, workers):
    fraction = runner.gpu_memory_fraction(memory, workers)
    assert workers * fraction * memory + (workers + 1) * runner.GPU_WORKER_OVERHEAD == pytest.approx(memory)
    assert fraction * memory >= 4 * GIB


def test_gpu_workers_that_leave_no_memory_are_refused():
    with pytest.raises(ValueError, match="fewer --workers"):
        runner.gpu_memory_fraction(8 * GIB, 16)
    with pytest.raises(ValueError, match="workers_on_gpu"):
        runner.gpu_memory_fraction(8 * GIB, 0)


def test_kill_speed_reports_the_time_to_find_each_mutant(tmp_path, cpu_only):
    from jfa.fuzz import kill_speed

    code = kill_speed.main(["--minutes", "1", "--parallel", "2", "--workers", "1", "--device", "cpu",
                            "--mutants", "fwd-lse-base2,bwd-dq-overwritten", "--out", str(tmp_path)])
    results = {r["mutant"]: r for r in json.loads((tmp_path / "kill-speed.json").read_text())["results"]}
    assert code == 0 and set(results) == {"fwd-lse-base2", "bwd-dq-overwritten"}
    for r in results.values():
        assert r["found"] and 0 < r["seconds_to_find"] < 60 and r["how"] == "rule" and r["case"]
    assert "2 of 2 within 1 min" in (tmp_path / "kill-speed.md").read_text()


def test_kill_speed_refuses_an_unknown_mutant(tmp_path):
    from jfa.fuzz import kill_speed

    with pytest.raises(SystemExit):
        kill_speed.main(["--mutants", "no-such-bug", "--out", str(tmp_path)])
