#!/usr/bin/env bash
# Block-sparse attention on the H200: the GPU suite (every test; the block-sparse and selection tests among
# them, and the dense TLX kernels' tests, which share the changed kernels), compute-sanitizer on the
# catalogue's small shapes (block-sparse ones included), then `python -m jfa.bench.sparse` (jfa dense vs
# block-sparse vs FlexAttention's block mask on the same blocks). From the repo root after
# `source .gpu/device-env.sh`; results in $OUT/sparse.tgz.
#   PART: "tests" (suite + sanitizers), "bench" (the benchmark) or "all" (default)
#   SUITE_SECONDS (default 330), WORKERS (default 16): the suite's time limit and xdist workers
set -u
source "$(dirname "$0")/lib.sh"; results_dir sparse
part=${PART:-all}
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
