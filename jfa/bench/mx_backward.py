"""The MXFP8 backward on the GPU, where its time goes: the shipped backward (TLX dK/dV ``MX`` build + the portable
MX dQ pass, operands quantized inside), the portable MX backward and jfa's bf16 TLX backward on the gem shapes,
one process, the same inputs; agreement of the two MX backwards, and a torch.profiler table of one shipped
backward's kernels per shape. A lab tool (not a test: the tests judge the kernels by the bounds).

    python -m jfa.bench.mx_backward --out DIR [--rule floor] [--repeats 1] [--skip-portable]
                                    [--dq-configs 64x32x8x2,64x64x8x2]

``--dq-configs``: also the shipped backward with each of these portable dQ launch configs (block_m x block_n x
warps x stages), its dQ's largest difference to the shipped config's (fp32 accumulation order: another
block_n sums the chunks in another order).

Writes DIR/mx_backward.json after every shape and DIR/profile-<shape>.txt (a call cut short keeps what it
measured).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics

import torch

from jfa import mx as jmx
from jfa.bench.runner import launcher_inputs, profiled_calls, times_in_turns
from jfa.bench.suites import get_suite
from jfa.kernels.tlx.hopper.backward import jagged_backward_tlx, mx_backward_tlx
from jfa.kernels.tlx.hopper.forward import jagged_forward_tlx, mx_forward_tlx
from jfa.kernels.tlx.hopper.backward import mx_dkdv_tlx
from jfa.kernels.triton.configs import KernelConfig
from jfa.kernels.triton.mx_attention import mx_backward, mx_configs


def _max_rel(got, want) -> float:
    """max |got - want| relative to max |want|."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def _kernel_table(fn, calls: int = 3) -> str:
    """torch.profiler's table of the CUDA kernels of ``calls`` calls of ``fn``, by total CUDA time."""
    return profiled_calls(fn, calls, host=True).key_averages().table(sort_by="cuda_time_total", row_limit=16,
                                                                     max_name_column_width=70)


def _dq_config(text: str) -> KernelConfig:
    """``KernelConfig`` of "BMxBNxWxS"."""
    block_m, block_n, warps, stages = (int(x) for x in text.split("x"))
    return KernelConfig(block_m, block_n, warps, stages)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="gem")
    parser.add_argument("--rule", default="floor", choices=jmx.RULES)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rep", type=int, default=30)
    parser.add_argument("--skip-portable", action="store_true", help="time only the shipped MX and bf16 backwards")
    parser.add_argument("--dq-configs", default="", help="comma-separated BMxBNxWxS portable dQ configs to time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    dq_configs = [_dq_config(c) for c in args.dq_configs.split(",") if c]
    rows = []
    for problem in get_suite(args.suite):
        batch, kw = launcher_inputs(problem)
        kw.pop("window")
        cu_q = batch.cu_q if batch.cu_q is not None else batch.cu_k
        qm, km = jmx.quantize(batch.q, "dim", rule=args.rule), jmx.quantize(batch.k, "dim", rule=args.rule)
        vm = jmx.quantize(batch.v, "tokens", batch.cu_k, rule=args.rule)
        out, lse = mx_forward_tlx(qm, km, vm, cu_q, batch.cu_k, rule=args.rule, out_dtype=problem.dtype, **kw)
        out16, lse16 = jagged_forward_tlx(batch.q, batch.k, batch.v, cu_q, batch.cu_k, **kw)
        dout = torch.randn_like(out)
        row = {"problem": problem.name, "rule": args.rule}
        try:
            shipped = lambda: mx_backward_tlx(batch.q, batch.k, batch.v, out, lse, dout, cu_q,  # noqa: E731
                                              batch.cu_k, rule=args.rule, **kw)
            portable = lambda: mx_backward(batch.q, batch.k, batch.v, out, lse, dout, cu_q,  # noqa: E731
                                           batch.cu_k, rule=args.rule, **kw)
            bf16 = lambda: jagged_backward_tlx(batch.q, batch.k, batch.v, out16, lse16, dout, cu_q,  # noqa: E731
                                               batch.cu_k, **kw)
            timed = [("tlx_mx_ms", shipped), ("tlx_bf16_ms", bf16)]
            if not args.skip_portable:
                got, want = shipped(), portable()
                row.update({f"{name}_rel": _max_rel(g, w) for name, g, w in zip(("dq", "dk", "dv"), got, want)})
                timed.append(("portable_mx_ms", portable))
            reference = shipped()
            for cfg in dq_configs:
                configs = dataclasses.replace(mx_configs(problem.D), dq=cfg)
                variant = functools.partial(mx_backward, batch.q, batch.k, batch.v, out, lse, dout, cu_q, batch.cu_k,
                                            rule=args.rule, config=configs, dkdv=mx_dkdv_tlx, **kw)
                label = f"dq_{cfg.block_m}x{cfg.block_n}x{cfg.num_warps}x{cfg.num_stages}"
                try:
                    row[label + "_dq_rel"] = _max_rel(variant()[0], reference[0])
                    timed.append((label + "_ms", variant))
                except Exception as exc:  # noqa: BLE001 - a config that does not build is reported
                    row[label + "_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            times = times_in_turns(dict(timed), args.repeats, 5, args.rep)
            row.update({name: statistics.median(ms) for name, ms in times.items()})
            row["mx_vs_bf16"] = row["tlx_bf16_ms"] / row["tlx_mx_ms"]
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, f"profile-{problem.name}.txt"), "w") as f:
                    f.write(_kernel_table(shipped))
        except Exception as exc:  # noqa: BLE001 - one shape's failure is reported, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "mx_backward.json"), "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
