"""The simulator-fidelity tool (jfa.fuzz.fidelity): a record compared with the simulator reports both
verdicts and the outputs' largest difference; here the simulator plays the GPU, so a faithful record
compares bitwise equal and a perturbed one shows its perturbation."""
import pytest
import torch

from jfa.fuzz import fidelity

CASE = "gqa-causal-bf16-D64"


@pytest.fixture(autouse=True)
def cpu_only(device):
    if device != "cpu":
        pytest.skip("the simulator runs on the CPU interpreter")


def test_a_record_compares_equal_to_its_simulation_and_a_perturbed_one_does_not(tmp_path):
    import jfa.sim as sim

    with sim.simulated(arch=(9, 0), sm_count=3):
        assert fidelity.record(tmp_path, only=CASE, device="cpu") == 0
    (row,) = fidelity.compare(tmp_path, only=CASE, workers=1)
    assert row["gpu_ok"] and row["sim_ok"] and row["kernels"]["sim"] == ["tlx-hopper", "tlx-hopper"]
    assert set(row["tensors"]) == set(fidelity.TENSORS)
    assert all(t["bitwise"] and t["max_diff"] == 0.0 for t in row["tensors"].values()), row

    (path,) = tmp_path.glob("*.pt")
    saved = torch.load(path, weights_only=False)
    saved["outputs"]["dk"] = saved["outputs"]["dk"] + 0.25
    torch.save(saved, path)
    (row,) = fidelity.compare(tmp_path, only=CASE, workers=1)
    assert not row["tensors"]["dk"]["bitwise"] and row["tensors"]["dk"]["max_diff"] == pytest.approx(0.25, rel=0.1)
    assert row["tensors"]["out"]["bitwise"]
    assert "| dk | 0/1 |" in fidelity.summary([row])
