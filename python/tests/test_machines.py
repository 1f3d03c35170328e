"""Groups across machines (docs/machines.md), imitated on one host: every
rank claims a machine with SYMMEM_MACHINE_ID and has that machine's socket
directory. Layouts: 2 x 2 ranks and 3 x 1.

Over the NCCL stand-in, collectives, barriers and remote signals cross the
imitated machines through its typed collectives and 2.29 one-sided
signals; all-reduce runs in every form (auto, hierarchical, nccl); every
all-to-all form crosses them through its ncclSend/ncclRecv (2 x 2 and
2 + 1 ranks)."""

from __future__ import annotations

import os
import uuid

import pytest

import _machine_workers as mw
import symmem
from _mp import run_ranks
from conftest import REPO_DIR
from symmem import Result

FAKE = os.environ.get("FAKENCCL_LIB", str(REPO_DIR / "build" / "libnccl_fake.so"))
FAKE228 = str(REPO_DIR / "build" / "libnccl_fake_228.so")

LAYOUTS = {"2x2": [0, 0, 1, 1], "3x1": [0, 1, 2]}

pytestmark = pytest.mark.usefixtures("symmetric")


def job(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def check_layout(infos, machines):
    world = len(machines)
    for rank, info in enumerate(infos):
        team = [r for r in range(world) if machines[r] == machines[rank]]
        assert info["local"] == (team.index(rank), len(team))
        assert info["is_local"] == [machines[r] == machines[rank] for r in range(world)]
        assert info["mapped"] == info["is_local"]
        assert info["pads"] == info["is_local"]
        assert info["mapped_peers"] == len(team) - 1
        assert f'machine "m{machines[rank]}"' in info["machine"]
        assert info["writes_ok"]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_allgather_group_spans_machines(tmp_path, layout):
    machines = LAYOUTS[layout]
    world = len(machines)
    infos = run_ranks(mw.allgather_group, world, machines, str(tmp_path / "store"), job("mm-ag"),
                      env=mw.machine_env(machines, str(tmp_path / "sock")))
    check_layout(infos, machines)
    for rank, info in enumerate(infos):
        remote = next(r for r in range(world) if machines[r] != machines[rank])
        code, msg = info["remote_view"]
        assert code == Result.INVALID_ARGUMENT
        assert f"rank {remote} is on another machine" in msg and f'machine "m{machines[remote]}"' in msg
        for what, err in info["errors"].items():
            assert err is not None, what
            code, msg = err
            assert code == Result.UNAVAILABLE and "engine between machines" in msg, (what, msg)


def test_socket_group_needs_one_machine(tmp_path):
    sock = tmp_path / "shared"
    sock.mkdir(mode=0o700)
    machines = [0, 0, 1]
    env = lambda r: {"SYMMEM_MACHINE_ID": f"m{machines[r]}", "SYMMEM_SOCKET_DIR": str(sock)}  # noqa: E731
    for err in run_ranks(mw.socket_group, 3, job("mm-sock"), env=env):
        code, msg = err
        assert code == Result.MISMATCH
        assert "different machines" in msg and 'ranks 0, 1: machine "m0"' in msg and 'rank 2: machine "m1"' in msg


# The ranks' own limits (the group's timeout, the NCCL stand-in's
# FAKENCCL_TIMEOUT_MS) end a stuck wait with a message naming it; the
# launcher waits well past them, so that on a loaded machine a slow run
# still reports its own cause rather than the launcher's timeout.
RANKS_SECONDS = 300.0


@pytest.fixture
def fake_nccl(monkeypatch):
    assert os.path.isfile(FAKE), f"the NCCL stand-in is not built: make {FAKE}"
    monkeypatch.setenv("SYMMEM_LIBNCCL", FAKE)
    monkeypatch.setenv("FAKENCCL_TIMEOUT_MS", "60000")


@pytest.mark.skipif(symmem.backend_name() == "cuda" and not os.environ.get("SYMMEM_LIBCUDA"),
                    reason="the NCCL stand-in works on host memory")
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_nccl_group_spans_machines(fake_nccl, tmp_path, layout):
    machines = LAYOUTS[layout]
    infos = run_ranks(mw.nccl_group, len(machines), machines, job("mm-nccl"), False,
                      env=mw.machine_env(machines, str(tmp_path / "sock")), timeout=RANKS_SECONDS)
    check_layout(infos, machines)
    assert all(info["window"] for info in infos)


@pytest.mark.skipif(symmem.backend_name() == "cuda" and not os.environ.get("SYMMEM_LIBCUDA"),
                    reason="the NCCL stand-in works on host memory")
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("lib", ["2.29", "2.28"])
def test_nccl_collectives_across_machines(fake_nccl, monkeypatch, tmp_path, layout, lib):
    if lib == "2.28":
        monkeypatch.setenv("SYMMEM_LIBNCCL", FAKE228)
    machines = LAYOUTS[layout]
    infos = run_ranks(mw.nccl_group, len(machines), machines, job("mm-coll"), True,
                      env=mw.machine_env(machines, str(tmp_path / "sock")), timeout=RANKS_SECONDS)
    check_layout(infos, machines)
    for info in infos:
        bad = [k for k, ok in info["collectives"].items() if not ok]
        assert not bad, bad
        assert any("/hierarchical/" in k for k in info["collectives"])
        if lib == "2.29":
            assert info["remote_signal"] is None
        else:
            code, msg = info["remote_signal"]
            assert code == Result.UNAVAILABLE and "2.29" in msg


@pytest.mark.skipif(symmem.backend_name() == "cuda" and not os.environ.get("SYMMEM_LIBCUDA"),
                    reason="the NCCL stand-in works on host memory")
@pytest.mark.parametrize("machines", [[0, 0, 1, 1], [0, 0, 1]], ids=["2x2", "2x1"])
def test_nccl_all_to_all_across_machines(fake_nccl, tmp_path, machines):
    results = run_ranks(mw.nccl_all_to_all, len(machines), machines, job("mm-a2a"),
                        env=mw.machine_env(machines, str(tmp_path / "sock")), timeout=RANKS_SECONDS)
    for rank, res in enumerate(results):
        assert len(res) == 3 + 8 + 1, (rank, sorted(res))
        wrong = {k: v for k, v in res.items() if v is not None}
        assert not wrong, (rank, wrong)
