"""Run a benchmark suite: build inputs, check each implementation, time it, report.

Usage (also the body of the future ``jfa bench`` command)::

    python -m jfa.bench --suite gem --impls jfa-triton,torch-varlen --pass fwd,bwd --out DIR
    python -m jfa.bench --suite gem --dry-run        # list problems and impls, no GPU needed

Per problem: bf16 packed Q/K/V with fresh normal data on the GPU, in as many copies as it
takes to exceed 2x the L2 cache (memory permitting), rotated between calls; every
implementation's forward output is compared with a float32 PyTorch reference on a subsample
of sequences before it is timed (``wrong`` and not timed above 5e-2 absolute); times are
``triton.testing.do_bench`` medians; backward = (forward + backward) - forward.
Nothing touches CUDA at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import os
import sys
import zlib
from typing import Callable, Iterable, Sequence

import torch

from .impls import BASELINE, IMPLS, Impl, PackedBatch, Prepared, get_impl
from .suites import SUITES, Problem, flops, get_suite, make_lengths, q_lengths

__all__ = [
    "run_suite",
    "bench_problem",
    "reference_forward_rows",
    "check_forward",
    "format_table",
    "markdown_report",
    "dry_run",
    "main",
    "L2_BYTES",
    "ATOL",
]

#: L2 cache size assumed when the device does not report a larger one (H200: 60 MB class).
L2_BYTES = 60 * 2**20
#: Absolute forward tolerance against the float32 reference for bf16/fp16 inputs.
ATOL = 5e-2
#: Most input copies kept alive at once, and the share of free memory they may take.
MAX_COPIES = 64
COPY_MEMORY_FRACTION = 0.25
#: Sequences per problem checked against the reference.
CHECK_SEQUENCES = 6
#: Implementations whose failures are reported as "skipped" rather than "error".
OPTIONAL_IMPLS = ("jfa-tlx", "flex-docmask")
PASSES = ("fwd", "bwd")


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------

def _cu(lengths: torch.Tensor, device) -> torch.Tensor:
    """int32 offsets ``[0, L0, L0+L1, ...]`` on ``device``."""
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lengths, 0)
    return cu.to(device=device, dtype=torch.int32)


def _bytes_per_copy(problem: Problem, lengths_q: torch.Tensor, lengths_k: torch.Tensor) -> int:
    rows_q = problem.Lq if problem.broadcast_q else int(lengths_q.sum())
    rows = rows_q + 2 * int(lengths_k.sum())
    return rows * problem.H * problem.D * torch.empty((), dtype=problem.dtype).element_size()


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
    cu_q = None if problem.broadcast_q else _cu(lengths_q, device)
    cu_k = _cu(lengths_k, device)

    def randn(rows):
        return torch.randn((rows, problem.H, problem.D), generator=gen, device=device, dtype=problem.dtype)

    return [
        PackedBatch(q=randn(rows_q), k=randn(rows_k), v=randn(rows_k), cu_q=cu_q, cu_k=cu_k,
                    max_q=int(lengths_q.max()) if lengths_q.numel() else 0,
                    max_k=int(lengths_k.max()) if lengths_k.numel() else 0,
                    lengths_q=lengths_q, lengths_k=lengths_k,
                    causal=problem.causal, broadcast_q=problem.broadcast_q)
        for _ in range(n)
    ]


# ---------------------------------------------------------------------------------------
# Correctness check
# ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _no_tf32():
    """float32 matmuls in IEEE precision while the reference runs."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _attention_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    head_chunk_bytes: int = 2**29) -> torch.Tensor:
    """Exact softmax attention of one sequence in float32: ``[Lq,H,D] x [Lk,H,D] -> [Lq,H,D]``.

    Causal is bottom-right aligned; rows that see no key are 0. Heads are processed in
    chunks so the score matrix stays below ``head_chunk_bytes``.
    """
    q, k, v = q.float(), k.float(), v.float()
    lq, h, d = q.shape
    lk = k.shape[0]
    out = torch.zeros((lq, h, d), dtype=torch.float32, device=q.device)
    if lq == 0 or lk == 0:
        return out
    scale = 1.0 / math.sqrt(d)
    mask = None
    if causal:
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        mask = j <= i + (lk - lq)
    step = max(1, head_chunk_bytes // (4 * lq * lk))
    for h0 in range(0, h, step):
        hs = slice(h0, h0 + step)
        s = torch.einsum("qhd,khd->hqk", q[:, hs], k[:, hs]) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        if mask is not None:
            p = torch.where(mask.any(dim=-1, keepdim=True), p, torch.zeros_like(p))
        out[:, hs] = torch.einsum("hqk,khd->qhd", p, v[:, hs])
    return out


def _offsets_cpu(lengths: torch.Tensor) -> list[int]:
    return [0] + torch.cumsum(lengths, 0).tolist()


def reference_forward_rows(batch: PackedBatch, b: int) -> tuple[slice, torch.Tensor]:
    """(rows of the packed output, float32 reference output) for sequence ``b`` of ``batch``."""
    ok = _offsets_cpu(batch.lengths_k)
    k = batch.k[ok[b]:ok[b + 1]]
    v = batch.v[ok[b]:ok[b + 1]]
    if batch.broadcast_q:
        rows = slice(b * batch.Lq, (b + 1) * batch.Lq)
        q = batch.q
    else:
        oq = _offsets_cpu(batch.lengths_q)
        rows = slice(oq[b], oq[b + 1])
        q = batch.q[rows]
    return rows, _attention_fp32(q, k, v, batch.causal)


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


def check_forward(out: torch.Tensor, batch: PackedBatch, indices: Iterable[int]) -> float:
    """Max absolute error of ``out`` (packed) against the float32 reference on ``indices``.

    Non-finite values count as an infinite error.
    """
    err = 0.0
    with _no_tf32():
        for b in indices:
            rows, ref = reference_forward_rows(batch, b)
            got = out[rows].float()
            if got.numel() == 0:
                continue
            if not torch.isfinite(got).all():
                return math.inf
            err = max(err, float((got - ref).abs().max()))
    return err


# ---------------------------------------------------------------------------------------
# Timing
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


def _tflops(flop: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flop / (ms * 1e-3) / 1e12


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


# ---------------------------------------------------------------------------------------
# One problem
# ---------------------------------------------------------------------------------------

def _row(suite: str, problem: Problem, impl: str, pass_: str, flop: float, **extra) -> dict:
    row = {
        "suite": suite, "problem": problem.name, "impl": impl, "pass": pass_,
        "status": "ok", "ms": None, "tflops": None, "ratio_vs_torch_varlen": None,
        "tflop": flop / 1e12, "max_abs_err": None, "setup_ms": None, "note": "",
        "B": problem.B, "H": problem.H, "D": problem.D, "causal": problem.causal,
        "broadcast_q": problem.broadcast_q,
    }
    row.update(extra)
    return row


def _bench_impl(impl: Impl, batches: list[PackedBatch], grad: torch.Tensor, passes, check_idx,
                warmup: int, rep: int) -> dict:
    """Check then time one implementation. Returns {status, note, err, setup_ms, fwd_ms, bwd_ms}."""
    res = {"status": "ok", "note": "", "err": None, "setup_ms": None, "fwd_ms": None, "bwd_ms": None,
           "bwd_status": None}
    ok, why = impl.available()
    if not ok:
        res.update(status="skipped", note=why)
        return res
    stage = "prepare"
    try:
        prepared: list[Prepared] = [impl.prepare(b, grad) for b in batches]
        p0 = prepared[0]
        res["setup_ms"] = p0.setup_ms
        res["note"] = p0.note
        if p0.fwd is None:
            res.update(status="n/a", note="no forward")
            return res
        stage = "check"
        with torch.no_grad():
            out = p0.fwd()
            torch.cuda.synchronize()
            if check_idx is not None:
                res["err"] = check_forward(out, batches[0], check_idx)
        del out
        if res["err"] is not None and not res["err"] <= ATOL:
            res.update(status="wrong", note=f"max abs err {res['err']:.3g} > {ATOL}")
            return res
        stage = "fwd timing"
        with torch.no_grad():
            res["fwd_ms"] = time_ms(_rotating([p.fwd for p in prepared]), warmup, rep)
        if "bwd" in passes:
            if p0.fwd_bwd is None:
                res["bwd_status"] = "n/a"
            else:
                stage = "fwd+bwd timing"
                total = time_ms(_rotating([p.fwd_bwd for p in prepared]), warmup, rep)
                res["bwd_ms"] = max(total - res["fwd_ms"], 0.0)
    except Exception as e:  # noqa: BLE001 - one implementation failing must not stop the suite
        status = "skipped" if impl.name in OPTIONAL_IMPLS else "error"
        res.update(status=status, note=f"{stage}: {_short(e)}")
    finally:
        prepared = None
        impl.clear_cache()
        torch.cuda.empty_cache()
    return res


def bench_problem(suite: str, problem: Problem, impls: Sequence[Impl], passes=PASSES, check=True,
                  warmup: int = 25, rep: int = 100, log: Callable[[str], None] | None = None) -> list[dict]:
    """All result rows (one per impl and pass) of one problem on the current CUDA device."""
    device = torch.device("cuda", torch.cuda.current_device())
    lengths_k = make_lengths(problem)
    lengths_q = q_lengths(problem, lengths_k)
    flop = {p: flops(problem, lengths_q, lengths_k, p) for p in PASSES}

    l2 = max(L2_BYTES, getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    free, _ = torch.cuda.mem_get_info(device)
    n = num_copies(_bytes_per_copy(problem, lengths_q, lengths_k), l2, free)
    batches = make_batches(problem, lengths_q, lengths_k, n, device)
    out_rows = problem.B * problem.Lq if problem.broadcast_q else int(lengths_q.sum())
    grad = torch.randn((out_rows, problem.H, problem.D), device=device, dtype=problem.dtype,
                       generator=torch.Generator(device=device).manual_seed(7))
    check_idx = check_indices(lengths_q, lengths_k) if check else None

    rows = []
    for impl in impls:
        r = _bench_impl(impl, batches, grad, passes, check_idx, warmup, rep)
        for pass_ in passes:
            ms = r["fwd_ms"] if pass_ == "fwd" else r["bwd_ms"]
            status = r["status"]
            if pass_ == "bwd" and status == "ok" and r["bwd_status"]:
                status = r["bwd_status"]
            row = _row(suite, problem, impl.name, pass_, flop[pass_], status=status, ms=ms,
                       tflops=_tflops(flop[pass_], ms) if status == "ok" else None,
                       max_abs_err=r["err"], setup_ms=r["setup_ms"], note=r["note"], n_copies=n,
                       total_q=out_rows, total_k=int(lengths_k.sum()))
            rows.append(row)
            if log:
                log(format_table([row], header=False))
    _add_ratios(rows)
    del batches, grad
    torch.cuda.empty_cache()
    return rows


def _add_ratios(rows: list[dict]) -> None:
    """Fill ``ratio_vs_torch_varlen`` (TFLOP/s over the baseline's, same problem and pass)."""
    base = {(r["problem"], r["pass"]): r["tflops"] for r in rows
            if r["impl"] == BASELINE and r["tflops"]}
    for r in rows:
        b = base.get((r["problem"], r["pass"]))
        if b and r["tflops"]:
            r["ratio_vs_torch_varlen"] = r["tflops"] / b


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------

def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _columns(header: Sequence[str], rows: Sequence[Sequence[str]], show_header=True) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [line(header), line(["-" * w for w in widths])] if show_header else []
    return "\n".join(lines + [line(r) for r in rows])


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def format_table(results: Sequence[dict], header: bool = True) -> str:
    """Plain-text table of result rows, one line per (problem, impl, pass)."""
    head = ["problem", "impl", "pass", "status", "ms", "TFLOP/s", "vs varlen", "err", "note"]
    body = [[r["problem"], r["impl"], r["pass"], r["status"], _fmt(r["ms"], ".3f"),
             _fmt(r["tflops"], ".1f"), _fmt(r["ratio_vs_torch_varlen"], ".2f") + ("x" if r["ratio_vs_torch_varlen"] else ""),
             _fmt(r["max_abs_err"], ".1e"), _clip(r["note"], 90)] for r in results]
    return _columns(head, body, show_header=header)


def _cell(results: Sequence[dict], problem: str, impl: str, key: str, spec: str, passes) -> str:
    parts = []
    for pass_ in passes:
        r = next((x for x in results if x["problem"] == problem and x["impl"] == impl and x["pass"] == pass_), None)
        if r is None:
            parts.append("")
        elif r["status"] != "ok":
            parts.append(r["status"])
        else:
            parts.append(_fmt(r[key], spec))
    return " / ".join(parts)


def markdown_report(results: Sequence[dict], meta: dict | None = None) -> str:
    """Markdown: TFLOP/s and ratio-to-torch-varlen tables (cells ``fwd / bwd``), then notes."""
    problems = list(dict.fromkeys(r["problem"] for r in results))
    impls = list(dict.fromkeys(r["impl"] for r in results))
    passes = [p for p in PASSES if any(r["pass"] == p for r in results)]
    out = []
    if meta:
        out.append("Run: " + ", ".join(f"{k} {v}" for k, v in meta.items()) + "\n")
    for title, key, spec in (("TFLOP/s", "tflops", ".0f"), (f"ratio to {BASELINE}", "ratio_vs_torch_varlen", ".2f")):
        out.append(f"{title}, {' / '.join(passes)}:\n")
        out.append("| shape | " + " | ".join(impls) + " |")
        out.append("|---" * (len(impls) + 1) + "|")
        for p in problems:
            out.append(f"| {p} | " + " | ".join(_cell(results, p, i, key, spec, passes) for i in impls) + " |")
        out.append("")
    notes = sorted({f"{r['impl']} on {r['problem']}: {r['status']}: {r['note']}"
                    for r in results if r["status"] != "ok" and r["note"]})
    setups = sorted({f"{r['impl']} on {r['problem']}: set-up {r['setup_ms']:.1f} ms (not timed)"
                     for r in results if r["setup_ms"] is not None})
    if notes or setups:
        out.append("Notes:\n")
        out.extend(f"- {n}" for n in notes + setups)
        out.append("")
    return "\n".join(out)


def _meta(warmup: int, rep: int) -> dict:
    import triton

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": props.name,
        "sm": f"{props.major}{props.minor}",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timing": f"triton do_bench median, warmup {warmup} ms, rep {rep} ms",
    }


def write_outputs(out_dir: str, suite: str, results: list[dict], meta: dict) -> tuple[str, str]:
    """``<out_dir>/<suite>.json`` and ``<out_dir>/<suite>.md``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{suite}.json")
    md_path = os.path.join(out_dir, f"{suite}.md")
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(md_path, "w") as f:
        f.write(f"## Suite {suite}\n\n" + markdown_report(results, meta))
    return json_path, md_path


def run_suite(suite_name: str, impls: Sequence[str | Impl] = ("jfa-triton", BASELINE),
              passes: Sequence[str] = PASSES, out_dir: str | None = None, check: bool = True,
              warmup: int = 25, rep: int = 100, problems: Sequence[str] | None = None,
              verbose: bool = True) -> list[dict]:
    """Benchmark every problem of a suite with every implementation; needs a CUDA GPU.

    ``impls`` are names from ``IMPLS`` or adapter objects; ``problems`` optionally keeps
    only problems whose name contains one of the given substrings. Returns the result
    rows; writes JSON and markdown to ``out_dir`` if given and prints a table.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("jfa bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    bad = [p for p in passes if p not in PASSES]
    if bad:
        raise ValueError(f"unknown pass {bad}; known: {PASSES}")
    adapters = [get_impl(i) if isinstance(i, str) else i for i in impls]
    selected = [p for p in get_suite(suite_name) if not problems or any(s in p.name for s in problems)]
    log = (lambda s: print(s, flush=True)) if verbose else None
    results = []
    for problem in selected:
        if log:
            log(f"# {problem.name}")
        results += bench_problem(suite_name, problem, adapters, passes, check, warmup, rep, log)
    meta = _meta(warmup, rep)
    if verbose:
        print("\n" + format_table(results), flush=True)
    if out_dir:
        paths = write_outputs(out_dir, suite_name, results, meta)
        if verbose:
            print("wrote " + ", ".join(paths), flush=True)
    return results


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def dry_run(suite_name: str, impl_names: Sequence[str], passes: Sequence[str] = PASSES,
            file=None) -> None:
    """Print the problems (shape, tokens, TFLOP per pass) and the impls with their availability."""
    file = file or sys.stdout
    rows = []
    for p in get_suite(suite_name):
        lk = make_lengths(p)
        lq = q_lengths(p, lk)
        total_q = p.B * p.Lq if p.broadcast_q else int(lq.sum())
        sparsity = 1 - float(lk.float().mean()) / p.max_len
        rows.append([p.name, str(p.B), str(p.H), str(p.D), "y" if p.causal else "n",
                     str(p.Lq) if p.broadcast_q else "-", str(total_q), str(int(lk.sum())),
                     f"{sparsity:.2f}"] + [f"{flops(p, lq, lk, x) / 1e12:.3f}" for x in passes])
    head = ["problem", "B", "H", "D", "causal", "bcast Lq", "total q", "total k", "sparsity"] + \
           [f"{x} TFLOP" for x in passes]
    print(f"suite {suite_name}: {len(rows)} problems", file=file)
    print(_columns(head, rows), file=file)
    print("\nimpls:", file=file)
    for name in impl_names:
        ok, why = get_impl(name).available()
        print(f"  {name}: {'available' if ok else 'unavailable: ' + why}", file=file)


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="jfa bench", description="Benchmark jagged attention implementations.")
    ap.add_argument("--suite", default="gem", choices=sorted(SUITES))
    ap.add_argument("--impls", default=",".join(IMPLS), type=_csv,
                    help=f"comma-separated, from: {', '.join(IMPLS)} (default: all)")
    ap.add_argument("--pass", dest="passes", default="fwd,bwd", type=_csv, help="fwd,bwd")
    ap.add_argument("--problems", default=None, type=_csv,
                    help="keep only problems whose name contains one of these substrings")
    ap.add_argument("--out", default=None, help="directory for <suite>.json and <suite>.md")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
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
        dry_run(args.suite, args.impls, args.passes)
        return 0
    if not torch.cuda.is_available():
        print("error: jfa bench needs a CUDA GPU (torch.cuda.is_available() is False); "
              "use --dry-run to list the problems without one", file=sys.stderr)
        return 2
    results = run_suite(args.suite, args.impls, args.passes, args.out, check=not args.no_check,
                        warmup=args.warmup, rep=args.rep, problems=args.problems)
    return 1 if any(r["status"] in ("wrong", "error") for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
