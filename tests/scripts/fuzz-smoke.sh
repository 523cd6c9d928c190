#!/usr/bin/env bash
# Short fuzzing runs of the frame decoder, the Want block-set parser, the receiver's protocol state
# driven by arbitrary message sequences, the sender's reply rules (Wants and NeedBlocks) likewise, the
# parser of peer paths, filter rules received over the wire, the node service's requests, a
# staging manifest read back from disk, and the operator's cross-cluster messages (CI smoke). Installs cargo-fuzz into a cache directory
# if missing (idempotent) and uses the nightly toolchain that libFuzzer's sanitizer flags need.
set -euo pipefail
SECS="${FUZZ_SECONDS:-30}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}/cargo"
export PATH="$CACHE/bin:$PATH"
# Builds with the sanitizers live outside the checkout, so a fresh clone reuses them (the
# operator's alone takes about 8 minutes from nothing on 2 cores).
TARGETS="${FERRY_CACHE:-$HOME/.cache/ferry}/fuzz-target"
# Each checkout path builds ferry's own crates anew beside the cached dependencies: a cache
# past 6 GiB starts over, so it stays bounded.
for t in mover operator; do
    if [ -d "$TARGETS/$t" ] && [ "$(du -sm "$TARGETS/$t" | cut -f1)" -gt 6144 ]; then
        rm -rf "${TARGETS:?}/$t"
    fi
done
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked --root "$CACHE"
fi
cd "$ROOT/mover"
mkdir -p fuzz/corpus/frame_decoder
cargo +nightly fuzz run --target-dir "$TARGETS/mover" frame_decoder fuzz/corpus/frame_decoder -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
mkdir -p fuzz/corpus/want_blocks
cargo +nightly fuzz run --target-dir "$TARGETS/mover" want_blocks fuzz/corpus/want_blocks -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
mkdir -p fuzz/corpus/receiver_state
cargo +nightly fuzz run --target-dir "$TARGETS/mover" receiver_state fuzz/corpus/receiver_state -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=4096
mkdir -p fuzz/corpus/sender_state
cargo +nightly fuzz run --target-dir "$TARGETS/mover" sender_state fuzz/corpus/sender_state -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=4096
for target in peer_path wire_filter node_requests staging_manifest; do
    mkdir -p "fuzz/corpus/$target"
    cargo +nightly fuzz run --target-dir "$TARGETS/mover" "$target" "fuzz/corpus/$target" -- \
        -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
done
# staging_manifest's scratch directories (one per fuzzing process).
rm -rf "${TMPDIR:-/tmp}"/ferry-fuzz-staging-*
# The operator's: what another cluster's operator says over the cross-cluster API, through the
# plan of the half that hears it (seeded with well-formed answers and reports).
cd "$ROOT/operator"
mkdir -p fuzz/corpus/peering_json
cargo +nightly fuzz run --target-dir "$TARGETS/operator" peering_json fuzz/corpus/peering_json fuzz/seeds/peering_json -- \
    -max_total_time="$SECS" -rss_limit_mb=2048 -max_len=65536
