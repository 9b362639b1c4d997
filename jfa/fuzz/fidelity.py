"""Fidelity of the TLX simulator: the same cases on the GPU and on the simulator, judged by the same rule,
and how far apart their outputs are.

    python -m jfa.fuzz.fidelity record --out DIR      # on a Hopper GPU: the TLX kernels on CUDA
    python -m jfa.fuzz.fidelity compare DIR           # on any CPU: the same cases on jfa.sim, against DIR

``record`` runs the simulator-scale TLX catalogue (``jfa.fuzz.catalog.tlx_cases("sim")``, or ``--only``
name substrings) forward and backward through the public op with ``backend="tlx"`` and saves, per case,
the verdicts and the outputs (out, lse, dq, dk, dv). ``compare`` runs each case on the simulator (its own
process pool; the interpreter is switched on for it) and reports per case whether both meet the oracle
rule, and per tensor the largest difference between the two outputs, absolute and as a share of what the
rule allows for that tensor (``Verdict.allowed``): a share well under 1 means the simulator computes what
the GPU computes up to rounding order. Exit codes: 0 all cases meet the rule on both sides, 1 otherwise,
2 usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TENSORS = ("out", "lse", "dq", "dk", "dv")


def _cases(only: str):
    from jfa.fuzz.catalog import tlx_cases

    wanted = [w for w in only.split(",") if w]
    return [c for c in tlx_cases("sim") if not wanted or any(w in c.id for w in wanted)]


def _file(directory: Path, case) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in case.id)
    return directory / f"{safe}.pt"


def _verdicts(report) -> dict:
    return {v.name: {"error": v.error, "allowed": v.allowed, "ok": v.ok} for v in report.verdicts}


def record(directory: Path, only: str = "", fused_dq: bool = True, device: str = "cuda") -> int:
    """Run every case on the TLX kernels on ``device`` (CPU tensors: inside ``jfa.sim.simulated``) and save
    verdicts and outputs; returns the number of cases failing the rule."""
    import torch

    from jfa import knobs
    from jfa.fuzz.rule import run_case

    directory.mkdir(parents=True, exist_ok=True)
    failures = 0
    with knobs.scope(tlx_fused_dq=fused_dq):
        for case in _cases(only):
            report, outputs = run_case(case, backend="tlx", device=device, return_outputs=True)
            failures += not report.ok
            torch.save({"case": case.id, "ok": report.ok, "kernels": [report.kernel, report.backward_kernel],
                        "verdicts": _verdicts(report),
                        "outputs": {n: (t.detach().cpu() if t is not None else None)
                                    for n, t in zip(TENSORS, outputs)}}, _file(directory, case))
    return failures


def _compare_one(args) -> dict:
    import torch

    import jfa.sim as sim
    from jfa import knobs
    from jfa.fuzz.rule import run_case

    directory, case, fused_dq = args
    gpu = torch.load(_file(Path(directory), case), weights_only=False)
    with sim.simulated(arch=(9, 0), sm_count=3), knobs.scope(tlx_fused_dq=fused_dq):
        report, outputs = run_case(case, backend="tlx", device="cpu", return_outputs=True)
    sim_verdicts = _verdicts(report)
    row = {"case": case.id, "gpu_ok": gpu["ok"], "sim_ok": report.ok,
           "kernels": {"gpu": gpu["kernels"], "sim": [report.kernel, report.backward_kernel]}, "tensors": {}}
    for name, simulated in zip(TENSORS, outputs):
        on_gpu = gpu["outputs"][name]
        if on_gpu is None or simulated is None:
            continue
        a, b = on_gpu.double(), simulated.detach().double()
        both_finite = torch.isfinite(a) & torch.isfinite(b)
        same_nonfinite = bool(((~torch.isfinite(a)) == (~torch.isfinite(b))).all()
                              and (a[~both_finite] == b[~both_finite]).all())
        diff = float((a[both_finite] - b[both_finite]).abs().max()) if both_finite.any() else 0.0
        allowed = sim_verdicts.get(name, {}).get("allowed", 0.0)
        row["tensors"][name] = {"max_diff": diff, "share_of_allowed": diff / allowed if allowed else None,
                                "bitwise": bool(same_nonfinite and torch.equal(a[both_finite], b[both_finite])),
                                "nonfinite_agree": same_nonfinite}
    return row


def compare(directory: Path, only: str = "", fused_dq: bool = True, workers: int = 2, progress: bool = False) -> list:
    """Every recorded case on the simulator against its GPU record (``_compare_one`` rows)."""
    cases = [c for c in _cases(only) if _file(directory, c).exists()]
    os.environ["TRITON_INTERPRET"] = "1"  # the workers import triton under the interpreter
    threads = max(1, (os.cpu_count() or 2) // max(workers, 1))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))
    import multiprocessing

    rows = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for row in pool.map(_compare_one, [(str(directory), c, fused_dq) for c in cases]):
            rows.append(row)
            if progress:
                worst = max((t["share_of_allowed"] or 0.0) for t in row["tensors"].values()) if row["tensors"] else 0.0
                print(f"[{len(rows)}/{len(cases)}] {row['case']}: gpu {'ok' if row['gpu_ok'] else 'FAIL'}, "
                      f"sim {'ok' if row['sim_ok'] else 'FAIL'}, largest difference {worst:.3f} of the allowance",
                      file=sys.stderr, flush=True)
    return rows


def summary(rows: list) -> str:
    """Markdown: cases, both sides meeting the rule, and per tensor the largest difference."""
    lines = [f"- cases: {len(rows)}; meet the rule on the GPU: {sum(r['gpu_ok'] for r in rows)}, on the "
             f"simulator: {sum(r['sim_ok'] for r in rows)}; non-finite values agree everywhere: "
             f"{all(t['nonfinite_agree'] for r in rows for t in r['tensors'].values())}", "",
             "| tensor | bitwise equal (cases) | largest difference | its share of the rule's allowance | case |",
             "|---|---|---|---|---|"]
    for name in TENSORS:
        have = [(r["case"], r["tensors"][name]) for r in rows if name in r["tensors"]]
        if not have:
            continue
        case, worst = max(have, key=lambda x: x[1]["max_diff"])
        share = max((t["share_of_allowed"] or 0.0) for _, t in have)
        lines.append(f"| {name} | {sum(t['bitwise'] for _, t in have)}/{len(have)} | {worst['max_diff']:.3e} | "
                     f"{share:.3f} (largest) | {case} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.fuzz.fidelity", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="on a GPU: the TLX kernels on the cases, outputs saved")
    rec.add_argument("--out", required=True, help="directory for the records")
    cmp_ = sub.add_parser("compare", help="on a CPU: the same cases on the simulator, against the records")
    cmp_.add_argument("directory", help="the records of `record`")
    cmp_.add_argument("--workers", type=int, default=2, help="simulator processes")
    cmp_.add_argument("--json", default="", help="write every case's row to this file")
    for p in (rec, cmp_):
        p.add_argument("--only", default="", help="comma-separated substrings of case ids")
        p.add_argument("--deterministic", action="store_true", help="the deterministic backward (no fused dQ)")
    args = parser.parse_args(argv)
    fused = not args.deterministic
    if args.command == "record":
        failures = record(Path(args.out), args.only, fused)
        print(f"fidelity record: {len(_cases(args.only))} cases, {failures} failing the rule on the GPU")
        return 1 if failures else 0
    directory = Path(args.directory)
    if not directory.is_dir():
        parser.error(f"directory: {directory} is not a directory")
    rows = compare(directory, args.only, fused, args.workers, progress=True)
    if not rows:
        print(f"fidelity compare: no record in {directory} matches", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    print(summary(rows))
    return 0 if all(r["gpu_ok"] and r["sim_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
