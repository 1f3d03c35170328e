#!/bin/sh
# A user's first minutes with pip: in a fresh virtual environment,
# `pip install .` at the repository root (offline: the build backend needs
# nothing from PyPI), then from another directory `import symmem;
# symmem.alloc(64)` with no SYMMEM_LIBRARY: the package's own copy is used.
# Then the lookup order: without the package's copy the system loader's path
# (LD_LIBRARY_PATH here, the ld.so cache after make install) is used, and when
# nothing is found the error lists every place tried.
set -eu
root=$(pwd)
t=$root/build/wheel-test
rm -rf "$t"
mkdir -p "$t/elsewhere"
unset SYMMEM_LIBRARY || true
python3 -m venv --without-pip "$t/venv"
py=$t/venv/bin/python
python3 -m pip --python "$py" install -q --no-index --no-build-isolation --no-deps "$root"
cd "$t/elsewhere"
"$py" - <<'PY'
import os, symmem
p = symmem.alloc(64)
assert p, p
symmem.free(p)
lib = symmem.library_path()
pkg = os.path.dirname(symmem.__file__)
assert lib == os.path.join(pkg, "libsymmem.so"), (lib, pkg)
assert "site-packages" in pkg, pkg
assert os.path.exists(os.path.join(pkg, "py.typed"))
print("fresh venv: import symmem; symmem.alloc(64) ok, library", lib)
PY
"$py" -m symmem --no-self-test > "$t/info.txt"
head -3 "$t/info.txt"
# The wheel's tag is a platform tag, not py3-none-any: this Python's
# (cpXY-cpXY) when the call module was built into it, as it is where
# Python's headers are (here), and then the package calls through it.
"$py" - <<'PY'
import glob, os, sys, sysconfig, symmem
from symmem import _lib
d = glob.glob(os.path.join(os.path.dirname(os.path.dirname(symmem.__file__)), "symmem-*.dist-info"))[0]
wheel = open(os.path.join(d, "WHEEL")).read()
headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
cp = "cp%d%d" % sys.version_info[:2]
tag = f"Tag: {cp}-{cp}-linux_" if headers else "Tag: py3-none-linux_"
assert "Root-Is-Purelib: false" in wheel and tag in wheel, (tag, wheel)
assert _lib.calls().extension is headers, _lib.calls_fallback_reason
print("wheel tag:", [l for l in wheel.splitlines() if l.startswith("Tag")][0],
      "; calls through", "symmem._calls" if headers else "ctypes")
PY
# The operators' C++ kernels go into the wheel where torch imports in the
# build's Python, and are loaded from the package (not from the command's
# directory, empty here). The venv above sees no torch: its package has none.
site=$("$py" -c "import symmem, os; print(os.path.dirname(symmem.__file__))")
if ls "$site"/_torch_ops-*.so >/dev/null 2>&1; then echo "a package built without torch holds the C++ kernels"; exit 1; fi
if python3 -c "import torch" >/dev/null 2>&1; then
  python3 -m venv --without-pip --system-site-packages "$t/venv-torch"
  python3 -m pip --python "$t/venv-torch/bin/python" install -q --no-index --no-build-isolation --no-deps "$root"
  mkdir -p "$t/no-ops"
  SYMMEM_TORCH_OPS_DIR=$t/no-ops SYMMEM_BACKEND=host "$t/venv-torch/bin/python" - <<'PY'
import os, torch
import symmem._torch_ops as ops
import symmem.torch as st
info = st.cpp_ops_info()
pkg = os.path.dirname(ops.__file__)
assert "site-packages" in pkg and info["loaded"] == os.path.join(pkg, ops.filename(torch)), (info, pkg)
assert not os.listdir(os.environ["SYMMEM_TORCH_OPS_DIR"])
print("pip install --no-build-isolation with torch", torch.__version__, ": the package's C++ kernels are loaded")
PY
else
  echo "skip: torch does not import here, so the wheel's C++ kernels are not checked"
fi
python3 -c "
import sys; sys.path.insert(0, '$root/buildsys'); import symmem_build as b
assert b._torch_ops_setting(None) == 'auto' and b._torch_ops_setting({'torch-ops': 'skip'}) == 'skip'
assert b._build_torch_ops(None, 'skip') is None
try:
    b._torch_ops_setting({'torch-ops': 'maybe'})
except b.BuildError as e:
    assert 'auto, require, skip' in str(e), e
else:
    raise SystemExit('torch-ops=maybe was taken')
print('config setting torch-ops: auto by default, the value that leaves them out builds nothing, others refused')"
# Without the package's copy: the system loader's path, then the error.
rm "$site/libsymmem.so"
LD_LIBRARY_PATH=$root/build "$py" -c "
import symmem
symmem.free(symmem.alloc(64))
assert symmem.library_path() == '$root/build/libsymmem.so.0', symmem.library_path()
print('system loader path: ok,', symmem.library_path())"
LD_LIBRARY_PATH= "$py" -c "
import symmem
try:
    symmem.alloc(64)
except symmem.LibraryNotFoundError as e:
    msg = str(e)
    assert '$site/libsymmem.so: no such file' in msg and 'libsymmem.so.0 (through the system loader' in msg, msg
    assert '$root/build/libsymmem.so' not in msg, msg  # an installed package names no source-tree folder
    print('no library anywhere: LibraryNotFoundError lists the %d places tried' % msg.count(chr(10) + '  '))
else:
    raise SystemExit('expected LibraryNotFoundError')"
# `pip install -e .`: the package runs from the checkout's python/ and the
# library is built into its build/. A copy of the tracked tree stands in for
# the checkout, so that the build/ that other suites load is left alone.
src=$t/editable-src
mkdir -p "$src"
cd "$root"
git ls-files -z | xargs -0 cp --parents -t "$src"
python3 -m venv --without-pip "$t/venv-e"
python3 -m pip --python "$t/venv-e/bin/python" install -q --no-index --no-build-isolation --no-deps -e "$src"
cd "$t/elsewhere"
"$t/venv-e/bin/python" - "$src" <<'PY'
import os, sys, symmem
src = sys.argv[1]
assert symmem.__file__ == os.path.join(src, "python", "symmem", "__init__.py"), symmem.__file__
assert symmem.library_path() == os.path.join(src, "build", "libsymmem.so"), symmem.library_path()
symmem.free(symmem.alloc(64))
print("pip install -e: the package from the checkout, the library from its build/")
PY
cd "$root"
# The build's own message when Go is missing or too old. The expected
# messages are checked here, not printed: printed, they read like failures
# in make test's output.
cd "$root"
printf '#!/bin/sh\necho go1.10\n' > "$t/oldgo"; chmod +x "$t/oldgo"
for go in /nonexistent/go "$t/oldgo"; do
  GO=$go python3 -c "
import sys; sys.path.insert(0, 'buildsys'); import symmem_build
try:
    symmem_build._check_toolchain()
except symmem_build.BuildError as e:
    assert 'needs Go >=' in str(e), e
    # the README's ways out, not a distribution's package manager
    assert 'GOTOOLCHAIN=auto' in str(e) and 'https://go.dev/dl/' in str(e), e
    assert 'package manager' not in str(e), e
    print('GO=$go: the toolchain check refuses it, naming the Go needed and the ways to get it')
else:
    raise SystemExit('expected BuildError for GO=$go')"
  # make checks first, with the same message (not go.mod's "invalid go version").
  out=$(MAKEFLAGS= make --no-print-directory GO=$go BUILD="$t/mk" "$t/mk/libsymmem.so.0" 2>&1) && { echo "make built with GO=$go"; exit 1; }
  # Only the check's own line is shown: make's "*** ... Error 1" after it is
  # expected here and must not read as a failure in make test's output.
  case $out in
    *"building symmem needs Go >="*) echo "GO=$go: make refuses it, saying which Go it needs" ;;
    *) echo "make with GO=$go did not say which Go it needs: $out"; exit 1 ;;
  esac
done
echo "1 passed, 0 failed"
