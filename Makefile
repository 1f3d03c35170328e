# libsymmem: `make` builds build/libsymmem.so (no CUDA toolkit needed),
# `make test` runs every suite on the host backend (and on the cuda backend
# where a GPU is present), `make demo` runs the multi-rank demo.
GO      ?= go
CC      ?= cc
PYTHON  ?= python3
PREFIX  ?= /usr/local
BUILD   := build
ROOT    := $(abspath .)
LIB     := $(BUILD)/libsymmem.so
GOFILES := $(shell find core cuda export -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.map' 2>/dev/null) go.mod go.sum

# NCCL's stand-ins (rules below), needed by the C and Python suites.
FAKENCCL    := $(BUILD)/libnccl_fake.so
FAKENCCL228 := $(BUILD)/libnccl_fake_228.so

CTEST_SRC   := $(wildcard tests/c/test_*.c)
CTEST_BIN   := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(CTEST_SRC))
CTEST_FLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address -fno-omit-frame-pointer
LINK_LIB    := -L$(BUILD) -lsymmem -Wl,-rpath,$(ROOT)/$(BUILD) -pthread

.PHONY: all build test test-go test-c test-python test-fakecuda test-install demo bench install clean fuzz gpu-artifacts

all: build
build: $(LIB)

$(LIB): $(GOFILES)
	@mkdir -p $(BUILD)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath \
	  -ldflags "-s -w -extldflags -Wl,--version-script=$(ROOT)/export/symmem.map" \
	  -o $@ ./export
	@rm -f $(BUILD)/libsymmem.h

test: test-go test-c test-install test-fakecuda test-python

test-go:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

$(BUILD)/tests/%: tests/c/%.c include/symmem.h tests/c/check.h $(LIB)
	@mkdir -p $(BUILD)/tests
	$(CC) $(CTEST_FLAGS) -Iinclude -o $@ $< $(LINK_LIB)

test-c: $(CTEST_BIN) $(FAKENCCL) $(FAKENCCL228)
	@rc=0; for t in $(CTEST_BIN); do echo "== $$t"; \
	  ( [ -f tests/c/env.sh ] && . tests/c/env.sh; $$t ) || rc=1; done; exit $$rc

test-python: $(LIB) $(FAKENCCL) $(FAKENCCL228)
	cd python && SYMMEM_LIBRARY=$(ROOT)/$(LIB) $(PYTHON) -m pytest -q tests

# The cuda backend's code paths without a GPU: the C and Python suites, the
# fault tables (core/fault_test.go, core/symm/fault_test.go) and the demo against cuda/testdata/fakecuda.c, a stand-in libcuda on host memory
# (asynchronous streams, VMM mapping, fds across processes).
FAKECUDA := $(BUILD)/libcuda_fake.so
$(FAKECUDA): cuda/testdata/fakecuda.c cuda/driver.h
	@mkdir -p $(BUILD)
	$(CC) -shared -fPIC -O1 -Icuda -o $@ $< -lpthread

test-fakecuda: $(CTEST_BIN) $(BUILD)/demo $(FAKECUDA) $(FAKENCCL) $(FAKENCCL228)
	@rc=0; for t in $(CTEST_BIN); do echo "== $$t (fake cuda)"; \
	  ( [ -f tests/c/env.sh ] && . tests/c/env.sh; \
	    SYMMEM_BACKEND=cuda SYMMEM_LIBCUDA=$(ROOT)/$(FAKECUDA) $$t ) || rc=1; done; \
	SYMMEM_BACKEND=cuda SYMMEM_LIBCUDA=$(ROOT)/$(FAKECUDA) $(BUILD)/demo 4 || rc=1; \
	SYMMEM_BACKEND=cuda SYMMEM_LIBCUDA=$(ROOT)/$(FAKECUDA) $(GO) test -race -count=1 \
	  -run 'UnderInjectedFaults|FailedSync|UnmappedSegment' ./core ./core/symm || rc=1; \
	cd python && SYMMEM_BACKEND=cuda SYMMEM_LIBCUDA=$(ROOT)/$(FAKECUDA) SYMMEM_LIBRARY=$(ROOT)/$(LIB) \
	  $(PYTHON) -m pytest -q tests || rc=1; exit $$rc

# NCCL's stand-in (cuda/testdata/fakenccl.c) for the NCCL path without a GPU
# (tests/c/test_nccl.c, python/tests/test_nccl_host.py): NCCL 2.29 with host
# peer pointers, and 2.28.9 without them. The soname is NCCL's, so that the
# run-time loader finds a copy already loaded the way it finds torch's.
$(FAKENCCL): cuda/testdata/fakenccl.c
	@mkdir -p $(BUILD)
	$(CC) -shared -fPIC -O1 -Wall -Wextra -Werror -Wl,-soname,libnccl.so.2 -o $@ $< -lpthread
$(FAKENCCL228): cuda/testdata/fakenccl.c
	@mkdir -p $(BUILD)
	$(CC) -shared -fPIC -O1 -Wall -Wextra -Werror -DFAKENCCL_NO_PEER_POINTER -Wl,-soname,libnccl.so.2 -o $@ $< -lpthread

# `make install` into a scratch prefix, then build and run a program the way
# a user would: with pkg-config.
test-install: $(LIB)
	@rm -rf $(BUILD)/install-test
	$(MAKE) --no-print-directory install PREFIX=$(ROOT)/$(BUILD)/install-test
	printf '#include <symmem.h>\nint main(void){void*p=symmem_alloc(100,0,0);symmem_free(p,100,0,0);return p==0;}\n' > $(BUILD)/install-test/app.c
	PKG_CONFIG_PATH=$(ROOT)/$(BUILD)/install-test/lib/pkgconfig sh -c \
	  '$(CC) $(BUILD)/install-test/app.c $$(pkg-config --cflags --libs symmem) -o $(BUILD)/install-test/app'
	SYMMEM_BACKEND=host $(BUILD)/install-test/app && echo "install + pkg-config: ok"

fuzz:
	$(GO) test ./core -run '^$$' -fuzz FuzzAllocFree -fuzztime 60s

$(BUILD)/demo: examples/demo.c include/symmem.h $(LIB)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o $@ $< $(LINK_LIB)

demo: $(BUILD)/demo
	$(BUILD)/demo 4

$(BUILD)/bench_alloc: bench/bench_alloc.c include/symmem.h $(LIB)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o $@ bench/bench_alloc.c $(LINK_LIB)

bench: $(BUILD)/bench_alloc
	SYMMEM_BACKEND=host $(BUILD)/bench_alloc

install: $(LIB)
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0755 $(LIB) $(DESTDIR)$(PREFIX)/lib/libsymmem.so
	install -m 0644 include/symmem.h $(DESTDIR)$(PREFIX)/include/symmem.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|0.1.0|g' symmem.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/symmem.pc

clean:
	rm -rf $(BUILD)

# What the GPU machine (which has no Go) needs: the library and the Go test
# binaries, built here and carried in build/ (see scripts/gpu_suite.sh).
GO_TEST_PKGS ?= ./core ./core/host ./core/ipc ./core/symm ./cuda
gpu-artifacts: $(LIB) $(FAKENCCL) $(FAKENCCL228)
	@mkdir -p $(BUILD)/gotests
	@for p in $(GO_TEST_PKGS); do \
	  n=$$(echo $$p | sed 's|^\./||; s|/|_|g'); \
	  $(GO) test -race -c -o $(BUILD)/gotests/$$n.test $$p || exit 1; done
	$(GO) build -buildmode=c-shared -o $(BUILD)/libgofloor.so ./bench/gofloor
