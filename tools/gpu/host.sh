#!/usr/bin/env bash
# Host time per call (issue 21), alone on the GPU, from the repo root after `source .gpu/device-env.sh`:
# the bench's host_us and times for IMPLS (default jfa-tlx,torch-varlen; add fa4-varlen once FA4 is on the
# path) on SUITE (default gem), then cProfile of each call with jfa's direct launch and with Triton's own
# launch path (--triton-launch), the host time with and without call plans (jfa.plans, interleaved in one
# process), then the CUDA-graph tests; with STEPS naming "kernels", each implementation's GPU time kernel by
# kernel (jfa.bench.kernels, the same inputs in one process). Results in $OUT/host.tgz.
#   STEPS (default "bench profile plans graphs"), REPEATS (default 1), BENCH_SECONDS (default 300),
#   KERNELS_SECONDS (default 150).
set -u
source "$(dirname "$0")/lib.sh"; results_dir host
STEPS=${STEPS:-bench profile plans graphs}
[[ $STEPS == *bench* ]] && step ${BENCH_SECONDS:-300} python3 -m jfa.bench --suite "${SUITE:-gem}" \
  --impls "${IMPLS:-jfa-tlx,torch-varlen}" --pass fwd,bwd --repeats "${REPEATS:-1}" --no-plots --out $R/bench \
  --write-benchmarks $R/BENCHMARKS-run.md > $R/bench.log 2>&1
[[ $STEPS == *bench* ]] && { tail -3 $R/bench.log; cat $R/bench/*.md 2>/dev/null | grep -A12 "host time" | head -30; }
[[ $STEPS == *kernels* ]] && { step ${KERNELS_SECONDS:-150} python3 -m jfa.bench.kernels --suite "${SUITE:-gem}" \
  --impls "${IMPLS:-jfa-tlx,torch-varlen}" --calls 10 --out $R/kernels > $R/kernels.log 2>&1; grep -v "^  " $R/kernels.log; }
if [[ $STEPS == *profile* ]]; then
  step 150 python3 -m jfa.bench.host_profile --suite "${SUITE:-gem}" --calls 30 --out $R/profile
  step 150 python3 -m jfa.bench.host_profile --suite "${SUITE:-gem}" --calls 30 --triton-launch --out $R/profile-triton
fi
[[ $STEPS == *plans* ]] && step 240 python3 -m jfa.bench.host_profile --suite "${SUITE:-gem}" --compare-plans \
  --calls 30 --rounds 7 --out $R/plans
[[ $STEPS == *graphs* ]] && step 180 python3 -m pytest tests/test_tlx_gpu.py --device cuda -q -p no:cacheprovider \
  -k "graph" -rfE > $R/graphs.log 2>&1; tail -5 $R/graphs.log
true
