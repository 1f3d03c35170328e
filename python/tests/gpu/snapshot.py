"""A heap snapshot of libsymmem as torch's global allocator, fed to
PyTorch's own visualiser code (torch.cuda._memory_viz): segsum (which asserts
that the segments add up), trace, segment_plot and trace_plot (HTML that
embeds the pickled snapshot, decoded back here). With $OUT set, the HTML
pages, the pickle (open it at pytorch.org/memory_viz) and an SVG picture are
written there."""

from __future__ import annotations

import base64
import os
import pickle
import re

from _common import install_symmem, result

install_symmem()

import torch  # noqa: E402
from torch.cuda import _memory_viz as mv  # noqa: E402

import symmem.torch as st  # noqa: E402
from symmem.snapshot import segment_svg  # noqa: E402

st.record_memory_history(max_entries=100_000)


def train_steps(model, opt, steps):
    for _ in range(steps):
        x = torch.randn(64, 256, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train_steps(model, opt, 3)
keep = [torch.empty(n, device="cuda") for n in (1000, 300_000, 5_000_000)]
del keep[1]
torch.cuda.synchronize()
snap = st.memory_snapshot()

active = [(b["address"], b["size"]) for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
ptrs = [p.data_ptr() for p in model.parameters()] + [k.data_ptr() for k in keep]
in_blocks = all(any(a <= p < a + n for a, n in active) for p in ptrs)
summary = mv.segsum(snap)  # asserts free + allocated == reserved
trace_text = mv.trace(snap)
seg_html = mv.segment_plot(snap)
trace_html = mv.trace_plot(snap)


def embedded(html):
    m = re.search(r'"base64": "([^"]+)"', html)
    return pickle.loads(base64.b64decode(m.group(1))) if m else None


back = embedded(seg_html)
roundtrip = back is not None and back["segments"] == snap["segments"] and back["device_traces"] == snap["device_traces"]
me = os.path.abspath(__file__)
frames_ok = any(
    any(f["filename"] == me and f["name"] == "train_steps" for f in e["frames"])
    for e in snap["device_traces"][0]
    if e["action"] == "alloc"
)
out = os.environ.get("OUT")
if out:
    os.makedirs(out, exist_ok=True)
    for name, text in (("segment_plot.html", seg_html), ("trace_plot.html", trace_html),
                       ("heap.svg", segment_svg(snap, title="libsymmem heap under PyTorch (H200), device 0")),
                       ("segsum.txt", summary), ("trace.txt", trace_text)):
        with open(os.path.join(out, "snapshot_" + name), "w") as f:
            f.write(text)
    with open(os.path.join(out, "snapshot.pickle"), "wb") as f:
        pickle.dump(snap, f)
result(
    segments=len(snap["segments"]),
    events=len(snap["device_traces"][0]),
    in_blocks=in_blocks,
    segsum_ok="total_reserved" in summary,
    trace_ok="entries" in trace_text and "cudaMalloc" in trace_text,
    html_ok=seg_html.count("<html>") == 1 and trace_html.count("<html>") == 1,
    roundtrip=roundtrip,
    frames_ok=frames_ok,
)
