"""The MXFP8 error report (issue 23): what ``precision="mxfp8"`` / ``"mxfp8-rceil"`` costs in accuracy on the
gem shapes, and how far that is from the a-priori bound (b) of docs/mxfp8.md section 3.

Two steps, because the bound is NumPy interval arithmetic (tens of seconds per 500-token sequence) and the
shapes are GPU-sized:

``measure`` (on the GPU): per shape and rule, jfa's MXFP8 forward and backward through the public op against
exact attention in float64 on the device (``jfa.fuzz.twin``); per tensor (out, dq, dk, dv) the median and
p99 over rows (token, head) of the relative error ``|x - ref|_2 / |ref|_2`` and the cosine similarity of the
whole tensor. It also saves one sampled sequence per shape (inputs and both rules' outputs), the one nearest the median
length among those of at most ``--sample-tokens`` keys (none where no sequence is that short), to
``DIR/sample-<shape>.pt``.

``bound`` (on any machine, from those files): on the sampled sequence, the MX oracle's error against exact
attention beside bound (b), observed / bound median and max per tensor, and the kernel's own error against
exact on the same rows.

    python -m jfa.bench.mx_report measure --out DIR [--suite gem] [--rules floor,rceil]
    python -m jfa.bench.mx_report bound --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Optional

import numpy as np
import torch

import jfa
from jfa.bench.runner import launcher_inputs
from jfa.bench.suites import get_suite

TENSORS = ("out", "dq", "dk", "dv")
PRECISIONS = {"floor": "mxfp8", "rceil": "mxfp8-rceil"}


def row_errors(x: torch.Tensor, ref: torch.Tensor) -> dict:
    """Median and p99 over the (token, head) rows of |x - ref| / |ref| (rows with ref = 0 left out), and the
    cosine similarity of the whole tensor, all in float64."""
    x, ref = x.detach().double().flatten(0, -2), ref.detach().double().flatten(0, -2)
    norms = ref.norm(dim=-1)
    keep = norms > 0
    rel = (x - ref)[keep].norm(dim=-1) / norms[keep]
    if rel.numel() == 0:
        return {"median": 0.0, "p99": 0.0, "cosine": 1.0, "rows": 0}
    cosine = float((x * ref).sum() / (x.norm() * ref.norm()).clamp_min(1e-300))
    return {"median": float(rel.median()), "p99": float(torch.quantile(rel, 0.99)), "cosine": cosine,
            "rows": int(rel.numel())}


def _sample_sequence(lengths_k: torch.Tensor, cap: int) -> Optional[int]:
    """The sequence whose key length is nearest the batch's median among those with 0 < length <= cap (None
    when none fits: the bound's interval arithmetic on longer sequences is too slow to be worth it)."""
    lengths = lengths_k.tolist()
    candidates = [b for b, n in enumerate(lengths) if 0 < n <= cap]
    if not candidates:
        return None
    median = float(np.median([lengths[b] for b in candidates]))
    return min(candidates, key=lambda b: (abs(lengths[b] - median), b))


def measure(problem, rules, device: str, sample_tokens: int) -> tuple[list, Optional[dict]]:
    """The rows of one shape (one per rule) and its sample for the bound step (None: no short sequence)."""
    from jfa.fuzz import twin

    batch, kw = launcher_inputs(problem, device)
    g = torch.Generator(device=device).manual_seed(7)
    rows_out = kw["num_seqs"] * kw["len_q_bcast"] if problem.broadcast_q else batch.q.shape[0]
    dout = torch.randn((rows_out, problem.H, problem.D), device=device, dtype=problem.dtype, generator=g)
    common = dict(causal=problem.causal, softmax_scale=kw["softmax_scale"], broadcast_q=problem.broadcast_q)
    out_x, lse_x = twin.attention_forward(batch.q, batch.k, batch.v, batch.cu_q, batch.cu_k, **common)
    grads_x = twin.attention_backward(batch.q, batch.k, batch.v, out_x, lse_x, dout, batch.cu_q, batch.cu_k, **common)
    exact = dict(zip(TENSORS, (out_x, *grads_x)))
    b = _sample_sequence(batch.lengths_k, sample_tokens)
    if b is not None:
        q_rows, k_rows, o_rows = _sequence_rows(problem, batch, kw, b)
        sample = {"problem": problem.name, "sequence": b, "causal": problem.causal,
                  "broadcast_q": problem.broadcast_q, "softmax_scale": kw["softmax_scale"],
                  "q": batch.q[q_rows].cpu(), "k": batch.k[k_rows].cpu(), "v": batch.v[k_rows].cpu(),
                  "dout": dout[o_rows].cpu(), "outputs": {}}
    rows = []
    for rule in rules:
        q, k, v = (t.detach().requires_grad_() for t in (batch.q, batch.k, batch.v))
        with jfa.recording_dispatch() as ran:
            out = jfa.jagged_attention(q, k, v, batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
                                       precision=PRECISIONS[rule], **common)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        got = dict(zip(TENSORS, (out, *grads)))
        row = {"problem": problem.name, "rule": rule, "kernels": sorted({kernel for _, kernel, _ in ran})}
        row.update({name: row_errors(got[name], exact[name]) for name in TENSORS})
        rows.append(row)
        if b is not None:
            # the sample's dq is this sequence's share only where q is not shared (broadcast Q sums over sequences)
            sample["outputs"][rule] = {"out": out[o_rows].detach().cpu(), "dk": grads[1][k_rows].cpu(),
                                       "dv": grads[2][k_rows].cpu(),
                                       "dq": None if problem.broadcast_q else grads[0][q_rows].cpu()}
    return rows, (sample if b is not None else None)


def _sequence_rows(problem, batch, kw, b: int) -> tuple[slice, slice, slice]:
    """Sequence ``b``'s rows in q, in k and v, and in the output."""
    cu_k = batch.cu_k.tolist()
    k_rows = slice(cu_k[b], cu_k[b + 1])
    if problem.broadcast_q:
        return slice(0, batch.q.shape[0]), k_rows, slice(b * kw["len_q_bcast"], (b + 1) * kw["len_q_bcast"])
    cu_q = batch.cu_q.tolist()
    return slice(cu_q[b], cu_q[b + 1]), k_rows, slice(cu_q[b], cu_q[b + 1])


def bound_rows(sample: dict) -> list:
    """Per rule: the MX oracle's and the kernel's error against exact attention on the sampled sequence,
    observed / bound (b) median and max per tensor, and any violation (observed > bound)."""
    from jfa.oracle import attention_backward, attention_forward
    from jfa.oracle.mx_attention import mx_backward, mx_forward
    from jfa.oracle.mx_bounds import apriori_bound

    q, k, v, dout = (sample[n].double().numpy() for n in ("q", "k", "v", "dout"))
    cu_k = np.array([0, k.shape[0]])
    cu_q = None if sample["broadcast_q"] else np.array([0, q.shape[0]])
    kw = dict(causal=sample["causal"], softmax_scale=sample["softmax_scale"], broadcast_q=sample["broadcast_q"])
    out_x, lse_x = attention_forward(q, k, v, cu_q, cu_k, **kw)
    exact = dict(zip(TENSORS, (out_x, *attention_backward(q, k, v, out_x, lse_x, dout, cu_q, cu_k, **kw))))
    rows = []
    for rule, got in sample["outputs"].items():
        bound = apriori_bound(q, k, v, dout, cu_q, cu_k, rule=rule, **kw)
        out_m, lse_m = mx_forward(q, k, v, cu_q, cu_k, rule=rule, **kw)
        oracle = dict(zip(TENSORS, (out_m, *mx_backward(q, k, v, out_m, lse_m, dout, cu_q, cu_k, rule=rule, **kw))))
        row = {"problem": sample["problem"], "rule": rule, "sequence": sample["sequence"], "tokens": k.shape[0]}
        for name in TENSORS:
            observed = np.abs(oracle[name] - exact[name])
            ratio = observed / np.maximum(bound[name], 1e-300)
            entry = {"oracle_over_bound_median": float(np.median(ratio)), "oracle_over_bound_max": float(ratio.max()),
                     "violations": int((observed > bound[name]).sum()), "bound_median": float(np.median(bound[name]))}
            if got.get(name) is not None:
                kernel = np.abs(got[name].double().numpy() - exact[name])
                entry["kernel_over_bound_max"] = float((kernel / np.maximum(bound[name], 1e-300)).max())
            row[name] = entry
        rows.append(row)
    return rows


def _measure_table(rows: list) -> str:
    lines = ["| shape | rule | " + " | ".join(f"{n} rel. err. median / p99 / cosine" for n in TENSORS) + " |",
             "|---|---|" + "---|" * len(TENSORS)]
    for r in rows:
        cells = [f"{r[n]['median']:.2e} / {r[n]['p99']:.2e} / {r[n]['cosine']:.6f}" for n in TENSORS]
        lines.append(f"| {r['problem']} | {r['rule']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bound_table(rows: list) -> str:
    lines = ["| shape (sampled sequence) | rule | " + " | ".join(
        f"{n}: oracle / bound median, max; kernel / bound max; violations" for n in TENSORS) + " |",
        "|---|---|" + "---|" * len(TENSORS)]
    for r in rows:
        cells = []
        for n in TENSORS:
            e = r[n]
            kernel = f"{e['kernel_over_bound_max']:.1e}" if "kernel_over_bound_max" in e else "-"
            cells.append(f"{e['oracle_over_bound_median']:.1e}, {e['oracle_over_bound_max']:.1e}; {kernel}; "
                         f"{e['violations']}")
        lines.append(f"| {r['problem']} (seq {r['sequence']}, {r['tokens']} keys) | {r['rule']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("measure", "bound"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--suite", default="gem")
    parser.add_argument("--problems", default=None, help="comma-separated problem names of the suite")
    parser.add_argument("--rules", default="floor,rceil")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sample-tokens", type=int, default=512)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.step == "measure":
        rules = [r for r in args.rules.split(",") if r]
        wanted = set(args.problems.split(",")) if args.problems else None
        rows = []
        for problem in get_suite(args.suite):
            if wanted is not None and problem.name not in wanted:
                continue
            shape_rows, sample = measure(problem, rules, args.device, args.sample_tokens)
            rows += shape_rows
            if sample is not None:
                torch.save(sample, os.path.join(args.out, f"sample-{problem.name}.pt"))
            with open(os.path.join(args.out, "mx_report.json"), "w") as f:  # after every shape: a cut call keeps it
                json.dump(rows, f, indent=1)
            print(_measure_table(shape_rows), flush=True)
        with open(os.path.join(args.out, "mx_report.md"), "w") as f:
            f.write(_measure_table(rows) + "\n")
        return 0
    rows = []
    for name in sorted(os.listdir(args.out)):
        if name.startswith("sample-") and name.endswith(".pt"):
            rows += bound_rows(torch.load(os.path.join(args.out, name)))
            print(_bound_table(rows[-len(PRECISIONS):]), flush=True)
    with open(os.path.join(args.out, "mx_bound.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "mx_bound.md"), "w") as f:
        f.write(_bound_table(rows) + "\n")
    return 0 if all(r[n]["violations"] == 0 for r in rows for n in TENSORS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
