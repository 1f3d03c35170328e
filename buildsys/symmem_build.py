"""A PEP 517 build backend for `pip install .` at the repository root.

It needs nothing from PyPI: it builds libsymmem.so with Go
(`go build -buildmode=c-shared`, which also needs a C compiler for cgo) and
writes a platform wheel holding the `symmem` package with
`symmem/libsymmem.so` inside, and the call module `symmem/_calls*.so` (a
small CPython extension, Note [The call module] in python/symmem/_lib.py)
where it builds: tagged cpXY-cpXY-<platform> with it, py3-none-<platform>
without (the library is loaded with ctypes, so any Python 3 can use it);
and where torch imports in the build's Python, the operators' C++ kernels
built against it (see _build_torch_ops). The version comes from the
VERSION file.

Hooks: build_wheel, build_editable (`pip install -e .`), build_sdist,
get_requires_for_build_wheel/editable/sdist. pip calls them with the
repository root as the working directory.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "symmem"
SUMMARY = "A caching GPU allocator for PyTorch and symmetric memory across processes (libsymmem)"


class BuildError(RuntimeError):
    pass


def _version() -> str:
    return (ROOT / "VERSION").read_text().strip()


def _go_min_version() -> tuple:
    m = re.search(r"^go (\d+)\.(\d+)", (ROOT / "go.mod").read_text(), re.M)
    return (int(m.group(1)), int(m.group(2))) if m else (1, 21)


def _ways_out(need: tuple, have: tuple = None) -> str:
    """The README's ways to a new enough Go (its Install section), for the
    errors below; have is the Go found (None: none)."""
    n = f"{need[0]}.{need[1]}"
    tarball = "take Go's official tarball for your platform from https://go.dev/dl/ and put its bin on PATH"
    if have is None:
        return (f"{tarball[0].upper()}{tarball[1:]} (distribution packages are often older), or set GO to a "
                f"Go binary; with any Go from 1.21 on, GOTOOLCHAIN=auto fetches Go {n} itself.")
    if have < (1, 21):
        return (f"{tarball[0].upper()}{tarball[1:]}, or set GO to a newer Go (Go before 1.21 cannot fetch "
                f"Go {n} itself with GOTOOLCHAIN=auto).")
    return f"Build again with GOTOOLCHAIN=auto (this Go then fetches Go {n} itself), or {tarball}."


def _check_toolchain() -> str:
    go = os.environ.get("GO", "go")
    need = _go_min_version()
    where = shutil.which(go)
    if where is None:
        raise BuildError(
            f"building symmem needs Go >= {need[0]}.{need[1]} (to build libsymmem.so) and a C compiler, "
            f"but '{go}' is not on PATH. {_ways_out(need)} (README.md, Install)"
        )
    # In the module's folder, so that GOTOOLCHAIN=auto reports the Go it
    # would switch to for go.mod.
    out = subprocess.run([where, "env", "GOVERSION"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < need:
        have = (int(m.group(1)), int(m.group(2))) if m else None
        raise BuildError(
            f"building symmem needs Go >= {need[0]}.{need[1]}, but {where} is {out or 'of unknown version'}. "
            f"{_ways_out(need, have or (0, 0))} (README.md, Install)"
        )
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc.split()[0]) is None:
        raise BuildError(f"building symmem needs a C compiler for cgo, but '{cc}' is not on PATH (install gcc, or set CC)")
    return where


def main(argv: list) -> int:
    """`python3 buildsys/symmem_build.py check-toolchain`: the Makefile's
    first step, so that `make` and `pip install .` say the same thing.
    `symmem_build.py calls DIR`: the call module into DIR, as a wheel
    builds it (the Makefile's; a module that cannot be built is a note)."""
    if len(argv) == 3 and argv[1] == "calls":
        _build_calls(Path(argv[2]))
        return 0
    if argv[1:] != ["check-toolchain"]:
        print("usage: symmem_build.py check-toolchain | calls DIR", file=sys.stderr)
        return 2
    try:
        _check_toolchain()
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _build_library(out_dir: Path) -> Path:
    go = _check_toolchain()
    major = _version().split(".")[0]
    out = out_dir / "libsymmem.so"
    ldflags = (
        f"-s -w -extldflags '-Wl,--version-script={ROOT}/export/symmem.map "
        f"-Wl,-soname,libsymmem.so.{major}'"
    )
    cmd = [go, "build", "-buildmode=c-shared", "-trimpath", "-ldflags", ldflags, "-o", str(out), "./export"]
    print("symmem: building libsymmem.so:", " ".join(cmd), flush=True)
    env = dict(os.environ, CGO_ENABLED="1")
    p = subprocess.run(cmd, cwd=ROOT, env=env)
    if p.returncode != 0:
        raise BuildError(f"go build failed (exit {p.returncode}); its messages are above")
    (out_dir / "libsymmem.h").unlink(missing_ok=True)
    return out


# The call module (python/symmem/_calls.c; Note [The call module] in
# python/symmem/_lib.py): a CPython extension for the per-call functions,
# built for the Python that runs the build where it has its headers and a C
# compiler is found; without it the package calls the library through
# ctypes, so a failure here is a note, not an error. It links neither
# libsymmem nor CUDA.
CALLS_SOURCE = ROOT / "python" / NAME / "_calls.c"


def calls_command(out: Path) -> list:
    """The compiler command that builds the call module at out (also the
    Makefile's, through `symmem_build.py calls-command OUT`)."""
    cc = os.environ.get("CC", "cc").split()
    include = sysconfig.get_paths()["include"]
    return cc + ["-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                 "-o", str(out), str(CALLS_SOURCE)]


def calls_filename() -> str:
    return "_calls" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def _build_calls(out_dir: Path):
    """Builds the call module into out_dir; returns its path, or None (and
    says why) where it cannot be built."""
    if sys.implementation.name != "cpython":
        print("symmem: the call module is for CPython: the package will call libsymmem through ctypes", flush=True)
        return None
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        print(f"symmem: no Python.h in {include}: the package will call libsymmem through ctypes", flush=True)
        return None
    out = out_dir / calls_filename()
    cmd = calls_command(out)
    print("symmem: building the call module:", " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, cwd=ROOT)
    except OSError as exc:
        print(f"symmem: cannot run the C compiler ({exc}): the package will call libsymmem through ctypes", flush=True)
        return None
    if p.returncode != 0:
        print(f"symmem: the call module did not build (exit {p.returncode}): the package will call libsymmem "
              "through ctypes", flush=True)
        return None
    return out


# The collectives' operators' C++ kernels (python/symmem/_torch_ops.cpp;
# Note [Operators in C++] in python/symmem/torch.py), built against the torch
# that the build's Python imports (`pip install --no-build-isolation .` in an
# environment with torch) and carried in the package, so that where it is
# installed no compiler is needed. The module's name carries the torch it
# was built for: another torch finds none and runs the Python kernels, or
# builds its own with `python -m symmem build-torch-ops`. The config setting
# torch-ops (`pip install . --config-settings torch-ops=VALUE`) says whether:
# auto (the default: where torch imports, a failure being a note), require
# (a failure fails the build) or skip.
TORCH_OPS_SETTINGS = ("auto", "require", "skip")
TORCH_OPS_COMPILE = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("symmem_torch_ops", sys.argv[1])
ops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ops)
import torch
dest = Path(sys.argv[2]) / ops.filename(torch)
try:
    ops.compile_into(torch, dest)
except RuntimeError as exc:
    sys.exit(str(exc))
print(dest)
"""


def _torch_ops_setting(config_settings) -> str:
    value = (config_settings or {}).get("torch-ops", "auto")
    if value not in TORCH_OPS_SETTINGS:
        raise BuildError(f"config setting torch-ops={value!r}: one of {', '.join(TORCH_OPS_SETTINGS)}")
    return value


def _build_torch_ops(out_dir: Path, setting: str):
    """Builds the operators' C++ kernels into out_dir for the torch that
    this Python imports; returns the module's path, or None (and says why)
    where there is none."""
    if setting == "skip":
        return None
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        if setting == "require":
            raise BuildError(f"torch-ops=require: torch does not import in the build's Python ({why}); "
                             "pip install --no-build-isolation builds in the environment's own Python")
        print(f"symmem: torch does not import in the build's Python ({why}): the operators' C++ kernels are "
              "not in the package (`python -m symmem build-torch-ops` builds them where torch is)", flush=True)
        return None
    p = subprocess.run([sys.executable, "-c", TORCH_OPS_COMPILE, str(ROOT / "python" / NAME / "_torch_ops.py"),
                        str(out_dir)], cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        why = p.stderr.strip()[-4000:]
        if setting == "require":
            raise BuildError(f"torch-ops=require: {why}")
        print(f"{why}\nsymmem: the package goes without the operators' C++ kernels; its operators run their "
              "Python kernels", flush=True)
        return None
    return Path(p.stdout.strip().splitlines()[-1])


def _python_tag() -> str:
    """This interpreter's wheel tag (cp311), for a wheel holding the call module."""
    return f"cp{sys.version_info[0]}{sys.version_info[1]}"


def _platform_tag() -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


def _metadata() -> str:
    readme = (ROOT / "python" / "README.md").read_text() if (ROOT / "python" / "README.md").exists() else ""
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {_version()}\n"
        f"Summary: {SUMMARY}\n"
        "License: BSD-3-Clause\n"
        "Requires-Python: >=3.8\n"
        "Provides-Extra: torch\n"
        'Requires-Dist: torch>=2.5; extra == "torch"\n'
        "Description-Content-Type: text/markdown\n"
        "\n" + readme
    )


# The entry points of pyproject.toml's [project.entry-points.*] tables
# (python/tests/test_compat.py checks that they agree).
ENTRY_POINTS = "[vllm.general_plugins]\nsymmem = symmem.compat.vllm:register\n"


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files, python_tag: str = "py3-none") -> str:
    """Writes the wheel of files [(arcname, bytes)] with its dist-info;
    python_tag: py3-none, or cpXY-cpXY when it holds the call module."""
    version = _version()
    tag = f"{python_tag}-{_platform_tag()}"
    wheel_name = f"{NAME}-{version}-{tag}.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    files = list(files)
    files.append((f"{dist_info}/METADATA", _metadata().encode()))
    files.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: symmem_build\nRoot-Is-Purelib: false\n" f"Tag: {tag}\n").encode()))
    files.append((f"{dist_info}/LICENSE", (ROOT / "LICENSE").read_bytes()))
    files.append((f"{dist_info}/entry_points.txt", ENTRY_POINTS.encode()))
    record = [_record_line(a, d) for a, d in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
            mode = 0o755 if arcname.endswith(".so") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []  # (arcname, bytes)
    pkg = ROOT / "python" / NAME
    for path in sorted(pkg.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".pyc", ".so"):
            continue
        files.append((f"{NAME}/{path.relative_to(pkg).as_posix()}", path.read_bytes()))
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build_library(Path(tmp))
        files.append((f"{NAME}/libsymmem.so", lib.read_bytes()))
        ext = _build_calls(Path(tmp))
        if ext is not None:
            files.append((f"{NAME}/{ext.name}", ext.read_bytes()))
        ops = _build_torch_ops(Path(tmp), _torch_ops_setting(config_settings))
        if ops is not None:
            files.append((f"{NAME}/{ops.name}", ops.read_bytes()))
    python_tag = "py3-none" if ext is None else f"{_python_tag()}-{_python_tag()}"
    return _write_wheel(wheel_directory, files, python_tag)


# `pip install -e .` (PEP 660): the wheel holds one .pth file that puts the
# checkout's python/ on sys.path, so the package runs from the checkout and
# finds the library in build/ (the last place python/symmem/_lib.py tries,
# in a checkout). The library is built there by this hook, as `make` builds
# it; after a change to the Go code, `make` rebuilds it.
EDITABLE_PTH = f"{NAME}_editable.pth"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build = ROOT / "build"
    build.mkdir(exist_ok=True)
    _build_library(build)
    _build_calls(ROOT / "python" / NAME)
    _build_torch_ops(ROOT / "python" / NAME, _torch_ops_setting(config_settings))
    return _write_wheel(wheel_directory, [(EDITABLE_PTH, (str(ROOT / "python") + "\n").encode())])


def _sdist_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and not any(x in p.parts for x in (".git", "build", "dist", "__pycache__"))]
    return [n for n in names if (ROOT / n).is_file()]


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for n in _sdist_files():
            tar.add(str(ROOT / n), arcname=f"{base}/{n}")
        data = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


if __name__ == "__main__":
    sys.exit(main(sys.argv))
