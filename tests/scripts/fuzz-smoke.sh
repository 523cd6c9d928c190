#!/usr/bin/env bash
# Short fuzzing runs of the frame decoder and the Want block-set parser (CI smoke). Installs cargo-fuzz into a cache directory
# if missing (idempotent) and uses the nightly toolchain that libFuzzer's sanitizer flags need.
set -euo pipefail
SECS="${FUZZ_SECONDS:-30}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}/cargo"
export PATH="$CACHE/bin:$PATH"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked --root "$CACHE"
fi
cd "$ROOT/mover"
mkdir -p fuzz/corpus/frame_decoder
cargo +nightly fuzz run frame_decoder fuzz/corpus/frame_decoder -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
mkdir -p fuzz/corpus/want_blocks
cargo +nightly fuzz run want_blocks fuzz/corpus/want_blocks -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
