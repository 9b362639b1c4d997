"""Where the time goes: SM timelines of the TLX forward under different schedules.

The profiling build of the TLX kernel (``profile=True``) records, per work item, the SM that ran it
and its start and end on the GPU's global timer. This module runs one benchmark shape under several
schedules and draws each as a heatmap of SM activity over time (rows: SMs, columns: time, colour:
busy), with the numbers that matter for load balance: the makespan and the idle share of SM-time
before the last SM finishes.

    python -m jfa.bench.timeline --shape longtail-B256-L4096-H4-D128 --out DIR

Needs a Hopper GPU. Writes ``timeline-<shape>.png`` and ``timeline-<shape>.json``.

``--steps N`` instead looks inside one SM: the profiling build also logs CTA 0's first N K/V steps of both
consumers (four SM clock stamps a step, ``Timeline.steps``), and the summary is how long each phase of a
consumer's step takes and how far apart the two consumers pass the pingpong turn (``step_phases``):

    python -m jfa.bench.timeline --shape full-B8-L4096-H16-D128 --steps 256 --out DIR

``--backward`` runs the dK/dV kernel's profiling build instead (the fused dQ; the variant ``JFA_TLX_BWD_VARIANT``
names, what ships by default): consumer 0 and the producer stamp each work item's phases
(``jfa.kernels.tlx.hopper.dkdv_steps.PROFILE_FIELDS``), and the summary is what an item costs beyond its query
steps and where the producer is meanwhile (``item_phases``):

    python -m jfa.bench.timeline --backward --shape bcastq-Lq256-B1152-L1000-H4-D128 --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# label -> Variant keyword arguments; "naive" is the order a plain grid would take: batch order, no LPT
SCHEDULES = {
    "zigzag (shipped)": dict(schedule="zigzag"),
    "dynamic": dict(schedule="dynamic"),
    "naive (batch order)": dict(longest_first=False),
    "non-persistent": dict(persistent=False),
}


def columns(rows: np.ndarray, names: tuple) -> dict:
    """A profiling build's records (int64 rows of the fields ``names``) as one array per field."""
    return {name: rows[:, i] for i, name in enumerate(names)}


def forward_columns(records: np.ndarray) -> dict:
    """The forward's item records (``forward.PROFILE_FIELDS``: SM, start ns, end ns, CTA) by field."""
    from jfa.kernels.tlx.hopper.forward import PROFILE_FIELDS

    return columns(np.asarray(records), PROFILE_FIELDS)


def busy_map(records: np.ndarray, bins: int = 400) -> tuple[np.ndarray, float]:
    """(busy [SMs, bins] in {0, 1}, makespan in us): whether some item ran on each SM at each bin's centre.
    ``records``: the forward's item records (``forward_columns``); time 0 is the earliest start."""
    col = forward_columns(records)
    sms = int(col["sm"].max()) + 1
    t0 = col["start_ns"].min()
    start, end = (col["start_ns"] - t0) / 1e3, (col["end_ns"] - t0) / 1e3
    makespan = float(end.max())
    centres = (np.arange(bins) + 0.5) * makespan / bins
    busy = np.zeros((sms, bins))
    for sm in range(sms):
        mine = col["sm"] == sm
        if not mine.any():
            continue
        order = np.argsort(start[mine])
        s, e = start[mine][order], np.maximum.accumulate(end[mine][order])
        idx = np.searchsorted(s, centres, side="right") - 1
        busy[sm] = (idx >= 0) & (e[np.maximum(idx, 0)] > centres)
    return busy, makespan


def stats(records: np.ndarray) -> dict:
    """Makespan (us), idle share of SM-time before the end, and the spread of per-SM finish times, from the
    forward's item records (``forward_columns``)."""
    col = forward_columns(records)
    t0 = col["start_ns"].min()
    finish = {}
    busy_ns = 0
    for sm, s, e in zip(col["sm"], col["start_ns"], col["end_ns"]):
        finish[sm] = max(finish.get(sm, 0), e - t0)
        busy_ns += e - s
    makespan = max(finish.values())
    ends = np.array(sorted(finish.values())) / 1e3
    return {"makespan_us": round(makespan / 1e3, 1), "sms": len(finish),
            "idle_share": round(1 - busy_ns / (makespan * len(finish)), 4),
            "first_sm_done_us": round(float(ends[0]), 1), "median_sm_done_us": round(float(np.median(ends)), 1)}


def step_phases(steps: np.ndarray) -> dict:
    """Median SM cycles of the phases of a consumer's K/V step, from ``Timeline.steps`` ([consumer, step,
    (start, turn passed, V ready, done)], -1 where no step was logged). Per consumer: "K, turn and QK^T" (start
    to the turn passed: the K buffer's wait, the pingpong turn, the QK^T issue and, in the shipped builds, its
    completion), "V wait" (to V(j - 1) ready), "softmax under PV" (V ready to done: PV(j - 1) issued among the
    softmax's instructions, then retired), "to the next step" (done to the next step's start: the rescale, P's
    conversion, the loop; consecutive steps only) and "period" (start to the next start); and "turn offset":
    consumer 1's turn passed after consumer 0's, steps both logged. ``n`` counts the steps each median is of."""
    steps = np.asarray(steps, dtype=np.int64)
    logged = (steps >= 0).all(-1)
    out = {}
    for cid in range(steps.shape[0]):
        rows = steps[cid][logged[cid]]
        nxt = logged[cid][1:] & logged[cid][:-1]
        starts, ends = steps[cid][1:][nxt, 0], steps[cid][:-1][nxt]
        phases = {"K, turn and QK^T": rows[:, 1] - rows[:, 0], "V wait": rows[:, 2] - rows[:, 1],
                  "softmax under PV": rows[:, 3] - rows[:, 2], "to the next step": starts - ends[:, 3],
                  "period": starts - ends[:, 0]}
        out[f"consumer {cid}"] = {name: (float(np.median(v)) if v.size else None) for name, v in phases.items()}
        out[f"consumer {cid}"]["n"] = int(rows.shape[0])
    both = logged.all(0)
    offset = steps[1][both, 1] - steps[0][both, 1] if steps.shape[0] > 1 else np.zeros(0)
    out["turn offset"] = float(np.median(offset)) if offset.size else None
    return out


def item_phases(records: np.ndarray) -> dict:
    """What the dK/dV kernel's items cost, from its profiling records (rows of ``PROFILE_FIELDS``; -1 rows: no
    item ran there), in us at the SM clock the records themselves show ("clock GHz": cycles over global-timer ns
    between a CTA's first and last item starts, the median over CTAs). Medians over the items with steps of the
    consumers' phases: "K/V wait" (start to K and V ready: the item decoded and its K and V waited for; "of which
    decode": start to the item decoded, the tile list's and the offsets' dependent loads), "per step"
    (the steps' cycles over their number), "epilogue" (last step done to dK and dV stored), "to the next item"
    (end to the same CTA's next start); the least-squares line ``cycles = boundary + per_step * steps`` over every
    such item ("fit": its boundary and per-step us), whose boundary is what an item costs beside its steps; and
    the producer's ("producer"): "late" (the consumers' last step of the CTA's previous item done, when they hand
    K and V back, to the producer's start of this one: negative when it was there first), "decode and K/V issue"
    (its start to K and V issued: the item decoded and the K/V tiles waited for; negative with ``item_prefetch``,
    which issues them during the CTA's previous item), "K/V issued to ready" (to the
    consumers' K and V ready) and "after its last load" (its last Q/dO load issued to its end: with the producer's
    dQ, the dQ of the steps still behind). ``items`` counts the items used."""
    from jfa.kernels.tlx.hopper.dkdv_steps import PROFILE_FIELDS

    rec = np.asarray(records, dtype=np.int64)
    rec = rec[(rec >= 0).all(1) & (rec[:, PROFILE_FIELDS.index("steps")] > 0)]
    if not rec.size:
        return {"items": 0}
    col = columns(rec, PROFILE_FIELDS)
    steps = col["steps"].astype(np.float64)
    gaps, late, clocks = [], [], []
    for cta in np.unique(col["cta"]):
        mine = col["cta"] == cta
        order = np.argsort(col["start"][mine])
        field = {name: values[mine][order] for name, values in col.items()}
        gaps.append(field["start"][1:] - field["end"][:-1])
        late.append(field["producer_start"][1:] - field["steps_done"][:-1])
        if field["start_ns"][-1] > field["start_ns"][0]:
            clocks.append((field["start"][-1] - field["start"][0]) / (field["start_ns"][-1] - field["start_ns"][0]))
    gaps, late = np.concatenate(gaps), np.concatenate(late)
    clock_ghz = float(np.median(clocks)) if clocks else float("nan")
    us = 1e-3 / clock_ghz

    def median_us(cycles) -> float:
        return round(float(np.median(cycles)) * us, 3)

    cycles = (col["end"] - col["start"]).astype(np.float64)
    if np.unique(steps).size > 1:
        slope, boundary = np.polyfit(steps, cycles, 1)
    else:  # (one step count: no line through the points; all of it counted as steps)
        slope, boundary = float(np.median(cycles / steps)), 0.0
    return {"items": int(rec.shape[0]), "mean steps": round(float(steps.mean()), 2), "clock GHz": round(clock_ghz, 3),
            "K/V wait": median_us(col["kv_ready"] - col["start"]),
            "of which decode": median_us(col["decoded"] - col["start"]),
            "per step": median_us((col["steps_done"] - col["kv_ready"]) / steps),
            "epilogue": median_us(col["end"] - col["steps_done"]),
            "to the next item": median_us(gaps) if gaps.size else None,
            "fit": {"boundary": round(float(boundary) * us, 3), "per step": round(float(slope) * us, 3)},
            "producer": {"late": median_us(late) if late.size else None,
                         "decode and K/V issue": median_us(col["kv_issued"] - col["producer_start"]),
                         "K/V issued to ready": median_us(col["kv_ready"] - col["kv_issued"]),
                         "after its last load": median_us(col["producer_end"] - col["loads_done"])}}


def record_backward(problem) -> np.ndarray:
    """The dK/dV kernel's profiling records of ``problem`` (the fused dQ's build of the variant
    ``knobs.tlx_bwd_variant`` names, after a warm-up run)."""
    import torch

    from jfa.bench.runner import launcher_inputs, run_tlx_forward
    from jfa.kernels.schedule import output_offsets
    from jfa.kernels.tlx.hopper import backward as tlx_backward

    b, kwargs = launcher_inputs(problem)
    out, lse = run_tlx_forward(b, kwargs)
    dout = torch.randn_like(out)
    out_cu = output_offsets(b.cu_q, problem.B, problem.Lq or 0, problem.broadcast_q, b.q.device)
    for _ in range(2):  # the first run compiles and warms up
        records = tlx_backward.jagged_dkdv_tlx(
            b.q, b.k, b.v, dout, lse, None, torch.empty_like(b.k), torch.empty_like(b.v), out_cu, b.cu_k,
            causal=problem.causal, softmax_scale=kwargs["softmax_scale"], broadcast_q=problem.broadcast_q,
            num_seqs=problem.B, len_q_bcast=problem.Lq or 0, dq_accum=tlx_backward.DqAccumulator(b.q, zeroed=False),
            outputs=(out, dout, None), window=problem.window, profile=True,
            variant=tlx_backward.variant_from_knobs())
    torch.cuda.synchronize()
    return records.cpu().numpy()


def record_steps(problem, steps: int) -> np.ndarray:
    """CTA 0's first ``steps`` K/V steps of ``problem`` with the shipped build (after a warm-up run)."""
    import torch

    from jfa.bench.runner import launcher_inputs, run_tlx_forward

    b, kwargs = launcher_inputs(problem)
    for _ in range(2):  # the first run compiles and warms up
        _, _, timeline = run_tlx_forward(b, kwargs, profile=True, trace_steps=steps)
    torch.cuda.synchronize()
    return timeline.steps.cpu().numpy()


def record(problem, variants: dict) -> dict:
    """Run ``problem`` once per variant (after a warm-up run) with the profiling build."""
    import torch

    from jfa.bench.runner import launcher_inputs, run_tlx_forward
    from jfa.kernels.tlx.hopper.forward import Variant

    b, kwargs = launcher_inputs(problem)
    out = {}
    for label, switches in variants.items():
        variant = Variant(**switches)
        for _ in range(2):  # the first run compiles and warms up
            _, _, timeline = run_tlx_forward(b, kwargs, variant=variant, profile=True)
        torch.cuda.synchronize()
        out[label] = timeline.records.cpu().numpy()
    return out


def draw(records_by_label: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(records_by_label)
    maps = {label: busy_map(records_by_label[label]) for label in labels}
    longest = max(makespan for _, makespan in maps.values())
    fig, axes = plt.subplots(len(labels), 1, figsize=(11, 2.3 * len(labels)), squeeze=False)
    for ax, label in zip(axes[:, 0], labels):
        busy, makespan = maps[label]
        s = stats(records_by_label[label])
        ax.imshow(busy, aspect="auto", cmap="Greens", vmin=0, vmax=1, interpolation="nearest",
                  extent=(0, makespan, busy.shape[0], 0))
        ax.set_xlim(0, longest)
        ax.set_ylabel("SM")
        ax.set_title(f"{label}: makespan {s['makespan_us']:.0f} us, idle {100 * s['idle_share']:.1f}% of SM-time",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time since the first item started (us)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jfa.bench.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="gem")
    parser.add_argument("--shape", action="append", help="shape name(s) of the suite (default: longtail, uniform)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated labels of: "
                        + ", ".join(SCHEDULES))
    parser.add_argument("--steps", type=int, default=0, help="instead: log CTA 0's first STEPS K/V steps and "
                        "summarise their phases (step_phases)")
    parser.add_argument("--backward", action="store_true", help="instead: the dK/dV kernel's per-item phases "
                        "(item_phases)")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)

    import torch

    from jfa.bench.suites import get_suite

    if not torch.cuda.is_available():
        print("jfa timeline: needs a CUDA GPU (Hopper): the profiling build of the TLX kernel records on the GPU")
        return 2
    wanted = [s.strip() for s in args.schedules.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SCHEDULES]
    if unknown:
        parser.error(f"--schedules: unknown {unknown}; known: {list(SCHEDULES)}")
    problems = {p.name: p for p in get_suite(args.suite)}
    shapes = args.shape or [n for n in problems if n.startswith(("longtail", "uniform-B512"))]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in shapes:
        if name not in problems:
            parser.error(f"--shape: {name!r} is not in suite {args.suite} ({list(problems)})")
        if args.backward:
            records = record_backward(problems[name])
            phases = item_phases(records)
            (out_dir / f"items-{name}.json").write_text(json.dumps({"phases": phases, "records": records.tolist()})
                                                        + "\n")
            print(f"{name}: {json.dumps(phases)}")
            continue
        if args.steps:
            steps = record_steps(problems[name], args.steps)
            phases = step_phases(steps)
            (out_dir / f"steps-{name}.json").write_text(json.dumps({"phases": phases, "steps": steps.tolist()}) + "\n")
            print(f"{name}: {json.dumps(phases)}")
            continue
        recs = record(problems[name], {label: SCHEDULES[label] for label in wanted})
        summary = {label: stats(r) for label, r in recs.items()}
        (out_dir / f"timeline-{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
        draw(recs, f"TLX forward, {name}: SM activity per schedule", out_dir / f"timeline-{name}.png")
        for label, s in summary.items():
            print(f"{name:36s} {label:22s} makespan {s['makespan_us']:8.1f} us  idle {100 * s['idle_share']:5.1f}%  "
                  f"first SM done {s['first_sm_done_us']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
