#!/bin/sh
# Builds abi_check.c against the real cuda.h and runs it: checks that
# cuda/driver.h matches the CUDA headers and that the installed driver
# exports every versioned symbol the backend resolves. Exit status 0 means
# everything matched.
#
# The include directory is, in order: $CUDA_INCLUDE, $CUDA_HOME/include,
# $CUDA_PATH/include, the include directory next to the nvcc on PATH,
# /usr/local/cuda/include, /usr/include, and the copies of cuda.h that pip
# wheels carry (nvidia-cuda-runtime, triton). Set ABI_CHECK_NO_DRIVER=1 to
# skip the driver part on a machine without libcuda.so.1.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-gcc}

find_include() {
	for dir in "${CUDA_INCLUDE:-}" \
		"${CUDA_HOME:+$CUDA_HOME/include}" \
		"${CUDA_PATH:+$CUDA_PATH/include}"; do
		if [ -n "$dir" ] && [ -f "$dir/cuda.h" ]; then
			echo "$dir"
			return
		fi
	done
	if nvcc=$(command -v nvcc 2>/dev/null); then
		dir=$(dirname "$(dirname "$(readlink -f "$nvcc")")")/include
		if [ -f "$dir/cuda.h" ]; then
			echo "$dir"
			return
		fi
	fi
	for dir in /usr/local/cuda/include /usr/include; do
		if [ -f "$dir/cuda.h" ]; then
			echo "$dir"
			return
		fi
	done
	if command -v python3 >/dev/null 2>&1; then
		python3 - <<'EOF'
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for pat in ("nvidia/cuda_runtime/include/cuda.h", "nvidia/cu*/include/cuda.h",
                "triton/backends/nvidia/include/cuda.h"):
        hits = sorted(glob.glob(f"{root}/{pat}"))
        if hits:
            print(hits[-1].rsplit("/", 1)[0])
            sys.exit(0)
EOF
	fi
}

inc=$(find_include)
if [ -z "$inc" ]; then
	echo "run.sh: no cuda.h found; set CUDA_INCLUDE to the directory that holds it" >&2
	exit 2
fi
echo "cuda.h: $inc/cuda.h"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$cc" -std=gnu11 -Wall -Wextra -Werror -I"$inc" -I"$here/.." \
	-o "$out/abi_check" "$here/abi_check.c" -ldl
"$out/abi_check"
