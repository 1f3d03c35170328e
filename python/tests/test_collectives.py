"""Collectives through symmem.Handle (no torch) with real processes, on
either backend (the host backend in CI; GPUs with SYMMEM_REQUIRE_GPU=1). The
values are exact in any summation order, so the checks are exact."""

from __future__ import annotations

import os
import uuid

import pytest

import _workers
from _mp import run_ranks
from symmem import Result

pytestmark = pytest.mark.usefixtures("symmetric")


@pytest.mark.parametrize("world,count", [(2, 1), (2, 1000), (4, 37)])
def test_collectives_through_the_handle(world, count):
    if os.environ.get("SYMMEM_BACKEND") == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", ""):
        pytest.skip("make test-fakecuda: the fake CUDA driver runs no kernels")
    results = run_ranks(_workers.collectives, world, f"coll-{uuid.uuid4().hex[:12]}", count)
    inp = {fmt: [_workers._coll_inputs(r, count, fmt) for r in range(world)] for fmt in ("i", "f")}

    def wrap32(v):
        return (v + 2**31) % 2**32 - 2**31

    isum = [wrap32(sum(col)) for col in zip(*inp["i"])]
    imax = [max(col) for col in zip(*inp["i"])]
    fsum = [sum(col) for col in zip(*inp["f"])]
    fmin = [min(col) for col in zip(*inp["f"])]
    per = (count - count % world) // world
    for rank, res in enumerate(results):
        assert res["sum_inplace"] == isum, rank
        assert res["max_local"] == imax, rank
        assert res["fsum_two_shot"] == fsum, rank
        assert res["fmin_one_shot"] == fmin, rank
        # low_latency (GPUs: the one-crossing kernel; the host backend runs
        # it as one_shot) gives the same numbers.
        assert res["fsum_low_latency"] == fsum, rank
        assert res["gather"] == [v for r in range(world) for v in inp["i"][r]], rank
        assert res["gather_one_shot"] == res["gather"], rank
        assert res["scatter"] == isum[rank * per : (rank + 1) * per], rank
        if "numpy" in res:
            assert res["numpy"] == fsum
        assert res["whole_ok"], rank
        assert res["device_error"] == 0
        errors = res["errors"]
        for what in ("dtype", "op", "count", "misaligned", "overlap", "no_out"):
            assert errors[what] is not None, what
            assert errors[what][:2] == ("InvalidArgumentError", Result.INVALID_ARGUMENT), (what, errors[what])
        assert 'unknown dtype "complex64"' in errors["dtype"][2]
        assert "past the buffer" in errors["count"][2]
        assert "16-byte aligned" in errors["misaligned"][2]
        assert "overlaps the input" in errors["overlap"][2]


@pytest.mark.parametrize("algo", ["one_shot", "two_shot"])
def test_a_late_peer_stops_the_group(algo, host_backend):
    """A late peer: timeout 2 s, rank 1 late by 3 s for #2. Rank
    0's #2 times out; rank 1's late #2 and every later call on both ranks
    fail at once, naming the first failure and what to do, and leave the
    buffer as the caller wrote it: no call returns wrong sums."""
    results = run_ranks(_workers.collectives_late_peer, 2, f"late-{uuid.uuid4().hex[:12]}", 2.0, 3.0, algo)
    for rank, calls in enumerate(results):
        assert calls[1][:3] == ("ok", "", [23.0]), (rank, calls[1])
        first = "this rank's collective timed out waiting for rank 1" if rank == 0 else "rank 0 gave up a collective"
        for call in range(2, 7):
            outcome, msg, held, took = calls[call]
            if rank == 0 and call == 2:
                assert outcome == "TimeoutError", (rank, call, calls[call])
            else:
                assert outcome == "InvalidStateError", (rank, call, calls[call])
                assert f"collectives are stopped since {first}" in msg, (rank, call, msg)
                assert "abort the group (symmem_group_abort), destroy it and create a new one" in msg, msg
                assert took < 1.0, (rank, call, took)
            assert held == [call * 10 + rank + 1], (rank, call, calls[call])


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_whose_ranks_disagree(world, host_backend):
    """Every kind of difference is MismatchError on every rank, naming every
    rank's call, with out untouched; the group still works after it. On the
    host backend the call itself fails; on GPUs the kernels find it and the
    device error flag says so (test_coll_gpu.py,
    test_collectives_whose_ranks_disagree_or_die)."""
    results = run_ranks(_workers.collectives_mismatch, world, f"mis-{uuid.uuid4().hex[:12]}")
    theirs = {
        "count": "all_reduce(float32, sum, count 128, one_shot)",
        "dtype": "all_reduce(int32, sum, count 256, one_shot)",
        "op": "all_reduce(float32, max, count 256, one_shot)",
        "kind": "all_gather(float32, count 256)",
        "algo": "all_reduce(float32, sum, count 256, two_shot)",
    }
    last = world - 1
    for rank, res in enumerate(results):
        for what, call in theirs.items():
            name, code, msg, untouched = res[what]
            assert (name, code) == ("MismatchError", Result.MISMATCH), (rank, what, res[what])
            assert f"rank {last}: {call}" in msg, (rank, what, msg)
            assert "all_reduce(float32, sum, count 256, one_shot)" in msg, (rank, what, msg)
            assert untouched, (rank, what)
        assert res["after"] == "ok"
        name, msg = res["device_error"]  # the flag records the first mismatch
        assert name == "MismatchError" and "called a collective with other arguments" in msg, res["device_error"]
