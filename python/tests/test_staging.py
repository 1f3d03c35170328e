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


class _Like:
    """What _reads_in_place reads of a tensor."""

    def __init__(self, ptr: int, contiguous: bool = True):
        self.ptr, self.contiguous = ptr, contiguous

    def data_ptr(self) -> int:
        return self.ptr

    def is_contiguous(self) -> bool:
        return self.contiguous


def test_small_calls_read_the_tensor_where_it_lies_and_larger_ones_stage():
    """The rule symmem.torch applies before symmem_collective_from: what
    the low-latency path takes (Note [Inputs outside the block]), the
    library's own rule for an input outside the block."""
    from types import SimpleNamespace

    from symmem import _coll
    from symmem.torch import _reads_in_place

    ws = SimpleNamespace(ll_bytes=256 << 10, world=2)
    AR, AG, RS = _coll.ALL_REDUCE, _coll.ALL_GATHER, _coll.REDUCE_SCATTER
    t = _Like(0x10000)
    ll, one_shot = _coll.ALGOS["low_latency"], _coll.ALGOS["one_shot"]
    assert _reads_in_place(ws, AR, t, None, 2048, 4096, 0)
    assert _reads_in_place(ws, AR, t, None, 2048, 4096, ll)
    assert _reads_in_place(ws, AR, t, None, 1, 2, 0), "all_reduce takes any size up to the buffers"
    assert _reads_in_place(ws, AR, t, None, 128 << 10, 256 << 10, 0)
    assert not _reads_in_place(ws, AR, t, None, (128 << 10) + 1, (256 << 10) + 2, 0), "past the buffers: staged"
    assert not _reads_in_place(ws, AR, t, None, 2048, 4096, one_shot), "one_shot reads the peers' blocks"
    assert not _reads_in_place(ws, AR, _Like(0x10008), None, 2048, 4096, 0), "not 16-byte aligned"
    assert not _reads_in_place(ws, AR, _Like(0x10000, contiguous=False), None, 2048, 4096, 0)
    assert not _reads_in_place(ws, AR, t, _Like(0x20008), 2048, 4096, 0), "out not 16-byte aligned"
    assert _reads_in_place(ws, AG, t, _Like(0x20000), 4, 8, 0)
    assert not _reads_in_place(ws, AG, t, _Like(0x20000), 3, 6, 0), "all_gather: a multiple of 8 bytes per peer"
    assert _reads_in_place(ws, RS, t, _Like(0x20000), 256 << 10, 512 << 10, 0), "reduce_scatter: bytes / world per peer"
    assert not _reads_in_place(ws, RS, t, _Like(0x20000), 7, 14, 0), "count not a multiple of the world size"
    assert not _reads_in_place(ws, RS, t, _Like(0x20000), 4, 8, 0), "4 bytes per peer"
    assert not _reads_in_place(SimpleNamespace(ll_bytes=0, world=2), AR, t, None, 2048, 4096, 0), \
        "the host backend has no low-latency path"
