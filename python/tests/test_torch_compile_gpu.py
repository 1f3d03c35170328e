"""symmem.torch on GPUs as a PyTorch user meets it: collectives
on any tensor (Note [Staging] in symmem/torch.py) and torch.compile in
every mode, through the rank script tests/gpu/torch_compile.py (see its
docstring) and test_symm_gpu's launcher. Without torch or a GPU the test
skips and says why; with SYMMEM_REQUIRE_GPU=1 it fails instead.
"""

from __future__ import annotations

import pytest

import test_symm_gpu as tsg

pytestmark = pytest.mark.gpu

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
PATTERNS = ("argument", "argument_functional", "module_buffer", "intermediate", "intermediate_staged")


# Fifteen compilations (five patterns, three modes) take minutes, beyond the
# launcher's usual limits: this file's launch gets at least these.
COMPILE_SECONDS = 900


@pytest.fixture(autouse=True, scope="module")
def _own_budget():
    saved = tsg.LAUNCH_TIMEOUT, tsg.BUDGET
    tsg.LAUNCH_TIMEOUT, tsg.BUDGET = max(saved[0], COMPILE_SECONDS), max(saved[1], COMPILE_SECONDS + 60)
    tsg._budget_end = None
    yield
    tsg.LAUNCH_TIMEOUT, tsg.BUDGET = saved
    tsg._budget_end = None


def test_compile_patterns_in_every_mode_and_staging_on_two_gpus(tmp_path):
    for rec in tsg.launch("torch_compile.py", "pair", tmp_path):
        res = rec["result"]
        for mode in MODES:
            for pattern in PATTERNS:
                got = res[f"{mode}/{pattern}"]
                assert isinstance(got, list), (rec["rank"], mode, pattern, got)  # a str: what it raised
                assert len(got) == 3 and all(m is None for step in got for m in step), (rec["rank"], mode, pattern, got)
        assert res["cudagraph_skips"] == 0, res
        # scripts/gpu_suite.sh builds the operators' C++ kernels: the
        # compiled steps' repeated calls on one tensor are answered there.
        cpp = res["cpp_ops"]
        assert cpp["loaded"] and cpp["error"] is None, ("python -m symmem build-torch-ops builds them", cpp)
        assert cpp["answered"] > 0 and cpp["passed_to_python"] > 0, cpp
        # Staged calls too: in the modes that run the kernels at every call,
        # the C++ kernels stage the four calls of every step after the first
        # at least, wherever their intermediates lie (decided from the
        # group's workspace, entered by the patterns before).
        for mode in ("default", "max-autotune-no-cudagraphs"):
            answered, passed = res[f"{mode}/intermediate_staged/cpp"]
            assert answered >= 8, (mode, answered, passed)
        print(f"rank {rec['rank']}: {cpp}; staged pattern (answered, passed on) per mode:",
              {m: res[f"{m}/intermediate_staged/cpp"] for m in MODES})
        e = res["eager"]
        assert e["in_place"] is None and e["non_contiguous"] is None, e
        for key in ("direct", "direct_all_gather", "direct_reduce_scatter", "direct_replay"):
            assert e[key] is None, (key, e)
        assert e["direct_untouched"] is True and e["direct_untouched_replay"] is True, e
        assert "cannot run inside CUDA-graph capture" in e["capture_growth"], e
        assert "SYMMEM_STAGING_BYTES" in e["capture_growth"], e
        assert e["grown"] is None and e["staged_replay"] is None, e
        assert e["grown_bytes"] >= 4 << 20, e
