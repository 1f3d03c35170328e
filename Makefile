# libsymmem. `make help` lists the targets.
GO      ?= go
CC      ?= cc
PYTHON  ?= python3
PREFIX  ?= /usr/local
BUILD   := build
ROOT    := $(abspath .)
# VERSION is the one source of truth (scripts/version.sh writes it into the
# header, Go and Python; pkg-config, CMake and the wheel read it here).
VERSION := $(shell tr -d ' \n' < VERSION)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))
SONAME  := libsymmem.so.$(SOMAJOR)
# build/libsymmem.so.0 is the library (SONAME libsymmem.so.0); build/libsymmem.so
# is a hard link to it (not a symbolic link, so that copies of build/, such as
# the GPU machine's, keep it). `make install` makes the usual symbolic links.
LIBSO   := $(BUILD)/$(SONAME)
LIB     := $(BUILD)/libsymmem.so
GOFILES := $(shell find core cuda export -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.map' 2>/dev/null) include/embed.go include/symmem_device.cuh go.mod go.sum

# NCCL's stand-ins (rules below), needed by the C and Python suites.
FAKENCCL    := $(BUILD)/libnccl_fake.so
FAKENCCL228 := $(BUILD)/libnccl_fake_228.so

CTEST_SRC   := $(wildcard tests/c/test_*.c)
CTEST_BIN   := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(CTEST_SRC))
CTEST_FLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address -fno-omit-frame-pointer
LINK_LIB    := -L$(BUILD) -lsymmem -Wl,-rpath,$(ROOT)/$(BUILD) -pthread
FAKECUDA    := $(BUILD)/libcuda_fake.so
FAKE_ENV    := SYMMEM_BACKEND=cuda SYMMEM_LIBCUDA=$(ROOT)/$(FAKECUDA)

.PHONY: all build torch-ops help test test-go test-c test-python test-fakecuda test-install demo bench \
  install uninstall clean fuzz gpu-artifacts wheel info check-toolchain

# The Python package's call module (python/symmem/_calls.c, Note [The call
# module] in python/symmem/_lib.py), built as `pip install .` builds it; where
# it cannot be built (no Python headers) the package uses ctypes, and this
# rule only says so.
CALLS := python/symmem/_calls$(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX') or '.so')")

all: build
build: $(LIB) $(BUILD)/symmem-info $(CALLS) torch-ops

# The collectives' operators' C++ kernels (Note [Operators in C++] in
# python/symmem/torch.py), built for the torch installed here into
# $SYMMEM_TORCH_OPS_DIR (default: ~/.cache/symmem/torch-ops) where torch
# imports; a file already built for this torch and source is kept.
torch-ops:
	@if $(PYTHON) -c "import torch" >/dev/null 2>&1; then PYTHONPATH=python $(PYTHON) -m symmem build-torch-ops; \
	else echo "symmem: torch does not import here: the operators' C++ kernels are not built"; fi

$(CALLS): python/symmem/_calls.c buildsys/symmem_build.py
	@$(PYTHON) buildsys/symmem_build.py calls python/symmem

help: ## this list
	@grep -E '^[a-z][a-zA-Z_-]*:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort | \
	  awk -F'\t' '{printf "  make %-16s %s\n", $$1, $$2}'

# The Go and C compiler check of `pip install .` (buildsys/symmem_build.py;
# the minimum Go is go.mod's), first, with the same message.
check-toolchain:
	@GO=$(GO) CC=$(CC) $(PYTHON) buildsys/symmem_build.py check-toolchain

$(LIBSO): $(GOFILES) VERSION | check-toolchain
	@mkdir -p $(BUILD)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath \
	  -ldflags "-s -w -extldflags '-Wl,--version-script=$(ROOT)/export/symmem.map -Wl,-soname,$(SONAME)'" \
	  -o $@ ./export
	@rm -f $(BUILD)/libsymmem*.h

$(LIB): $(LIBSO) ## build/libsymmem.so (Go and a C compiler are all it needs)
	ln -f $< $@

$(BUILD)/symmem-info: tools/symmem-info.c include/symmem.h $(LIB)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o $@ $< $(LINK_LIB)

info: $(BUILD)/symmem-info ## print what libsymmem finds here, then a self-test
	$(BUILD)/symmem-info

# ---------------------------------------------------------------------------
# Tests. `make test` runs every suite in SUITES through scripts/run_suite.py
# (full output in build/logs/NAME.log, a line at least every 10 s) and ends
# with one table (scripts/summary.py). To add a suite: write a target
# suite-NAME whose recipe is `$(RUN) NAME KIND -- command` (KIND: go, pytest,
# c or plain, which says how its passes and failures are counted) and add
# NAME to SUITES. Suites marked independent run concurrently under -j.
# ---------------------------------------------------------------------------
SUITES := go go-fakecuda c c-fakecuda demo-fakecuda python python-fakecuda install wheel readme
RUN    := $(PYTHON) scripts/run_suite.py
.PHONY: $(addprefix suite-,$(SUITES))

test: ## every suite (what CI runs), ending with a table
	@rm -rf $(BUILD)/results
	@$(RUN) build plain -- $(MAKE) --no-print-directory $(LIB) $(CTEST_BIN) $(FAKECUDA) $(BUILD)/demo \
	  $(BUILD)/symmem-info $(FAKENCCL) $(FAKENCCL228) $(CALLS) torch-ops || true
	@$(MAKE) --no-print-directory -k -j2 $(addprefix suite-,$(SUITES)) || true
	@$(PYTHON) scripts/summary.py build $(SUITES)

suite-go: $(LIB)
	@$(RUN) go go -- sh -c '$(GO) vet ./... && $(GO) test -race -tags symmem_lockrank -count=1 -v ./...'

# The fault tables (core/alloc/fault_test.go, core/symm/fault_test.go) over the
# cuda backend on the stand-in driver: its stream-ordered paths under faults.
suite-go-fakecuda: $(FAKECUDA)
	@$(RUN) go-fakecuda go -- sh -c '$(FAKE_ENV) $(GO) test -race -tags symmem_lockrank -count=1 -v \
	  -run "UnderInjectedFaults|FailedSync|UnmappedSegment|PointerArraysLiveInThePad|AbortReleasesStuckWaits|CollectivePauseRollsBack|DeviceErrorWithAStuckStream|StopWordRefusesCollectives|UnmapFailureLeavesTheImportMapped|CopyEngineOnStreams|CopyEngineWatchdog|AutoAllGatherOnCopyEngines" ./core/alloc ./core/symm'

suite-c: $(CTEST_BIN) $(FAKECUDA) $(FAKENCCL) $(FAKENCCL228)
	@$(RUN) c c -- sh -c 'rc=0; for t in $(CTEST_BIN); do echo "== $$t"; \
	  ( . tests/c/env.sh; $$t ) || rc=1; done; exit $$rc'

suite-c-fakecuda: $(CTEST_BIN) $(FAKECUDA) $(FAKENCCL) $(FAKENCCL228)
	@$(RUN) c-fakecuda c -- sh -c 'rc=0; for t in $(CTEST_BIN); do echo "== $$t (fake cuda)"; \
	  ( . tests/c/env.sh; $(FAKE_ENV) $$t ) || rc=1; done; exit $$rc'

suite-demo-fakecuda: $(BUILD)/demo $(FAKECUDA)
	@$(RUN) demo-fakecuda plain -- sh -c '$(FAKE_ENV) $(BUILD)/demo 4'

suite-python: $(LIB) $(FAKENCCL) $(FAKENCCL228) $(CALLS)
	@$(RUN) python pytest -- sh -c 'cd python && SYMMEM_LIBRARY=$(ROOT)/$(LIB) $(PYTHON) -m pytest -q -rs tests'

suite-python-fakecuda: $(LIB) $(FAKECUDA) $(FAKENCCL) $(FAKENCCL228) $(CALLS)
	@$(RUN) python-fakecuda pytest -- sh -c 'cd python && $(FAKE_ENV) SYMMEM_LIBRARY=$(ROOT)/$(LIB) \
	  $(PYTHON) -m pytest -q -rs tests'

suite-install: $(LIB) $(BUILD)/symmem-info
	@$(RUN) install plain -- sh scripts/test_install.sh

suite-wheel: $(LIB)
	@$(RUN) wheel plain -- sh scripts/test_wheel.sh

# readme: every README block runs; the documents agree with the code
# (tests/test_docs.py); the tracked tree holds no build output and no
# narration (tests/test_tree.py); gpu-artifacts, the summary's skip reasons
# and the toolchain check (tests/test_make.py).
suite-readme: $(LIB)
	@$(RUN) readme pytest -- sh -c 'SYMMEM_LIBRARY=$(ROOT)/$(LIB) $(PYTHON) -m pytest -q -rs tests/test_readme.py tests/test_docs.py tests/test_tree.py tests/test_make.py'

# The single suites, by hand.
test-go: suite-go ## go vet and go test -race
test-c: suite-c ## the C tests (AddressSanitizer) on the host backend
test-python: suite-python ## the Python tests on the host backend
test-fakecuda: suite-go-fakecuda suite-c-fakecuda suite-demo-fakecuda suite-python-fakecuda ## the cuda backend's paths on a stand-in driver
test-install: suite-install ## make install into a scratch prefix; pkg-config, CMake, symmem-info

$(BUILD)/tests/%: tests/c/%.c include/symmem.h tests/c/check.h $(LIB)
	@mkdir -p $(BUILD)/tests
	$(CC) $(CTEST_FLAGS) -Iinclude -o $@ $< $(LINK_LIB)

# The cuda backend's code paths without a GPU: cuda/testdata/fakecuda.c, a
# stand-in libcuda on host memory (asynchronous streams, VMM mapping, fds
# across processes).
$(FAKECUDA): cuda/testdata/fakecuda.c cuda/driver.h
	@mkdir -p $(BUILD)
	$(CC) -shared -fPIC -O1 -Icuda -o $@ $< -lpthread

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

fuzz: ## fuzz the allocator, with and without thread caches, 60 s each
	$(GO) test ./core/alloc -run '^$$' -fuzz FuzzAllocFree -fuzztime 60s
	$(GO) test ./core/alloc -run '^$$' -fuzz FuzzThreadCache -fuzztime 60s

$(BUILD)/demo: examples/demo.c include/symmem.h $(LIB)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o $@ $< $(LINK_LIB)

demo: $(BUILD)/demo ## the multi-rank demo (4 ranks)
	$(BUILD)/demo 4

$(BUILD)/bench_alloc: bench/bench_alloc.c include/symmem.h $(LIB)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o $@ bench/bench_alloc.c $(LINK_LIB)

bench: $(BUILD)/bench_alloc ## the allocator benchmark on the host backend
	SYMMEM_BACKEND=host $(BUILD)/bench_alloc

wheel: $(LIB) ## a platform wheel of the Python package with the library inside, in dist/
	$(PYTHON) -m pip wheel --no-deps --no-build-isolation -w dist .

# ---------------------------------------------------------------------------
# Install: lib/libsymmem.so.MAJOR.MINOR.PATCH with the links libsymmem.so.MAJOR
# and libsymmem.so, the header, pkg-config's symmem.pc, CMake's package
# config (find_package(symmem) -> symmem::symmem) and bin/symmem-info.
# ---------------------------------------------------------------------------
LIBDIR   = $(DESTDIR)$(PREFIX)/lib
INSTALLED = $(PREFIX)/lib/libsymmem.so.$(VERSION) $(PREFIX)/lib/$(SONAME) $(PREFIX)/lib/libsymmem.so \
  $(PREFIX)/include/symmem.h $(PREFIX)/include/symmem_device.cuh $(PREFIX)/lib/pkgconfig/symmem.pc $(PREFIX)/bin/symmem-info \
  $(PREFIX)/lib/cmake/symmem/symmemConfig.cmake $(PREFIX)/lib/cmake/symmem/symmemConfigVersion.cmake

install: $(LIB) $(BUILD)/symmem-info ## install into PREFIX (default /usr/local; DESTDIR honoured)
	install -d $(LIBDIR) $(DESTDIR)$(PREFIX)/include $(LIBDIR)/pkgconfig $(LIBDIR)/cmake/symmem $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(LIBSO) $(LIBDIR)/libsymmem.so.$(VERSION)
	ln -sf libsymmem.so.$(VERSION) $(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(LIBDIR)/libsymmem.so
	install -m 0644 include/symmem.h $(DESTDIR)$(PREFIX)/include/symmem.h
	install -m 0644 include/symmem_device.cuh $(DESTDIR)$(PREFIX)/include/symmem_device.cuh
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' symmem.pc.in > $(LIBDIR)/pkgconfig/symmem.pc
	sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@SONAME@|$(SONAME)|g' cmake/symmemConfig.cmake.in > $(LIBDIR)/cmake/symmem/symmemConfig.cmake
	sed -e 's|@VERSION@|$(VERSION)|g' cmake/symmemConfigVersion.cmake.in > $(LIBDIR)/cmake/symmem/symmemConfigVersion.cmake
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Iinclude -o $(DESTDIR)$(PREFIX)/bin/symmem-info tools/symmem-info.c \
	  -L$(BUILD) -lsymmem -Wl,-rpath,$(PREFIX)/lib -pthread
	-[ -z "$(DESTDIR)" ] && [ "$(PREFIX)" = /usr/local ] && command -v ldconfig >/dev/null && ldconfig || true

uninstall: ## remove what install put in PREFIX
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(PREFIX)/lib/cmake/symmem 2>/dev/null || true

clean: ## remove build/ and dist/ (and the call module)
	rm -rf $(BUILD) dist $(CALLS)

# What the GPU machine (which has no Go) needs: the library, the stand-ins
# that the C and Python tests load (tests/c/test_fakenccl.c runs the NCCL
# stand-in beside the stand-in driver), the Go test binaries and the Go
# floor of the allocator benchmark, built here and carried in build/ (see
# scripts/gpu_suite.sh; tests/test_make.py checks that nothing is missing).
GO_TEST_PKGS ?= ./core ./core/alloc ./core/host ./core/ipc ./core/symm ./core/symm/coll ./cuda ./cuda/symmtest
gpu-artifacts: $(LIB) $(FAKECUDA) $(FAKENCCL) $(FAKENCCL228) ## everything scripts/gpu_suite.sh needs from Go, in build/
	@mkdir -p $(BUILD)/gotests
	@for p in $(GO_TEST_PKGS); do \
	  n=$$(echo $$p | sed 's|^\./||; s|/|_|g'); \
	  $(GO) test -race -c -o $(BUILD)/gotests/$$n.test $$p || exit 1; done
	$(GO) build -buildmode=c-shared -o $(BUILD)/libgofloor.so ./bench/gofloor
