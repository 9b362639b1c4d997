#!/usr/bin/env bash
# jfa fuzz on one GPU, then on every GPU of the host, with the same workers per GPU and a cold Triton
# cache each time: the scaling of the nightly fuzzer (issue 5). From the repo root after
# `source .gpu/device-env.sh`; results (reports, JSONL logs, JUnit) in $OUT/fuzz-scaling.tgz.
#   ONE_MINUTES (default 3.5), ALL_MINUTES (default 4), PER_GPU (workers per GPU, default 8).
set -u
source "$(dirname "$0")/lib.sh"; results_dir fuzz-scaling
GPUS=$(nvidia-smi -L | wc -l); PER_GPU=${PER_GPU:-8}
{ nvidia-smi -L; echo "cpus $(nproc)"; } > $R/host.txt
run_fuzz() {  # NAME MINUTES WORKERS [VISIBLE]
  local limit=$(python3 -c "print(int($2 * 60 + 60))")
  step $limit env TRITON_CACHE_DIR=/tmp/triton-cache-$1 ${4:+CUDA_VISIBLE_DEVICES=$4} \
    python3 -m jfa.cli fuzz --minutes $2 --workers $3 --out $R/$1 > $R/$1.log 2>&1
  tail -4 $R/$1.log; cat $R/$1/summary.md 2>/dev/null | head -30
}
run_fuzz one-gpu "${ONE_MINUTES:-3.5}" $PER_GPU 0
run_fuzz all-gpus "${ALL_MINUTES:-4}" $((PER_GPU * GPUS))
