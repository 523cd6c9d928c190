#!/usr/bin/env bash
# Copies the cluster's logs (components and containers) to $1 before down.sh removes them.
set -euo pipefail
source "$(dirname "$0")/common.sh"
dest="${1:?usage: save-logs.sh DIR}"
[[ -d "$log_dir" ]] || exit 0
rm -rf "$dest"
mkdir -p "$dest"
cp -r "$log_dir/." "$dest/"
echo "save-logs.sh: cluster logs copied to $dest" >&2
