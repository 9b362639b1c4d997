#!/usr/bin/env bash
# Simulator fidelity (from the repo root, after `source .gpu/device-env.sh`): the simulator-scale TLX
# catalogue on the GPU's TLX kernels (`python -m jfa.fuzz.fidelity record`), then the same cases on the
# simulator on this machine's CPU (`compare`), beside a short TLX fuzz on the GPU. Results in
# $OUT/fidelity.tgz.
#   FUZZ_MINUTES (default 2; 0: no fuzz), COMPARE_WORKERS (default 12).
set -u
source "$(dirname "$0")/lib.sh"; results_dir fidelity
share_cores 1
step ${RECORD_SECONDS:-150} python3 -m jfa.fuzz.fidelity record --out /tmp/jfa-records > $R/record.log 2>&1
tail -2 $R/record.log
if [ "${FUZZ_MINUTES:-2}" != 0 ]; then
  ( export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    timeout -s KILL 200 python3 -m jfa.cli fuzz --backend tlx --device cuda --minutes "${FUZZ_MINUTES:-2}" \
      --workers 4 --out $R/fuzz > $R/fuzz.log 2>&1 ) &
  FUZZ=$!
fi
step ${COMPARE_SECONDS:-200} python3 -m jfa.fuzz.fidelity compare /tmp/jfa-records --workers "${COMPARE_WORKERS:-12}" \
  --json $R/fidelity.jsonl > $R/compare.log 2>&1
cat $R/compare.log | tail -12
if [ -n "${FUZZ:-}" ]; then wait $FUZZ; echo "== fuzz rc=$?"; cat $R/fuzz/summary.md 2>/dev/null || tail -5 $R/fuzz.log; fi
