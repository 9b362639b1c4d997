"""The cluster launchers in tools/cluster/ start shards jfa fuzz accepts: each script runs with stand-ins
for python3 and sbatch that record their arguments, and every recorded jfa fuzz command line must parse
and name its shard of one campaign."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jfa.fuzz.runner import fuzz_parser

CLUSTER = Path(__file__).resolve().parent.parent / "tools" / "cluster"
STUBS = """
python3() { "$PY" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$CALLS"; }
sbatch() { "$PY" -c 'import json, sys; print(json.dumps(["sbatch"] + sys.argv[1:]))' "$@" >> "$CALLS"; }
"""


def _calls(script: str, env: dict, tmp_path: Path) -> list:
    calls = tmp_path / "calls.jsonl"
    full_env = {"PATH": "/usr/bin:/bin", "PY": sys.executable, "CALLS": str(calls), "HOME": str(tmp_path), **env}
    done = subprocess.run(["bash", "-c", STUBS + script], env=full_env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def _fuzz_args(call: list):
    assert call[:3] == ["-m", "jfa.cli", "fuzz"], call
    return fuzz_parser().parse_args(call[3:])


def test_the_slurm_array_task_runs_its_shard_and_queues_the_merge(tmp_path):
    env = {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "16", "SLURM_ARRAY_JOB_ID": "99",
           "SLURM_SUBMIT_DIR": str(CLUSTER.parent.parent), "JFA_FUZZ_SEED": "20261201"}
    calls = _calls(f"source {CLUSTER / 'jfa-fuzz.sbatch'}", env, tmp_path)
    queued, fuzz = calls
    assert queued[0] == "sbatch" and "--dependency=afterany:99" in queued
    assert Path(queued[-1]).exists() and queued[-1].endswith("jfa-fuzz-merge.sbatch")
    args = _fuzz_args(fuzz)
    assert (args.shard, args.seed, args.out) == ("0/16", 20261201, str(tmp_path / "fuzz-99" / "shard-0"))


def test_other_slurm_array_tasks_only_fuzz(tmp_path):
    env = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "16", "SLURM_ARRAY_JOB_ID": "99",
           "SLURM_ARRAY_TASK_MIN": "0", "JFA_FUZZ_SEED": "7"}
    (fuzz,) = _calls(f"source {CLUSTER / 'jfa-fuzz.sbatch'}", env, tmp_path)
    assert _fuzz_args(fuzz).shard == "5/16"


def test_the_slurm_merge_job_merges_every_shard(tmp_path):
    for i in range(3):
        (tmp_path / "camp" / f"shard-{i}").mkdir(parents=True)
    (merge,) = _calls(f"source {CLUSTER / 'jfa-fuzz-merge.sbatch'}", {"JFA_FUZZ_OUT": str(tmp_path / "camp")}, tmp_path)
    assert merge[:4] == ["-m", "jfa.cli", "fuzz", "merge"]
    assert merge[4:7] == [str(tmp_path / "camp" / f"shard-{i}") for i in range(3)]


def _manifest(name: str):
    """(the container's bash command, its env) of a Job manifest (read as text: no YAML parser needed)."""
    text = (CLUSTER / name).read_text()
    block = re.search(r"args:\n\s*- >-\n(.*?)\n\s*env:", text, re.S)
    command = " ".join(line.strip() for line in block.group(1).splitlines()) if block else \
        json.loads(re.search(r"args: (\[.*\])", text).group(1))[0]
    env = dict(re.findall(r'\{name: (\w+), value: "?([^"}]*)"?\}', text))
    return command, env


@pytest.mark.parametrize("index", ["0", "7"])
def test_the_kubernetes_indexed_job_runs_one_shard_per_index(tmp_path, index):
    command, env = _manifest("jfa-fuzz-job.yaml")
    completions = re.search(r"completions: (\d+)", (CLUSTER / "jfa-fuzz-job.yaml").read_text()).group(1)
    assert env["JFA_FUZZ_SHARDS"] == completions
    (fuzz,) = _calls(command, {**env, "JOB_COMPLETION_INDEX": index}, tmp_path)
    args = _fuzz_args(fuzz)
    assert (args.shard, args.out, args.seed) == (f"{index}/{completions}", f"/results/shard-{index}", int(env["JFA_FUZZ_SEED"]))


def test_the_kubernetes_merge_job_merges_the_shards(tmp_path):
    command, _ = _manifest("jfa-fuzz-merge-job.yaml")
    (merge,) = _calls(command, {}, tmp_path)
    assert merge[:4] == ["-m", "jfa.cli", "fuzz", "merge"] and merge[-2:] == ["--out", "/results/merged"]
