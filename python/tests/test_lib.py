"""Loading the library: search order, prototypes against the header, and
importing without torch or numpy."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import symmem
from symmem.errors import quote
from symmem import _lib

from conftest import PYTHON_DIR, REPO_DIR

HEADER = REPO_DIR / "include" / "symmem.h"


def run_py(code: str, env_update=None, env_remove=(), cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for k in env_remove:
        env.pop(k, None)
    env.update(env_update or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def header_functions() -> set:
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return set(re.findall(r"\b(symmem_[a-z0-9_]+)\s*\(", text)) - {"symmem_allgather_fn"}


def test_every_header_function_has_a_prototype():
    assert header_functions() == set(_lib.PROTOTYPES)


def test_struct_sizes_match_the_c_compiler(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to check struct layouts with")
    src = tmp_path / "layout.c"
    src.write_text(
        textwrap.dedent(
            """
            #include <stdio.h>
            #include <stddef.h>
            #include "symmem.h"
            #define O(T, f) printf(#T "." #f " %zu\\n", offsetof(T, f))
            int main(void) {
              printf("symmem_stat %zu\\n", sizeof(symmem_stat));
              O(symmem_stat, key); O(symmem_stat, value);
              printf("symmem_pointer_info %zu\\n", sizeof(symmem_pointer_info));
              O(symmem_pointer_info, block); O(symmem_pointer_info, block_size);
              O(symmem_pointer_info, requested_size); O(symmem_pointer_info, offset);
              O(symmem_pointer_info, heap_offset); O(symmem_pointer_info, device);
              O(symmem_pointer_info, reserved_);
              return 0;
            }
            """
        )
    )
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", str(REPO_DIR / "include"), str(src), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines())
    want = {"symmem_stat": ctypes.sizeof(_lib.SymmemStat), "symmem_pointer_info": ctypes.sizeof(_lib.SymmemPointerInfo)}
    for cls, cname in ((_lib.SymmemStat, "symmem_stat"), (_lib.SymmemPointerInfo, "symmem_pointer_info")):
        for field, _ in cls._fields_:
            want[f"{cname}.{field}"] = getattr(cls, field).offset
    assert {k: int(v) for k, v in got.items()} == want


def test_version_matches_header():
    assert symmem.version() == symmem.HEADER_VERSION
    assert symmem.version_tuple() == (0, 1, 0)


def test_candidates_without_env(monkeypatch):
    monkeypatch.delenv("SYMMEM_LIBRARY", raising=False)
    c = _lib.candidates()
    # the package's copy, the system loader's name(s), the checkout's build folder
    assert c[0] == str(PYTHON_DIR / "symmem" / "libsymmem.so")
    assert c[1] == "libsymmem.so.0"
    assert c[-1] == str(REPO_DIR / "build" / "libsymmem.so")


def test_env_var_is_the_only_candidate(monkeypatch, tmp_path):
    monkeypatch.setenv("SYMMEM_LIBRARY", str(tmp_path / "x.so"))
    assert _lib.candidates() == [str(tmp_path / "x.so")]


def test_missing_library_lists_where_it_looked(tmp_path):
    missing = tmp_path / "nowhere" / "libsymmem.so"
    r = run_py(
        """
        import symmem
        try:
            symmem.version()
        except ImportError as e:
            print(type(e).__name__)
            print(e)
        """,
        {"SYMMEM_LIBRARY": str(missing)},
    )
    assert r.returncode == 0, r.stderr
    assert "LibraryNotFoundError" in r.stdout
    assert quote(str(missing)) in r.stdout  # cut at 64 characters when longer
    assert "SYMMEM_LIBRARY" in r.stdout


def test_env_var_wins_over_the_build_folder(tmp_path):
    copy = tmp_path / "libsymmem-copy.so"
    shutil.copy(symmem.library_path(), copy)
    r = run_py("import symmem; print(symmem.library_path()); print(symmem.version())", {"SYMMEM_LIBRARY": str(copy)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(copy), str(symmem.version())]


def test_package_copy_wins_over_the_build_folder(tmp_path):
    # A copy of the package with the library inside it, as a wheel ships it.
    pkg = tmp_path / "symmem"
    shutil.copytree(PYTHON_DIR / "symmem", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(symmem.library_path(), pkg / "libsymmem.so")
    r = run_py(
        "import symmem; print(symmem.__file__); print(symmem.library_path())",
        {"PYTHONPATH": str(tmp_path)},
        env_remove=("SYMMEM_LIBRARY",),
        cwd=str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(pkg / "__init__.py"), str(pkg / "libsymmem.so")]


def test_import_without_torch_or_numpy():
    r = run_py(
        """
        import sys
        sys.modules["torch"] = None      # import torch now raises ImportError
        sys.modules["numpy"] = None
        import symmem, symmem.torch
        p = symmem.alloc(100)
        symmem.free(p)
        for call in (lambda: symmem.torch.empty(4), symmem.torch.allocator, symmem.torch.mem_pool):
            try:
                call()
            except RuntimeError as e:
                assert "PyTorch" in str(e), e
            else:
                raise AssertionError("no error without torch")
        assert sys.modules["torch"] is None
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_missing_symbol_raises_unavailable():
    stub = _lib._Missing("symmem_future_thing", Path("/x/libsymmem.so"))
    with pytest.raises(symmem.UnavailableError) as info:
        stub(1, 2)
    assert info.value.code == symmem.Result.UNAVAILABLE
    assert "symmem_future_thing" in info.value.message


def test_backend_is_host_in_ci():
    if os.environ.get("SYMMEM_REQUIRE_GPU") == "1":
        assert symmem.backend_name() == "cuda", symmem.backend_notes()
    elif os.environ.get("SYMMEM_BACKEND") == "cuda":  # make test-fakecuda
        assert symmem.backend_name() == "cuda", symmem.backend_notes()
        if "fake" in os.environ.get("SYMMEM_LIBCUDA", ""):
            assert symmem.device_count() == 2  # the fake driver's default
    else:
        assert symmem.backend_name() == "host"
        assert symmem.device_count() == 1
    assert isinstance(symmem.backend_notes(), str)


def test_a_forked_child_is_refused_not_hung():
    """After fork() the library's Go runtime is gone in the child: a call
    there must raise UnavailableError at once, naming fork, never hang."""
    symmem.version()  # loaded in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only Python runs here, never the library
        os.close(r)
        try:
            symmem.version()
            msg = b"no error"
        except symmem.UnavailableError as e:
            msg = b"ok " + e.message.encode()
        except BaseException as e:  # noqa: BLE001 - report anything else
            msg = repr(e).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    got = b""
    while chunk := os.read(r, 4096):
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    assert got.startswith(b"ok "), got
    assert b"fork" in got and b"spawn" in got, got
