"""The all-reduce operators' C++ kernels (Note [Operators in C++] in
symmem/torch.py), on the host backend's CPU tensors (test_torch_compile_gpu.py
runs their CUDA kernels): built by `make` (or
`python -m symmem build-torch-ops`) wherever torch imports, so where torch
is installed and the module is missing the test fails, naming the command."""

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the operators' kernels need it")

from _mp import run_ranks  # noqa: E402

import _staging_workers as sw  # noqa: E402


def _built() -> Path:
    import symmem._torch_ops as to

    p = to.path(torch)
    if not p.exists():
        pytest.fail(f"the operators' C++ kernels are not built for torch {torch.__version__} ({p} is missing): "
                    "run `make` or `python -m symmem build-torch-ops`")
    return p


def test_the_kernels_answer_repeated_calls_from_their_table(host_backend, tmp_path):
    _built()
    for res in run_ranks(sw.cpp_kernels, 2, str(tmp_path / "pg"), timeout=300, allow_errors=False):
        assert res["loaded"] is True, res
        # One call passed to Python, which entered the tensor; two answered.
        assert res["in_place"] is True and res["in_place_counts"] == (2, 1, 1), res
        assert res["out_max"] is True and res["functional"] is True, res
        assert res["out_functional_counts"] == (2, 0), res
        # Each collective's first call passes to Python; four answered.
        assert res["all_gather"] is True and res["reduce_scatter"] is True, res
        assert res["ag_rs_counts"] == (4, 2, 2), res
        # The norm: bit for bit the Python kernel's; one call passed on.
        assert res["norm"] is True and res["norm_counts"] == (2, 1), res
        # The split-driven all-to-alls, twice each: the first of each passed
        # on; all_to_all in two dtypes, entered by the Python kernel first.
        assert res["a2a"] is True and res["a2a_counts"] == (3 + 6, 3), res
        # Staged calls: the first passes to Python, which enters it and the
        # workspace; the other ten are staged in C++, six of them on
        # tensors it had not seen (two_shot only on the entered one: the
        # workspace decides the auto algorithm's calls alone). A libsymmem tensor not seen passes to
        # Python (an entry of its own).
        assert res["staged"] is True and res["fresh_symmem"] is True, res
        assert res["staged_counts"] == (10, 2, 2), res
        assert res["bogus"].startswith("InvalidArgumentError") and 'unknown op "bogus"' in res["bogus"], res
        # A libsymmem tensor's entries go with its memory; the staged one,
        # of torch's memory, stays until destroy_group.
        assert res["entries_after_free"] == 2, res
        assert res["entries_before_destroy"] == 3 and res["entries_after_destroy"] == 0, res
        assert res["after_destroy"] is True, res
        assert res["torch_memory_after_destroy"] is True, res
        assert res["torch_memory_after_destroy_counts"] == (1, 1), res
        assert res["aborted"].startswith("AbortedError"), res


def test_symmem_torch_ops_off_keeps_the_python_kernels(host_backend, tmp_path):
    _built()
    results = run_ranks(sw.cpp_kernels_off, 2, str(tmp_path / "pg"), timeout=300,
                        env=lambda r: {"SYMMEM_TORCH_OPS": "0"})
    assert results == [{"loaded": None, "sum": True}] * 2


def test_the_module_is_named_for_its_torch_and_source():
    import symmem._torch_ops as to

    name = to.filename(torch)
    assert name.startswith("_torch_ops-torch") and name.endswith(".so")
    assert torch.__version__.split("+")[0] in name
    out = subprocess.run([sys.executable, "-m", "symmem", "build-torch-ops", "--print-path"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0 and out.stdout.strip() == str(to.path(torch)), out


def test_the_packages_module_comes_before_the_command_s(tmp_path, monkeypatch):
    """A module in the package (a wheel built where torch imported) is the
    one loaded; without it, the one the command builds in its directory."""
    import shutil

    import symmem._torch_ops as to

    pkg = tmp_path / "symmem"
    pkg.mkdir()
    shutil.copy(to.SOURCE, pkg / "_torch_ops.cpp")
    monkeypatch.setattr(to, "SOURCE", pkg / "_torch_ops.cpp")
    monkeypatch.setenv("SYMMEM_TORCH_OPS_DIR", str(tmp_path / "cache"))
    assert to.path(torch) == tmp_path / "cache" / to.filename(torch)
    (pkg / to.filename(torch)).write_bytes(b"")
    assert to.path(torch) == to.packaged(torch) == pkg / to.filename(torch)
