"""The all-reduce with RMSNorm through symmem.Handle (no torch) with real
processes, on either backend (the host backend in CI; GPUs with
SYMMEM_REQUIRE_GPU=1): residual and out compared bit for bit with the
plain-Python reference of the documented rounding (_tp_ref.py), on every
rank."""

from __future__ import annotations

import os
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
