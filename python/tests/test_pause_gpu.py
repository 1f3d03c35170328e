"""Tags, pause and resume on GPUs (run by scripts/gpu_suite.sh tests with
SYMMEM_REQUIRE_GPU=1; without a GPU they skip and say why, with
SYMMEM_REQUIRE_GPU=1 they fail instead; the 2-GPU test skips on one GPU).

* tests/gpu/pause_model.py: a model's weights (backup) and KV cache (no
  backup) paused and resumed 20 times, outputs identical, KV zero, a CUDA
  graph replayed after resume, mem_get_info's free memory rising by the
  paused bytes; with libsymmem as the global allocator and in MemPools.
* the collective pause across 2 GPUs (tests/_pause_workers.py), measuring
  each GPU's free memory.
"""

from __future__ import annotations

import os

import pytest

from test_torch_gpu import need_gpus, run_script

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.mark.parametrize("mode", ["global", "mempool"])
def test_model_weights_and_cache_survive_20_pauses(mode):
    need_gpus()
    r = run_script("pause_model.py", mode)
    assert r["cycles"] == 20
    assert all(r["identical"]), r["identical"]
    assert all(r["kv_zero"]), r["kv_zero"]
    assert r["same_ptrs"]
    assert r["paused_after"] == 0
    # Weights (~84 MiB) and cache (256 MiB) paused; the device's free memory
    # rose by them (1/16 slack for other processes on the GPU).
    for paused, rise in zip(r["paused"], r["free_rise"]):
        assert paused >= 256 * MiB + 80 * MiB, r["paused"]
        assert rise >= paused - paused // 16, (paused, rise)
    if mode == "mempool":
        assert r["graph_reference_ok"]
        assert len(r["graph_identical"]) == 20 and all(r["graph_identical"]), r["graph_identical"]


def test_collective_pause_on_two_gpus():
    need_gpus(2)
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
        os.environ[k] = v
    from _mp import run_ranks
    from _pause_workers import collective_pause

    nbytes = 64 * MiB
    results = run_ranks(collective_pause, 2, f"gpu-cp-{os.getpid()}", nbytes, 5, timeout=240)
    for r, res in enumerate(results):
        assert all(res["same_ptrs"]), (r, res)
        assert all(res["data_ok"]), (r, res)
        assert res["final_ok"], (r, res)
        assert all(b == nbytes for b in res["paused_bytes"]), res["paused_bytes"]
        # Each GPU got its rank's 64 MiB back: the peer dropped its import.
        assert all(d >= nbytes - nbytes // 16 for d in res["drops"]), (r, res["drops"])
