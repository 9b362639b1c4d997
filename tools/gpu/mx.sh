#!/usr/bin/env bash
# MXFP8 on the H200: the MX tests (quantizer, oracle, bounds, kernels, API, fuzzer), the MX fuzzer on CUDA for
# FUZZ_MINUTES (default 2; examples written as they finish), then the MX benchmark beside bf16 (BENCH=1).
# From the repo root after `source .gpu/device-env.sh`; results in $OUT/mx.tgz.
#   WORKERS (default 8): xdist workers for the tests, the cores shared out between them.
set -u
source "$(dirname "$0")/lib.sh"; results_dir mx
share_cores "${WORKERS:-8}"
step "${TEST_SECONDS:-240}" python3 -m pytest tests/test_mx*.py --device cuda -n "${WORKERS:-8}" -q \
  -rfE -p no:cacheprovider --timeout 200 --timeout-method thread --durations 10 > $R/pytest.log 2>&1
grep -E "^(FAILED|ERROR)|node down|passed|failed" $R/pytest.log | tail -25
share_cores 1
step $(( ${FUZZ_MINUTES:-2} * 60 + 90 )) python3 -m jfa.fuzz.mx --device cuda --minutes "${FUZZ_MINUTES:-2}" \
  --out $R/fuzz > $R/fuzz.log 2>&1
tail -5 $R/fuzz.log
if [ "${BENCH:-0}" = 1 ]; then
  step "${BENCH_SECONDS:-300}" python3 -m jfa.bench --suite gem --impls "${IMPLS:-jfa-tlx,jfa-mxfp8}" --pass fwd,bwd \
    --repeats "${REPEATS:-1}" --no-plots --out $R/bench > $R/bench.log 2>&1
  tail -3 $R/bench.log; cat $R/bench/*.md 2>/dev/null | head -40
fi
true
