"""The copy-engine collectives on GPUs (algo "copy_engine", sm_free=True):
tests/gpu/ce_check.py through test_symm_gpu's launcher, on 2 GPUs, and the
FSDP example under torchrun. Exact against torch references and NCCL (see
the rank script); a CUDA graph of every form; what runs on the GPU. Without
torch or a GPU the tests skip and say why; with SYMMEM_REQUIRE_GPU=1 they
fail instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import test_symm_gpu as tsg

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    tsg._budget_end = None
    yield


def test_copy_engine_collectives_two_gpus(tmp_path, monkeypatch):
    # auto takes the copy engines for uncaptured all-gathers of 2 ranks
    # from this size per rank on.
    monkeypatch.setenv("SYMMEM_CE_ALL_GATHER_MIN_BYTES", "1M")
    records = tsg.launch("ce_check.py", "two_gpus", tmp_path, str(64 << 20))
    for rec in records:
        res = rec["result"]
        world = rec["world"]
        assert res["failures"] == [], res["failures"]
        assert res["checked"] > 300, res["checked"]
        assert res["device_error"] == 0 and res["device_error_after_graph"] == 0, res
        assert res["graph_warm"] == [None] * 4, res["graph_warm"]
        assert all(v is None for v in res["graph"].values()), res["graph"]
        refused = res["capture_without_scratch"]
        assert refused is not None and refused[0] == "InvalidStateError", refused
        assert "cannot be made inside a CUDA-graph capture: run the call once before capturing" in refused[1], refused
        act = res["activity"]
        # No kernel moves an all-gather's or all-to-all's bytes: the copies
        # (our own part and one per peer) and the stream's memory operations.
        for what in ("all_gather", "all_to_all"):
            assert act[what]["kernels"] == [] and act[what]["other"] == [], (what, act[what])
            assert act[what]["copies"] == world, (what, act[what])
        assert act["all_reduce"]["kernels"] == ["symmem_ce_reduce_bfloat16_sum"], act["all_reduce"]
        assert act["all_reduce"]["copies"] == world - 1, act["all_reduce"]
        assert act["all_gather_sm"]["kernels"] == ["symmem_all_gather"], act["all_gather_sm"]
        auto = act["all_gather_auto"]
        if world == 2:
            assert auto["kernels"] == [] and auto["copies"] == world, auto
        else:
            assert auto["kernels"] == ["symmem_all_gather"], auto


def test_fsdp_overlap_example_under_torchrun(tmp_path):
    """examples/fsdp_overlap.py: all-gathers of parameter shards on a side
    stream on the copy engines beside matmuls, checked against a reference."""
    tsg.layout("two_gpus")  # skips (or fails) without 2 GPUs
    env = tsg._base_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29400 + os.getpid() % 500), str(REPO / "examples" / "fsdp_overlap.py")]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in 300 s\n{(exc.stdout or '')[-3000:]}")
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    # Two ranks' lines may interleave on one line: count the marks.
    assert len(re.findall(r"OK rank \d", r.stdout)) == 2, r.stdout[-3000:]


def test_a_stuck_copy_engine_call_is_failed_by_the_watchdog(tmp_path):
    """ce_stuck.py: the stream of a copy-engine call that a peer never
    answers (or answers with other arguments) moves on after the group's
    timeout (3 s), and the next call names the cause; a late peer's call
    does not meet the given-up one."""
    for rec in tsg.launch("ce_stuck.py", "two_gpus", tmp_path):
        rank, res = rec["rank"], rec["result"]
        for case, calls in res.items():
            assert calls["1"]["raised"] is None, (rank, case, calls["1"])
            # The call whose waits are never answered, and the next one.
            stuck, after = ("3", "4") if case == "absent" and rank == 1 else ("2", "3")
            assert calls[stuck]["raised"] is None and 3.0 <= calls[stuck]["seconds"] < 20.0, (rank, case, calls[stuck])
            if case == "absent" and rank == 1:
                want = "collectives are stopped since rank 0 gave up a collective"
            elif case == "absent":
                want = "timed out waiting for rank 1"
            else:
                want = f"rank {1 - rank} called a collective with other arguments than this rank"
            assert calls[after]["raised"] == "InvalidStateError", (rank, case, calls[after])
            assert want in calls[after]["message"], (rank, case, calls[after])
