#!/usr/bin/env bash
# Quick interleaved timing of `ferry-mover copy` against cp and rsync on a tmpfs in a private mount
# namespace (the engine's own tuning loop; `make bench-local` is the full harness).
#
#   tests/scripts/engine-quick-bench.sh ROUNDS "small medium big" "ferry cp cp-a rsync" [AUTOGROUP_NICE]
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
    cp) cp -r --preserve=mode,ownership,timestamps "$w/src/$2" "$3" ;;
    cp-a) cp -a "$w/src/$2" "$3" ;;
    rsync) rsync -a "$w/src/$2/" "$3/" ;;
  esac
}
declare -A times
n=0
for ds in $datasets; do for t in $tools; do run "$t" "$ds" "$w/warm-$ds-$t"; done; done
rm -rf "$w"/warm-*
for r in $(seq 1 "$rounds"); do
  for ds in $datasets; do for t in $tools; do
    n=$((n + 1))
    s=$(date +%s.%N); run "$t" "$ds" "$w/out-$n"; e=$(date +%s.%N)
    times[$ds.$t]+=" $(echo "$e - $s" | bc)"
  done; done
  rm -rf "$w"/out-*   # tmpfs: no inode-reuse trap, deleting is cheap
done
for ds in $datasets; do
  fm=$(echo ${times[$ds.ferry]:-0} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  for t in $tools; do
    m=$(echo ${times[$ds.$t]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    printf '%-7s %-6s median %6.3f s  %5.2fx ferry  (all:%s)\n' "$ds" "$t" "$m" "$(echo "$m / $fm" | bc -l)" "${times[$ds.$t]}"
  done
done
umount "$w" && rmdir "$w"
