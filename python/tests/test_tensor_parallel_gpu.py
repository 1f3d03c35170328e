"""The tensor-parallel operators on GPUs: the rank script tests/gpu/tp_check.py
through test_symm_gpu's launcher, and the examples under torchrun.

* tp_check.py ("pair": 2 GPUs, or both ranks on one GPU with
  SYMMEM_ALLOW_OVERLAPPING_DEVICES=1 where there is one):
  all_reduce_rmsnorm bit for bit against the documented rounding, within
  the dtype's rounding of an fp32 reference, the same bits on every rank,
  every algorithm, in a CUDA graph; the fused matmuls against an fp32
  reference and against torch.ops.symm_mem's own, in a CUDA graph, and
  the backward of a tensor-parallel MLP against autograd on one GPU.
* examples/tp_mlp.py and examples/tp_decode.py under torchrun (2 ranks),
  each checking itself against the same block on one GPU and printing OK.

Without torch or a GPU the tests skip and say why; with
SYMMEM_REQUIRE_GPU=1 they fail instead.
"""

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
_results = {}


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    tsg._budget_end = None  # this file's launches get test_symm_gpu's budget afresh
    yield


def _tp_check(tmp_path):
    if "recs" not in _results:
        _results["recs"] = tsg.launch("tp_check.py", "pair", tmp_path, "10")
    return _results["recs"]


def test_norm_and_fused_matmuls_exact_and_close(tmp_path):
    for rec in _tp_check(tmp_path):
        res, rank = rec["result"], rec["rank"]
        assert res["norm_failures"] == [], (rank, res["norm_failures"][:10])
        assert res["norm_checked"] >= 50, res["norm_checked"]
        assert res["norm_graph_bad_replays"] == [], (rank, res["norm_graph_bad_replays"])
        assert res["fused_failures"] == [], (rank, res["fused_failures"][:10])
        assert res["fused_checked"] >= 15, res["fused_checked"]
        assert res["fused_graph_bad_replays"] == 0, rank
        assert res["device_error"] == 0


def test_fused_matmuls_against_torch_symm_mem(tmp_path):
    """The comparisons with torch.ops.symm_mem's fused operators ran (their
    agreement is asserted by the test above); where this torch cannot run
    them, the reason."""
    recs = _tp_check(tmp_path)
    why = recs[0]["result"]["torch_unavailable"]
    if why and len({rec["device"] for rec in recs}) < len(recs):
        # torch's symmetric memory refuses ranks that share a GPU, as the
        # two_gpus layouts are skipped on a machine of one GPU
        pytest.skip(f"torch.ops.symm_mem's fused operators need a GPU per rank, the ranks shared one: {why}")
    if why:
        msg = f"torch.ops.symm_mem's fused operators cannot run here: {why}"
        if tsg.REQUIRE_GPU:
            pytest.fail(msg + " (SYMMEM_REQUIRE_GPU=1)")
        pytest.skip(msg)
    for rec in recs:
        assert len(rec["result"]["bit_equal_to_torch"]) == 7, rec["result"]["bit_equal_to_torch"]
        print(f"rank {rec['rank']}: bit-equal to torch's: {rec['result']['bit_equal_to_torch']}")


@pytest.mark.parametrize("script,args", [
    ("tp_mlp.py", []),
    ("tp_mlp.py", ["--dtype", "float32", "--tokens", "1024", "--ffn", "4096"]),
    ("tp_decode.py", []),
    ("tp_decode.py", ["--tokens", "128", "--hidden", "8192", "--inter", "8192"]),
])
def test_examples_under_torchrun(tmp_path, script, args):
    devices, overlap = tsg.layout("pair")
    env = tsg._base_env()
    if overlap:
        env["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29400 + os.getpid() % 500), str(REPO / "examples" / script), *args]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=tsg.LAUNCH_TIMEOUT, cwd=str(tmp_path))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {tsg.LAUNCH_TIMEOUT:.0f} s\n{(exc.stdout or '')[-3000:]}")
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    # Both ranks write to one pipe, unbuffered: their lines may interleave.
    oks = re.findall(r"OK rank \d", r.stdout)
    assert len(oks) == 2, r.stdout[-4000:]
