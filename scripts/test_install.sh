#!/bin/sh
# make install into a scratch prefix, then build programs the ways users do:
# with pkg-config, with CMake's find_package (when cmake is installed), and
# run the installed symmem-info. Then make uninstall leaves nothing behind.
set -eu
# Under `make test` this script runs below make but without its jobserver's
# descriptors: the inner makes would warn "jobserver unavailable".
unset MAKEFLAGS MFLAGS
root=$(pwd)
pre=$root/build/install-test
rm -rf "$pre"
make --no-print-directory install PREFIX="$pre"
for l in libsymmem.so libsymmem.so.0; do
  [ -L "$pre/lib/$l" ] || { echo "FAIL: $pre/lib/$l is not a symbolic link"; exit 1; }
done
soname=$(readelf -d "$pre/lib/libsymmem.so.0" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libsymmem.so.0 ] || { echo "FAIL: SONAME is '$soname'"; exit 1; }
echo "SONAME $soname, links: ok"

cp tests/cmake/app.c "$pre/app.c"
PKG_CONFIG_PATH=$pre/lib/pkgconfig
export PKG_CONFIG_PATH
[ "$(pkg-config --modversion symmem)" = "$(cat VERSION)" ] || { echo "FAIL: pkg-config version"; exit 1; }
cc "$pre/app.c" $(pkg-config --cflags --libs symmem) -Wl,-rpath,"$pre/lib" -o "$pre/app"
SYMMEM_BACKEND=host "$pre/app"
readelf -d "$pre/app" | grep -q 'NEEDED.*libsymmem.so.0' || { echo "FAIL: app does not need libsymmem.so.0"; exit 1; }
echo "install + pkg-config: ok"

if command -v cmake >/dev/null; then
  rm -rf "$pre/cmake-build"
  cmake -S tests/cmake -B "$pre/cmake-build" -DCMAKE_PREFIX_PATH="$pre" -DCMAKE_BUILD_RPATH="$pre/lib" >"$pre/cmake.log" 2>&1 \
    || { cat "$pre/cmake.log"; exit 1; }
  cmake --build "$pre/cmake-build" >>"$pre/cmake.log" 2>&1 || { cat "$pre/cmake.log"; exit 1; }
  SYMMEM_BACKEND=host "$pre/cmake-build/app"
  echo "install + CMake find_package(symmem): ok"
else
  echo "cmake not installed: the CMake check did not run (apt-get install cmake)"
  exit 1
fi

out=$(SYMMEM_BACKEND=host "$pre/bin/symmem-info")
echo "$out" | tail -4
echo "$out" | grep -q '"version": "'"$(cat VERSION)"'"' || { echo "FAIL: symmem-info shows no version"; exit 1; }
echo "$out" | grep -q '^self-test: PASS' || { echo "FAIL: symmem-info self-test"; exit 1; }
# --json is one JSON document and nothing else; --help works; a bad option is refused.
SYMMEM_BACKEND=host "$pre/bin/symmem-info" --json | python3 -c 'import json, sys; d = json.load(sys.stdin); assert d["version"], d' ||
  { echo "FAIL: symmem-info --json is not JSON alone"; exit 1; }
"$pre/bin/symmem-info" --help | grep -q '^usage: symmem-info' || { echo "FAIL: symmem-info --help"; exit 1; }
if "$pre/bin/symmem-info" --bogus 2>/dev/null; then echo "FAIL: symmem-info accepted --bogus"; exit 1; fi

make --no-print-directory uninstall PREFIX="$pre"
left=$(find "$pre" \( -type f -o -type l \) ! -path "$pre/app*" ! -path "$pre/cmake*" | head)
[ -z "$left" ] || { echo "FAIL: uninstall left $left"; exit 1; }
echo "uninstall: ok"
echo "1 passed, 0 failed"
