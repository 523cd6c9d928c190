#!/usr/bin/env bash
# Starts the local registry (with the router it lives in, net.sh) unless it runs, builds every image
# the clusters run from the workspace's $FERRY_PROFILE build and pushes what the registry lacks
# (tests/images/build.sh). Prints the env file naming each image (FERRY_IMAGE_<NAME>=ref).
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/net.sh"
net_router_up
env_file="$cache_dir/images/$profile.env"
mkdir -p "$cache_dir/images"
"$repo_root/tests/images/build.sh" "$registry_addr/ferry" "$env_file" >&2
echo "$env_file"
