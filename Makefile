# ferry's verbs. Each is a thin call into cargo or a script under tests/ or .ci/.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: build release test lint fmt deps fuzz-smoke bench-net-ferry
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

# Debian packages for tests and benchmarks (idempotent, cached by a stamp under ~/.cache/ferry).
deps:
	tests/scripts/deps.sh

# ~30 s of cargo-fuzz on the frame decoder (installs cargo-fuzz into ~/.cache/ferry/cargo if missing).
fuzz-smoke:
	tests/scripts/fuzz-smoke.sh

# ferry-only loopback numbers against plaintext socket references (root; tmpfs in a private mount ns).
bench-net-ferry: release
	tests/scripts/bench-net-ferry.sh
