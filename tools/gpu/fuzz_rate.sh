#!/usr/bin/env bash
# jfa fuzz's rate on one GPU host with its defaults (issue 22), from the repo root after
# `source .gpu/device-env.sh`: a first campaign on a cold Triton cache (a first night), a second with
# another seed on the cache the first filled (every later night, with TRITON_CACHE_DIR kept), then
# MUTANT with --until-found on the whole machine. Results in $OUT/fuzz-rate.tgz.
#   MINUTES per campaign (default 2.5), MUTANT (default head-dim-mask-off-by-one; empty: none).
set -u
source "$(dirname "$0")/lib.sh"; results_dir fuzz-rate
export TRITON_CACHE_DIR=/tmp/jfa-fuzz-rate-cache; rm -rf "$TRITON_CACHE_DIR"
m=${MINUTES:-2.5}
limit=$(python3 -c "print(int($m * 60 + 50))")
for night in cold:101 warm:102; do
  name=${night%%:*}
  step $limit python3 -m jfa.cli fuzz --minutes $m --seed ${night##*:} --out $R/$name > $R/$name.log 2>&1
  sed -n 2,4p $R/$name/summary.md
done
mutant=${MUTANT-head-dim-mask-off-by-one}
if [[ -n $mutant ]]; then
  step 170 python3 -m jfa.cli fuzz --mutant $mutant --until-found --minutes 2 --seed 103 --hang-seconds 45 \
    --out $R/mutant > $R/mutant.log 2>&1
  sed -n 2,4p $R/mutant/summary.md; grep "failures:" $R/mutant/summary.md
fi
