#!/usr/bin/env bash
# GPU correctness pass, one command on a Hopper machine (from the repo root, after
# `source .gpu/device-env.sh`): the fuzzer in the background on the same GPU while the suite, the TLX
# GPU tests and compute-sanitizer run in the foreground. Everything lands in $OUT/correctness.tgz.
#   FUZZ_MINUTES (default 8.5), FUZZ_WORKERS (default 6): the fuzzer's budget and processes.
set -u
source "$(dirname "$0")/lib.sh"; results_dir correctness

timeout -s KILL 585 python3 -m jfa.cli fuzz --minutes "${FUZZ_MINUTES:-8.5}" \
  --workers "${FUZZ_WORKERS:-6}" --out $R/fuzz > $R/fuzz.log 2>&1 &
FUZZ=$!

step 170 python3 -m pytest tests/test_tlx_gpu.py --device cuda -n 6 -v -p no:cacheprovider --timeout 120 \
  --timeout-method thread > $R/pytest-tlx.log 2>&1; tail -3 $R/pytest-tlx.log; grep -E "FAILED|ERROR" $R/pytest-tlx.log | head -20
# per-test limit 240 s: the fuzz property test alone takes ~175 s on the H200 (a worker that hits the limit dies,
# "node down"); -v so that a lost worker's test is named
step 270 python3 -m pytest tests --ignore=tests/test_tlx_gpu.py --device cuda -n 8 -v -rfE -p no:cacheprovider --timeout 240 --timeout-method thread \
  --junitxml $R/junit-cuda.xml > $R/pytest.log 2>&1; tail -3 $R/pytest.log; grep -E "FAILED|ERROR|node down" $R/pytest.log | head -20
sanitize 55 bwd --backward
wait $FUZZ; echo "== fuzz rc=$?"; cat $R/fuzz/summary.md 2>/dev/null || tail -5 $R/fuzz.log
