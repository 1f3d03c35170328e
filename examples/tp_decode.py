"""The end of a tensor-parallel decode layer on libsymmem: a row-parallel
linear whose partial sums go straight into a symmetric tensor, then
symmem.torch.all_reduce_rmsnorm (all-reduce, residual add and RMSNorm in
one call), captured in a CUDA graph as a serving engine runs it.

    torchrun --nproc-per-node 2 examples/tp_decode.py [--tokens 8] [--hidden 4096]
        [--inter 14336] [--steps 4] [--dtype bfloat16] [--cpu]

Each rank holds inter / world_size of the layer's intermediate activations
and the matching rows of the output projection wo; the residual stream and
the norm's weight are replicated. A step:

1. torch.matmul(h_shard, wo_shard, out=x): this rank's partial sum of the
   layer's output, written into x, a tensor of libsymmem memory
   (symmem.torch.empty: the all-reduce reads it where it is);
2. out, residual = symmem.torch.all_reduce_rmsnorm(x, residual, weight,
   eps): residual += the sum over ranks; out = rmsnorm(residual) * weight.

The script runs --steps steps (graph replays on a GPU, eager calls with
--cpu), feeding each step's out back as the next step's activations, and
checks every step against the same layer on one device: the residual and
out within the dtype's rounding of an fp32 reference, and the same bits
on every rank. It prints "OK rank R ..." on each rank.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import symmem.torch as st  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8, help="tokens of the decode batch")
    ap.add_argument("--hidden", type=int, default=4096, help="a multiple of 8, at most 16384")
    ap.add_argument("--inter", type=int, default=14336, help="a multiple of the world size")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--cpu", action="store_true",
                    help="CPU tensors on libsymmem's host backend (SYMMEM_BACKEND=host), eager")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.cpu:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    dtype = getattr(torch, args.dtype)
    T, H, inter = args.tokens, args.hidden, args.inter
    g = torch.Generator(device="cpu").manual_seed(99)  # every rank makes every tensor alike
    wi = (torch.randn(H, inter, generator=g) * H ** -0.5).to(device, dtype)  # activations' stand-in
    wo = (torch.randn(inter, H, generator=g) * inter ** -0.5).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(H, generator=g)).to(device, dtype)
    first = torch.randn(T, H, generator=g).to(device, dtype)
    per = inter // world
    wi_shard, wo_shard = wi[:, rank * per:(rank + 1) * per], wo[rank * per:(rank + 1) * per].contiguous()

    x = st.empty(T, H, dtype=dtype, device=device)  # the all-reduce's symmetric input
    act = torch.empty(T, H, dtype=dtype, device=device)  # the step's input activations
    residual = torch.empty(T, H, dtype=dtype, device=device)
    out = torch.empty(T, H, dtype=dtype, device=device)

    def step():
        h_shard = F.silu(act @ wi_shard)
        torch.matmul(h_shard, wo_shard, out=x)
        st.all_reduce_rmsnorm(x, residual, weight, args.eps, out=out)
        act.copy_(out)

    act.copy_(first)
    residual.copy_(first)
    graph = None
    if device.type == "cuda":
        step()  # warm up: the rendezvous on x happens here, outside the capture
        torch.cuda.synchronize(device)
        act.copy_(first)
        residual.copy_(first)
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            step()
        torch.cuda.synchronize(device)
        act.copy_(first)
        residual.copy_(first)

    # The reference: the same layer on one device in fp32, rounded where the
    # layer's tensors are (x's sum, residual and out are dtype tensors).
    r_act, r_res = first.float(), first.float()
    worst = {"residual": 0.0, "out": 0.0}
    same = True
    for i in range(args.steps):
        if graph is not None:
            graph.replay()
            torch.cuda.synchronize(device)
        else:
            step()
        xs = F.silu(r_act.to(dtype) @ wi).float() @ wo.float()
        r_res = (r_res + xs).to(dtype).float()
        r_out = F.rms_norm(r_res, (H,), weight.float(), args.eps)
        scale = r_out.abs().max().item()
        worst["residual"] = max(worst["residual"], (residual.float() - r_res).abs().max().item() / r_res.abs().max().item())
        worst["out"] = max(worst["out"], (out.float() - r_out).abs().max().item() / scale)
        r_act = out.float()  # the next step starts from what the layer gave, as a serving engine would
        r_res = residual.float()
        mine = torch.cat([residual.reshape(-1), out.reshape(-1)]).view(torch.uint8 if dtype != torch.float32 else torch.int32).cpu()
        theirs = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(theirs, mine)
        same = same and all(torch.equal(t, theirs[0]) for t in theirs)
    tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}[args.dtype]
    text = f"residual {worst['residual']:.2e}, out {worst['out']:.2e} (of the largest magnitude)"
    dist.barrier()
    dist.destroy_process_group()
    if not same or worst["residual"] > tol or worst["out"] > tol:
        print(f"FAIL rank {rank}: bit-equal across ranks: {same}; worst errors {text} (tolerance {tol:g})", flush=True)
        raise SystemExit(1)
    print(f"OK rank {rank}/{world} {args.dtype} {T}x{H} {args.steps} steps "
          f"({'graph replays' if graph is not None else 'eager'}) on {device}: same bits on every rank; "
          f"worst errors {text}", flush=True)


if __name__ == "__main__":
    main()
