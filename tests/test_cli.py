"""The command line's exit codes can be trusted: 0 only when work ran and passed, 1 when a check failed,
2 for usage errors and when nothing ran, each with one line on stderr and no traceback."""
import json
import os
import subprocess
import sys

import pytest
import torch

from jfa.fuzz import runner


def _jfa(*args, timeout=120, interpreter=True):
    env = {k: v for k, v in os.environ.items() if interpreter or k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "jfa.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _usage_error(result, words):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and words in result.stderr, result.stderr


def test_fuzz_with_no_time_is_a_usage_error():
    _usage_error(_jfa("fuzz", "--minutes", "0"), "must be > 0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU")
def test_fuzz_on_a_missing_gpu_is_a_usage_error():
    _usage_error(_jfa("fuzz", "--device", "cuda", "--minutes", "1"), "no CUDA GPU is visible")


def test_fuzz_with_a_bad_worker_count_is_a_usage_error():
    _usage_error(_jfa("fuzz", "--workers", "none", "--minutes", "1"), "--workers")


@pytest.mark.parametrize("content, words", [(None, "no such case file"), ("{bad", "not a JSON case file"),
                                             ('{"format": 99}', "unknown case format"), ('[1, 2]', "case format")],
                         ids=["missing", "bad-json", "unknown-format", "not-a-record"])
def test_repro_of_what_is_no_case_file_is_a_usage_error(tmp_path, content, words):
    path = tmp_path / "case.json"
    if content is not None:
        path.write_text(content)
    assert runner.cmd_repro([str(path), "--device", "cpu"]) == 2


def test_repro_refuses_an_unknown_backend_by_name(tmp_path):
    result = _jfa("repro", str(tmp_path / "x.json"), "--backend", "cuda-magic")
    assert result.returncode == 2 and "invalid choice: 'cuda-magic'" in result.stderr


def test_repro_of_a_file_recording_an_unknown_backend_is_a_usage_error(tmp_path, capsys):
    from jfa.fuzz.cases import Case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(runner.case_record(Case((3,), (3,)), backend="quantum")))
    assert runner.cmd_repro([str(path), "--device", "cpu"]) == 2
    assert "records backend 'quantum'" in capsys.readouterr().err


def test_compile_check_that_matches_nothing_is_a_usage_error():
    _usage_error(_jfa("compile-check", "--only", "NO-SUCH-TARGET", interpreter=False), "no target matches")


def test_gate_with_a_bad_worker_count_is_a_usage_error():
    result = _jfa("gate", "--workers", "many")
    assert result.returncode == 2 and "--workers" in result.stderr


def test_help_shows_defaults_without_markup():
    for command in ("fuzz", "repro"):
        text = _jfa(command, "--help").stdout
        assert "``" not in text and "(default:" in text, command
    assert "Exit codes" in _jfa("--help").stdout
