#!/usr/bin/env bash
# Writes the version in VERSION (the one source of truth, MAJOR.MINOR.PATCH)
# into every file that states it: include/symmem.h, core/version.go and
# python/symmem/_version.py. pkg-config, CMake and the wheel read VERSION
# when they are made. Run it after changing VERSION; TestVersionAgrees (go
# test ./core) fails while any file disagrees.
set -euo pipefail
cd "$(dirname "$0")/.."
v=$(tr -d ' \n' < VERSION)
IFS=. read -r major minor patch <<<"$v"
sed -i -E "s/^(#define SYMMEM_VERSION_MAJOR ).*/\1$major/; s/^(#define SYMMEM_VERSION_MINOR ).*/\1$minor/; s/^(#define SYMMEM_VERSION_PATCH ).*/\1$patch/" include/symmem.h
sed -i -E "s/^const Version = .*/const Version = $major*10000 + $minor*100 + $patch/; s/^const VersionString = .*/const VersionString = \"$v\"/" core/version.go
sed -i -E "s/^__version__ = .*/__version__ = \"$v\"/; s/^VERSION_MAJOR = .*/VERSION_MAJOR = $major/; s/^VERSION_MINOR = .*/VERSION_MINOR = $minor/; s/^VERSION_PATCH = .*/VERSION_PATCH = $patch/" python/symmem/_version.py
echo "version $v written to include/symmem.h, core/version.go, python/symmem/_version.py"
