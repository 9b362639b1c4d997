#!/usr/bin/env bash
# Nsight Compute on the TLX kernels (from the repo root, after `source .gpu/device-env.sh`): for the gem
# shape(s) whose name contains SHAPE (default longtail-B256-L4096-H4-D128), one launch of each kernel matching
# KERNELS (default the forward and the dK/dV kernel), the second launch (the first compiles), with
# the full section set (pipe utilisation, warp stall reasons, per-instruction stall samples). The clocks are
# left alone (--clock-control none: METHOD.md). Reports and their text pages land in $OUT/profile.tgz.
#   SET (default full); the JFA_TLX_* switches in the environment reach the profiled program.
set -u
source "$(dirname "$0")/lib.sh"; results_dir profile
for kernel in ${KERNELS:-jagged_fwd_tlx_kernel jagged_dkdv_tlx_kernel}; do
  step ${PROFILE_SECONDS:-240} ncu --clock-control none --set ${SET:-full} --import-source yes \
    -k "regex:^$kernel\$" -s 1 -c 1 -f -o $R/$kernel \
    python3 -m jfa.bench.ablation profile --only "${SHAPE:-longtail-B256-L4096-H4-D128}" \
    > $R/$kernel.ncu.log 2>&1
  tail -3 $R/$kernel.ncu.log
  [ -f $R/$kernel.ncu-rep ] || continue
  ncu -i $R/$kernel.ncu-rep --page details --print-units base > $R/$kernel.details.txt 2>&1
  ncu -i $R/$kernel.ncu-rep --page source --csv --print-source sass > $R/$kernel.sass.csv 2>&1
  ncu -i $R/$kernel.ncu-rep --page source --csv --print-source cuda > $R/$kernel.lines.csv 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A" \
    $R/$kernel.details.txt | head -12
done
