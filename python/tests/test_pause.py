"""Tags, pause and resume on the host backend (include/symmem.h, "Tags and
pause"): contents with backup survive 100 cycles at the same addresses,
without backup they are zero, the process's footprint drops while paused
(measured by the kernel, not by our statistics), the collective case across
4 processes, and the defined result of every misuse."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

import symmem
from _mp import run_ranks
from _pause_workers import collective_pause, pause_when_a_peer_leaves, rss_shmem

# CPU loads and stores into the memory, and RssShmem: the host backend, and
# the fake driver of make test-fakecuda (its device memory is a memfd too).
ON_FAKE = symmem.backend_name() == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", "")
pytestmark = pytest.mark.skipif(
    symmem.backend_name() != "host" and not ON_FAKE, reason="CPU-addressable backends only (python/tests/gpu covers GPUs)"
)

MiB = 1 << 20


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{threading.get_ident() % 100000}"


def stats():
    return symmem.memory_stats(0)


def test_backup_survives_100_cycles_at_the_same_addresses():
    tag = unique("weights")
    with symmem.region(tag, backup=True):
        ptrs = [symmem.alloc(n) for n in (1000, 3 * MiB, 24 * MiB)]
    for i, p in enumerate(ptrs):
        ctypes.memset(p, 0x21 + i, 1000)
    for cycle in range(100):
        symmem.pause(tag)
        assert stats()["paused_bytes.all.current"] > 0
        symmem.resume(tag)
        for i, p in enumerate(ptrs):
            assert symmem.pointer_info(p).block == p
            assert ctypes.string_at(p, 1000) == bytes([0x21 + i]) * 1000, f"cycle {cycle}"
    assert stats()["paused_bytes.all.current"] == 0
    for p in ptrs:
        symmem.free(p)
    symmem.validate()


def test_without_backup_contents_are_zero():
    tag = unique("kv")
    with symmem.region(tag):
        p = symmem.alloc(4 * MiB)
    ctypes.memset(p, 0x7F, 4 * MiB)
    symmem.pause(tag)
    symmem.resume(tag)
    assert ctypes.string_at(p, 4 * MiB) == bytes(4 * MiB)
    symmem.free(p)


def test_footprint_drops_while_paused():
    tag = unique("big")
    n = 64 * MiB
    with symmem.region(tag, backup=True):
        p = symmem.alloc(n)
    ctypes.memset(p, 1, n)
    reserved = stats()["reserved_bytes.all.current"]
    before = rss_shmem()
    symmem.pause(tag)
    during = rss_shmem()
    assert before - during >= n * 9 // 10, (before, during)
    s = stats()
    assert s["paused_bytes.all.current"] >= n
    assert s["reserved_bytes.all.current"] == reserved - s["paused_bytes.all.current"]
    symmem.resume(tag)
    assert rss_shmem() - during >= n * 9 // 10
    assert ctypes.string_at(p + n - 8, 8) == b"\x01" * 8
    symmem.free(p)
    symmem.empty_cache()


def test_misuse_has_defined_results():
    tag = unique("t")
    with pytest.raises(symmem.InvalidArgumentError, match="never-opened"):
        symmem.pause("never-opened")
    with pytest.raises(symmem.InvalidArgumentError):
        with symmem.region("no spaces"):
            pass
    with symmem.region(tag):
        p = symmem.alloc(4096)
        q = symmem.alloc(4096)
    with pytest.raises(symmem.InvalidArgumentError, match="backup"):
        with symmem.region(tag, backup=True):
            pass
    with pytest.raises(symmem.InvalidStateError):
        symmem.resume(tag)  # live
    symmem.pause(tag)
    with pytest.raises(symmem.InvalidStateError):
        symmem.pause(tag)  # paused
    with pytest.raises(symmem.InvalidStateError, match=tag):
        with symmem.region(tag):
            symmem.alloc(64)
    symmem.free(p)  # bookkeeping only
    paused = stats()["paused_bytes.all.current"]
    symmem.empty_cache()  # leaves paused segments alone
    assert stats()["paused_bytes.all.current"] == paused
    symmem.validate()
    # The memory limit makes the resume run out: nothing mapped, retry works.
    symmem.set_memory_limit(0, stats()["reserved_bytes.all.current"] + 1)
    with pytest.raises(symmem.OutOfMemoryError, match=tag):
        symmem.resume(tag)
    assert stats()["paused_bytes.all.current"] == paused
    symmem.set_memory_limit(0, 0)
    symmem.resume(tag)
    symmem.free(q)
    symmem.validate()


def test_regions_are_per_thread():
    tag = unique("thread")
    seen = {}

    def other():
        seen["ptr"] = symmem.alloc(4096)  # no region open on this thread

    with symmem.region(tag):
        mine = symmem.alloc(4096)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    symmem.pause(tag)
    ctypes.memset(seen["ptr"], 3, 4096)  # untagged: still mapped
    symmem.resume(tag)
    symmem.free(mine)
    symmem.free(seen["ptr"])


def test_collective_pause_across_4_processes():
    world, nbytes = 4, 1 * MiB
    results = run_ranks(collective_pause, world, unique("cp"), nbytes, 3, timeout=120)
    for r, res in enumerate(results):
        assert all(res["same_ptrs"]), (r, res)
        assert all(res["data_ok"]), (r, res)
        assert res["final_ok"], (r, res)
        # Every rank's 2 MiB segment left this process: its own and the
        # three peers' (each read whole before the pause).
        assert all(d >= world * nbytes * 9 // 10 for d in res["drops"]), (r, res["drops"])
        assert all(b == 2 * MiB for b in res["paused_bytes"]), (r, res["paused_bytes"])


def test_a_peer_that_leaves_during_a_collective_pause():
    results = run_ranks(pause_when_a_peer_leaves, 3, unique("die"), 1, timeout=60, allow_errors=True)
    for r, res in enumerate(results):
        if r == 1:
            continue  # exited
        assert res["code"] in (int(symmem.Result.PEER), int(symmem.Result.TIMEOUT)), res
        assert "rank 1" in res["message"], res


def test_the_empty_tag_is_refused_everywhere():
    """"" is not every tag: pause, resume, region and the group calls refuse
    it and nothing is paused."""
    tag = unique("live")
    with symmem.region(tag):
        p = symmem.alloc(4096)
    ctypes.memset(p, 0x42, 4096)
    for call in (symmem.pause, symmem.resume):
        with pytest.raises(symmem.InvalidArgumentError, match="empty"):
            call("")
    with pytest.raises(symmem.InvalidArgumentError, match="empty"):
        symmem.pause("", backup=False)
    with pytest.raises(symmem.InvalidArgumentError):
        with symmem.region(""):
            pass
    with symmem.Group(unique("empty-tag"), 0, 1) as g:
        with pytest.raises(symmem.InvalidArgumentError, match="empty"):
            symmem.pause("", group=g)
        with pytest.raises(symmem.InvalidArgumentError, match="empty"):
            symmem.resume("", group=g)
    assert stats()["paused_bytes.all.current"] == 0
    assert ctypes.string_at(p, 4) == b"\x42" * 4
    symmem.free(p)


def test_pageable_backup_and_per_pause_choices():
    pg, kv = unique("pageable"), unique("kv")
    with symmem.region(pg, backup="pageable"):
        p = symmem.alloc(MiB)
    with symmem.region(kv):
        q = symmem.alloc(MiB)
    with pytest.raises(ValueError, match="pageable"):
        with symmem.region(unique("x"), backup="gpu"):
            pass
    ctypes.memset(p, 0x61, MiB)
    ctypes.memset(q, 0x62, MiB)
    with pytest.raises(symmem.InvalidStateError, match="never paused"):
        symmem.backup_pointer(p, 16)
    symmem.pause(pg)
    host, paused = symmem.backup_pointer(p + 8, 8)
    assert paused and ctypes.string_at(host, 8) == b"\x61" * 8
    symmem.pause(kv, backup=True)
    host, _ = symmem.backup_pointer(q, MiB)
    assert ctypes.string_at(host + MiB - 2, 2) == b"\x62\x62"
    symmem.resume(kv)
    symmem.resume(pg)
    assert ctypes.string_at(q, 2) == b"\x62\x62" and ctypes.string_at(p + MiB - 1, 1) == b"\x61"
    symmem.pause(pg, backup=False)
    with pytest.raises(symmem.InvalidStateError, match="discarded"):
        symmem.backup_pointer(p, 16)
    symmem.resume(pg)
    assert ctypes.string_at(p, 4) == b"\0" * 4
    symmem.pause(pg)
    symmem.resume(pg, zero=False)  # the copy is restored all the same
    assert ctypes.string_at(p, 4) == b"\0" * 4
    with symmem.Group(unique("no-flags"), 0, 1) as g:
        with pytest.raises(ValueError, match="group"):
            symmem.pause(pg, group=g, backup=False)
        with pytest.raises(ValueError, match="group"):
            symmem.resume(pg, group=g, zero=False)
    symmem.free(p)
    symmem.free(q)


def test_default_tag_and_untagged_regions():
    """A default tag tags what every thread allocates outside regions (also
    small blocks, which then skip the thread caches); an untagged region
    opts out; clearing it restores untagged allocations."""
    tag = unique("default")
    symmem.set_default_tag(tag, backup=True)
    try:
        p = symmem.alloc(4096)
        got = []
        t = threading.Thread(target=lambda: got.append(symmem.alloc(4096)))
        t.start()
        t.join()
        with symmem.untagged():
            u = symmem.alloc(4096)
        with symmem.region(unique("inner")):
            with symmem.untagged():
                u2 = symmem.alloc(4096)
    finally:
        symmem.set_default_tag(None)
    after = symmem.alloc(4096)
    for q, v in ((p, 1), (got[0], 2), (u, 3), (u2, 4), (after, 5)):
        ctypes.memset(q, v, 4096)
    symmem.pause(tag)
    # The default tag's blocks are paused; the untagged ones stay readable.
    assert symmem.backup_pointer(p, 4096)[1] and symmem.backup_pointer(got[0], 16)[1]
    for q, v in ((u, 3), (u2, 4), (after, 5)):
        assert ctypes.string_at(q, 1) == bytes([v])
        with pytest.raises(symmem.InvalidStateError, match="no backup"):
            symmem.backup_pointer(q, 16)
    symmem.resume(tag)
    assert ctypes.string_at(p, 1) == b"\1" and ctypes.string_at(got[0] + 4095, 1) == b"\2"
    with pytest.raises(symmem.InvalidArgumentError):
        symmem.set_default_tag("")
    for q in (p, got[0], u, u2, after):
        symmem.free(q)


def test_own_device_is_a_property_of_the_tag():
    """own_device (SYMMEM_REGION_OWN_DEVICE) is fixed by the tag's first
    region like its backup; the memory pauses and resumes with its contents,
    and the default tag takes it too."""
    tag = unique("own")
    with symmem.region(tag, backup=True, own_device=True):
        p = symmem.alloc(MiB)
    with pytest.raises(symmem.InvalidArgumentError, match="own-device mapping true before"):
        with symmem.region(tag, backup=True):
            pass
    with pytest.raises(TypeError, match="own_device must be a bool"):
        with symmem.region(unique("own-bad"), own_device=1):
            pass
    ctypes.memset(p, 0x5d, MiB)
    symmem.pause(tag)
    symmem.resume(tag)
    assert ctypes.string_at(p + MiB - 1, 1) == b"\x5d"
    symmem.free(p)
    default = unique("own-default")
    symmem.set_default_tag(default, own_device=True)
    try:
        q = symmem.alloc(4096)
    finally:
        symmem.set_default_tag(None)
    with pytest.raises(symmem.InvalidArgumentError, match="own-device"):
        with symmem.region(default):
            pass
    symmem.free(q)
