#!/usr/bin/env bash
# Quick interleaved timing of `ferry-mover copy` against cp and rsync on a tmpfs in a private mount
# namespace (the engine's own tuning loop; `make bench-local` is the full harness).
#
#   tests/scripts/engine-quick-bench.sh ROUNDS "small medium big" "ferry cp cp-a rsync" [AUTOGROUP_NICE]
#
# More ferry contenders: `ferry-jN` runs ferry with --jobs N; `ferry-base` runs the build named by
# FERRY_BASE_BIN (an older commit, to measure a change against it in the same rounds).
#
# Besides the wall time it reports each contender's CPU time (user + system of the process and its
# threads, from the shell's child rusage): on a machine shared with other sessions the wall-time
# ratio depends on how much CPU the session gets, the CPU-time ratio does not.
#
# AUTOGROUP_NICE (optional, root): the scheduler shares CPU per session ("autogroup"), so on a machine
# busy with other sessions every contender gets the same slice whatever its thread count, and a
# parallel copier cannot show its speed-up. Giving this session's autogroup a negative nice for the
# length of the run measures what the tools do with the machine's cores; it applies to all
# contenders alike (they run one after the other in this session).
set -euo pipefail
if [[ -z "${ENGINE_BENCH_INNER:-}" ]]; then
  export ENGINE_BENCH_INNER=1
  exec setsid unshare -m --propagation private -- "$0" "$@"
fi
rounds=$1 datasets=$2 tools=$3 agnice=${4:-}
[[ -n "$agnice" ]] && echo "$agnice" > /proc/$$/autogroup
ferry=${FERRY_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/ferry-mover}
w=$(mktemp -d /tmp/engine-bench.XXXXXX)
mount -t tmpfs -o size=12g tmpfs "$w"
python3 - "$w/src" "$datasets" <<'PY'
import os, random, sys
root, want = sys.argv[1], sys.argv[2].split()
rnd = random.Random(42)
def tree(name, n, size, dirs):
    for d in range(dirs):
        os.makedirs(f"{root}/{name}/d{d:03}", exist_ok=True)
    blob = rnd.randbytes(size + 4096)
    for i in range(n):
        with open(f"{root}/{name}/d{i % dirs:03}/f{i:06}", "wb") as f:
            f.write(blob[i % 4096:i % 4096 + size])
if "small" in want: tree("small", 50000, 4096, 100)
if "medium" in want: tree("medium", 3000, 100 * 1024, 30)
if "big" in want:
    os.makedirs(f"{root}/big", exist_ok=True)
    with open(f"{root}/big/file", "wb") as f:
        for _ in range(1024): f.write(rnd.randbytes(1 << 20))
PY
run() { # tool dataset destination
  case $1 in
    ferry) "$ferry" copy --json "$w/src/$2" "$3" >/dev/null ;;
    ferry-j*) "$ferry" copy --jobs "${1#ferry-j}" --json "$w/src/$2" "$3" >/dev/null ;;
    ferry-base) "${FERRY_BASE_BIN:?ferry-base needs FERRY_BASE_BIN}" copy --json "$w/src/$2" "$3" >/dev/null ;;
    cp) cp -r --preserve=mode,ownership,timestamps "$w/src/$2" "$3" ;;
    cp-a) cp -a "$w/src/$2" "$3" ;;
    rsync) rsync -a "$w/src/$2/" "$3/" ;;
  esac
}
# Sets cpu_ms to the CPU milliseconds (user + system) of all waited-for children so far. Pure
# bash on purpose: `times` must run in this shell (a subshell reports its own, empty, children)
# and any helper process would add its own CPU to the next measurement.
child_cpu() {
  local skip u s f
  times > "$w/.times"
  { read -r skip; read -r u s; } < "$w/.times"
  cpu_ms=0
  for f in "$u" "$s"; do # "XmY.YYYs"
    f=${f%s}; local min=${f%%m*} sec=${f#*m}
    cpu_ms=$((cpu_ms + min * 60000 + 10#${sec%.*} * 1000 + 10#${sec#*.}))
  done
}
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A times cpus
n=0
for ds in $datasets; do for t in $tools; do run "$t" "$ds" "$w/warm-$ds-$t"; done; done
rm -rf "$w"/warm-*
for r in $(seq 1 "$rounds"); do
  for ds in $datasets; do for t in $tools; do
    n=$((n + 1))
    child_cpu; c0=$cpu_ms; s=$EPOCHREALTIME
    run "$t" "$ds" "$w/out-$n"
    e=$EPOCHREALTIME; child_cpu
    times[$ds.$t]+=" $(echo "$e - $s" | bc)"
    cpus[$ds.$t]+=" $(echo "scale=3; ($cpu_ms - $c0) / 1000" | bc)"
  done; done
  rm -rf "$w"/out-*   # tmpfs: no inode-reuse trap, deleting is cheap
done
for ds in $datasets; do
  fm=$(echo ${times[$ds.ferry]:-0} | median)
  fc=$(echo ${cpus[$ds.ferry]:-0} | median)
  for t in $tools; do
    m=$(echo ${times[$ds.$t]} | median)
    c=$(echo ${cpus[$ds.$t]} | median)
    printf '%-7s %-10s median %6.3f s  %5.2fx ferry   cpu %6.3f s  %5.2fx ferry  (all:%s)\n' "$ds" "$t" \
      "$m" "$(echo "$m / $fm" | bc -l)" "$c" "$(echo "$c / $fc" | bc -l)" "${times[$ds.$t]}"
  done
done
umount "$w" && rmdir "$w"
