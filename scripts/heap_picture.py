#!/usr/bin/env python3
"""Draws docs/heap_snapshot.svg, the README's picture of the heap: a
host-backend snapshot after a made-up training step's pattern (weights kept,
activations of several sizes, some freed), drawn by symmem.snapshot.segment_svg.

    SYMMEM_LIBRARY=build/libsymmem.so python3 scripts/heap_picture.py [out.svg]
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
os.environ.setdefault("SYMMEM_BACKEND", "host")

import symmem  # noqa: E402
import symmem.torch as st  # noqa: E402
from symmem.snapshot import segment_svg  # noqa: E402

rng = random.Random(7)
st.record_memory_history()
weights = [symmem.alloc(n) for n in (4 << 20, 4 << 20, 1 << 20, 256 << 10, 16 << 20)]
acts = [symmem.alloc(rng.choice((3000, 70_000, 300_000, 900_000, 2 << 20, 6 << 20))) for _ in range(40)]
for p in rng.sample(acts, 22):
    symmem.free(p)
out = sys.argv[1] if len(sys.argv) > 1 else "docs/heap_snapshot.svg"
with open(out, "w") as f:
    f.write(segment_svg(st.memory_snapshot(), title="libsymmem heap (host backend), device 0"))
print("wrote", out)
