#!/usr/bin/env bash
# Time to find each mutant with the nightly profile on this GPU host (issue 22): `python -m
# jfa.fuzz.kill_speed`, PARALLEL campaigns at once sharing the machine, each up to MINUTES. From the
# repo root after `source .gpu/device-env.sh`; results in $OUT/kill-speed.tgz.
#   MINUTES (default 2), PARALLEL (default 8), WORKERS per campaign (default 2), MUTANTS (default all),
#   HANG_SECONDS (default 45), LIMIT for the whole run (default 560).
set -u
source "$(dirname "$0")/lib.sh"; results_dir kill-speed
step "${LIMIT:-560}" python3 -m jfa.fuzz.kill_speed --minutes "${MINUTES:-2}" --parallel "${PARALLEL:-8}" \
  --workers "${WORKERS:-2}" --hang-seconds "${HANG_SECONDS:-45}" ${MUTANTS:+--mutants $MUTANTS} --out $R \
  > $R/kill-speed.log 2>&1
tail -45 $R/kill-speed.log
