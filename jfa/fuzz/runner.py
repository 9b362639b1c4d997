"""``jfa fuzz``, ``jfa fuzz merge`` and ``jfa repro``: time-budgeted property fuzzing against the oracle,
merging a campaign's shards, and replay.

``jfa fuzz`` starts worker processes (on a GPU host several per GPU, each pinned with
``CUDA_VISIBLE_DEVICES``; on a CPU-only host interpreter workers), the machine's cores shared out
between them (``jfa.fuzz.cores``). Each runs the hypothesis property of ``tests/test_fuzz.py``
(``jfa.fuzz.strategies.mixed_problems`` judged by ``jfa.fuzz.rule.run_case``) in seeded rounds until
the deadline; the round seeds of every (campaign seed, shard, worker, restart, round) are distinct by
construction, so the shards of ``--shard I/N`` never repeat each other. On a GPU the examples are
judged by the oracle's float64 twin on the device (``jfa.fuzz.twin``), a sampled fraction re-judged by
the NumPy oracle, the root of trust.

Every example is a JSON line in ``DIR/worker-N.jsonl`` (``jfa.fuzz.report``). The first failing example
of a round is written at once as a case file ``DIR/failures/case-*.json``, then hypothesis shrinks it
and the shrunk case replaces it; ``jfa repro CASE.json`` replays one (copy it into ``tests/corpus/`` to
keep it forever). The parent watches the workers: one whose example runs past ``--hang-seconds`` is
killed and its example written as a "hang" case file; a worker whose CUDA context died (an illegal
address) writes its case and exits; either is restarted, so a campaign survives the bugs it finds. It
shows live progress and writes ``summary.json``, ``summary.md`` and ``junit.xml`` to DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def case_from_fields(fields: dict):
    """The :class:`jfa.fuzz.cases.Case` of a record's ``"case"`` fields (JSON lists back to tuples)."""
    from jfa.fuzz.cases import Case

    fields = dict(fields)
    for key in ("lengths_q", "lengths_k", "window", "sparse"):
        if key in fields:
            fields[key] = tuple(fields[key])
    return Case(**fields)


def write_failure(failures: Path, case, report=None, *, backend: str, device: str, note: str, kind: str,
                  mutant: str = "", **extra) -> Path:
    """Write ``case`` as ``failures/case-<hash>.json`` (kind: rule, crash, context-lost, hang; the mutant
    it ran against, if any; ``extra`` fields such as a hang's stacks). Returns the file's path."""
    record = case_record(case, report, backend=backend, device=device, note=note)
    record.update(kind=kind, **extra)
    if mutant:
        record["mutant"] = mutant
    failures.mkdir(parents=True, exist_ok=True)
    path = failures / case_filename(case)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def load_case(path):
    """The :class:`jfa.fuzz.cases.Case` stored in a case file, and the whole record. Raises
    FileNotFoundError, json.JSONDecodeError, or ValueError/KeyError/TypeError for what is no case file."""
    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or record.get("format") != CASE_FORMAT:
        raise ValueError(f"{path}: unknown case format {record.get('format') if isinstance(record, dict) else record!r}")
    return case_from_fields(record["case"]), record


# fields added to Case after cases were first named, at their defaults: left out of a case's key so that
# every earlier case keeps its name (corpus files, failure records)
_LATER_DEFAULTS = {"sparse": ()}


def case_key(case) -> str:
    """The canonical text of ``case`` its file name and sampling hash are taken from."""
    fields = {name: value for name, value in dataclasses.asdict(case).items()
              if not (name in _LATER_DEFAULTS and tuple(value) == _LATER_DEFAULTS[name])}
    return json.dumps(fields, sort_keys=True)


def case_filename(case) -> str:
    digest = hashlib.sha1(case_key(case).encode()).hexdigest()[:10]
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


def _count(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


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


COMPILE_SECONDS = 600  # one compile running longer than this counts as a hang too
EXIT_CONTEXT_LOST = 3  # a worker whose CUDA context died: its case is written, the parent restarts it
# a sampled example is re-judged by the NumPy oracle only up to this many (query, key) pairs x heads x
# head dim: about a second of the host's float64 work (the twin judges the larger ones; the twin itself
# is checked against NumPy on every strategy family by tests/test_twin.py)
RECHECK_MAX_COST = 1 << 28
_SEED_FIELDS = (("shard", 20), ("slot", 12), ("restart", 16), ("round", 32))


def round_seed(seed: int, shard: int, slot: int, restart: int, round_index: int) -> int:
    """The hypothesis seed of one round: the campaign seed and the round's (shard, worker slot, restart,
    round) packed side by side, so no two rounds of a campaign, in any of its shards, share a seed."""
    packed = seed
    for (name, bits), value in zip(_SEED_FIELDS, (shard, slot, restart, round_index)):
        if not 0 <= value < 1 << bits:
            raise ValueError(f"{name}: {value} is outside [0, 2**{bits})")
        packed = packed << bits | value
    return packed


def attention_cost(case) -> int:
    """(query, key) pairs x heads x head dim of ``case``: the size of the oracle's work."""
    lengths_q = [case.lengths_q[0]] * len(case.lengths_k) if case.broadcast_q else case.lengths_q
    return sum(a * b for a, b in zip(lengths_q, case.lengths_k)) * case.heads * case.head_dim


def _sampled(case, seed: int, fraction: float) -> bool:
    """Whether ``case`` is in the re-judged sample: decided by its hash, so a replay while shrinking
    decides the same way."""
    digest = hashlib.sha1(f"{seed}:{case_key(case)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * 2 ** 32


def _context_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the process's CUDA context is gone (every later call would fail too)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(sign in text for sign in ("AcceleratorError", "CUDA error", "illegal memory access",
                                         "unspecified launch failure", "misaligned address", "illegal instruction"))


def _signs_of_life(write) -> None:
    """Make the worker's log show compiles (a cold compile is slow, not hung: the parent's hang clock
    restarts at each "compiled" row and a "compiling" row gets COMPILE_SECONDS)."""
    from triton import knobs as triton_knobs

    def name(kwargs) -> str:
        return str(kwargs.get("repr", "?")).split("[", 1)[0]

    def compiling(*args, **kwargs):
        write({"compiling": name(kwargs)})
        return False  # False: compile as usual (True would skip the compile)

    def compiled(*args, **kwargs):
        write({"compiled": name(kwargs)})

    triton_knobs.runtime.jit_cache_hook = compiling
    triton_knobs.runtime.jit_post_compile_hook = compiled


@dataclasses.dataclass
class WorkerSettings:
    """What one worker runs (the parent passes it as JSON)."""

    out_dir: str
    deadline: float
    backend: str = "auto"
    device: str = "cpu"
    mix: str = "all"
    oracle: str = "numpy"
    recheck_fraction: float = 0.0
    max_tokens: int = 640
    # the share of its GPU's memory the worker's torch allocator may take (``gpu_memory_fraction``); 0: no cap
    memory_fraction: float = 0.0
    round_examples: int = 25
    seed: int = 0
    shard: int = 0
    slot: int = 0
    restart: int = 0
    mutant: str = ""


def run_worker(ws: WorkerSettings) -> None:
    """Run hypothesis rounds until the deadline, logging every example to ``worker-<slot>.jsonl`` and
    writing a case file for every failure (with ``ws.mutant``: against that mutant of the kernels)."""
    import contextlib

    with contextlib.ExitStack() as cleanups:
        # the parent stops workers with SIGTERM: undo the mutant (its temporary module files) and leave at
        # once (hypothesis would take a SystemExit raised mid-example for a failure and go on)
        def stop(signum, frame):
            cleanups.close()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        if ws.mutant:
            from jfa.fuzz.mutants import BY_NAME, applied

            cleanups.enter_context(applied(BY_NAME[ws.mutant]))
        _run_rounds(ws)


def _run_rounds(ws: WorkerSettings) -> None:
    import faulthandler
    import warnings

    import torch
    from hypothesis import HealthCheck, Phase, given, reject, settings, target
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from jfa.fuzz.rule import cannot_run, run_case
    from jfa.fuzz.strategies import TLX_ONLY, mixed_problems, problems

    out_dir, backend, device = Path(ws.out_dir), ws.backend, ws.device
    strategy = (problems(max_tokens=ws.max_tokens, **TLX_ONLY) if backend == "tlx"
                else mixed_problems(ws.mix, max_tokens=ws.max_tokens))
    if backend == "tlx" and device == "cpu":  # the TLX kernels on the simulator, a seeded schedule a worker
        import jfa.sim as sim

        sim.install(sm_count=3, schedule=sim.Schedule.seeded(round_seed(ws.seed, ws.shard, ws.slot, ws.restart, 0)))

    # inf/NaN in lanes the kernels mask out (e.g. exp2 of padded columns) are expected in the interpreter
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    log = open(out_dir / f"worker-{ws.slot}.jsonl", "a", buffering=1)

    def write(row: dict) -> None:
        log.write(json.dumps({"t": round(time.time(), 3), **row}) + "\n")

    failures = out_dir / "failures"
    failures.mkdir(exist_ok=True)
    where = f"worker {ws.slot} (restart {ws.restart}) of shard {ws.shard}" + (f", mutant {ws.mutant}" if ws.mutant else "")
    write({"worker": ws.slot, "restart": ws.restart, "pid": os.getpid()})
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for the stacks of a hang
    if device == "cuda":
        _signs_of_life(write)
        if ws.memory_fraction > 0:  # a case too large for this worker's share is skipped (out of memory below)
            torch.cuda.set_per_process_memory_fraction(ws.memory_fraction)
    state = {"first": None, "last": None}

    def write_case(case, report, note: str, kind: str) -> Path:
        return write_failure(failures, case, report, backend=backend, device=device, note=note, kind=kind,
                             mutant=ws.mutant)

    def failed(case, report, crash: str) -> None:
        state["last"] = (case, report, crash)
        if state["first"] is None:  # on disk at once: a worker killed while shrinking still leaves it
            state["first"] = write_case(case, report, f"{crash or 'first failing example'}, not shrunk yet; "
                                        f"found by jfa fuzz, {where}", "crash" if crash else "rule")
            write({"first_failure": str(state["first"]), "case": case.id})

    def property_(data):
        if time.time() > ws.deadline and state["first"] is None:
            reject()  # out of time: end the round, unless a failure is being shrunk (let that finish)
        case = data.draw(strategy, label="case")
        if backend == "tlx" and cannot_run(case, backend, device):
            reject()  # outside what the TLX kernel takes (dtype, head dim, strides): "auto" covers those
        recheck = ws.oracle == "twin" and attention_cost(case) <= RECHECK_MAX_COST and _sampled(
            case, ws.seed, ws.recheck_fraction)
        write({"start": dataclasses.asdict(case), "case": case.id})
        start = time.time()
        try:
            report = run_case(case, backend=backend, device=device, oracle_name=ws.oracle, recheck=recheck)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()  # the harness's own allocations (oracle, reference) on a busy GPU
            write({"skipped": "out of GPU memory", "case": case.id})
            reject()
        except Exception as exc:  # a crash is a finding too
            crash = f"{type(exc).__name__}: {exc}"[:2000]
            if device == "cuda" and _context_lost(exc):  # nothing more can run in this process
                path = write_case(case, None, f"the CUDA context died: {crash}; found by jfa fuzz, {where}",
                                  "context-lost")
                write({"failure": str(path), "case": case.id, "kind": "context-lost"})
                log.close()
                os._exit(EXIT_CONTEXT_LOST)
            failed(case, None, crash)
            raise
        worst = report.worst
        write({"case": case.id, "ok": report.ok, "ratio": min(worst.ratio, 1e9), "tensor": worst.name,
               "kernel": report.kernel, "backward_kernel": report.backward_kernel, "rechecked": recheck,
               "per_kernel": {k: min(r, 1e9) for k, r in report.worst_per_kernel().items()},
               "seconds": round(time.time() - start, 3)})
        # one target per kernel: hypothesis climbs each kernel's worst ratio, so the kernel with the
        # larger ratios does not pull the whole mix toward its inputs
        target(min(worst.ratio, 1e6), label=f"worst error / allowed, {report.kernel or 'no kernel'}")
        if not report.ok:
            failed(case, report, "")
        assert report.ok, str(report)

    round_index = 0
    while time.time() < ws.deadline:
        this_seed = round_seed(ws.seed, ws.shard, ws.slot, ws.restart, round_index)
        round_index += 1
        test = settings(max_examples=ws.round_examples, deadline=None, database=None, derandomize=False,
                        phases=[Phase.generate, Phase.target, Phase.shrink], print_blob=False,
                        suppress_health_check=list(HealthCheck))(given(data=st.data())(property_))
        test = hypothesis_seed(this_seed)(test)
        state["first"] = state["last"] = None
        try:
            test()
        except Exception as exc:  # hypothesis re-raises the shrunk failure after shrinking
            if state["last"] is None:
                if time.time() > ws.deadline:
                    break  # the round was cut at the deadline (rejected replays read as flaky data): not a finding
                write({"error": f"{type(exc).__name__}: {exc}"[:500]})
                continue
            case, report, crash = state["last"]
            path = write_case(case, report, (crash + "; " if crash else "") +
                              f"found by jfa fuzz, {where}, round seed {this_seed}, shrunk", "crash" if crash else "rule")
            if state["first"] != path:
                state["first"].unlink(missing_ok=True)  # the shrunk case replaces the unshrunk one
            write({"failure": str(path), "case": case.id, "kind": "crash" if crash else "rule"})
    log.close()


# ----------------------------------------------------------------------------------------------------
# the parent: workers, hang watch, restarts, progress, reports
# ----------------------------------------------------------------------------------------------------
def wait_for_workers(children: list, deadline: float, grace: float, on_tick=None) -> list:
    """Wait for the worker processes; any still running ``grace`` seconds past the deadline (stuck in a
    long compile or a large example) is terminated, then killed, so the run always ends and writes its
    reports. ``on_tick(now)`` runs about once a second and may return True to stop every worker at once.
    Returns the indices of the workers stopped (their last example is lost, nothing else: every finished
    example is already in their JSONL logs)."""
    stopped = []
    while any(c.poll() is None for c in children):
        time.sleep(min(1.0, grace))
        now = time.time()
        stop_now = on_tick is not None and on_tick(now)
        if stop_now or now > deadline + grace:
            stopped = [i for i, c in enumerate(children) if c.poll() is None]
            for i in stopped:
                _stop(children[i])
            break
    return stopped


def _stop(child: subprocess.Popen) -> None:
    """Terminate a worker and everything it started (its own session), then kill it if it lingers."""
    def signal_group(sig):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError, OSError):
            if child.poll() is None:
                child.send_signal(sig)

    signal_group(signal.SIGTERM)
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        signal_group(signal.SIGKILL)
        child.wait()


def worker_command(ws: WorkerSettings) -> list:
    """The command line of one worker process."""
    return [sys.executable, "-m", "jfa.cli", "fuzz", "--worker-settings", json.dumps(dataclasses.asdict(ws))]


class _Slot:
    """One worker position: its process, its GPU, how often it was restarted."""

    def __init__(self, index: int, gpu):
        self.index, self.gpu, self.restart, self.proc, self.started = index, gpu, 0, None, 0.0
        self.quick_failures = 0
        self.hung = False  # its process was killed by the hang watch


def _stack_of(slot: "_Slot", out_dir: Path) -> str:
    """Every thread's Python stack of a worker (it dumps them into its .log on SIGUSR1; a hung kernel
    shows as a thread waiting in a CUDA call), or "" where it cannot tell."""
    log = out_dir / f"worker-{slot.index}.log"
    before = log.stat().st_size if log.exists() else 0
    try:
        os.kill(slot.proc.pid, signal.SIGUSR1)
    except OSError:
        return ""
    time.sleep(1.0)
    if not log.exists():
        return ""
    with open(log, "rb") as f:
        f.seek(before)
        return f.read()[-6000:].decode(errors="replace")


def _parse_shard(text: str) -> tuple:
    shard, _, shards = text.partition("/")
    if not (shard.isdigit() and shards.isdigit() and int(shard) < int(shards)):
        raise UsageError(f"--shard: expected I/N with 0 <= I < N, got {text!r}")
    return int(shard), int(shards)


# Device memory a GPU worker's torch allocator is given: about the H200's 139 GiB over the 16 workers of its 16 cores
# (less their overhead below), the share its case sizes (GPU_MAX_TOKENS) were drawn for. On the 80 GB H100, 16
# workers ran the device out of memory within ~90 s, and the errors landed on whichever worker allocated next
# (cuBLAS handles, Triton module loads, small cases: NOTES.md session 46).
GPU_WORKER_MEMORY = 15 * 2 ** 30 // 2
# Per worker process, memory its torch allocator does not see: the CUDA context, loaded modules, cuBLAS workspaces.
GPU_WORKER_OVERHEAD = 3 * 2 ** 30 // 4


def _default_workers(device: str, gpus: int, gpu_memory: int = 0) -> int:
    """auto: on a GPU host one worker a core (a GPU worker's host work is single-threaded: drawing,
    compiling, the sampled NumPy re-judging; the twin runs on the GPU), at least one a GPU, and no more on a
    GPU than its memory (``gpu_memory`` bytes, the smallest GPU's; 0: unknown) gives GPU_WORKER_MEMORY each; on a
    CPU host one a two cores (the interpreter and the NumPy oracle use BLAS threads)."""
    from jfa.fuzz.cores import usable_cores

    if device != "cuda":
        return max(1, usable_cores() // 2)
    workers = usable_cores()
    if gpu_memory:  # (the campaign's parent, which read the size, holds a context too)
        per_gpu = (gpu_memory - GPU_WORKER_OVERHEAD) // (GPU_WORKER_MEMORY + GPU_WORKER_OVERHEAD)
        workers = min(workers, gpus * max(1, per_gpu))
    return max(gpus, workers)


def gpu_memory_fraction(gpu_memory: int, workers_on_gpu: int) -> float:
    """The share of a GPU of ``gpu_memory`` bytes each of ``workers_on_gpu`` worker processes' torch allocator
    may take: an equal part of what the GPU_WORKER_OVERHEAD of theirs and of the campaign's parent leaves, so
    that no worker's case (or its allocator's cache) takes the memory another needs for its context, modules and
    handles. Raises ValueError where nothing is left."""
    if workers_on_gpu < 1:
        raise ValueError(f"workers_on_gpu: must be >= 1, got {workers_on_gpu}")
    left = gpu_memory - (workers_on_gpu + 1) * GPU_WORKER_OVERHEAD
    if left <= 0:
        raise ValueError(f"{workers_on_gpu} fuzz workers do not fit a GPU of {gpu_memory / 2 ** 30:.1f} GiB "
                         f"({GPU_WORKER_OVERHEAD / 2 ** 30:.2f} GiB each outside torch): fewer --workers")
    return left / workers_on_gpu / gpu_memory


def cmd_merge(argv=None) -> int:
    """``jfa fuzz merge DIR... --out DIR``. Exit 0: merged, no failure; 1: merged, failures found; 2: the
    directories are not shards of one campaign (one line on stderr)."""
    from jfa.fuzz.report import MergeError, failure_files, merge

    parser = _parser("jfa fuzz merge", "Merge the outputs of a campaign's shards (jfa fuzz --shard I/N) into one "
                     "report: totals, rates, worst ratios per kernel, deduplicated shrunk failures.")
    parser.add_argument("dirs", nargs="+", help="the shards' --out directories")
    parser.add_argument("--out", default="fuzz-merged", help="directory for the merged report and failures")
    args = parser.parse_args(argv)
    try:
        summary = merge(args.dirs, Path(args.out))
    except MergeError as exc:
        print(f"jfa fuzz merge: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "summary.md").read_text())
    return 1 if summary["failures"] or failure_files(Path(args.out)) else 0


def fuzz_parser() -> argparse.ArgumentParser:
    """The command line of ``jfa fuzz`` (the cluster launchers' tests parse their commands with it)."""
    from jfa.fuzz.strategies import MIXES

    parser = _parser("jfa fuzz", "Fuzz the kernels against the oracle for a time budget; shrunk failures become "
                     "case files for jfa repro. 'jfa fuzz merge DIR...' merges a campaign's shards.")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="auto: the TLX kernels where they apply on a Hopper GPU, the portable kernel elsewhere")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto: cuda if visible, else the CPU interpreter")
    parser.add_argument("--minutes", type=_positive_minutes, default=10.0, help="wall-clock budget (> 0)")
    parser.add_argument("--out", default="fuzz-out", help="directory for logs, failures and reports")
    parser.add_argument("--workers", default="auto",
                        help="'auto': one per core on a GPU host (the GPUs round-robin), one per 2 cores on a CPU")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="this run is shard I of N of one campaign (same --seed on every shard: disjoint rounds)")
    parser.add_argument("--mix", default="auto", choices=("auto",) + MIXES,
                        help="what is drawn; auto: production on a GPU (85%% what the TLX kernels take), all on a CPU")
    parser.add_argument("--oracle", default="auto", choices=("auto", "numpy", "twin"),
                        help="what judges; auto: twin (float64, on the GPU) on a GPU, numpy on a CPU")
    parser.add_argument("--recheck", type=float, default=0.05, metavar="FRACTION",
                        help="with the twin: the fraction of examples re-judged by the NumPy oracle")
    parser.add_argument("--hang-seconds", type=float, default=300.0,
                        help="an example running longer is a hang: its worker is killed, the case written")
    parser.add_argument("--until-found", action="store_true",
                        help="stop at the first failing example (measures the time to find a bug)")
    parser.add_argument("--mutant", default="", help="fuzz this mutant of the kernels (jfa.fuzz.mutants) instead")
    parser.add_argument("--max-tokens", type=_count(0), default=0, help="tokens per side (0: 640 on a CPU, 24000 on a GPU)")
    parser.add_argument("--round-examples", type=_count(1), default=25, help="examples per hypothesis round")
    parser.add_argument("--seed", type=int, default=None, help="the campaign's seed (None: random; give "
                        "every shard the same)")
    parser.add_argument("--worker-settings", default=None, help=argparse.SUPPRESS)
    return parser


def cmd_fuzz(argv=None) -> int:
    """Time-budgeted fuzzing. Exit 0: examples ran and none failed; 1: a failure was found (or a worker
    crashed); 2: a usage error, or no example ran (one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return cmd_merge(argv[1:])
    args = fuzz_parser().parse_args(argv)
    if args.worker_settings is not None:  # a child process
        ws = WorkerSettings(**json.loads(args.worker_settings))
        _prepare_process(ws.device)
        run_worker(ws)
        return 0
    try:
        device = _device(args.device)
        if args.workers != "auto" and not (args.workers.isdigit() and int(args.workers) > 0):
            raise UsageError(f"--workers: expected 'auto' or a positive number, got {args.workers!r}")
        shard, shards = _parse_shard(args.shard)
        if not 0.0 <= args.recheck <= 1.0:
            raise UsageError(f"--recheck: a fraction in [0, 1], got {args.recheck}")
        if args.hang_seconds <= 0:
            raise UsageError(f"--hang-seconds: must be > 0, got {args.hang_seconds}")
        if args.mutant:
            from jfa.fuzz.mutants import BY_NAME

            if args.mutant not in BY_NAME:
                raise UsageError(f"--mutant: no mutant {args.mutant!r}; one of: {', '.join(sorted(BY_NAME))}")
        if args.seed is None and shards > 1:
            raise UsageError("--shard: give every shard the same --seed (one campaign, disjoint rounds)")
    except UsageError as exc:
        print(f"jfa fuzz: {exc}", file=sys.stderr)
        return 2
    from jfa.fuzz.cores import share_cores
    from jfa.fuzz.report import failure_files, write_reports
    from jfa.fuzz.strategies import CPU_MAX_TOKENS, GPU_MAX_TOKENS

    oracle_name = args.oracle if args.oracle != "auto" else ("twin" if device == "cuda" else "numpy")
    gpus = gpu_memory = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        if gpus:
            gpu_memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
    workers = _default_workers(device, gpus, gpu_memory) if args.workers == "auto" else int(args.workers)
    try:
        memory_fraction = gpu_memory_fraction(gpu_memory, -(-workers // gpus)) if gpus else 0.0
    except ValueError as exc:
        print(f"jfa fuzz: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    threads = share_cores(env, workers)
    if device == "cuda":
        env.pop("TRITON_INTERPRET", None)
    start = time.time()
    base = WorkerSettings(
        out_dir=args.out, deadline=start + args.minutes * 60, backend=args.backend, device=device,
        mix=args.mix if args.mix != "auto" else ("production" if device == "cuda" else "all"), oracle=oracle_name,
        recheck_fraction=args.recheck if oracle_name == "twin" else 0.0,
        max_tokens=args.max_tokens or (CPU_MAX_TOKENS if device == "cpu" else GPU_MAX_TOKENS),
        memory_fraction=memory_fraction, round_examples=args.round_examples,
        seed=args.seed if args.seed is not None else random.randrange(2 ** 31),
        shard=shard, mutant=args.mutant)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"jfa fuzz: {workers} worker(s) x {threads} CPU thread(s) on {device}"
          f"{f' ({gpus} GPU(s))' if gpus else ''}, backend {args.backend}, mix {base.mix}, oracle {oracle_name}, "
          f"{args.minutes:g} min, seed {base.seed}, shard {shard}/{shards}"
          f"{f', mutant {args.mutant}' if args.mutant else ''}, out {out_dir}", flush=True)
    campaign = Campaign(base, workers, gpus, env, hang_seconds=args.hang_seconds, until_found=args.until_found)
    campaign.run(grace=max(20.0, 0.05 * args.minutes * 60))
    meta = {"backend": args.backend, "device": device, "mix": base.mix, "oracle": oracle_name,
            "recheck_fraction": base.recheck_fraction, "workers": workers, "threads": threads, "gpus": gpus,
            "seconds": time.time() - start, "start": start, "seed": base.seed, "shard": f"{shard}/{shards}",
            "shards": shards, "max_tokens": base.max_tokens, "memory_fraction": round(memory_fraction, 4),
            "round_examples": args.round_examples,
            "mutant": args.mutant, "hang_seconds": args.hang_seconds, "until_found": args.until_found,
            "restarts": campaign.restarts, "crashes": campaign.crashes, "stopped_at_deadline": campaign.stopped}
    stats = campaign.stats
    write_reports(out_dir, stats.as_dict(), meta)
    print((out_dir / "summary.md").read_text())
    if failure_files(out_dir) or stats.failures or campaign.crashes:
        return 1
    if stats.examples == 0:
        print(f"jfa fuzz: no example ran in {meta['seconds']:.0f} s ({workers} worker(s)): nothing was checked",
              file=sys.stderr)
        return 2
    return 0


class Campaign:
    """The parent of one ``jfa fuzz`` run: a slot per worker, each started, watched and restarted. A worker
    whose example shows no sign of life for ``hang_seconds`` is killed and its example written as a
    "hang" case file; a worker that died (a dead CUDA context, a crash, a killed hang) starts again while
    time remains, unless it died three times within 15 s of starting; a crash (any exit but 0 and
    EXIT_CONTEXT_LOST) is reported."""

    def __init__(self, base: WorkerSettings, workers: int, gpus: int, env: dict, *, hang_seconds: float,
                 until_found: bool):
        from jfa.fuzz.report import LogStats

        self.base, self.env, self.hang_seconds, self.until_found = base, env, hang_seconds, until_found
        self.out_dir = Path(base.out_dir)
        self.slots = [_Slot(i, i % gpus if gpus else None) for i in range(workers)]
        self.stats = LogStats()
        self.restarts, self.crashes, self.stopped = 0, [], []
        self.start, self.last_print, self.tty = time.time(), 0.0, sys.stdout.isatty()

    def launch(self, slot: _Slot) -> None:
        env = dict(self.env)
        if slot.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(slot.gpu)  # workers round-robin over the GPUs
        cmd = worker_command(dataclasses.replace(self.base, slot=slot.index, restart=slot.restart))
        with open(self.out_dir / f"worker-{slot.index}.log", "a") as output:  # tracebacks, hypothesis's report
            slot.proc = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        slot.started, slot.hung = time.time(), False

    def run(self, grace: float) -> None:
        """Start every worker and wait until all ended: at the deadline (those still running ``grace``
        seconds past it are stopped), or at the first failure with ``until_found``."""
        for slot in self.slots:
            self.launch(slot)
        while True:  # the slots' processes change as workers restart: wait on the current ones
            self.stopped += wait_for_workers([s.proc for s in self.slots], self.base.deadline, grace, on_tick=self.tick)
            if all(s.proc.poll() is not None for s in self.slots):
                self.tick(time.time())  # a last read (and restarts, when time remains)
                if all(s.proc.poll() is not None for s in self.slots):
                    break
        if self.tty:
            print()
        self.stopped = sorted(set(self.stopped))
        self.stats.update(sorted(self.out_dir.glob("worker-*.jsonl")))
        for slot in self.slots:
            if slot.index not in self.stopped:
                self._note_exit(slot)

    def tick(self, now: float) -> bool:
        """Read new log lines, kill hung workers, restart dead ones, show progress. True: stop the campaign
        (``until_found`` and a failure was found)."""
        self.stats.update(sorted(self.out_dir.glob("worker-*.jsonl")))
        found = self.until_found and self.stats.first_failure_t is not None
        for slot in self.slots:
            self._watch(slot, now)
            if slot.proc.poll() is not None and now < self.base.deadline - 5 and not found:
                self._note_exit(slot)
                slot.quick_failures = slot.quick_failures + 1 if now - slot.started < 15 else 0
                if slot.quick_failures < 3 and slot.restart + 1 < 1 << 16:
                    slot.restart += 1
                    self.restarts += 1
                    self.launch(slot)
        self._progress(now)
        return found

    def _note_exit(self, slot: _Slot) -> None:
        crash = (slot.index, slot.restart, slot.proc.returncode)
        if slot.proc.returncode not in (0, EXIT_CONTEXT_LOST) and not slot.hung and crash not in self.crashes:
            self.crashes.append(crash)

    def _watch(self, slot: _Slot, now: float) -> None:
        """Kill ``slot``'s worker when its example shows no sign of life for too long, writing the case."""
        log_path = self.out_dir / f"worker-{slot.index}.jsonl"
        last = self.stats.last_row.get(log_path, {})
        started = self.stats.last_start.get(log_path)
        limit = max(COMPILE_SECONDS, self.hang_seconds) if "compiling" in last else self.hang_seconds
        mid_example = any(key in last for key in ("start", "compiling", "compiled"))
        if not (slot.proc.poll() is None and mid_example and started and last["t"] >= slot.started - 1
                and now - last["t"] > limit):
            return
        stack = _stack_of(slot, self.out_dir)
        _stop(slot.proc)
        slot.hung = True
        case = case_from_fields(started["start"])
        what = (f"compiling {last['compiling']}" if "compiling" in last else
                f"after compiling {last['compiled']}" if "compiled" in last else "running")
        path = write_failure(self.out_dir / "failures", case, backend=self.base.backend, device=self.base.device,
                             note=f"hang: no sign of life for {limit:g} s ({what}); worker {slot.index}, "
                                  f"restart {slot.restart}, killed by jfa fuzz",
                             kind="hang", mutant=self.base.mutant, stack=stack)
        with open(log_path, "a") as f:
            f.write(json.dumps({"t": round(now, 3), "failure": str(path), "case": case.id, "kind": "hang"}) + "\n")

    def _progress(self, now: float) -> None:
        from jfa.fuzz.report import failure_files

        if not (self.tty or now - self.last_print >= 30):
            return
        s, elapsed = self.stats, max(now - self.start, 1e-9)
        line = (f"{elapsed:6.0f}s  examples {s.examples:6d}  {60 * s.examples / elapsed:7.0f}/min  "
                f"production {100 * s.production / max(s.examples, 1):3.0f}%  worst err/allowed {s.worst:.3f}  "
                f"failures {len(failure_files(self.out_dir))}")
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", flush=True)
        self.last_print = now
