#!/usr/bin/env bash
# Block-sparse attention on the H200: the GPU suite (every test; the block-sparse and selection tests among
# them, and the dense TLX kernels' tests, which share the changed kernels), compute-sanitizer on the
# catalogue's small shapes (block-sparse ones included), then `python -m jfa.bench.sparse` (jfa dense vs
# block-sparse vs FlexAttention's block mask on the same blocks). From the repo root after
# `source .gpu/device-env.sh`; results in $OUT/sparse.tgz.
#   PART: "tests" (suite + sanitizers), "bench" (the benchmark), "profile" (Nsight Compute on the TLX dK/dV
#         kernel of PROFILE_SHAPE, default full-B8, with the lists made beforehand, at each of PROFILE_KEEPS,
#         default "0.5 1.0"), "variants" (the benchmark once per setting of VARIANTS, a space-separated list
#         of NAME:JFA_TLX_VARIANT:JFA_TLX_BWD_VARIANT, in turn, ROUNDS times) or "all" (tests and bench;
#         default)
#   BENCH_ARGS: more arguments for the benchmark (e.g. --keep 0.5 --only full-B8)
#   SUITE_SECONDS (default 330), WORKERS (default 16): the suite's time limit and xdist workers
set -u
source "$(dirname "$0")/lib.sh"; results_dir sparse
part=${PART:-all}
if [ "$part" = profile ]; then
  for keep in ${PROFILE_KEEPS:-0.5 1.0}; do
    step ${PROFILE_SECONDS:-150} ncu --clock-control none --set full --import-source yes \
      -k "regex:^${PROFILE_KERNEL:-jagged_dkdv_tlx_kernel}\$" -s 3 -c 1 -f -o /tmp/dkdv-$keep \
      python3 -m jfa.bench.sparse --out /tmp/ncu-bench-$keep --keep $keep --impls jfa-sparse-lists --repeats 1 \
      --only "${PROFILE_SHAPE:-full-B8}" > $R/ncu-$keep.log 2>&1
    tail -2 $R/ncu-$keep.log
    ncu -i /tmp/dkdv-$keep.ncu-rep --page details --print-units base > $R/dkdv-$keep.details.txt 2>&1
    ncu -i /tmp/dkdv-$keep.ncu-rep --page source --csv --print-source sass > $R/dkdv-$keep.sass.csv 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|Executed Ipc A" \
      $R/dkdv-$keep.details.txt | head -8
  done
  exit 0
fi
if [ "$part" = variants ]; then
  for round in $(seq ${ROUNDS:-1}); do
    for spec in ${VARIANTS:-shipped::}; do
      IFS=: read -r name fwd bwd <<< "$spec"
      JFA_TLX_VARIANT="$fwd" JFA_TLX_BWD_VARIANT="$bwd" step "${BENCH_SECONDS:-240}" python3 -m jfa.bench.sparse \
        --out $R/$name-$round --repeats "${REPEATS:-3}" ${BENCH_ARGS:-} > $R/$name-$round.log 2>&1
      echo "-- $name (fwd '$fwd', bwd '$bwd') round $round"; cat $R/$name-$round/sparse.md 2>/dev/null | grep -E "jfa|impl"
    done
  done
  exit 0
fi
if [ "$part" != bench ]; then
  step "${SUITE_SECONDS:-330}" python3 -m pytest tests --device cuda -n "${WORKERS:-16}" -q -rfE -p no:cacheprovider \
    --timeout 240 --timeout-method thread --durations 15 --junitxml $R/junit-cuda.xml > $R/pytest.log 2>&1
  grep -E "^(FAILED|ERROR)|node down|passed|failed" $R/pytest.log | tail -25
  share_cores 1
  sanitize 60 fwd
  sanitize 120 bwd --backward
fi
if [ "$part" != tests ]; then
  step "${BENCH_SECONDS:-420}" python3 -m jfa.bench.sparse --out $R/bench --repeats "${REPEATS:-3}" ${BENCH_ARGS:-} \
    > $R/bench.log 2>&1
  tail -3 $R/bench.log; cat $R/bench/sparse.md 2>/dev/null
fi
