#!/usr/bin/env bash
# TLX backward pass on the GPU (from the repo root, after `source .gpu/device-env.sh`): the backward's
# oracle tests, its ablation (jfa.bench.ablation backward), compute-sanitizer on the gradients of the
# adversarial shapes. Everything lands in $OUT/backward.tgz.
#   TESTS: pytest -k expression (default "dkdv or backward"); ONLY: the ablation's columns (its --only; default
#   all), ROUNDS its rounds (default 1), SUITE its suite (default gem); PHASES: gem shapes whose dK/dV item
#   phases the profiling build records (jfa.bench.timeline --backward) as shipped and under each
#   JFA_TLX_BWD_VARIANT of VARIANTS (space-separated), e.g. PHASES="uniform-B1152-L1000-H2-D64"
#   VARIANTS="item_prefetch=always"; SANITIZERS: the compute-sanitizer tools (default memcheck racecheck; none: no
#   sanitizer pass). The JFA_TLX_* settings in the environment reach every step (the sanitizer's too).
set -u
source "$(dirname "$0")/lib.sh"; results_dir backward
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.csv
step ${TEST_SECONDS:-240} python3 -m pytest tests/test_tlx_gpu.py --device cuda -n ${WORKERS:-6} -q -rfE -p no:cacheprovider -k "${TESTS:-dkdv or backward}" \
  --timeout 150 --timeout-method thread --junitxml $R/junit-tlx-bwd.xml > $R/pytest-tlx-bwd.log 2>&1
tail -3 $R/pytest-tlx-bwd.log; grep -E "^(FAILED|ERROR)" $R/pytest-tlx-bwd.log | head -20
step ${ABLATION_SECONDS:-150} python3 -m jfa.bench.ablation backward --suite ${SUITE:-gem} --rep ${REP:-60} \
  --rounds ${ROUNDS:-1} --only "${ONLY:-}" --out $R/backward.json 2>&1 | tee $R/backward.log
if [ -n "${PHASES:-}" ]; then
  shapes=$(for s in $PHASES; do printf -- '--shape %s ' "$s"; done)
  for v in "" ${VARIANTS:-}; do
    step ${PHASES_SECONDS:-120} env ${v:+JFA_TLX_BWD_VARIANT=$v} python3 -m jfa.bench.timeline --backward --suite gem \
      $shapes --out $R/phases-${v:-shipped} 2>&1 | tee $R/phases-${v:-shipped}.log | grep -v '^=='
  done
fi
[ "${SANITIZERS:-}" = none ] || sanitize 90 bwd --backward
