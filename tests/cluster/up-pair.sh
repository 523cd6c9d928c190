#!/usr/bin/env bash
# Starts the two local clusters the tests use, `ferry` and `peer`, side by side (concurrently) and
# fails when either does not come up. `down-pair.sh` stops both.
set -uo pipefail
here="$(dirname "$0")"
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
