"""``jfa sim CASE.json``: replay one case on the TLX simulator, the tool for debugging a TLX kernel without a GPU.

The case (a ``jfa fuzz`` failure file, or one of ``tests/corpus/``) runs through the public op with
``backend="tlx"`` on CPU tensors, forward and backward, under the deterministic schedule or ``--seed N``,
judged by the oracle rule. A protocol error (deadlock, race, bounds, ...) prints the simulator's report
with the kernel's source lines, every task's and barrier's state, and with ``--trace`` the last events
before it (which task did what to which barrier or slot). ``--mutant NAME`` plants one of the TLX mutants
of ``jfa.fuzz.mutants`` first (to see what a bug of that kind looks like).

Exit codes: 0 the case passes; 1 it fails the rule or the simulator reports an error; 2 usage.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jfa sim", description="Replay one case file on the TLX simulator (CPU): "
                                     "the TLX kernels, judged by the oracle rule, with deadlock, race and bounds "
                                     "reports.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("case_file", help="a case file: DIR/failures/case-*.json or tests/corpus/*.json")
    parser.add_argument("--seed", type=int, default=None, help="a seeded schedule (default: the deterministic one)")
    parser.add_argument("--trace", type=int, nargs="?", const=60, default=0, metavar="EVENTS",
                        help="record events and print the last EVENTS before a failure")
    parser.add_argument("--sm-count", type=int, default=3, help="CTAs a persistent grid launches")
    parser.add_argument("--forward-only", action="store_true", help="run the forward alone")
    parser.add_argument("--deterministic", action="store_true", help="the backward's deterministic dQ (no fused dQ)")
    parser.add_argument("--mutant", default=None, help="plant this TLX mutant of jfa.fuzz.mutants first")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        print("jfa sim: triton was imported before the interpreter could be enabled", file=sys.stderr)
        return 2
    os.environ["TRITON_INTERPRET"] = "1"  # the simulator runs on Triton's interpreter, chosen at triton's import
    from jfa import knobs
    from jfa.fuzz.mutants import BY_NAME, TLX_MODULES, applied
    from jfa.fuzz.rule import cannot_run, run_case
    from jfa.fuzz.runner import load_case

    import jfa.sim as sim

    if args.sm_count < 1:
        print("jfa sim: --sm-count must be at least 1", file=sys.stderr)
        return 2
    try:
        case, _record = load_case(args.case_file)
    except FileNotFoundError:
        print(f"jfa sim: no such case file: {args.case_file}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"jfa sim: {args.case_file}: not a case file jfa can read ({exc})", file=sys.stderr)
        return 2
    mutant = BY_NAME.get(args.mutant) if args.mutant else None
    if args.mutant and (mutant is None or mutant.module not in TLX_MODULES):
        names = sorted(m.name for m in BY_NAME.values() if m.module in TLX_MODULES)
        print(f"jfa sim: --mutant: not a TLX mutant: {args.mutant!r} (one of {', '.join(names)})", file=sys.stderr)
        return 2
    schedule = sim.Schedule.seeded(args.seed) if args.seed is not None else sim.Schedule.deterministic()
    with sim.simulated(sm_count=args.sm_count, schedule=schedule, trace=args.trace or False) as session:
        if reason := cannot_run(case, "tlx", "cpu"):
            print(f"jfa sim: the TLX kernels cannot run {case.id}: {reason}", file=sys.stderr)
            return 2
        print(f"jfa sim: {case.id} on the simulator ({schedule.describe()}, {args.sm_count} CTAs"
              f"{', mutant ' + mutant.name if mutant else ''})", flush=True)
        start = time.perf_counter()
        planted = applied(mutant) if mutant else contextlib.nullcontext()
        try:
            with planted, knobs.scope(tlx_fused_dq=not args.deterministic):
                report = run_case(case, backend="tlx", device="cpu", backward=not args.forward_only)
        except sim.SimError as exc:
            print(exc.report())
            print(f"FAIL: {type(exc).__name__} after {time.perf_counter() - start:.1f} s "
                  f"({len(session.reports)} launch(es) completed before it)")
            return 1
    print(report)
    for r in session.reports:
        print(f"  {r.kernel}: grid {r.grid}, {r.ctas} CTAs, {r.task_switches} task switches, {r.copies} copies, "
              f"{r.seconds:.2f} s")
    print(("PASS" if report.ok else "FAIL") + f" in {time.perf_counter() - start:.1f} s")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
