"""The TLX kernels' ablation study on a GPU: each reported switch off in turn, against what ships.

    python -m jfa.bench.ablation forward            # persistence, LPT order, dynamic scheduler, pingpong,
                                                    # peeling, Q operand, LLVM setting, long causal zig-zag
    python -m jfa.bench.ablation forward --suite causal-sweep --only "dynamic,zig-zag"   # the counter's rule
    python -m jfa.bench.ablation backward           # persistence, deterministic dQ, the dK/dV kernel's compile
                                                    # switches
    ncu ... python -m jfa.bench.ablation profile --only longtail   # plain launches for a profiler

Every column of one shape is timed in the same process on the same inputs (the launchers are called
directly, no API validation); with ``--rounds N`` the columns take turns N times, so that a drift of the
clocks reaches all of them (median and range). Each column's result is compared with what ships (max
abs difference; the ablation builds round differently but must agree to bf16 noise). Run it under
``timeout -s KILL``: a pipeline bug shows up as a hang, and every line is flushed before the next launch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from typing import Callable

import torch

from jfa import knobs


def _say(*parts) -> None:
    print(*parts, flush=True)


def _suite_inputs(suite: str, head_dims, also_at_d64: bool = False):
    """(problem, one fresh input batch, launcher kwargs) for each problem of ``suite`` at ``head_dims``;
    with ``also_at_d64`` each other jagged problem once more at head dim 64 (named ``...-D64``)."""
    from jfa.bench.runner import launcher_inputs
    from jfa.bench.suites import get_suite

    for problem in get_suite(suite):
        if problem.D in head_dims:
            yield (problem, *launcher_inputs(problem))
        if also_at_d64 and problem.D != 64 and 64 in head_dims and not problem.name.startswith("full"):
            at64 = dataclasses.replace(problem, D=64, name=problem.name.replace(f"D{problem.D}", "D64"))
            yield (at64, *launcher_inputs(at64))


def _max_abs_diff(got, ref) -> float:
    pairs = zip(got, ref) if isinstance(got, tuple) else [(got, ref)]
    return max((float((a.float() - r.float()).abs().max()) if a.numel() else 0.0) for a, r in pairs)


def _time_columns(columns: dict, work: float, rep: int, rounds: int) -> dict:
    """{name: {"tflops", "ms", ["tflops_range"]}} of each callable in ``columns``, taking turns ``rounds``
    times."""
    from jfa.bench.runner import times_in_turns

    times = times_in_turns(columns, rounds, 25, rep)
    out = {}
    for name, ms_list in times.items():
        ms = statistics.median(ms_list)
        out[name] = {"tflops": round(work / ms / 1e9, 1), "ms": round(ms, 4)}
        if rounds > 1:
            out[name]["tflops_range"] = [round(work / max(ms_list) / 1e9, 1), round(work / min(ms_list) / 1e9, 1)]
    return out


def _selected(columns: dict, only: str, keep: str) -> dict:
    wanted = [w for w in only.split(",") if w]
    return {n: c for n, c in columns.items() if n == keep or not wanted or any(w in n for w in wanted)}


def times_portable(only: str) -> bool:
    """Whether ``--only`` leaves the portable kernels' column in (no selection, or one naming it): a selection of
    TLX columns need not wait for the slowest column of all."""
    return bool(_selected({"portable": None}, only, ""))


def forward(suite: str = "gem", only: str = "", rep: int = 100, rounds: int = 1) -> dict:
    """TFLOP/s of the TLX forward with each ablation switch off, and of the portable forward."""
    from jfa.bench.runner import llvm_the_other_way, run_tlx_forward
    from jfa.bench.suites import flops
    from jfa.kernels.tlx.hopper import forward as tlx_forward
    from jfa.kernels.triton.forward import jagged_forward

    V = tlx_forward.Variant
    def fixed(variant):
        return lambda cfg: (variant, {})

    # name -> (head dim's config -> (variant, knob settings around the launch)); the knobs are part of the
    # compile cache key, so every column's build lives in this process
    columns_spec = _selected({
        "shipped": fixed(V()), "dynamic scheduler": fixed(V(schedule="dynamic")),
        "no LPT sort": fixed(V(longest_first=False)), "not persistent": fixed(V(persistent=False)),
        "no pingpong": fixed(V(pingpong=False)), "no loop peeling": fixed(V(peel=False)),
        # causal launches over long sequences dealt zig-zag too (``Variant.for_launch``; elsewhere what ships)
        "long causal zig-zag": fixed(V(long_causal_schedule="zigzag")),
        # the bulk loop's Q operand from where the config does not take it (registers or shared memory)
        "Q the other way": lambda cfg: (V(q_regs=not cfg.q_in_registers), {}),
        # LLVM optimising the IR where the config leaves it to ptxas, and the other way round
        "LLVM the other way": lambda cfg: (V(), llvm_the_other_way(tlx_forward.jagged_fwd_tlx_kernel, cfg.llvm_o0)),
    }, only, "shipped")
    table = {}
    for problem, b, kwargs in _suite_inputs(suite, tlx_forward.SUPPORTED_HEAD_DIMS):
        args = (b.q, b.k, b.v, b.cu_q, b.cu_k)
        cfg = tlx_forward.config_for(problem.D)

        def launch(variant, settings):
            with knobs.scope(**settings):
                return run_tlx_forward(b, kwargs, variant=variant)

        columns: dict[str, Callable] = {name: (lambda vs=spec(cfg): launch(*vs)) for name, spec in columns_spec.items()}
        if times_portable(only):
            columns["portable"] = lambda: jagged_forward(*args, **kwargs)
        ref = columns["shipped"]()
        row = _time_columns(columns, flops(problem, b.lengths_q, b.lengths_k, "fwd"), rep, rounds)
        for name, fn in columns.items():
            row[name]["out_max_abs_diff"] = _max_abs_diff(fn()[0], ref[0])
        table[problem.name] = row
        _say(f"{problem.name:36s} " + "  ".join(f"{n} {r['tflops']:6.1f}" for n, r in row.items()) + "  TFLOP/s")
    return table


def _fused_path_parts(q, o, do, lse, cu_q, kwargs, rep: int) -> dict:
    """Milliseconds of what the fused-dQ backward runs besides its kernel (memory-bound passes): the row
    statistics with delta (and zeroing the fp32 dQ accumulator, what ships for jagged Q), the zeroed
    accumulator alone (what broadcast Q runs), dq's read-out in q's dtype."""
    import triton

    from jfa.kernels.schedule import output_offsets
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.tlx.hopper import row_stats as stats_pass

    num_seqs = kwargs["num_seqs"]
    out_cu = output_offsets(cu_q, num_seqs, kwargs["len_q_bcast"], kwargs["broadcast_q"], q.device)
    accum = tlx_backward.DqAccumulator(q)
    zero = tlx_backward.DqAccumulator(q, zeroed=False).tensor if not kwargs["broadcast_q"] else None
    parts = {"row stats with delta": lambda: stats_pass.row_stats(lse, None, out_cu, num_seqs, outputs=(o, do, None)),
             "... zeroing dq_accum": lambda: stats_pass.row_stats(lse, None, out_cu, num_seqs, outputs=(o, do, None),
                                                                  zero=zero),
             "zero dq_accum": lambda: tlx_backward.DqAccumulator(q), "convert dq": accum.read}
    return {name: round(triton.testing.do_bench(fn, warmup=10, rep=rep), 4) for name, fn in parts.items()}


def backward(suite: str = "gem", only: str = "", rep: int = 100, rounds: int = 1, shapes: str = "") -> dict:
    """TFLOP/s of the TLX backward as it ships (fused dQ), with the deterministic dQ (the portable dQ pass), not
    persistent, items from the global counter (the dynamic schedule), the next item's K, V and first query tiles
    loaded during this one (two K/V slot pairs), the dK/dV kernel under Triton's generic pipeliner and with LLVM
    optimising its IR (compile switches, set around each launch: part of the cache key, so both builds live in this
    process), and of the portable backward; plus what the fused path runs outside its kernel."""
    from jfa.bench.runner import run_tlx_forward
    from jfa.bench.suites import flops
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.triton.backward import jagged_backward

    BV = tlx_backward.BackwardVariant
    # name -> (launcher keyword arguments, knob settings around the launch)
    columns_spec = _selected({
        "shipped": (dict(), {}),
        "deterministic dQ": (dict(deterministic=True), {}),
        "not persistent": (dict(variant=BV(persistent=False)), {}),
        "dynamic schedule": (dict(variant=BV(dense_schedule="dynamic")), {}),
        "next item prefetched": (dict(variant=BV(item_prefetch="always")), {}),
        "no prefetch": (dict(variant=BV(item_prefetch="never")), {}),
        "generic pipeliner (dK/dV)": (dict(), {"tlx_own_waits": False}),
        "LLVM O3 (dK/dV)": (dict(), {"tlx_llvm_o0": False}),
    }, only, "shipped")
    table = {}
    for problem, b, kwargs in _suite_inputs(suite, tlx_backward.SUPPORTED_HEAD_DIMS, also_at_d64=True):
        if shapes and not any(w in problem.name for w in shapes.split(",") if w):
            continue
        args = (b.q, b.k, b.v)
        o, lse = run_tlx_forward(b, kwargs)
        do = torch.randn_like(o)
        grads = (*args, o, lse, do, b.cu_q, b.cu_k)

        def launch(extra, settings):
            with knobs.scope(**settings):
                return tlx_backward.jagged_backward_tlx(*grads, **extra, **kwargs)

        columns = {name: (lambda e=extra, s=settings: launch(e, s)) for name, (extra, settings) in columns_spec.items()}
        if times_portable(only):
            columns["portable"] = lambda: jagged_backward(*grads, **kwargs)
        ref = columns["shipped"]()
        row = _time_columns(columns, flops(problem, b.lengths_q, b.lengths_k, "bwd"), rep, rounds)
        for name, fn in columns.items():
            row[name]["grad_max_abs_diff"] = _max_abs_diff(fn(), ref)
        row["outside the fused kernel, ms"] = _fused_path_parts(b.q, o, do, lse, b.cu_q, kwargs, rep)
        table[problem.name] = row
        _say(f"{problem.name:40s} " + "  ".join(f"{n}: {r['tflops']} {r.get('tflops_range', '')}" for n, r in row.items()
                                                 if "tflops" in r))
    return table


def profile(suite: str = "gem", only: str = "", launches: int = 2) -> dict:
    """For a profiler (tools/gpu/profile.sh): the shipped forward and backward of each shape of ``suite``
    whose name contains ``only``, each launched ``launches`` times in a row, nothing timed (the first
    launch compiles: have the profiler skip it)."""
    from jfa.bench.runner import run_tlx_forward
    from jfa.kernels.tlx.hopper import backward as tlx_backward
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    shapes = {}
    for problem, b, kwargs in _suite_inputs(suite, tlx_forward.SUPPORTED_HEAD_DIMS):
        if only not in problem.name:
            continue
        for _ in range(launches):
            o, lse = run_tlx_forward(b, kwargs)
        do = torch.randn_like(o)
        for _ in range(launches):
            tlx_backward.jagged_backward_tlx(b.q, b.k, b.v, o, lse, do, b.cu_q, b.cu_k, **kwargs)
        torch.cuda.synchronize()
        shapes[problem.name] = launches
        _say(f"{problem.name}: {launches} forward and {launches} backward launches")
    return shapes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.bench.ablation", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("what", choices=("forward", "backward", "profile"))
    parser.add_argument("--suite", default="gem", help="suite name (jfa.bench.suites)")
    parser.add_argument("--only", default="", help="forward, backward: comma-separated substrings of the columns "
                        "to time (what ships always runs, the portable kernels' column when named or without --only); "
                        "profile: a substring of the shape names")
    parser.add_argument("--shapes", default="", help="backward: comma-separated substrings of the shapes to run")
    parser.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    parser.add_argument("--rounds", type=int, default=1, help="time the columns this many times in turn")
    parser.add_argument("--out", default="", help="write the table as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("jfa.bench.ablation: no CUDA GPU visible", file=sys.stderr)
        return 2
    from jfa.kernels.tlx.hopper import forward as tlx_forward

    ok, reason = tlx_forward.supports(torch.empty(1, 1, 64, device="cuda", dtype=torch.bfloat16), 64, torch.bfloat16)
    if not ok:
        print(f"jfa.bench.ablation: the TLX kernels cannot run here: {reason}", file=sys.stderr)
        return 2
    if args.what == "forward":
        table = forward(args.suite, args.only, args.rep, args.rounds)
    elif args.what == "backward":
        table = backward(args.suite, args.only, args.rep, args.rounds, args.shapes)
    else:
        table = profile(args.suite, args.only)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"suite": args.suite, args.what: table, "device": torch.cuda.get_device_name()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
