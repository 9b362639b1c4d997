"""Where the host time of one jfa call goes, on the machine that runs it (issue 21's "profile it there").

For each problem of a suite: one input copy, a warm-up call (compilation, caches), then ``--calls`` calls
under cProfile while a sleep kernel keeps the GPU busy (so nothing waits on the device and the profile is
the host's own work, as ``jfa.bench.runner.host_us`` measures it). Writes, per problem and pass, the
median wall time of a call and the functions with the most cumulative and own time per call.

    python -m jfa.bench.host_profile --suite gem --pass fwd,bwd --out DIR [--triton-launch]

``--compare-plans`` measures instead, per problem and pass, the host time with call plans (``jfa.plans``)
and without them, interleaved in one process (rounds of ``--calls`` calls, alternating; the minimum
round's mean per call of each, since this host's medians drift by up to 1.6x between runs).

``--compare-impls jfa-tlx,fa4-varlen,torch-varlen`` measures, the same way, the host time of each named
implementation (``jfa.bench.impls``) in one process; ``--compare-impls jfa-tlx`` alone is jfa's host time in a
process that holds nothing else (this host's times move by up to 2x with what the process has loaded).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from typing import Callable

import torch

from jfa.bench.impls import JfaImpl, get_impl
from jfa.bench.runner import launcher_inputs, output_grad
from jfa.bench.suites import get_suite

SLEEP_CYCLES = 2_000_000_000  # ~1 s of GPU time queued ahead of the profiled calls


def _profile(fn: Callable[[], object], calls: int, top: int) -> dict:
    """Median wall time of ``fn`` (us) unprofiled and under cProfile, and its cProfile rows per call, the
    GPU kept busy meanwhile."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    plain = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        plain.append(time.perf_counter() - start)
    walls = []
    prof = cProfile.Profile()
    for _ in range(calls):
        start = time.perf_counter()
        prof.enable()
        fn()
        prof.disable()
        walls.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, name), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        rows.append({"function": f"{os.path.relpath(path) if path.startswith('/') else path}:{line}({name})",
                     "calls": ncalls / calls, "own_us": tottime / calls * 1e6, "cum_us": cumtime / calls * 1e6})
    by_cum = sorted(rows, key=lambda r: -r["cum_us"])[:top]
    by_own = sorted(rows, key=lambda r: -r["own_us"])[:top]
    return {"wall_us": statistics.median(walls) * 1e6, "plain_us": statistics.median(plain) * 1e6,
            "by_cumulative": by_cum, "by_own": by_own}


def _plans_enabled(enabled: bool) -> None:
    """Turn call plans on or off for the calls that follow (off: no call has a key, so none is made or used)."""
    from jfa import api, plans

    api.call_key = plans.call_key if enabled else (lambda *args, **kwargs: None)


def _round_us(fn: Callable[[], object], calls: int) -> float:
    """Host us per call of one round of ``calls`` calls of ``fn``, issued while a sleep kernel queued ahead keeps
    the GPU busy; the GPU is idle again when it returns."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES // 4)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return us


def _compare_plans(fn: Callable[[], object], calls: int, rounds: int) -> dict:
    """Host us per call of ``fn`` with and without call plans: the minimum over ``rounds`` interleaved rounds
    of ``calls`` calls each, the GPU kept busy by a sleep kernel queued before each round."""
    best = {"planned_us": float("inf"), "unplanned_us": float("inf")}
    for _ in range(rounds):
        for name, enabled in (("planned_us", True), ("unplanned_us", False)):
            _plans_enabled(enabled)
            fn()  # (a plan made, or the unplanned path warm)
            best[name] = min(best[name], _round_us(fn, calls))
    _plans_enabled(True)
    return best


def _compare_impls(fns: dict, calls: int, rounds: int) -> dict:
    """Host us per call of each of ``fns`` (name -> callable): the minimum over ``rounds`` rounds of ``calls``
    calls each, the callables taking turns within a round, the GPU kept busy by a sleep kernel queued before
    each."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()  # compiled, caches filled
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], _round_us(fn, calls))
    return best


def _text(name: str, result: dict) -> str:
    out = io.StringIO()
    out.write(f"## {name}: {result['plain_us']:.0f} us per call unprofiled, {result['wall_us']:.0f} us under "
              "cProfile (medians)\n")
    for key in ("by_own", "by_cumulative"):
        out.write(f"### {key}\n")
        for r in result[key]:
            out.write(f"{r['own_us']:9.1f} {r['cum_us']:9.1f} {r['calls']:6.1f}  {r['function']}\n")
    return out.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="gem")
    parser.add_argument("--pass", dest="passes", default="fwd,bwd", help="fwd and/or bwd (fwd+bwd call)")
    parser.add_argument("--backend", default="tlx")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None, help="directory for host_profile.json and host_profile.txt")
    parser.add_argument("--triton-launch", action="store_true",
                        help="every launch through Triton's own binding (jfa.kernels.launch's direct launch off): "
                             "the comparison for what the direct launch saves")
    parser.add_argument("--compare-plans", action="store_true",
                        help="host time with and without call plans, interleaved (no cProfile)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="rounds of --calls calls each (--compare-plans, --compare-impls)")
    parser.add_argument("--compare-impls", default=None,
                        help="comma-separated implementations (jfa.bench.impls) whose host time to measure side by side")
    args = parser.parse_args(argv)
    if args.triton_launch:
        from jfa.kernels import launch

        launch._KernelLaunches.signature = lambda self, values, options, device: None
    impl = JfaImpl(args.backend)
    results = {}
    for problem in get_suite(args.suite):
        batch, _ = launcher_inputs(problem)
        grad = output_grad(problem, batch.q.shape[0], "cuda")
        if args.compare_impls:
            preps = {name: get_impl(name).prepare(batch, grad) for name in args.compare_impls.split(",")}
            for name in ("fwd", "fwd+bwd"):
                fns = {impl_name: getattr(p, "fwd" if name == "fwd" else "fwd_bwd") for impl_name, p in preps.items()}
                fns = {k: fn for k, fn in fns.items() if fn is not None}
                if name.split("+")[-1] in args.passes and fns:
                    result = results[f"{problem.name} {name}"] = _compare_impls(fns, args.calls, args.rounds)
                    print(f"{problem.name} {name}: " + ", ".join(f"{k} {v:.0f} us" for k, v in result.items()),
                          flush=True)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "compare_impls.json"), "w") as f:
                    json.dump(results, f, indent=1)
            del preps
            continue
        prepared = impl.prepare(batch, grad)
        if args.compare_plans:
            for name, fn in (("fwd", prepared.fwd), ("fwd+bwd", prepared.fwd_bwd)):
                if name.split("+")[-1] in args.passes and fn is not None:
                    result = results[f"{problem.name} {name}"] = _compare_plans(fn, args.calls, args.rounds)
                    print(f"{problem.name} {name}: planned {result['planned_us']:.0f} us, unplanned "
                          f"{result['unplanned_us']:.0f} us", flush=True)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "compare_plans.json"), "w") as f:
                    json.dump(results, f, indent=1)
            continue
        if "fwd" in args.passes:
            results[f"{problem.name} fwd"] = _profile(prepared.fwd, args.calls, args.top)
        if "bwd" in args.passes and prepared.fwd_bwd is not None:
            results[f"{problem.name} fwd+bwd"] = _profile(prepared.fwd_bwd, args.calls, args.top)
        for name in [n for n in results if n.startswith(problem.name)]:
            print(f"{name}: {results[name]['plain_us']:.0f} us ({results[name]['wall_us']:.0f} profiled)", flush=True)
        if args.out:  # written after every problem: a call cut by a time limit keeps what it measured
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "host_profile.json"), "w") as f:
                json.dump(results, f, indent=1)
            with open(os.path.join(args.out, "host_profile.txt"), "w") as f:
                f.write("\n".join(_text(n, r) for n, r in results.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
