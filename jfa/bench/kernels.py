"""Where one call's GPU time goes, kernel by kernel, for each implementation on the same inputs in one process.

For each problem of a suite and each named implementation (``jfa.bench.impls``): a warm-up call, then
``--calls`` calls of the forward and of forward+backward under torch.profiler; per call, each device
kernel's launches and microseconds, the sum ("busy": what the GPU ran), and the span from the first
kernel's start to the last one's end divided by the calls ("span": busy plus the gaps the host left).
The answer to "which kernel of the backward is behind FA4's, and by how much", next to the matmul rate.

    python -m jfa.bench.kernels --suite gem --impls jfa-tlx,fa4-varlen --calls 10 --out DIR [--only full-B8]

Writes DIR/kernels.json and DIR/kernels.md (``summary``: each backward's main kernel and its rate beside the
rest) after every problem (a call cut short keeps what it measured) and prints both.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from typing import Callable, Iterable

import torch

from jfa.bench.impls import get_impl
from jfa.bench.runner import launcher_inputs, output_grad, profiled_calls
from jfa.bench.suites import PASSES, flops, get_suite

NAME_CHARS = 72  # CuTe DSL kernels carry their whole template in the name


def kernel_events(fn: Callable[[], object], calls: int) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every device event (kernels, memsets, copies) of ``calls`` calls of ``fn``,
    after one unprofiled call (compilation, caches)."""
    from torch.autograd import DeviceType

    prof = profiled_calls(fn, calls)
    return [(e.name, float(e.time_range.start), float(e.time_range.end))
            for e in prof.events() if e.device_type == DeviceType.CUDA]


def per_call(events: Iterable[tuple[str, float, float]], calls: int) -> dict:
    """Per call of ``calls``: each kernel name's launches and us, longest first; ``busy_us`` (their sum) and
    ``span_us`` (first start to last end). Names are cut to ``NAME_CHARS``; equal cut names add up."""
    events = list(events)
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    launches, micros = defaultdict(int), defaultdict(float)
    for name, start, end in events:
        key = name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 3] + "..."
        launches[key] += 1
        micros[key] += end - start
    kernels = [{"name": k, "launches": launches[k] / calls, "us": micros[k] / calls}
               for k in sorted(micros, key=lambda k: -micros[k])]
    span = (max(e for _, _, e in events) - min(s for _, s, _ in events)) / calls if events else 0.0
    return {"kernels": kernels, "busy_us": sum(micros.values()) / calls, "span_us": span}


def text(problem: str, impl: str, pass_: str, result: dict, top: int = 8) -> str:
    """One block of the printed table: the pass's busy and span time, its TFLOP/s at the busy time, the
    ``top`` longest kernels."""
    lines = [f"{problem} {impl} {pass_}: busy {result['busy_us']:.1f} us, span {result['span_us']:.1f} us, "
             f"{result['tflops_busy']:.1f} TFLOP/s at busy"]
    lines += [f"  {k['us']:9.1f} us {k['launches']:5.1f}x  {k['name']}" for k in result["kernels"][:top]]
    return "\n".join(lines)


def summary(results: dict, backward_flops: dict) -> str:
    """A markdown table per problem and implementation: the forward pass's busy time, the backward's main kernel
    (the longest kernel of forward+backward that the forward pass does not run) with its TFLOP/s
    (``backward_flops[problem]`` over that kernel alone), and the backward's other kernels' time."""
    lines = ["| problem | impl | fwd us | bwd main kernel us (TFLOP/s) | bwd other kernels us | bwd main kernel |",
             "|---|---|---|---|---|---|"]
    for key, both in results.items():
        problem, impl, pass_ = key.rsplit(" ", 2)
        fwd = results.get(f"{problem} {impl} fwd")
        if pass_ != "fwd_bwd" or fwd is None:
            continue
        forward_names = {k["name"] for k in fwd["kernels"]}
        backward = [k for k in both["kernels"] if k["name"] not in forward_names]
        if not backward:
            continue
        main_kernel = backward[0]  # per_call lists the longest first
        rate = backward_flops[problem] / (main_kernel["us"] * 1e-6) / 1e12
        others = sum(k["us"] for k in backward[1:])
        lines.append(f"| {problem} | {impl} | {fwd['busy_us']:.0f} | {main_kernel['us']:.0f} ({rate:.0f}) | "
                     f"{others:.0f} | {main_kernel['name']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="gem")
    parser.add_argument("--impls", default="jfa-tlx,fa4-varlen", help="comma-separated, jfa.bench.impls names")
    parser.add_argument("--only", default="", help="a substring of the problem names")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", default=None, help="directory for kernels.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA GPU visible")
    results, backward_flops = {}, {}
    for problem in get_suite(args.suite):
        if args.only not in problem.name:
            continue
        batch, _ = launcher_inputs(problem)
        work = {pass_: flops(problem, batch.lengths_q, batch.lengths_k, pass_) for pass_ in PASSES}
        backward_flops[problem.name] = work["bwd"]
        grad = output_grad(problem, batch.q.shape[0], "cuda")
        for impl_name in args.impls.split(","):
            impl = get_impl(impl_name)
            ok, why = impl.available()
            if not ok:
                print(f"{problem.name} {impl_name}: skipped ({why})", flush=True)
                continue
            prepared = impl.prepare(batch, grad)
            for pass_, fn in (("fwd", prepared.fwd), ("fwd_bwd", prepared.fwd_bwd)):
                if fn is None:
                    continue
                if pass_ == "fwd":
                    fn = torch.no_grad()(fn)
                result = per_call(kernel_events(fn, args.calls), args.calls)
                busy_s = result["busy_us"] * 1e-6
                result["tflops_busy"] = work[pass_] / busy_s / 1e12 if busy_s else 0.0
                results[f"{problem.name} {impl_name} {pass_}"] = result
                print(text(problem.name, impl_name, pass_, result), flush=True)
            del prepared
            impl.clear_cache()
            torch.cuda.empty_cache()
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "kernels.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
            with open(os.path.join(args.out, "kernels.md"), "w") as f:
                f.write(summary(results, backward_flops) + "\n")
    print(summary(results, backward_flops), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
