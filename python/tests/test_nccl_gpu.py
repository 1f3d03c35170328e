"""Groups over NCCL communicators on GPUs (tests/gpu/nccl_torch.py), one
rank per GPU: NCCL refuses two ranks on one GPU, so the overlapping layouts
of test_symm_gpu.py do not apply (the NCCL stand-in covers 4 ranks in CI:
tests/c/test_nccl.c, test_nccl_host.py). Skips without torch or GPUs,
fails instead with SYMMEM_REQUIRE_GPU=1 (two_gpus still skips on one GPU)."""

from __future__ import annotations

import pytest

import test_symm_gpu as tsg
from test_symm_gpu import launch, parts, where

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    # This file's launches get test_symm_gpu's budget afresh.
    tsg._budget_end = None
    yield


@pytest.mark.parametrize("mode", ["two_gpus", "all_gpus"])
def test_nccl_groups_windows_and_collectives(mode, tmp_path):
    recs = launch("nccl_torch.py", mode, tmp_path)
    world = len(recs)
    for rec, r in zip(recs, parts(recs, "torch")):
        at = where(rec, "torch")
        assert r["nccl_group"] and r["window"], (at, r)
        assert tuple(r["counts_first"]) == (1, 0, 1), (at, r)
        assert tuple(r["counts_again"]) == (1, 0, 1), f"{at}: a second rendezvous registered again: {r}"
        assert r["every_peer"] == [], (at, r["every_peer"])
        for op in ("all_reduce", "all_reduce_bf16", "all_gather", "reduce_scatter"):
            assert r[op] is None, f"{at}: {op} on registered libsymmem tensors is wrong: {r[op]}"
        reg, dereg, live = r["counts_after_collectives"]
        assert reg == live + dereg and live >= 1, (at, r)
        lc = r["loop_counts"]
        assert all(r["loop_ok"]), (at, r["loop_ok"])
        assert lc["after"][2] == 0 and lc["after"][0] == lc["after"][1], f"{at}: windows leak: {lc}"
        assert lc["after"][0] - lc["before"][0] == 6 and lc["live_max"] <= 1, (at, lc)
    for rec, r in zip(recs, parts(recs, "c_comm")):
        at = where(rec, "c_comm")
        assert r["version"] >= 22800, (at, r)
        assert r["group"] == [rec["rank"], world, rec["device"]], (at, r)
        assert r["window"] and r["every_peer"] == [], (at, r)
        assert tuple(r["counts"]) == (1, 1, 0), (at, r)
    for rec, r in zip(recs, parts(recs, "pool")):
        assert r["all_reduce"] is None, (where(rec, "pool"), r)
    for rec, r in zip(recs, parts(recs, "destroy")):
        at = where(rec, "destroy")
        assert r["sum_before"] and r["sum_after"] and r["new_group"], (at, r)
        assert r["released_handle"] != "worked", f"{at}: a handle of the destroyed group still works: {r}"


def test_nccl_lazy_communicator(tmp_path):
    recs = launch("nccl_torch.py", "two_gpus", tmp_path, "lazy")
    for rec in recs:
        r = rec["result"]
        at = where(rec)
        if r["outcome"] == "error":
            assert "device_id=" in r["message"], (at, r)
        else:
            assert r["outcome"] == "worked" and r["window"], (at, r)
        assert r["after_collective_window"], (at, r)


def test_nccl_all_to_all_imitated_machines(tmp_path):
    """Two GPUs as two machines of one GPU each (gpu/a2a_machines.py): every
    all-to-all form through NCCL's ncclSend/ncclRecv, exact; the equal
    form also from a CUDA graph; the overrun fails the receiver alone."""
    recs = launch("a2a_machines.py", "two_gpus", tmp_path)
    for rec, r in zip(recs, parts(recs, "a2a")):
        at = where(rec, "a2a")
        assert r["machines"] == [1, [q == rec["rank"] for q in range(len(recs))]], (at, r["machines"])
        wrong = {k: v for k, v in r.items() if k != "machines" and v is not None}
        assert not wrong, (at, wrong)
        assert len(r) == 1 + 2 + 8 + 1, (at, sorted(r))
