#!/usr/bin/env bash
# The working tree's ferry-mover raced against a base revision's: both release builds, on the same
# data in one interleaved run (tests/scripts/ab-mover.sh: one 1 GiB file and 20 000 x 4 KiB files
# over loopback mutual TLS, old, new, old, new, ...), at 2 and at 4 streams; prints each ratio.
#
#   make bench-ab BASE=649ddeb [ROUNDS=5]
#
# The base is exported from git (no worktree) and built in a target directory of its own under
# ~/.cache/ferry/bench-ab/; its binary is kept there for the next race against the same
# revision, the build (about 1 GiB) is removed. A benchmark, not a
# test: run it on a quiet machine and read the ratios, not the seconds (docs/benchmarks.md).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
base=${BASE:?"name the base revision: make bench-ab BASE=<revision>"}
rounds=${ROUNDS:-5}
cache="${FERRY_CACHE:-$HOME/.cache/ferry}/bench-ab"
commit=$(git -C "$repo" rev-parse --verify "$base^{commit}") \
  || { echo "bench-ab: $base is not a revision of this repository" >&2; exit 2; }
short=${commit:0:12}
base_bin="$cache/ferry-mover-$short"
if [[ ! -x $base_bin ]]; then
  src="$cache/src-$short"
  rm -rf "$src" && mkdir -p "$src"
  git -C "$repo" archive "$commit" | tar -x -C "$src"
  echo "bench-ab: building $short (release) in $cache/target-$short" >&2
  CARGO_TARGET_DIR="$cache/target-$short" cargo build --release -q -p ferry-mover \
    --manifest-path "$src/Cargo.toml"
  cp "$cache/target-$short/release/ferry-mover" "$base_bin.tmp" && mv "$base_bin.tmp" "$base_bin"
  rm -rf "$src" "$cache/target-$short"
fi
echo "bench-ab: building the working tree (release)" >&2
cargo build --release -q -p ferry-mover --manifest-path "$repo/Cargo.toml"
new_bin="${CARGO_TARGET_DIR:-$repo/target}/release/ferry-mover"
head=$(git -C "$repo" rev-parse --short=12 HEAD)
dirty=$(git -C "$repo" status --porcelain -- mover proto Cargo.toml Cargo.lock | head -1)
echo "bench-ab: old = $short, new = $head${dirty:+ with uncommitted changes}; $rounds rounds each"
for streams in 2 4; do
  echo "-- $streams streams"
  STREAMS=$streams "$repo/tests/scripts/ab-mover.sh" "$base_bin" "$new_bin" "$rounds"
done
