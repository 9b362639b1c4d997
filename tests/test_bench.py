"""CPU tests of the benchmark module: suite data, FLOP counts, CLI behaviour without a GPU,
report writers (CSV, markdown, PNG, BENCHMARKS.md), the padded / nested-tensor SDPA adapters
against the float64 oracle, and the broadcast-Q dq-summing of the peers."""

import csv
import inspect
import io
import json
import math
import os
import sys
import types

import numpy as np
import pytest
import torch

from jfa.bench import impls, report, runner, suites
from jfa.bench.suites import flops, get_suite, make_lengths, q_lengths, visible_pairs
from jfa.oracle import attention_backward, attention_forward

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
    assert all(p.causal for p in get_suite("causal"))
    with pytest.raises(ValueError, match="unknown suite"):
        get_suite("nope")


def test_the_causal_sweep_straddles_the_forwards_counter_threshold_at_each_head_dim():
    """The causal sweep exists to place ``LONG_CAUSAL_TILES``: at each head dim some of its causal problems
    are dealt zig-zag by the shipped forward and some take the counter (``Variant.for_launch``)."""
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    picks = {}
    for p in get_suite("causal-sweep"):
        assert p.causal, p.name
        lengths = make_lengths(p)
        tile_rows = tlx_forward.NUM_CONSUMERS * tlx_forward.config_for(p.D).block_m
        variant = tlx_forward.SHIPPED.for_launch(causal=True, window=(-1, -1), rows=int(lengths.sum()),
                                                 num_seqs=p.B, tile_rows=tile_rows, longest_rows=int(lengths.max()))
        picks.setdefault(p.D, set()).add(variant.schedule)
    assert picks == {64: {"zigzag", "dynamic"}, 128: {"zigzag", "dynamic"}}, picks


def test_the_broadcast_q_sweep_spans_query_lengths_and_key_lengths_at_each_head_dim():
    """The broadcast-Q sweep asks which schedule a broadcast Q's launches should take: every problem is a
    broadcast Q, over more than one query length and key length per head dim, and it is run by name only."""
    problems = get_suite("bcastq-sweep")
    assert all(p.broadcast_q and not p.causal for p in problems)
    for D in (64, 128):
        assert len({p.Lq for p in problems if p.D == D}) >= 3 and len({p.max_len for p in problems if p.D == D}) >= 2
    assert "bcastq-sweep" in suites.LAB_SUITES


def test_the_items_sweep_spans_short_and_long_dkdv_items_at_head_dim_64():
    """The items sweep asks where the backward's next-item prefetch pays: every problem is at D 64 (the
    producer's-dQ build), jagged and broadcast-Q ones both, their items from ~2 to ~16 query steps of 64 rows
    on average, and it is run by name only."""
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    problems = get_suite("items-sweep")
    assert all(p.D == 64 for p in problems)
    steps = {p.name: tlx_backward.item_steps(int(make_lengths(p).sum()), p.B, broadcast_q=p.broadcast_q,
                                             len_q_bcast=p.Lq or 0, group=1, causal=p.causal, block_m=64)
             for p in problems}
    assert min(steps.values()) <= 2.1 and max(steps.values()) >= 15, steps
    assert any(p.broadcast_q for p in problems) and any(not p.broadcast_q for p in problems)
    assert "items-sweep" in suites.LAB_SUITES


def test_the_items_sweep_straddles_the_backwards_prefetch_threshold():
    """The items sweep exists to place ``PREFETCH_MAX_STEPS``: what ships takes two K/V slot pairs on some of its
    problems and one on others (``BackwardVariant.kv_buffers`` of the launch's ``item_steps``)."""
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    cfg = tlx_backward.config_for(64, True)
    picks = {}
    for p in get_suite("items-sweep"):
        lengths = make_lengths(p)
        steps = tlx_backward.item_steps(int(lengths.sum()), p.B, broadcast_q=p.broadcast_q, len_q_bcast=p.Lq or 0,
                                        group=1, causal=p.causal, block_m=cfg.block_m)
        picks[p.name] = tlx_backward.SHIPPED.kv_buffers(cfg, steps=steps, broadcast_q=p.broadcast_q)
    for bcast in (False, True):
        assert {pairs for name, pairs in picks.items() if ("bcastq" in name) == bcast} == {1, 2}, picks


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


def _brute_window_pairs(lq, lk, causal, window):
    left, right = window
    right = 0 if causal else right
    return sum(1 for i in range(lq) for j in range(lk)
               if (left < 0 or j - i - (lk - lq) >= -left) and (right < 0 or j - i - (lk - lq) <= right))


@pytest.mark.parametrize("lq,lk", [(7, 3), (3, 7), (5, 5), (1, 9), (9, 1), (4, 0), (0, 4), (13, 12)])
@pytest.mark.parametrize("causal,window", [(False, (2, 1)), (False, (0, -1)), (False, (-1, 3)), (True, (3, 0)),
                                           (True, (0, -1)), (False, (0, 0))],
                         ids=["both", "left0", "right-only", "causal-left3", "causal-left0", "diagonal"])
def test_visible_pairs_of_a_window_brute_force(lq, lk, causal, window):
    got = visible_pairs(torch.tensor([lq, lk]), torch.tensor([lk, lq]), causal, window)
    assert got.tolist() == [_brute_window_pairs(lq, lk, causal, window), _brute_window_pairs(lk, lq, causal, window)]


def test_gqa_suite_problems_are_grouped_or_windowed():
    for p in get_suite("gqa"):
        assert p.kv_heads < p.H or p.window != (-1, -1), p.name
        lk = make_lengths(p)
        windowed = visible_pairs(q_lengths(p, lk), lk, p.causal, p.window).sum()
        assert windowed <= visible_pairs(q_lengths(p, lk), lk, p.causal).sum()


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


@pytest.mark.parametrize("broadcast_q", [False, True], ids=["packed", "bcastq"])
def test_the_forward_check_judges_by_the_oracle_rule(broadcast_q):
    """The bench's check (the rule of jfa.fuzz.rule on a subsample of sequences and heads) passes the
    reference's own output and refuses one that is off in a single checked row."""
    from jfa.reference import attention_reference

    b = _batch([3, 0, 5, 2], seed=4, Lq=4 if broadcast_q else None)
    out, _ = attention_reference(b.q, b.k, b.v, b.cu_q, b.cu_k, causal=b.causal, broadcast_q=b.broadcast_q)
    check = runner.ForwardCheck(b, runner.check_indices(b.lengths_q, b.lengths_k))
    assert check(out).ok
    wrong = out.clone()
    wrong[int(check.rows[-1]), 0] += 0.05
    verdict = check(wrong)
    assert not verdict.ok and verdict.error >= 0.04


def _grouped_batch(lengths, kv_heads, window, causal=False, seed=3):
    g = torch.Generator().manual_seed(seed)
    lk = torch.tensor(lengths, dtype=torch.long)
    total = int(lk.sum())
    q = torch.randn(total, 2 * kv_heads, D_T, generator=g)
    k, v = (torch.randn(total, kv_heads, D_T, generator=g) for _ in range(2))
    return impls.PackedBatch(q=q, k=k, v=v, cu_q=_cu(lengths), cu_k=_cu(lengths), max_q=int(lk.max()),
                             max_k=int(lk.max()), lengths_q=lk, lengths_k=lk, causal=causal, window=window)


@pytest.mark.parametrize("causal,window", [(False, (2, 1)), (True, (3, 0)), (False, (-1, -1))],
                         ids=["window", "causal-window", "no-window"])
def test_the_forward_check_judges_grouped_heads_and_windows(causal, window):
    """The check takes the query heads of its key/value heads and the problem's window: the reference's
    output passes, one computed without the window (or with the wrong key head) fails."""
    from jfa.reference import attention_reference

    b = _grouped_batch([9, 0, 12, 5], kv_heads=2, window=window, causal=causal)
    check = runner.ForwardCheck(b, runner.check_indices(b.lengths_q, b.lengths_k))
    out, _ = attention_reference(b.q, b.k, b.v, b.cu_q, b.cu_k, causal=causal, window=window)
    assert check(out).ok
    if window != (-1, -1):
        unwindowed, _ = attention_reference(b.q, b.k, b.v, b.cu_q, b.cu_k, causal=causal)
        assert not check(unwindowed).ok
    swapped, _ = attention_reference(b.q, b.k.flip(1), b.v.flip(1), b.cu_q, b.cu_k, causal=causal, window=window)
    assert not check(swapped).ok


def test_peers_without_grouped_heads_or_windows_say_not_applicable(cpu_runner, monkeypatch):
    impl = impls.get_impl("sdpa-padded")
    monkeypatch.setattr(impl, "available", lambda: (True, ""))
    for b in (_grouped_batch([3, 5], kv_heads=1, window=(-1, -1)), _grouped_batch([3, 5], kv_heads=2, window=(1, 1))):
        res = runner._bench_impl(impl, [b], torch.zeros(8, b.q.shape[1], D_T), suites.PASSES, None, 0, 0)
        assert res["status"] == "n/a" and "without a window" in res["note"], res


@pytest.mark.parametrize("causal,window,expected", [(False, (4, -1), (4, None)), (True, (4, 0), (4, 0)),
                                                    (False, (-1, 2), (None, 2))], ids=["left", "causal", "right"])
def test_fa4_gets_the_window_in_its_own_spelling(causal, window, expected, monkeypatch):
    seen = {}

    def fake_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                    causal=False, window_size=(None, None)):
        seen.update(causal=causal, window_size=window_size)
        return q

    monkeypatch.setattr(impls, "find_fa4_varlen", lambda: (fake_varlen, "fake"))
    b = _grouped_batch([3, 5], kv_heads=2, window=window, causal=causal)
    impls.get_impl("fa4-varlen").prepare(b, torch.zeros(8, 4, D_T)).fwd()
    assert seen == {"causal": causal, "window_size": expected}


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


# ---------------------------------------------------------------------------------------
# Reports: CSV, markdown, plots, BENCHMARKS.md
# ---------------------------------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NEW_IMPLS = ("sdpa-padded", "sdpa-njt", "fa4-varlen")


SYNTHETIC_PROBLEMS = {
    "gem": [("uniform-B512-L1024-H4-D128", 1024, 0.51), ("full-B8-L4096-H16-D128", 4096, 0.0)],
    "sweep": [("sweep-L1000-s0.5-B1152-H4-D128", 1000, 0.5), ("sweep-L1000-s0.9-B1152-H4-D128", 1000, 0.9),
              ("sweep-L4096-s0.5-B1152-H4-D128", 4096, 0.5)],
    "dense": [("dense-B4-L2048-H32-D128", 2048, 0.0), ("dense-B4-L8192-H16-D128-causal", 8192, 0.0)],
    "gqa": [("gqa-uniform-B256-L2048-H16-KV4-D128", 2048, 0.47), ("window-longtail-B256-L4096-H4-D128-W256", 4096, 0.76)],
    "causal": [("uniform-B512-L1024-H4-D128-causal", 1024, 0.51), ("full-B8-L4096-H16-D128-causal", 4096, 0.0)],
}


def _synthetic_rows(suite="gem", sweep=False):
    """Result rows as the runner makes them, for two or three problems (the sweep's with ``sweep``,
    the dense ones for suite "dense", else gem's), three impls, three passes."""
    rows = []
    problems = SYNTHETIC_PROBLEMS["sweep" if sweep else suite if suite in ("dense", "gqa", "causal") else "gem"]
    for pi, (problem, max_len, s) in enumerate(problems):
        for impl, base in (("jfa-triton", 300.0), ("torch-varlen", 250.0), ("sdpa-njt", None)):
            for pass_, f in (("fwd", 1.0), ("bwd", 2.5), ("fwd_bwd", 3.5)):
                ok = base is not None
                tflop = 0.5 * f
                tf = base * (1 + 0.1 * pi) * (0.9 if pass_ != "fwd" else 1) if ok else None
                rows.append({
                    "suite": suite, "problem": problem, "impl": impl, "pass": pass_,
                    "status": "ok" if ok else "n/a", "ms": tflop / tf * 1e3 if ok else None,
                    "tflops": tf, "ratio_vs_torch_varlen": None,
                    "peak_mem_mib": (100.0 if pass_ == "fwd" else 300.0) if ok else None,
                    "host_us": (410.0 if pass_ == "fwd" else 1520.0) if ok else None, "tflop": tflop, "max_abs_err": 0.01 if ok else None, "setup_ms": None,
                    "note": "" if ok else "causal: not covered", "B": 512, "H": 4, "D": 128,
                    "causal": False, "broadcast_q": False, "max_len": max_len, "sparsity": s,
                })
    report.add_ratios(rows)
    return rows


META = {"date": "2026-11-29 10:00 UTC", "device": "NVIDIA H200", "sm": "90", "torch": "2.11.0+cu130",
        "triton": "3.8.0", "timing": "triton do_bench median, warmup 25 ms, rep 100 ms"}


def test_csv_writer_round_trips(tmp_path):
    rows = _synthetic_rows()
    path = report.write_csv(str(tmp_path / "gem.csv"), rows)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        got = list(reader)
        header = reader.fieldnames
    assert len(got) == len(rows)
    assert header[:5] == ["suite", "problem", "impl", "pass", "status"]
    assert set(report.CSV_COLUMNS) <= set(header) | {"n_copies", "total_q", "total_k"}
    first = got[0]
    assert first["impl"] == "jfa-triton" and first["pass"] == "fwd"
    assert float(first["tflops"]) == pytest.approx(300.0)
    assert float(first["ratio_vs_torch_varlen"]) == pytest.approx(1.2)
    assert float(first["peak_mem_mib"]) == 100.0
    assert float(first["host_us"]) == 410.0
    na = next(r for r in got if r["impl"] == "sdpa-njt")
    assert na["status"] == "n/a" and na["tflops"] == "" and na["note"] == "causal: not covered"


def test_markdown_report_has_ms_ratio_memory_and_fwd_bwd():
    md = runner.markdown_report(_synthetic_rows())
    assert "TFLOP/s, fwd / bwd / fwd+bwd:" in md
    assert "ms, fwd / bwd / fwd+bwd:" in md
    assert "ratio to torch-varlen, fwd / bwd / fwd+bwd:" in md
    assert "peak extra GPU memory, MiB, fwd / fwd+bwd:" in md
    assert "| uniform-B512-L1024-H4-D128 | 300 / 270 / 270 | 250 / 225 / 225 | n/a / n/a / n/a |" in md
    assert "1.20 / 1.20 / 1.20" in md
    assert "100 / 300" in md
    assert "host time of a call (CPU, the GPU kept busy), us, fwd / fwd+bwd:" in md
    assert "| uniform-B512-L1024-H4-D128 | 410 / 1520 | 410 / 1520 | n/a / n/a |" in md
    assert "sdpa-njt on full-B8-L4096-H16-D128: n/a: causal: not covered" in md
    table = runner.format_table(_synthetic_rows())
    assert "peak MiB" in table and "fwd_bwd" in table


def test_plots_are_pngs(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (the optional 'bench' extra)")
    paths = report.write_plots(str(tmp_path), "gem", _synthetic_rows(), META)
    assert sorted(os.path.basename(p) for p in paths) == [
        "gem-tflops-bwd.png", "gem-tflops-fwd.png", "gem-tflops-fwd_bwd.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == PNG_MAGIC
    sweep = report.write_plots(str(tmp_path), "sweep", _synthetic_rows("sweep", sweep=True), META)
    names = sorted(os.path.basename(p) for p in sweep)
    assert "sweep-sparsity-fwd.png" in names and "sweep-tflops-fwd_bwd.png" in names and len(names) == 6
    with open(os.path.join(str(tmp_path), "sweep-sparsity-fwd.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_plots_skipped_with_note_without_matplotlib(tmp_path, monkeypatch):
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)  # makes "import matplotlib..." raise ImportError
    notes = []
    assert report.write_plots(str(tmp_path), "gem", _synthetic_rows(), META, log=notes.append) == []
    assert len(notes) == 1 and "matplotlib" in notes[0] and "skipped" in notes[0]
    paths = runner.write_reports("gem", _synthetic_rows(), META, out_dir=str(tmp_path / "o"), log=notes.append)
    assert paths["png"] == [] and os.path.exists(paths["csv"]) and os.path.exists(paths["json"])


def test_write_reports_and_benchmarks_md(tmp_path):
    rows = _synthetic_rows()
    bench_md = tmp_path / "docs" / "BENCHMARKS.md"
    bench_md.parent.mkdir()
    cmd = "python3 -m jfa.bench --suite gem --out out/bench --write-benchmarks docs/BENCHMARKS.md"
    paths = runner.write_reports("gem", rows, META, out_dir=str(tmp_path / "out"),
                                 benchmarks_path=str(bench_md), command=cmd, log=lambda s: None)
    for key in ("json", "md", "csv"):
        assert os.path.exists(paths[key])
    with open(paths["json"]) as f:
        assert json.load(f)["meta"]["device"] == "NVIDIA H200"
    text = bench_md.read_text()
    assert text.startswith("# Benchmarks")
    for needle in ("2026-11-29 10:00 UTC", "NVIDIA H200 (sm_90)", "torch 2.11.0+cu130, Triton 3.8.0",
                   "```\n" + cmd + "\n```", "## Suite gem", "TFLOP/s, fwd / bwd / fwd+bwd:",
                   "| full-B8-L4096-H16-D128 |"):
        assert needle in text, needle
    if paths["png"]:  # matplotlib installed: relative links to each PNG
        assert "![gem-tflops-fwd](../out/gem-tflops-fwd.png)" in text
    else:
        assert "## Plots" not in text


def test_write_benchmarks_default_files_dir(tmp_path):
    path = str(tmp_path / "B.md")
    paths = runner.write_reports("gem", _synthetic_rows(), META, benchmarks_path=path, command="x",
                                 plots=False, log=lambda s: None)
    assert os.path.dirname(paths["csv"]) == str(tmp_path / "B-files")
    assert os.path.exists(path)


def test_command_line(monkeypatch):
    assert runner.command_line(["--suite", "gem", "--out", "a b"]) == "jfa bench --suite gem --out 'a b'"
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python3", "-m", "jfa.bench", "--suite", "sweep"])
    monkeypatch.setattr(sys, "argv", ["/repo/jfa/bench/__main__.py", "--suite", "sweep"])
    assert runner.command_line(None) == "python3 -m jfa.bench --suite sweep"
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python3", "/venv/bin/jfa", "bench", "--suite", "gem"])
    assert runner.command_line(["--suite", "gem"]) == "jfa bench --suite gem"


def test_cli_passes_write_benchmarks(monkeypatch, tmp_path):
    seen = {}

    def fake_run_suite(suite, impls, passes, out, **kw):
        seen.update(suite=suite, impls=impls, passes=passes, out=out, **kw)
        return _synthetic_rows()

    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "run_suite", fake_run_suite)
    argv = ["--suite", "sweep", "--impls", "sdpa-padded,torch-varlen", "--write-benchmarks", str(tmp_path / "B.md")]
    assert runner.main(argv) == 0
    assert seen["suite"] == "sweep" and seen["impls"] == ["sdpa-padded", "torch-varlen"]
    assert seen["passes"] == ["fwd", "bwd", "fwd_bwd"]
    assert seen["benchmarks_path"] == str(tmp_path / "B.md")
    assert seen["command"].startswith("jfa bench --suite sweep") and seen["plots"] is True


def test_cli_passes_repeats_and_refuses_fewer_than_one(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "run_suite", lambda *a, **kw: seen.update(kw) or _synthetic_rows())
    assert runner.main(["--suite", "gem", "--repeats", "3"]) == 0
    assert seen["repeats"] == 3
    for bad in ("0", "two"):
        with pytest.raises(SystemExit):
            runner.main(["--suite", "gem", "--repeats", bad])
        assert "--repeats" in capsys.readouterr().err


def test_run_suite_refuses_fewer_than_one_repeat_before_anything_runs():
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        runner.run_suite("gem", repeats=0)


class _CountingImpl:
    """A stand-in implementation whose timings come from a script (no GPU needed)."""

    name = "fake"

    def available(self):
        return True, ""

    def applies(self, causal, broadcast_q, lengths_q, lengths_k):
        return True, ""

    def prepare(self, batch, grad):
        return impls.Prepared(fwd=lambda: torch.zeros(1), fwd_bwd=lambda: None)

    def clear_cache(self):
        pass


def test_repeats_report_the_median_and_keep_every_run(monkeypatch):
    """fwd and fwd+bwd take turns; each pass's time is the median over the repeats, a repeat's bwd
    being its own fwd+bwd minus its own fwd (not the medians' difference)."""
    script = iter([1.0, 4.0,    # repeat 1: fwd, fwd+bwd -> bwd 3.0
                   3.0, 5.0,    # repeat 2: bwd 2.0
                   2.0, 10.0])  # repeat 3: bwd 8.0
    calls = []
    monkeypatch.setattr(runner, "time_ms", lambda fn, warmup, rep: calls.append(fn) or next(script))
    monkeypatch.setattr(runner.torch.cuda, "synchronize", lambda: None)  # the check's sync (no GPU here)
    batch = types.SimpleNamespace(q=torch.zeros(1), causal=False, broadcast_q=False, lengths_q=None,
                                  lengths_k=None)
    res = runner._bench_impl(_CountingImpl(), [batch], None, ("fwd", "bwd"), None, 1, 1, repeats=3)
    assert res["status"] == "ok", res
    assert res["runs"] == {"fwd_ms": [1.0, 3.0, 2.0], "fwd_bwd_ms": [4.0, 5.0, 10.0], "bwd_ms": [3.0, 2.0, 8.0]}
    assert (res["fwd_ms"], res["fwd_bwd_ms"], res["bwd_ms"]) == (2.0, 5.0, 3.0)
    assert len(calls) == 6


def test_markdown_shows_the_range_of_the_repeats_only_when_repeated():
    rows = _synthetic_rows()
    assert "repeats" not in report.markdown_report(rows)
    for r in rows:
        r["repeats"] = 3
        if r["status"] == "ok":
            r["ms_min"], r["ms_max"] = r["ms"] * 0.9, r["ms"] * 1.2
    md = report.markdown_report(rows)
    assert "ms, lowest-highest of 3 repeats, fwd / bwd / fwd+bwd:" in md
    first = next(r for r in rows if r["status"] == "ok" and r["pass"] == "fwd")
    assert f"{first['ms_min']:.3f}-{first['ms_max']:.3f}" in md


def test_one_repeat_times_each_pass_once(monkeypatch):
    script = iter([1.5, 4.0])
    monkeypatch.setattr(runner, "time_ms", lambda fn, warmup, rep: next(script))
    monkeypatch.setattr(runner.torch.cuda, "synchronize", lambda: None)
    batch = types.SimpleNamespace(q=torch.zeros(1), causal=False, broadcast_q=False, lengths_q=None,
                                  lengths_k=None)
    res = runner._bench_impl(_CountingImpl(), [batch], None, ("fwd", "bwd"), None, 1, 1)
    assert (res["fwd_ms"], res["fwd_bwd_ms"], res["bwd_ms"]) == (1.5, 4.0, 2.5)


# ---------------------------------------------------------------------------------------
# --suite all: gem, sweep, dense, gqa, then causal in one run
# ---------------------------------------------------------------------------------------

ALL_SUITES = ("gem", "sweep", "dense", "gqa", "causal")


@pytest.mark.parametrize("suite", [*ALL_SUITES, "all"])
def test_parser_accepts_each_suite_and_all(suite):
    assert runner.build_parser().parse_args(["--suite", suite]).suite == suite


def test_all_stands_for_every_suite_in_order_but_the_lab_suites():
    assert runner.suite_names("all") == list(ALL_SUITES)
    assert "causal-sweep" in suites.SUITES and "causal-sweep" in suites.LAB_SUITES  # run by name only
    assert [name for name, _ in runner.plan("all")] == list(ALL_SUITES)


def test_dry_run_all_lists_the_problems_of_every_suite(capsys):
    assert runner.main(["--suite", "all", "--dry-run", "--impls", "jfa-triton,torch-varlen"]) == 0
    out = capsys.readouterr().out
    for suite in ALL_SUITES:
        assert f"suite {suite}: {len(get_suite(suite))} problems" in out
        for p in get_suite(suite):
            assert p.name in out, p.name
    assert out.index("suite gem:") < out.index("suite sweep:") < out.index("suite dense:")
    assert out.count("\n  jfa-triton:") == 1  # the impls once, after every suite


def test_dry_run_all_keeps_only_suites_with_selected_problems(capsys):
    assert runner.main(["--suite", "all", "--dry-run", "--impls", "jfa-triton", "--problems", "s0.9"]) == 0
    out = capsys.readouterr().out
    assert "suite sweep: 2 problems" in out and "sweep-L4096-s0.9-B1152-H4-D128" in out
    assert "suite gem" not in out and "suite dense" not in out and "sweep-L1000-s0.5" not in out


@pytest.mark.parametrize("entry", ["python -m jfa.bench", "jfa bench"])
def test_both_command_lines_accept_all(entry, capsys):
    from jfa import cli

    argv = ["--suite", "all", "--dry-run", "--impls", "jfa-triton"]
    code = runner.main(argv) if entry == "python -m jfa.bench" else cli.main(["bench", *argv])
    assert code == 0 and "suite dense: 4 problems" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_all_without_gpu_exits_nonzero_with_message(capsys):
    assert runner.main(["--suite", "all", "--impls", "jfa-triton"]) != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_combined_benchmarks_has_one_header_and_a_section_per_suite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    sections = [(s, _synthetic_rows(s, sweep=s == "sweep"), [str(out / f"{s}-tflops-fwd.png")]) for s in ALL_SUITES]
    cmd = "jfa bench --suite all --out out --write-benchmarks B.md"
    text = open(report.write_benchmarks(str(tmp_path / "B.md"), sections, META, cmd)).read()
    for once in ("# Benchmarks\n", "- Date: 2026-11-29 10:00 UTC", "- GPU: NVIDIA H200 (sm_90)",
                 "- torch 2.11.0+cu130, Triton 3.8.0", "```\n" + cmd + "\n```"):
        assert text.count(once) == 1, once
    assert "one run of suites `gem`, `sweep`, `dense`, `gqa`, `causal`." in text
    starts = [text.index(f"## Suite {s}\n") for s in ALL_SUITES]
    assert starts == sorted(starts) and text.count("## Suite ") == len(ALL_SUITES)
    bodies = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    for suite, body in zip(ALL_SUITES, bodies):  # each section: its own tables, problems and plots
        assert body.count("TFLOP/s, fwd / bwd / fwd+bwd:") == 1 and body.count("### Plots") == 1
        assert f"![{suite}-tflops-fwd](out/{suite}-tflops-fwd.png)" in body
        for name, _, _ in SYNTHETIC_PROBLEMS[suite]:
            assert f"| {name} |" in body


@pytest.fixture
def fake_gpu_bench(monkeypatch):
    """run_suite on CPU: CUDA "available", fixed meta, and a bench_problem that makes one ok row per
    impl and pass at once (TFLOP/s rising with the problem's sparsity, so the sweep plot has lines)."""
    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "_meta", lambda warmup, rep, repeats=1: dict(META))
    monkeypatch.setitem(sys.modules, "tqdm", None)  # progress as plain lines

    def bench_problem(suite, problem, adapters, passes, check, warmup, rep, log=None, repeats=1):
        lengths = make_lengths(problem)
        sparsity = 1 - float(lengths.float().mean()) / problem.max_len
        rows = [runner._row(suite, problem, impl.name, pass_, 1e12, ms=1.0, tflops=100.0 * (1 + sparsity + i),
                            sparsity=sparsity) for i, impl in enumerate(adapters) for pass_ in passes]
        report.add_ratios(rows)
        return rows

    monkeypatch.setattr(runner, "bench_problem", bench_problem)
    return dict(impls=["jfa-triton", "torch-varlen"], passes=["fwd"], command="jfa bench --suite all")


def test_run_all_writes_each_suite_files_as_a_single_suite_run_does(fake_gpu_bench, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (the optional 'bench' extra)")
    rows = runner.run_suite("all", out_dir=str(tmp_path / "all"), verbose=False, **fake_gpu_bench)
    assert [s for s in dict.fromkeys(r["suite"] for r in rows)] == list(ALL_SUITES)
    for suite in ALL_SUITES:  # the same JSON, CSV and markdown as the suite run alone
        runner.run_suite(suite, out_dir=str(tmp_path / suite), verbose=False, plots=False, **fake_gpu_bench)
        for name in os.listdir(tmp_path / suite):
            assert (tmp_path / "all" / name).read_text() == (tmp_path / suite / name).read_text(), name
    pngs = sorted(n for n in os.listdir(tmp_path / "all") if n.endswith(".png"))
    assert pngs == sorted([f"{suite}-tflops-fwd.png" for suite in ALL_SUITES] + ["sweep-sparsity-fwd.png"])


def test_run_all_writes_one_benchmarks_file_with_every_suite(fake_gpu_bench, tmp_path):
    path = tmp_path / "B.md"
    runner.run_suite("all", out_dir=str(tmp_path / "out"), benchmarks_path=str(path), verbose=False,
                     plots=False, **fake_gpu_bench)
    text = path.read_text()
    assert text.count("# Benchmarks\n") == 1 and text.count("jfa bench --suite all") == 1
    assert [line for line in text.splitlines() if line.startswith("## ")] == [f"## Suite {s}" for s in ALL_SUITES]
    for suite in ALL_SUITES:
        assert f"| {get_suite(suite)[-1].name} |" in text


def test_run_all_shows_progress_over_every_suite(fake_gpu_bench, tmp_path, capsys):
    runner.run_suite("all", **fake_gpu_bench)
    out = capsys.readouterr().out
    total = sum(len(get_suite(s)) for s in ALL_SUITES)
    for suite in ALL_SUITES:
        assert f"## suite {suite}: {len(get_suite(suite))} problems" in out
    assert f"[1/{total}] {get_suite('gem')[0].name} done" in out
    assert f"[{total}/{total}] {get_suite(ALL_SUITES[-1])[-1].name} done" in out


def test_progress_lines_without_tqdm():
    buf = io.StringIO()
    p = runner.Progress(2, use_tqdm=False, file=buf)
    p.log("# first")
    line = p.finish("first", 1.25)
    p.finish("second", 0.5)
    p.close()
    out = buf.getvalue()
    assert "# first" in out and line in out
    assert line.startswith("[1/2] first done in 1.2 s (elapsed") and "[2/2] second done in 0.5 s" in out
    quiet = io.StringIO()
    q = runner.Progress(1, enabled=False, file=quiet)
    q.finish("x", 1.0)
    assert quiet.getvalue() == ""


def test_progress_uses_tqdm_when_installed(monkeypatch):
    calls = []

    class FakeBar:
        def __init__(self, total, **kw):
            calls.append(("init", total))

        def write(self, msg, file=None):
            calls.append(("write", msg))

        def set_description(self, s):
            calls.append(("desc", s))

        def set_postfix_str(self, s):
            calls.append(("postfix", s))

        def update(self, n):
            calls.append(("update", n))

        def close(self):
            calls.append(("close",))

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    buf = io.StringIO()
    p = runner.Progress(3, file=buf)
    p.start("a")
    p.log("row")
    p.finish("a", 2.0)
    p.close()
    assert calls == [("init", 3), ("desc", "a"), ("write", "row"), ("postfix", "last 2.0 s"),
                     ("update", 1), ("close",)]
    assert buf.getvalue() == ""  # the bar replaces the per-problem lines


def test_peak_memory_is_measured_on_cuda_only():
    if torch.cuda.is_available():
        assert runner.peak_extra_mib(lambda: torch.empty(2**20, device="cuda"), torch.device("cuda")) >= 3.9
    assert runner.peak_extra_mib(lambda: torch.empty(4), torch.device("cpu")) is None


def test_host_time_is_measured_on_cuda_only():
    if torch.cuda.is_available():  # a few allocations: far below the sleep ahead of them
        assert 0 < runner.host_us(lambda: torch.empty(2**20, device="cuda"), torch.device("cuda")) < 5e3
    assert runner.host_us(lambda: torch.empty(4), torch.device("cpu")) is None


def test_dry_run_lists_new_impls_with_reasons(capsys):
    assert runner.main(["--suite", "gem", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    for name in NEW_IMPLS:
        assert name in lines, name
    assert "n/a for bcastq-Lq256-B1152-L1000-H4-D128: broadcast-Q" in out  # sdpa-njt
    if not torch.cuda.is_available():
        for name in NEW_IMPLS:
            assert "unavailable: needs a CUDA GPU" in lines[name], lines[name]
        try:
            import flash_attn.cute  # noqa: F401
        except Exception:  # noqa: BLE001
            assert "flash_attn.cute not importable" in lines["fa4-varlen"]
    dense = io.StringIO()
    runner.dry_run("dense", ["sdpa-njt"], file=dense)
    assert "n/a for dense-B4-L8192-H16-D128-causal: causal" in dense.getvalue()


# ---------------------------------------------------------------------------------------
# Padded and nested-tensor SDPA adapters on CPU, against the float64 oracle
# ---------------------------------------------------------------------------------------

H_T, D_T = 2, 8


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return cu


def _batch(lengths_k, lengths_q=None, causal=False, Lq=None, seed=0):
    """A float32 CPU PackedBatch; broadcast-Q when Lq is given."""
    g = torch.Generator().manual_seed(seed)
    lk = torch.tensor(lengths_k, dtype=torch.long)
    bcast = Lq is not None
    if bcast:
        lq, q, cu_q = torch.full_like(lk, Lq), torch.randn(Lq, H_T, D_T, generator=g), None
    else:
        lq = torch.tensor(lengths_q if lengths_q is not None else lengths_k, dtype=torch.long)
        q, cu_q = torch.randn(int(lq.sum()), H_T, D_T, generator=g), _cu(lq.tolist())
    k = torch.randn(int(lk.sum()), H_T, D_T, generator=g)
    v = torch.randn(int(lk.sum()), H_T, D_T, generator=g)
    return impls.PackedBatch(q=q, k=k, v=v, cu_q=cu_q, cu_k=_cu(lk.tolist()), max_q=int(lq.max()),
                             max_k=int(lk.max()), lengths_q=lq, lengths_k=lk, causal=causal, broadcast_q=bcast)


def _out_rows(b):
    return b.B * b.Lq if b.broadcast_q else b.q.shape[0]


def _oracle(b, dout=None):
    args = [t.double().numpy() for t in (b.q, b.k, b.v)]
    cu_q = None if b.broadcast_q else b.cu_q.numpy()
    out, lse = attention_forward(*args, cu_q, b.cu_k.numpy(), causal=b.causal, broadcast_q=b.broadcast_q)
    if dout is None:
        return out
    return out, attention_backward(*args, out, lse, dout.double().numpy(), cu_q, b.cu_k.numpy(),
                                   causal=b.causal, broadcast_q=b.broadcast_q)


PADDED_CASES = {
    "self-empty": dict(lengths_k=[3, 0, 5, 2]),
    "self-empty-causal": dict(lengths_k=[3, 0, 5, 2], causal=True),
    "cross-causal-blind-rows": dict(lengths_k=[2, 5, 3, 0], lengths_q=[4, 2, 0, 3], causal=True),
    "cross-blind-at-max-k": dict(lengths_k=[8, 1], lengths_q=[10, 0], causal=True),  # needs the extra column
    "bcast-causal-empty-k": dict(lengths_k=[3, 0, 5], Lq=4, causal=True),
    "bcast": dict(lengths_k=[3, 0, 5, 8], Lq=4),
}


@pytest.mark.parametrize("case", sorted(PADDED_CASES))
def test_padded_sdpa_matches_oracle(case):
    b = _batch(**PADDED_CASES[case])
    impl = impls.get_impl("sdpa-padded")
    assert impl.applies(b.causal, b.broadcast_q, b.lengths_q, b.lengths_k) == (True, "")
    p = impl.prepare(b, torch.zeros(_out_rows(b), H_T, D_T))
    with torch.no_grad():
        out = p.packed(p.fwd())
    assert out.shape == (_out_rows(b), H_T, D_T)
    np.testing.assert_allclose(out.double().numpy(), _oracle(b), atol=2e-6, rtol=0)
    assert p.fwd_bwd is not None and "pad/unpad not timed" in p.note


def test_padded_sizes_align_and_leave_a_zero_key():
    assert impls.padded_sizes(torch.tensor([3, 5]), torch.tensor([3, 5]), causal=False) == (5, 8)
    assert impls.padded_sizes(torch.tensor([3, 5]), torch.tensor([3, 16]), causal=False) == (5, 16)
    # causal Lq > Lk at the longest key sequence: one padding column is needed for the blind rows
    assert impls.padded_sizes(torch.tensor([17]), torch.tensor([16]), causal=True) == (17, 24)
    mask = impls.padded_attention_mask(torch.tensor([4]), torch.tensor([2]), True, 4, 8, torch.float32, "cpu")
    assert mask.shape == (1, 1, 4, 8)
    assert torch.isfinite(mask).any(dim=-1).all()  # no row is all -inf
    assert torch.isfinite(mask[0, 0, 0]).tolist() == [False, False, True] + [False] * 5  # blind row -> zero key 2
    assert torch.isfinite(mask[0, 0, 3]).tolist() == [True, True] + [False] * 6


def test_padded_sdpa_gradients_match_oracle():
    b = _batch([3, 0, 5, 2], causal=True, seed=3)
    dout = torch.randn(_out_rows(b), H_T, D_T, generator=torch.Generator().manual_seed(4))
    p = impls.get_impl("sdpa-padded").prepare(b, dout)
    q, k, v = p.leaves
    out = p.forward(q, k, v)  # padded [B, H, Lq_pad, D]
    out.backward(_padded_grad(b, dout))
    _, (dq, dk, dv) = _oracle(b, dout)
    unpad_q = p.to_packed(q.grad.transpose(1, 2))
    kb, kpos = impls._pad_index(b.lengths_k, "cpu")
    np.testing.assert_allclose(unpad_q.double().numpy(), dq, atol=1e-5, rtol=0)
    np.testing.assert_allclose(k.grad[kb, kpos].double().numpy(), dk, atol=1e-5, rtol=0)
    np.testing.assert_allclose(v.grad[kb, kpos].double().numpy(), dv, atol=1e-5, rtol=0)


def _padded_grad(b, dout):
    """dout in the padded [B, H, Lq_pad, D] layout of the adapter's output."""
    qb, qpos = impls._pad_index(b.lengths_q, "cpu")
    lq_pad = impls.padded_sizes(b.lengths_q, b.lengths_k, b.causal)[0]
    g = torch.zeros(b.B, lq_pad, H_T, D_T)
    g[qb, qpos] = dout
    return g.transpose(1, 2)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_sdpa_matches_oracle_with_empty_sequence():
    b = _batch([3, 0, 5, 2], seed=1)
    impl = impls.get_impl("sdpa-njt")
    assert impl.applies(False, False, b.lengths_q, b.lengths_k) == (True, "")
    dout = torch.randn(_out_rows(b), H_T, D_T, generator=torch.Generator().manual_seed(2))
    p = impl.prepare(b, dout)
    assert "1 empty sequences dropped" in p.note
    with torch.no_grad():
        out = p.packed(p.fwd())
    ref, (dq, dk, dv) = _oracle(b, dout)
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-6, rtol=0)
    q, k, v = p.leaves
    p.forward(q, k, v).backward(dout)
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        np.testing.assert_allclose(got.double().numpy(), want, atol=1e-5, rtol=0)
    p.fwd_bwd()  # the timed callable runs and drops its grads
    assert all(t.grad is None for t in p.leaves)


def test_nested_sdpa_not_applicable_with_reasons():
    impl = impls.get_impl("sdpa-njt")
    lk = torch.tensor([3, 4])
    ok, why = impl.applies(True, False, lk, lk)
    assert not ok and why.startswith("causal")
    ok, why = impl.applies(False, True, torch.full_like(lk, 4), lk)
    assert not ok and why.startswith("broadcast-Q")
    ok, why = impl.applies(False, False, torch.tensor([0, 4]), lk)
    assert not ok and "length 0" in why
    with pytest.raises(impls.NotApplicable, match="causal"):
        impl.prepare(_batch([3, 4], causal=True), torch.zeros(7, H_T, D_T))


# ---------------------------------------------------------------------------------------
# Broadcast-Q: peers' dq is the sum over the repeats
# ---------------------------------------------------------------------------------------

def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), **_):
    """A CPU stand-in for torch's varlen_attn (CUDA only), through jfa's PyTorch reference."""
    from jfa.reference import attention_reference
    return attention_reference(q, k, v, cu_q, cu_k, causal=tuple(window_size) == (-1, 0))[0]


def _fake_fa4(monkeypatch):
    """Install a fake ``flash_attn.cute`` whose varlen function returns ``(out, lse)`` as FA4's does."""

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, seqused_q=None, seqused_k=None, causal=False, **_):
        from jfa.reference import attention_reference
        return attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal)

    root, cute, iface = (types.ModuleType(n) for n in ("flash_attn", "flash_attn.cute", "flash_attn.cute.interface"))
    iface.flash_attn_varlen_func = flash_attn_varlen_func
    cute.interface = iface
    root.cute = cute
    for name, mod in (("flash_attn", root), ("flash_attn.cute", cute), ("flash_attn.cute.interface", iface)):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("name", ["sdpa-padded", "torch-varlen", "fa4-varlen"])
@pytest.mark.parametrize("causal", [False, True])
def test_broadcast_q_peer_dq_is_sum_over_repeats(name, causal, monkeypatch):
    if name == "torch-varlen":
        from torch.nn.attention import varlen as varlen_mod
        monkeypatch.setattr(varlen_mod, "varlen_attn", _reference_varlen)
    if name == "fa4-varlen":
        _fake_fa4(monkeypatch)
        assert impls.find_fa4_varlen()[1] == "flash_attn.cute.interface.flash_attn_varlen_func"
    lengths_k, Lq = [3, 0, 5, 6], 4
    b = _batch(lengths_k, Lq=Lq, causal=causal, seed=5)
    B = b.B
    dout = torch.randn(B * Lq, H_T, D_T, generator=torch.Generator().manual_seed(6))
    impl = impls.get_impl(name)

    # The peer's own graph: the leaf is the shared [Lq, H, D] Q, repeated inside the graph.
    p = impl.prepare(b, dout)
    q = p.leaves[0]
    assert q.shape == (Lq, H_T, D_T)
    out = p.forward(*p.leaves)
    grad = _padded_grad_bcast(dout, B, Lq) if name == "sdpa-padded" else dout
    out.backward(grad)
    assert "dq summed" in p.note

    # The same problem with Q repeated by hand (an independent leaf per copy): per-copy dq, summed.
    flat = impls.PackedBatch(q=b.q.repeat(B, 1, 1), k=b.k, v=b.v, cu_q=_cu([Lq] * B), cu_k=b.cu_k,
                             max_q=Lq, max_k=b.max_k, lengths_q=torch.full((B,), Lq),
                             lengths_k=b.lengths_k, causal=causal, broadcast_q=False)
    pf = impl.prepare(flat, dout)
    pf.forward(*pf.leaves).backward(grad)
    per_copy = pf.leaves[0].grad  # [B * Lq, H, D], or padded [B, Lq, H, D] (every sequence full)
    summed = per_copy.reshape(B, Lq, H_T, D_T).sum(0)
    torch.testing.assert_close(q.grad, summed, atol=1e-5, rtol=1e-5)
    # ... and both equal the oracle's broadcast-Q dq (summed over all sequences).
    _, (dq, _, _) = _oracle(b, dout)
    np.testing.assert_allclose(q.grad.double().numpy(), dq, atol=1e-5, rtol=0)
    # The forward-only callable gives the same output as the graph.
    with torch.no_grad():
        np.testing.assert_allclose(p.packed(p.fwd()).double().numpy(), _oracle(b), atol=2e-6, rtol=0)


def _padded_grad_bcast(dout, B, Lq):
    return dout.view(B, Lq, H_T, D_T).transpose(1, 2)


def test_expand_broadcast_q_sums_gradients():
    q = torch.randn(3, 2, 4, requires_grad=True)
    rep = impls.expand_broadcast_q(q, 5)
    assert rep.shape == (15, 2, 4) and torch.equal(rep.detach(), q.detach().repeat(5, 1, 1))
    w = torch.randn(15, 2, 4)
    (rep * w).sum().backward()
    torch.testing.assert_close(q.grad, w.view(5, 3, 2, 4).sum(0))
    x = torch.randn(1, 2, 3, 4)
    assert impls.expand_broadcast_q(x, 2, dim=2).shape == (1, 2, 6, 4)


def test_find_fa4_varlen_reports_missing_module(monkeypatch):
    # (both names: on a machine with FA4, another test may have imported flash_attn.cute already)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    fn, why = impls.find_fa4_varlen()
    assert fn is None and "flash_attn.cute not importable" in why
    ok, why = impls.get_impl("fa4-varlen").available()
    assert not ok and "flash_attn.cute not importable" in why


# ---------------------------------------------------------------------------------------
# The runner's per-implementation flow, on CPU with a stand-in timer
# ---------------------------------------------------------------------------------------

@pytest.fixture
def cpu_runner(monkeypatch):
    """_bench_impl on CPU: no-op synchronize, a timer that calls once and says 1 ms (fwd) / 3 ms."""
    monkeypatch.setattr(runner.torch.cuda, "synchronize", lambda *a, **k: None)
    calls = []

    def fake_time_ms(fn, warmup, rep):
        fn()
        calls.append(fn)
        return 1.0 if len(calls) == 1 else 3.0

    monkeypatch.setattr(runner, "time_ms", fake_time_ms)
    return calls


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("name", ["sdpa-padded", "sdpa-njt"])
def test_bench_impl_flow_on_cpu(name, cpu_runner, monkeypatch):
    impl = impls.get_impl(name)
    monkeypatch.setattr(impl, "available", lambda: (True, ""))
    b = _batch([3, 0, 5, 2], seed=7)
    grad = torch.randn(_out_rows(b), H_T, D_T)
    check = runner.ForwardCheck(b, runner.check_indices(b.lengths_q, b.lengths_k))
    res = runner._bench_impl(impl, [b], grad, suites.PASSES, check, 0, 0)
    assert res["status"] == "ok", res
    assert res["err"] < 1e-5 and res["fwd_ms"] == 1.0 and res["fwd_bwd_ms"] == 3.0 and res["bwd_ms"] == 2.0
    assert res["fwd_mem"] is None and res["fwd_host_us"] is None  # CPU tensors: nothing measured on a GPU
    # n/a, with the adapter's reason, before anything is prepared (NJT on a causal problem).
    njt = impls.get_impl("sdpa-njt")
    monkeypatch.setattr(njt, "available", lambda: (True, ""))
    c = _batch([3, 4], causal=True)
    res = runner._bench_impl(njt, [c], torch.zeros(7, H_T, D_T), suites.PASSES, None, 0, 0)
    assert res["status"] == "n/a" and res["note"].startswith("causal")


def test_bench_impl_reports_wrong_output(cpu_runner, monkeypatch):
    impl = impls.get_impl("sdpa-padded")
    monkeypatch.setattr(impl, "available", lambda: (True, ""))
    real_prepare = impl.prepare

    def broken_prepare(batch, grad):
        p = real_prepare(batch, grad)
        fwd = p.fwd
        p.fwd = lambda: fwd() * 1.5
        return p

    monkeypatch.setattr(impl, "prepare", broken_prepare)
    b = _batch([3, 5], seed=8)
    res = runner._bench_impl(impl, [b], torch.zeros(8, H_T, D_T), suites.PASSES,
                             runner.ForwardCheck(b, runner.check_indices(b.lengths_q, b.lengths_k)), 0, 0)
    assert res["status"] == "wrong" and res["fwd_ms"] is None and not cpu_runner


@pytest.mark.parametrize("broadcast_q", [False, True], ids=["packed", "bcastq"])
def test_launcher_inputs_match_the_problem(broadcast_q):
    p = suites.Problem("tiny", B=5, H=2, D=16, max_len=9, lengths_fn=suites._uniform(5, 9),
                       broadcast_q=broadcast_q, Lq=7 if broadcast_q else None)
    batch, kwargs = runner.launcher_inputs(p, "cpu")
    lengths_k = make_lengths(p)
    assert batch.cu_k.tolist() == [0] + lengths_k.cumsum(0).tolist()
    assert batch.q.shape == ((7 if broadcast_q else int(lengths_k.sum())), 2, 16)
    assert batch.k.shape == batch.v.shape == (int(lengths_k.sum()), 2, 16)
    assert kwargs == dict(causal=False, softmax_scale=16 ** -0.5, broadcast_q=broadcast_q, num_seqs=5,
                          len_q_bcast=7 if broadcast_q else 0, window=(-1, -1))


@pytest.mark.parametrize("broadcast_q", [False, True], ids=["packed", "bcastq"])
def test_the_lab_runs_the_tlx_forward_told_the_longest_query_sequence_as_the_op_tells_it(broadcast_q, monkeypatch):
    """``run_tlx_forward`` (the ablations', timelines' and profiler's forward) passes the launcher the longest query
    sequence (its long-causal schedule rule reads it: without it a launch takes another schedule than the op's),
    the problem's keyword arguments and the caller's own."""
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    seen = {}
    monkeypatch.setattr(tlx_forward, "jagged_forward_tlx", lambda *args, **kwargs: seen.update(args=args, **kwargs))
    p = suites.Problem("tiny", B=5, H=2, D=16, max_len=9, lengths_fn=lambda g: torch.tensor([3, 9, 0, 4, 7]),
                       broadcast_q=broadcast_q, Lq=6 if broadcast_q else None)
    batch, kwargs = runner.launcher_inputs(p, "cpu")
    runner.run_tlx_forward(batch, kwargs, profile=True)
    assert seen.pop("longest_q") == (6 if broadcast_q else 9)
    assert seen.pop("args")[:3] == (batch.q, batch.k, batch.v)
    assert seen == dict(kwargs, profile=True)


def test_the_sparse_benchmark_judges_each_output_by_its_own_lists():
    """python -m jfa.bench.sparse judges a block-sparse output against the oracle restricted to the same
    lists, on a subsample of sequences and heads: the block-sparse kernel's output passes, the dense op's
    (which sees every block) fails, and the dense judge says the opposite."""
    import jfa
    from jfa.bench import sparse
    from jfa.kernels.block_lists import exact_csr

    lengths = torch.tensor([300, 0, 129, 260])
    problem = suites.Problem("t", B=4, H=2, D=32, max_len=300, lengths_fn=lambda g: lengths, dtype=torch.float32)
    batch = runner.make_batches(problem, lengths, lengths, 1, "cpu")[0]
    lists = jfa.select_kv_blocks(batch.q, batch.k, batch.cu_q, batch.cu_k, block_size=sparse.BLOCK, keep_ratio=0.5)
    csr = exact_csr(lists, batch.cu_q, batch.cu_k, False, 0)
    seqs = [0, 3]
    sparse_out = jfa.block_sparse_attention(batch.q, batch.k, batch.v, batch.cu_q, batch.cu_k, kv_blocks=lists,
                                            block_size=sparse.BLOCK)
    dense_out = jfa.jagged_attention(batch.q, batch.k, batch.v, batch.cu_q, batch.cu_k)
    by_lists, dense = sparse._Judge(batch, seqs, csr), sparse._Judge(batch, seqs)
    assert by_lists(sparse_out).ok and not by_lists(dense_out).ok
    assert dense(dense_out).ok and not dense(sparse_out).ok
    assert 0.5 <= sparse._listed_share(csr, lengths, lengths, 2, False) < 0.75
    assert "| t | 0.5 |" in sparse.table([dict(problem="t", keep=None, impl="jfa-dense", status="ok", fwd_ms=2.0,
                                              bwd_ms=4.0),
                                         dict(problem="t", keep=0.5, impl="jfa-sparse", status="ok", fwd_ms=1.0,
                                              bwd_ms=2.5, listed_block_share=0.55)])


def test_the_sparse_table_shows_each_rows_forward_host_time():
    """Where a call's host time exceeds its kernels' time the GPU waits and fwd ms measures the host: the table
    shows both."""
    from jfa.bench import sparse

    md = sparse.table([dict(problem="t", keep=0.5, impl="jfa-sparse", status="ok", fwd_ms=1.0, bwd_ms=2.0,
                            fwd_host_us=812.4),
                       dict(problem="t", keep=0.5, impl="flex-blockmask", status="ok", fwd_ms=1.0, bwd_ms=2.0)])
    assert "| 812 | ok" in md and "| - | ok" in md


def test_a_lab_tool_times_its_columns_in_turns(monkeypatch):
    """``runner.times_in_turns``: each round times every column once, in order, so that a drift of the machine
    lands on all columns alike; each column's list holds one time per round."""
    timed = []
    monkeypatch.setattr(runner, "time_ms", lambda fn, warmup, rep: float(len(timed.append(fn()) or timed)))
    times = runner.times_in_turns({"a": lambda: "a", "b": lambda: "b"}, 3, 5, 10)
    assert timed == ["a", "b"] * 3
    assert times == {"a": [1.0, 3.0, 5.0], "b": [2.0, 4.0, 6.0]}


@pytest.mark.parametrize("configured", [True, False], ids=["config-o0", "config-o2"])
def test_the_llvm_other_way_column_compiles_the_opposite_of_the_config(configured):
    """``runner.llvm_the_other_way``: inside its knob settings a build of the kernel skips LLVM's optimisation
    exactly when its config does not ask for that (the config's own request is overridden)."""
    from jfa import knobs
    from jfa.kernels.tlx import pipeline
    from jfa.kernels.tlx.hopper.forward import jagged_fwd_tlx_kernel

    name = jagged_fwd_tlx_kernel.fn.__name__
    with pipeline.build_llvm_o0(name, configured):
        assert pipeline.llvm_o0(name) == configured
        with knobs.scope(**runner.llvm_the_other_way(jagged_fwd_tlx_kernel, configured)):
            assert pipeline.llvm_o0(name) == (not configured)


def test_step_phases_are_the_medians_of_each_consumers_stamps():
    """``step_phases`` reads a consumer's phases off its own rows (unlogged rows skipped, "to the next step"
    and "period" only across consecutive logged steps) and the turn offset off the steps both logged."""
    from jfa.bench.timeline import step_phases

    def step(start, turn_passed, v_ready, done):
        return [start, turn_passed, v_ready, done]

    unlogged = [-1, -1, -1, -1]
    c0 = [unlogged, step(100, 110, 150, 300), step(320, 330, 370, 520), unlogged, step(900, 905, 945, 1100)]
    c1 = [unlogged, step(150, 170, 210, 360), step(380, 400, 440, 590), step(600, 620, 660, 810), unlogged]
    phases = step_phases(np.array([c0, c1]))
    assert phases["consumer 0"] == {"K, turn and QK^T": 10, "V wait": 40, "softmax under PV": 150,
                                    "to the next step": 20, "period": 220, "n": 3}
    assert phases["consumer 1"] == {"K, turn and QK^T": 20, "V wait": 40, "softmax under PV": 150,
                                    "to the next step": 15, "period": 225, "n": 3}
    assert phases["turn offset"] == 65  # steps 1 and 2: 170 - 110 and 400 - 330


def test_item_phases_read_the_boundary_and_the_step_cost_off_the_backward_records():
    """``item_phases`` takes the SM clock from the records themselves (cycles over global-timer ns between a
    CTA's item starts), the phases' medians (the consumers' decode within their K/V wait too), the line through
    an item's cycles against its steps, whose intercept is the cost of an item beside its steps, and the
    producer's phases against the consumers' (how late it starts an item after the consumers' last step of the
    previous one); rows never run (-1) and items without steps are left out."""
    from jfa.bench.timeline import item_phases
    from jfa.kernels.tlx.hopper.dkdv_steps import PROFILE_FIELDS

    ghz, boundary, per_step = 2.0, 3000, 1000  # cycles; at 2 GHz: 1.5 us and 0.5 us
    rows, t = [], {0: 0, 1: 0}
    for i, steps in enumerate([1, 4, 2, 6, 3, 5, 2, 4]):
        cta = i % 2
        start = t[cta]
        kv, done = start + 1000, start + boundary - 600 + per_step * steps
        end = done + 600
        # the producer: starts 400 cycles after the consumers' start, issues K/V 500 later (K/V ready 100 after),
        # its last load 1000 cycles before the consumers' last step, its end 800 after that
        producer = [start + 400, start + 900, done - 1000, done - 200]
        rows.append([cta + 7, int(start / ghz), start, kv, done, end, cta, steps, *producer, start + 400, 0])
        t[cta] = end + 200  # 0.1 us to the CTA's next item
    width = len(PROFILE_FIELDS)
    rows += [[-1] * width, [3, 10, 10, 20, 30, 40, 0, 0, 10, 15, 25, 35, 12, 0]]
    phases = item_phases(np.array(rows))
    assert phases["items"] == 8 and phases["clock GHz"] == 2.0
    assert (phases["K/V wait"], phases["epilogue"], phases["to the next item"]) == (0.5, 0.3, 0.1)
    assert phases["of which decode"] == 0.2
    assert phases["fit"] == {"boundary": 1.5, "per step": 0.5}
    # late: the consumers' last step, then their epilogue (600), the gap (200) and the producer's 400 cycles
    assert phases["producer"] == {"late": 0.6, "decode and K/V issue": 0.25, "K/V issued to ready": 0.05,
                                  "after its last load": 0.4}
    assert item_phases(np.array([[-1] * width]))["items"] == 0


def test_the_makespan_model_costs_a_causal_tile_by_its_blocks_up_to_the_diagonal():
    """Item costs follow the causal forward: a 300-row sequence's tiles see 1, 2 and 3 blocks of 128 keys (the
    last tile's keys end at row 299), a 0-row one has none; each tile once per head."""
    from jfa.bench import makespan

    problem = suites.Problem("t", B=2, H=2, D=128, max_len=300,
                             lengths_fn=lambda g: torch.tensor([300, 0]), causal=True)
    costs = makespan.item_costs(problem)
    assert sorted(costs[costs > 0].tolist()) == [1, 1, 2, 2, 3, 3]


def test_the_makespan_model_deals_zigzag_and_the_counter_as_the_kernels_do():
    from jfa.bench import makespan

    equal = np.full(12, 2.0)  # equal items: both schedules end together, the counter's cost on every item
    assert makespan.makespans(equal, grid=4) == (6.0, 6.0)
    assert makespan.makespans(equal, counter_cost=0.5, grid=4) == (6.0, 7.5)
    # zig-zag deals odd rounds right to left (CTA 0 takes the round's last item): [5, 4] then [2, 1] -> 6 and 6
    assert makespan.makespans(np.array([5.0, 4.0, 2.0, 1.0]), grid=2)[0] == 6.0
    # a list not sorted by cost: zig-zag gives CTA 0 items 0, 3, 4 (3 + 1 + 3), the counter gives each item to
    # the CTA free first (3 + 3 and 1 + 1 + 1 + 3)
    assert makespan.makespans(np.array([3.0, 1.0, 1.0, 1.0, 3.0, 3.0]), grid=2) == (7.0, 6.0)


def test_the_makespan_model_reproduces_the_measurements_it_was_fitted_on():
    """The constants NOTES.md session 39 reports (FITTED) are the fit of session 38's measured ratios."""
    from jfa.bench import makespan

    per_item, counter_cost, rms = makespan.fit(makespan.MEASURED_SESSION_38, {p.name: p for p in get_suite("causal")})
    assert (per_item, round(counter_cost, 2)) == (makespan.FITTED["per_item"], makespan.FITTED["counter_cost"])
    assert rms < 0.02


def test_an_ablation_narrowed_to_some_columns_leaves_the_portable_one_out_unless_named():
    from jfa.bench.ablation import times_portable

    assert times_portable("") and times_portable("dynamic,portable") and times_portable("port")
    assert not times_portable("dynamic") and not times_portable("dynamic,zig-zag")


def test_kernel_breakdown_adds_each_kernels_time_per_call_and_orders_them_longest_first():
    from jfa.bench import kernels

    events = [("dkdv", 0.0, 90.0), ("stats", 90.0, 100.0), ("dkdv", 120.0, 210.0), ("stats", 210.0, 230.0)]
    result = kernels.per_call(events, calls=2)
    assert [(k["name"], k["launches"], k["us"]) for k in result["kernels"]] == [("dkdv", 1.0, 90.0),
                                                                              ("stats", 1.0, 15.0)]
    assert result["busy_us"] == 105.0
    assert result["span_us"] == 115.0  # the 20 us the host left between the calls count in the span only


def test_kernel_breakdown_cuts_long_names_and_counts_what_they_share_as_one_kernel():
    from jfa.bench import kernels

    long_a, long_b = "k" * 200 + "a", "k" * 200 + "b"
    result = kernels.per_call([(long_a, 0.0, 1.0), (long_b, 1.0, 3.0)], calls=1)
    assert len(result["kernels"]) == 1
    assert len(result["kernels"][0]["name"]) == kernels.NAME_CHARS and result["kernels"][0]["launches"] == 2.0
    assert result["kernels"][0]["us"] == 3.0


def test_kernel_breakdown_refuses_zero_calls_and_reports_no_time_for_no_events():
    from jfa.bench import kernels

    with pytest.raises(ValueError, match="calls"):
        kernels.per_call([], calls=0)
    assert kernels.per_call([], calls=3) == {"kernels": [], "busy_us": 0.0, "span_us": 0.0}


def test_kernel_breakdown_cli_says_no_gpu_instead_of_failing_deep_inside(monkeypatch, capsys):
    from jfa.bench import kernels

    monkeypatch.setattr(kernels.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        kernels.main(["--suite", "gem"])
    assert exit_info.value.code == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_kernel_breakdown_cli_writes_each_implementations_passes_with_their_rate(monkeypatch, tmp_path):
    from jfa.bench import kernels

    class Stub:
        def available(self):
            return True, ""

        def prepare(self, batch, grad):
            def fwd_bwd():
                pass

            fwd_bwd.backward = True
            return impls.Prepared(fwd=lambda: None, fwd_bwd=fwd_bwd)

        def clear_cache(self):
            pass

    problem = _gem("full-B8-L4096-H16-D128")
    small = types.SimpleNamespace(q=torch.zeros(8, 1, 1), lengths_q=torch.tensor([4, 4]), lengths_k=torch.tensor([4, 4]))
    monkeypatch.setattr(kernels.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(kernels.torch.cuda, "get_device_name", lambda: "stub")
    monkeypatch.setattr(kernels, "launcher_inputs", lambda p: (small, {}))
    monkeypatch.setattr(kernels.torch, "randn", lambda *a, **k: None)
    monkeypatch.setattr(kernels, "get_impl", lambda name: Stub())
    monkeypatch.setattr(kernels, "kernel_events", lambda fn, calls: [("main", 0.0, 100.0 * calls)] + (
        [("dkdv", 0.0, 300.0 * calls)] if getattr(fn, "backward", False) else []))
    assert kernels.main(["--only", "full-B8", "--impls", "a,b", "--calls", "2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "kernels.json").read_text())["results"]
    assert sorted(results) == [f"{problem.name} {i} {p}" for i in "ab" for p in ("fwd", "fwd_bwd")]
    work = flops(problem, small.lengths_q, small.lengths_k, "fwd_bwd")
    assert results[f"{problem.name} a fwd_bwd"]["tflops_busy"] == pytest.approx(work / 400e-6 / 1e12)
    rows = [line for line in (tmp_path / "kernels.md").read_text().splitlines() if problem.name in line]
    assert [row.split(" | ")[1] for row in rows] == ["a", "b"] and all(row.endswith("| dkdv |") for row in rows)


def test_kernel_breakdown_summary_names_the_backwards_main_kernel_and_leaves_the_forwards_out():
    from jfa.bench import kernels

    fwd = kernels.per_call([("fwd_k", 0.0, 50.0)], calls=1)
    both = kernels.per_call([("fwd_k", 0.0, 50.0), ("stats", 50.0, 60.0), ("dkdv", 60.0, 160.0),
                             ("readout", 160.0, 165.0)], calls=1)
    table = kernels.summary({"p impl fwd": fwd, "p impl fwd_bwd": both}, {"p": 2e10})
    row = table.splitlines()[-1]
    assert row == "| p | impl | 50 | 100 (200) | 15 | dkdv |"  # 20 GFLOP in 100 us: 200 TFLOP/s
    assert len(table.splitlines()) == 3


def test_profiled_calls_warm_up_unrecorded_then_record_exactly_the_asked_calls(monkeypatch):
    monkeypatch.setattr(runner.torch.cuda, "synchronize", lambda: None)  # (no GPU here)
    seen = []

    def fn():
        seen.append(len(seen))
        with torch.profiler.record_function("one_call"):
            torch.ones(2).sum()

    prof = runner.profiled_calls(fn, calls=3, warmups=2, host=True)
    assert len(seen) == 5
    assert sum(e.name == "one_call" for e in prof.events()) == 3
