#!/usr/bin/env bash
# Stops both local clusters (`ferry` and `peer`); with a directory argument, first copies their logs
# there (DIR and DIR-peer).
set -uo pipefail
here="$(dirname "$0")"
if [[ -n "${1:-}" ]]; then
  "$here/save-logs.sh" "$1" || true
  FERRY_CLUSTER=peer "$here/save-logs.sh" "$1-peer" || true
fi
"$here/down.sh" &
FERRY_CLUSTER=peer "$here/down.sh" &
wait
