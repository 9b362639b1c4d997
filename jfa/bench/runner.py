"""Run a benchmark suite: build inputs, check each implementation, time it, report.

Usage (the body of ``jfa bench``)::

    python -m jfa.bench --suite gem --impls jfa-triton,torch-varlen --pass fwd,bwd,fwd_bwd --out DIR
    python -m jfa.bench --suite sweep --out DIR --write-benchmarks BENCHMARKS.md
    python -m jfa.bench --suite all --out DIR --write-benchmarks BENCHMARKS.md   # gem, sweep, dense, gqa, causal
    python -m jfa.bench --suite gem --dry-run        # list problems and impls, no GPU needed

Per problem: bf16 packed Q/K/V with fresh normal data on the GPU, in as many copies as it
takes to exceed 2x the L2 cache (memory permitting), rotated between calls; every
implementation's forward output is judged by the oracle rule (``jfa.fuzz.rule``) on a subsample of
sequences and heads before it is timed (``wrong`` and not timed where it fails); times are
``triton.testing.do_bench`` medians; backward = (forward + backward) - forward. After timing,
one untimed call per pass measures the peak extra GPU memory, and 20 calls issued behind a GPU
sleep measure the host (CPU) time of a call (``host_us``). Progress: one line per finished
problem (a tqdm bar when tqdm is installed). Reports (:mod:`jfa.bench.report`): terminal table,
JSON, markdown, CSV, PNG plots, and optionally a BENCHMARKS.md-style file. ``--suite all`` runs
every suite in turn (gem, sweep, dense, gqa, causal) and writes each suite's files as it finishes, as a run of
that suite alone would, and one BENCHMARKS.md-style file holding every finished suite.
Nothing touches CUDA at import time.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import shlex
import statistics
import sys
import time
import zlib
from typing import Callable, Sequence

import torch

from .impls import BASELINE, IMPLS, Impl, NotApplicable, PackedBatch, Prepared, _offsets, get_impl
from .report import (Section, _columns, add_ratios, format_table, markdown_report,
                     write_benchmarks, write_outputs)
from .suites import LAB_SUITES, PASSES, SUITES, Problem, flops, get_suite, make_lengths, q_lengths

__all__ = [
    "run_suite",
    "plan",
    "suite_names",
    "ALL",
    "bench_problem",
    "ForwardCheck",
    "format_table",
    "markdown_report",
    "dry_run",
    "main",
    "write_reports",
    "peak_extra_mib",
    "Progress",
    "command_line",
    "L2_BYTES",
    "PASSES",
]

#: L2 cache size assumed when the device does not report a larger one (H200: 60 MB class).
L2_BYTES = 60 * 2**20
#: Most input copies kept alive at once, and the share of free memory they may take.
MAX_COPIES = 64
COPY_MEMORY_FRACTION = 0.25
#: Sequences and heads per problem judged by the oracle rule before timing.
CHECK_SEQUENCES = 6
CHECK_HEADS = 2
#: Host time: calls timed per pass, behind a sleep kernel of this many GPU cycles (~50 ms on an H200),
#: which keeps the GPU busy for longer than the calls take so that none of them waits on it.
HOST_CALLS = 20  # calls per round of host_us
HOST_ROUNDS = 5
HOST_SLEEP_CYCLES = 100_000_000
#: ``--suite`` value that runs every suite of ``SUITES`` in turn.
ALL = "all"
#: Implementations whose failures are reported as "skipped" rather than "error".
OPTIONAL_IMPLS = ("jfa-tlx", "flex-docmask", "sdpa-padded", "sdpa-njt", "fa4-varlen")


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------

def _bytes_per_copy(problem: Problem, lengths_q: torch.Tensor, lengths_k: torch.Tensor) -> int:
    rows_q = problem.Lq if problem.broadcast_q else int(lengths_q.sum())
    elements = rows_q * problem.H + 2 * int(lengths_k.sum()) * problem.kv_heads
    return elements * problem.D * torch.empty((), dtype=problem.dtype).element_size()


def num_copies(bytes_per_copy: int, l2_bytes: int, free_bytes: int) -> int:
    """Copies needed to exceed 2x L2, limited to a share of free memory and MAX_COPIES; >= 1."""
    want = 2 * l2_bytes // max(bytes_per_copy, 1) + 1  # smallest n with n * bytes > 2 * L2
    allowed = int(COPY_MEMORY_FRACTION * free_bytes) // max(bytes_per_copy, 1)
    return max(1, min(want, allowed, MAX_COPIES))


def make_batches(problem: Problem, lengths_q: torch.Tensor, lengths_k: torch.Tensor,
                 n: int, device) -> list[PackedBatch]:
    """``n`` input copies with independent standard-normal data (offsets shared)."""
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(problem.name.encode()))
    rows_q = problem.Lq if problem.broadcast_q else int(lengths_q.sum())
    rows_k = int(lengths_k.sum())
    cu_q = None if problem.broadcast_q else _offsets(lengths_q, device)
    cu_k = _offsets(lengths_k, device)

    def randn(rows, heads=problem.H):
        return torch.randn((rows, heads, problem.D), generator=gen, device=device, dtype=problem.dtype)

    return [
        PackedBatch(q=randn(rows_q), k=randn(rows_k, problem.kv_heads), v=randn(rows_k, problem.kv_heads),
                    cu_q=cu_q, cu_k=cu_k,
                    max_q=int(lengths_q.max()) if lengths_q.numel() else 0,
                    max_k=int(lengths_k.max()) if lengths_k.numel() else 0,
                    lengths_q=lengths_q, lengths_k=lengths_k,
                    causal=problem.causal, broadcast_q=problem.broadcast_q, window=problem.window)
        for _ in range(n)
    ]


def launcher_inputs(problem: Problem, device="cuda") -> tuple[PackedBatch, dict]:
    """One input copy of ``problem`` and the keyword arguments a jfa launcher (``jagged_forward``,
    ``jagged_forward_tlx``) takes with it, for tools that call the kernels directly."""
    lengths_k = make_lengths(problem)
    batch = make_batches(problem, q_lengths(problem, lengths_k), lengths_k, 1, device)[0]
    kwargs = dict(causal=problem.causal, softmax_scale=problem.D ** -0.5, broadcast_q=problem.broadcast_q,
                  num_seqs=problem.B, len_q_bcast=problem.Lq or 0, window=problem.window)
    return batch, kwargs


def run_tlx_forward(batch: PackedBatch, kwargs: dict, **extra):
    """The TLX forward launcher (``jagged_forward_tlx``) on one batch of ``launcher_inputs`` with its keyword
    arguments ``kwargs`` and the launcher's ``extra`` ones, told the longest query sequence as the op tells it
    (the long-causal schedule rule reads it)."""
    from jfa.kernels.tlx.hopper import forward as tlx_forward_launcher

    return tlx_forward_launcher.jagged_forward_tlx(batch.q, batch.k, batch.v, batch.cu_q, batch.cu_k,
                                                   longest_q=batch.max_q, **kwargs, **extra)


# ---------------------------------------------------------------------------------------
# Correctness check
# ---------------------------------------------------------------------------------------

def _offsets_cpu(lengths: torch.Tensor) -> list[int]:
    return [0] + torch.cumsum(lengths, 0).tolist()


def check_indices(lengths_q: torch.Tensor, lengths_k: torch.Tensor, n: int = CHECK_SEQUENCES) -> list[int]:
    """Sequences to check: the most work, the least non-empty work, then random others."""
    work = lengths_q * lengths_k
    candidates = torch.nonzero(lengths_q > 0).flatten()
    if candidates.numel() == 0:
        return []
    picks = [int(torch.argmax(work))]
    nonempty = torch.nonzero(work > 0).flatten()
    if nonempty.numel():
        picks.append(int(nonempty[torch.argmin(work[nonempty])]))
    g = torch.Generator().manual_seed(0)
    perm = candidates[torch.randperm(candidates.numel(), generator=g)].tolist()
    for i in perm:
        if len(picks) >= n:
            break
        picks.append(i)
    return sorted(set(picks))


class ForwardCheck:
    """The oracle rule (``jfa.fuzz.rule``, the same one the tests and the gate apply) on a subsample of
    one problem's sequences (``check_indices``) and its first CHECK_HEADS query heads (at least one key/value
    head's group): every implementation's
    forward output is judged against the float64 oracle and the PyTorch reference in the inputs' dtype,
    both computed once per problem."""

    def __init__(self, batch: PackedBatch, indices: Sequence[int]):
        from jfa.fuzz.rule import OutputJudge

        group = batch.q.shape[1] // batch.k.shape[1]
        kv_heads = slice(0, min(max(1, CHECK_HEADS // group), batch.k.shape[1]))
        heads = slice(0, kv_heads.stop * group)  # the query heads of those key/value heads
        ok = _offsets_cpu(batch.lengths_k)
        oq = [b * batch.Lq for b in range(batch.B + 1)] if batch.broadcast_q else _offsets_cpu(batch.lengths_q)
        self.rows = torch.cat([torch.arange(oq[b], oq[b + 1]) for b in indices]) if indices else torch.zeros(0, dtype=torch.long)
        keys = torch.cat([torch.arange(ok[b], ok[b + 1]) for b in indices]) if indices else torch.zeros(0, dtype=torch.long)
        self.heads = heads
        device = batch.q.device
        k, v = batch.k[keys.to(device), kv_heads], batch.v[keys.to(device), kv_heads]
        cu_k = _offsets(torch.tensor([ok[b + 1] - ok[b] for b in indices], dtype=torch.int64), device)
        if batch.broadcast_q:
            q, cu_q = batch.q[:, heads], None
        else:
            q = batch.q[self.rows.to(device), heads]
            cu_q = _offsets(torch.tensor([oq[b + 1] - oq[b] for b in indices], dtype=torch.int64), device)
        self.judge = OutputJudge(q, k, v, cu_q, cu_k, causal=batch.causal, broadcast_q=batch.broadcast_q,
                                 window=batch.window)

    def __call__(self, out: torch.Tensor):
        """The verdict (``jfa.fuzz.rule.Verdict``) of ``out``, the packed output of the whole problem."""
        return self.judge(out[self.rows.to(out.device), self.heads])


# ---------------------------------------------------------------------------------------
# Timing and memory
# ---------------------------------------------------------------------------------------

def _rotating(fns: Sequence[Callable]) -> Callable:
    """One callable that calls ``fns`` in turn (one input copy per call)."""
    if len(fns) == 1:
        return fns[0]
    it = itertools.cycle(fns)
    return lambda: next(it)()


def time_ms(fn: Callable, warmup: int, rep: int) -> float:
    """Median milliseconds of ``fn`` with ``triton.testing.do_bench`` (which also flushes L2)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def output_grad(problem, q_rows: int, device, generator=None) -> torch.Tensor:
    """A random gradient of ``problem``'s output, [rows, H, D] in its dtype: a broadcast Q's B x Lq rows, else the
    batch's ``q_rows`` packed query rows."""
    rows = problem.B * problem.Lq if problem.broadcast_q else q_rows
    return torch.randn((rows, problem.H, problem.D), device=device, dtype=problem.dtype, generator=generator)


def profiled_calls(fn: Callable, calls: int, warmups: int = 1, host: bool = False):
    """torch.profiler's record of ``calls`` calls of ``fn`` after ``warmups`` unprofiled ones (compilation,
    caches), the GPU drained before and after; the device's activity only, or the host's too (``host``)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if host else [ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof


def llvm_the_other_way(kernel, llvm_o0: bool) -> dict:
    """Knob settings (for ``knobs.scope``) that compile the TLX ``kernel`` with LLVM's optimisation the other way
    from its config's ``llvm_o0``: optimised where the config leaves the IR to ptxas, and the other way round (the
    knob is part of the compile cache key: a build of its own beside the shipped one)."""
    return {"tlx_llvm_o0": "0" if llvm_o0 else kernel.fn.__name__}


def times_in_turns(columns: dict, rounds: int, warmup: int, rep: int) -> dict:
    """{name: [ms of each round]} of each callable in ``columns``, the columns taking turns ``rounds`` times
    (a drift of the clocks or of the machine hits every column alike)."""
    times = {name: [] for name in columns}
    for _ in range(rounds):
        for name, fn in columns.items():
            times[name].append(time_ms(fn, warmup, rep))
    return times


def _on_cuda(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


def peak_extra_mib(fn: Callable, device: torch.device) -> float | None:
    """Peak GPU memory that one call of ``fn`` allocates beyond what is already allocated, MiB.

    ``torch.cuda.reset_peak_memory_stats`` and ``max_memory_allocated`` around one untimed call,
    minus ``memory_allocated`` before it (the inputs, already there). Whatever ``fn`` returns is
    alive at the peak and counts. None unless ``device`` (the inputs') is a CUDA device.
    """
    if not _on_cuda(device):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return max(peak - base, 0) / 2**20


def host_us(fn: Callable, device: torch.device) -> float | None:
    """Host (CPU) microseconds of one call of ``fn``: the mean per call of the fastest of HOST_ROUNDS rounds
    of HOST_CALLS calls, each round issued while the GPU is still busy with a sleep kernel queued ahead of
    it, so the time is the caller's own (Python, allocations, launches), which a GPU waits on whenever its
    kernels are shorter. The fastest round, because what the host adds between calls (scheduling, other
    processes) only ever adds time: medians of single calls on the H200's host drifted up to 1.6x between
    runs of the same code (NOTES.md, session 18). A call that synchronises with the GPU waits for the
    sleep and shows it (milliseconds, not microseconds). None unless ``device`` is a CUDA device."""
    if not _on_cuda(device):
        return None
    fn()  # compiled and its caches filled: the steady state a training step sees
    best = float("inf")
    for _ in range(HOST_ROUNDS):
        torch.cuda.synchronize()
        torch.cuda._sleep(HOST_SLEEP_CYCLES)
        start = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        best = min(best, (time.perf_counter() - start) / HOST_CALLS)
    torch.cuda.synchronize()
    return best * 1e6


def _tflops(flop: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flop / (ms * 1e-3) / 1e12


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


# ---------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------

class Progress:
    """Progress of a suite: a tqdm bar when tqdm is installed, else one line per problem.

    The line is ``[i/n] <problem> done in X s (elapsed Y s, about Z s left)``. ``log`` prints
    a message without breaking the bar. tqdm is optional and never a dependency.
    """

    def __init__(self, total: int, enabled: bool = True, use_tqdm: bool | None = None, file=None):
        self.total, self.enabled, self.done = total, enabled, 0
        self.file = file
        self.t0 = time.perf_counter()
        self.bar = None
        if enabled and use_tqdm is not False:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, unit="problem", file=file or sys.stderr, dynamic_ncols=True)

    def log(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg, file=self.file or sys.stdout)
        else:
            print(msg, file=self.file or sys.stdout, flush=True)

    def start(self, name: str) -> None:
        if self.bar is not None:
            self.bar.set_description(name)

    def finish(self, name: str, seconds: float) -> str:
        """Count one finished problem; returns the progress line (printed without tqdm)."""
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        line = (f"[{self.done}/{self.total}] {name} done in {seconds:.1f} s "
                f"(elapsed {elapsed:.0f} s, about {left:.0f} s left)")
        if not self.enabled:
            return line
        if self.bar is not None:
            self.bar.set_postfix_str(f"last {seconds:.1f} s")
            self.bar.update(1)
        else:
            print(line, file=self.file or sys.stdout, flush=True)
        return line

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------
# One problem
# ---------------------------------------------------------------------------------------

def _row(suite: str, problem: Problem, impl: str, pass_: str, flop: float, **extra) -> dict:
    row = {
        "suite": suite, "problem": problem.name, "impl": impl, "pass": pass_,
        "status": "ok", "ms": None, "tflops": None, "ratio_vs_torch_varlen": None,
        "peak_mem_mib": None, "host_us": None, "tflop": flop / 1e12, "max_abs_err": None, "setup_ms": None,
        "ms_min": None, "ms_max": None, "repeats": 1,
        "note": "", "B": problem.B, "H": problem.H, "H_kv": problem.kv_heads, "D": problem.D,
        "window": list(problem.window), "causal": problem.causal,
        "broadcast_q": problem.broadcast_q, "max_len": problem.max_len, "sparsity": None,
    }
    row.update(extra)
    return row


def _bench_impl(impl: Impl, batches: list[PackedBatch], grad: torch.Tensor, passes, check,
                warmup: int, rep: int, repeats: int = 1) -> dict:
    """Check, time and measure one implementation.

    Returns {status, note, err, setup_ms, fwd_ms, fwd_bwd_ms, bwd_ms, fwd_mem, fwd_bwd_mem, fwd_host_us,
    fwd_bwd_host_us, bwd_status, runs}; fwd+bwd is timed (and measured) when "bwd" or "fwd_bwd" is
    asked for. With
    ``repeats`` > 1 the timings are taken that many times, fwd and fwd+bwd taking turns, and each
    ``*_ms`` is the median over the repeats (a repeat's bwd is its fwd+bwd minus its fwd); ``runs``
    holds every repeat's value per key (the spread between repeats: clocks and power move by several
    per cent within minutes on a lent GPU).
    """
    res = {"status": "ok", "note": "", "err": None, "setup_ms": None, "fwd_ms": None, "bwd_ms": None,
           "fwd_bwd_ms": None, "fwd_mem": None, "fwd_bwd_mem": None, "fwd_host_us": None,
           "fwd_bwd_host_us": None, "bwd_status": None,
           "runs": {"fwd_ms": [], "fwd_bwd_ms": [], "bwd_ms": []}}
    ok, why = impl.available()
    if not ok:
        res.update(status="skipped", note=why)
        return res
    b0 = batches[0]
    ok, why = impl.applies(b0.causal, b0.broadcast_q, b0.lengths_q, b0.lengths_k)
    if not ok:
        res.update(status="n/a", note=why)
        return res
    stage = "prepare"
    prepared: list[Prepared] | None = None
    try:
        prepared = [impl.prepare(b, grad) for b in batches]
        p0 = prepared[0]
        res["setup_ms"] = p0.setup_ms
        res["note"] = p0.note
        if p0.fwd is None:
            res.update(status="n/a", note="no forward")
            return res
        stage = "check"
        with torch.no_grad():
            out = p0.packed(p0.fwd())
            torch.cuda.synchronize()
            verdict = check(out) if check is not None else None
        del out
        if verdict is not None:
            res["err"] = verdict.error
            if not verdict.ok:
                res.update(status="wrong", note=f"fails the oracle rule: {verdict}")
                return res
        timed_bwd = "bwd" in passes or "fwd_bwd" in passes
        if timed_bwd and p0.fwd_bwd is None:
            res["bwd_status"] = "n/a"
            timed_bwd = False
        runs = res["runs"]
        for _ in range(repeats):
            stage = "fwd timing"
            with torch.no_grad():
                runs["fwd_ms"].append(time_ms(_rotating([p.fwd for p in prepared]), warmup, rep))
            if timed_bwd:
                stage = "fwd+bwd timing"
                runs["fwd_bwd_ms"].append(time_ms(_rotating([p.fwd_bwd for p in prepared]), warmup, rep))
                runs["bwd_ms"].append(max(runs["fwd_bwd_ms"][-1] - runs["fwd_ms"][-1], 0.0))
        for key, values in runs.items():
            res[key] = statistics.median(values) if values else None
        stage = "fwd memory"
        with torch.no_grad():
            res["fwd_mem"] = peak_extra_mib(p0.fwd, b0.q.device)
        if timed_bwd:
            stage = "fwd+bwd memory"
            res["fwd_bwd_mem"] = peak_extra_mib(p0.fwd_bwd, b0.q.device)
        stage = "host time"
        with torch.no_grad():
            res["fwd_host_us"] = host_us(p0.fwd, b0.q.device)
        if timed_bwd:
            res["fwd_bwd_host_us"] = host_us(p0.fwd_bwd, b0.q.device)
    except NotApplicable as e:
        res.update(status="n/a", note=str(e))
    except Exception as e:  # noqa: BLE001 - one implementation failing must not stop the suite
        status = "skipped" if impl.name in OPTIONAL_IMPLS else "error"
        res.update(status=status, note=f"{stage}: {_short(e)}")
    finally:
        prepared = None
        impl.clear_cache()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return res


def bench_problem(suite: str, problem: Problem, impls: Sequence[Impl], passes=PASSES, check=True,
                  warmup: int = 25, rep: int = 100, log: Callable[[str], None] | None = None,
                  repeats: int = 1) -> list[dict]:
    """All result rows (one per impl and pass) of one problem on the current CUDA device; with
    ``repeats`` > 1 each time is the median of that many (``ms_min``, ``ms_max``: their range)."""
    device = torch.device("cuda", torch.cuda.current_device())
    lengths_k = make_lengths(problem)
    lengths_q = q_lengths(problem, lengths_k)
    flop = {p: flops(problem, lengths_q, lengths_k, p) for p in PASSES}
    sparsity = 1 - float(lengths_k.float().mean()) / problem.max_len if problem.max_len else None

    l2 = max(L2_BYTES, getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    free, _ = torch.cuda.mem_get_info(device)
    n = num_copies(_bytes_per_copy(problem, lengths_q, lengths_k), l2, free)
    batches = make_batches(problem, lengths_q, lengths_k, n, device)
    grad = output_grad(problem, int(lengths_q.sum()), device, torch.Generator(device=device).manual_seed(7))
    out_rows = grad.shape[0]
    checker = ForwardCheck(batches[0], check_indices(lengths_q, lengths_k)) if check else None

    rows = []
    for impl in impls:
        precision = getattr(impl, "precision", "auto")
        r = _bench_impl(impl, batches, grad, passes, checker if precision == "auto" else None, warmup, rep, repeats)
        for pass_ in passes:
            ms = {"fwd": r["fwd_ms"], "bwd": r["bwd_ms"], "fwd_bwd": r["fwd_bwd_ms"]}[pass_]
            mem = r["fwd_mem"] if pass_ == "fwd" else r["fwd_bwd_mem"]
            host = r["fwd_host_us"] if pass_ == "fwd" else r["fwd_bwd_host_us"]  # bwd: fwd+bwd's, as memory
            status = r["status"]
            if pass_ != "fwd" and status == "ok" and r["bwd_status"]:
                status = r["bwd_status"]
            runs = r["runs"][f"{pass_}_ms"] if status == "ok" else []
            row = _row(suite, problem, impl.name, pass_, flop[pass_], status=status, ms=ms,
                       ms_min=min(runs) if runs else None, ms_max=max(runs) if runs else None,
                       repeats=repeats,
                       tflops=_tflops(flop[pass_], ms) if status == "ok" else None,
                       peak_mem_mib=mem if status == "ok" else None,
                       host_us=host if status == "ok" else None,
                       max_abs_err=r["err"], setup_ms=r["setup_ms"], note=r["note"], n_copies=n,
                       total_q=out_rows, total_k=int(lengths_k.sum()), sparsity=sparsity,
                       precision=str(problem.dtype).removeprefix("torch.") if precision == "auto" else precision)
            rows.append(row)
            if log:
                log(format_table([row], header=False))
    _add_ratios(rows)
    del batches, grad
    torch.cuda.empty_cache()
    return rows


_add_ratios = add_ratios


# ---------------------------------------------------------------------------------------
# Suite
# ---------------------------------------------------------------------------------------

def _meta(warmup: int, rep: int, repeats: int = 1) -> dict:
    import triton

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": props.name,
        "sm": f"{props.major}{props.minor}",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timing": f"triton do_bench median, warmup {warmup} ms, rep {rep} ms"
                  + (f"; each time the median of {repeats} repeats, fwd and fwd+bwd taking turns"
                     if repeats > 1 else ""),
    }


def benchmarks_files_dir(benchmarks_path: str) -> str:
    """Where a run with ``--write-benchmarks PATH`` and no ``--out`` puts its files: PATH's stem + -files."""
    stem = os.path.splitext(os.path.abspath(benchmarks_path))[0]
    return stem + "-files"


def write_reports(suite: str, results: list[dict], meta: dict, out_dir: str | None = None,
                  benchmarks_path: str | None = None, command: str = "", plots: bool = True,
                  log: Callable[[str], None] = print, earlier: Sequence[Section] = ()) -> dict:
    """Write one suite's JSON/markdown/CSV/PNG to ``out_dir`` and, if asked, a BENCHMARKS.md-style
    file holding the sections ``earlier`` (suites of this run already written) and then this suite,
    under one header made from ``meta`` (this suite's, so the latest date).

    With ``benchmarks_path`` and no ``out_dir`` the files go to :func:`benchmarks_files_dir`.
    Returns the paths written ({"json", "md", "csv", "png", "benchmarks"} as applicable).
    """
    if benchmarks_path and not out_dir:
        out_dir = benchmarks_files_dir(benchmarks_path)
    paths: dict = {}
    if out_dir:
        paths = write_outputs(out_dir, suite, results, meta, plots=plots, log=log)
    if benchmarks_path:
        sections = [*earlier, (suite, results, paths.get("png", []))]
        paths["benchmarks"] = write_benchmarks(benchmarks_path, sections, meta, command)
    return paths


def suite_names(suite_name: str) -> list[str]:
    """The suites ``suite_name`` stands for: every suite of ``SUITES`` in its order for ``ALL`` (but the
    ``LAB_SUITES``), else ``[suite_name]``; a ``ValueError`` for an unknown name."""
    if suite_name == ALL:
        return [name for name in SUITES if name not in LAB_SUITES]
    get_suite(suite_name)
    return [suite_name]


def plan(suite_name: str, problems: Sequence[str] | None = None) -> list[tuple[str, list[Problem]]]:
    """(suite, its problems) for each suite a run of ``suite_name`` covers, in running order.

    ``problems`` keeps only problems whose name contains one of the given substrings; under
    ``ALL`` a suite left without problems is dropped (a single suite is kept, even empty).
    """
    runs = [(name, [p for p in get_suite(name) if not problems or any(s in p.name for s in problems)])
            for name in suite_names(suite_name)]
    return [(name, ps) for name, ps in runs if ps or suite_name != ALL]


def run_suite(suite_name: str, impls: Sequence[str | Impl] = ("jfa-triton", BASELINE),
              passes: Sequence[str] = PASSES, out_dir: str | None = None, check: bool = True,
              warmup: int = 25, rep: int = 100, problems: Sequence[str] | None = None,
              verbose: bool = True, benchmarks_path: str | None = None, command: str = "",
              plots: bool = True, repeats: int = 1) -> list[dict]:
    """Benchmark every problem of a suite (or of every suite, in turn, for ``ALL``) with every
    implementation; needs a CUDA GPU.

    ``impls`` are names from ``IMPLS`` or adapter objects; ``problems`` optionally keeps
    only problems whose name contains one of the given substrings (see :func:`plan`). Returns
    the result rows of all suites; prints progress (one line per finished problem over all
    suites, or a tqdm bar) and each suite's table when it finishes. As each suite finishes,
    its JSON, markdown, CSV and PNG plots go to ``out_dir`` if given, and the BENCHMARKS.md-style
    file at ``benchmarks_path``, if given, is rewritten with every suite finished so far
    (``command`` is the command line it quotes). ``repeats``: each time is the median of that many
    (``bench_problem``).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not torch.cuda.is_available():
        raise RuntimeError("jfa bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    bad = [p for p in passes if p not in PASSES]
    if bad:
        raise ValueError(f"unknown pass {bad}; known: {PASSES}")
    adapters = [get_impl(i) if isinstance(i, str) else i for i in impls]
    runs = plan(suite_name, problems)
    progress = Progress(sum(len(selected) for _, selected in runs), enabled=verbose)
    results: list[dict] = []
    done: list[Section] = []
    try:
        for name, selected in runs:
            if len(runs) > 1:
                progress.log(f"## suite {name}: {len(selected)} problem{'s' if len(selected) != 1 else ''}")
            rows = []
            for problem in selected:
                progress.start(problem.name)
                progress.log(f"# {problem.name}")
                t0 = time.perf_counter()
                rows += bench_problem(name, problem, adapters, passes, check, warmup, rep,
                                      progress.log if verbose else None, repeats=repeats)
                progress.finish(problem.name, time.perf_counter() - t0)
            results += rows
            progress.log("\n" + format_table(rows))
            paths = write_reports(name, rows, _meta(warmup, rep, repeats), out_dir, benchmarks_path, command,
                                  plots, progress.log, done)
            done.append((name, rows, paths.get("png", [])))
            if paths:
                flat = [p for v in paths.values() for p in (v if isinstance(v, list) else [v])]
                progress.log("wrote " + ", ".join(flat))
    finally:
        progress.close()
    return results


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def dry_run(suite_name: str, impl_names: Sequence[str], passes: Sequence[str] = PASSES,
            file=None, problems: Sequence[str] | None = None) -> None:
    """Print, per suite a run would cover (:func:`plan`), its problems (shape, tokens, TFLOP per
    pass); then, once, the impls with their availability and the problems they do not apply to."""
    file = file or sys.stdout
    head = ["problem", "B", "H", "D", "causal", "bcast Lq", "total q", "total k", "sparsity"] + \
           [f"{x} TFLOP" for x in passes]
    shapes = []
    for i, (name, selected) in enumerate(plan(suite_name, problems)):
        rows = []
        for p in selected:
            lk = make_lengths(p)
            lq = q_lengths(p, lk)
            shapes.append((p, lq, lk))
            total_q = p.B * p.Lq if p.broadcast_q else int(lq.sum())
            sparsity = 1 - float(lk.float().mean()) / p.max_len
            rows.append([p.name, str(p.B), str(p.H), str(p.D), "y" if p.causal else "n",
                         str(p.Lq) if p.broadcast_q else "-", str(total_q), str(int(lk.sum())),
                         f"{sparsity:.2f}"] + [f"{flops(p, lq, lk, x) / 1e12:.3f}" for x in passes])
        if i:
            print(file=file)
        print(f"suite {name}: {len(rows)} problem{'s' if len(rows) != 1 else ''}", file=file)
        print(_columns(head, rows), file=file)
    print("\nimpls:", file=file)
    for name in impl_names:
        impl = get_impl(name)
        ok, why = impl.available()
        print(f"  {name}: {'available' if ok else 'unavailable: ' + why}", file=file)
        reasons: dict[str, list[str]] = {}
        for p, lq, lk in shapes:
            applies, reason = impl.applies(p.causal, p.broadcast_q, lq, lk)
            if not applies:
                reasons.setdefault(reason, []).append(p.name)
        for reason, names in reasons.items():
            print(f"    n/a for {', '.join(names)}: {reason}", file=file)


def command_line(argv: Sequence[str] | None) -> str:
    """The command line of this run, as typed where it can be recovered from ``sys.orig_argv``.

    ``python -m jfa.bench ...`` and ``jfa bench ...`` come back as typed (interpreter and script
    by basename); when ``argv`` was passed programmatically, ``jfa bench <argv>``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    orig = list(getattr(sys, "orig_argv", None) or [])
    if orig and (not args or orig[-len(args):] == args):
        prefix = orig[: len(orig) - len(args)]
        if len(prefix) >= 3 and prefix[1] == "-m":
            head = [os.path.basename(prefix[0]), "-m", *prefix[2:]]
            return shlex.join(head + args)
        if len(prefix) >= 2 and os.path.basename(prefix[1]) == "jfa":
            return shlex.join(["jfa", *prefix[2:]] + args)
    return shlex.join(["jfa", "bench"] + args)


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _positive_int(s: str) -> int:
    try:
        value = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="jfa bench", description="Benchmark jagged attention implementations.")
    ap.add_argument("--suite", default="gem", choices=[*SUITES, ALL],
                    help=f"suite to run; {ALL}: {', '.join(SUITES)} in turn, with the same options")
    ap.add_argument("--impls", default=",".join(IMPLS), type=_csv,
                    help=f"comma-separated, from: {', '.join(IMPLS)} (default: all)")
    ap.add_argument("--pass", dest="passes", default=",".join(PASSES), type=_csv,
                    help=f"comma-separated, from: {', '.join(PASSES)} (default: all; bwd = fwd_bwd - fwd)")
    ap.add_argument("--problems", default=None, type=_csv,
                    help="keep only problems whose name contains one of these substrings")
    ap.add_argument("--out", default=None,
                    help="directory for <suite>.json, .md, .csv and the PNG plots (every suite's, "
                         f"with --suite {ALL})")
    ap.add_argument("--write-benchmarks", dest="write_benchmarks", default=None, metavar="PATH",
                    help="also write a BENCHMARKS.md-style file of this run to PATH (date, GPU, "
                         "versions, command line, then per suite its tables and links to its PNGs; "
                         "files go to --out, "
                         "default PATH's stem + '-files'; ignored with --dry-run)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    ap.add_argument("--repeats", type=_positive_int, default=1,
                    help="time each problem this many times (fwd and fwd+bwd taking turns) and report the "
                         "median, with the range in the JSON/CSV (ms_min, ms_max)")
    ap.add_argument("--no-check", action="store_true", help="skip the reference check")
    ap.add_argument("--dry-run", action="store_true", help="list problems and impls; no GPU needed")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``jfa bench``; returns the process exit status."""
    ap = build_parser()
    args = ap.parse_args(argv)
    for name in args.impls:
        if name not in IMPLS:
            ap.error(f"unknown impl {name!r}; known: {', '.join(IMPLS)}")
    for p in args.passes:
        if p not in PASSES:
            ap.error(f"unknown pass {p!r}; known: {', '.join(PASSES)}")
    if args.dry_run:
        dry_run(args.suite, args.impls, args.passes, problems=args.problems)
        return 0
    if not torch.cuda.is_available():
        print("error: jfa bench needs a CUDA GPU (torch.cuda.is_available() is False); "
              "use --dry-run to list the problems without one", file=sys.stderr)
        return 2
    results = run_suite(args.suite, args.impls, args.passes, args.out, check=not args.no_check,
                        warmup=args.warmup, rep=args.rep, problems=args.problems,
                        benchmarks_path=args.write_benchmarks, command=command_line(argv),
                        plots=not args.no_plots, repeats=args.repeats)
    return 1 if any(r["status"] in ("wrong", "error") for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
