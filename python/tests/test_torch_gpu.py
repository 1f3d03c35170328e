"""PyTorch on libsymmem's cuda backend. Every test runs a script of
tests/gpu/ in a fresh process: torch's allocator can only be changed before
CUDA is initialised, so each global-allocator run needs its own process.

Without torch or a GPU these tests skip and print why; with
SYMMEM_REQUIRE_GPU=1 they fail instead. The two-GPU test skips (never
fails) on a machine with one GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent / "gpu"
REQUIRE_GPU = os.environ.get("SYMMEM_REQUIRE_GPU") == "1"

pytestmark = pytest.mark.gpu


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["SYMMEM_BACKEND"] = "cuda"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONPATH"] = os.pathsep.join([str(GPU_DIR), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


@lru_cache(maxsize=1)
def gpu_probe() -> tuple:
    """(number of GPUs torch sees, why not) from a throwaway process."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return 0, "probing torch.cuda timed out"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return 0, f"torch cannot be imported ({last})"
    n = int(r.stdout.strip().splitlines()[-1])
    return n, "" if n else "torch sees no CUDA device"


def need_gpus(n: int = 1) -> None:
    count, why = gpu_probe()
    if count >= n:
        return
    if n > 1 and count >= 1:
        pytest.skip(f"needs {n} GPUs, this machine has {count}")
    msg = f"no GPU test possible: {why}"
    if REQUIRE_GPU:
        pytest.fail(msg + " (SYMMEM_REQUIRE_GPU=1)")
    pytest.skip(msg)


def run_script(name: str, *args: str, timeout: float = 600, **env) -> dict:
    """Run tests/gpu/<name> and return its RESULT line as a dict."""
    r = subprocess.run(
        [sys.executable, str(GPU_DIR / name), *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"{name} {args} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_training_is_bitwise_identical_to_torch_allocator(model):
    need_gpus()
    ours = run_script("train.py", "symmem", model, "50")
    theirs = run_script("train.py", "torch", model, "50")
    assert ours["allocations"] > 0 and ours["segments"] > 0  # our allocator did the work
    assert len(ours["losses"]) == 50
    assert ours["losses"] == theirs["losses"]


def test_mem_pool_segments_come_from_us_and_go_back():
    need_gpus()
    r = run_script("mempool.py")
    assert r["sums_ok"] and r["in_our_blocks"]
    assert not r["outside_is_ours"]  # outside the pool: torch's own allocator
    assert r["allocated_mid"] > r["allocated_before"]
    assert r["device_allocs"] > 0
    assert r["held_by_pool"] > 0  # segments cached by the pool after the tensors die
    assert r["allocated_after"] == 0  # deleting the pool released them
    assert r["reserved_final"] == 0


def test_two_gpus_in_one_process():
    need_gpus(2)
    r = run_script("two_gpus.py")
    assert r["ok"]
    assert r["devices"] == [0, 1, 1, 1]
    assert all(a > 0 for a in r["allocs"])
    assert r["live_after"] == [0, 0]


def test_out_of_memory_raises_and_recovers():
    need_gpus()
    r = run_script("oom.py")
    assert r["raised"] is not None and r["is_runtime_error"], r
    assert "symmem" in r["message"], r["message"]
    assert r["after_ok"]
    assert r["ooms"] >= 1
    assert abs(r["limit"] - r["total"] // 4) <= r["total"] // 100
    assert r["frac_raised"] is not None
    assert r["big_ok"]


def test_many_zero_size_tensors_freed_in_any_order():
    need_gpus()
    r = run_script("zero_size.py")
    assert r["distinct"] and r["sums_ok"]
    assert r["end"] == r["base"]


def test_freed_block_not_reused_by_another_stream_while_in_use():
    need_gpus()
    r = run_script("streams.py")
    assert r["a_ok"], r
    assert r["b_ok"], r  # record_stream honoured
    assert r["c_ok"], r


def test_symmetric_tensors_and_buffers_on_cuda():
    need_gpus()
    r = run_script("tensors.py")
    assert r == {
        "shape_ok": True,
        "on_heap": True,
        "sum_ok": True,
        "freed": True,
        "cai_ok": True,
        "dlpack_ok": True,
        "zero_ok": True,
        "end": 0,
    }
