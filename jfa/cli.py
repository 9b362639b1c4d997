"""The jfa command line: gate (the pre-merge correctness gate), fuzz (time-budgeted fuzzing), repro
(replay a case file), sim (replay a case on the TLX simulator), compile-check (the offline sm_90a / sm_100a build
gate), bench, info.

Exit codes, every command: 0 when the work ran and passed, 1 when a check failed, 2 for a usage error
or when nothing ran (one line on stderr)."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def _repo_tests() -> Path:
    tests = Path(__file__).resolve().parent.parent / "tests"
    if not (tests / "test_kernels.py").exists():
        raise SystemExit("jfa gate: tests/ not found next to the jfa package; run it from a jfa checkout "
                         "(pip install -e '.[test]')")
    return tests


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _run_suite(device: str, out_dir: Path, workers: str) -> tuple[int, Path, float]:
    """Run the pytest suite on ``device`` in a fresh process (the interpreter switch is process-wide)."""
    junit = out_dir / f"junit-{device}.xml"
    cmd = [sys.executable, "-m", "pytest", str(_repo_tests()), "--device", device, "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if workers != "0":
        cmd += ["-n", workers]
    if device == "cpu":
        cmd += ["--sim-scope", "full"]  # the gate runs the whole TLX catalogue on the simulator, every schedule
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    print(f"$ {' '.join(cmd)}", flush=True)
    start = time.time()
    rc = subprocess.call(cmd, env=env, cwd=_repo_tests().parent)
    return rc, junit, time.time() - start


PYTEST_NO_TESTS = 5  # pytest's exit code when it collected nothing


_KILL_TEST = re.compile(r"(test_(?:catalog|fuzzer|simulator|mx_fuzzer)_kills)(?:_\w+)?\[(.+)\]")


def _mutation_rows(device: str, junit: Path) -> list:
    """Per mutant: whether the catalogue and the ci fuzzer killed it, with examples and seconds to kill."""
    kills: dict[str, dict] = {}
    for tc in ET.parse(junit).getroot().iter("testcase"):
        # test_<how>_kills[mutant], or a family of them (test_simulator_kills_blackwell_mutants[mutant])
        match = _KILL_TEST.fullmatch(tc.get("name", ""))
        if match is None:
            continue
        kind, mutant = match.groups()
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        failed = tc.find("failure") is not None or tc.find("error") is not None
        skipped = tc.find("skipped") is not None
        cell = "skipped" if skipped else ("SURVIVED" if failed else
                                          f"{props.get('examples_to_kill', '?')} ex / {props.get('seconds_to_kill', '?')} s")
        column = "test_fuzzer_kills" if kind == "test_mx_fuzzer_kills" else kind  # the MX fuzzer is a fuzzer
        kills.setdefault(mutant, {})[column] = cell
    return [[device, m, k.get("test_catalog_kills", "-"), k.get("test_fuzzer_kills", "-"), k.get("test_simulator_kills", "-")]
            for m, k in sorted(kills.items())]


def _summarise(device: str, junit: Path, seconds: float) -> tuple[list, dict]:
    """Per test file: passed/failed/skipped; per tensor: the worst error/allowed over the kernel cases."""
    rows: dict[str, list] = {}
    worst: dict[str, tuple] = {}
    if not junit.exists():
        return [[device, "(no results)", 0, 1, 0, f"{seconds:.0f}"]], worst
    for tc in ET.parse(junit).getroot().iter("testcase"):
        group = tc.get("classname", "?").split(".")[-1]
        row = rows.setdefault(group, [0, 0, 0, 0.0])
        if tc.find("failure") is not None or tc.find("error") is not None:
            row[1] += 1
        elif tc.find("skipped") is not None:
            row[2] += 1
        else:
            row[0] += 1
        row[3] += float(tc.get("time", 0))
        for prop in tc.iter("property"):
            if prop.get("name") != "verdicts":
                continue
            for tensor, (err, allowed) in json.loads(prop.get("value")).items():
                ratio = 0.0 if err == 0 else (err / allowed if allowed else math.inf)
                if tensor not in worst or ratio > worst[tensor][0]:
                    worst[tensor] = (ratio, err, allowed, tc.get("name"))
    table = [[device, g, p, f, s, f"{t:.0f}"] for g, (p, f, s, t) in sorted(rows.items())]
    return table, worst


def _print_table(headers: list, rows: list) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    text = "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
    print(text)
    return text


def cmd_gate(args) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    devices = ["cpu"] + (["cuda"] if args.device in ("auto", "cuda") and _cuda_visible() else [])
    if args.device == "cuda" and "cuda" not in devices:
        print("jfa gate: --device cuda asked for, but no CUDA GPU is visible", file=sys.stderr)
        return 2
    if args.device == "cuda":
        devices = ["cuda"]
    if args.device == "cpu":
        devices = ["cpu"]
    results, all_rows, worst_rows, mutant_rows, failed = [], [], [], [], False
    for device in devices:
        rc, junit, seconds = _run_suite(device, out_dir, args.workers)
        rows, worst = _summarise(device, junit, seconds)
        failed |= rc != 0
        results.append({"device": device, "exit_code": rc, "seconds": round(seconds, 1)})
        all_rows += rows
        if junit.exists():
            mutant_rows += _mutation_rows(device, junit)
        for tensor, (ratio, err, allowed, case) in sorted(worst.items()):
            worst_rows.append([device, tensor, f"{err:.2e}", f"{allowed:.2e}", f"{ratio:.2f}", case])
    print("\njfa gate summary")
    text = _print_table(["device", "suite", "passed", "failed", "skipped", "seconds"], all_rows)
    print("\nworst error per tensor over the kernel cases (ratio = error / allowed; > 1 fails)")
    text2 = _print_table(["device", "tensor", "error", "allowed", "ratio", "case"], worst_rows)
    text3 = ""
    if mutant_rows:
        killed = sum(1 for r in mutant_rows if "SURVIVED" not in r[2:] and "skipped" not in r[2:])
        print(f"\nmutation check: {killed}/{len(mutant_rows)} mutants killed (portable: by the catalogue and the ci "
              "fuzzer; TLX: by the TLX catalogue on the simulator)")
        text3 = _print_table(["device", "mutant", "catalogue kill", "ci fuzzer kill", "simulator kill"], mutant_rows)
    nothing_ran = all(r["exit_code"] == PYTEST_NO_TESTS for r in results)
    verdict = "NOTHING RAN" if nothing_ran else ("FAILED" if failed else "PASSED")
    print(f"\ngate {verdict}")
    (out_dir / "summary.md").write_text(f"# jfa gate: {verdict}\n\n```\n{text}\n\n{text2}\n\n{text3}\n```\n")
    (out_dir / "summary.json").write_text(json.dumps(results, indent=2))
    if nothing_ran:
        print("jfa gate: pytest collected no test", file=sys.stderr)
        return 2
    return 1 if failed else 0


def cmd_info(args) -> int:
    import torch
    import triton

    import jfa
    from jfa.kernels.triton import interpreter_active

    print(f"jfa {jfa.__version__}; torch {torch.__version__}; triton {triton.__version__}")
    print(f"triton interpreter active: {interpreter_active()}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"cuda:{i} {p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs")
    else:
        print("no CUDA GPU visible: backend='auto' runs the interpreter (TRITON_INTERPRET=1) or the torch reference")
    return 0


def cmd_bench(args, rest) -> int:
    from jfa.bench.runner import main as bench_main

    return bench_main(rest)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="jfa", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gate = sub.add_parser("gate", help="pre-merge correctness gate: the suite on the interpreter, and the GPU if visible",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gate.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                      help="auto: the CPU suite, then the GPU suite when a GPU is visible")
    gate.add_argument("--out", default="gate-out", help="directory for JUnit XML and summaries")
    gate.add_argument("--workers", default="auto", help="pytest-xdist workers ('0' = in process)")
    sub.add_parser("info", help="versions, devices, interpreter state")
    sub.add_parser("bench", help="benchmarks (see jfa bench --help)", add_help=False)
    sub.add_parser("fuzz", help="fuzz the kernels against the oracle (see jfa fuzz --help)", add_help=False)
    sub.add_parser("repro", help="replay a case file (see jfa repro --help)", add_help=False)
    sub.add_parser("compile-check", help="offline sm_90a / sm_100a compile gate of the shipped kernels",
                   add_help=False)
    sub.add_parser("sim", help="replay a case file on the TLX simulator (see jfa sim --help)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command in ("gate", "info") and rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.command == "gate" and args.workers not in ("auto",) and not args.workers.isdigit():
        parser.error(f"--workers: expected 'auto' or a number, got {args.workers!r}")
    if args.command == "gate":
        return cmd_gate(args)
    if args.command == "info":
        return cmd_info(args)
    if args.command == "bench":
        return cmd_bench(args, rest)
    if args.command == "fuzz":
        from jfa.fuzz.runner import cmd_fuzz

        return cmd_fuzz(rest)
    if args.command == "compile-check":
        from jfa.fuzz.compile_gate import main as compile_main

        return compile_main(rest)
    if args.command == "sim":
        if "triton" not in sys.modules:  # the simulator runs on Triton's interpreter, chosen at triton's import
            os.environ["TRITON_INTERPRET"] = "1"
        from jfa.sim.cli import main as sim_main

        return sim_main(rest)
    if args.command == "repro":
        from jfa.fuzz.runner import cmd_repro

        return cmd_repro(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
