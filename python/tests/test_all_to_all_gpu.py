"""All-to-all on GPUs: the rank scripts tests/gpu/a2a_*.py through
test_symm_gpu's launcher, and the MoE example under torchrun.

* a2a_check.py: every form exactly against the reference (_a2a_ref) for
  random splits, on 2 ranks ("pair": 2 GPUs, or both on one GPU with
  SYMMEM_ALLOW_OVERLAPPING_DEVICES=1 where there is one) and on 4 ranks
  sharing one GPU; the overrun and negative-split refusals through the
  device error flag.
* a2a_torch.py: bit for bit against torch's own all_to_all_vdev,
  all_to_all_vdev_2d and all_to_all_vdev_2d_offset (NVSHMEM). NVSHMEM needs
  a GPU per rank: on one GPU this test skips, saying so; with 2 GPUs or
  more, a torch whose NVSHMEM backend cannot run fails it under
  SYMMEM_REQUIRE_GPU=1 and skips it otherwise.
* a2a_graph.py: captured in a CUDA graph, replayed with new splits written
  between replays; torch.compile(fullgraph=True), and that compiled
  function in a CUDA graph.
* examples/moe_layer.py under torchrun (2 ranks), which checks its forward
  against the same layer on one GPU and prints OK.

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


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    tsg._budget_end = None  # this file's launches get test_symm_gpu's budget afresh
    yield


@pytest.mark.parametrize("mode,max_rows", [("pair", "4096"), ("overlap4", "512")])
def test_every_form_exact_and_the_refusals(tmp_path, mode, max_rows):
    recs = tsg.launch("a2a_check.py", mode, tmp_path, max_rows)
    world = len(recs)
    for rec in recs:
        res, rank = rec["result"], rec["rank"]
        assert res["failures"] == [], (rank, res["failures"])
        assert res["checked"] > 40, res["checked"]
        assert res["device_error"] == 0, res["device_error"]
        over = res["refusals"]["overrun"]
        if rank == 0:  # received 100 rows from the last rank into room for 50: names itself
            assert over.get("raised") == "InvalidArgumentError", over
            assert "passed its out_rows" in over["message"] and "rank 0:" in over["message"], over
            assert over["untouched"], over
            assert over["received"][world - 1] == 100, over
        else:
            assert over.get("flag") == 0, over
        neg = res["refusals"]["negative"]  # the last rank's negative split: every rank
        assert neg.get("raised") == "InvalidArgumentError", (rank, neg)
        assert f"rank {world - 1}" in neg["message"], (rank, neg)
        assert neg["untouched"], (rank, neg)


def test_bit_identical_to_torch_nvshmem(tmp_path):
    count, why = tsg.gpu_probe()
    if 0 < count < 2:
        pytest.skip(f"torch's NVSHMEM backend needs a GPU per rank; this machine has {count}")
    recs = tsg.launch("a2a_torch.py", "two_gpus", tmp_path, "12")
    missing = [rec["result"]["torch_unavailable"] for rec in recs if "torch_unavailable" in rec["result"]]
    if missing:
        msg = f"torch's NVSHMEM all_to_all_vdev cannot run here: {missing[0]}"
        if tsg.REQUIRE_GPU:
            pytest.fail(msg + " (SYMMEM_REQUIRE_GPU=1, 2 GPUs or more)")
        pytest.skip(msg)
    for rec in recs:
        res = rec["result"]
        assert res["failures"] == [], (rec["rank"], res["failures"])
        assert res["checked"] == 12 * 6, res["checked"]


def test_cuda_graph_replays_with_new_splits_and_torch_compile(tmp_path):
    recs = tsg.launch("a2a_graph.py", "pair", tmp_path, "20")
    for rec in recs:
        res = rec["result"]
        assert res["graph_failures"] == [], (rec["rank"], res["graph_failures"])
        assert res["compiled"] == [None, None, None], (rec["rank"], res["compiled"])
        assert res["compiled_graph"] is None, (rec["rank"], res["compiled_graph"])
        assert res["device_error"] == 0


def test_moe_layer_example_under_torchrun(tmp_path):
    devices, overlap = tsg.layout("pair")
    env = tsg._base_env()
    if overlap:
        env["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29400 + os.getpid() % 500), str(REPO / "examples" / "moe_layer.py")]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=tsg.LAUNCH_TIMEOUT, cwd=str(tmp_path))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish in {tsg.LAUNCH_TIMEOUT:.0f} s\n{(exc.stdout or '')[-3000:]}")
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    # Both ranks write to one pipe, unbuffered: their lines may interleave.
    oks = re.findall(r"OK rank \d", r.stdout)
    assert len(oks) == 2, r.stdout[-4000:]
