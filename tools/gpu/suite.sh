#!/usr/bin/env bash
# The GPU test suite alone (no fuzzer beside it), then compute-sanitizer on the TLX forward's
# adversarial shapes. From the repo root after `source .gpu/device-env.sh`; results in $OUT/suite.tgz.
#   SUITE_SECONDS (default 330): the suite's time limit.
set -u
source "$(dirname "$0")/lib.sh"; results_dir suite
step "${SUITE_SECONDS:-330}" python3 -m pytest tests --device cuda -n 14 -v -rfE -p no:cacheprovider --timeout 240 \
  --timeout-method thread --durations 15 --junitxml $R/junit-cuda.xml > $R/pytest.log 2>&1
grep -E "^(FAILED|ERROR)|node down|passed|failed" $R/pytest.log | tail -25
# --report-api-errors no: Triton's loader probes cuFuncSetAttribute and handles the refusal (not a kernel error)
for tool in memcheck racecheck; do
  step 45 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
    python3 -m jfa.kernels.tlx.hopper.gpu_check sanitize > $R/sanitizer-$tool.log 2>&1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAIL|Error" $R/sanitizer-$tool.log | sort | uniq -c | head -6
done
