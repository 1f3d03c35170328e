#!/usr/bin/env bash
# The GPU suite, run on a machine with NVIDIA GPUs, CUDA, gcc and PyTorch but
# no Go: the library and the Go test binaries are built beforehand on a
# machine with Go (`make gpu-artifacts`) and carried in build/.
#
#   bash scripts/gpu_suite.sh [tests|bench|all]     (logs go to ${OUT:-/tmp/symmem-gpu})
#
# Every suite runs with SYMMEM_REQUIRE_GPU=1: a test that would skip for want
# of a GPU fails instead. NVLink multicast stays off everywhere.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-/tmp/symmem-gpu}
logs=$(mktemp -d /tmp/symmem-gpu-logs.XXXXXX)  # one log per step, one directory per run (runs may go side by side); joined into $out/suite.log at the end
mkdir -p "$out" "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMEM_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export SYMMEM_LIBRARY=$PWD/build/libsymmem.so
status=0
step() { # step NAME COMMAND...: runs a command, logs it, remembers failure
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  if "$@" >"$logs/$name.log" 2>&1; then echo "--- $name ok ($((SECONDS - t0)) s)"; else
    echo "--- $name FAILED ($((SECONDS - t0)) s); last lines:"; status=1; fi
  tail -n 25 "$logs/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -5
echo "libsymmem links: $(ldd build/libsymmem.so | awk '{print $1}' | tr '\n' ' ')"
if ldd build/libsymmem.so | grep -Eq 'libcuda|libcudart'; then echo "FAIL: libsymmem links CUDA"; status=1; fi
# The Python package's call module, for this machine's Python (gcc and
# Python's headers; without them the package uses ctypes, and says so here).
python3 buildsys/symmem_build.py calls python/symmem
for m in python/symmem/_calls*.so; do
  [ -f "$m" ] || continue
  if ldd "$m" | grep -Eq 'libcuda|libcudart|libsymmem'; then echo "FAIL: $m links CUDA or libsymmem"; status=1; fi
done
# The operators' C++ kernels, for this machine's torch (Note [Operators in
# C++] in python/symmem/torch.py); test_torch_ops.py fails without them.
if python3 -c "import torch" >/dev/null 2>&1; then
  PYTHONPATH=python python3 -m symmem build-torch-ops | tail -n 1 || status=1
fi

# PARTS chooses parts of the tests (to split a run between calls): any of
# abi go c demo python; every part by default.
parts=" ${PARTS:-abi go c demo python} "
has() { case "$parts" in *" $1 "*) return 0 ;; esac; return 1; }
if [ "$what" = tests ] || [ "$what" = all ]; then
  has abi && step abi bash cuda/abicheck/run.sh
  # Each Go test binary runs in its package's folder, as go test would run it
  # (build/gotests/core_host.test is the package core/host). The race
  # detector leaves a process about 2 TiB of address space for mappings,
  # and a heap's default range is twice its device's memory (the host
  # backend's device is the machine's RAM: 1 TiB on a 512 GiB machine), so
  # the binaries run with 64 GiB ranges (SYMMEM_HEAP_RESERVE); a heap that
  # needs more takes another range.
  for t in build/gotests/*.test; do
    has go || break
    [ -x "$t" ] || continue
    n=$(basename "$t" .test)
    step "go-$n" env SYMMEM_HEAP_RESERVE=64G bash -c "cd ${n//_//} && $PWD/$t -test.count=1 -test.timeout=300s"
  done
  mkdir -p build/tests-gpu
  ctests_ok=1
  has c || CTESTS=" "
  for src in ${CTESTS:-tests/c/test_*.c}; do
    n=$(basename "$src" .c)
    gcc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -fsanitize=address -fno-omit-frame-pointer -Iinclude \
      -o "build/tests-gpu/$n" "$src" -Lbuild -lsymmem -Wl,-rpath,"$PWD/build" -pthread || ctests_ok=0
  done
  [ $ctests_ok = 1 ] || { echo "C tests failed to build"; status=1; }
  for t in build/tests-gpu/test_*; do
    has c || break
    step "c-$(basename "$t")" bash -c "[ -f tests/c/env.sh ] && . tests/c/env.sh; $t"
  done
  has demo && gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o build/demo-gpu examples/demo.c \
    -Lbuild -lsymmem -Wl,-rpath,"$PWD/build" && {
    step demo-2 build/demo-gpu 2
    step demo-4 build/demo-gpu 4
  }
  has python && step python python3 -m pytest -q -ra -p no:cacheprovider --timeout 240 ${PYTEST_ARGS:-python/tests}
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o build/bench_alloc-gpu bench/bench_alloc.c \
    -Lbuild -lsymmem -Wl,-rpath,"$PWD/build" && step bench-alloc-host env SYMMEM_BACKEND=host build/bench_alloc-gpu
  step bench-symm-host python3 bench/symm_bench.py --host --ranks 2 4 8 --out "$out"
  # RMM's torch allocator, from the wheels carried in .whl/ (no network).
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  # The Go free-list floor (bench/gofloor), built by make gpu-artifacts.
  [ -f build/libgofloor.so ] && export GOFLOOR_SO=$PWD/build/libgofloor.so
  step bench-torch-alloc python3 bench/torch_alloc_bench.py --reps ${BENCH_REPS:-3} --out "$out"
  step bench-decode python3 bench/decode_bench.py --reps ${BENCH_REPS:-3} --out "$out"
  step bench-pause python3 bench/pause_bench.py --workloads 4g-1,4g-1024 --rounds ${BENCH_REPS:-1} --out "$out"
  step bench-pause-model python3 bench/pause_bench.py --workloads model --model-gib 24 --rounds 1 --impls symmem,tms-preload --out "$out"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    nvcc -O2 -arch=sm_90 -o build/stream_signal_bench bench/stream_signal_bench.cu -lcuda &&
      step bench-stream-signals build/stream_signal_bench
  fi
  # NCCL all_reduce on plain / libsymmem / windowed libsymmem / torch NCCL
  # symmetric tensors, and rendezvous over an NCCL group vs the socket group
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step bench-nccl python3 bench/nccl_bench.py --gpus 2 --out "$out"
  fi
  # SYMMEM_TRACE=1: each rank prints the phases of every rendezvous (in the log)
  step bench-symm env SYMMEM_TRACE=1 python3 bench/symm_bench.py --reps ${BENCH_REPS:-3} --out "$out"
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step bench-coll python3 bench/coll_bench.py --world 2 --out "$out"
    step bench-a2a python3 bench/a2a_bench.py --world 2 --out "$out"
    step bench-tp python3 bench/tp_bench.py --world 2 --out "$out"
    step bench-ce python3 bench/ce_bench.py --out "$out"
  fi
fi
for f in "$logs"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$out/suite.log"
echo "suite status: $status"
exit $status
