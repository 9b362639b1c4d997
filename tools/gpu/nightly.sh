#!/usr/bin/env bash
# The nightly fuzzer's numbers on one GPU host (issue 22), from the repo root after
# `source .gpu/device-env.sh`: the GPU test suite at one xdist worker per core (the suite shares the
# cores out itself: no worker may be lost), then a `jfa fuzz` campaign with its defaults (workers,
# mix, twin oracle) on the Triton cache the suite warmed. Results in $OUT/nightly.tgz.
# Then the MXFP8 fuzzer (`python -m jfa.fuzz.mx`: bounds (a) and (b) on every example), MX_WORKERS seeds
# side by side for MX_MINUTES.
#   WORKERS (default: nproc), SUITE_SECONDS (default 330), PART (I/N: only that part of the suite, pytest --part),
#   FUZZ_MINUTES (default 2.5), FUZZ_ARGS (extra),
#   MX_WORKERS (default 4), MX_MINUTES (default 1.5).
set -u
source "$(dirname "$0")/lib.sh"; results_dir nightly
{ nvidia-smi -L; echo "cpus $(nproc)"; } > $R/host.txt
step "${SUITE_SECONDS:-330}" python3 -m pytest tests ${PART:+--part $PART} --device cuda -n "${WORKERS:-$(nproc)}" -q -rfE -p no:cacheprovider \
  --timeout 240 --timeout-method thread --durations 10 --junitxml $R/junit-cuda.xml > $R/pytest.log 2>&1
grep -E "^(FAILED|ERROR)|node down|replacing crashed|passed|failed" $R/pytest.log | tail -20
m=${FUZZ_MINUTES:-2.5}
step $(python3 -c "print(int($m * 60 + 60))") python3 -m jfa.cli fuzz --minutes $m --out $R/fuzz ${FUZZ_ARGS:-} > $R/fuzz.log 2>&1
tail -3 $R/fuzz.log; cat $R/fuzz/summary.md 2>/dev/null | head -30
mx=${MX_MINUTES:-1.5}; share_cores "${MX_WORKERS:-4}"
for s in $(seq 1 "${MX_WORKERS:-4}"); do
  step $(python3 -c "print(int($mx * 60 + 90))") python3 -m jfa.fuzz.mx --examples 100000 --minutes $mx --seed $s \
    --device cuda --out $R/mx-fuzz-$s --quiet > $R/mx-fuzz-$s.log 2>&1 &
done; wait
tail -q -n 1 $R/mx-fuzz-*.log
