#!/usr/bin/env bash
# A/B of the opt-in TLX build flags (from the repo root, after `source .gpu/device-env.sh`): first
# correctness, both runs at once (JFA_TLX_OWN_WAITS=1 on every TLX test and the kernel suite; the fused
# dQ and deterministic tests with the default build), then timing alone on the GPU: the forward
# (`gpu_check bench`) and the backward (`gpu_check bwd`, which includes the fused dQ) with and without
# JFA_TLX_OWN_WAITS. Everything lands in $OUT/flags.tgz.
#   CHECKS: the gpu_check timing commands (default "bench bwd"; also ablation, bwd-ablation), each with a
#   CHECK_SECONDS limit (default 160) per wait build; TESTS=0 skips the tests.
set -u
source "$(dirname "$0")/lib.sh"; results_dir flags
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.csv
PYTEST="python3 -m pytest --device cuda -q -rfE -p no:cacheprovider --timeout 200 --timeout-method thread"
if [[ ${TESTS:-1} == 1 ]]; then
step ${TEST_SECONDS:-270} env JFA_TLX_OWN_WAITS=1 $PYTEST tests/test_tlx_gpu.py tests/test_kernels.py -n 6 \
  --junitxml $R/junit-own-waits.xml > $R/pytest-own-waits.log 2>&1 &
step ${TEST_SECONDS:-270} $PYTEST tests/test_tlx_gpu.py -k "fused or deterministic" -n 3 \
  --junitxml $R/junit-fused.xml > $R/pytest-fused.log 2>&1
wait
for log in own-waits fused; do echo "-- $log"; tail -2 $R/pytest-$log.log; grep -E "^(FAILED|ERROR)" $R/pytest-$log.log | head -12; done
fi
for what in ${CHECKS:-bench bwd}; do
  for flag in 0 1; do
    step ${CHECK_SECONDS:-160} env JFA_TLX_OWN_WAITS=$flag python3 -m jfa.kernels.tlx.hopper.gpu_check $what --rep ${REP:-40} \
      --out $R/$what-own-waits-$flag.json 2>&1 | tee $R/$what-own-waits-$flag.log
  done
done
