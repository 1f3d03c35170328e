#!/usr/bin/env bash
# The GPU runs at a world size of N GPUs, in parts of under ten minutes
# each, on a machine with that many GPUs, CUDA and PyTorch but no Go: the
# library is built beforehand (`make build`) and carried in build/; the Go
# test binaries of `make gpu-artifacts` too where the "suite" part runs them
# (as build/gotests/, or packed as build/gotests.tar.xz, which is unpacked).
# Nothing is compiled on the device but the C tests, the demo, Python's
# call module and the operators' C++ kernels.
#
#   bash scripts/gpu_world.sh N PART     N: 1, 2, 4 or 8; PART: one of
#     suite     the Go, C, ABI and demo parts of scripts/gpu_suite.sh, and
#               examples/demo.c at N ranks
#     python1   the first half of the Python test files (SYMMEM_REQUIRE_GPU=1)
#     python2   the second half
#     bench     coll_bench, a2a_bench and tp_bench at --world N,
#               symm_bench at --ranks N
#     machines  two imitated machines of N/2 GPUs each on real NCCL:
#               examples/torchrun_two_nodes.py as two torchrun commands
#               (two-nodes alone) and multihost_bench --imitate 2xN/2
#               (multihost alone)
#
# Everything goes under ${OUT:-/tmp/symmem-world}: one log per step, packed
# into logs.tgz at the end (a few files come back from a device run more
# easily than many), and the benchmarks' JSON and plots. NVLink multicast
# stays off everywhere.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: gpu_world.sh N PART}
part=${2:?usage: gpu_world.sh N PART}
out=${OUT:-/tmp/symmem-world}
logs=$out/logs
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMEM_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export SYMMEM_LIBRARY=$PWD/build/libsymmem.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -lt "$n" ]; then
  echo "gpu_world.sh: $n GPUs asked, this machine has $gpus"
  exit 2
fi
status=0
step() { # step NAME SECONDS COMMAND...: runs a command under a time limit and logs it
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  if timeout "$limit" "$@" >"$logs/$name.log" 2>&1; then echo "--- $name ok ($((SECONDS - t0)) s)"; else
    echo "--- $name FAILED or out of time ($((SECONDS - t0)) s of $limit); last lines:"
    tail -n 15 "$logs/$name.log"
    status=1
  fi
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c
# The call module, once: parts may run side by side, and none rebuilds it
# while another has it loaded.
ls python/symmem/_calls*.so >/dev/null 2>&1 || python3 buildsys/symmem_build.py calls python/symmem >/dev/null 2>&1
PYTHONPATH=python python3 -m symmem build-torch-ops >/dev/null 2>&1 || echo "the operators' C++ kernels did not build"
python_half() { # python_half 0|1: every other test file, so both halves hold GPU files
  ls python/tests/test_*.py | awk -v h="$1" 'NR % 2 == h'
}

case $part in
suite)
  if [ -f build/gotests.tar.xz ] && [ ! -d build/gotests ]; then tar -C build -xJf build/gotests.tar.xz; fi
  OUT=$out PARTS="abi go c demo" step suite 560 bash scripts/gpu_suite.sh tests
  grep -E -- '^---' "$logs/suite.log"
  gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude -o build/demo-world examples/demo.c \
    -Lbuild -lsymmem -Wl,-rpath,"$PWD/build" && step "demo-$n" 60 build/demo-world "$n"
  ;;
python1 | python2)
  h=$([ "$part" = python1 ] && echo 1 || echo 0)
  OUT=$out PARTS=python PYTEST_ARGS="$(python_half "$h" | tr '\n' ' ')" step "$part" 570 bash scripts/gpu_suite.sh tests
  tail -n 5 "$logs/$part.log"
  ;;
bench)
  step "coll-$n" 180 python3 bench/coll_bench.py --world "$n" --out "$out/coll-$n"
  step "a2a-$n" 120 python3 bench/a2a_bench.py --world "$n" --out "$out/a2a-$n"
  step "tp-$n" 90 python3 bench/tp_bench.py --world "$n" --out "$out/tp-$n"
  step "symm-$n" 120 python3 bench/symm_bench.py --ranks "$n" --reps 1 --out "$out/symm-$n"
  grep -h -E '^(GOAL|EAGER|BW)' "$logs"/*.log | grep -c . | xargs echo "goal lines:"
  grep -h -E '^(GOAL|EAGER)' "$logs"/*.log | grep -c MISSED | xargs echo "missed:"
  ;;
machines | two-nodes | multihost)
  half=$((n / 2))
  if [ "$part" != multihost ]; then
  # Two imitated nodes as two torchrun commands: each its machine identity,
  # socket directory, NCCL host id and half of the GPUs; NCCL's P2P and SHM
  # stay on.
  first=$(seq -s, 0 $((half - 1)))
  second=$(seq -s, "$half" $((n - 1)))
  port=$((29500 + $$ % 400))
  # Socket directories must be private (mode 0700), or the library refuses them.
  mkdir -p -m 700 /tmp/symmem-node-a /tmp/symmem-node-b && chmod 700 /tmp/symmem-node-a /tmp/symmem-node-b
  cat >"$logs/two_nodes.sh" <<EOF_NODES
node() { # node RANK ID GPUS
  CUDA_VISIBLE_DEVICES=\$3 SYMMEM_MACHINE_ID=\$2 SYMMEM_SOCKET_DIR=/tmp/symmem-node-\$2 NCCL_HOSTID=\$2 \\
    torchrun --nnodes 2 --nproc-per-node $half --node-rank \$1 --rdzv-backend c10d \\
    --rdzv-endpoint 127.0.0.1:$port examples/torchrun_two_nodes.py
}
node 0 a $first & a=\$!
node 1 b $second & b=\$!
wait \$a; ra=\$?
wait \$b; rb=\$?
[ \$ra = 0 ] && [ \$rb = 0 ]
EOF_NODES
  step "torchrun-2x$half" 180 bash "$logs/two_nodes.sh"
  tail -n "$n" "$logs/torchrun-2x$half.log"
  fi
  # The bench last: its defaults are meant to finish within 8 minutes.
  [ "$part" = two-nodes ] || step "multihost-2x$half" 480 python3 bench/multihost_bench.py --imitate "2x$half" --out "$out/multihost-2x$half"
  [ "$part" = two-nodes ] || tail -n 30 "$logs/multihost-2x$half.log"
  ;;
*)
  echo "gpu_world.sh: no part $part (suite, python1, python2, bench, machines, two-nodes, multihost)"
  exit 2
  ;;
esac
tar -C "$logs" -czf "$out/logs.tgz" .
echo "gpu_world.sh $n $part: status $status"
exit $status
