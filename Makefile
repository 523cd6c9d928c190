# ferry's verbs. Each is a thin call into cargo or a script under tests/ or .ci/.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: build release test lint fmt deps k8s-bin cluster-up cluster-down cluster-env cluster-logs test-cluster
build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

# The README's test command: formatting and lints, the build, the Kubernetes binaries (cached), then
# every test with the local cluster up. The cluster goes down afterwards whatever happened, and the
# exit code is the tests'. On failure the cluster's logs are kept in target/cluster-logs.
test: lint build k8s-bin
	@rc=0; \
	tests/cluster/up.sh && $(CARGO) test --workspace || rc=$$?; \
	if [[ $$rc -ne 0 ]]; then tests/cluster/save-logs.sh target/cluster-logs || true; fi; \
	tests/cluster/down.sh || true; \
	exit $$rc

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Debian packages for tests and benchmarks (idempotent, cached by a stamp under ~/.cache/ferry).
deps:
	tests/scripts/deps.sh

# --- the local Kubernetes cluster (tests/README.md) ---------------------------------------------
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and helm, built once into
# ~/.cache/ferry/k8s-<version>/bin (about 10 minutes cold; a no-op afterwards).
k8s-bin:
	tests/k8s/build.sh >/dev/null

cluster-up:
	tests/cluster/up.sh

cluster-down:
	tests/cluster/down.sh

# eval "$(make -s cluster-env)"
cluster-env:
	@tests/cluster/env.sh

# make cluster-logs POD=name [NS=namespace]; without POD, lists the log files.
cluster-logs:
	@tests/cluster/logs.sh "$(POD)" "$(or $(NS),default)"

# Only the cluster tests, with a cluster started and stopped around them.
test-cluster: k8s-bin
	@rc=0; \
	tests/cluster/up.sh && $(CARGO) test -p ferry-cluster-tests || rc=$$?; \
	if [[ $$rc -ne 0 ]]; then tests/cluster/save-logs.sh target/cluster-logs || true; fi; \
	tests/cluster/down.sh || true; \
	exit $$rc
