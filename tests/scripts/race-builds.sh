#!/usr/bin/env bash
# Many ferry-mover builds raced in one interleaved run on 20 000 x 4 KiB files (tmpfs, loopback
# mutual TLS, no compression): each round runs every build once, in an order that rotates from
# round to round; prints each build's median and its ratio to the first build's. For a bisect:
# build the revisions first (`make bench-ab BASE=<rev> ROUNDS=1` keeps each one's binary in
# ~/.cache/ferry/bench-ab/), then race them all at once so they share the machine's state.
#
#   [STREAMS=4] [ROUNDS=11] tests/scripts/race-builds.sh BASE_BIN BIN...
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 BASE_BIN BIN..." >&2; exit 2; }
ROUNDS=${ROUNDS:-11} STREAMS=${STREAMS:-4}
w=$(mktemp -d /dev/shm/race.XXXX)
trap 'rm -rf "$w"' EXIT
# shellcheck source=ab-data.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab-data.sh"
ab_small "$w/small"
"$1" certs --out "$w/pki" --transfer race >/dev/null 2>&1
run() { # bin -> seconds
  local bin=$1
  rm -rf "$w/dst" "$w/addr"
  "$bin" receive --listen 127.0.0.1:0 --root "$w/dst" --once --transfer race --ca "$w/pki/ca.crt" \
    --cert "$w/pki/receiver.crt" --key "$w/pki/receiver.key" > "$w/addr" 2>/dev/null &
  local rp=$!
  until [ -s "$w/addr" ]; do sleep 0.05; done
  local t0=$EPOCHREALTIME
  "$bin" send --connect "$(head -1 "$w/addr")" --root "$w/small" --streams "$STREAMS" --compress none \
    --transfer race --ca "$w/pki/ca.crt" --cert "$w/pki/sender.crt" --key "$w/pki/sender.key" >/dev/null 2>&1
  wait $rp
  local t1=$EPOCHREALTIME
  [ "$(find "$w/dst" -type f | wc -l)" -eq 20000 ] || { echo "$bin: not all files arrived" >&2; exit 1; }
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
bins=("$@")
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!bins[@]}"; do
    b=${bins[$(( (i + r) % ${#bins[@]} ))]}
    echo "$b $(run "$b")" >> "$w/times"
  done
done
python3 - "$w/times" "${bins[@]}" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    b, t = line.split()
    times.setdefault(b, []).append(float(t))
base = statistics.median(times[sys.argv[2]])
for b in sys.argv[2:]:
    ts = times[b]
    m = statistics.median(ts)
    print(f"{b.rsplit('/', 1)[-1]:32s} median {m:.3f} s  x{m / base:.3f}  (min {min(ts):.3f}, max {max(ts):.3f})")
PY
