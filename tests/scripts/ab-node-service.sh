#!/usr/bin/env bash
# Two builds of ferry-mover's node service against each other, as an honest receiver uses it: one
# 1 GiB file received through the node service into an empty store (the Put path), then the same
# file again into a fresh directory (the Take path: every full block from the store), in tmpfs,
# rounds interleaved (old, new, old, new, ...). Each build runs its own service, receiver and
# sender. Prints each side's medians and new/old.
#
#   tests/scripts/ab-node-service.sh OLD_BIN NEW_BIN [ROUNDS]   (ROUNDS default 5)
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 OLD_BIN NEW_BIN [ROUNDS]" >&2; exit 2; }
OLD=$1 NEW=$2 ROUNDS=${3:-5}
w=$(mktemp -d /dev/shm/abn.XXXX)
svc=
trap '[[ -n $svc ]] && kill "$svc" 2>/dev/null; rm -rf "$w"' EXIT
# shellcheck source=ab-data.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab-data.sh"
ab_big "$w/big"
"$NEW" certs --out "$w/pki" --transfer ab --cluster bench >/dev/null 2>&1
tls() { echo --transfer ab --ca "$w/pki/ca.crt" --cert "$w/pki/$1.crt" --key "$w/pki/$1.key"; }
once() { # bin service -> seconds
  local bin=$1 service=$2 dst="$w/dst"
  rm -rf "$dst"
  # shellcheck disable=SC2046
  "$bin" receive --listen 127.0.0.1:0 --root "$dst" --block-service "$service" --once $(tls receiver) > "$w/addr" 2>/dev/null &
  local rp=$!
  until [ -s "$w/addr" ]; do sleep 0.05; done
  local t0=$EPOCHREALTIME
  # shellcheck disable=SC2046
  "$bin" send --connect "$(head -1 "$w/addr")" --root "$w/big" --streams 4 --compress none $(tls sender) >/dev/null 2>&1
  wait $rp
  local t1=$EPOCHREALTIME
  rm -f "$w/addr"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
pair() { # bin -> "put_seconds take_seconds"
  local bin=$1
  rm -rf "$w/store"
  "$bin" node serve --listen 127.0.0.1:0 --store "$w/store" --cap 4G --node ab \
    --ca "$w/pki/ca.crt" --cert "$w/pki/node.crt" --key "$w/pki/node.key" > "$w/svc" 2>/dev/null &
  svc=$!
  until [ -s "$w/svc" ]; do sleep 0.05; done
  local service put take
  service=$(head -1 "$w/svc")
  put=$(once "$bin" "$service")
  take=$(once "$bin" "$service")
  kill "$svc"; wait "$svc" 2>/dev/null || true; svc=
  rm -f "$w/svc"
  echo "$put $take"
}
op=(); ot=(); np=(); nt=()
for r in $(seq 1 "$ROUNDS"); do
  read -r p t < <(pair "$OLD"); op+=("$p"); ot+=("$t")
  read -r p t < <(pair "$NEW"); np+=("$p"); nt+=("$t")
done
python3 - "${op[*]}" "${ot[*]}" "${np[*]}" "${nt[*]}" <<'PY'
import statistics, sys
op, ot, np_, nt = ([float(x) for x in a.split()] for a in sys.argv[1:5])
for what, o, n in (("into the store (Put)", op, np_), ("from the store (Take)", ot, nt)):
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"{what}: old median {mo:.3f}s {o}  new median {mn:.3f}s {n}  new/old {mn/mo:.2f}x")
PY
