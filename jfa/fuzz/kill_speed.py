"""Bug-finding speed as a number: how long the fuzzer's own profile takes to find each planted bug.

For every mutant of :mod:`jfa.fuzz.mutants` (or a chosen few) this runs ``jfa fuzz --mutant NAME
--until-found`` with the campaign's usual settings (mix, oracle, backend "auto") under a time limit,
``--parallel`` campaigns at once sharing the machine (so each gets a fraction of it: the times are
upper bounds of what the whole machine would take), and reports per mutant: found or not, the seconds
from the campaign's start (worker start-up and compiles included) to the first failing example, how
it showed (a rule violation, a crash, a dead CUDA context, a hang) and the case. Writes
``kill-speed.json`` and ``kill-speed.md`` to ``--out``; exit 0 when every mutant was found within the
limit, 1 otherwise.

    python -m jfa.fuzz.kill_speed --minutes 2 --parallel 8 --workers 2 --out kill-speed
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from jfa.fuzz.cores import share_cores


def _campaign(name: str, args, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jfa.cli", "fuzz", "--mutant", name, "--until-found", "--minutes", str(args.minutes),
           "--workers", str(args.workers), "--device", args.device, "--seed", str(args.seed),
           "--hang-seconds", str(args.hang_seconds), "--out", str(out / name)]
    if args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    env = dict(os.environ)
    share_cores(env, args.parallel * args.workers)  # every campaign's workers share the one machine
    with open(out / f"{name}.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _result(name: str, out: Path, wall: float, code: int) -> dict:
    path = out / name / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    found_after = summary.get("seconds_to_first_failure")
    failures = sorted((out / name / "failures").glob("*.json")) if (out / name / "failures").exists() else []
    first = json.loads(failures[0].read_text()) if failures else {}
    return {"mutant": name, "found": found_after is not None, "seconds_to_find": found_after,
            "examples": summary.get("examples", 0), "how": first.get("kind", ""),
            "case": _describe(first["case"]) if first.get("case") else "", "wall_seconds": round(wall, 1),
            "exit_code": code}


def _describe(fields: dict) -> str:
    from jfa.fuzz.runner import case_from_fields

    return case_from_fields(fields).id


def _write(results: list, names: list, args, out: Path, quiet: bool = False) -> list:
    """Write kill-speed.json and kill-speed.md for the results so far; returns those found in time."""
    results = sorted(results, key=lambda r: names.index(r["mutant"]))
    limit = args.minutes * 60
    within = [r for r in results if r["found"] and r["seconds_to_find"] <= limit]
    (out / "kill-speed.json").write_text(json.dumps({"settings": vars(args), "results": results}, indent=2) + "\n")
    lines = [f"# Time to find each mutant: {len(within)} of {len(results)} within {args.minutes:g} min"
             + ("" if len(results) == len(names) else f" ({len(names) - len(results)} not run yet)"), "",
             f"{args.parallel} campaigns at once, {args.workers} worker(s) each, device {args.device}, seed {args.seed}, "
             f"hang after {args.hang_seconds:g} s; seconds from the campaign's start (start-up and compiles included)",
             "", "| mutant | found after (s) | how | examples | case |", "|---|---|---|---|---|"]
    lines += [f"| {r['mutant']} | {'%.1f' % r['seconds_to_find'] if r['found'] else 'not found'} | {r['how']} | "
              f"{r['examples']} | {r['case']} |" for r in results]
    (out / "kill-speed.md").write_text("\n".join(lines) + "\n")
    if not quiet:
        print("\n".join(lines))
    return within


def main(argv=None) -> int:
    from jfa.fuzz.mutants import MUTANTS

    parser = argparse.ArgumentParser(prog="python -m jfa.fuzz.kill_speed", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0, help="time limit per mutant (the target)")
    parser.add_argument("--parallel", type=int, default=8, help="campaigns at once")
    parser.add_argument("--workers", type=int, default=2, help="fuzz workers per campaign")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--mutants", default="", help="comma-separated names (default: every mutant)")
    parser.add_argument("--seed", type=int, default=1, help="the campaigns' seed")
    parser.add_argument("--hang-seconds", type=float, default=45.0, help="passed to jfa fuzz: a hang counts as found")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--out", default="kill-speed")
    args = parser.parse_args(argv)
    names = [m.name for m in MUTANTS]
    if args.mutants:
        wanted = args.mutants.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"--mutants: unknown {', '.join(unknown)}")
        names = wanted
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pending, running, results = list(names), {}, []
    while pending or running:
        while pending and len(running) < args.parallel:
            name = pending.pop(0)
            running[name] = (_campaign(name, args, out), time.time())
        time.sleep(1.0)
        for name, (proc, started) in list(running.items()):
            if proc.poll() is not None:
                results.append(_result(name, out, time.time() - started, proc.returncode))
                del running[name]
                r = results[-1]
                print(f"{name}: {'found after %.1f s (%s)' % (r['seconds_to_find'], r['how']) if r['found'] else 'NOT FOUND'}"
                      f", {r['examples']} examples", flush=True)
                _write(results, names, args, out, quiet=True)  # partial results survive a killed run
    within = _write(results, names, args, out)
    return 0 if len(within) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
