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


def test_a_compiled_function_may_be_the_first_use_of_symmem_torch(host_torch, tmp_path):
    """torch.compile(fullgraph=True) of a function that calls symmem.torch
    before anything else in the process has: no graph break."""
    import _staging_workers as sw
    from _mp import run_ranks

    for res in run_ranks(sw.compiled_first, 2, str(tmp_path / "pg"), timeout=300):
        assert res == {"first_call_compiled": True}, res


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
    assert not _reads_in_place(SimpleNamespace(ll_bytes=256 << 10, world=1), AR, t, None, 2048, 4096, 0), \
        "a group of one stages"


def test_a_tensor_read_in_place_is_looked_up_at_its_next_call(host_torch, tmp_path, monkeypatch):
    """symmem.torch's eager path (Note [Eager collectives]): once a call on
    the default group has read a tensor of torch's memory in place, the
    next call of that collective on it goes straight to
    symmem_collective_from with the same workspace handle; a view with the
    same address and size that is not contiguous, an algo, or another
    collective does not take that shortcut, and destroy_group forgets it.
    The host backend has no low-latency path, so the workspace is told it
    has one and the library's two calls are recorded instead of run."""
    import torch
    import torch.distributed as dist

    from symmem import torch as stm

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        x = torch.ones(64, 8, dtype=torch.bfloat16)
        stm.all_reduce(x)  # the first call: the group and its workspace (staged, for real)
        ws = next(w for w in stm._workspaces.values() if w.group is stm.group_for(None, 0))
        monkeypatch.setattr(ws, "ll_bytes", 256 << 10)
        monkeypatch.setattr(ws, "world", 2)  # a group of one stages
        calls = []

        def record(kind):
            def fn(*args):
                calls.append((kind,) + args)
                return 0
            return fn

        monkeypatch.setattr(stm, "_collective_from_fn", record("from"))
        monkeypatch.setattr(stm, "_collective_fn", record("plain"))
        stm.all_reduce(x)  # read in place: through _run_staged, then remembered
        stm.all_reduce(x)  # the shortcut
        assert [c[0] for c in calls] == ["from", "from"], calls
        assert calls[0][1:] == calls[1][1:], calls
        assert calls[1][1] == ws.hptr and calls[1][6] == x.data_ptr() and calls[1][5] == x.numel(), calls
        key = (x.get_device(), x.data_ptr(), x.nbytes, stm._coll.ALL_REDUCE)
        assert key in stm._in_place

        calls.clear()
        stm.all_reduce(x.t())  # same address and size, not contiguous: staged
        assert [c[0] for c in calls] == ["plain"], calls
        calls.clear()
        stm.all_reduce(x, algo="one_shot")  # an algo: no shortcut, and one_shot is staged
        assert [c[0] for c in calls] == ["plain"], calls
        calls.clear()
        out = torch.empty(64, 8, dtype=torch.bfloat16)
        stm.all_gather(x, out=out)  # another collective: decided afresh, then remembered
        stm.all_gather(x, out=out)
        assert [c[0] for c in calls] == ["from", "from"], calls
        assert (x.get_device(), x.data_ptr(), x.nbytes, stm._coll.ALL_GATHER) in stm._in_place

        stm.destroy_group()
        assert key not in stm._in_place
    finally:
        dist.destroy_process_group()
