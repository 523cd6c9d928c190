#!/usr/bin/env bash
# Starts the two local clusters the tests use, `ferry` and `peer`, side by side (concurrently) and
# fails when either does not come up. `down-pair.sh` stops both.
set -uo pipefail
here="$(dirname "$0")"
repo_root="$(cd "$here/../.." && pwd)"
# What both would otherwise build or install at the same time: once, first.
"$repo_root/tests/scripts/deps.sh" || exit 1
"$repo_root/tests/k8s/build.sh" >/dev/null || exit 1
cargo_flags=()
[[ "${FERRY_PROFILE:-debug}" == release ]] && cargo_flags+=(--release)
(cd "$repo_root" && cargo build -q "${cargo_flags[@]}" --workspace) || exit 1
# Built once for both clusters, which then only read the references.
FERRY_IMAGES_ENV="$("$here/images.sh")" || exit 1
export FERRY_IMAGES_ENV
"$here/up.sh" &
main=$!
FERRY_CLUSTER=peer "$here/up.sh" &
peer=$!
rc=0
wait "$main" || rc=1
wait "$peer" || rc=1
if ((rc)); then
  echo "up-pair.sh: a cluster did not start; stopping both" >&2
  "$here/down-pair.sh" >/dev/null 2>&1
fi
exit "$rc"
