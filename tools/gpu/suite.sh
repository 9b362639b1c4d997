#!/usr/bin/env bash
# The GPU test suite alone (no fuzzer beside it), then compute-sanitizer on the TLX kernels'
# adversarial shapes (forward, then with the gradients). From the repo root after `source .gpu/device-env.sh`; results in $OUT/suite.tgz.
#   SUITE_SECONDS (default 330): the suite's time limit; WORKERS (default 8) xdist workers, the cores shared
#   out between them.
#   PART (I/N, optional): only part I of N of the tests (pytest --part), for a suite longer than one call.
set -u
source "$(dirname "$0")/lib.sh"; results_dir suite
share_cores "${WORKERS:-8}"
step "${SUITE_SECONDS:-330}" python3 -m pytest tests ${PART:+--part $PART} --device cuda -n "${WORKERS:-8}" -v -rfE -p no:cacheprovider --timeout 240 \
  --timeout-method thread --durations 15 --junitxml $R/junit-cuda.xml > $R/pytest.log 2>&1
grep -E "^(FAILED|ERROR)|node down|passed|failed" $R/pytest.log | tail -25
share_cores 1
sanitize 45 fwd
sanitize 60 bwd --backward
