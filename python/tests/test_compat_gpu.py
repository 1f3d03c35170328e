"""The drop-ins on a GPU with torch: tests/gpu/tms_program.py, a program
written for torch_memory_saver, run unchanged through ``python -m
symmem.compat --`` (and one case after ``symmem.compat.install()`` in the
same process), and vLLM's CuMemAllocator. Run by scripts/gpu_suite.sh
tests with SYMMEM_REQUIRE_GPU=1; without torch or a GPU they skip and say
why (fail with SYMMEM_REQUIRE_GPU=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    assert r["same_ptr"], r  # contents undefined after the resume, as torch_memory_saver's


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


def test_dropin_memory_is_mapped_for_its_own_gpu():
    """The drop-ins' tags map for their own GPU alone (as torch_memory_saver
    and vLLM map theirs, and so their resumes skip the peers' page tables);
    libsymmem's own pool grants the peer GPU too."""
    need_gpus(2)
    r = run_program("own_device")
    rw = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    assert r["tms_own"] == rw, r
    assert r["tms_peer"] == 0 and r["tms_peer_after_resume"] == 0, r
    assert r["vllm_peer"] == 0, r
    assert r["plain_peer"] == rw, r


def test_disable():
    need_gpus()
    r = run_program("disable")
    assert r["disabled_live"], r


def test_training_step_between_pause_and_resume():
    need_gpus()
    r = run_program("training")
    assert r["identical"], r
    assert len(r["losses"]) == 3


def test_tms_init_enable():
    need_gpus()
    r = run_program("init_enable", TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
    assert r["weights_kept"], r
    assert r["free_rise"] >= 2 * 40_000_000 - 16 * MiB, r


def test_vllm_sleep_and_wake_up():
    need_gpus()
    r = run_program("vllm")
    assert r["usage"] >= 96 * MiB * 4, r
    assert r["free_rise"] >= 96 * MiB * 4 - 16 * MiB, r
    assert r["weights_ok"], r


def test_vllm_cuda_graph_across_sleep():
    """vLLM's worker: a CUDA graph over the weights (kept at level 1,
    dropped and reloaded at level 2) and the KV cache (dropped) replays
    right after wake_up(["weights"]) then wake_up(["kv_cache"]);
    get_current_usage is the same before and after; a wake_up without
    room is a RuntimeError (torch.OutOfMemoryError) carrying libsymmem's
    code, and the retry works."""
    need_gpus()
    r = run_program("vllm_graph")
    assert r["replays_ok"] == [True] * 4, r
    assert r["usage_before"] == r["usage_after"] >= r["weights_bytes"] + 64 * MiB, r
    assert r["free_rise_min"] >= r["weights_bytes"] + 64 * MiB - 16 * MiB, r
    assert r["oom"] == dict(runtime=True, torch_oom=True, symmem_oom=True, code=2), r
    assert r["retry_ok"], r


# -- torch_memory_saver's own example programs --------------------------------

# Where a copy of torch_memory_saver's repository is (carried, never
# committed: scripts/tms_examples.sh says how to fetch it).
TMS_REPO = Path(os.environ.get("TMS_REPO", Path(__file__).resolve().parents[2] / ".scratch" / "torch_memory_saver"))
TMS_PROGRAMS = ["simple", "cpu_backup", "cuda_graph", "rl_example", "training_engine"]


@pytest.mark.parametrize("entry", ["install", "module"])
@pytest.mark.parametrize("program", TMS_PROGRAMS)
def test_torch_memory_saver_example_programs(program, entry):
    """torch_memory_saver's test/examples/<program>.py, unchanged, in a
    fresh process through symmem.compat.install() or python -m
    symmem.compat --, hook mode "preload" (training_engine with
    TMS_INIT_ENABLE=1 TMS_INIT_ENABLE_CPU_BACKUP=1, as its own tests run
    it). Skips where the copy of its repository is absent."""
    need_gpus()
    prog = TMS_REPO / "test" / "examples" / f"{program}.py"
    if not prog.exists():
        pytest.skip(f"{prog} is absent: fetch torch_memory_saver's repository into {TMS_REPO} (scripts/tms_examples.sh)")
    extra = {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"} if program == "training_engine" else {}
    if entry == "module":
        cmd = [sys.executable, "-m", "symmem.compat", "--", sys.executable, str(prog), "preload"]
    else:
        code = (
            "import sys, runpy, symmem.compat; symmem.compat.install(); "
            f"sys.argv = [{str(prog)!r}, 'preload']; runpy.run_path({str(prog)!r}, run_name='__main__')"
        )
        cmd = [sys.executable, "-c", code]
    env = _env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env["PYTHONPATH"]])  # symmem from any folder
    r = subprocess.run(cmd, env=env, cwd=str(prog.parent), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{program} ({entry}) failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
