#!/usr/bin/env bash
# GPU timing pass, alone on the GPU (from the repo root, after `source .gpu/device-env.sh`): the TLX
# ablation, the gem suite beside the peers, and the SM timelines. Everything lands in $OUT/timing.tgz.
#   IMPLS: the jfa bench implementations (default jfa-tlx,jfa-triton,torch-varlen; add flex-docmask,
#   sdpa-padded,sdpa-njt,fa4-varlen for every peer).
set -u
source "$(dirname "$0")/lib.sh"; results_dir timing
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.csv
step 180 python3 -m jfa.kernels.tlx.hopper.gpu_check ablation --rep 60 --out $R/ablation.json
step 240 python3 -m jfa.bench --suite gem --impls "${IMPLS:-jfa-tlx,jfa-triton,torch-varlen}" --pass fwd,bwd --rep 60 \
  --out $R/bench --write-benchmarks $R/BENCHMARKS-run.md
step 100 python3 -m jfa.bench.timeline --out $R/timeline
