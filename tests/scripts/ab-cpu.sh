#!/usr/bin/env bash
# CPU time and page faults of each end of two ferry-mover builds (`perf stat` per process): one
# 1 GiB file and 20 000 x 4 KiB files sent over loopback mutual TLS into tmpfs, rounds
# interleaved (old, new, ...). Prints medians per end: CPU milliseconds per GiB and per 1 000
# files, page faults, and new/old. CPU time, unlike wall time, hardly depends on what else the
# machine runs, so this tells where a change moved the cost even on a busy machine.
#
#   [STREAMS=2] tests/scripts/ab-cpu.sh OLD_BIN NEW_BIN [ROUNDS]   (ROUNDS default 5)
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OLD_BIN NEW_BIN [ROUNDS]" >&2; exit 2; }
command -v perf >/dev/null || { echo "$0: perf is missing (make deps)" >&2; exit 2; }
OLD=$1 NEW=$2 ROUNDS=${3:-5} STREAMS=${STREAMS:-2}
w=$(mktemp -d /dev/shm/abcpu.XXXX)
trap 'rm -rf "$w"' EXIT
# shellcheck source=ab-data.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab-data.sh"
ab_big "$w/big"
ab_small "$w/small"
"$NEW" certs --out "$w/pki" --transfer abc >/dev/null 2>&1
tls() { echo --transfer abc --ca "$w/pki/ca.crt" --cert "$w/pki/$1.crt" --key "$w/pki/$1.key"; }
# One run: prints "recv_ms send_ms recv_faults send_faults".
run() { # bin data
  local bin=$1 data=$2
  rm -rf "$w/dst" "$w/addr"
  # shellcheck disable=SC2046
  perf stat -x, -e task-clock,page-faults -o "$w/recv.stat" "$bin" receive --listen 127.0.0.1:0 \
    --root "$w/dst" --once $(tls receiver) > "$w/addr" 2>/dev/null &
  local rp=$!
  until [ -s "$w/addr" ]; do sleep 0.05; done
  # shellcheck disable=SC2046
  perf stat -x, -e task-clock,page-faults -o "$w/send.stat" "$bin" send --connect "$(head -1 "$w/addr")" \
    --root "$w/$data" --streams "$STREAMS" --compress none $(tls sender) >/dev/null 2>&1
  wait $rp
  field() { awk -F, -v e="$2" '$3 == e { printf "%d", $1 }' "$1"; }
  echo "$(field "$w/recv.stat" task-clock) $(field "$w/send.stat" task-clock)" \
    "$(field "$w/recv.stat" page-faults) $(field "$w/send.stat" page-faults)"
}
for data in big small; do
  : > "$w/$data.old"; : > "$w/$data.new"
  for _ in $(seq 1 "$ROUNDS"); do
    run "$OLD" $data >> "$w/$data.old"
    run "$NEW" $data >> "$w/$data.new"
  done
done
python3 - "$w" "$STREAMS" <<'PY'
import statistics, sys
w, streams = sys.argv[1], sys.argv[2]
unit = {"big": (1.0, "ms CPU per GiB"), "small": (20.0, "ms CPU per 1 000 files")}
print(f"{streams} streams, medians of each end (old -> new, new/old)")
for data in ("big", "small"):
    cols = {}
    for side in ("old", "new"):
        rows = [list(map(int, l.split())) for l in open(f"{w}/{data}.{side}") if l.strip()]
        cols[side] = [statistics.median(c) for c in zip(*rows)]
    div, what = unit[data]
    o, n = cols["old"], cols["new"]
    for i, (end, kind) in enumerate([("receiver", what), ("sender", what),
                                     ("receiver", "page faults"), ("sender", "page faults")]):
        a, b = (o[i] / div, n[i] / div) if i < 2 else (o[i], n[i])
        print(f"{data:5s} {end:8s} {kind:22s} {a:10.1f} -> {b:10.1f}  {b / a if a else float('nan'):.2f}x")
PY
