"""Symmetric memory on GPUs with PyTorch: ranks are separate processes.

Every test starts the ranks of one script of tests/gpu/symm_*.py as
subprocesses (torch.cuda.set_device'd to their GPU, libsymmem on its cuda
backend, torch.distributed over gloo where used) and checks what each rank
wrote to ``rank<r>.json`` (see tests/gpu/_symm_common.py). A failure names
the rank, its GPU, the stage it was in, its error and the tail of its
stderr.

Device layouts ("modes"):

    two_gpus   2 ranks on GPUs 0 and 1 (skipped on a machine with one GPU)
    all_gpus   one rank per GPU where there are 3 or more (8 on an 8-GPU node)
    overlap2   2 ranks both on GPU 0    (SYMMEM_ALLOW_OVERLAPPING_DEVICES=1)
    overlap4   4 ranks all on GPU 0     (same)
    overlap8   8 ranks over the GPUs round-robin (same): world size 8
    pair       two_gpus where there are 2 GPUs, else overlap2

Without torch or a GPU the tests skip and print why; with
SYMMEM_REQUIRE_GPU=1 they fail instead (but two_gpus still skips on a
one-GPU machine, which legitimately lacks it).

Bounds: inside the ranks every wait takes at most 60 s (group timeouts, GPU
waits by event polling), torch.distributed's 30 s (by then the ranks have met
in a symmem.Group, so no start-up skew is left to absorb); each launch at most
SYMMEM_GPU_TEST_TIMEOUT (120 s) before its ranks are killed, and 15 s after
the first rank failed; and the whole file at most SYMMEM_GPU_TEST_BUDGET
(300 s) of launches, after which the remaining tests fail at once, so that
one hang cannot eat a timed run. NVLink multicast is never used (the NCCL /
torch / NVSHMEM switches are forced off in the ranks' environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

import pytest

from symmem import Result

TESTS_DIR = Path(__file__).resolve().parent
GPU_DIR = TESTS_DIR / "gpu"
PYTHON_DIR = TESTS_DIR.parent
REQUIRE_GPU = os.environ.get("SYMMEM_REQUIRE_GPU") == "1"

RANK_TIMEOUT = 60.0  # every wait inside a rank
LAUNCH_TIMEOUT = float(os.environ.get("SYMMEM_GPU_TEST_TIMEOUT", "120"))
GRACE_AFTER_FAILURE = 15.0
BUDGET = float(os.environ.get("SYMMEM_GPU_TEST_BUDGET", "300"))

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

pytestmark = pytest.mark.gpu


# --------------------------------------------------------------------------
# What this machine has
# --------------------------------------------------------------------------


def _base_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["SYMMEM_BACKEND"] = "cuda"
    env["SYMMEM_TIMEOUT_MS"] = str(int(RANK_TIMEOUT * 1000))
    env.update(NO_MULTICAST)
    # Every rank is on this host: gloo over loopback needs no name resolution.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(GPU_DIR), str(PYTHON_DIR), str(TESTS_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env


@lru_cache(maxsize=1)
def gpu_probe() -> tuple:
    """(number of GPUs torch sees, why none) from a throwaway process."""
    code = (
        "import torch, torch.distributed as dist\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print('PROBE', n, int(dist.is_available()))\n"
    )
    try:
        r = subprocess.run([sys.executable, "-c", code], env=_base_env(), capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return 0, "probing torch.cuda timed out"
    lines = [l for l in r.stdout.splitlines() if l.startswith("PROBE ")]
    if r.returncode != 0 or not lines:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return 0, f"torch cannot be imported ({last})"
    _, n, has_dist = lines[-1].split()
    if not int(has_dist):
        return 0, "torch.distributed is not available in this torch"
    n = int(n)
    return n, "" if n else "torch sees no CUDA device"


MODES = ("two_gpus", "all_gpus", "overlap2", "overlap4", "overlap8", "pair")


def layout(mode: str) -> tuple:
    """(devices of the ranks, overlapping allowed) for mode, after skipping
    or failing when this machine cannot run it."""
    count, why = gpu_probe()
    if count < 1:
        msg = f"no GPU test possible: {why}"
        if REQUIRE_GPU:
            pytest.fail(msg + " (SYMMEM_REQUIRE_GPU=1)")
        pytest.skip(msg)
    if mode == "pair":
        mode = "two_gpus" if count >= 2 else "overlap2"
    if mode == "two_gpus":
        if count < 2:
            pytest.skip(f"two_gpus needs 2 GPUs, this machine has {count}")
        return [0, 1], False
    if mode == "all_gpus":
        # one rank per GPU on a node with more than two (world size 8 on an
        # 8-GPU node); two_gpus covers a pair
        if count < 3:
            pytest.skip(f"all_gpus needs 3 or more GPUs (two_gpus covers 2), this machine has {count}")
        return list(range(count)), False
    if mode == "overlap2":
        return [0, 0], True
    if mode == "overlap4":
        return [0] * 4, True
    if mode == "overlap8":
        return [r % count for r in range(8)], True
    raise ValueError(f"unknown mode {mode!r}")


# --------------------------------------------------------------------------
# Launching ranks
# --------------------------------------------------------------------------

_budget_end = None


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    # This file's launches get the whole budget, whatever other files that
    # use launch (test_coll_gpu, test_nccl_gpu) spent before it.
    global _budget_end
    _budget_end = None
    yield


def _time_left() -> float:
    global _budget_end
    if _budget_end is None:
        _budget_end = time.monotonic() + BUDGET
    return _budget_end - time.monotonic()


def _tail(path: Path, n: int = 2500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-n:]


def launch(script: str, mode: str, tmp_path: Path, *args: str) -> List[dict]:
    """Run every rank of tests/gpu/<script> in mode; return each rank's
    record (rank, device, result), failing the test with every rank's story
    when any rank did not succeed."""
    devices, overlap = layout(mode)
    world = len(devices)
    left = _time_left()
    if left < 20:
        pytest.fail(
            f"not started: this file's time budget ({BUDGET:.0f} s, SYMMEM_GPU_TEST_BUDGET) was used up "
            "by earlier tests (a hang?)"
        )
    timeout = min(LAUNCH_TIMEOUT, left)
    out_dir = tmp_path / "ranks"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"s{uuid.uuid4().hex[:12]}"
    base = _base_env()
    if overlap:
        base["SYMMEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    else:
        base.pop("SYMMEM_ALLOW_OVERLAPPING_DEVICES", None)  # the real rule: one GPU per rank
    procs = []
    files = []
    try:
        for rank, dev in enumerate(devices):
            env = dict(base)
            env.update(
                SYMM_RANK=str(rank),
                SYMM_WORLD=str(world),
                SYMM_DEVICE=str(dev),
                SYMM_NAME=name,
                SYMM_OUT=str(out_dir),
                SYMM_INIT=str(tmp_path / "dist-init"),
                SYMM_TIMEOUT=str(RANK_TIMEOUT),
            )
            so = open(out_dir / f"rank{rank}.stdout", "wb")
            se = open(out_dir / f"rank{rank}.stderr", "wb")
            files += [so, se]
            procs.append(
                subprocess.Popen([sys.executable, str(GPU_DIR / script), *args], env=env, stdout=so, stderr=se, cwd=str(TESTS_DIR))
            )
        t0 = time.monotonic()
        deadline = t0 + timeout
        failed_at = None
        timed_out = False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                # A rank failed: its peers get a moment to report their side.
                failed_at = now
                deadline = min(deadline, now + GRACE_AFTER_FAILURE)
            if now > deadline:
                timed_out = True
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for f in files:
            f.close()

    records = []
    problems = []
    for rank, (p, dev) in enumerate(zip(procs, devices)):
        path = out_dir / f"rank{rank}.json"
        rec = None
        if path.exists():
            try:
                rec = json.loads(path.read_text())
            except ValueError as exc:
                rec = {"ok": False, "error": f"unreadable result file: {exc}"}
        if rec is not None and rec.get("ok") and p.returncode == 0:
            records.append(rec)
            continue
        if rec is None:
            what = "killed: no result" if p.returncode is not None and p.returncode < 0 else f"exit {p.returncode}, no result"
            problems.append(f"--- rank {rank} (cuda:{dev}): {what}\nstderr tail:\n{_tail(out_dir / f'rank{rank}.stderr')}")
        else:
            problems.append(
                f"--- rank {rank} (cuda:{dev}): exit {p.returncode}, stage {rec.get('stage')!r}: {rec.get('error')}\n"
                f"{(rec.get('traceback') or '')[-2500:]}\nstderr tail:\n{_tail(out_dir / f'rank{rank}.stderr', 800)}"
            )
        records.append(rec)
    if problems:
        head = f"{script} {' '.join(args)} in {mode} (devices {devices}) failed after {elapsed:.1f} s"
        if timed_out:
            head += f" (killed the ranks still running after the {timeout:.0f} s limit or the grace after a failure)"
        pytest.fail(head + "\n" + "\n".join(problems), pytrace=False)
    for rank, rec in enumerate(records):
        assert rec["rank"] == rank and rec["device"] == devices[rank], rec
    return records


def where(rec: dict, via: str = "") -> str:
    return f"rank {rec['rank']} (cuda:{rec['device']})" + (f" via {via}" if via else "")


def parts(recs: List[dict], via: str) -> List[dict]:
    """Every rank's result for one part ("group", "dist", ...), failing the
    test with every rank's error where that part raised (the ranks report a
    failed last part instead of dying, so the earlier parts still count)."""
    errors = [
        f"--- {where(rec, via)}: {rec['result'][via]['error']} (stage {rec['result'][via].get('stage')!r})\n"
        f"{rec['result'][via].get('traceback', '')}"
        for rec in recs
        if "error" in rec["result"][via]
    ]
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
    return [rec["result"][via] for rec in recs]


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["two_gpus", "all_gpus", "overlap4", "overlap8"])
def test_every_rank_writes_every_peer(mode, tmp_path):
    recs = launch("symm_every_peer.py", mode, tmp_path)
    world = len(recs)
    for via in ("group", "dist"):
        for rec, r in zip(recs, parts(recs, via)):
            at = where(rec, via)
            assert (r["rank"], r["world_size"]) == (rec["rank"], world), (at, r)
            assert r["offset"] == 0 and r["buffer_size"] >= r["nbytes"], (at, r)
            assert r["own_ptr_ok"] and r["own_view_ok"], (at, r)
            assert r["distinct_ptrs"] and r["distinct_pads"], (at, r)
            assert r["peer_devices_ok"], (at, r["peer_devices"])
            assert r["bad_slots"] == [], f"{at}: slots written by peers hold wrong values: {r['bad_slots']}"
            assert r["peer_read"] is None, f"{at}: reading back our write in the next peer: {r['peer_read']}"
            assert not r["pad_bad"], f"{at}: signal pad counts wrong after the final barrier: {r['pad_bad']}"


def test_torch_ops_on_symmetric_tensors(tmp_path):
    recs = launch("symm_interop.py", "pair", tmp_path)
    for rec in recs:
        r, at = rec["result"], where(rec)
        assert r["on_heap"], at
        assert r["matmul_vs_torch"] is None, f"{at}: matmul into a symmetric tensor: {r['matmul_vs_torch']}"
        assert r["matmul_vs_cpu"] is None, f"{at}: matmul vs CPU: {r['matmul_vs_cpu']}"
        assert r["matmul_from_symm_inputs"] is None, f"{at}: {r['matmul_from_symm_inputs']}"
        assert r["sum"] == r["sum_ref"], (at, r["sum"], r["sum_ref"])
        assert r["peer_matmul"] is None, f"{at}: the next rank's matmul read through the mapping: {r['peer_matmul']}"
        assert r["peer_matmul_sum"] == r["sum_ref"], at
    r0, r1 = recs[0]["result"], recs[1]["result"]
    assert r0["own_intact"] is None, f"rank 0's arange changed: {r0['own_intact']}"
    assert r1["peer_device"] == f"cuda:{recs[1]['device']}", r1["peer_device"]
    assert r1["gpu_equal"] is None, f"rank 1 reading rank 0's arange on the GPU: {r1['gpu_equal']}"
    assert r1["cpu_equal"] is None, f"rank 1 reading rank 0's arange on the CPU: {r1['cpu_equal']}"
    assert r1["peer_sum"] == r1["want_sum"]
    assert r1["offset_view"] == list(range(1000, 1016))


@pytest.mark.parametrize("mode,rounds", [("two_gpus", 100), ("overlap2", 20)])
def test_signals_carry_data_in_stream_order(mode, rounds, tmp_path):
    recs = launch("symm_signal.py", mode, tmp_path, str(rounds))
    r0, r1 = recs[0]["result"], recs[1]["result"]
    assert r0["stream_nonzero"] and r1["stream_nonzero"]
    assert r0["queued"] == rounds
    assert r1["seen"] == rounds
    assert r1["n_bad"] == 0, f"rank 1 saw data the signal did not order ({r1['n_bad']} of {rounds} rounds): {r1['bad']}"
    for rec in recs:
        assert not rec["result"]["pad_bad"], f"{where(rec)}: signal pad counts wrong at the end: {rec['result']['pad_bad']}"


@pytest.mark.parametrize(
    "mode,sub", [("overlap4", 2), ("overlap8", 2), ("overlap8", 4), ("all_gpus", 2), ("all_gpus", 4)]
)
def test_subgroups_share_a_buffer_with_the_world(tmp_path, mode, sub):
    devices, _ = layout(mode)
    if len(devices) % sub or sub >= len(devices):
        pytest.skip(f"subgroups of {sub} need a world size that is a larger multiple of {sub} ({len(devices)} ranks)")
    recs = launch("symm_subgroups.py", mode, tmp_path, str(sub))
    world = len(recs)
    for via in ("group", "dist"):
        for rec, r in zip(recs, parts(recs, via)):
            at, rank = where(rec, via), rec["rank"]
            assert (r["world_rank"], r["world_size"]) == (rank, world), (at, r)
            assert (r["sub_rank"], r["sub_size"]) == (rank % sub, sub), (at, r)
            assert r["own_ptr_world"] and r["own_ptr_sub"], (at, r)
            assert r["pads_differ"], f"{at}: the world and subgroup handles share signal pads"
            assert r["world_pads_distinct"] and r["sub_pads_distinct"], (at, r)
            assert r["sub_bad"] == [], f"{at}: rows written through the subgroup handle: {r['sub_bad']}"
            assert r["world_bad"] == [], f"{at}: rows written through the world handle: {r['world_bad']}"
            assert r["sub_rows_kept"], at
            assert not r["world_pad_bad"] and not r["sub_pad_bad"], (at, r)


def test_rendezvous_on_a_view_with_a_storage_offset(tmp_path):
    recs = launch("symm_interior.py", "pair", tmp_path)
    for rec in recs:
        assert rec["result"]["view_storage_offset"] == 256
    for via in ("group", "dist"):
        for rec, r in zip(recs, parts(recs, via)):
            at = where(rec, via)
            assert r["offset"] == r["want_offset"] > 0, (at, r["offset"], r["want_offset"])
            assert r["buffer_size"] >= r["nbytes"], (at, r)
            assert r["own_ptr_ok"] and r["own_block_ok"], (at, r)
            assert r["default_view_bytes"] == r["want_default_view_bytes"], (at, r)
            assert r["bad"] == [], f"{at}: values written through get_buffer(storage_offset=...): {r['bad']}"
            assert r["prefix_untouched"], f"{at}: a write landed before the view"
            assert r["suffix_untouched"], f"{at}: a write landed after the written part"


def test_mismatched_sizes_fail_on_every_rank(tmp_path):
    recs = launch("symm_mismatch.py", "pair", tmp_path)
    timeout = recs[0]["result"]["timeout"]

    def check(via):
        for rec, r in zip(recs, parts(recs, via)):
            at = where(rec, via)
            # symmem.MismatchError (a SymmemError with code MISMATCH), on every rank
            assert r["raised"] is not None, f"{at}: the mismatched rendezvous succeeded"
            assert r["code"] == Result.MISMATCH, f"{at}: {r}"
            assert r["raised"] == "MismatchError", f"{at}: {r}"
            assert r["message"], at
            assert r["seconds"] < timeout, f"{at}: the mismatch took {r['seconds']} s to report"

    check("group")
    for rec, r in zip(recs, parts(recs, "after")):
        assert r["peer_values"] is None, f"{where(rec)}: a rendezvous after the mismatch: {r['peer_values']}"
    check("dist")


def test_peer_memory_lives_on_the_peer_gpu(tmp_path):
    recs = launch("symm_peer_gpu.py", "two_gpus", tmp_path)
    r0, r1 = recs[0]["result"], recs[1]["result"]
    assert (r0["tensor_device"], r1["tensor_device"]) == ("cuda:0", "cuda:1")
    assert (r0["heap_device"], r1["heap_device"]) == (0, 1)
    # a peer's memory is addressed through our own device
    assert (r0["peer_tensor_device"], r1["peer_tensor_device"]) == ("cuda:0", "cuda:1")
    assert r0["own_after_peer_write"] is None, f"rank 0 reading on cuda:0 what rank 1 wrote: {r0['own_after_peer_write']}"
    assert r0["own_sum"] == r0["want_sum"]
    assert r0["own_head_cpu"] == [1.0, 2.0, 3.0, 4.0]
    assert r1["peer_after_double"] is None, f"rank 1 reading rank 0's doubled tensor: {r1['peer_after_double']}"
    assert r1["own_untouched"]
    for rec in recs:
        r = rec["result"]
        assert r["rendezvous_took_bytes"] < r["nbytes"] // 2, (
            f"{where(rec)}: mapping the peer's {r['nbytes']} bytes took {r['rendezvous_took_bytes']} bytes "
            "of our own GPU's memory (a copy, not a mapping?)"
        )
