"""Collectives on GPUs (libsymmem's kernels, compiled at run time with
NVRTC): the rank scripts tests/gpu/coll_*.py through test_symm_gpu's
launcher, and a user kernel built with nvcc on include/symmem_device.cuh.

Every comparison is exact: the references are computed with torch in the
order the kernels reduce (Note [Collectives]: fp32 accumulation in rank
order, rounded once), so bf16/fp16/fp32 and int32 results must be equal
bit for bit. Without torch or a GPU the tests skip and say why; with
SYMMEM_REQUIRE_GPU=1 they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import test_symm_gpu as tsg

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    # This file's launches get test_symm_gpu's budget afresh.
    tsg._budget_end = None
    yield


def _check(records, *, graph=False):
    for rec in records:
        res = rec["result"]
        if graph:
            assert res["warm"] is None and res["graph"] is None, res
            assert res["two_streams_wrong"] == [], res
            assert res["view_graph"] is None, res["view_graph"]
            assert res["device_error_after_graph"] == 0 and res["device_error"] == 0, res
        else:
            assert res["failures"] == [], res["failures"]
            assert res["checked"] > 100
            assert all(v is None or v is True for v in res["torch"].values()), res["torch"]
            assert res["device_error"] == 0
            assert res["kernels"]["arch"] >= 70, res["kernels"]


def test_collectives_two_gpus_4b_to_256mib(tmp_path):
    _check(tsg.launch("coll_check.py", "two_gpus", tmp_path, str(256 << 20)))


def test_collectives_eight_ranks_over_shared_gpus(tmp_path):
    _check(tsg.launch("coll_check.py", "overlap8", tmp_path, str(1 << 20)))


def test_collectives_four_ranks_on_one_gpu(tmp_path):
    _check(tsg.launch("coll_check.py", "overlap4", tmp_path, str(64 << 10)))


def test_graph_capture_1000_replays_and_two_streams(tmp_path):
    _check(tsg.launch("coll_graph.py", "pair", tmp_path, "1000"), graph=True)


def test_user_kernel_built_with_nvcc(tmp_path):
    devices, overlap = tsg.layout("pair")
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        if tsg.REQUIRE_GPU:
            pytest.fail("nvcc not found (SYMMEM_REQUIRE_GPU=1)")
        pytest.skip("nvcc not found")
    import symmem

    lib = Path(symmem.library_path())
    exe = tmp_path / "user_kernel"
    cmd = [nvcc, "-O2", "-std=c++17", "-arch=native", f"-I{REPO / 'include'}", "-o", str(exe),
           str(tsg.GPU_DIR / "user_kernel.cu"), f"-L{lib.parent}", "-lsymmem", f"-Xlinker=-rpath={lib.parent}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    env = tsg._base_env()
    if overlap:
        env["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    name = f"uk{uuid.uuid4().hex[:10]}"
    procs = [subprocess.Popen([str(exe), str(rank), str(len(devices)), str(dev), name], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, dev in enumerate(devices)]
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the user kernel's ranks did not finish in 120 s")
        outs.append((p.returncode, o, e))
    for rank, (rc, o, e) in enumerate(outs):
        assert rc == 0 and "RESULT ok" in o, f"rank {rank}: exit {rc}\n{o}\n{e}"


def test_a_late_peer_stops_the_group(tmp_path):
    """A late peer on 2 GPUs (docs/diagnostics.md, "A collective timed out"):
    symmem.torch.all_reduce in place on a group with timeout 2 s, rank 1
    late by 3 s for #2, at 4 KiB (the low-latency kernel) and 4 MiB (the
    barrier kernels). Rank 0's #2 kernel gives up and rank 1's late #2
    kernel refuses to run: both leave the tensor as its rank wrote it. Every
    later call raises InvalidStateError naming the first failure, with the
    tensor untouched: no call ever leaves a wrong sum."""
    for rec in tsg.launch("coll_late_peer.py", "two_gpus", tmp_path):
        rank = rec["rank"]
        first = "this rank's collective timed out waiting for rank 1" if rank == 0 else "rank 0 gave up a collective"
        for label, res in rec["result"].items():
            calls = res["calls"]
            assert calls["1"]["raised"] is None and calls["1"]["state"] == "sum", (rank, label, calls["1"])
            assert calls["2"]["state"] == "input", (rank, label, calls["2"])
            for call in ("3", "4", "5", "6"):
                c = calls[call]
                assert c["raised"] == "InvalidStateError", (rank, label, call, c)
                assert f"collectives are stopped since {first}" in c["message"], (rank, label, call, c)
                assert "abort the group (symmem_group_abort), destroy it and create a new one" in c["message"], c
                assert c["state"] == "input", (rank, label, call, c)
            assert all(c["state"] != "wrong" for c in calls.values()), (rank, label, calls)


@pytest.mark.parametrize("mode", ["overlap2", "overlap4"])
def test_collectives_whose_ranks_disagree_or_die(tmp_path, mode):
    """docs/diagnostics.md on the GPU, ranks sharing one GPU: a mismatched
    all-reduce leaves out untouched and the flag says MISMATCH on every rank
    (or, where the group had stopped before the rank's kernel started, the
    stop and its cause);
    an all-reduce whose last rank exits returns soon after the exit and the
    flag says PEER naming it."""
    recs = tsg.launch("coll_disagree.py", mode, tmp_path)
    world = len(recs)
    for rec in recs:
        res = rec["result"]
        m = res["mismatch"]
        # Every rank raises MismatchError: the rank that found the
        # difference says so; a rank whose kernel started after a peer had
        # stopped the group's collectives (Note [Failed collectives]) names
        # the stop and its cause.
        assert m["raised"] == "MismatchError" and (
            "called a collective with other arguments" in m["message"]
            or "found other collective arguments" in m["message"]), m
        assert m["untouched"], m
        assert m["seconds"] < res["timeout"] / 2, m
        if rec["rank"] == world - 1:
            continue
        d = res["dead"]
        assert d["raised"] == "PeerError" and f"rank {world - 1}'s process exited" in d["message"], d
        assert d["seconds"] < 0.3 + 5, d
