"""The FSDP shape on libsymmem's copy engines: each rank holds 1 / world_size
of every layer's weight; before a layer runs, its weight is all-gathered
into a preallocated buffer on a side stream, while the previous layer's
matmul runs on the main stream. The all-gathers run with sm_free=True (the
copy engines move the bytes, no kernel), so the matmuls keep every SM.

    torchrun --nproc-per-node 2 examples/fsdp_overlap.py [--layers 8] [--hidden 4096]
        [--tokens 4096] [--dtype bfloat16]

Per layer l: the side stream waits until the matmul that last read buffer
l % 2 is done, then gathers layer l's shards into it and records an event;
the main stream waits for that event and multiplies. So the gather of layer
l + 1 overlaps the matmul of layer l. The script checks every gathered
weight bit for bit against the whole weight (every rank makes every weight
from one seed) and the output against the same layers run with the whole
weights, within the dtype's tolerance, and prints "OK rank R ..." with the
time of the overlapped pass and of the same pass with every gather waited
for before its matmul.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import symmem.torch as st  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096, help="a multiple of the world size")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")  # the communication is libsymmem's; gloo names the group
    if args.hidden % world:
        raise SystemExit(f"--hidden {args.hidden} must be a multiple of the world size {world}")
    dtype = getattr(torch, args.dtype)
    h = args.hidden
    rows = h // world
    g = torch.Generator(device="cpu").manual_seed(1234)  # every rank makes every tensor alike
    weights = [(torch.randn(h, h, generator=g) * h ** -0.5).to(dtype) for _ in range(args.layers)]
    x0 = torch.randn(args.tokens, h, generator=g).to(device, dtype)
    # This rank's shard of every layer: rows [rank * rows, (rank + 1) * rows)
    # of the weight, in symmetric memory (the all-gather reads it where it
    # lies).
    shards = [st.empty((rows, h), dtype=dtype, device=device) for _ in range(args.layers)]
    for s, w in zip(shards, weights):
        s.copy_(w[rank * rows:(rank + 1) * rows])
    full = [torch.empty(h, h, dtype=dtype, device=device) for _ in range(2)]  # preallocated outputs
    side = torch.cuda.Stream(device=device)
    main_stream = torch.cuda.current_stream(device)

    def forward(overlap: bool, check: bool):
        gathered = [torch.cuda.Event() for _ in range(args.layers)]
        used = [torch.cuda.Event() for _ in range(args.layers)]
        bad = []

        def gather(l, after=None):
            with torch.cuda.stream(side):
                if l >= 2:
                    side.wait_event(used[l - 2])  # buffer l % 2 was last read by layer l - 2
                if after is not None:
                    side.wait_event(after)
                st.all_gather(shards[l], out=full[l % 2], sm_free=True)
                gathered[l].record(side)

        side.wait_stream(main_stream)  # the shards are written
        x = x0
        gather(0)
        for l in range(args.layers):
            if overlap and l + 1 < args.layers:
                gather(l + 1)
            main_stream.wait_event(gathered[l])
            if check and not torch.equal(full[l % 2], weights[l].to(device)):
                bad.append(l)
            x = x @ full[l % 2]
            used[l].record(main_stream)
            if not overlap and l + 1 < args.layers:
                gather(l + 1, after=used[l])  # in sequence: after the matmul
        main_stream.wait_stream(side)
        return x, bad

    # One pass checked, then timed passes: overlapped and in sequence.
    y, bad = forward(True, True)
    ref = x0.float()
    for w in weights:
        ref = (ref @ w.to(device).float()).to(dtype).float()
    err = float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))
    times = {}
    for name, overlap in (("overlapped", True), ("in sequence", False)):
        forward(overlap, False)
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(main_stream)
        for _ in range(5):
            forward(overlap, False)
        b.record(main_stream)
        b.synchronize()
        times[name] = a.elapsed_time(b) / 5
    tol = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}[args.dtype]
    dist.barrier()
    dist.destroy_process_group()
    if bad or not err <= tol:
        print(f"FAIL rank {rank}: gathered weights wrong at layers {bad}; output relative error {err:.2e} (tolerance {tol:g})",
              flush=True)
        raise SystemExit(1)
    print(f"OK rank {rank}/{world} {args.layers} layers {args.tokens}x{h} {args.dtype}: output relative error {err:.2e}, "
          f"every gathered weight exact; pass {times['overlapped']:.2f} ms overlapped, "
          f"{times['in sequence']:.2f} ms in sequence", flush=True)


if __name__ == "__main__":
    main()
