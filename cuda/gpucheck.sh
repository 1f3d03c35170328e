#!/bin/sh
# Runs every check of the cuda backend on a GPU machine, from the repository
# root or anywhere: the ABI check of driver.h against the real cuda.h and
# driver, then the package tests with a GPU required (the real driver in
# process, testdata/fakecuda.c in child processes), then again with -race.
# Needs gcc, Go and the CUDA headers (see abicheck/run.sh); exits non-zero on
# the first failure.
set -eu
cd "$(dirname "$0")/.."

if command -v nvidia-smi >/dev/null 2>&1; then
	nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv
fi
echo "== ABI check"
cuda/abicheck/run.sh
echo "== go test (SYMMEM_REQUIRE_GPU=1)"
SYMMEM_REQUIRE_GPU=1 go test -count=1 -v ./cuda/
echo "== go test -race"
SYMMEM_REQUIRE_GPU=1 go test -count=1 -race ./cuda/
echo "== all cuda backend checks passed"
