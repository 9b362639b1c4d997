#!/usr/bin/env bash
# The nightly fuzzer's numbers on one GPU host (issue 22), from the repo root after
# `source .gpu/device-env.sh`: the GPU test suite at one xdist worker per core (the suite shares the
# cores out itself: no worker may be lost), then a `jfa fuzz` campaign with its defaults (workers,
# mix, twin oracle) on the Triton cache the suite warmed. Results in $OUT/nightly.tgz.
#   WORKERS (default: nproc), SUITE_SECONDS (default 330), FUZZ_MINUTES (default 2.5), FUZZ_ARGS (extra).
set -u
source "$(dirname "$0")/lib.sh"; results_dir nightly
{ nvidia-smi -L; echo "cpus $(nproc)"; } > $R/host.txt
step "${SUITE_SECONDS:-330}" python3 -m pytest tests --device cuda -n "${WORKERS:-$(nproc)}" -q -rfE -p no:cacheprovider \
  --timeout 240 --timeout-method thread --durations 10 --junitxml $R/junit-cuda.xml > $R/pytest.log 2>&1
grep -E "^(FAILED|ERROR)|node down|replacing crashed|passed|failed" $R/pytest.log | tail -20
m=${FUZZ_MINUTES:-2.5}
step $(python3 -c "print(int($m * 60 + 60))") python3 -m jfa.cli fuzz --minutes $m --out $R/fuzz ${FUZZ_ARGS:-} > $R/fuzz.log 2>&1
tail -3 $R/fuzz.log; cat $R/fuzz/summary.md 2>/dev/null | head -30
