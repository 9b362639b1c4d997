"""Every case in tests/corpus/ (found by the fuzzer, or picked by hand) still meets the oracle rule.

Add a case: copy a failure file written by ``jfa fuzz`` (``DIR/failures/*.json``) here, with a
``note`` saying what it found. Replay one by hand: ``jfa repro tests/corpus/FILE.json``.
"""
from pathlib import Path

import pytest

from jfa.fuzz.runner import load_case
from jfa.fuzz.rule import cannot_run, run_case

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.json"))


def test_corpus_is_not_empty():
    assert CORPUS, "tests/corpus/ holds no case"


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_case_meets_the_oracle(path, backend, device):
    case, record = load_case(path)
    if reason := cannot_run(case, backend, device):
        pytest.skip(reason)
    report = run_case(case, backend=backend, device=device)
    assert report.ran_as_dispatched(), report.ran
    assert report.ok, f"{path.name} ({record.get('note', '')}):\n{report}"
