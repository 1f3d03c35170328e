"""The all-reduce with RMSNorm through symmem.Handle (no torch) with real
processes, on either backend (the host backend in CI; GPUs with
SYMMEM_REQUIRE_GPU=1): residual and out compared bit for bit with the
plain-Python reference of the documented rounding (_tp_ref.py), on every
rank."""

from __future__ import annotations

import os
import re
import uuid

import pytest

import _tp_workers
from _mp import run_ranks
from _tp_ref import reference
from symmem import Result

pytestmark = pytest.mark.usefixtures("symmetric")

CASES = [
    ("bfloat16", 1, 8, None, "inplace", 1e-6),
    ("bfloat16", 3, 40, None, "local", 1e-5),
    ("bfloat16", 2, 512 + 64, "low_latency", "local", 1e-6),
    ("bfloat16", 2, 2048 + 8, "one_shot", "inplace", 1e-6),
    ("float16", 2, 64, "two_shot", "block", 1e-5),
    ("float16", 1, 4096, None, "inplace", 0.0),
    ("float32", 3, 24, "one_shot", "local", 1e-6),
    ("float32", 1, 2056, "low_latency", "inplace", 1e-6),
]


@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_rmsnorm_matches_the_reference_bit_for_bit(world):
    if os.environ.get("SYMMEM_BACKEND") == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", ""):
        pytest.skip("make test-fakecuda: the fake CUDA driver runs no kernels")
    results = run_ranks(_tp_workers.all_reduce_rmsnorm, world, f"tp-{uuid.uuid4().hex[:12]}", CASES)
    for call, (dtype, tokens, hidden, algo, where, eps) in enumerate(CASES):
        n = tokens * hidden
        xs = [_tp_workers.values(dtype, 0, r, n, call) for r in range(world)]
        outs = []
        for rank, res in enumerate(results):
            want_res, want_out = reference(dtype, xs, _tp_workers.values(dtype, 1, 0, n, call),
                                           _tp_workers.values(dtype, 2, rank, hidden, call), hidden, eps)
            got_res, got_out = res["results"][call]
            case = (rank, dtype, tokens, hidden, algo, where)
            assert got_res == want_res, case
            bad = [i for i in range(n) if got_out[i] != want_out[i]]
            assert not bad, (case, bad[:4], [hex(got_out[i]) for i in bad[:4]], [hex(want_out[i]) for i in bad[:4]])
            outs.append(got_out)
        # Residuals and weights are the same on every rank here, as in a
        # tensor-parallel layer: so are the results.
        assert all(o == outs[0] for o in outs), (dtype, tokens, hidden)
    for rank, res in enumerate(results):
        e = res["errors"]
        for what in ("int32", "hidden", "eps", "overlap", "tokens", "algo"):
            assert e[what] is not None and e[what][:2] == ("InvalidArgumentError", Result.INVALID_ARGUMENT), (what, e)
        assert "dtype int32: the norm takes bfloat16, float16 or float32" in e["int32"][2]
        assert "hidden 12 must be a multiple of 8 in [8, 16384]" in e["hidden"][2]
        assert "eps NaN must be finite and not negative" in e["eps"][2]
        assert "overlaps weight" in e["overlap"][2]
        assert "tokens -1 is out of range" in e["tokens"][2]
        assert "unknown algo \"fastest\"" in e["algo"][2]
        assert e["eps_type"] == ("TypeError", 0, "symmem.Handle.all_reduce_rmsnorm: eps must be a float, not str \"1e-6\""), e
        assert res["device_error"] == 0


# -- symmem.torch (where torch is installed) ----------------------------------


def test_torch_operators(tmp_path):
    """symmem.torch.all_reduce_rmsnorm bit for bit against the reference,
    x symmetric or staged; fused_all_gather_matmul and
    fused_matmul_reduce_scatter exactly against the same arithmetic on the
    whole tensors (small integers), for every gather and scatter dimension,
    sum and avg; their backward through each other against autograd on the
    whole block; and the refusals, naming what is wrong (CPU tensors on the
    host backend)."""
    pytest.importorskip("torch", reason="PyTorch is not installed: the torch tensor-parallel test needs it")
    if os.environ.get("SYMMEM_BACKEND") == "cuda" and "fake" in os.environ.get("SYMMEM_LIBCUDA", ""):
        pytest.skip("make test-fakecuda: the fake CUDA driver runs no kernels")
    import _tp_torch_workers as tw

    for world in (2, 3):
        results = run_ranks(tw.run, world, str(tmp_path / f"init{world}"), timeout=240)
        for rank, res in enumerate(results):
            assert res["fail"] == [], (world, rank, res["fail"])
            e = res["errors"]
            assert e["norm_weight_shape"][0] == "ValueError" and "weight has shape (32,), expected (64,)" in e["norm_weight_shape"][1]
            assert "residual has shape (1, 64), x (2, 64)" in e["norm_residual_shape"][1]
            assert "residual is torch.float32, x torch.bfloat16" in e["norm_dtype"][1]
            assert "hidden 12 (x's last dimension) must be a multiple of 8" in e["norm_hidden"][1]
            assert "bs[0] has 8 rows, but the gathered A has 16 columns" in e["ag_rows"][1]
            assert "gather_dim 2 is not a dimension of the input (0 .. 1)" in e["ag_dim"][1]
            assert "bs[0] is torch.bfloat16, a_shard torch.float32" in e["ag_dtype"][1]
            assert "reduce_op must be one of sum, avg, not 'max'" in e["rs_op"][1]
            assert f"dimension 0 of A @ B (1) does not split over {world} ranks" in e["rs_split"][1]


@pytest.mark.parametrize("script,args", [
    ("tp_mlp.py", ["--tokens", "256", "--hidden", "64", "--ffn", "256", "--dtype", "float32"]),
    ("tp_decode.py", ["--tokens", "4", "--hidden", "64", "--inter", "128", "--steps", "3"]),
])
def test_examples_on_the_host_backend(tmp_path, host_backend, script, args):
    """The examples under torchrun on CPU tensors (--cpu): each checks
    itself against the same block on one device and prints OK per rank."""
    pytest.importorskip("torch", reason="PyTorch is not installed: the examples need it")
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, SYMMEM_BACKEND="host", GLOO_SOCKET_IFNAME="lo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29000 + os.getpid() % 500), str(repo / "examples" / script), "--cpu", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    # Both ranks write to one pipe, unbuffered: their lines may interleave.
    assert len(re.findall(r"OK rank \d", r.stdout)) == 2, r.stdout[-4000:]
