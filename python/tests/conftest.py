"""Test setup for the symmem Python package.

* Runs everything on libsymmem's host backend (SYMMEM_BACKEND=host) unless
  SYMMEM_REQUIRE_GPU=1 or SYMMEM_BACKEND is set, so the suite runs in CI without a GPU. Tests that
  need the cuda backend start subprocesses with their own environment.
* Gives the run a private socket directory (SYMMEM_SOCKET_DIR) so groups of
  parallel runs never meet.
* Makes python/ and this folder importable, here and in spawned processes.
* A library without the symmetric part fails the symmetric tests, unless
  SYMMEM_PARTIAL_LIBRARY=1 (a library built with the allocator only), where
  they skip.

The environment is set at import time, before symmem loads the library
(the library reads it once, when it starts).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
PYTHON_DIR = TESTS_DIR.parent
REPO_DIR = PYTHON_DIR.parent

REQUIRE_GPU = os.environ.get("SYMMEM_REQUIRE_GPU") == "1"

if not REQUIRE_GPU:
    # host unless the caller chose (make test-fakecuda runs on the fake driver)
    os.environ.setdefault("SYMMEM_BACKEND", "host")
if "SYMMEM_SOCKET_DIR" not in os.environ:
    _socket_dir = tempfile.mkdtemp(prefix="symmem-pytest-")
    os.environ["SYMMEM_SOCKET_DIR"] = _socket_dir
    atexit.register(shutil.rmtree, _socket_dir, ignore_errors=True)
# Several ranks of a test share device 0 (always so on the host backend,
# and on a one-GPU machine).
os.environ.setdefault("SYMMEM_ALLOW_OVERLAPPING_DEVICES", "1")

for p in (str(PYTHON_DIR), str(TESTS_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)
# Subprocesses started with subprocess.* find the package too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(PYTHON_DIR), str(TESTS_DIR)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
)

import symmem  # noqa: E402
from symmem import _lib  # noqa: E402

SYMMETRIC_SYMBOLS = ("symmem_group_create", "symmem_rendezvous", "symmem_barrier")


def pytest_report_header(config):
    try:
        lines = [
            f"libsymmem: {symmem.library_path()} version {symmem.version()} backend {symmem.backend_name()}",
        ]
        notes = symmem.backend_notes().strip()
        if notes:
            lines.append(f"libsymmem backend notes: {notes}")
        missing = _lib.lib().missing
        if missing:
            lines.append(f"libsymmem lacks: {', '.join(missing)}")
        return lines
    except Exception as exc:  # the tests will say it again
        return [f"libsymmem: not loadable: {exc}"]


@pytest.fixture(scope="session", autouse=True)
def _library_loads():
    """Every test needs the library: fail loudly (not skip) without it."""
    symmem.version()


@pytest.fixture
def symmetric():
    """Skip or fail when the library has no symmetric part (see above)."""
    missing = [s for s in SYMMETRIC_SYMBOLS if not _lib.has(s)]
    if missing:
        msg = f"libsymmem lacks the symmetric part ({', '.join(missing)})"
        if os.environ.get("SYMMEM_PARTIAL_LIBRARY") == "1":
            pytest.skip(msg)
        pytest.fail(msg + " (set SYMMEM_PARTIAL_LIBRARY=1 to skip)")


@pytest.fixture
def clean_device():
    """Device 0 with no memory limit and an empty cache, before and after."""
    symmem.set_memory_limit(0, 0)
    symmem.empty_cache(0)
    yield 0
    symmem.set_memory_limit(0, 0)
    symmem.empty_cache(0)


@pytest.fixture
def host_backend():
    """The test touches memory from the CPU: the host backend only."""
    name = symmem.backend_name()
    if name != "host":
        pytest.skip(f"needs the host backend (CPU-addressable memory); running on {name!r}")
