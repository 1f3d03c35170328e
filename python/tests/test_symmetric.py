"""Symmetric memory with real processes: every rank is a spawned process.

The rank functions (tests/_workers.py) move data with Buffer.read/write, so
these tests run on either backend; on the cuda backend (SYMMEM_REQUIRE_GPU=1)
ranks use GPU rank % device_count.
"""

from __future__ import annotations

import time
import uuid

import pytest

import _workers
import symmem
from _mp import run_ranks
from symmem import Result

pytestmark = pytest.mark.usefixtures("symmetric")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_writes_every_peer(world):
    results = run_ranks(_workers.write_every_peer, world, unique("all"), 1 << 16)
    for rank, info in enumerate(results):
        assert info["rank"] == rank and info["world_size"] == world
        assert info["offset"] == 0 and info["buffer_size"] >= 1 << 16
        assert info["own_ptr_ok"] and info["distinct_ptrs"] and info["distinct_pads"]
        assert info["signal_pad_size"] >= 4 * world
        assert info["slots_ok"] == [True] * world
        assert info["peer_read_ok"]
    assert len({info["buffer_size"] for info in results}) == 1


def test_rendezvous_on_an_interior_pointer():
    results = run_ranks(_workers.write_every_peer, 2, unique("interior"), 8192, "", 1024)
    for info in results:
        assert info["offset"] == 1024
        assert info["slots_ok"] == [True, True]


@pytest.mark.parametrize("world", [2, 4])
def test_signals_go_round_the_ring(world):
    rounds = 5
    results = run_ranks(_workers.signal_ring, world, unique("ring"), rounds)
    for rank, res in enumerate(results):
        want = [r * world + rank for r in range(rounds)] if rank else [r * world + world for r in range(rounds)]
        assert res["seen"] == want, (rank, res)
        errors = res["errors"]
        if res["kind"] == "host":
            name, code, is_timeout = errors["wait_timeout"]
            assert (name, code, is_timeout) == ("TimeoutError", Result.TIMEOUT, True)
        for what in ("bad_channel", "bad_rank", "negative_rank"):
            assert errors[what][:2] == ("InvalidArgumentError", Result.INVALID_ARGUMENT), (what, errors[what])
            assert errors[what][2]


@pytest.mark.parametrize("world", [2, 3])
def test_mismatched_sizes_fail_on_every_rank(world):
    results = run_ranks(_workers.mismatched_sizes, world, unique("mismatch"), timeout=90)
    for rank, res in enumerate(results):
        assert res["raised"] == "MismatchError", (rank, res)
        assert res["code"] == Result.MISMATCH
        assert res["message"]


@pytest.mark.parametrize("world", [2, 4])
def test_python_allgather_over_a_file_store(world, tmp_path):
    store_dir = tmp_path / "store"
    results = run_ranks(_workers.write_every_peer, world, unique("cb"), 1 << 14, str(store_dir))
    for info in results:
        assert info["slots_ok"] == [True] * world
        assert info["store_sets"] >= 2  # the group and the rendezvous went through it
    # Old records are deleted as the protocol goes: at most two per rank remain.
    left = [p for p in store_dir.iterdir()]
    assert len(left) <= 2 * world


def test_failing_python_allgather_is_the_cause():
    results = run_ranks(_workers.failing_allgather, 2, unique("boom"), timeout=60)
    for res in results:
        assert res["raised"] is not None and res["cause"] == "ValueError", res
        assert "no all-gather today" in res["cause_msg"]


def test_two_handles_outlive_their_group():
    for res in run_ranks(_workers.rendezvous_twice, 2, unique("twice")):
        assert tuple(res["got"]) == res["want"]


def test_placement_is_the_same_on_every_rank():
    results = run_ranks(_workers.placement, 3, 1234, 200)
    assert results[0] and results[0] == results[1] == results[2]


def test_group_times_out_naming_missing_ranks():
    t0 = time.monotonic()
    with pytest.raises(symmem.TimeoutError) as info:
        symmem.Group(unique("alone"), 0, 3, timeout=1.0)
    assert time.monotonic() - t0 < 30
    assert info.value.code == Result.TIMEOUT
    assert isinstance(info.value, TimeoutError)
    assert "1" in info.value.message and "2" in info.value.message


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "slash/name", "ünï"])
def test_bad_group_names(name):
    with pytest.raises(symmem.InvalidArgumentError):
        symmem.Group(name, 0, 1)


def test_bad_rank_and_world():
    for rank, world in ((1, 1), (-1, 2), (0, 0)):
        with pytest.raises(symmem.SymmemError) as info:
            symmem.Group(unique("bad"), rank, world, timeout=1.0)
        assert info.value.code == Result.INVALID_ARGUMENT


def test_single_rank_group(clean_device):
    with symmem.Group(unique("solo"), 0, 1, timeout=10) as g:
        assert (g.rank, g.world_size, g.device) == (0, 1, 0)
        with symmem.empty(4096) as buf, symmem.rendezvous(buf, g) as h:
            assert h.buffer_ptrs == [buf.ptr]
            assert h.get_buffer(0).ptr == buf.ptr
            h.get_buffer(0).write(b"\x09")
            assert buf.read(0, 1) == b"\x09"
            h.barrier(timeout=5)
            h.put_signal(0)
            h.wait_signal(0, timeout=5)
            with pytest.raises(symmem.InvalidArgumentError):
                h.get_buffer(1)
            with pytest.raises(symmem.InvalidArgumentError):
                h.get_buffer(0, nbytes=h.buffer_size + 1)
            assert "Handle" in repr(h)
        with pytest.raises(symmem.InvalidStateError):
            h.barrier()
    with pytest.raises(symmem.InvalidStateError):
        g.rendezvous(0)


def test_handle_description_and_release(clean_device):
    """A handle's attributes match the library's getters, stay readable
    after release, and a handle dropped without release() is released when
    it is collected."""
    import gc

    lib = symmem._lib.lib()
    with symmem.Group(unique("desc"), 0, 1, timeout=10) as g, symmem.empty(4096) as buf:
        first = symmem.rendezvous(buf.ptr + 64, g)
        for _ in range(3):  # again on the same buffer: the same description
            h = symmem.rendezvous(buf.ptr + 64, g)
            p = h.ptr
            assert (h.rank, h.world_size, h.offset) == (0, 1, 64)
            assert h.buffer_size == lib.symmem_handle_buffer_size(p) and h.buffer_size >= 4096
            assert h.signal_pad_size == lib.symmem_handle_signal_pad_size(p)
            assert h.buffer_ptrs == [buf.ptr] == first.buffer_ptrs
            assert h.signal_pad_ptrs == [lib.symmem_handle_signal_pad_ptr(p, 0)] == first.signal_pad_ptrs
            assert h.buffer_ptrs_dev == lib.symmem_handle_buffer_ptrs_dev(p)
            assert h.signal_pad_ptrs_dev == lib.symmem_handle_signal_pad_ptrs_dev(p)
            assert h.mapped_peers == lib.symmem_handle_mapped_peers(p) == 0
            assert h.kind == symmem.backend_name() and h.device == g.device
            h.release()
            h.release()  # twice is fine
            assert h.buffer_ptrs == [buf.ptr] and h.mapped_peers == 0 and "released" in repr(h)
            with pytest.raises(symmem.InvalidStateError):
                h.ptr
            assert lib.symmem_handle_rank(p) == -1  # no longer a live handle
        h = symmem.rendezvous(buf, g)
        p = h.ptr
        assert lib.symmem_handle_rank(p) == 0
        del h
        gc.collect()
        assert lib.symmem_handle_rank(p) == -1  # released by the collection
        first.release()


def test_peer_views_as_memoryviews(host_backend):
    with symmem.Group(unique("mv"), 0, 1, timeout=10) as g, symmem.empty(256) as buf:
        with symmem.rendezvous(buf.ptr + 128, g) as h:
            view = h.get_buffer(0, nbytes=16, offset=8)
            assert view.ptr == buf.ptr + 128 + 8 and not view.owning
            view.memoryview()[:] = b"p" * 16
            assert buf.read(136, 16) == b"p" * 16
            pad = h.get_signal_pad(0)
            assert pad.nbytes == h.signal_pad_size and pad.ptr == h.signal_pad_ptrs[0]
            assert h.buffer_ptrs_dev and h.signal_pad_ptrs_dev


def test_rendezvous_on_a_foreign_pointer():
    import ctypes

    mem = ctypes.create_string_buffer(4096)
    with symmem.Group(unique("foreign"), 0, 1, timeout=10) as g:
        with pytest.raises(symmem.SymmemError) as info:
            symmem.rendezvous(ctypes.addressof(mem), g)
        assert info.value.code in (Result.INVALID_POINTER, Result.INVALID_ARGUMENT)
