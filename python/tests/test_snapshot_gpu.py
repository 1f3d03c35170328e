"""The heap snapshot under PyTorch on a GPU, checked by torch's own
visualiser code (tests/gpu/snapshot.py). Skips without torch or a GPU, fails
there with SYMMEM_REQUIRE_GPU=1."""

import pytest
from test_torch_gpu import need_gpus, run_script

pytestmark = pytest.mark.gpu


def test_snapshot_renders_with_torch_memory_viz():
    need_gpus()
    r = run_script("snapshot.py")
    assert r["segments"] > 0 and r["events"] > 0, r
    assert r["in_blocks"], r  # every live tensor lies in an active block
    assert r["segsum_ok"] and r["trace_ok"] and r["html_ok"], r
    assert r["roundtrip"], r  # the HTML embeds our snapshot, unchanged
    assert r["frames_ok"], r  # Python stacks of the allocations
