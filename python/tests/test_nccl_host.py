"""Groups over an NCCL communicator without a GPU: the NCCL stand-in
(build/libnccl_fake.so from cuda/testdata/fakenccl.c) on the host backend
or the fake driver. On a GPU (the real cuda backend) the stand-in cannot
reach device memory: there tests/gpu/nccl_*.py run the same path on NCCL."""

from __future__ import annotations

import os
import uuid

import pytest

import _nccl_workers
import symmem
from _mp import run_ranks
from conftest import REPO_DIR
from symmem import Result

FAKE = os.environ.get("FAKENCCL_LIB", str(REPO_DIR / "build" / "libnccl_fake.so"))

pytestmark = [
    pytest.mark.usefixtures("symmetric"),
    pytest.mark.skipif(
        symmem.backend_name() == "cuda" and not os.environ.get("SYMMEM_LIBCUDA"),
        reason="the NCCL stand-in works on host memory; on GPUs python/tests/gpu/nccl_*.py run the NCCL path",
    ),
]


@pytest.fixture
def fake_nccl(monkeypatch):
    assert os.path.isfile(FAKE), f"the NCCL stand-in is not built: make {FAKE}"
    monkeypatch.setenv("SYMMEM_LIBNCCL", FAKE)
    monkeypatch.setenv("FAKENCCL_TIMEOUT_MS", "60000")


def job(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("world", [2, 4])
def test_group_over_nccl_registers_each_segment_once(fake_nccl, world):
    results = run_ranks(_nccl_workers.group_over_comm, world, job("py-nccl"))
    for rank, info in enumerate(results):
        assert info["version"] == 22900
        assert info["group"] == (rank, world, 0)
        win, off = info["window"]
        assert win != 0 and 0 <= off < (3 << 20)
        assert info["same_window"]
        assert info["counts_after_two"] == (1, 0, 1)  # two rendezvous, one registration
        assert info["slots_ok"] == [True] * world
        assert info["counts_after_release"] == (1, 1, 0)  # deregistered before the segment went
        assert info["nowin_window"] is None and info["nowin_counts"] == (0, 0, 0)


def test_mismatch_fails_everywhere_before_registration(fake_nccl):
    for info in run_ranks(_nccl_workers.mismatch, 2, job("py-nccl-mm")):
        assert info["code"] == Result.MISMATCH, info
        assert info["counts"] == (0, 0, 0)


def test_missing_and_too_old_nccl_are_unavailable(monkeypatch):
    monkeypatch.setenv("SYMMEM_LIBNCCL", "/nonexistent/libnccl.so.2")
    (info,) = run_ranks(_nccl_workers.unavailable, 1, "missing")
    assert info["code"] == Result.UNAVAILABLE and "/nonexistent/libnccl.so.2" in info["msg"]
    monkeypatch.setenv("SYMMEM_LIBNCCL", FAKE)
    monkeypatch.setenv("FAKENCCL_VERSION", "22605")
    (info,) = run_ranks(_nccl_workers.unavailable, 1, "old")
    assert info["code"] == Result.UNAVAILABLE and "2.26.5" in info["msg"] and "2.28.0" in info["msg"]
