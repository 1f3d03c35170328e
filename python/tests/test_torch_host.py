"""symmem.torch with PyTorch on the host backend (CPU tensors), and
torch.distributed rendezvous on whichever backend the run uses.

Skipped, with the reason printed, where torch cannot be imported.
"""

from __future__ import annotations

import gc

import pytest

import symmem

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch helper tests need it")

import symmem.torch as st  # noqa: E402

host_only = pytest.mark.usefixtures("host_backend")


def allocated() -> int:
    return symmem.memory_stats(0)["allocated_bytes.all.current"]


@host_only
def test_empty_is_on_the_heap_and_freed_with_the_tensor(clean_device):
    # What earlier tests of this process still hold (a group's staging
    # workspace lives as long as its group) is the baseline.
    gc.collect()
    base = allocated()
    t = st.empty(4, 8, dtype=torch.float32)
    assert t.shape == (4, 8) and t.dtype == torch.float32 and t.device.type == "cpu"
    info = symmem.pointer_info(t.data_ptr())
    assert info.requested_size == 4 * 8 * 4 and info.offset == 0
    assert allocated() >= base + 128
    t.fill_(3.0)
    v = t[1:3]  # a view keeps the memory alive
    del t
    gc.collect()
    assert allocated() > base and float(v.sum()) == 3.0 * 16
    del v
    gc.collect()
    assert allocated() == base


@host_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int64", "bool", "uint8", "complex64"])
def test_empty_dtypes_and_shapes(dtype, clean_device):
    gc.collect()
    base = allocated()
    dt = getattr(torch, dtype)
    for shape in [(), (0,), (5,), (2, 0, 3), (3, 7)]:
        t = st.empty(shape, dtype=dt)
        assert tuple(t.shape) == shape and t.dtype == dt and t.is_contiguous()
        t2 = st.empty(*shape, dtype=dt)
        assert tuple(t2.shape) == shape
    del t, t2
    gc.collect()
    assert allocated() == base


@host_only
def test_as_tensor_aliases_a_buffer(clean_device):
    with symmem.empty(16) as buf:
        t = st.as_tensor(buf)
        t[:] = torch.arange(16, dtype=torch.uint8)
        assert buf.tobytes() == bytes(range(16))
        del t


def test_memory_stats_are_sorted_like_torch():
    s = st.memory_stats()
    assert list(s) == sorted(s)
    assert "allocated_bytes.all.current" in s
    assert s == dict(sorted(symmem.memory_stats(0).items())) or symmem.backend_name() == "cuda"


@host_only
def test_cuda_helpers_say_what_is_missing():
    for call in (st.allocator, st.use_as_global_allocator, st.mem_pool_allocator, st.mem_pool):
        with pytest.raises(RuntimeError) as info:
            call()
        assert "CUDA" in str(info.value) or "cuda" in str(info.value)
    with pytest.raises(RuntimeError):
        st.empty(4, device="cuda")


@pytest.fixture
def torch_sees_the_backend():
    """Ranks of symmem.torch on the cuda backend put their tensors on torch's
    CUDA devices: with libsymmem on cuda (the stand-in driver of make
    test-fakecuda) and no CUDA device that torch sees, there is nothing to
    run on."""
    if symmem.backend_name() == "cuda" and not torch.cuda.is_available():
        pytest.skip("libsymmem runs on cuda, but torch sees no CUDA device (make test-fakecuda's stand-in driver)")


@pytest.mark.usefixtures("symmetric", "torch_sees_the_backend")
@pytest.mark.parametrize("world", [2, 4])
def test_rendezvous_with_a_process_group(world, tmp_path):
    import _torch_workers
    from _mp import run_ranks

    results = run_ranks(_torch_workers.write_every_peer, world, str(tmp_path / "pg"), timeout=240)
    for res in results:
        assert res == {"rows_ok": True, "row_ok": True, "same_group": True, "on_heap": True, "world_size": world}


@pytest.mark.usefixtures("symmetric", "torch_sees_the_backend")
def test_rendezvous_mismatch_with_a_process_group(tmp_path):
    import _torch_workers
    from _mp import run_ranks

    results = run_ranks(_torch_workers.mismatch, 2, str(tmp_path / "pg"), timeout=240)
    assert [r["raised"] for r in results] == ["MismatchError", "MismatchError"]


@pytest.mark.usefixtures("symmetric", "torch_sees_the_backend")
def test_process_group_across_machines(tmp_path):
    """Ranks 0, 1 on imitated machine m0, ranks 2, 3 on m1 (docs/machines.md)."""
    import _torch_workers
    from _mp import run_ranks

    def env(rank):
        d = tmp_path / f"sock-m{rank // 2}"
        d.mkdir(mode=0o700, exist_ok=True)
        return {"SYMMEM_MACHINE_ID": f"m{rank // 2}", "SYMMEM_SOCKET_DIR": str(d)}

    results = run_ranks(_torch_workers.across_machines, 4, str(tmp_path / "pg"), timeout=240, env=env)
    for rank, res in enumerate(results):
        assert res["local"] == (rank % 2, 2)
        other = [2, 3] if rank < 2 else [0, 1]
        assert res["remote"] == other
        assert f"rank {other[0]} is on another machine" in res["remote_error"]
        assert f'machine "m{1 - rank // 2}"' in res["remote_error"]
        assert res["rows_ok"]
        assert res["coll_error"].startswith("UnavailableError") and "engine between machines" in res["coll_error"]
