#!/usr/bin/env bash
# Block store dedup benchmark (issue 5). Run as root from the repository root after
# `cargo build --release -p ferry-mover`:
#
#   unshare -m --propagation private tests/scripts/bench-cas.sh [ROUNDS] [tmpfs|disk]
#
# tmpfs (default): everything under a private tmpfs (see docs: /work/shared/BENCHMARKING.md).
# disk: the same under a directory on the root filesystem, labelled on-disk.
# Measures, per round, with fresh destinations and a fresh store each round:
#   A. a 1 GiB file sent twice to fresh destinations sharing one store: wire bytes and seconds;
#   B. the same with --bandwidth-limit 50000000: seconds of first vs repeat;
#   C. a 400 MiB dataset, then another sharing 90 % of its blocks under other names: wire / size.
# Prints one JSON line per measurement and a median summary at the end.
set -euo pipefail

ROUNDS=${1:-3}
MODE=${2:-tmpfs}
BIN=${BIN:-$PWD/target/release/ferry-mover}
[[ -x $BIN ]] || { echo "build first: cargo build --release -p ferry-mover" >&2; exit 2; }

if [[ $MODE == tmpfs ]]; then
    WORK=$(mktemp -d /tmp/ferry-bench-cas.XXXXXX)
    mount -t tmpfs -o size=14g tmpfs "$WORK"
else
    WORK=$(mktemp -d "$PWD/target/ferry-bench-cas-disk.XXXXXX")
fi
cleanup() {
    [[ -n ${RECV_PID:-} ]] && kill "$RECV_PID" 2>/dev/null || true
    if [[ $MODE == tmpfs ]]; then umount "$WORK" || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" certs --out "$WORK/pki" --transfer bench >/dev/null 2>&1
tls() { echo --ca "$WORK/pki/ca.crt" --cert "$WORK/pki/$1.crt" --key "$WORK/pki/$1.key" --transfer bench; }

# One transfer: receive into $2 with store $3, send $1; extra sender flags after.
# Prints "<sender json> <receiver json>" on one line.
transfer() {
    local src=$1 dst=$2 store=$3; shift 3
    local fifo=$WORK/recv.out
    rm -f "$fifo"
    # shellcheck disable=SC2046
    "$BIN" receive --listen 127.0.0.1:0 --root "$dst" --once --cas "$store" --json $(tls receiver) >"$fifo" &
    RECV_PID=$!
    local addr=""
    for _ in $(seq 100); do addr=$(head -n1 "$fifo" 2>/dev/null || true); [[ -n $addr ]] && break; sleep 0.05; done
    # shellcheck disable=SC2046
    local sent
    sent=$("$BIN" send --connect "$addr" --root "$src" --compress none --json "$@" $(tls sender))
    wait "$RECV_PID"
    RECV_PID=
    echo "$sent $(sed -n 2p "$fifo")" | jq -c -s '{sent: .[0], received: .[1]}'
}

echo "machine: $(nproc) cores, $(uname -r), mode $MODE, $(date -u +%FT%TZ)" >&2

# Sources, made once.
mkdir -p "$WORK/src1g" "$WORK/dsA" "$WORK/dsB"
head -c 1073741824 /dev/urandom >"$WORK/src1g/model.bin"
python3 - "$WORK" <<'PY'
import os, sys
work = sys.argv[1]
B = 4 << 20
blocks = [os.urandom(B) for _ in range(100)]       # dataset A: 100 blocks in 10 files
for f in range(10):
    with open(f"{work}/dsA/part-{f:02}.bin", "wb") as out:
        for b in blocks[f * 10:(f + 1) * 10]:
            out.write(b)
new = [os.urandom(B) for _ in range(10)]           # dataset B: 90 shared + 10 new, reshuffled
mix = blocks[5:95] + new
mix = mix[::7] + [b for i, b in enumerate(mix) if i % 7]
os.makedirs(f"{work}/dsB/other/names", exist_ok=True)
for f in range(4):
    with open(f"{work}/dsB/other/names/shard-{f}.bin", "wb") as out:
        for b in mix[f * 25:(f + 1) * 25]:
            out.write(b)
PY

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
for r in $(seq 0 "$ROUNDS"); do
    # Round 0 is an untimed warm-up.
    d=$WORK/r$r; mkdir -p "$d"
    differs() { echo "round $r: $1 differs from its source" >&2; exit 1; }
    # Each pair's outputs are checked and deleted before the next pair (tmpfs is RAM).
    a1=$(transfer "$WORK/src1g" "$d/a1" "$d/storeA")
    a2=$(transfer "$WORK/src1g" "$d/a2" "$d/storeA")
    cmp -s "$WORK/src1g/model.bin" "$d/a2/model.bin" || differs a2
    rm -rf "$d/a1" "$d/a2" "$d/storeA"
    b1=$(transfer "$WORK/src1g" "$d/b1" "$d/storeB" --bandwidth-limit 50000000)
    b2=$(transfer "$WORK/src1g" "$d/b2" "$d/storeB" --bandwidth-limit 50000000)
    cmp -s "$WORK/src1g/model.bin" "$d/b2/model.bin" || differs b2
    rm -rf "$d/b1" "$d/b2" "$d/storeB"
    c1=$(transfer "$WORK/dsA" "$d/c1" "$d/storeC")
    c2=$(transfer "$WORK/dsB" "$d/c2" "$d/storeC")
    diff -r "$WORK/dsB" "$d/c2" >/dev/null || differs c2
    rm -rf "$d"
    [[ $r == 0 ]] && continue
    dsb=$(du -sb --apparent-size "$WORK/dsB" | cut -f1)
    jq -n -c --argjson a1 "$a1" --argjson a2 "$a2" --argjson b1 "$b1" --argjson b2 "$b2" \
        --argjson c1 "$c1" --argjson c2 "$c2" --argjson dsb "$dsb" --arg r "$r" '{
        round: ($r|tonumber),
        repeat_wire_pct: (100 * $a2.sent.wire_bytes / $a1.sent.wire_bytes),
        first_wire: $a1.sent.wire_bytes, repeat_wire: $a2.sent.wire_bytes,
        first_s: $a1.sent.seconds, repeat_s: $a2.sent.seconds,
        repeat_dedup_blocks: $a2.received.dedup_blocks,
        limited_first_s: $b1.sent.seconds, limited_repeat_s: $b2.sent.seconds,
        limited_speedup: ($b1.sent.seconds / $b2.sent.seconds),
        shared90_wire_pct: (100 * $c2.sent.wire_bytes / $dsb),
        shared90_dedup_blocks: $c2.received.dedup_blocks
    }' | tee -a "$RESULTS"
done

jq -s -c '
  def median: sort | if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end;
  {rounds: length,
   repeat_wire_pct: (map(.repeat_wire_pct) | median),
   first_s: (map(.first_s) | median), repeat_s: (map(.repeat_s) | median),
   limited_first_s: (map(.limited_first_s) | median), limited_repeat_s: (map(.limited_repeat_s) | median),
   limited_speedup: (map(.limited_speedup) | median),
   shared90_wire_pct: (map(.shared90_wire_pct) | median)}' "$RESULTS"
