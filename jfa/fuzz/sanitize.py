"""The TLX kernels under compute-sanitizer: the catalogue's small adversarial shapes, judged by the rule.

    compute-sanitizer --tool memcheck --error-exitcode 9 python -m jfa.fuzz.sanitize [--backward]
    compute-sanitizer --tool racecheck --error-exitcode 9 python -m jfa.fuzz.sanitize --backward

Each case runs through the public op with ``backend="tlx"`` (with ``--backward`` also its gradients,
which autograd runs on the TLX backward), and must meet the oracle rule; the sanitizer judges the memory
accesses. Exit 0: every case ran on the TLX kernels and passed; 1: a case failed; 2: nothing could run.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.fuzz.sanitize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backward", action="store_true", help="the gradients too (the TLX backward)")
    args = parser.parse_args(argv)
    import torch

    from jfa.fuzz.catalog import sanitize_cases
    from jfa.fuzz.rule import cannot_run, run_case

    if not torch.cuda.is_available():
        print("jfa.fuzz.sanitize: no CUDA GPU visible", file=sys.stderr)
        return 2
    failed = 0
    for case in sanitize_cases():
        if reason := cannot_run(case, "tlx", "cuda"):
            print(f"jfa.fuzz.sanitize: the TLX kernels cannot run {case.id}: {reason}", file=sys.stderr)
            return 2
        report = run_case(case, backend="tlx", device="cuda", backward=args.backward)
        torch.cuda.synchronize()
        tlx = "tlx-hopper-block-sparse" if case.sparse else "tlx-hopper"
        ran_tlx = report.kernel == tlx and (not args.backward or report.backward_kernel == tlx)
        ok = report.ok and ran_tlx
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case.id}: {report.worst} ({report.kernel}/{report.backward_kernel or '-'})",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
