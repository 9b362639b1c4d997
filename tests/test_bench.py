"""CPU tests of the benchmark module: suite data, FLOP counts, CLI behaviour without a GPU."""

import inspect
import math

import pytest
import torch

from jfa.bench import impls, runner, suites
from jfa.bench.suites import flops, get_suite, make_lengths, q_lengths, visible_pairs

GEM_NAMES = [
    "uniform-B512-L1024-H4-D128",
    "longtail-B256-L4096-H4-D128",
    "uniform-B1152-L1000-H2-D64",
    "full-B8-L4096-H16-D128",
    "bcastq-Lq256-B1152-L1000-H4-D128",
]


def _gem(name):
    return next(p for p in get_suite("gem") if p.name == name)


def _design_recipe(name):
    """DESIGN.md section 6, written out independently of jfa.bench.suites."""
    g = torch.Generator().manual_seed(1)
    if name == "uniform-B512-L1024-H4-D128":
        return torch.randint(1, 1025, (512,), generator=g)
    if name == "longtail-B256-L4096-H4-D128":
        x = torch.exp(torch.randn(256, generator=g) * 1.2 + math.log(4096 / 8))
        x = x.clamp(0, 4096).long()
        x[torch.arange(0, 256, 17)] = 0
        return x
    if name in ("uniform-B1152-L1000-H2-D64", "bcastq-Lq256-B1152-L1000-H4-D128"):
        return torch.randint(1, 1001, (1152,), generator=g)
    if name == "full-B8-L4096-H16-D128":
        return torch.full((8,), 4096)
    raise KeyError(name)


def test_gem_suite_is_the_design_list():
    problems = get_suite("gem")
    assert [p.name for p in problems] == GEM_NAMES
    for p in problems:
        assert p.dtype == torch.bfloat16 and not p.causal
        assert (p.B, p.H, p.D) == tuple(
            int(part[1:]) for part in p.name.split("-") if part[0] in "BHD" and part[1:].isdigit())
    bq = _gem("bcastq-Lq256-B1152-L1000-H4-D128")
    assert bq.broadcast_q and bq.Lq == 256
    assert sum(p.broadcast_q for p in problems) == 1


@pytest.mark.parametrize("name", GEM_NAMES)
def test_gem_lengths_match_design_recipe(name):
    p = _gem(name)
    lengths = make_lengths(p)
    assert lengths.dtype == torch.long and lengths.shape == (p.B,)
    assert torch.equal(lengths, _design_recipe(name).long())
    # Deterministic, and independent of what was drawn before (fresh generator per shape).
    torch.randint(0, 10, (100,), generator=torch.Generator().manual_seed(1))
    for other in get_suite("gem"):
        make_lengths(other)
    assert torch.equal(make_lengths(p), lengths)


def test_longtail_shape_of_lengths():
    lengths = make_lengths(_gem("longtail-B256-L4096-H4-D128"))
    assert int(lengths.min()) >= 0 and int(lengths.max()) <= 4096
    assert (lengths[0::17] == 0).all()
    others = torch.ones(256, dtype=torch.bool)
    others[0::17] = False
    assert (lengths[others] > 0).all()  # only the every-17th ones are forced empty
    assert 200 < float(lengths[others].float().median()) < 1000  # around 4096/8


def test_uniform_and_full_ranges():
    u = make_lengths(_gem("uniform-B512-L1024-H4-D128"))
    assert 1 <= int(u.min()) and int(u.max()) <= 1024
    assert (make_lengths(_gem("full-B8-L4096-H16-D128")) == 4096).all()
    p = _gem("bcastq-Lq256-B1152-L1000-H4-D128")
    lk = make_lengths(p)
    assert (q_lengths(p, lk) == 256).all()
    assert torch.equal(lk, make_lengths(_gem("uniform-B1152-L1000-H2-D64")))


def test_every_suite_builds_lengths():
    for name, problems in suites.SUITES.items():
        assert problems, name
        for p in problems:
            lengths = make_lengths(p)
            assert int(lengths.min()) >= 0 and int(lengths.max()) <= p.max_len
    assert len(get_suite("sweep")) == 10
    assert sum(p.causal for p in get_suite("dense")) == 1
    with pytest.raises(ValueError, match="unknown suite"):
        get_suite("nope")


def test_sweep_sparsity_is_close_to_nominal_when_unclamped():
    for p in get_suite("sweep"):
        s = float(p.name.split("-s")[1].split("-")[0])
        realised = 1 - float(make_lengths(p).float().mean()) / p.max_len
        if s >= 0.5:
            assert abs(realised - s) < 0.03, p.name
        else:
            assert s < realised < 0.5, p.name  # the clamp at max_len removes tokens


def _brute_pairs(lq, lk, causal):
    if not causal:
        return lq * lk
    return sum(1 for i in range(lq) for j in range(lk) if j <= i + lk - lq)


@pytest.mark.parametrize("lq,lk", [(7, 3), (3, 7), (5, 5), (1, 9), (9, 1), (4, 0), (0, 4), (0, 0), (13, 12)])
@pytest.mark.parametrize("causal", [False, True])
def test_visible_pairs_brute_force(lq, lk, causal):
    got = visible_pairs(torch.tensor([lq]), torch.tensor([lk]), causal)
    assert int(got[0]) == _brute_pairs(lq, lk, causal)


def test_flops_against_brute_force_causal():
    lq, lk = torch.tensor([7, 3, 5, 0]), torch.tensor([3, 7, 5, 2])
    p = suites.Problem("t", B=4, H=2, D=8, max_len=7, lengths_fn=lambda g: lk, causal=True)
    pairs = sum(_brute_pairs(a, b, True) for a, b in zip(lq.tolist(), lk.tolist()))
    assert pairs < int((lq * lk).sum())
    assert flops(p, lq, lk, "fwd") == 4 * pairs * 2 * 8
    assert flops(p, lq, lk, "bwd") == 2.5 * 4 * pairs * 2 * 8
    nc = suites.Problem("t", B=4, H=2, D=8, max_len=7, lengths_fn=lambda g: lk)
    assert flops(nc, lq, lk, "fwd") == 4 * int((lq * lk).sum()) * 2 * 8
    with pytest.raises(ValueError):
        flops(p, lq, lk, "sideways")


def test_gem_flops_values():
    p = _gem("full-B8-L4096-H16-D128")
    lk = make_lengths(p)
    assert flops(p, q_lengths(p, lk), lk, "fwd") == 4 * 8 * 4096 * 4096 * 16 * 128
    b = _gem("bcastq-Lq256-B1152-L1000-H4-D128")
    lk = make_lengths(b)
    assert flops(b, q_lengths(b, lk), lk, "fwd") == 4 * 256 * int(lk.sum()) * 4 * 128


def test_varlen_causal_kwargs_adapts_to_signature():
    def new(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
        pass

    def old(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
        pass

    def bare(q, k, v, cu_q, cu_k, max_q, max_k):
        pass

    assert impls.varlen_causal_kwargs(new, True) == {"window_size": (-1, 0)}
    assert impls.varlen_causal_kwargs(new, False) == {}
    assert impls.varlen_causal_kwargs(old, True) == {"is_causal": True}
    assert impls.varlen_causal_kwargs(old, False) == {"is_causal": False}
    assert impls.varlen_causal_kwargs(bare, False) == {}
    with pytest.raises(NotImplementedError):
        impls.varlen_causal_kwargs(bare, True)
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return
    params = inspect.signature(varlen_attn).parameters
    assert "window_size" in params or "is_causal" in params


def test_reference_matches_sdpa_on_cpu():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 2, 8, generator=g) for n in (5, 7, 7))
    for causal in (False, True):
        got = runner._attention_fp32(q, k, v, causal)
        mask = None
        if causal:  # bottom-right: query i sees j <= i + 2
            mask = torch.arange(7)[None, :] <= torch.arange(5)[:, None] + 2
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask).transpose(0, 1)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # A query row that sees no key gives zeros.
    out = runner._attention_fp32(k, q, q, causal=True)  # Lq=7 > Lk=5: rows 0, 1 see nothing
    assert (out[:2] == 0).all() and torch.isfinite(out).all()


def test_num_copies():
    l2 = 60 * 2**20
    assert runner.num_copies(10 * 2**20, l2, 10**12) == 13  # 13 * 10 MiB > 120 MiB
    assert runner.num_copies(10**9, l2, 10**12) == 1
    assert runner.num_copies(10 * 2**20, l2, 4 * 30 * 2**20) == 3  # limited by memory
    assert runner.num_copies(1, l2, 10**12) == runner.MAX_COPIES


def test_dry_run_lists_every_gem_problem(capsys):
    assert runner.main(["--suite", "gem", "--dry-run", "--impls", "jfa-triton,torch-varlen"]) == 0
    out = capsys.readouterr().out
    for name in GEM_NAMES:
        assert name in out
    assert "jfa-triton" in out and "torch-varlen" in out


def test_rejects_unknown_impl():
    with pytest.raises(SystemExit) as e:
        runner.main(["--dry-run", "--impls", "no-such-impl"])
    assert e.value.code != 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_gpu_exits_nonzero_with_message(capsys):
    code = runner.main(["--suite", "gem", "--impls", "jfa-triton,torch-varlen", "--pass", "fwd,bwd"])
    assert code != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_markdown_report_layout():
    rows = []
    for impl, tf in (("jfa-triton", 330.0), ("torch-varlen", 300.0)):
        for pass_ in ("fwd", "bwd"):
            rows.append({"problem": "p", "impl": impl, "pass": pass_, "status": "ok", "tflops": tf,
                         "ms": 1.0, "ratio_vs_torch_varlen": None, "max_abs_err": 0.01,
                         "setup_ms": None, "note": ""})
    rows.append({"problem": "p", "impl": "jfa-tlx", "pass": "fwd", "status": "skipped", "tflops": None,
                 "ms": None, "ratio_vs_torch_varlen": None, "max_abs_err": None, "setup_ms": None,
                 "note": "no TLX"})
    runner._add_ratios(rows)
    assert rows[0]["ratio_vs_torch_varlen"] == pytest.approx(1.1)
    md = runner.markdown_report(rows)
    assert "| p | 330 / 330 | 300 / 300 | skipped /  |" in md
    assert "1.10 / 1.10" in md and "no TLX" in md
    assert "jfa-triton" in runner.format_table(rows)
