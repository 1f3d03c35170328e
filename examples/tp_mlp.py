"""A tensor-parallel MLP block (sequence parallel, as Megatron-LM and
torchtitan's async TP run it) on libsymmem's fused operators.

    torchrun --nproc-per-node 2 examples/tp_mlp.py [--tokens 4096] [--hidden 2048]
        [--ffn 8192] [--dtype bfloat16] [--cpu]

Each rank holds tokens / world_size rows of the activations and 1 /
world_size of each weight:

1. column-parallel linear: symmem.torch.fused_all_gather_matmul gathers
   every rank's rows and multiplies them by this rank's columns of w1
   (hidden x ffn / world_size), each rank's chunk multiplied as soon as it
   has arrived;
2. silu;
3. row-parallel linear: symmem.torch.fused_matmul_reduce_scatter
   multiplies by this rank's rows of w2 (ffn / world_size x hidden) and
   reduce-scatters the sum, each destination's chunk crossing while the
   next is computed: this rank's tokens / world_size rows of the output.

Then the backward pass of a loss over the output (the two operators' backward
passes are each other). The script checks the forward and every gradient
against the same block computed on one device with the whole weights, within
the dtype's tolerance, and prints "OK rank R ..." on each rank.

With --cpu (and SYMMEM_BACKEND=host) the same runs on CPU tensors in
libsymmem's host memory.
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


class TensorParallelMLP:
    """This rank's shards of w1 (columns) and w2 (rows)."""

    def __init__(self, w1, w2, rank: int, world: int):
        f = w1.shape[1] // world
        self.w1 = w1[:, rank * f:(rank + 1) * f].contiguous().requires_grad_()
        self.w2 = w2[rank * f:(rank + 1) * f].contiguous().requires_grad_()

    def forward(self, x_shard):
        _, (h,) = st.fused_all_gather_matmul(x_shard, [self.w1], gather_dim=0, return_a=False)
        return st.fused_matmul_reduce_scatter(F.silu(h), self.w2, "sum", scatter_dim=0)


def rel_err(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens in all (a multiple of the world size)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192, help="a multiple of the world size")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--cpu", action="store_true",
                    help="CPU tensors on libsymmem's host backend (SYMMEM_BACKEND=host)")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.cpu:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")  # the communication is libsymmem's; gloo names the group
    if args.tokens % world or args.ffn % world:
        raise SystemExit(f"--tokens {args.tokens} and --ffn {args.ffn} must be multiples of the world size {world}")
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device="cpu").manual_seed(4321)  # every rank makes every tensor alike
    x = (torch.randn(args.tokens, args.hidden, generator=g)).to(device, dtype)
    w1 = (torch.randn(args.hidden, args.ffn, generator=g) * args.hidden ** -0.5).to(device, dtype)
    w2 = (torch.randn(args.ffn, args.hidden, generator=g) * args.ffn ** -0.5).to(device, dtype)
    per = args.tokens // world
    x_shard = x[rank * per:(rank + 1) * per].clone().requires_grad_()

    mlp = TensorParallelMLP(w1, w2, rank, world)
    y = mlp.forward(x_shard)
    (y.float().square().mean() / world).backward()  # this rank's share of the mean over every token

    # The same block on one device, whole weights, in fp32.
    xr, w1r, w2r = (t.detach().float().requires_grad_() for t in (x, w1, w2))
    yr = F.silu(xr @ w1r) @ w2r
    yr.square().mean().backward()
    f = args.ffn // world
    checks = {
        "forward": rel_err(y.detach(), yr[rank * per:(rank + 1) * per].detach()),
        "grad x": rel_err(x_shard.grad, xr.grad[rank * per:(rank + 1) * per]),
        "grad w1": rel_err(mlp.w1.grad, w1r.grad[:, rank * f:(rank + 1) * f]),
        "grad w2": rel_err(mlp.w2.grad, w2r.grad[rank * f:(rank + 1) * f]),
    }
    tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 4e-2}[args.dtype]
    bad = {k: v for k, v in checks.items() if not v <= tol}
    text = ", ".join(f"{k} {v:.2e}" for k, v in checks.items())
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        print(f"FAIL rank {rank}: relative errors above {tol:g}: {text}", flush=True)
        raise SystemExit(1)
    print(f"OK rank {rank}/{world} {args.dtype} {args.tokens}x{args.hidden}x{args.ffn} on {device}: "
          f"relative errors {text}", flush=True)


if __name__ == "__main__":
    main()
