#!/usr/bin/env bash
# Quick ferry-only network benchmark on loopback (the full comparison with rsync/ssh, scp and
# stunnel is `make bench-net`). Compares ferry send/receive (streams 1, 2, 4) with plaintext
# references: the 1 GiB file through a raw socat pipe, and 50 000 x 4 KiB through tar over socat.
# Interleaved rounds, fresh destination per run, medians and ratios. Run as root: it re-executes
# itself in a private mount namespace with a tmpfs work directory (BENCHMARKING.md).
set -euo pipefail
ROUNDS="${ROUNDS:-3}"
BIN="${BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/ferry-mover}"
if [[ -z "${FERRY_BENCH_INNER:-}" ]]; then
    exec unshare -m --propagation private env FERRY_BENCH_INNER=1 BIN="$BIN" ROUNDS="$ROUNDS" "$0" "$@"
fi
W=$(mktemp -d /tmp/ferry-bench.XXXX)
mount -t tmpfs -o size=10g tmpfs "$W"
cd "$W"
"$BIN" certs --out certs --transfer bench >/dev/null 2>&1
mkdir -p src-big src-small
head -c $((1024*1024*1024)) /dev/urandom > src-big/big.bin
python3 - <<'PY'
import os
for d in range(50):
    os.makedirs(f"src-small/d{d:02}", exist_ok=True)
    for i in range(1000):
        with open(f"src-small/d{d:02}/f{i:04}", "wb") as f:
            f.write(os.urandom(4096))
PY
TLS=(--ca certs/ca.crt --transfer bench)
# Each run is called in a $(...) subshell, so names come from mktemp, not a shell counter.
fresh() { mktemp -d "$W/run.XXXXXX"; }
ferry() { # set streams -> seconds
    local set=$1 streams=$2; local d; d=$(fresh); local n; n=$(basename "$d"); local dst="$d/dst"
    "$BIN" receive --listen 127.0.0.1:0 --root "$dst" "${TLS[@]}" --cert certs/receiver.crt \
        --key certs/receiver.key --once --json > "$d/recv.out" 2>/dev/null &
    local rpid=$!
    while [[ ! -s "$d/recv.out" ]]; do sleep 0.02; done
    local addr; addr=$(head -1 "$d/recv.out")
    local t0 t1; t0=$(date +%s.%N)
    "$BIN" send --connect "$addr" --root "src-$set" "${TLS[@]}" --cert certs/sender.crt \
        --key certs/sender.key --streams "$streams" --compress auto --json > "$d/send.out" 2>/dev/null || { kill "$rpid"; echo "send failed" >&2; }
    wait "$rpid"; t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
rawpipe() { # 1 GiB through a plaintext socket
    local d; d=$(fresh); local port=$((20000 + RANDOM % 20000))
    socat -b 262144 -u TCP-LISTEN:$port,reuseaddr,bind=127.0.0.1 CREATE:"$d/raw.bin" &
    local rpid=$!; sleep 0.1
    local t0 t1; t0=$(date +%s.%N)
    socat -b 262144 -u OPEN:src-big/big.bin TCP:127.0.0.1:$port
    wait "$rpid"; t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
tarpipe() { # small files: tar through a plaintext socket
    local d; d=$(fresh); local port=$((20000 + RANDOM % 20000))
    (socat -b 1048576 -u TCP-LISTEN:$port,reuseaddr,bind=127.0.0.1 - | tar -x -C "$d") &
    local rpid=$!; sleep 0.1
    local t0 t1; t0=$(date +%s.%N)
    tar -c -C src-small . | socat -b 1048576 -u - TCP:127.0.0.1:$port
    wait "$rpid"; t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
# Warm-up (untimed).
ferry big 2 >/dev/null; rawpipe >/dev/null; ferry small 2 >/dev/null; tarpipe >/dev/null
declare -A R
for r in $(seq "$ROUNDS"); do
    R[raw]+="$(rawpipe) "
    for s in 1 2 4; do R[big$s]+="$(ferry big $s) "; done
    R[tar]+="$(tarpipe) "
    for s in 1 2 4; do R[small$s]+="$(ferry small $s) "; done
done
python3 - "${R[raw]}" "${R[big1]}" "${R[big2]}" "${R[big4]}" "${R[tar]}" "${R[small1]}" "${R[small2]}" "${R[small4]}" <<'PY'
import statistics, sys
names = ["raw socket 1 GiB", "ferry 1 GiB s=1", "ferry 1 GiB s=2", "ferry 1 GiB s=4",
         "tar|socket 50k x 4 KiB", "ferry 50k s=1", "ferry 50k s=2", "ferry 50k s=4"]
med = [statistics.median(float(x) for x in a.split()) for a in sys.argv[1:]]
print(f"{'case':28} {'median s':>9} {'vs reference':>13}")
for i, (n, m) in enumerate(zip(names, med)):
    ref = med[0] if i < 4 else med[4]
    print(f"{n:28} {m:9.3f} {ref / m:12.2f}x")
PY
echo "sample summaries: $(cat "$W"/run.*/send.out 2>/dev/null | head -2 | tr '\n' ' ')"
cd /; umount "$W"; rmdir "$W"
