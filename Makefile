# cri-shim. Two commands set up everything on a fresh machine:
#   make run    containerd + cri-shim + kubelet and API server, with demo pods
#               that exercise each feature (test/stack/demo.sh prints how to see each);
#               it builds the newest pair of the version matrix only
#   make test   vet, unit tests (with -race) and the end-to-end suite on the real
#               stack; as root only: it FAILS, saying why, when the stack cannot
#               be installed or the node does not come up (a skipped suite is not a pass)
#   make unit   the quick run: vet and the unit tests with -race, no root, nothing
#               of the machine touched (test/unit-nonroot.sh checks that as nobody)
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
COMMIT_TIME ?= $(shell git log -1 --format=%cI 2>/dev/null)
LDFLAGS := -X github.com/cri-shim/cri-shim/internal/version.Version=$(VERSION) \
	-X github.com/cri-shim/cri-shim/internal/version.Revision=$(REVISION) \
	-X github.com/cri-shim/cri-shim/internal/version.CommitTime=$(COMMIT_TIME)
export GONOSUMDB := k8s.io,sigs.k8s.io
STACK_ENV := test/stack/env.sh
IS_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo 1)

.PHONY: proto all build generate test test-long unit unit-nonroot e2e e2e-oldest matrix node-vm node-vm-shapes stack stack-test stack-run run stop bench-proxy bench-restart bench-backoff bench-backoff-stress bench-checkpoint bench-checkpoint-freeze bench-checkpoint-baseline bench-fleet fuzz vet clean release

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o _output/cri-shim ./cmd/cri-shim
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o _output/containerd-shim-cri-shim-v2 ./cmd/containerd-shim-cri-shim-v2

# Deepcopy code of pkg/apis and the CRDs in deploy/crd, by controller-gen
# (pinned in build/codegen); a unit test fails when they are stale.
generate:
	GO=$(GO) build/codegen/generate.sh

vet:
	$(GO) vet ./...

unit: vet
	$(GO) test -race -count=1 ./cmd/... ./internal/... ./pkg/... ./docs/

# As root: `make unit` again as nobody on a copy of the tree, then the
# end-to-end suite as nobody, which must fail (and pass only with
# CRI_SHIM_E2E_ALLOW_SKIP=1, every test skipped).
unit-nonroot:
	test/unit-nonroot.sh

# Short fuzzing of every parser; the seed corpora also run as part of `unit`.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 20s ./internal/config
	$(GO) test -run '^$$' -fuzz '^FuzzParseRules$$' -fuzztime 20s ./internal/podspec
	$(GO) test -run '^$$' -fuzz FuzzDecodeSlot -fuzztime 20s ./internal/store
	$(GO) test -run '^$$' -fuzz FuzzPeeks -fuzztime 20s ./internal/wire
	for f in FuzzParse FuzzParseOrchestrator FuzzParseWarmRestart FuzzParseSchedule; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime 10s ./internal/podspec || exit 1; done
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 20s ./internal/events
	$(GO) test -run '^$$' -fuzz FuzzCheckKey -fuzztime 10s ./internal/store
	$(GO) test -run '^$$' -fuzz FuzzCheckKubelet -fuzztime 10s ./cmd/cri-shim
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 10s ./internal/restoremark
	$(GO) test -run '^$$' -fuzz FuzzHandlerRoute -fuzztime 10s ./internal/restoremark
	$(GO) test -run '^$$' -fuzz '^FuzzCheck$$' -fuzztime 30s ./internal/criucheck
	$(GO) test -run '^$$' -fuzz '^FuzzCheckAccess$$' -fuzztime 20s ./internal/criucheck
	$(GO) test -run '^$$' -fuzz '^FuzzCheckRootfsDiff$$' -fuzztime 20s ./internal/criucheck
	$(GO) test -run '^$$' -fuzz '^FuzzCheckpointOptions$$' -fuzztime 10s ./internal/capture
	for f in FuzzParseManifest FuzzConfine FuzzCheckName; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime 10s ./internal/layout || exit 1; done

# The real node stack (test/stack/install.sh), as root; each target asks for
# the set it runs (test/stack/versions.sh): stack-run the newest pair and what
# make run starts, stack-test also the oldest pair, every containerd and the
# test tools, stack every version of the matrix.
STACK_SET_stack := all
STACK_SET_stack-test := test
STACK_SET_stack-run := run
stack stack-test stack-run:
ifeq ($(IS_ROOT),1)
	@test/stack/install.sh --set $(STACK_SET_$@) || { echo "!!! make $@: installing the real node stack failed (see above): the node cannot start, so neither make run nor the end-to-end suite can run." >&2; exit 1; }
else
	@echo "!!! make $@: not root: the real node stack cannot be installed, so neither make run nor the end-to-end suite can run. Run as root (sudo make run, sudo make test), or 'make unit' for the unit tests alone." >&2; exit 1
endif

# The fast tier (docs/testing.md): every e2e test on the newest pair and the
# matrix's subset on the oldest, in lanes side by side (test/e2e-lanes.sh;
# CRI_SHIM_E2E_LANES sets how many). Every lane runs to its end; the summary
# lists each.
e2e: build stack-test
	test/e2e-lanes.sh

# Both parts run whatever the other's outcome, so one failure hides nothing.
test:
	@rc=0; $(MAKE) --no-print-directory unit || rc=1; $(MAKE) --no-print-directory e2e || rc=1; \
		[[ $$rc == 0 ]] || echo "!!! make test: FAILED (see the unit output and the e2e summary above)" >&2; exit $$rc

# The long tier: every test at full size and count on the newest pair
# (CRI_SHIM_E2E_TIER=long: churn, the demo, release packaging, the full
# tenant and upgrade loops, every kill point, the pinned critest specs), then
# the matrix over every pair (docs/compatibility.md).
test-long: unit build stack
	@rc=0; test/e2e-lanes.sh --tier long --no-oldest || rc=1; test/matrix.sh --lanes 3 || rc=1; test/vm/run.sh || rc=1; CRI_SHIM_VM_SUITE=shapes test/vm/run.sh || rc=1; \
		[[ $$rc == 0 ]] || echo "!!! make test-long: FAILED (see the e2e summary, docs/compatibility.md and the guest's checks above)" >&2; exit $$rc

# A systemd + cgroup v2 node in a QEMU guest (test/vm): built from Debian's
# packages and cached with the stack; cri-shim installed there by
# deploy/install.sh; the guest's checks print at the end. About 10 minutes
# with the machine otherwise idle (TCG emulation).
node-vm: build stack-run
	test/vm/run.sh

# The same guest node through containerd's main-config shapes
# (test/testdata/containerd-shapes) on containerd 2.2.9, 2.3.7 and 2.4.2:
# install.sh --with-containerd on each, containerd comes up, a pod restores
# from a checkpoint (test/vm/guest/shapes.sh). The guest's checks print at
# the end.
node-vm-shapes: build stack-test
	CRI_SHIM_VM_SUITE=shapes test/vm/run.sh

# The matrix's subset (test/matrix.sh) on the oldest supported pair alone
# (make e2e runs it in a lane beside the newest).
e2e-oldest: build stack-test
	test/matrix.sh --containerd 2.2.9 --kubelet 1.34.4 --out _output/compatibility-oldest.md
	@cat _output/matrix/containerd-2.2.9-kubelet-1.34.4.log | grep -E '^(--- |ok|FAIL|PASS)' || true

# The version matrix: a named subset of the e2e suite on every containerd and
# kubelet pair the stack builds, written to docs/compatibility.md
# (test/matrix.sh; about 5 minutes a pair, three pairs at a time in lanes).
matrix: build stack
	test/matrix.sh --lanes 3

run: build stack-run
	test/stack/up.sh --kubelet --apiserver --shim-api --shim-config deploy/examples/demo/cri-shim.toml
	@GO=$(GO) test/stack/demo.sh

stop:
	test/stack/down.sh

bench-proxy: build stack-run
	$(GO) build -o _output/proxybench ./bench/proxybench
	test/stack/up.sh
	source test/stack/env.sh; _output/proxybench --direct $$CONTAINERD_SOCK --shim $$SHIM_SOCK \
		--shim-pid $$(cat $$NODE_RUN/cri-shim.pid) --out bench/results; rc=$$?; test/stack/down.sh; exit $$rc

clean:
	rm -rf _output

# Versioned static tarballs and .deb packages (nfpm) for amd64 and arm64, with
# SHA256SUMS, in _output/release (build/release.sh).
release:
	build/release.sh $(VERSION) _output/release

# Trigger-to-all-running latency of an in-place pod restart: cri-shim vs the
# native kubelet feature vs deleting and recreating the pod (test/e2e).
bench-restart: build stack-test
	$(GO) test -count=1 -run '^$$' -bench BenchmarkRestart -benchtime 1x -timeout 30m ./test/e2e/

# Restarts of a crashing container under the kubelet's and cri-shim's curves,
# and the shim's CPU with 20 crashing pods (about 12 minutes; test/e2e).
bench-backoff: build stack-test
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkBackoff$$' -benchtime 1x -timeout 40m ./test/e2e/

# The 20 crashing pods of bench-backoff alone for STRESS (a Go duration, or
# CRI_SHIM_BENCH_STRESS; default 25m, about 25,000 restarts here): restarts,
# status updates the kubelet refused and pods wrongly Failed, written to
# bench/results/backoff-stress-*.md (test/e2e). Raise STRESS_TIMEOUT past 2 h runs.
# CRI_SHIM_BENCH_STRESS_STOP_AT=N ends the run once it has counted N restarts.
STRESS ?= $(or $(CRI_SHIM_BENCH_STRESS),25m)
STRESS_TIMEOUT ?= 3h
bench-backoff-stress: build stack-test
	CRI_SHIM_BENCH_STRESS=$(STRESS) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkBackoffStress$$' -benchtime 1x -timeout $(STRESS_TIMEOUT) ./test/e2e/

# The stack's registry keeps what earlier runs pushed (gigabytes of random
# blobs and checkpoints per run, each unique): emptied first, with the node down.
# One run per containerd of the matrix (BENCH_CONTAINERDS), each written to
# bench/results/checkpoint-<time>-containerd-<version>.md.
BENCH_CONTAINERDS ?= 2.2.9 2.3.7 2.4.2
bench-checkpoint: build stack-test
	set -e; for v in $(BENCH_CONTAINERDS); do \
		(source test/stack/env.sh; test/stack/down.sh --quiet 2>/dev/null; rm -rf "$$NODE_DATA/registry/docker"); \
		CRI_SHIM_CONTAINERD_VERSION=$$v $(GO) test -count=1 -run '^$$' -bench BenchmarkCheckpoint -benchtime 1x -timeout 30m ./test/e2e/; \
	done

# Where a CheckpointPod's freeze goes (pause, CRIU per container, resume),
# 3 checkpoints per size; writes bench/results/checkpoint-freeze-*.md.
bench-checkpoint-freeze: build stack-test
	CRI_SHIM_BENCH_SIZES=$${CRI_SHIM_BENCH_SIZES:-64,2048} $(GO) test -count=1 -run '^$$' -bench '^BenchmarkCheckpointFreeze$$' -benchtime 1x -timeout 30m ./test/e2e/

# The fleet harness (test/fleet, issue 30): one real etcd + kube-apiserver
# and N simulated nodes running the shim's API side in one process, each as
# system:node:<name>, through sync, idle, churn and restart-storm phases and a
# kubelet-like baseline; one run per FLEET_NODES, each written to
# bench/results/fleet-<time>-n<N>.md. FLEET_PHASE: seconds per timed phase;
# FLEET_CHURN: seconds of churn (3600 for the hour the memory check asks).
FLEET_NODES ?= 50 100 200 500
FLEET_PHASE ?= 60
FLEET_CHURN ?= $(FLEET_PHASE)
bench-fleet: build stack-run
	set -e; for n in $(FLEET_NODES); do \
		CRI_SHIM_FLEET_NODES=$$n CRI_SHIM_FLEET_PHASE=$(FLEET_PHASE) CRI_SHIM_FLEET_CHURN=$(FLEET_CHURN) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkFleet$$' -benchtime 1x -timeout 90m ./test/fleet/; \
	done

# The same benchmark on containerd 2.2.9 with containerd's own restore through
# CreateContainer switched on, measured beside cri-shim's route in one run:
# the "before" of the restore figures (the route cri-shim used until it owned
# the restore; off by default in 2.2.9 and 2.3, removed in 2.4). Only
# BenchmarkCheckpoint (the streaming and registry benches have no baseline);
# CRI_SHIM_BENCH_SIZES=2048 CRI_SHIM_BENCH_REPS=7 repeats one size.
bench-checkpoint-baseline: build stack-test
	(source test/stack/env.sh; test/stack/down.sh --quiet 2>/dev/null; rm -rf "$$NODE_DATA/registry/docker")
	CRI_SHIM_CONTAINERD_VERSION=2.2.9 CRI_SHIM_CONTAINERD_RESTORE_VIA_CREATE=1 CRI_SHIM_BENCH_IMPORT_BASELINE=1 \
		$(GO) test -count=1 -run '^$$' -bench '^BenchmarkCheckpoint$$' -benchtime 1x -timeout 30m ./test/e2e/
	(source test/stack/env.sh; test/stack/down.sh --quiet 2>/dev/null)

# Regenerates api/podmanagement/v1 (needs protoc, protoc-gen-go, protoc-gen-go-grpc).
proto:
	protoc --proto_path=api --go_out=api --go_opt=paths=source_relative \
		--go-grpc_out=api --go-grpc_opt=paths=source_relative podmanagement/v1/podmanagement.proto
