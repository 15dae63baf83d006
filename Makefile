# xdplb build, test and demo entry points. Every target installs what it
# needs on a fresh Debian machine first (see `deps`).

SHELL := /bin/bash
# Go from the PATH, else where these machines have it.
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
BIN := bin/xdplb

# The BPF toolchain is pinned: the committed objects must be reproducible.
BPF_CLANG ?= clang-16
BPF_STRIP ?= llvm-strip-16
ARCH_INCLUDE := /usr/include/$(shell uname -m)-linux-gnu
BPF_CFLAGS ?= -O2 -g -Wall -Werror -mcpu=v3 -I$(ARCH_INCLUDE)
export BPF_CLANG BPF_STRIP BPF_CFLAGS

# Debian packages the targets below rely on.
DEB_PACKAGES := clang-16 llvm-16 libbpf-dev linux-libc-dev iproute2 iptables nftables ethtool

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# The version `xdplb version` reports (stamped with -ldflags -X). The image
# takes it as a build argument: docker build --build-arg VERSION=$(VERSION).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: all deps generate build k8s-bins test test-unit bench lint demo perf perf-quick clean

all: build

## deps: install missing Debian packages (needs root and apt).
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

## generate: rebuild the BPF objects and Go bindings from the C sources.
generate: deps
	cd xdp && $(GO) generate ./...

## build: the xdplb binary (uses the committed BPF objects, no clang needed).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/xdplb

## k8s-bins: build kube-apiserver and etcd from the Go module proxy, once
## (cached under ~/.cache/xdplb, keyed by version).
k8s-bins:
	./tests/apiserver/build.sh

## test: every test tier, for real: needs root and a BPF-capable kernel.
test: deps build k8s-bins
	$(GO) test -count=1 -timeout 60m ./...

## test-unit: the tests that need neither root nor a kernel.
test-unit:
	$(GO) test -count=1 ./control/...

## bench: datapath and control-plane benchmarks with their baselines.
bench: deps build
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

## lint: go vet and staticcheck.
lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

## demo: the agent on its embedded default (a services file) in a sandbox of
## network namespaces: client, edge node, second node with pods.
demo: deps build
	CGO_ENABLED=0 $(GO) build -o bin/xdplb-demo ./cmd/xdplb-demo
	./bin/xdplb-demo -xdplb $(BIN)

## perf-quick: every perf mode once on a representative subset (under a
## minute once kube-apiserver, etcd and kube-proxy are built and cached); fails only if a mode that can run here
## produced no figure.
perf-quick: deps build
	./tests/apiserver/build.sh -kube-proxy
	$(GO) run ./perf/cmd/xdplb-perf -xdplb $(BIN) -quick -check

## perf: the full perf matrix; the report is also published to perf/report/,
## which docs/performance.md shows.
perf: deps build
	./tests/apiserver/build.sh -kube-proxy
	$(GO) run ./perf/cmd/xdplb-perf -xdplb $(BIN) -publish perf/report

clean:
	rm -rf bin
