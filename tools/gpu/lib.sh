# Shared by the tools/gpu/*.sh scripts: `step LIMIT CMD...` runs CMD under a hard time limit and says
# how it ended (a hung kernel shows up as rc=137); `pack_on_exit NAME` tars /tmp/jfa-NAME into
# $OUT/NAME.tgz when the script exits (the device tool returns at most 8 files from $OUT).
export PYTHONUNBUFFERED=1
step() { local t=$1; shift; echo "== $* (limit ${t}s)"; local s=$SECONDS; timeout -s KILL "$t" "$@"; local rc=$?
         echo "== rc=$rc after $((SECONDS - s))s: $*"; }
results_dir() { OUT=${OUT:-gpu-out}; mkdir -p "$OUT"; R=/tmp/jfa-$1; rm -rf "$R"; mkdir -p "$R"
                trap "tar czf '$OUT/$1.tgz' -C /tmp 'jfa-$1' 2>/dev/null" EXIT; }
