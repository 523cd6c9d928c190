#!/usr/bin/env bash
# Two builds of ferry-mover against each other on the same data: send/receive over loopback mutual
# TLS (4 streams, no compression) of one 1 GiB file and of 20 000 x 4 KiB files, in tmpfs, rounds
# interleaved (old, new, old, new, ...). Prints each side's median and new/old.
#
#   [STREAMS=4] [COMPRESS=none] [CAS=1] tests/scripts/ab-mover.sh OLD_BIN NEW_BIN [ROUNDS]   (ROUNDS default 5)
#
# CAS=1 gives the receiver a fresh block store each run, so the sender announces every full
# block (hash and proof of possession) before sending it: the dedup path.
#
# For a change's cost, build its parent and itself with `cargo build --release -p ferry-mover`
# into two target directories (CARGO_TARGET_DIR) and pass both binaries.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OLD_BIN NEW_BIN [ROUNDS]" >&2; exit 2; }
OLD=$1 NEW=$2 ROUNDS=${3:-5} STREAMS=${STREAMS:-4} COMPRESS=${COMPRESS:-none} CAS=${CAS:-}
w=$(mktemp -d /dev/shm/ab.XXXX)
trap 'rm -rf "$w"' EXIT
# shellcheck source=ab-data.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab-data.sh"
ab_big "$w/big"
ab_small "$w/small"
"$NEW" certs --out "$w/pki" --transfer ab >/dev/null 2>&1
run() { # bin data -> seconds
  local bin=$1 data=$2 dst="$w/dst"
  rm -rf "$dst" "$w/cas"
  local store=()
  [[ -n $CAS ]] && store=(--cas "$w/cas")
  "$bin" receive --listen 127.0.0.1:0 --root "$dst" "${store[@]}" --once --transfer ab --ca "$w/pki/ca.crt" --cert "$w/pki/receiver.crt" --key "$w/pki/receiver.key" > "$w/addr" 2>/dev/null &
  local rp=$!
  until [ -s "$w/addr" ]; do sleep 0.05; done
  local t0=$EPOCHREALTIME
  "$bin" send --connect "$(head -1 "$w/addr")" --root "$w/$data" --streams "$STREAMS" --compress "$COMPRESS" --transfer ab --ca "$w/pki/ca.crt" --cert "$w/pki/sender.crt" --key "$w/pki/sender.key" >/dev/null 2>&1
  wait $rp
  local t1=$EPOCHREALTIME
  rm -f "$w/addr"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
for data in big small; do
  o=(); n=()
  for r in $(seq 1 "$ROUNDS"); do
    o+=("$(run "$OLD" $data)"); n+=("$(run "$NEW" $data)")
  done
  python3 -c "
import statistics,sys
o=[float(x) for x in '${o[*]}'.split()]; n=[float(x) for x in '${n[*]}'.split()]
mo,mn=statistics.median(o),statistics.median(n)
print(f'$data: old median {mo:.3f}s {o}  new median {mn:.3f}s {n}  new/old {mn/mo:.2f}x')"
done
