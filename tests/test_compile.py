"""Offline compile gate (no GPU needed): every shipped portable kernel config builds for sm_90a with
wgmma, no register spills and shared memory within the SM limit (TLX targets: test_tlx_compile.py).
The compile runs in a child process because this test process has Triton's interpreter switched on."""
import json

import pytest

from jfa.fuzz.compile_gate import shipped_targets

TARGETS = [t.name for t in shipped_targets()]


@pytest.fixture(scope="module")
def results(compile_gate):
    return compile_gate("triton")


@pytest.mark.parametrize("name", TARGETS)
def test_kernel_compiles_for_sm90a_with_wgmma_no_spills(name, results, record_property):
    row = results[name]
    record_property("resources", json.dumps({k: row[k] for k in ("registers", "local_bytes", "shared_bytes")}))
    assert row["tensor_core_ops"] > 0, "no wgmma"
    assert row["ok"], "; ".join(row["problems"])
