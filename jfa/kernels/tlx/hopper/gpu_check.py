"""GPU harness for the TLX Hopper forward: a smoke launch, its case suite, timing and the ablation.

    python -m jfa.kernels.tlx.hopper.gpu_check smoke        # one tiny launch: does it run, finish, agree
    python -m jfa.kernels.tlx.hopper.gpu_check correctness  # the case suite with backend="tlx", judged by the rule
    compute-sanitizer --tool memcheck python -m jfa.kernels.tlx.hopper.gpu_check sanitize  # small adversarial shapes
    python -m jfa.kernels.tlx.hopper.gpu_check bench        # gem suite: TLX vs portable forward, TFLOP/s
    python -m jfa.kernels.tlx.hopper.gpu_check ablation     # each schedule/pingpong/peeling switch off in turn
    python -m jfa.kernels.tlx.hopper.gpu_check bwd          # backward: portable vs TLX dK/dV pass, TFLOP/s
    python -m jfa.kernels.tlx.hopper.gpu_check bwd-ablation # backward: scheduling, dQ reductions, determinism
    ncu ... python -m jfa.kernels.tlx.hopper.gpu_check profile --only longtail  # plain launches for a profiler

Run each under ``timeout -s KILL`` (a pipeline bug shows up as a hang: mbarrier phases or the pingpong
handshake out of step); every line is flushed before the next launch, so the last line printed names
the case that hung. ``correctness`` judges through :func:`jfa.testing.run_case` (NaN-poisoned outputs,
float64 oracle, the ``2 * |ref_t - oracle| + floor`` rule) with ``backend="tlx"``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from jfa.kernels.tlx.hopper import forward as tlx_forward


def _say(*parts) -> None:
    print(*parts, flush=True)


def cases() -> list:
    """The catalogue's structural cases for every supported dtype and head dim, plus the TLX tile
    edges (per consumer, per work item, per key block), many work items per CTA (ring and phase
    wrap-around, the persistent stride), and the value recipes that stress the softmax."""
    from jfa.fuzz.catalog import structural_cases, tail_lengths
    from jfa.testing import Case, replace

    out = []
    for dtype in ("bf16", "fp16"):
        for head_dim in tlx_forward.SUPPORTED_HEAD_DIMS:
            out += structural_cases(dtype, head_dim)
            cfg = tlx_forward.config_for(head_dim)
            base = Case((), (), head_dim=head_dim, dtype=dtype)
            for block in sorted({cfg.block_m, tlx_forward.NUM_CONSUMERS * cfg.block_m, cfg.block_n,
                                 2 * cfg.block_n}):
                lens = tail_lengths(block)
                out.append(replace(base, lengths_q=lens, lengths_k=lens, name=f"tlx-tails-{block}-{dtype}-D{head_dim}"))
                out.append(replace(base, lengths_q=lens, lengths_k=lens[::-1], causal=True,
                                   name=f"tlx-tails-{block}-causal-{dtype}-D{head_dim}"))
            g = torch.Generator().manual_seed(head_dim)
            lens = tuple(int(x) for x in torch.randint(0, 400, (200,), generator=g))
            for causal in (False, True):
                out.append(replace(base, lengths_q=lens, lengths_k=lens, heads=4, causal=causal,
                                   name=f"tlx-many-items{'-causal' if causal else ''}-{dtype}-D{head_dim}"))
                out.append(replace(base, lengths_q=(256,), lengths_k=lens, heads=4, causal=causal, broadcast_q=True,
                                   name=f"tlx-many-items-bcastq{'-causal' if causal else ''}-{dtype}-D{head_dim}"))
    for values in ("near-ties", "dominant-key", "constant-keys"):
        out.append(Case((300, 77, 513), (300, 513, 77), heads=2, head_dim=128, dtype="bf16", causal=True,
                        values=values, name=f"tlx-values-{values}"))
    return out


def smoke() -> int:
    from jfa.testing import Case, run_case

    case = Case((5, 130, 0, 70), (7, 129, 3, 70), heads=2, head_dim=128, dtype="bf16", causal=True,
                name="tlx-smoke")
    start = time.time()
    report = run_case(case, backend="tlx", device="cuda", backward=False)
    torch.cuda.synchronize()
    _say(f"smoke: {report.worst}  (forward kernel {report.kernel}, {time.time() - start:.1f}s)")
    return 0 if report.ok and report.kernel == "tlx-hopper" else 1


def correctness(only: str = "") -> int:
    from jfa.testing import run_case

    failures = 0
    selected = [c for c in cases() if not only or only in c.id]
    for i, case in enumerate(selected):
        _say(f"[{i + 1}/{len(selected)}] {case.id} ...")
        report = run_case(case, backend="tlx", device="cuda", backward=False)
        torch.cuda.synchronize()
        ok = report.ok and report.kernel == "tlx-hopper"
        failures += not ok
        _say(f"    {'ok  ' if ok else 'FAIL'} {report.worst}  ({report.kernel})")
    _say(f"{len(selected) - failures}/{len(selected)} cases pass")
    return 1 if failures else 0


def sanitize_cases() -> list:
    """Small adversarial shapes for compute-sanitizer (memcheck, racecheck): empty sequences, length 1,
    tile tails on both sides, Lq != Lk under causal (rows that see no key), broadcast Q."""
    from jfa.testing import Case

    out = []
    for head_dim in tlx_forward.SUPPORTED_HEAD_DIMS:
        base = dict(heads=2, head_dim=head_dim, dtype="bf16")
        out += [Case((0, 1, 0, 127, 129, 0), (0, 1, 5, 127, 129, 0), name=f"san-empty-one-tails-D{head_dim}", **base),
                Case((1, 300, 64, 200), (130, 7, 64, 1), causal=True, name=f"san-causal-cross-D{head_dim}", **base),
                Case((200, 7, 0), (7, 200, 3), causal=True, name=f"san-causal-lq-gt-lk-D{head_dim}", **base),
                Case((77,), (0, 129, 1), broadcast_q=True, name=f"san-bcastq-D{head_dim}", **base)]
    return out


def sanitize(backward: bool = False) -> int:
    """Launch each sanitizer case (forward, backend="tlx"; with ``backward`` also the gradients, which
    autograd runs on the TLX backward where it applies) and check it against the oracle; run this under
    ``compute-sanitizer --tool memcheck|racecheck --error-exitcode 9``."""
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.testing import run_case

    bad = 0
    for case in sanitize_cases():
        if backward and case.head_dim not in tlx_backward.SUPPORTED_HEAD_DIMS:
            continue
        report = run_case(case, backend="tlx", device="cuda", backward=backward)
        torch.cuda.synchronize()
        bad += not report.ok
        _say(f"{'ok  ' if report.ok else 'FAIL'} {case.id}: {report.worst}")
    return 1 if bad else 0


# the ablation study of issue 3: each switch off in turn, against what ships
ABLATIONS = {
    "shipped": tlx_forward.SHIPPED,
    "round-robin (no zig-zag)": tlx_forward.Variant(schedule="round-robin"),
    "dynamic scheduler": tlx_forward.Variant(schedule="dynamic"),
    "no LPT sort": tlx_forward.Variant(longest_first=False),
    "not persistent": tlx_forward.Variant(schedule="round-robin", persistent=False),
    "no pingpong": tlx_forward.Variant(pingpong=False),
    "pingpong turn over QK and PV": tlx_forward.Variant(pingpong_pv=True),
    "no loop peeling": tlx_forward.Variant(peel=False),
    "rowless half computed": tlx_forward.Variant(skip_rowless=False),
}


def _suite_inputs(suite: str, head_dims, also_at_d64: bool = False):
    """(problem, one fresh input batch, launcher kwargs) for each problem of ``suite`` at ``head_dims``;
    with ``also_at_d64`` each other jagged problem once more at head dim 64 (named ``...-D64``)."""
    import dataclasses

    from jfa.bench.runner import launcher_inputs
    from jfa.bench.suites import get_suite

    for problem in get_suite(suite):
        if problem.D in head_dims:
            yield (problem, *launcher_inputs(problem))
        if also_at_d64 and problem.D != 64 and 64 in head_dims and not problem.name.startswith("full"):
            at64 = dataclasses.replace(problem, D=64, name=problem.name.replace(f"D{problem.D}", "D64"))
            yield (at64, *launcher_inputs(at64))


def _max_abs_diffs(got, ref) -> dict:
    """``{"dq_max_abs_diff": ..., "dk_...", "dv_..."}`` of two (dq, dk, dv) triples."""
    return {f"d{x}_max_abs_diff": (float((a.float() - r.float()).abs().max()) if a.numel() else 0.0)
            for x, a, r in zip("qkv", got, ref)}


def _write_json(path: str, record: dict) -> None:
    import json

    if path:
        with open(path, "w") as f:
            json.dump({**record, "device": torch.cuda.get_device_name()}, f, indent=2)


def bench(suite: str = "gem", variants: tuple = ("shipped",), out: str = "", rep: int = 100) -> int:
    """TFLOP/s of the TLX forward (each variant) and the portable forward on each shape of ``suite``;
    the launchers are timed directly (no API validation), inputs fresh per shape."""
    import triton

    from jfa.bench.suites import flops
    from jfa.kernels.triton.forward import jagged_forward

    table = {}
    for problem, b, kwargs in _suite_inputs(suite, tlx_forward.SUPPORTED_HEAD_DIMS):
        q, k, v, cu_q, cu_k = b.q, b.k, b.v, b.cu_q, b.cu_k
        work = flops(problem, b.lengths_q, b.lengths_k, "fwd")
        row = table[problem.name] = {}
        runs = [(name, lambda variant=ABLATIONS[name]: tlx_forward.jagged_forward_tlx(
            q, k, v, cu_q, cu_k, variant=variant, **kwargs)) for name in variants]
        runs.append(("portable", lambda: jagged_forward(q, k, v, cu_q, cu_k, **kwargs)))
        for name, fn in runs:
            ms = triton.testing.do_bench(fn, warmup=25, rep=rep)
            row[name] = round(work / ms / 1e9, 1)
        _say(f"{problem.name:36s} " + "  ".join(f"{n} {t:6.1f}" for n, t in row.items()) + "  TFLOP/s")
    _write_json(out, {"suite": suite, "tflops": table})
    return 0


def bwd(suite: str = "gem", out: str = "", rep: int = 100) -> int:
    """Backward TFLOP/s: the portable backward; the same with its dK/dV pass on the TLX kernel (shipped
    config; at D64 also 32-row steps); the TLX backward with the fused dQ reduction where it applies.
    The dK/dV pass alone is the difference to a run that skips it (same delta and dQ passes). Every
    variant's gradients are compared with the portable ones (max abs difference)."""
    import dataclasses
    import functools

    import triton

    from jfa.bench.suites import flops
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.triton.backward import jagged_backward

    def skip_dkdv(*args, **kwargs):
        return None

    table = {}
    for problem, b, kwargs in _suite_inputs(suite, tlx_backward.SUPPORTED_HEAD_DIMS):
        q, k, v, cu_q, cu_k = b.q, b.k, b.v, b.cu_q, b.cu_k
        o, lse = tlx_forward.jagged_forward_tlx(q, k, v, cu_q, cu_k, **kwargs)
        do = torch.randn_like(o)
        work = flops(problem, b.lengths_q, b.lengths_k, "bwd")
        runs = {"portable": functools.partial(jagged_backward, dkdv=None),
                "tlx": functools.partial(jagged_backward, dkdv=tlx_backward.jagged_dkdv_tlx)}
        if problem.D == 64:
            m32 = dataclasses.replace(tlx_backward.config_for(64), block_m=32)
            runs["tlx-m32"] = functools.partial(
                jagged_backward, dkdv=functools.partial(tlx_backward.jagged_dkdv_tlx, config=m32))
        if problem.D in tlx_backward.FUSED_DQ_HEAD_DIMS:
            runs["tlx-fused-dq"] = functools.partial(tlx_backward.jagged_backward_tlx, fused_dq=True)
        ref = jagged_backward(q, k, v, o, lse, do, cu_q, cu_k, **kwargs)
        row = table[problem.name] = {}
        for name, fn in runs.items():
            diff = _max_abs_diffs(fn(q, k, v, o, lse, do, cu_q, cu_k, **kwargs), ref)
            ms = triton.testing.do_bench(lambda fn=fn: fn(q, k, v, o, lse, do, cu_q, cu_k, **kwargs),
                                         warmup=25, rep=rep)
            row[name] = {"bwd_tflops": round(work / ms / 1e9, 1), "ms": round(ms, 4), **diff}
        rest = triton.testing.do_bench(lambda: jagged_backward(q, k, v, o, lse, do, cu_q, cu_k, dkdv=skip_dkdv,
                                                               **kwargs), warmup=25, rep=rep)
        for name in runs:
            if name != "tlx-fused-dq":
                row[name]["dkdv_ms"] = round(row[name]["ms"] - rest, 4)
        row["delta_and_dq_ms"] = round(rest, 4)
        _say(f"{problem.name:40s} " + "  ".join(
            f"{n}: {r['bwd_tflops']} TFLOP/s ({r['ms']} ms, dK/dV {r.get('dkdv_ms', '-')} ms, max diff dq/dk/dv "
            f"{r['dq_max_abs_diff']:.2g}/{r['dk_max_abs_diff']:.2g}/{r['dv_max_abs_diff']:.2g})"
            for n, r in row.items() if isinstance(r, dict)) + f"  delta+dQ {rest:.3f} ms")
    _write_json(out, {"suite": suite, "bwd": table})
    return 0


def _fused_path_parts(q, o, do, lse, cu_q, kwargs, rep):
    """Times of what the fused-dQ backward runs besides its kernel (memory-bound passes): the row
    statistics with delta computed in the same pass, alone and zeroing the fp32 dQ accumulator too (what
    ships, not for broadcast Q; the portable delta pass and the statistics from it, as the unfused path
    runs them, beside it), allocating the zeroed accumulator (what broadcast Q runs), reading it out as
    dq in q's dtype."""
    import triton

    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.tlx.hopper import row_stats as stats_pass
    from jfa.kernels.triton.backward import row_delta
    from jfa.kernels.triton.forward import output_offsets

    num_seqs = kwargs["num_seqs"]
    out_cu = output_offsets(cu_q, num_seqs, kwargs["len_q_bcast"], kwargs["broadcast_q"], q.device)
    delta = row_delta(o, do)
    def accumulator():
        return tlx_backward.DqAccumulator(q)

    def stats_with_delta(**options):
        return lambda: stats_pass.row_stats(lse, None, out_cu, num_seqs, outputs=(o, do, None), **options)

    accum = accumulator()
    zero = tlx_backward.DqAccumulator(q, zeroed=False).tensor if not kwargs["broadcast_q"] else None
    parts = {"row stats with delta": stats_with_delta(),
             # what ships (not broadcast Q): the same pass also zeroes the accumulator
             "row stats with delta, zeroing dq_accum": stats_with_delta(zero=zero),
             "... 32-row blocks": stats_with_delta(zero=zero, block_rows=32),
             "... 128-row blocks": stats_with_delta(zero=zero, block_rows=128),
             "delta (unfused path)": lambda: row_delta(o, do),
             "row stats from delta (unfused path)": lambda: stats_pass.row_stats(lse, delta, out_cu, num_seqs),
             "zero dq_accum": accumulator, "convert dq": accum.read}
    return {name: round(triton.testing.do_bench(fn, warmup=10, rep=rep), 4) for name, fn in parts.items()}


def bwd_ablation(suite: str = "gem", out: str = "", rep: int = 100, only: str = "", rounds: int = 1,
                 shapes: str = "") -> int:
    """The backward's ablation (issue 4): the whole TLX backward's TFLOP/s with each scheduling switch
    off in turn (dK/dV kernel: zig-zag instead of round-robin, one CTA per work item instead of
    persistent), and, where the dQ is fused (every shape, and the jagged ones again at D64): what ships
    (D 64: the producer's dQ; D 128: the 64-row steps' dQ halves sent a step late), those halves sent in
    their own step, the 32-row D 128 build that shipped until session 11 ("32-row steps (D128)") and,
    on the 32-row builds, each reduction of the consumers' dQ (``BackwardVariant.dq_reduce``: "tma";
    "atomic"; "none" and "stage-only", timing only, dq wrong), the dQ-before-dK step order and the
    producer's dQ's own switches ("producer: ...": its step before the loads, sent in its own step,
    "stage-only", "none", the zig-zag schedule; only where the build has the producer's dQ), against the
    deterministic backward (portable dQ pass: each row written once, fixed order); what ships again
    under the generic pipeliner and with the other LLVM setting; plus what the fused path runs outside
    its kernel. ``only``: comma-separated substrings of the column names to time (the deterministic
    baseline always runs); ``rounds``: the columns take turns that many times (median and range);
    ``shapes``: comma-separated substrings of the shape names."""
    import contextlib
    import functools
    import statistics

    import triton

    from jfa.bench.suites import flops
    from jfa.kernels.tlx import pipeline
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    BV = tlx_backward.BackwardVariant
    # the 32-row builds at D 128 (steps64=0, shipped until session 11; at D 64 every build has 64-row
    # steps): the switches of the producer's and the consumers' dQ are theirs
    B32 = functools.partial(BV, steps64=False)
    unfused = {"deterministic": BV(), "zig-zag": BV(schedule="zigzag"),
               "not persistent": BV(persistent=False)}
    # experiment (not validated, its builds spill: NOTES.md session 7): D128 64-row row-major steps
    unfused["rows64, deterministic"] = B32(rows64=True)
    # a consumer whose key rows all lie past the sequence computes anyway (skip_keyless=0: until session 10)
    unfused["keyless half computed, deterministic"] = B32(skip_keyless=False)
    fused = {"fused tma (ships)": BV()}  # what ships first
    # at D 128: the 64-row steps' dQ halves sent in their own step; their parts (timing only: dq wrong;
    # "stage-only" is left out: ptxas crashed on that build, SIGSEGV, 2026-11-30)
    fused.update({"steps64: dq half sent in its step": BV(halves_send_late=False),
                  "steps64: none": BV(dq_reduce="none")})
    # the 32-row D 128 build with the producer's dQ (what shipped until session 11), its switches
    fused["32-row steps (D128), dQ in producer"] = B32()
    fused["rows64, fused tma"] = B32(rows64=True)
    fused["producer: dQ before the loads"] = B32(dq_first=True)
    fused["producer: dQ sent in its step"] = B32(dq_send_late=False)
    fused["producer: zig-zag"] = B32(schedule="zigzag")
    fused["keyless half computed"] = B32(skip_keyless=False)
    # what ships, timed again with the generic pipeliner on the dK/dV kernel (own waits ship for it:
    # jfa.kernels.tlx.pipeline), set around each launch: the setting is part of the cache key, so both
    # builds live in this process and are timed in turn, past the run-to-run spread between processes
    own_waits_columns = {"generic pipeliner (dK/dV)": False}
    fused.update({name: BV() for name in own_waits_columns})
    # likewise, JFA_TLX_LLVM_O0 set around each launch: what ships with LLVM optimising all of the
    # kernel's LLVM IR (its 64-row D 128 build, which ships without, then spills) and the 32-row D 128
    # build without it (what its config does not ask for)
    llvm_columns = {"LLVM O3 (dK/dV)": False, "32-row steps (D128), LLVM O0": "jagged_dkdv_tlx_kernel"}
    fused.update({"LLVM O3 (dK/dV)": BV(), "32-row steps (D128), LLVM O0": B32()})
    fused.update({f"producer: {mode}": B32(dq_reduce=mode) for mode in ("stage-only", "none")})
    fused.update({f"fused {mode}": B32(dq_in_producer=False, dq_reduce=mode) for mode in tlx_backward.DQ_REDUCES})
    fused["fused tma, dQ before dK"] = B32(dq_in_producer=False, dq_first=True)
    if only:
        wanted = [w for w in only.split(",") if w]
        unfused = {n: v for n, v in unfused.items() if n == "deterministic" or any(w in n for w in wanted)}
        fused = {n: v for n, v in fused.items() if any(w in n for w in wanted)}
    _say(f"JFA_TLX_OWN_WAITS={os.environ.get(pipeline.ENV, '')!r} (dK/dV kernel: "
         f"{'own waits' if pipeline.enabled('jagged_dkdv_tlx_kernel') else 'generic pipeliner'})")
    table = {}
    for problem, b, kwargs in _suite_inputs(suite, tlx_backward.SUPPORTED_HEAD_DIMS, also_at_d64=True):
        if shapes and not any(w in problem.name for w in shapes.split(",") if w):
            continue
        q, k, v, cu_q, cu_k = b.q, b.k, b.v, b.cu_q, b.cu_k
        o, lse = tlx_forward.jagged_forward_tlx(q, k, v, cu_q, cu_k, **kwargs)
        do = torch.randn_like(o)
        work = flops(problem, b.lengths_q, b.lengths_k, "bwd")
        def applies(name, D=problem.D):  # the columns of D 128's builds (at D 64 the same build as ships)
            return D == 128 or not any(w in name for w in ("32-row", "steps64", "rows64", "LLVM O3"))

        runs = {name: dict(fused_dq=False, variant=var) for name, var in unfused.items() if applies(name)}
        if problem.D in tlx_backward.FUSED_DQ_HEAD_DIMS:
            # the "producer: ..." columns only where the build has the producer's dQ (not causal D 128)
            runs.update({name: dict(fused_dq=True, variant=var) for name, var in fused.items()
                         if applies(name) and (not name.startswith("producer:") or tlx_backward.dq_in_producer(
                             tlx_backward.config_for(problem.D, var), var, kwargs["causal"]))})
        ref = tlx_backward.jagged_backward_tlx(q, k, v, o, lse, do, cu_q, cu_k, fused_dq=False, **kwargs)
        row = table[problem.name] = {}
        fns, times = {}, {name: [] for name in runs}
        for name, extra in runs.items():
            def fn(extra=extra, waits=own_waits_columns.get(name), llvm=llvm_columns.get(name)):
                with contextlib.ExitStack() as settings:
                    if waits is not None:
                        settings.enter_context(pipeline.own_waits(waits))
                    # the other columns as their builds ask, whatever the environment says
                    settings.enter_context(pipeline.llvm_unoptimised(llvm))
                    return tlx_backward.jagged_backward_tlx(q, k, v, o, lse, do, cu_q, cu_k, **extra, **kwargs)
            fns[name] = fn
            row[name] = _max_abs_diffs(fn(), ref)
        # with rounds > 1 the columns take turns, so that a drift of the clocks reaches all of them
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(triton.testing.do_bench(fn, warmup=25, rep=rep))
        for name, ms_list in times.items():
            ms = statistics.median(ms_list)
            row[name] = {"bwd_tflops": round(work / ms / 1e9, 1), "ms": round(ms, 4), **row[name]}
            if rounds > 1:
                row[name]["tflops_range"] = [round(work / max(ms_list) / 1e9, 1), round(work / min(ms_list) / 1e9, 1)]
        if problem.D in tlx_backward.FUSED_DQ_HEAD_DIMS:
            row["outside the fused kernel, ms"] = _fused_path_parts(q, o, do, lse, b.cu_q, kwargs, rep)
        _say(f"{problem.name:40s} " + "  ".join(f"{n}: {r['bwd_tflops']} {r.get('tflops_range', '')} ({r['ms']} ms, "
                                                 f"dq diff {r['dq_max_abs_diff']:.2g})" for n, r in row.items()
                                                 if "bwd_tflops" in r))
        if "outside the fused kernel, ms" in row:
            _say(f"{'':40s} outside the fused kernel, ms: {row['outside the fused kernel, ms']}")
    _write_json(out, {"suite": suite, "own_waits": pipeline.enabled("jagged_dkdv_tlx_kernel"), "bwd_ablation": table})
    return 0


def profile(suite: str = "gem", only: str = "", launches: int = 2) -> int:
    """For a profiler (tools/gpu/profile.sh): the shipped forward and backward of each shape of ``suite``
    whose name contains ``only``, each launched ``launches`` times in a row, nothing timed (the first
    launch compiles: have the profiler skip it)."""
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    for problem, b, kwargs in _suite_inputs(suite, tlx_forward.SUPPORTED_HEAD_DIMS):
        if only not in problem.name:
            continue
        q, k, v, cu_q, cu_k = b.q, b.k, b.v, b.cu_q, b.cu_k
        for _ in range(launches):
            o, lse = tlx_forward.jagged_forward_tlx(q, k, v, cu_q, cu_k, **kwargs)
        do = torch.randn_like(o)
        for _ in range(launches):
            tlx_backward.jagged_backward_tlx(q, k, v, o, lse, do, cu_q, cu_k, **kwargs)
        torch.cuda.synchronize()
        _say(f"{problem.name}: {launches} forward and {launches} backward launches")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.kernels.tlx.hopper.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("smoke", "correctness", "sanitize", "bench", "ablation", "bwd",
                                         "bwd-ablation", "profile"))
    parser.add_argument("--backward", action="store_true", help="sanitize: the gradients too (TLX dK/dV)")
    parser.add_argument("--only", default="", help="correctness, profile: substring of the case (shape) names to run; "
                        "ablation, bwd-ablation: comma-separated substrings of the columns to time")
    parser.add_argument("--suite", default="gem", help="bench, ablation: suite name (jfa.bench.suites)")
    parser.add_argument("--out", default="", help="bench, ablation: write the TFLOP/s table as JSON here")
    parser.add_argument("--rep", type=int, default=100, help="bench, ablation: do_bench rep (ms)")
    parser.add_argument("--rounds", type=int, default=1, help="bwd-ablation: time the columns this many times "
                        "in turn (median TFLOP/s and its range)")
    parser.add_argument("--shapes", default="", help="bwd-ablation: comma-separated substrings of the shapes to run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        _say("gpu_check: no CUDA GPU visible")
        return 2
    ok, reason = tlx_forward.supports(torch.empty(1, 1, 64, device="cuda", dtype=torch.bfloat16), 64, torch.bfloat16)
    if not ok:
        _say(f"gpu_check: the TLX forward cannot run here: {reason}")
        return 2
    if args.what == "smoke":
        return smoke()
    if args.what == "correctness":
        return correctness(args.only)
    if args.what == "sanitize":
        return sanitize(args.backward)
    if args.what == "bwd":
        return bwd(args.suite, args.out, args.rep)
    if args.what == "bwd-ablation":
        return bwd_ablation(args.suite, args.out, args.rep, args.only, args.rounds, args.shapes)
    if args.what == "profile":
        return profile(args.suite, args.only)
    if args.what == "ablation":
        wanted = [w for w in args.only.split(",") if w]
        variants = [n for n in ABLATIONS if n == "shipped" or not wanted or any(w in n for w in wanted)]
        return bench(args.suite, tuple(variants), args.out, args.rep)
    return bench(args.suite, ("shipped",), args.out, args.rep)


if __name__ == "__main__":
    sys.exit(main())
