"""The copy-engine collectives (algo "copy_engine", sm_free=True) through
symmem.Handle with real processes, on either backend (the host backend in
CI, where the copies are memcpy; GPUs with SYMMEM_REQUIRE_GPU=1). Exact
values, so the checks are exact."""

from __future__ import annotations

import os
import uuid

import pytest

import _ce_workers
from _mp import run_ranks
from _workers import _coll_inputs
from symmem import Result
from symmem._enums import ALGOS

pytestmark = pytest.mark.usefixtures("symmetric")


def test_copy_engine_is_an_algo():
    assert ALGOS["copy_engine"] == 6


@pytest.mark.parametrize("world,count", [(2, 1), (2, 1000), (3, 37), (4, 64)])
def test_copy_engine_collectives(world, count):
    if os.environ.get("SYMMEM_BACKEND") == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", ""):
        pytest.skip("make test-fakecuda: the fake CUDA driver runs no kernels (the reductions need one)")
    results = run_ranks(_ce_workers.copy_engine, world, f"ce-{uuid.uuid4().hex[:12]}", count)
    per = count - count % world
    inp = {fmt: [_coll_inputs(r, count, fmt) for r in range(world)] for fmt in ("i", "f")}
    inp_per = {fmt: [_coll_inputs(r, per, fmt) for r in range(world)] for fmt in ("i", "f")}

    def wrap32(v):
        return (v + 2**31) % 2**32 - 2**31

    isum = [wrap32(sum(col)) for col in zip(*inp["i"])]
    imax = [max(col) for col in zip(*inp["i"])]
    fsum = [sum(col) for col in zip(*inp["f"])]
    fmin = [min(col) for col in zip(*inp["f"])]
    isum_per = [wrap32(sum(col)) for col in zip(*inp_per["i"])]
    fmax_per = [max(col) for col in zip(*inp_per["f"])]
    chunk = per // world
    for rank, res in enumerate(results):
        assert res["sum_inplace"] == isum, rank
        assert res["max_local"] == imax, rank
        assert res["fsum_block"] == fsum, rank
        assert res["fmin_local"] == fmin, rank
        assert res["gather"] == [v for r in range(world) for v in inp["i"][r]], rank
        assert res["scatter"] == isum_per[rank * chunk:(rank + 1) * chunk], rank
        assert res["fscatter_max"] == fmax_per[rank * chunk:(rank + 1) * chunk], rank
        assert res["a2a"] == [v for s in range(world) for v in inp_per["i"][s][rank * chunk:(rank + 1) * chunk]], rank
        assert res["device_error"] == 0
        errors = res["errors"]
        assert errors["contradiction"][:2] == ("InvalidArgumentError", Result.INVALID_ARGUMENT), errors
        assert 'sm_free=True runs the call on the copy engines (algo "copy_engine"), but algo is "one_shot"' in errors["contradiction"][2]
        assert errors["not_bool"][:2] == ("InvalidArgumentError", Result.INVALID_ARGUMENT), errors
        assert "sm_free must be True or False" in errors["not_bool"][2]


def test_leave_sms_makes_auto_the_copy_engines(host_backend):
    world = 2
    results = run_ranks(_ce_workers.leave_sms, world, f"sms-{uuid.uuid4().hex[:12]}",
                        env=lambda r: {"SYMMEM_LEAVE_SMS": "1"})
    for rank, res in enumerate(results):
        assert res["mismatch"] is not None and res["mismatch"][:2] == ("MismatchError", Result.MISMATCH), res
        msg = res["mismatch"][2]
        assert "rank 0: all_reduce(int32, sum, count 4, copy_engine)" in msg, msg
        assert "rank 1: all_reduce(int32, sum, count 4, one_shot)" in msg, msg
        assert res["sum"] == [3] * 4, res
