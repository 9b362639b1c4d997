"""The TLX MXFP8 forward on the GPU beside the portable MXFP8 forward and jfa's bf16 TLX forward, on the gem
shapes: agreement of the two MX kernels (the same semantics, docs/mxfp8.md section 2) and forward times,
one process, the same quantized inputs, the columns timed in turns; the TLX MX forward also with its LLVM setting
the other way (``tlx_mx_llvm_other_way_ms``). A lab tool for the TLX MX kernel's first runs (not a test: the
tests judge it by the bounds).

    python -m jfa.bench.mx_forward --out DIR [--rule floor] [--repeats 3]

Writes DIR/mx_forward.json after every shape (a call cut short keeps what it measured).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

import jfa
from jfa import knobs
from jfa import mx as jmx
from jfa.bench.runner import launcher_inputs, llvm_the_other_way, times_in_turns
from jfa.bench.suites import get_suite
from jfa.kernels.tlx.hopper.forward import config_for, jagged_fwd_tlx_kernel, mx_forward_tlx
from jfa.kernels.triton.mx_attention import mx_forward


def _agreement(out, ref, lse, ref_lse) -> dict:
    """max |out - ref| relative to max |ref|, lse's max difference where finite, and -inf in the same places."""
    finite = torch.isfinite(ref_lse)
    return {"out_rel": float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)),
            "lse_abs": float((lse[finite] - ref_lse[finite]).abs().max()) if finite.any() else 0.0,
            "same_empty_rows": bool(torch.equal(torch.isinf(lse), torch.isinf(ref_lse))),
            "nan": bool(torch.isnan(out).any())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="gem")
    parser.add_argument("--rule", default="floor", choices=jmx.RULES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rep", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for problem in get_suite(args.suite):
        batch, kw = launcher_inputs(problem)
        cu_q = batch.cu_q if batch.cu_q is not None else batch.cu_k
        qm, km = jmx.quantize(batch.q, "dim", rule=args.rule), jmx.quantize(batch.k, "dim", rule=args.rule)
        vm = jmx.quantize(batch.v, "tokens", batch.cu_k, rule=args.rule)
        common = dict(causal=kw["causal"], softmax_scale=kw["softmax_scale"], broadcast_q=kw["broadcast_q"],
                      num_seqs=kw["num_seqs"], len_q_bcast=kw["len_q_bcast"], rule=args.rule,
                      out_dtype=problem.dtype)
        row = {"problem": problem.name, "rule": args.rule}
        try:
            tlx = lambda: mx_forward_tlx(qm, km, vm, cu_q, batch.cu_k, **common)  # noqa: E731
            portable = lambda: mx_forward(qm, km, vm, cu_q, batch.cu_k, **common)  # noqa: E731

            other_way = llvm_the_other_way(jagged_fwd_tlx_kernel, config_for(qm.data.shape[-1], mx=args.rule).llvm_o0)

            def tlx_llvm_other_way():
                """The TLX MX forward compiled with its LLVM setting the other way from its config's."""
                with knobs.scope(**other_way):
                    return tlx()

            bf16 = lambda: jfa.jagged_attention(batch.q, batch.k, batch.v, batch.cu_q, batch.cu_k,  # noqa: E731
                                                batch.max_q, batch.max_k, causal=problem.causal,
                                                broadcast_q=problem.broadcast_q, backend="tlx")
            out, lse = tlx()
            ref, ref_lse = portable()
            torch.cuda.synchronize()
            row.update(_agreement(out, ref, lse, ref_lse))
            columns = {"tlx_mx_ms": tlx, "tlx_mx_llvm_other_way_ms": tlx_llvm_other_way, "portable_mx_ms": portable,
                       "tlx_bf16_ms": bf16}
            times = times_in_turns(columns, args.repeats, 5, args.rep)
            row.update({name: statistics.median(ms) for name, ms in times.items()})
            row["mx_vs_bf16"] = row["tlx_bf16_ms"] / row["tlx_mx_ms"]
        except Exception as exc:  # noqa: BLE001 - one shape's failure is reported, the others still run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "mx_forward.json"), "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
