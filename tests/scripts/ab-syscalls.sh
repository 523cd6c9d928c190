#!/usr/bin/env bash
# System calls per small file of two ferry-mover builds, each end counted by `strace -f -c`: one
# send/receive of 5 000 x 4 KiB files over loopback mutual TLS (1 stream, no compression) into an
# empty tmpfs destination. Filesystem calls are fixed per file; epoll and futex calls follow
# scheduling and move the totals by a few hundredths.
#
#   tests/scripts/ab-syscalls.sh OLD_BIN NEW_BIN
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 OLD_BIN NEW_BIN" >&2; exit 2; }
command -v strace >/dev/null || { echo "$0: strace is missing (make deps)" >&2; exit 2; }
FILES=5000
w=$(mktemp -d /dev/shm/abs.XXXX)
trap 'rm -rf "$w"' EXIT
# shellcheck source=ab-data.sh
source "$(dirname "${BASH_SOURCE[0]}")/ab-data.sh"
ab_small "$w/src" "$FILES" 50
"$2" certs --out "$w/pki" --transfer abs >/dev/null 2>&1
# Total calls of an `strace -c` summary.
calls() { awk '$NF == "total" { print $(NF-2) }' "$1"; }
count() { # bin label
  local bin=$1 label=$2
  rm -rf "$w/dst" "$w/addr"
  strace -f -c -o "$w/$label.recv" "$bin" receive --listen 127.0.0.1:0 --root "$w/dst" --once --transfer abs \
    --ca "$w/pki/ca.crt" --cert "$w/pki/receiver.crt" --key "$w/pki/receiver.key" > "$w/addr" 2>/dev/null &
  local rp=$!
  until [ -s "$w/addr" ]; do sleep 0.05; done
  strace -f -c -o "$w/$label.send" "$bin" send --connect "$(head -1 "$w/addr")" --root "$w/src" --streams 1 \
    --compress none --transfer abs --ca "$w/pki/ca.crt" --cert "$w/pki/sender.crt" --key "$w/pki/sender.key" \
    >/dev/null 2>&1
  wait $rp
  [ "$(find "$w/dst" -type f | wc -l)" -eq "$FILES" ] || { echo "$label: not all files arrived" >&2; exit 1; }
  awk -v l="$label" -v s="$(calls "$w/$label.send")" -v r="$(calls "$w/$label.recv")" -v n="$FILES" \
    'BEGIN { printf "%s: sender %.2f, receiver %.2f syscalls per file (%d files)\n", l, s / n, r / n, n }'
}
count "$1" old
count "$2" new
