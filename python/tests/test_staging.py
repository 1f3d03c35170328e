"""symmem.torch's collectives on any tensor (Note [Staging] in
symmem/torch.py) and under torch.compile, on the host backend's CPU
tensors at 2 ranks; the settings they read.

Skipped, with the reason printed, where torch cannot be imported (the
settings tests run without it).
"""

from __future__ import annotations

import pytest

import symmem
from symmem.errors import env_size


def test_staging_bytes_reads_sizes_as_the_library_does(monkeypatch):
    for raw, want in [("4096", 4096), ("4K", 4096), ("8m", 8 << 20), ("1GiB", 1 << 30), (" 2 KB ", 2048)]:
        monkeypatch.setenv("SYMMEM_STAGING_BYTES", raw)
        assert env_size("SYMMEM_STAGING_BYTES", 1) == want, raw
    monkeypatch.setenv("SYMMEM_STAGING_BYTES", "")
    assert env_size("SYMMEM_STAGING_BYTES", 123) == 123
    monkeypatch.setenv("SYMMEM_STAGING_BYTES", "lots")
    with pytest.raises(symmem.InvalidArgumentError, match=r'SYMMEM_STAGING_BYTES="lots" cannot be read as a size'):
        env_size("SYMMEM_STAGING_BYTES", 1)


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: the staging tests need it")


@pytest.fixture
def host_torch(host_backend):
    return _torch()


def test_collectives_take_tensors_libsymmem_did_not_allocate(host_torch, tmp_path):
    import _staging_workers as sw
    from _mp import run_ranks

    results = run_ranks(sw.any_tensor, 2, str(tmp_path / "pg"), timeout=240,
                        env=lambda r: {"SYMMEM_STAGING_BYTES": "4K"})
    for res in results:
        for key in ("in_place", "in_place_same_tensor", "functional", "functional_new", "functional_untouched",
                    "out", "zero_copy", "zero_copy_rendezvoused", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
                    "non_contiguous", "grown"):
            assert res[key] is True, (key, res)
        assert res["grown_from"] == 4096 and res["grown_to"] == 32768 and res["grown_kept"] == 2, res
        msg = res["float64"]
        assert "all_reduce: unknown dtype" in msg and "torch.float64" in msg and "bfloat16" in msg, res


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_patterns_match_eager(host_torch, tmp_path, backend):
    """The argument, module-buffer and intermediate patterns compiled with
    fullgraph=True (a graph break would raise) give eager's results."""
    import _staging_workers as sw
    from _mp import run_ranks

    if backend == "inductor":
        import shutil

        if shutil.which("cc") is None and shutil.which("gcc") is None:
            pytest.skip("Inductor's CPU code needs a C++ compiler")
    results = run_ranks(sw.compiled, 2, str(tmp_path / "pg"), backend, timeout=600)
    for res in results:
        assert all(v is True for v in res.values()), res
