#!/usr/bin/env bash
# Runs the quick start of docs/network.md exactly as written (the shell block between the
# quickstart markers) with the workspace's ferry-mover on PATH, and checks what it promises: the
# copies are identical (the block's own diff) and the second send took blocks from the store.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin="${CARGO_TARGET_DIR:-$repo/target}/${FERRY_PROFILE:-debug}"
[[ -x "$bin/ferry-mover" ]] || { echo "network-quickstart: $bin/ferry-mover missing (make build)" >&2; exit 1; }
block=$(awk '/<!-- quickstart:begin -->/{on=1; next} /<!-- quickstart:end -->/{on=0} on && !/^```/' "$repo/docs/network.md")
[[ -n "$block" ]] || { echo "network-quickstart: no quickstart block in docs/network.md" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Output to a file, not a pipe, and background jobs killed on the way out: a receiver left
# waiting by a failed step must not hold the test up.
if ! PATH="$bin:$PATH" timeout 300 bash -euo pipefail -c "trap 'kill \$(jobs -p) 2>/dev/null || true' EXIT
$block" >"$log" 2>&1; then
  cat "$log" >&2
  echo "FAIL the quick start of docs/network.md did not run" >&2
  exit 1
fi
out=$(cat "$log")
grep -q 'dst is identical to src' <<<"$out" || { echo "$out" >&2; echo "FAIL first copy" >&2; exit 1; }
blocks=$(grep -o '"dedup_blocks":[0-9]*' <<<"$out" | tail -1 | cut -d: -f2)
[[ "${blocks:-0}" -ge 4 ]] || { echo "$out" >&2; echo "FAIL second send took ${blocks:-no} blocks from the store" >&2; exit 1; }
echo "ok   docs/network.md quick start: both copies identical, second send took $blocks blocks from the block store"
