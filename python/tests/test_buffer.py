"""symmem.Buffer: ownership, views, host access."""

from __future__ import annotations

import gc
import sys

import pytest

import symmem

host_only = pytest.mark.usefixtures("host_backend")


def allocated() -> int:
    return symmem.memory_stats(0)["allocated_bytes.all.current"]


@host_only
def test_context_manager_frees(clean_device):
    with symmem.empty(10000) as buf:
        assert allocated() > 0
        assert buf.owning and not buf.freed
        assert len(buf) == 10000
    assert buf.freed
    assert allocated() == 0
    buf.free()  # twice is fine


@host_only
def test_garbage_collection_frees(clean_device):
    buf = symmem.empty(5000)
    mv = buf.memoryview()
    mv[0] = 7
    del buf
    gc.collect()
    assert allocated() > 0  # the memoryview keeps the buffer alive
    assert mv[0] == 7
    del mv
    gc.collect()
    assert allocated() == 0


@host_only
def test_free_releases_memoryviews(clean_device):
    buf = symmem.empty(64)
    mv = buf.memoryview()
    buf.free()
    with pytest.raises(ValueError):
        mv[0]  # released, not a dangling pointer
    with pytest.raises(symmem.InvalidStateError):
        buf.memoryview()


@host_only
def test_host_interfaces(clean_device):
    with symmem.empty(32) as buf:
        assert not hasattr(buf, "__cuda_array_interface__")
        ai = buf.__array_interface__
        assert ai["shape"] == (32,) and ai["typestr"] == "|u1" and ai["data"] == (buf.ptr, False)
        buf.memoryview()[:] = bytes(range(32))
        assert buf.tobytes() == bytes(range(32))
        if sys.version_info >= (3, 12):
            assert bytes(memoryview(buf)) == bytes(range(32))
        assert "owning" in repr(buf)


@host_only
def test_zero_size_buffer(clean_device):
    a, b = symmem.empty(0), symmem.empty(0)
    assert a.ptr and b.ptr and a.ptr != b.ptr
    assert len(a.memoryview()) == 0
    a.free()
    b.free()
    assert allocated() == 0


@host_only
def test_views_do_not_free():
    with symmem.empty(128) as owner:
        view = symmem.Buffer(owner.ptr + 64, 64, 0)
        view.memoryview()[:] = b"x" * 64
        view.free()  # not owning: nothing happens
        assert not owner.freed
        assert owner.tobytes()[64:] == b"x" * 64
        assert "view" in repr(view)


@pytest.mark.parametrize("size", [1, 1000, 3 << 20])
def test_read_write_fill(size, clean_device):
    with symmem.empty(size) as buf:
        buf.fill(0xAB)
        assert buf.read() == b"\xab" * size
        data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        buf.write(data)
        assert buf.read() == data
        assert buf.read(size // 2, 1) == data[size // 2 : size // 2 + 1]
        buf.write(b"", size)  # empty write at the end is fine
        buf.fill(1, 0, 0)
        with pytest.raises(symmem.InvalidArgumentError):
            buf.write(b"xx", size - 1)
        with pytest.raises(symmem.InvalidArgumentError):
            buf.read(size, 1)
        if buf.kind == "host":
            assert buf.memoryview()[0] == data[0]


def test_raw_copy_and_memset(clean_device):
    a, b = symmem.empty(64), symmem.empty(64)
    symmem.memset(a.ptr, 7, 64)
    symmem.copy(b.ptr, a.ptr, 64)
    assert b.read() == b"\x07" * 64
    symmem.copy(0, 0, 0)  # n 0 is a no-op
    with pytest.raises(symmem.InvalidArgumentError):
        symmem.copy(0, a.ptr, 8)
    a.free()
    b.free()


def test_empty_drains_thread_caches(clean_device):
    """symmem.empty gives thread-cached blocks back before it allocates, so a
    buffer meant for a rendezvous lands where it would without the caches
    (here: where the freed scratch block was), not behind a block that only
    this rank's cache holds."""
    if symmem.memory_stats(0).get("thread_cache.all.current") is None:
        pytest.fail("the library reports no thread_cache statistics")
    scratch = symmem.alloc(1 << 20, 0)
    symmem.free(scratch, 1 << 20, 0)
    cached = symmem.memory_stats(0)["thread_cache.all.current"]
    if cached == 0:
        pytest.skip("thread caches are off here (SYMMEM_THREAD_CACHE=0)")
    assert cached == 1
    with symmem.empty(4096) as buf:
        assert symmem.memory_stats(0)["thread_cache.all.current"] == 0
        assert buf.ptr == scratch, "the buffer takes the drained block's place, as without caches"
    # The buffer's own block went to the cache when it was freed;
    # thread_caches_drain by itself gives it back, a bad device is refused.
    assert symmem.memory_stats(0)["thread_cache.all.current"] == 1
    symmem.thread_caches_drain(0)
    assert symmem.memory_stats(0)["thread_cache.all.current"] == 0
    with pytest.raises(symmem.SymmemError):
        symmem.thread_caches_drain(999)
