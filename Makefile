# ferry's verbs. Each is a thin call into cargo or a script under tests/ or .ci/.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: build release images push chart-push test lint fmt deps k8s-bin cluster-up cluster-down cluster-env cluster-logs \
	test-cluster clusters-up clusters-down node-stop node-start node-shape demo demo-down deploy-local manifests crds chart-check bench bench-operator bench-local bench-net bench-build bench-selftest fuzz-smoke bench-net-ferry bench-fanout bench-fanout-cluster bench-ab
build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

# ferry's two images (deploy/Dockerfile, FROM scratch, non-root, no shell), built with buildah
# from the release binaries as localhost/ferry/NAME:TAG (TAG defaults to the workspace version);
# debug info is kept apart in target/images/debug. `make push REGISTRY=host:port/prefix [TAG=...]`
# pushes them (PLAIN_HTTP=1 for a registry without TLS); `make chart-push REGISTRY=...` pushes
# the Helm chart there as an OCI artifact (oci://REGISTRY/charts/ferry).
images: deps
	$(CARGO) build --release -p ferry-operator -p ferry-mover
	TAG="$(TAG)" deploy/images.sh build

push:
	@[[ -n "$(REGISTRY)" ]] || { echo "usage: make push REGISTRY=host:port/prefix [TAG=...]" >&2; exit 2; }
	$(MAKE) --no-print-directory images
	TAG="$(TAG)" PLAIN_HTTP="$(PLAIN_HTTP)" deploy/images.sh push "$(REGISTRY)"

chart-push: k8s-bin
	@[[ -n "$(REGISTRY)" ]] || { echo "usage: make chart-push REGISTRY=host:port/prefix" >&2; exit 2; }
	PLAIN_HTTP="$(PLAIN_HTTP)" deploy/chart-push.sh "$(REGISTRY)"

# The README's test command: formatting and lints, the build, the Kubernetes binaries (cached), then
# every test with the two local clusters up (`ferry` and `peer`, side by side). The clusters go down
# afterwards whatever happened, and the exit code is the tests'. On failure their logs are kept in
# target/cluster-logs and target/cluster-logs-peer. Then short fuzzing runs (every target under
# mover/fuzz), the benchmark harness's own tests, the chart's offline checks and docs/network.md's quick start
# as written.
test: deps lint build k8s-bin
	@rc=0; \
	tests/cluster/up-pair.sh && $(CARGO) test --workspace || rc=$$?; \
	if [[ $$rc -ne 0 ]]; then tests/cluster/down-pair.sh target/cluster-logs; else tests/cluster/down-pair.sh; fi; \
	exit $$rc
	$(MAKE) --no-print-directory fuzz-smoke
	$(MAKE) --no-print-directory bench-selftest
	$(MAKE) --no-print-directory chart-check
	tests/scripts/network-quickstart.sh

# The README's first command: builds what is missing, starts the local cluster, installs ferry with
# its chart and runs a real Transfer end to end with live progress. The cluster stays up afterwards;
# running it again shows block-store hits; `make demo-down` removes everything.
demo:
	tests/demo/run.sh

demo-down:
	tests/demo/down.sh

# Installs or upgrades ferry through the Helm chart into the local cluster (started when none runs),
# /data granted to every namespace. HELM_ARGS are passed on (HELM_ARGS="--set maxActive=4").
deploy-local: deps build k8s-bin
	tests/demo/deploy-local.sh $(HELM_ARGS)

# deploy/install.yaml rendered from the chart (charts/ferry/check.sh fails when it is stale).
manifests: k8s-bin
	deploy/render-manifests.sh

# The Transfer and Peer CRDs generated from the Rust types (a unit test fails when crds/ drifts).
crds:
	$(CARGO) run -q -p ferry-operator --bin crdgen transfer > crds/ferry.dev_transfers.yaml
	$(CARGO) run -q -p ferry-operator --bin crdgen peer > crds/ferry.dev_peers.yaml
	charts/ferry/sync-crd.sh

# The Helm chart offline: lint, renders, the values schema's refusals, RBAC equal to deploy/rbac.yaml.
chart-check: k8s-bin
	charts/ferry/check.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Debian packages for tests and benchmarks (idempotent, cached by a stamp under ~/.cache/ferry).
deps:
	tests/scripts/deps.sh

# ~30 s each of cargo-fuzz on every target under mover/fuzz: the frame decoder, the Want parser, both
# ends' protocol state, peer paths, wire filters, the node service's requests and staging manifests;
# and under operator/fuzz: the cross-cluster API's messages through the plan (installs cargo-fuzz
# into ~/.cache/ferry/cargo if missing).
fuzz-smoke:
	tests/scripts/fuzz-smoke.sh

# ferry-only loopback numbers against plaintext socket references (root; tmpfs in a private mount ns).
bench-net-ferry: release
	tests/scripts/bench-net-ferry.sh

# Fan-out over capped links between network namespaces (one source, up to four destinations with
# node services), against separate transfers. Knobs: ROUNDS=3 RATE_MBIT=400 MIB=1024 FILES=8.
bench-fanout: release
	python3 tests/bench/fanout_bench.py

# The same through the operator on the local cluster's real nodes (release images, node service on
# every node, every link capped): node-e to node-a..d. Knobs: ROUNDS=3 RATE=200mbit MIB=1024 FILES=8.
bench-fanout-cluster: deps k8s-bin
	python3 tests/bench/fanout_cluster_bench.py

# Benchmarks (tests/bench/bench.py; method and tables in docs/benchmarks.md). Knobs, as make variables
# or environment: ROUNDS=3 DATASETS=small,big CONTENDERS=ferry,cp-r,rsync ON_DISK=/var/tmp/ferry-bench
# WRITE_DOCS=1 (rewrite the tables in docs/benchmarks.md) FERRY_BIN=path FERRY_REV=source-label
# FERRY_BUILD=0 (skip the release build; also skipped when FERRY_BIN is set), FERRY_BASELINE=path (bench-net:
# an older ferry-mover beside this one, same data and run; prints this build / baseline per dataset).
FERRY_BUILD ?= 1
BENCH_COMMAND = $(strip make $(MAKECMDGOALS) $(foreach v,ROUNDS DATASETS CONTENDERS ON_DISK SCALE PARTS SCALE_COUNT SCALE_ACTIVE COUNT,$(if $($(v)),$(v)=$($(v)))))
export ROUNDS PARTS SCALE_COUNT SCALE_ACTIVE COUNT DATASETS CONTENDERS ON_DISK SCALE WRITE_DOCS FERRY_BIN FERRY_REV FERRY_BASELINE TMPFS_SIZE RUN_TIMEOUT FERRY_JOBS ON_DISK_SETTLE BENCH_COMMAND

# The working tree's mover raced against revision BASE in one interleaved run (both datasets, 2 and
# 4 streams; tests/scripts/bench-ab.sh): make bench-ab BASE=649ddeb [ROUNDS=5].
bench-ab: deps
	tests/scripts/bench-ab.sh

bench-build:
ifeq ($(FERRY_BUILD)$(FERRY_BIN),1)
	$(CARGO) build --release -p ferry-mover
endif

# The operator's overhead on the local cluster (release build): fixed apply-to-Succeeded time, a
# large file through the operator against the bare mover pair, COUNT Transfers at once with the
# operator's peak RSS and status-patch rate, and a scale round (SCALE_COUNT Transfers queued by
# --max-active SCALE_ACTIVE: drain time, apiserver requests per Transfer, RSS, reconcile latency).
# Knobs: ROUNDS=5 LARGE_MIB=1024 COUNT=100 SCALE_COUNT=1000 SCALE_ACTIVE=20
# PARTS=overhead,large,many,scale WRITE_DOCS=1.
bench-operator: deps k8s-bin
	python3 tests/bench/operator_bench.py

bench-local: deps bench-build
	tests/bench/bench.py local

bench-net: deps bench-build
	tests/bench/bench.py net

bench: deps bench-build
	tests/bench/bench.py local
	tests/bench/bench.py net

# The harness's own tests (dataset determinism, verifier, tables, docs rewrite); no root needed.
bench-selftest:
	python3 -m unittest discover -s tests/bench -p 'test_*.py'

# --- the local Kubernetes cluster (tests/README.md) ---------------------------------------------
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl, etcd, helm,
# CoreDNS and MetalLB, built once into ~/.cache/ferry/k8s-<version>/bin (about 12 minutes cold; then a no-op).
# FERRY_CLUSTER=peer selects the second cluster for cluster-up, cluster-down, cluster-env,
# cluster-logs and node-stop/node-start.
k8s-bin:
	tests/k8s/build.sh >/dev/null

cluster-up:
	tests/cluster/up.sh

cluster-down:
	tests/cluster/down.sh

# eval "$(make -s cluster-env)"
cluster-env:
	@tests/cluster/env.sh

# Both clusters the tests use, side by side.
clusters-up:
	tests/cluster/up-pair.sh

clusters-down:
	tests/cluster/down-pair.sh

# make node-stop NODE=node-x: the node loses power (kubelet, containerd and every container die at
# once, its Lease stops);
# make node-start NODE=node-x brings it back.
node-stop:
	tests/cluster/node.sh stop "$(NODE)"

node-start:
	tests/cluster/node.sh start "$(NODE)"

# make node-shape NODE=node-b RATE=400mbit: caps the node's link each way with tc tbf (RATE=off
# removes it); without RATE, prints the cap and the link's byte counters.
node-shape:
	tests/cluster/shape.sh "$(NODE)" $(RATE)

# make cluster-logs POD=name [NS=namespace]; without POD, lists the log files.
cluster-logs:
	@tests/cluster/logs.sh "$(POD)" "$(or $(NS),default)"

# Only the cluster tests, with both clusters started and stopped around them.
test-cluster: k8s-bin
	@rc=0; \
	tests/cluster/up-pair.sh && $(CARGO) test -p ferry-cluster-tests || rc=$$?; \
	if [[ $$rc -ne 0 ]]; then tests/cluster/down-pair.sh target/cluster-logs; else tests/cluster/down-pair.sh; fi; \
	exit $$rc
