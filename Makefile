# ferry's verbs. Each is a thin call into cargo or a script under tests/ or .ci/.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: build release test lint fmt deps
build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

# The README's test command: formatting, lints, then every test.
test: lint
	$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Benchmarks (tests/bench/bench.py; method and tables in docs/benchmarks.md). Knobs, as make variables
# or environment: ROUNDS=3 DATASETS=small,big CONTENDERS=ferry,cp-r,rsync ON_DISK=/var/tmp/ferry-bench
# WRITE_DOCS=1 (rewrite the tables in docs/benchmarks.md) FERRY_BIN=path FERRY_REV=source-label
# FERRY_BUILD=0 (skip the release build; also skipped when FERRY_BIN is set).
.PHONY: bench bench-local bench-net bench-build bench-selftest
FERRY_BUILD ?= 1
BENCH_COMMAND = $(strip make $(MAKECMDGOALS) $(foreach v,ROUNDS DATASETS CONTENDERS ON_DISK SCALE,$(if $($(v)),$(v)=$($(v)))))
export ROUNDS DATASETS CONTENDERS ON_DISK SCALE WRITE_DOCS FERRY_BIN FERRY_REV TMPFS_SIZE RUN_TIMEOUT FERRY_JOBS ON_DISK_SETTLE BENCH_COMMAND

bench-build:
ifeq ($(FERRY_BUILD)$(FERRY_BIN),1)
	$(CARGO) build --release -p ferry-mover
endif

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

# Debian packages for tests and benchmarks (idempotent, cached by a stamp under ~/.cache/ferry).
deps:
	tests/scripts/deps.sh
