# Shared by the tools/gpu/*.sh scripts: `step LIMIT CMD...` runs CMD under a hard time limit and says
# how it ended (a hung kernel shows up as rc=137); `pack_on_exit NAME` tars /tmp/jfa-NAME into
# $OUT/NAME.tgz when the script exits (the device tool returns at most 8 files from $OUT).
export PYTHONUNBUFFERED=1
step() { local t=$1; shift; echo "== $* (limit ${t}s)"; local s=$SECONDS; timeout -s KILL "$t" "$@"; local rc=$?
         echo "== rc=$rc after $((SECONDS - s))s: $*"; }
results_dir() { OUT=${OUT:-gpu-out}; mkdir -p "$OUT"; R=/tmp/jfa-$1; rm -rf "$R"; mkdir -p "$R"
                trap "tar czf '$OUT/$1.tgz' -C /tmp 'jfa-$1' 2>/dev/null" EXIT; }
# `sanitize LIMIT NAME [ARGS...]`: compute-sanitizer memcheck and racecheck over `python -m jfa.fuzz.sanitize ARGS`
# (the TLX kernels on adversarial shapes), logs in $R/sanitizer-NAME-TOOL.log, a summary on stdout.
# --report-api-errors no: Triton's loader probes cuFuncSetAttribute and handles the refusal (not a kernel error)
sanitize() { local t=$1 name=$2; shift 2; for tool in ${SANITIZERS:-memcheck racecheck}; do
  step "$t" compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
    python3 -m jfa.fuzz.sanitize "$@" > $R/sanitizer-$name-$tool.log 2>&1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAIL|Error" $R/sanitizer-$name-$tool.log | sort | uniq -c | head -6; done; }
# `share_cores N`: N processes will run at once; give each nproc / N CPU threads (numpy, torch, BLAS), so
# that the CPU oracle of one does not starve the others into timeouts.
share_cores() { local t=$(( $(nproc) / $1 )); [ $t -lt 1 ] && t=1
                export OMP_NUM_THREADS=$t MKL_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t; }
