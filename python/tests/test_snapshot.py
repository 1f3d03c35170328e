"""Heap snapshots in PyTorch's format (host backend, no torch): the fields
torch.cuda._memory_viz and PyTorch's viewer read, blocks tiling segments,
the history of events with Python stacks, the pickle, the SVG picture."""

import pickle

import pytest

import symmem
import symmem.torch as st
from symmem import snapshot as snap


@pytest.fixture
def recording():
    st.record_memory_history(max_entries=10_000)
    yield
    st.record_memory_history(enabled=None)


def _check_format(s):
    assert set(s) >= {"segments", "device_traces"}
    assert len(s["device_traces"]) == symmem.device_count()
    for seg in s["segments"]:
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                  "stream", "segment_type", "blocks", "frames"):
            assert k in seg, k
        # blocks tile the segment, in address order (torch's viewer assumes it)
        addr = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == addr
            assert b["state"] in ("active_allocated", "inactive")
            assert {"size", "requested_size", "frames"} <= set(b)
            addr += b["size"]
        assert addr == seg["address"] + seg["total_size"]
        active = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
        assert seg["allocated_size"] == sum(b["size"] for b in active)
        assert seg["requested_size"] == sum(b["requested_size"] for b in active)
        # what torch's segsum asserts: free + internal + allocated == reserved
        free_ext = sum(b["size"] for b in seg["blocks"] if b["state"] != "active_allocated")
        free_int = sum(b["size"] - b["requested_size"] for b in active)
        assert free_ext + free_int + seg["requested_size"] == seg["total_size"]


def here():
    return symmem.alloc(3000)  # the allocation whose stack is checked


def test_snapshot_lists_blocks_with_stacks_and_history(recording):
    p1 = here()
    p2 = symmem.alloc(5 << 20)
    p3 = symmem.alloc(100)
    symmem.free(p3)
    s = st.memory_snapshot()
    _check_format(s)
    blocks = {b["address"]: b for seg in s["segments"] for b in seg["blocks"]}
    assert blocks[p1]["state"] == "active_allocated" and blocks[p1]["requested_size"] == 3000
    assert blocks[p1]["size"] == 3072
    names = [f["name"] for f in blocks[p1]["frames"]]
    assert "here" in names and names.index("alloc") < names.index("here"), names  # innermost first
    assert blocks[p2]["requested_size"] == 5 << 20
    # p3's block was freed and merged into the free rest of its segment
    assert p3 not in blocks or blocks[p3]["state"] == "inactive"
    trace = s["device_traces"][0]
    actions = [(e["action"], e["addr"]) for e in trace]
    assert ("alloc", p1) in actions and ("alloc", p2) in actions
    i = actions.index(("free_requested", p3))
    assert actions[i + 1] == ("free_completed", p3)
    assert any(a == "segment_alloc" for a, _ in actions)
    assert all(e["time_us"] > 0 for e in trace)
    alloc_p1 = next(e for e in trace if e["action"] == "alloc" and e["addr"] == p1)
    assert alloc_p1["size"] == 3000 and alloc_p1["frames"] == blocks[p1]["frames"]
    symmem.free(p1)
    symmem.free(p2)
    symmem.empty_cache()
    trace = st.memory_snapshot()["device_traces"][0]
    assert any(e["action"] == "segment_free" for e in trace)


def test_history_ring_keeps_the_last_entries():
    st.record_memory_history(max_entries=4)
    try:
        ps = [symmem.alloc(512) for _ in range(6)]
        trace = st.memory_snapshot()["device_traces"][0]
        assert len(trace) == 4
        assert [e["addr"] for e in trace[-3:]] == ps[-3:]
        for p in ps:
            symmem.free(p)
    finally:
        st.record_memory_history(enabled=None)


def test_not_recording_means_no_history_and_no_stacks():
    st.record_memory_history(enabled=None)
    p = symmem.alloc(4096)
    s = st.memory_snapshot()
    _check_format(s)
    assert s["device_traces"][0] == []
    b = next(b for seg in s["segments"] for b in seg["blocks"] if b["address"] == p)
    assert b["frames"] == []
    symmem.free(p)


def test_dump_snapshot_pickles_like_torch(tmp_path, recording):
    p = symmem.alloc(70_000)
    f = tmp_path / "snap.pickle"
    st.dump_snapshot(str(f))
    with open(f, "rb") as fh:
        s = pickle.load(fh)
    _check_format(s)
    assert any(b["address"] == p for seg in s["segments"] for b in seg["blocks"])
    symmem.free(p)


def test_segment_svg_draws_every_segment(recording):
    ps = [symmem.alloc(n) for n in (1000, 200_000, 3 << 20, 12 << 20)]
    s = st.memory_snapshot()
    svg = snap.segment_svg(s)
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert svg.count("</title></rect>") == sum(
        1 for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
    for p in ps:
        assert f"{p:#x}:" in svg
        symmem.free(p)


def test_bad_arguments():
    with pytest.raises(symmem.InvalidArgumentError):
        st.record_memory_history(enabled="sometimes")
    with pytest.raises(symmem.InvalidArgumentError):
        st.record_memory_history(max_entries=0)
