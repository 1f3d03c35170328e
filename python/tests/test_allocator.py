"""The caching allocator through the Python API (host backend in CI)."""

from __future__ import annotations

import random
import threading

import pytest

import symmem
from symmem import Result

MiB = 1 << 20

STATS = (
    "allocation",
    "segment",
    "active",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "requested_bytes",
    "paused_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
KINDS = ("current", "peak", "allocated", "freed")
SCALARS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams", "memory_limit")
EXPECTED_KEYS = {f"{s}.{p}.{k}" for s in STATS for p in POOLS for k in KINDS} | set(SCALARS)


def stat(key: str, device: int = 0) -> int:
    return symmem.memory_stats(device)[key]


def _pattern(i: int, size: int) -> bytes:
    unit = bytes(range(i % 256, 256)) + bytes(range(i % 256))
    return (unit * (size // 256 + 1))[:size]


def test_alloc_free_roundtrip_with_contents(clean_device, host_backend):
    bufs = []
    for i, size in enumerate([1, 100, 4096, 65536, 3 * MiB + 17]):
        buf = symmem.empty(size)
        assert buf.ptr % 512 == 0
        mv = buf.memoryview()
        assert len(mv) == size and not mv.readonly and mv.format == "B"
        mv[:] = _pattern(i + 1, size)
        bufs.append(buf)
    # Every buffer still holds its own pattern: no two overlap.
    for i, buf in enumerate(bufs):
        assert buf.tobytes() == _pattern(i + 1, buf.nbytes)
    spans = sorted((b.ptr, b.ptr + b.nbytes) for b in bufs)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    for buf in bufs:
        buf.free()
    assert stat("allocated_bytes.all.current") == 0
    symmem.validate(0)


def test_raw_alloc_and_free():
    p = symmem.alloc(1000)
    info = symmem.pointer_info(p)
    assert info.block == p and info.offset == 0 and info.requested_size == 1000
    assert info.block_size >= 1000 and info.device == 0
    symmem.free(p)  # size looked up
    q = symmem.alloc(1000)
    symmem.free(q, 1000, 0, 0)


def test_stats_keys_and_values(clean_device):
    stats = symmem.memory_stats(0)
    assert set(stats) >= EXPECTED_KEYS
    assert list(stats) == list(symmem.memory_stats(0))  # fixed order
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["memory_limit"] == 0

    before = symmem.memory_stats(0)
    p = symmem.alloc(3000)
    block = symmem.pointer_info(p).block_size
    mid = symmem.memory_stats(0)
    assert mid["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == block
    assert mid["requested_bytes.all.current"] - before["requested_bytes.all.current"] == 3000
    assert mid["allocation.all.current"] - before["allocation.all.current"] == 1
    assert mid["allocation.all.allocated"] - before["allocation.all.allocated"] == 1
    assert mid["allocated_bytes.all.peak"] >= mid["allocated_bytes.all.current"]
    assert mid["reserved_bytes.all.current"] >= mid["allocated_bytes.all.current"]
    assert mid["segment.all.current"] >= 1
    symmem.free(p)
    after = symmem.memory_stats(0)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocation.all.freed"] - before["allocation.all.freed"] == 1
    assert after["allocated_bytes.all.peak"] >= mid["allocated_bytes.all.current"]
    # "active" is "allocated" here (header: a freed block is reusable at once).
    assert mid["active_bytes.all.current"] == mid["allocated_bytes.all.current"]
    # The pools split "all".
    for s in STATS:
        assert after[f"{s}.all.current"] == after[f"{s}.small_pool.current"] + after[f"{s}.large_pool.current"], s


def test_reset_peak(clean_device):
    p = symmem.alloc(5 * MiB)
    symmem.free(p)
    assert stat("allocated_bytes.all.peak") >= 5 * MiB
    symmem.reset_peak_memory_stats(0)
    s = symmem.memory_stats(0)
    for key, value in s.items():
        if key.endswith(".peak"):
            assert value == s[key[: -len("peak")] + "current"], key


def test_empty_cache_lowers_reserved_bytes(clean_device):
    ptrs = [symmem.alloc(4 * MiB) for _ in range(3)]
    for p in ptrs:
        symmem.free(p)
    cached = stat("reserved_bytes.all.current")
    assert cached >= 12 * MiB  # kept in the cache after free
    assert stat("allocated_bytes.all.current") == 0
    symmem.empty_cache(0)
    assert stat("reserved_bytes.all.current") < cached
    assert stat("reserved_bytes.all.current") == 0
    symmem.empty_cache()  # -1: every device
    symmem.validate(0)


def test_empty_cache_keeps_live_blocks(clean_device, host_backend):
    live = symmem.empty(4 * MiB)
    live.memoryview()[:4] = b"live"
    dead = symmem.alloc(8 * MiB)
    symmem.free(dead)
    symmem.empty_cache(0)
    assert stat("reserved_bytes.all.current") >= 4 * MiB
    assert bytes(live.memoryview()[:4]) == b"live"
    live.free()


def test_memory_limit_gives_out_of_memory(clean_device):
    # Segments are 2 MiB, 20 MiB, or the request rounded up to 2 MiB.
    symmem.set_memory_limit(0, 64 * MiB)
    assert symmem.get_memory_limit(0) == 64 * MiB
    assert stat("memory_limit") == 64 * MiB
    ooms = stat("num_ooms")
    with pytest.raises(symmem.OutOfMemoryError) as info:
        symmem.alloc(128 * MiB)
    e = info.value
    assert isinstance(e, MemoryError)
    assert e.code == Result.OUT_OF_MEMORY
    assert "alloc" in e.message and e.message != symmem.strerror(Result.OUT_OF_MEMORY)
    assert stat("num_ooms") == ooms + 1
    # The next allocations that fit succeed.
    p = symmem.alloc(2 * MiB)
    q = symmem.alloc(40 * MiB)
    symmem.free(p)
    symmem.free(q)
    symmem.set_memory_limit(0, 0)
    assert symmem.get_memory_limit(0) == 0
    p = symmem.alloc(128 * MiB)
    symmem.free(p)


def test_limit_frees_idle_cache_before_failing(clean_device):
    p = symmem.alloc(30 * MiB)
    symmem.free(p)  # 30 MiB cached
    symmem.set_memory_limit(0, 40 * MiB)
    # A new 36 MiB segment fits only once the idle cached one is released.
    q = symmem.alloc(35 * MiB)
    assert stat("reserved_bytes.all.current") <= 40 * MiB
    symmem.free(q)


def test_huge_sizes_are_out_of_memory():
    # Sizes that fit size_t; one that does not is InvalidArgumentError
    # (test_int_ranges.py).
    for size in (2**64 - 1, 2**63):
        with pytest.raises(symmem.OutOfMemoryError) as info:
            symmem.alloc(size)
        assert info.value.code == Result.OUT_OF_MEMORY


def test_negative_size():
    with pytest.raises(symmem.InvalidArgumentError):
        symmem.alloc(-1)


@pytest.mark.parametrize("device", [-1, 1, 7, 1 << 30])
def test_bad_device(device):
    n = symmem.device_count()
    device = device if device < 0 or device >= n else n  # past the last one
    with pytest.raises(symmem.InvalidDeviceError) as info:
        symmem.alloc(100, device)
    assert info.value.code == Result.INVALID_DEVICE
    assert info.value.message
    for call in (
        lambda: symmem.memory_stats(device),
        lambda: symmem.set_memory_limit(device, MiB),
        lambda: symmem.get_memory_limit(device),
        lambda: symmem.reset_peak_memory_stats(device),
        lambda: symmem.validate(device),
    ):
        with pytest.raises(symmem.SymmemError) as info:
            call()
        assert info.value.code == Result.INVALID_DEVICE
    if device != -1:  # -1 means every device for empty_cache
        with pytest.raises(symmem.InvalidDeviceError):
            symmem.empty_cache(device)


def test_double_free_is_invalid_pointer():
    p = symmem.alloc(256)
    symmem.free(p)
    with pytest.raises(symmem.InvalidPointerError) as info:
        symmem.free(p)
    assert info.value.code == Result.INVALID_POINTER
    assert isinstance(info.value, symmem.SymmemError)
    assert info.value.message
    # The failed free did nothing: the allocator is consistent.
    symmem.validate(0)


def test_foreign_and_interior_pointers():
    buf = symmem.empty(4096)
    with pytest.raises(symmem.InvalidPointerError):
        symmem.free(buf.ptr + 512)  # interior
    with pytest.raises(symmem.InvalidPointerError):
        symmem.free(0x1000)  # never ours
    info = symmem.pointer_info(buf.ptr + 100)
    assert info.block == buf.ptr and info.offset == 100
    buf.free()
    with pytest.raises(symmem.InvalidPointerError):
        symmem.pointer_info(buf.ptr)
    symmem.free(0)  # NULL is a no-op


def test_wrong_size_is_reported_but_freed(clean_device):
    p = symmem.alloc(1000)
    with pytest.raises(symmem.InvalidArgumentError):
        symmem.free(p, 999)
    assert stat("allocated_bytes.all.current") == 0
    with pytest.raises(symmem.InvalidPointerError):
        symmem.free(p, 1000)


def test_size_zero_gives_distinct_pointers(clean_device):
    rng = random.Random(1)
    ptrs = [symmem.alloc(0) for _ in range(200)]
    assert all(ptrs) and len(set(ptrs)) == len(ptrs)
    info = symmem.pointer_info(ptrs[0])
    assert info.requested_size == 0 and info.block_size >= 512
    rng.shuffle(ptrs)
    for p in ptrs:
        symmem.free(p, 0)
    assert stat("allocated_bytes.all.current") == 0
    symmem.validate(0)


def test_heap_offsets_are_reused_after_free(clean_device):
    p = symmem.alloc(MiB)
    off = symmem.pointer_info(p).heap_offset
    symmem.free(p)
    q = symmem.alloc(MiB)
    assert symmem.pointer_info(q).heap_offset == off
    symmem.free(q)


def test_many_threads(clean_device):
    errors = []

    def churn(seed):
        rng = random.Random(seed)
        live = []
        try:
            for _ in range(300):
                if live and rng.random() < 0.5:
                    symmem.free(live.pop(rng.randrange(len(live))))
                else:
                    live.append(symmem.alloc(rng.choice([0, 64, 4096, 70000, MiB])))
            for p in live:
                symmem.free(p)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert stat("allocated_bytes.all.current") == 0
    symmem.validate(0)


def test_streams_are_numbered_on_host(clean_device, host_backend):
    # The host backend only numbers streams; a block freed on one stream is
    # reused on that stream.
    p = symmem.alloc(4096, 0, 0x1234)
    off = symmem.pointer_info(p).heap_offset
    symmem.free(p, 4096, 0, 0x1234)
    q = symmem.alloc(4096, 0, 0x1234)
    assert symmem.pointer_info(q).heap_offset == off
    symmem.record_stream(q, 0x5678)
    symmem.free(q, 4096, 0, 0x1234)
    symmem.validate(0)


def test_memory_fraction_bad_input():
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(symmem.SymmemError) as info:
            symmem.set_memory_fraction(bad, 0)
        assert info.value.code == Result.INVALID_ARGUMENT
    with pytest.raises(symmem.InvalidDeviceError):
        symmem.set_memory_fraction(0.5, 99)
