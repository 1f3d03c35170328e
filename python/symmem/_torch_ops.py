"""The collectives' operators' kernels in C++ (symmem/_torch_ops.cpp; Note
[Operators in C++] in symmem/torch.py): where the file lives, how
`python -m symmem build-torch-ops` builds it against the installed torch,
and whether symmem.torch loads it.

The module is built for one torch: its file name carries torch's version,
the C++ ABI flag and the source's hash, so a torch upgraded or a source
changed finds no file and symmem.torch runs the Python kernels, as it does
where the module was never built. It is looked for in the package first
(where `pip install --no-build-isolation .` put it, built against the
torch of the install's environment), then in directory(), where the command
puts it. Nothing here compiles at import: only the command and the
package's build do.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

SOURCE = Path(__file__).resolve().with_name("_torch_ops.cpp")


def directory() -> Path:
    """Where the built modules live: $SYMMEM_TORCH_OPS_DIR, else
    symmem/torch-ops in $XDG_CACHE_HOME (~/.cache)."""
    d = os.environ.get("SYMMEM_TORCH_OPS_DIR")
    if d:
        return Path(d).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "symmem" / "torch-ops"


def filename(torch) -> str:
    """The module's file name for this torch and this source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    version = re.sub(r"[^A-Za-z0-9.]", "_", torch.__version__)
    return f"_torch_ops-torch{version}-abi{_abi(torch)}-{digest}.so"


def _abi(torch) -> int:
    """torch's C++ ABI flag (_GLIBCXX_USE_CXX11_ABI)."""
    return int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))


def packaged(torch) -> Path:
    """Where a wheel holds the module: beside this file."""
    return SOURCE.with_name(filename(torch))


def path(torch) -> Path:
    """The module for this torch: the package's copy where there is one,
    else directory()'s (which may not exist yet)."""
    p = packaged(torch)
    return p if p.exists() else directory() / filename(torch)


def enabled() -> bool:
    """SYMMEM_TORCH_OPS=0 keeps the Python kernels."""
    from .errors import env_bool

    return env_bool("SYMMEM_TORCH_OPS", True)


def cuda_include(torch) -> Optional[str]:
    """A directory with CUDA's runtime headers (c10/cuda's headers include
    them): $CUDA_HOME's, /usr/local/cuda's, or the copy that torch's wheels
    bring along (triton's); None where none is found or torch has no CUDA."""
    if getattr(torch.version, "cuda", None) is None:
        return None
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    cands = [os.path.join(r, "include") for r in roots if r]
    try:
        import triton  # noqa: F401 (where its headers are)

        cands.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include"))
    except Exception:  # no triton: the toolkit's headers or none
        pass
    for c in cands:
        if os.path.exists(os.path.join(c, "cuda_runtime_api.h")) and os.path.exists(
                os.path.join(c, "crt", "host_defines.h")):
            return c
    return None


def command(torch, out: Path) -> List[str]:
    """The compiler command that builds the module at out."""
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "c++").split()
    cmd = cxx + ["-shared", "-fPIC", "-O2", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={_abi(torch)}", "-Wall", "-Wextra",
                 "-Wno-unused-parameter"]
    cmd += [f"-isystem{p}" for p in cpp_extension.include_paths()]
    libs = ["-lc10", "-ltorch_cpu"]
    inc = cuda_include(torch)
    if inc is not None:
        cmd += ["-DSYMMEM_TORCH_OPS_CUDA", f"-isystem{inc}"]
        libs.append("-lc10_cuda")
    libdir = cpp_extension.library_paths()[0]
    return cmd + [str(SOURCE), "-o", str(out), f"-L{libdir}"] + libs + [f"-Wl,-rpath,{libdir}"]


def build(quiet: bool = False) -> Path:
    """Builds the module for the installed torch (if it is not built
    already) and returns its path; raises RuntimeError saying why it could
    not."""
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(f"symmem: build-torch-ops needs PyTorch ({exc})") from exc
    dest = path(torch)
    if dest.exists():
        return dest
    compile_into(torch, dest, quiet)
    return dest


def compile_into(torch, dest: Path, quiet: bool = False) -> None:
    """Compiles the module for torch at dest (the package's build calls
    this too); raises RuntimeError saying why it could not."""
    cxx = os.environ.get("CXX", "c++").split()[0]
    if shutil.which(cxx) is None:
        raise RuntimeError(f"symmem: build-torch-ops needs a C++ compiler ({cxx!r} is not found; set CXX)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its place and renamed into it: a process that looks
    # meanwhile finds no file or the whole file.
    fd, tmp = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=dest.parent)
    os.close(fd)
    try:
        cmd = command(torch, Path(tmp))
        if not quiet:
            print("symmem: building the operators' C++ kernels:", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"symmem: the operators' C++ kernels did not build (exit {p.returncode}):\n"
                               + p.stderr[-4000:])
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: List[str]) -> int:
    """python -m symmem build-torch-ops [--print-path]: builds the module
    (or finds it built) and says where; --print-path only says where."""
    unknown = [a for a in argv if a != "--print-path"]
    if unknown:
        print(f"python -m symmem build-torch-ops: unknown argument {unknown[0]!r} (usage: "
              "python -m symmem build-torch-ops [--print-path])", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as exc:
        print(f"symmem: build-torch-ops needs PyTorch ({exc})", file=sys.stderr)
        return 1
    if "--print-path" in argv:
        print(path(torch))
        return 0
    try:
        p = build()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"symmem: the operators' C++ kernels for torch {torch.__version__}: {p}")
    return 0
