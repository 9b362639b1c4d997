"""First-GPU-run harness for the TLX Hopper forward (it has only been compiled offline so far).

    python -m jfa.kernels.tlx.hopper.gpu_check smoke        # one tiny launch: does it run, finish, agree
    python -m jfa.kernels.tlx.hopper.gpu_check correctness  # the case suite, judged by the project's rule
    python -m jfa.kernels.tlx.hopper.gpu_check bench        # gem suite: TLX vs portable forward, TFLOP/s

Run each under ``timeout`` (a pipeline bug shows up as a hang: mbarrier phases or the pingpong
handshake out of step); every line is flushed before the next launch, so the last line printed names
the case that hung.

``correctness`` judges through :func:`jfa.testing.run_case` (NaN-poisoned outputs, float64 oracle, the
``2 * |ref_t - oracle| + floor`` rule) with the TLX forward standing in for the portable one: the API
is not wired to this kernel, so the harness swaps ``jfa.kernels.triton.forward.jagged_forward`` (the
name ``jfa.api`` looks up at each call) for the duration and checks that the TLX launcher really ran.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

from jfa.kernels.tlx.hopper import forward as tlx_forward


def _say(*parts) -> None:
    print(*parts, flush=True)


@contextlib.contextmanager
def tlx_forward_in_place_of_portable():
    """Route the API's forward to the TLX launcher; yields a counter of TLX launches."""
    import jfa.kernels.triton.forward as portable

    calls = {"n": 0}
    saved = portable.jagged_forward

    def forward(*args, **kwargs):
        calls["n"] += 1
        return tlx_forward.jagged_forward_tlx(*args, **kwargs)

    portable.jagged_forward = forward
    try:
        yield calls
    finally:
        portable.jagged_forward = saved


def cases() -> list:
    """The catalogue's structural cases for every supported dtype and head dim, plus the TLX tile
    edges (per consumer, per work item, per key block), many work items per CTA (ring and phase
    wrap-around, the persistent stride), and the value recipes that stress the softmax."""
    from jfa.fuzz.catalog import structural_cases, tail_lengths
    from jfa.testing import Case, replace

    out = []
    for dtype in ("bf16", "fp16"):
        for head_dim in tlx_forward.SUPPORTED_HEAD_DIMS:
            out += structural_cases(dtype, head_dim)
            cfg = tlx_forward.config_for(head_dim)
            base = Case((), (), head_dim=head_dim, dtype=dtype)
            for block in sorted({cfg.block_m, tlx_forward.NUM_CONSUMERS * cfg.block_m, cfg.block_n,
                                 2 * cfg.block_n}):
                lens = tail_lengths(block)
                out.append(replace(base, lengths_q=lens, lengths_k=lens, name=f"tlx-tails-{block}-{dtype}-D{head_dim}"))
                out.append(replace(base, lengths_q=lens, lengths_k=lens[::-1], causal=True,
                                   name=f"tlx-tails-{block}-causal-{dtype}-D{head_dim}"))
            g = torch.Generator().manual_seed(head_dim)
            lens = tuple(int(x) for x in torch.randint(0, 400, (200,), generator=g))
            for causal in (False, True):
                out.append(replace(base, lengths_q=lens, lengths_k=lens, heads=4, causal=causal,
                                   name=f"tlx-many-items{'-causal' if causal else ''}-{dtype}-D{head_dim}"))
                out.append(replace(base, lengths_q=(256,), lengths_k=lens, heads=4, causal=causal, broadcast_q=True,
                                   name=f"tlx-many-items-bcastq{'-causal' if causal else ''}-{dtype}-D{head_dim}"))
    for values in ("near-ties", "dominant-key", "constant-keys"):
        out.append(Case((300, 77, 513), (300, 513, 77), heads=2, head_dim=128, dtype="bf16", causal=True,
                        values=values, name=f"tlx-values-{values}"))
    return out


def smoke() -> int:
    from jfa.testing import Case, run_case

    case = Case((5, 130, 0, 70), (7, 129, 3, 70), heads=2, head_dim=128, dtype="bf16", causal=True,
                name="tlx-smoke")
    with tlx_forward_in_place_of_portable() as calls:
        start = time.time()
        report = run_case(case, backend="triton", device="cuda", backward=False)
        torch.cuda.synchronize()
    _say(f"smoke: {report.worst}  ({calls['n']} TLX launches, {time.time() - start:.1f}s)")
    return 0 if report.ok and calls["n"] > 0 else 1


def correctness(only: str = "") -> int:
    from jfa.testing import run_case

    failures = 0
    selected = [c for c in cases() if not only or only in c.id]
    for i, case in enumerate(selected):
        _say(f"[{i + 1}/{len(selected)}] {case.id} ...")
        with tlx_forward_in_place_of_portable() as calls:
            report = run_case(case, backend="triton", device="cuda", backward=False)
            torch.cuda.synchronize()
        launched = calls["n"] > 0  # jfa.api calls the forward for every case, empty ones included
        ok = report.ok and launched
        failures += not ok
        _say(f"    {'ok  ' if ok else 'FAIL'} {report.worst}{'' if launched else '  (TLX launcher never ran)'}")
    _say(f"{len(selected) - failures}/{len(selected)} cases pass")
    return 1 if failures else 0


def bench(suite: str = "gem") -> int:
    import triton

    from jfa.bench.suites import flops, get_suite, make_lengths, q_lengths
    from jfa.kernels.triton.forward import jagged_forward
    from jfa.testing import offsets

    for problem in get_suite(suite):
        if problem.D not in tlx_forward.SUPPORTED_HEAD_DIMS:
            continue
        lengths_k = make_lengths(problem)
        lengths_q = q_lengths(problem, lengths_k)
        total_k = int(lengths_k.sum())
        q_rows = problem.Lq if problem.broadcast_q else int(lengths_q.sum())
        q = torch.randn(q_rows, problem.H, problem.D, device="cuda", dtype=problem.dtype)
        k, v = (torch.randn(total_k, problem.H, problem.D, device="cuda", dtype=problem.dtype) for _ in range(2))
        cu_k = offsets(lengths_k.tolist(), torch.int32, "cuda")
        cu_q = None if problem.broadcast_q else offsets(lengths_q.tolist(), torch.int32, "cuda")
        kwargs = dict(causal=problem.causal, softmax_scale=problem.D ** -0.5, broadcast_q=problem.broadcast_q,
                      num_seqs=problem.B, len_q_bcast=problem.Lq or 0)
        work = flops(problem, lengths_q, lengths_k, "fwd")
        row = [f"{problem.name:36s}"]
        for name, fn in (("tlx", tlx_forward.jagged_forward_tlx), ("triton", jagged_forward)):
            ms = triton.testing.do_bench(lambda: fn(q, k, v, cu_q, cu_k, **kwargs), warmup=25, rep=100)
            row.append(f"{name} {work / ms / 1e9:6.1f} TFLOP/s ({ms:.3f} ms)")
        _say("  ".join(row))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.kernels.tlx.hopper.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("smoke", "correctness", "bench"))
    parser.add_argument("--only", default="", help="correctness: substring of the case names to run")
    parser.add_argument("--suite", default="gem", help="bench: suite name (jfa.bench.suites)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        _say("gpu_check: no CUDA GPU visible")
        return 2
    ok, reason = tlx_forward.supports(torch.empty(1, 1, 64, device="cuda", dtype=torch.bfloat16), 64, torch.bfloat16)
    if not ok:
        _say(f"gpu_check: the TLX forward cannot run here: {reason}")
        return 2
    if args.what == "smoke":
        return smoke()
    if args.what == "correctness":
        return correctness(args.only)
    return bench(args.suite)


if __name__ == "__main__":
    sys.exit(main())
