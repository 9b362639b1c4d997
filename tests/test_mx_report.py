"""The MXFP8 error report's arithmetic (jfa.bench.mx_report): per-row relative errors and cosine, the
sampled sequence, and the bound step on a small sample (the MX oracle inside bound (b), kernel outputs
compared on the same rows)."""
import torch

from jfa.bench import mx_report


def test_row_errors_of_a_scaled_copy():
    ref = torch.randn(7, 2, 16, dtype=torch.float64)
    ref[3] = 0  # rows with a zero reference are left out
    got = mx_report.row_errors(ref * 1.5, ref)
    assert got["rows"] == 12
    assert abs(got["median"] - 0.5) < 1e-12 and abs(got["p99"] - 0.5) < 1e-12
    assert abs(got["cosine"] - 1.0) < 1e-12
    assert mx_report.row_errors(-ref, ref)["cosine"] < -0.999


def test_the_sample_is_the_sequence_nearest_the_median_length_under_the_cap():
    assert mx_report._sample_sequence(torch.tensor([0, 900, 10, 50, 70, 2000]), cap=512) == 3
    assert mx_report._sample_sequence(torch.tensor([0, 900, 700]), cap=512) is None  # none fits: no sample


def test_the_bound_step_finds_the_mx_oracle_inside_bound_b():
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(24, 2, 32, generator=g).to(torch.bfloat16) for _ in range(4))
    sample = {"problem": "tiny", "sequence": 0, "causal": True, "broadcast_q": False, "softmax_scale": 32 ** -0.5,
              "q": q, "k": k, "v": v, "dout": dout,
              "outputs": {"floor": {"out": None, "dq": None, "dk": None, "dv": None}}}
    rows = mx_report.bound_rows(sample)
    assert [r["rule"] for r in rows] == ["floor"]
    for name in mx_report.TENSORS:
        entry = rows[0][name]
        assert entry["violations"] == 0 and 0 < entry["oracle_over_bound_max"] <= 1
        assert "kernel_over_bound_max" not in entry  # no kernel output given for it
