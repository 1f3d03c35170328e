"""The drop-ins on a GPU with torch: tests/gpu/tms_program.py, a program
written for torch_memory_saver, run unchanged through ``python -m
symmem.compat --`` (and one case after ``symmem.compat.install()`` in the
same process), and vLLM's CuMemAllocator. Run by scripts/gpu_suite.sh
tests with SYMMEM_REQUIRE_GPU=1; without torch or a GPU they skip and say
why (fail with SYMMEM_REQUIRE_GPU=1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_torch_gpu import GPU_DIR, _env, need_gpus

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def run_program(case: str, how: str = "module", **env) -> dict:
    prog = str(GPU_DIR / "tms_program.py")
    if how == "module":
        cmd = [sys.executable, "-m", "symmem.compat", "--", sys.executable, prog, case]
    else:
        code = (
            "import sys, runpy, symmem.compat; symmem.compat.install(); "
            f"sys.argv = [{prog!r}, {case!r}]; runpy.run_path({prog!r}, run_name='__main__')"
        )
        cmd = [sys.executable, "-c", code]
    r = subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"{case} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("how", ["module", "install"])
def test_simple(how):
    need_gpus()
    r = run_program("simple", how)
    assert r["dropin"], "torch_memory_saver resolved to libsymmem's drop-in"
    assert r["free_rise"] >= 256 * MiB - 16 * MiB, r
    assert r["same_ptr"] and r["zero_after"], r


def test_cpu_backup():
    need_gpus()
    r = run_program("cpu_backup")
    for backend in ("pinned", "mmap"):
        assert all(r[backend]["survived"]), r
        assert all(r[backend]["cpu_copies"]), r
        assert r[backend]["live_copy_is_none"], r


def test_cuda_graph_replays_after_resume():
    need_gpus()
    r = run_program("cuda_graph")
    assert r["replays_ok"] == [True, True, True], r


def test_disable():
    need_gpus()
    r = run_program("disable")
    assert r["disabled_live"] and r["tagged_zero"], r


def test_training_step_between_pause_and_resume():
    need_gpus()
    r = run_program("training")
    assert r["identical"], r
    assert len(r["losses"]) == 3


def test_tms_init_enable():
    need_gpus()
    r = run_program("init_enable", TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
    assert r["weights_kept"] and r["grad_zero"], r
    assert r["free_rise"] >= 2 * 40_000_000 - 16 * MiB, r


def test_vllm_sleep_and_wake_up():
    need_gpus()
    r = run_program("vllm")
    assert r["usage"] >= 96 * MiB * 4, r
    assert r["free_rise"] >= 96 * MiB * 4 - 16 * MiB, r
    assert r["weights_ok"] and r["kv_zero"], r
