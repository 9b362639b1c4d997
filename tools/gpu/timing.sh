#!/usr/bin/env bash
# GPU timing pass, alone on the GPU (from the repo root, after `source .gpu/device-env.sh`): the TLX
# ablation, a jfa bench suite beside the peers, and the SM timelines. Everything lands in $OUT/timing.tgz.
#   STEPS: which parts (default "ablation bench timeline"); SUITE: the bench suite (default gem; all =
#   gem, sweep, dense); IMPLS: the jfa bench implementations (default jfa-tlx,jfa-triton,torch-varlen;
#   add flex-docmask,sdpa-padded,sdpa-njt,fa4-varlen for every peer); REPEATS (default 1): interleaved
#   timings per row, the median reported (jfa bench --repeats).
set -u
source "$(dirname "$0")/lib.sh"; results_dir timing
STEPS=${STEPS:-ablation bench timeline}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.csv
[[ $STEPS == *ablation* ]] && step 180 python3 -m jfa.bench.ablation forward --rep 60 --out $R/ablation.json
[[ $STEPS == *bench* ]] && step ${BENCH_SECONDS:-240} python3 -m jfa.bench --suite "${SUITE:-gem}" \
  --impls "${IMPLS:-jfa-tlx,jfa-triton,torch-varlen}" --pass fwd,bwd --rep 60 --repeats "${REPEATS:-1}" \
  --out $R/bench --write-benchmarks $R/BENCHMARKS-run.md
[[ $STEPS == *timeline* ]] && step 100 python3 -m jfa.bench.timeline --out $R/timeline
true
