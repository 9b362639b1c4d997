#!/usr/bin/env bash
# Hang hunt (from the repo root, after `source .gpu/device-env.sh`): the tests of a -k selection split
# over SHARDS plain pytest processes at once. Without xdist a test that reaches the per-test timeout
# dumps every thread's stack into its shard's log (under xdist the worker just goes "node down").
# Everything lands in $OUT/shards.tgz.
#   TESTS: the -k expression; FILES (default tests/test_tlx_gpu.py; node ids work too); SHARDS (default 8); TEST_TIMEOUT per
#   test (default 120 s); SHARD_SECONDS for a whole shard (default 240).
set -u
source "$(dirname "$0")/lib.sh"; results_dir shards
python3 -m pytest ${FILES:-tests/test_tlx_gpu.py} --device cuda --collect-only -q -p no:cacheprovider \
  -k "${TESTS:?TESTS: a -k expression}" | grep "::" > $R/ids.txt
n=${SHARDS:-8}
# the oracle (numpy/torch on the CPU) is multithreaded: n shards each using every core thrash (a
# many-items case took 14 s alone and over 250 s beside 7 others, 2026-11-29): share the cores out
threads=$(( $(nproc) / n )); [ $threads -lt 1 ] && threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} MKL_NUM_THREADS=${MKL_NUM_THREADS:-$threads} \
  OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$threads}
echo "$(wc -l < $R/ids.txt) tests in $n shards, $OMP_NUM_THREADS CPU threads each"
for s in $(seq 0 $((n - 1))); do
  awk -v s=$s -v n=$n 'NR % n == s' $R/ids.txt > $R/shard-$s.txt
  # xargs, not $(cat ...): the ids' brackets must not glob; -r: an empty shard must not run every test
  step ${SHARD_SECONDS:-240} xargs -r -d '\n' -a $R/shard-$s.txt python3 -m pytest --device cuda -q -rfE \
    -p no:cacheprovider --timeout ${TEST_TIMEOUT:-120} --timeout-method thread --junitxml $R/junit-$s.xml \
    > $R/shard-$s.log 2>&1 &
done
wait
for s in $(seq 0 $((n - 1))); do
  echo "-- shard $s: $(grep -cE 'passed|failed' $R/shard-$s.log) summary line(s)"; tail -1 $R/shard-$s.log
  grep -E "^(FAILED|ERROR)|Timeout|^E  " $R/shard-$s.log | head -8
done
