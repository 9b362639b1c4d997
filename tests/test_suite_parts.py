"""The suite's ``--part I/N`` option (the root conftest): N runs with I = 0 .. N-1 run each collected test once,
so a suite longer than one sitting (the lent GPU's ten-minute calls) runs as N calls."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE = "tests/test_reference.py"  # quick to collect, dozens of parametrised ids


def _collect(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", FILE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _ids(*args: str) -> list:
    run = _collect(*args)
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_the_parts_are_disjoint_and_cover_the_collected_tests():
    whole = _ids()
    parts = [_ids("--part", f"{i}/3") for i in range(3)]
    assert len(whole) > 20 and all(parts), [len(p) for p in parts]
    assert sorted(sum(parts, [])) == sorted(whole)


def test_a_part_out_of_range_is_a_usage_error_naming_the_option():
    run = _collect("--part", "3/3")
    assert run.returncode != 0 and "--part: need 0 <= I < N" in run.stdout + run.stderr
