# Rollout. `make` (or `make help`) lists the targets.

SHELL       := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# go from PATH, else the standard install; its directory also goes on PATH because tools
# (golangci-lint, the arch test) run `go` themselves.
GO := $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)

# The default build needs no experiment: the engine kernels are Go assembly (AVX-512/AVX2 on
# amd64, NEON on arm64). `make GOEXPERIMENT=simd build` selects the simd/archsimd kernels
# instead; `make test` and `make lint` cover that mode and the portable one (-tags purego) too.
GOEXPERIMENT ?=
export GOEXPERIMENT

BIN      := bin/rollout
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT   ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
TESTFLAGS ?=
FUZZTIME ?= 100000x
DEMO_STEPS ?= 300
AGENT_DEMO_STEPS ?= 200

.PHONY: help build bench-kernels bench-peer peer-install compose-soak test test-arm64 race lint lint-fmt lint-vet lint-golangci lint-arch lint-commits bench demo agent-demo e2e faults faults-ci fuzz clean

help: ## List the targets
	@echo "Usage: make <target>   (GOEXPERIMENT=$(GOEXPERIMENT); GOEXPERIMENT=simd selects the archsimd kernels)"
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'

# Builds a person waits on say what they compile and how far along they are (a line that
# updates on a terminal, one line before and after in logs): tools/buildprogress.sh.
GOBUILD_PROGRESS := GO=$(GO) tools/buildprogress.sh

build: ## Build the CLI into bin/rollout (progress on stderr)
	@$(GOBUILD_PROGRESS) . $(BIN) ./cmd/rollout -ldflags '$(LDFLAGS)'

test: ## Run all tests (default build), the engine tests with GOEXPERIMENT=simd and with -tags purego, and the tools module's
	$(GO) test -timeout 15m $(TESTFLAGS) ./...
	GOEXPERIMENT=simd $(GO) test -timeout 15m $(TESTFLAGS) ./engine/...
	GOEXPERIMENT= $(GO) test -tags purego -timeout 15m $(TESTFLAGS) ./engine/...
	$(GO) -C tools test -timeout 5m $(TESTFLAGS) ./...

# qemu-user runs linux/arm64 test binaries on this machine (Debian: qemu-user-static).
QEMU_ARM64 ?= qemu-aarch64-static

test-arm64: ## Cross-compile for linux/arm64 and darwin/arm64; run the kernel and model tests (short) for linux/arm64 under qemu-user
	GOOS=linux GOARCH=arm64 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./engine/...
	GOOS=linux GOARCH=arm64 $(GO) test -short -count=1 -timeout 15m -exec $(QEMU_ARM64) $(TESTFLAGS) ./engine/kernels/ ./engine/model/...

race: ## Run all tests in short mode under the race detector
	$(GO) test -race -short -timeout 15m $(TESTFLAGS) ./...

lint: lint-fmt lint-vet lint-golangci lint-arch lint-commits ## gofmt check, go vet (three kernel modes), golangci-lint, dependency rules, commit subjects

# The commit whose subject is the first kept to CONTRIBUTING.md's 72 characters: the history
# before it is published and stays as it was.
COMMITS_SINCE := dcdb48c

lint-commits: ## Fail listing commit subjects over 72 characters since COMMITS_SINCE
	@if ! git cat-file -e $(COMMITS_SINCE)^{commit} 2>/dev/null; then echo "lint-commits: $(COMMITS_SINCE) is not in this clone (shallow?): skipped"; exit 0; fi; \
	long=$$(git log --format='%h %s' $(COMMITS_SINCE)..HEAD | awk '{ s = $$0; sub(/^[^ ]+ /, "", s); if (length(s) > 72) print }'); \
	if [ -n "$$long" ]; then echo "commit subjects over 72 characters (CONTRIBUTING.md):"; echo "$$long"; exit 1; fi

lint-fmt: ## Fail listing the files gofmt would change
	@files=$$(find . -name '*.go' -not -path './vendor/*' -not -path '*/testdata/*' -not -path './.git/*' -print0 | xargs -0 -r gofmt -l); \
	if [ -n "$$files" ]; then echo "gofmt needed on:"; echo "$$files"; exit 1; fi

lint-vet: ## go vet in the default build, with GOEXPERIMENT=simd and with -tags purego
	$(GO) vet ./...
	GOEXPERIMENT=simd $(GO) vet ./...
	GOEXPERIMENT= $(GO) vet -tags purego ./...

GOLANGCI := bin/golangci-lint

lint-golangci: ## golangci-lint (pinned in tools/lint/go.mod, built into bin/) in the default build, with GOEXPERIMENT=simd and with -tags purego
	GOEXPERIMENT= $(GO) -C tools/lint build -o $(abspath $(GOLANGCI)) github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	GOEXPERIMENT= $(GOLANGCI) run ./...
	GOEXPERIMENT=simd $(GOLANGCI) run ./...
	GOEXPERIMENT= $(GOLANGCI) run --build-tags purego ./...

lint-arch: ## The dependency rules of docs/architecture.md (internal/archtest)
	$(GO) test -count=1 ./internal/archtest/

JAEGER := bin/jaeger

e2e: build ## Real-backend trace test: Jaeger, redis-server, 2 rollout serve --otel otlp, rollout fleet update and rl-loop steps, checked via Jaeger's HTTP API
	@GOEXPERIMENT= $(GOBUILD_PROGRESS) tools $(abspath $(JAEGER)) github.com/jaegertracing/jaeger/cmd/jaeger
	@$(GOBUILD_PROGRESS) . bin/rl-loop ./examples/rl-loop
	ROLLOUT_BIN=$(abspath $(BIN)) JAEGER_BIN=$(abspath $(JAEGER)) RL_LOOP_BIN=$(abspath bin/rl-loop) E2E_TRACE_OUT=$(abspath bin/e2e-trace.txt) \
		$(GO) -C tools test -tags e2e -count=1 -v -timeout 10m ./e2e/

# The fault harness (internal/faults, issue 25). FAULTS_SEED=n replays a run's schedule; the
# history is kept in bin/ for reading after a failure.
FAULTS_SEED ?=
FAULTS_STORM ?=
FAULTS_ENV = $(if $(FAULTS_SEED),ROLLOUT_FAULTS_SEED=$(FAULTS_SEED)) $(if $(FAULTS_STORM),ROLLOUT_FAULTS_STORM=$(FAULTS_STORM)) ROLLOUT_FAULTS_HISTORY=$(abspath bin/faults-history.json)

faults: ## Fault harness soak: 1000 faults on 3 rollout serve + redis-server, checked (FAULTS_SEED=n replays)
	@mkdir -p bin
	ROLLOUT_FAULTS=1000 $(FAULTS_ENV) $(GO) test -count=1 -v -run '^TestFaults$$' -timeout 60m ./internal/faults/

faults-ci: ## Fault harness, CI length: 200 faults in about 5 minutes (FAULTS_SEED=n replays)
	@mkdir -p bin
	ROLLOUT_FAULTS=200 $(FAULTS_ENV) $(GO) test -count=1 -v -run '^TestFaults$$' -timeout 15m ./internal/faults/

# docker-compose.yml's Redis, servers and loop as processes (no Docker daemon): the file's
# commands and arguments, ports mapped to free ones; servers and the loop are killed and
# restarted mid-run. make test runs it for one minute.
COMPOSE_SOAK ?= 10m

compose-soak: ## docker-compose.yml's stack without Docker for COMPOSE_SOAK (10m), servers and the loop restarted mid-run
	ROLLOUT_COMPOSE_SOAK=$(COMPOSE_SOAK) $(GO) -C tools test -count=1 -v -run '^TestComposeSoak$$' -timeout 60m ./compose/

bench: build ## Run the engine benchmark (bin/rollout bench engine)
	$(BIN) bench engine

BENCH_KERNELS_FLAGS ?= --quick

peer-install: ## Install node-llama-cpp (llama.cpp's prebuilt CPU build, from npm) into bench/peer for the peer benchmark
	npm install --prefix bench/peer --no-audit --no-fund

# The side-by-side table of docs/perf.md: rollout and llama.cpp on the same weights, per precision.
PEER_PRESETS ?= stories110m,qwen2.5-0.5b-shape,llama3.2-1b-shape
bench-peer: build ## rollout (f32/bf16/int8/w8a8) beside llama.cpp (f32/bf16/f16/q8_0; make peer-install first) on PEER_PRESETS: batch 1 and 16 sequences
	$(BIN) bench engine --quick --presets $(PEER_PRESETS) --precision f32,bf16,int8,w8a8 --tokens 64 --peer llamacpp --peer-tokens 64 --peer-sequences 16

bench-kernels: ## bench engine (BENCH_KERNELS_FLAGS, default --quick) with the default build and the GOEXPERIMENT=simd build, in one run
	GOEXPERIMENT= $(GO) build -ldflags '$(LDFLAGS)' -o bin/rollout-default ./cmd/rollout
	GOEXPERIMENT=simd $(GO) build -ldflags '$(LDFLAGS)' -o bin/rollout-simd ./cmd/rollout
	for b in default simd; do echo "== $$b build"; bin/rollout-$$b bench engine $(BENCH_KERNELS_FLAGS); echo; done

demo: ## GRPO on an embedded 2-server fleet (examples/rl-loop): held-out accuracy rises from chance to >= 0.9
	@$(GOBUILD_PROGRESS) . bin/rl-loop ./examples/rl-loop
	bin/rl-loop --steps $(DEMO_STEPS) --out rl-loop-out

agent-demo: ## GRPO teaches a tool-using agent (examples/agent-loop): held-out success rises from chance to about 0.9-1.0
	$(GO) build -o bin/agent-loop ./examples/agent-loop
	bin/agent-loop --steps $(AGENT_DEMO_STEPS) --out agent-loop-out

fuzz: ## Run every Fuzz target briefly: FUZZTIME executions each (a count: a duration hits golang/go#75804, a spurious "context deadline exceeded" in go1.26)
	@found=0; \
	while IFS= read -r file; do \
		dir=./$$(dirname "$${file#./}"); \
		for name in $$(grep -hoE '^func Fuzz[A-Za-z0-9_]*\(' "$$file" | sed -E 's/^func //; s/\($$//'); do \
			found=$$((found+1)); \
			echo "== $$dir $$name ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 0 "$$dir"; \
		done; \
	done < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '/vendor/' | sort); \
	echo "fuzz: $$found target(s) run"

clean: ## Remove build output
	rm -rf bin
