"""``jfa fuzz`` and ``jfa repro``: time-budgeted property fuzzing against the oracle, and replay.

``jfa fuzz`` starts one worker process per GPU (pinned with ``CUDA_VISIBLE_DEVICES``), or on a
CPU-only host interpreter workers, each running the hypothesis property of ``tests/test_fuzz.py``
(``jfa.fuzz.strategies.problems`` judged by ``jfa.fuzz.rule.run_case``) in fresh randomly seeded rounds
until the deadline. Every example is a JSON line in ``DIR/worker-N.jsonl``; every failure is shrunk
by hypothesis and written as a self-contained case file ``DIR/failures/*.json`` that
``jfa repro CASE.json`` replays in one command (copy it into ``tests/corpus/`` to keep it forever).
The parent shows live progress (examples, rate, worst error/allowed, failures) and writes
``summary.json``, ``summary.md`` and ``junit.xml`` to DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape

CASE_FORMAT = 1


# ----------------------------------------------------------------------------------------------------
# case files
# ----------------------------------------------------------------------------------------------------
def case_record(case, report=None, *, backend="auto", device="cpu", note="") -> dict:
    """A self-contained, JSON-able description of one problem and (optionally) its verdicts."""
    record = {"format": CASE_FORMAT, "case": dataclasses.asdict(case), "backend": backend, "device": device,
              "note": note, "date": datetime.date.today().isoformat()}
    if report is not None:
        record["verdicts"] = [{"tensor": v.name, "error": v.error, "allowed": v.allowed, "problem": v.problem}
                              for v in report.verdicts]
        record["ok"] = report.ok
        record["kernel"] = report.kernel
        record["backward_kernel"] = report.backward_kernel
    return record


def load_case(path):
    """The :class:`jfa.fuzz.cases.Case` stored in a case file, and the whole record. Raises
    FileNotFoundError, json.JSONDecodeError, or ValueError/KeyError/TypeError for what is no case file."""
    from jfa.fuzz.cases import Case

    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or record.get("format") != CASE_FORMAT:
        raise ValueError(f"{path}: unknown case format {record.get('format') if isinstance(record, dict) else record!r}")
    fields = dict(record["case"])
    for key in ("lengths_q", "lengths_k", "window"):
        if key in fields:
            fields[key] = tuple(fields[key])
    return Case(**fields), record


def case_filename(case) -> str:
    digest = hashlib.sha1(json.dumps(dataclasses.asdict(case), sort_keys=True).encode()).hexdigest()[:10]
    return f"case-{digest}.json"


class UsageError(Exception):
    """A command line that cannot run (exit 2, one line on stderr): a usage error, or nothing to run."""


def _positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (nothing would run), got {text}")
    return value


def _device(requested: str) -> str:
    """``requested`` ("auto", "cpu", "cuda") as the device this machine runs; UsageError for a missing GPU."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False)")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)


BACKENDS = ("auto", "tlx", "triton", "torch")


def cmd_repro(argv=None) -> int:
    """Replay one case file. Exit 0: it passes; 1: it fails the rule; 2: the file or the command line is
    wrong (one line on stderr)."""
    parser = _parser("jfa repro", "Replay one case file (written by jfa fuzz, or in tests/corpus/) against the oracle.")
    parser.add_argument("case_file", help="a case file: DIR/failures/case-*.json or tests/corpus/*.json")
    parser.add_argument("--backend", default=None, choices=BACKENDS, help="default: the backend the file records")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto: cuda if visible, else cpu")
    args = parser.parse_args(argv)
    try:
        device = _device(args.device)
        try:
            case, record = load_case(args.case_file)
        except FileNotFoundError:
            raise UsageError(f"no such case file: {args.case_file}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{args.case_file}: not a JSON case file ({exc})") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{args.case_file}: not a case file jfa can read ({exc})") from None
        backend = args.backend or record.get("backend", "auto")
        if backend not in BACKENDS:
            raise UsageError(f"{args.case_file}: records backend {backend!r}, expected one of {BACKENDS}")
    except UsageError as exc:
        print(f"jfa repro: {exc}", file=sys.stderr)
        return 2
    _prepare_process(device)
    from jfa.fuzz.rule import run_case

    print(f"replaying {args.case_file} on {backend}/{device}: {case.id}")
    if record.get("verdicts"):
        worst = max(record["verdicts"], key=lambda v: v["error"] / v["allowed"] if v["allowed"] else float("inf"))
        print(f"recorded: worst {worst['tensor']} error {worst['error']:.3e} allowed {worst['allowed']:.3e}")
    report = run_case(case, backend=backend, device=device)
    print(report)
    print("PASS" if report.ok else "FAIL")
    return 0 if report.ok else 1


# ----------------------------------------------------------------------------------------------------
# one worker
# ----------------------------------------------------------------------------------------------------
def _prepare_process(device: str) -> None:
    """The interpreter switch is process-wide and must precede triton's import."""
    if device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("jfa fuzz: triton was imported before the interpreter could be enabled")
        os.environ["TRITON_INTERPRET"] = "1"


def run_worker(index: int, out_dir: Path, deadline: float, backend: str, device: str, max_tokens: int,
               round_examples: int, seed: int) -> None:
    import warnings

    from hypothesis import HealthCheck, Phase, given, reject, settings, target
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from jfa.fuzz.rule import cannot_run, run_case
    from jfa.fuzz.strategies import TLX_ONLY, problems

    draw_kwargs = TLX_ONLY if backend == "tlx" else {}
    if backend == "tlx" and device == "cpu":  # the TLX kernels on the simulator, a seeded schedule a worker
        import jfa.sim as sim

        sim.install(sm_count=3, schedule=sim.Schedule.seeded(seed * 1009 + index))

    # inf/NaN in lanes the kernels mask out (e.g. exp2 of padded columns) are expected in the interpreter
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    log = open(out_dir / f"worker-{index}.jsonl", "a", buffering=1)
    failures = out_dir / "failures"
    failures.mkdir(exist_ok=True)
    rng = random.Random(seed * 1009 + index)
    state = {"last_failure": None}

    def property_(data):
        if time.time() > deadline and state["last_failure"] is None:
            reject()  # out of time: end the round, unless a failure is being shrunk (let that finish)
        case = data.draw(problems(max_tokens=max_tokens, **draw_kwargs), label="case")
        if backend == "tlx" and cannot_run(case, backend, device):
            reject()  # outside what the TLX kernel takes (dtype, head dim, strides): "auto" covers those
        start = time.time()
        try:
            report = run_case(case, backend=backend, device=device)
        except Exception as exc:  # a crash is a finding too
            state["last_failure"] = (case, None, f"{type(exc).__name__}: {exc}")
            raise
        worst = report.worst
        log.write(json.dumps({"t": round(time.time(), 3), "case": case.id, "ok": report.ok, "ratio": worst.ratio
                              if worst.ratio != float("inf") else 1e9, "tensor": worst.name,
                              "kernel": report.kernel, "per_kernel": {k: min(r, 1e9) for k, r in
                                                                      report.worst_per_kernel().items()},
                              "seconds": round(time.time() - start, 3)}) + "\n")
        target(min(worst.ratio, 1e6), label="worst error / allowed")
        if not report.ok:
            state["last_failure"] = (case, report, "")
        assert report.ok, str(report)

    while time.time() < deadline:
        round_seed = rng.randrange(2 ** 32)
        test = settings(max_examples=round_examples, deadline=None, database=None, derandomize=False,
                        phases=[Phase.generate, Phase.target, Phase.shrink], print_blob=False,
                        suppress_health_check=list(HealthCheck))(given(data=st.data())(property_))
        test = hypothesis_seed(round_seed)(test)
        state["last_failure"] = None
        try:
            test()
        except Exception as exc:  # hypothesis re-raises the shrunk failure after shrinking
            if state["last_failure"] is None:
                if time.time() > deadline:
                    break  # the round was cut at the deadline (rejected replays read as flaky data): not a finding
                log.write(json.dumps({"t": time.time(), "error": f"{type(exc).__name__}: {exc}"[:500]}) + "\n")
                continue
            case, report, crash = state["last_failure"]
            record = case_record(case, report, backend=backend, device=device,
                                 note=crash or f"found by jfa fuzz, worker {index}, round seed {round_seed}")
            path = failures / case_filename(case)
            path.write_text(json.dumps(record, indent=2) + "\n")
            log.write(json.dumps({"t": time.time(), "failure": str(path), "case": case.id}) + "\n")
    log.close()


# ----------------------------------------------------------------------------------------------------
# the parent: workers, progress, reports
# ----------------------------------------------------------------------------------------------------
def _read_logs(out_dir: Path) -> dict:
    stats = {"examples": 0, "failures": 0, "errors": 0, "worst": 0.0, "worst_case": "", "per_worker": {},
             "per_kernel": {}}
    for path in sorted(out_dir.glob("worker-*.jsonl")):
        n = 0
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if "ratio" in row:
                n += 1
                if row["ratio"] > stats["worst"]:
                    stats["worst"], stats["worst_case"] = row["ratio"], f"{row['tensor']} of {row['case']}"
                per_kernel = row.get("per_kernel") or {f"fwd {row.get('kernel') or '?'}": row["ratio"]}
                for name, ratio in per_kernel.items():
                    kernel = stats["per_kernel"].setdefault(name, {"examples": 0, "worst": 0.0, "worst_case": ""})
                    kernel["examples"] += 1
                    if ratio > kernel["worst"]:
                        kernel["worst"], kernel["worst_case"] = ratio, row["case"]
            elif "failure" in row:
                stats["failures"] += 1
            elif "error" in row:
                stats["errors"] += 1
        stats["examples"] += n
        stats["per_worker"][path.stem] = n
    return stats


def wait_for_workers(children: list, deadline: float, grace: float, on_tick=None) -> list:
    """Wait for the worker processes; any still running ``grace`` seconds past the deadline (stuck in a
    long compile or a large example) is terminated, then killed, so the run always ends and writes its
    reports. Returns the indices of the workers stopped that way (their last example is lost, nothing
    else: every finished example is already in their JSONL logs)."""
    stopped = []
    while any(c.poll() is None for c in children):
        time.sleep(min(1.0, grace))
        now = time.time()
        if now > deadline + grace:
            stopped = [i for i, c in enumerate(children) if c.poll() is None]
            for i in stopped:
                children[i].terminate()
            for i in stopped:
                try:
                    children[i].wait(timeout=10)
                except subprocess.TimeoutExpired:
                    children[i].kill()
                    children[i].wait()
            break
        if on_tick is not None:
            on_tick(now)
    return stopped


def _write_reports(out_dir: Path, stats: dict, meta: dict) -> None:
    (out_dir / "summary.json").write_text(json.dumps({**meta, **stats}, indent=2) + "\n")
    failures = sorted((out_dir / "failures").glob("*.json")) if (out_dir / "failures").exists() else []
    lines = [f"# jfa fuzz: {'FAILURES FOUND' if failures else 'no failure'}", "",
             f"- backend {meta['backend']} on {meta['device']}, {meta['workers']} worker(s), "
             f"{meta['seconds']:.0f} s, {stats['examples']} examples "
             f"({stats['examples'] / max(meta['seconds'], 1e-9):.2f}/s)",
             f"- worst error/allowed: {stats['worst']:.3f} ({stats['worst_case']})"] + [
             f"  - kernel {name}: {k['examples']} examples, worst {k['worst']:.3f} ({k['worst_case']})"
             for name, k in sorted(stats["per_kernel"].items())] + [
             f"- failures: {len(failures)}"] + [f"  - `jfa repro {p}`" for p in failures] + (
             [f"- stopped at the deadline (mid-example): worker(s) {meta['stopped_at_deadline']}"]
             if meta.get("stopped_at_deadline") else [])
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    cases = [f'<testcase classname="jfa.fuzz" name="{escape(name)}" time="{meta["seconds"]:.1f}">'
             f'<system-out>{n} examples</system-out></testcase>' for name, n in stats["per_worker"].items()]
    for p in failures:
        record = json.loads(p.read_text())
        detail = escape(json.dumps(record.get("verdicts", record.get("note", "")))[:4000])
        cases.append(f'<testcase classname="jfa.fuzz.failures" name="{escape(p.name)}">'
                     f'<failure message="replay: jfa repro {escape(str(p))}">{detail}</failure></testcase>')
    (out_dir / "junit.xml").write_text(
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="jfa-fuzz" tests="{len(cases)}" '
        f'failures="{len(failures)}" time="{meta["seconds"]:.1f}">\n' + "\n".join(cases) + "\n</testsuite>\n")


def cmd_fuzz(argv=None) -> int:
    """Time-budgeted fuzzing. Exit 0: examples ran and none failed; 1: a failure was found (or a worker
    crashed); 2: a usage error, or no example ran (one line on stderr)."""
    parser = _parser("jfa fuzz", "Fuzz the kernels against the oracle for a time budget; shrunk failures become "
                     "case files for jfa repro.")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="auto: the TLX forward where it applies on a Hopper GPU, the portable kernel elsewhere")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto: cuda if visible, else the CPU interpreter")
    parser.add_argument("--minutes", type=_positive_minutes, default=10.0, help="wall-clock budget (> 0)")
    parser.add_argument("--out", default="fuzz-out", help="directory for logs, failures and reports")
    parser.add_argument("--workers", default="auto", help="'auto': one per GPU, or one per 2 CPU cores")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per side (default: by device)")
    parser.add_argument("--round-examples", type=int, default=25, help="examples per hypothesis round")
    parser.add_argument("--seed", type=int, default=None, help="the campaign's seed (default: random)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        device = _device(args.device)
        if args.workers != "auto" and not (args.workers.isdigit() and int(args.workers) > 0):
            raise UsageError(f"--workers: expected 'auto' or a positive number, got {args.workers!r}")
    except UsageError as exc:
        print(f"jfa fuzz: {exc}", file=sys.stderr)
        return 2
    from jfa.fuzz.strategies import CPU_MAX_TOKENS, GPU_MAX_TOKENS

    max_tokens = args.max_tokens or (CPU_MAX_TOKENS if device == "cpu" else GPU_MAX_TOKENS)
    out_dir = Path(args.out)
    seed = args.seed if args.seed is not None else random.randrange(2 ** 31)
    if args.worker is not None:  # a child process
        _prepare_process(device)
        run_worker(args.worker, out_dir, args.deadline, args.backend, device, max_tokens, args.round_examples, seed)
        return 0

    out_dir.mkdir(parents=True, exist_ok=True)
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        workers = gpus if args.workers == "auto" else int(args.workers)
    else:
        workers = max(1, (os.cpu_count() or 2) // 2) if args.workers == "auto" else int(args.workers)
    start = time.time()
    deadline = start + args.minutes * 60
    children = []
    for i in range(workers):
        env = dict(os.environ)
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(i % max(1, gpus))  # one worker pinned to each GPU
            env.pop("TRITON_INTERPRET", None)
        cmd = [sys.executable, "-m", "jfa.cli", "fuzz", "--worker", str(i), "--deadline", str(deadline),
               "--backend", args.backend, "--device", device, "--out", str(out_dir), "--seed", str(seed),
               "--max-tokens", str(max_tokens), "--round-examples", str(args.round_examples)]
        children.append(subprocess.Popen(cmd, env=env))
    print(f"jfa fuzz: {workers} worker(s) on {device}, backend {args.backend}, {args.minutes:g} min, seed {seed}, "
          f"out {out_dir}", flush=True)
    tty = sys.stdout.isatty()
    last_print = 0.0

    def progress(now: float) -> None:
        nonlocal last_print
        if tty or now - last_print >= 30:
            s = _read_logs(out_dir)
            line = (f"{now - start:6.0f}s  examples {s['examples']:6d}  rate {s['examples'] / (now - start):6.2f}/s  "
                    f"worst err/allowed {s['worst']:.3f}  failures {s['failures']}")
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last_print = now

    stopped = wait_for_workers(children, deadline, grace=max(20.0, 0.05 * args.minutes * 60), on_tick=progress)
    if tty:
        print()
    seconds = time.time() - start
    stats = _read_logs(out_dir)
    meta = {"backend": args.backend, "device": device, "workers": workers, "seconds": seconds, "seed": seed,
            "max_tokens": max_tokens, "exit_codes": [c.returncode for c in children],
            "stopped_at_deadline": stopped}
    _write_reports(out_dir, stats, meta)
    print((out_dir / "summary.md").read_text())
    crashed = any(c.returncode != 0 for i, c in enumerate(children) if i not in stopped)
    if stats["failures"] or crashed:
        return 1
    if stats["examples"] == 0:
        print(f"jfa fuzz: no example ran in {seconds:.0f} s ({workers} worker(s)): nothing was checked", file=sys.stderr)
        return 2
    return 0
