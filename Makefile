# nodectl: `make help` lists the targets. Tests, demo and bench need root (sudo).
# sudo resets PATH: fall back to the usual Go install when go is not on it.
GO      ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
BIN     ?= bin/nodectl
# Evaluated once: a tree edited during a run must not give its image and its test two tags.
ifndef VERSION
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
endif
LDFLAGS := -X github.com/nodectl/nodectl/cli/internal/buildinfo.Version=$(VERSION)

# The container runtimes the runc and runsc tests start for real, from Debian's packages, and
# the headless Chromium (with a font) the report's rendering test opens reports in.
TEST_PACKAGES := runc runsc containerd chromium fonts-dejavu-core bpftrace linux-perf
# What make test-cluster adds: etcd for kube-apiserver, the CNI plugins (bridge, host-local,
# loopback) for the kubelet's pods, ip to remove the bridge.
CLUSTER_PACKAGES := etcd-server containernetworking-plugins iproute2
KUBE_VERSION ?= 1.37.2
# The VM lane: QEMU, the guest's busybox, the tools that pack its initramfs and disk.
VM_PACKAGES := qemu-system-x86 busybox-static cpio e2fsprogs kmod
# The kernels make test-vm boots, one Debian package each (unpacked into /var/cache/nodectl,
# never installed): a second kernel is one more word here.
VM_KERNELS ?= linux-image-cloud-amd64

# install-missing: apt-get installs those of the packages $(1) that are missing (as root); without
# root or apt-get it says who needs them ($(2)) and exits with $(3).
define install-missing
missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
if [ -z "$$missing" ]; then exit 0; fi; \
missing=$$(echo $$missing); \
if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	echo "make: $$missing not installed; $(2) (apt-get install $$missing, as root)" >&2; exit $(3); \
fi; \
echo "make: installing $$missing"; \
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null
endef

.PHONY: help generate generate-api build image deps deps-cluster deps-vm test test-cluster test-vm fuzz bench demo lint

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

generate: generate-api ## regenerate the BPF objects and their Go bindings (needs clang-19, llvm-strip-19) and the API's protobufs
	$(GO) generate ./record/trace/...

generate-api: ## regenerate the agent API's Go code from api/agent/v1/agent.proto (needs protoc; plugins pinned by go.mod)
	protoc --plugin=protoc-gen-go=$$($(GO) tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$$($(GO) tool -n protoc-gen-go-grpc) \
		--go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative \
		api/agent/v1/agent.proto

build: ## build bin/nodectl (static, no clang needed: generated BPF objects are committed)
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cli/nodectl

IMAGE ?= bin/nodectl-image.tar
image: build ## the agent's container image: bin/nodectl-image.tar, tagged nodectl:VERSION, a docker-archive for `ctr -n k8s.io images import` (no Docker daemon; docs/deploy.md)
	$(GO) run ./build/mkimage -binary $(BIN) -tag nodectl:$(VERSION) -version $(VERSION) -out $(IMAGE)

deps: ## install what the tests need (runc, runsc, containerd from Debian) when missing; idempotent
	@$(call install-missing,$(TEST_PACKAGES),the runc and runsc tests need them,0)

test: deps ## run every test (installing what they need first); as root the BPF, cgroup and end-to-end tests run for real; then a short fuzz of every fuzz target
	CGO_ENABLED=0 $(GO) test -count=1 -p 1 -timeout 40m ./...
	$(MAKE) fuzz
	$(MAKE) test-vm
	$(MAKE) test-cluster

deps-cluster: ## install what test-cluster needs (etcd-server, containernetworking-plugins, iproute2 from Debian) when missing; idempotent
	@$(call install-missing,$(CLUSTER_PACKAGES),the cluster tests need them,1)

test-cluster: deps deps-cluster image ## a real control plane (etcd, kube-apiserver) and kubelet node (private containerd, runc and gVisor pods), as root, with the agent's DaemonSet of deploy/ on it; builds kube-apiserver and the kubelet once into /var/cache/nodectl (202 MB)
	KUBE_VERSION=$(KUBE_VERSION) ./testcluster/build-kube.sh
	NODECTL_TEST_CLUSTER=1 NODECTL_BIN=$(abspath $(BIN)) NODECTL_IMAGE=$(abspath $(IMAGE)) NODECTL_IMAGE_TAG=$(VERSION) \
		CGO_ENABLED=0 $(GO) test -count=1 -p 1 -timeout 30m ./testcluster/... ./agent/kube/

deps-vm: ## install what test-vm needs (qemu-system-x86, busybox-static, cpio, e2fsprogs, kmod for depmod, from Debian) when missing; idempotent
	@$(call install-missing,$(VM_PACKAGES),the VM lane needs them,1)

test-vm: deps-vm ## boot each kernel of VM_KERNELS under QEMU with pure cgroup v2 and run the tracer, sampler, agent and noisy tests there (as root; console logs in $$NODECTL_TEST_ARTIFACTS)
	@dirs=""; for k in $(VM_KERNELS); do d=$$(./testvm/fetch-kernel.sh $$k) || exit 1; dirs="$$dirs $$d"; done; \
	NODECTL_TEST_VM=1 NODECTL_VM_KERNELS="$$dirs" CGO_ENABLED=0 $(GO) test -count=1 -v -timeout 90m ./testvm/

# A count, not a duration: with a duration Go's fuzzing coordinator can fail a target at the
# deadline having found nothing ("context deadline exceeded", go.dev/issue/75804, fixed in Go
# 1.27), as it did on a loaded CI machine here.
FUZZTIME ?= 1000x
fuzz: ## run each fuzz target for FUZZTIME (the flight recorder's reader, the API's request parsing)
	@for pkg in ./agent/flightrec ./agent/rpc; do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$f"; \
			out=$$(mktemp); \
			if ! $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >$$out 2>&1; then cat $$out; rm -f $$out; exit 1; fi; \
			rm -f $$out; \
		done; \
	done

bench: build ## tracer and whole-agent overhead (detached vs attached, ns per event); the agent at 1,000 live cgroups (RSS, CPU, syscalls a second under a guard, flight recorder); an incident's analysis at 1,000 cgroups; a post-mortem over 1 h of 1,000 cgroups; cgroup sampling cost at 100 and 1,000 cgroups; the metrics' series at 500 pods (fails past the series budget); the run-queue maps' bytes read an interval at 1,000 cgroups, summed in the kernel and whole (fails past a tenth); sched_switch's cost for a victim with a per-CPU slot and for one in the shared maps
	NODECTL_BIN=$(abspath $(BIN)) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./bench/...
	$(GO) test -run '^$$' -bench BenchmarkCgroupSampling -benchtime 2s -timeout 10m ./record/sample/
	$(GO) test -run '^$$' -bench BenchmarkScrape500Pods -benchtime 20x ./agent/exporter/
	$(GO) test -run '^$$' -bench BenchmarkRunqRead -benchtime 1x ./record/trace/runq/
	$(GO) test -run '^$$' -bench BenchmarkSwitch -benchtime 100000x ./record/trace/runq/

demo: build ## a noisy run with CPU and disk neighbours, traced, and its explanation
	./$(BIN) stress noisy --hog cpu,count=2 --hog disk --trace --baseline 15s --duration 20s

# goimports, pinned: imports in three groups (standard library, others, nodectl's own).
GOIMPORTS := golang.org/x/tools/cmd/goimports@v0.52.0

lint: ## gofmt, goimports' grouping (-local: nodectl's own imports last) and go vet; generated files excepted
	@files=$$(git ls-files --cached --others --exclude-standard '*.go' | xargs grep -L '^// Code generated .* DO NOT EDIT\.$$'); \
	bad=$$(gofmt -l $$files; $(GO) run $(GOIMPORTS) -local github.com/nodectl/nodectl -l $$files); \
	test -z "$$bad" || { echo "not formatted (gofmt, or goimports -local github.com/nodectl/nodectl -w):"; echo "$$bad"; exit 1; }
	$(GO) vet ./...
