"""jfa fuzz / jfa repro plumbing: failures are shrunk, written as self-contained case files, and replay."""
import json
import time

import pytest

from jfa.fuzz import runner
from jfa.fuzz.mutants import BY_NAME, applied
from jfa.fuzz.cases import Case
from jfa.fuzz.report import read_logs, write_reports

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(autouse=True)
def _cpu_triton_only(backend, device):
    if device != "cpu" or backend not in ("auto", "triton"):  # auto on a CPU is the portable kernel
        pytest.skip("drives the interpreter in-process with mutated kernels")


def test_case_file_round_trips_and_replays(tmp_path):
    case = Case((0, 5, 70), (3, 0, 64), causal=True, dtype="fp16", values="near-ties", strided=True)
    path = tmp_path / runner.case_filename(case)
    path.write_text(json.dumps(runner.case_record(case, note="hand-made")))
    loaded, record = runner.load_case(path)
    assert loaded == case and record["note"] == "hand-made"
    assert runner.cmd_repro([str(path), "--device", "cpu"]) == 0


@pytest.mark.slow  # ~45 s on 2 cores (a 20-second worker, then shrinking): the gate runs it
def test_worker_shrinks_a_real_bug_into_a_replayable_case(tmp_path):
    """Under a broken kernel the worker writes a small failing case; it replays red, then green once fixed."""
    with applied(BY_NAME["fwd-lse-base2"]):
        runner.run_worker(runner.WorkerSettings(str(tmp_path), time.time() + 20, backend="triton", device="cpu",
                                                max_tokens=200, round_examples=15, seed=1))
        failures = sorted((tmp_path / "failures").glob("*.json"))
        assert failures, "the worker found no failure under a mutant that breaks every non-empty row"
        case, record = runner.load_case(failures[0])
        assert record["ok"] is False and any(v["problem"] or v["error"] > v["allowed"] for v in record["verdicts"])
        assert sum(case.lengths_q) + sum(case.lengths_k) <= 64, f"not shrunk: {case.id}"
        assert runner.cmd_repro([str(failures[0]), "--device", "cpu"]) == 1
    assert runner.cmd_repro([str(failures[0]), "--device", "cpu"]) == 0
    log = [json.loads(line) for line in (tmp_path / "worker-0.jsonl").read_text().splitlines()]
    assert any("failure" in row for row in log) and any("ratio" in row for row in log)


def test_reports_summarise_the_logs(tmp_path):
    (tmp_path / "failures").mkdir()
    (tmp_path / "worker-0.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"case": "a", "ok": True, "ratio": 0.25, "tensor": "dq", "seconds": 0.1},
        {"case": "b", "ok": True, "ratio": 0.5, "tensor": "out", "seconds": 0.1})) + "\n")
    stats = read_logs(tmp_path)
    assert stats["examples"] == 2 and stats["worst"] == 0.5 and stats["worst_case"] == "out of b"
    write_reports(tmp_path, stats, {"backend": "triton", "device": "cpu", "workers": 1, "seconds": 2.0})
    assert "no failure" in (tmp_path / "summary.md").read_text()
    assert 'failures="0"' in (tmp_path / "junit.xml").read_text()


def test_workers_past_the_deadline_are_stopped_and_reported(tmp_path):
    """A worker stuck past the deadline (a long compile, a huge example) cannot keep the run from ending:
    it is stopped after the grace period and named in the summary; finished workers are left alone."""
    import subprocess
    import sys

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = time.time()
    stopped = runner.wait_for_workers([quick, stuck], deadline=start, grace=0.5)
    assert stopped == [1] and time.time() - start < 15
    assert quick.returncode == 0 and stuck.returncode is not None
    (tmp_path / "failures").mkdir()
    write_reports(tmp_path, read_logs(tmp_path), {"backend": "triton", "device": "cpu", "workers": 2,
                                                                   "seconds": 1.0, "stopped_at_deadline": stopped})
    assert "stopped at the deadline (mid-example): worker(s) [1]" in (tmp_path / "summary.md").read_text()
