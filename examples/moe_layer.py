"""A mixture-of-experts layer with expert parallelism on libsymmem.

    torchrun --nproc-per-node 2 examples/moe_layer.py [--tokens 1024] [--hidden 1024]
        [--ffn 2048] [--experts 8] [--top-k 2] [--major-align 16] [--grouped]

Each rank holds experts / world_size of the experts and a batch of tokens.
The forward pass:

1. router: logits = x @ w_router, top-k experts per token, softmax weights;
2. dispatch: the token copies sorted by global expert id (so that they are
   grouped by destination rank, then by its local expert: the send order
   of all_to_all_v_2d), the split sizes counted on the GPU, and
   symmem.torch.all_to_all_v_2d moves them to the ranks owning the
   experts, grouped there by local expert (each group starting at a
   multiple of major_align, for grouped GEMMs);
3. experts: each local expert's group through its FFN (silu(h @ w1) @ w2),
   in place; a loop of matmuls over the groups, or with --grouped one
   torch._grouped_mm per weight where this torch has it;
4. combine: symmem.torch.all_to_all_v_2d_offset sends every row back to
   the rank it came from, in the order it was sent;
5. the weighted sum of each token's k expert outputs.

No split size ever goes through the host on the way (the --grouped path
has no host synchronisation at all; the loop reads the group bounds once
to slice). The script then checks its result against the same layer
computed on this GPU with every expert and no exchange: the data movement
exactly (dispatch then combine of the unchanged rows gives back every
token copy, bit for bit), the forward within bf16 tolerance, and prints
"OK rank R ..." on each rank.

Ranks may share a GPU (SYMMEM_ALLOW_OVERLAPPING_DEVICES=1) when there are
fewer GPUs than ranks; with --cpu (and SYMMEM_BACKEND=host) the same runs on
CPU tensors in libsymmem's host memory.
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


class ExpertParallelMoE:
    """The experts of this rank, and the buffers of the exchange (made once,
    reused by every forward: the rendezvous happens at the first call)."""

    def __init__(self, args, rank: int, world: int, device):
        self.rank, self.world, self.device = rank, world, device
        self.n_experts, self.top_k, self.align = args.experts, args.top_k, args.major_align
        self.local = args.experts // world
        self.grouped = args.grouped and hasattr(torch, "_grouped_mm")
        g = torch.Generator(device="cpu").manual_seed(1234)  # every rank makes every weight alike
        scale = args.hidden ** -0.5
        self.w_router = (torch.randn(args.hidden, args.experts, generator=g) * scale).to(device)
        w1 = torch.randn(args.experts, args.hidden, args.ffn, generator=g) * scale
        w2 = torch.randn(args.experts, args.ffn, args.hidden, generator=g) * args.ffn ** -0.5
        self.w1_all, self.w2_all = w1.to(device, torch.bfloat16), w2.to(device, torch.bfloat16)
        mine = slice(rank * self.local, (rank + 1) * self.local)
        self.w1, self.w2 = self.w1_all[mine], self.w2_all[mine]
        # torch._grouped_mm takes its (groups, K, N) operand column-major
        self.w1g = self.w1.transpose(1, 2).contiguous().transpose(1, 2)
        self.w2g = self.w2.transpose(1, 2).contiguous().transpose(1, 2)
        copies = args.tokens * args.top_k
        # The dispatch's input and the combine's input are symmetric (peers
        # read them); out and the split tensors are ordinary tensors.
        self.send = st.empty(copies, args.hidden, dtype=torch.bfloat16, device=device)
        recv_rows = world * copies + self.local * self.align  # every copy of every rank, plus padding
        self.recv = st.empty(recv_rows, args.hidden, dtype=torch.bfloat16, device=device)
        self.back = torch.empty(copies, args.hidden, dtype=torch.bfloat16, device=device)
        S = world * self.local
        self.dispatch_so = torch.empty(2, S, dtype=torch.int64, device=device)
        self.combine_so = torch.empty(2, S, dtype=torch.int64, device=device)

    def route(self, x):
        logits = x.float() @ self.w_router
        weights, experts = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(weights, dim=-1), experts

    def expert_ffn(self, h, w1, w2):
        return F.silu(h @ w1) @ w2

    def run_experts(self):
        """Each local expert's rows of recv through its FFN, in place."""
        E, W, A = self.local, self.world, self.align
        rows = self.dispatch_so[0].view(E, W).sum(dim=1)
        taken = torch.clamp((rows + A - 1) // A * A, min=A)  # each group's rows, padding included
        if self.grouped:
            # One GEMM per weight over every group (rows past the last
            # group are computed and never sent back): no host sync.
            ends = torch.cumsum(taken, 0).to(torch.int32)
            h = F.silu(torch._grouped_mm(self.recv, self.w1g, offs=ends))
            self.recv.copy_(torch._grouped_mm(h.to(torch.bfloat16), self.w2g, offs=ends))
            return
        starts = (torch.cumsum(taken, 0) - taken).tolist()
        for e, (a, n) in enumerate(zip(starts, rows.tolist())):
            if n:
                self.recv[a:a + n] = self.expert_ffn(self.recv[a:a + n], self.w1[e], self.w2[e])

    def exchange(self, x, experts):
        """Dispatch the token copies; returns (order, splits) for the combine."""
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # grouped by (destination rank, its local expert)
        self.send[: flat.numel()].copy_(x[order // self.top_k])
        splits = torch.bincount(flat, minlength=self.n_experts)
        st.all_to_all_v_2d(self.send, self.recv, splits, self.dispatch_so, major_align=self.align)
        return order

    def combine(self, order, weights, tokens):
        st.all_to_all_v_2d_offset(self.recv, self.back, self.dispatch_so, self.combine_so)
        y = torch.empty_like(self.back)
        y[order] = self.back  # row j of back answers token copy order[j]
        y = y.view(tokens, self.top_k, -1).float()
        return (y * weights[..., None]).sum(dim=1).to(torch.bfloat16)

    def forward(self, x):
        weights, experts = self.route(x)
        order = self.exchange(x, experts)
        self.run_experts()
        return self.combine(order, weights, x.shape[0])

    def reference(self, x):
        """The same layer on this GPU with every expert and no exchange."""
        weights, experts = self.route(x)
        flat = experts.reshape(-1)
        rows = x[torch.arange(flat.numel(), device=x.device) // self.top_k]
        y = torch.empty_like(rows)
        for g in range(self.n_experts):
            sel = (flat == g).nonzero().flatten()
            if sel.numel():
                y[sel] = self.expert_ffn(rows[sel], self.w1_all[g], self.w2_all[g])
        y = y.view(x.shape[0], self.top_k, -1).float()
        return (y * weights[..., None]).sum(dim=1).to(torch.bfloat16)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tokens_of(rank, args, device):
    g = torch.Generator(device="cpu").manual_seed(100 + rank)
    return torch.randn(args.tokens, args.hidden, generator=g).to(device, torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=8, help="experts in all (a multiple of the world size)")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--major-align", type=int, default=16)
    ap.add_argument("--grouped", action="store_true", help="torch._grouped_mm for the experts where available")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU tensors on libsymmem's host backend (SYMMEM_BACKEND=host): the same exchange without a GPU")
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.cpu:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")  # the exchange itself is libsymmem's; gloo only for the check
    if args.experts % world:
        raise SystemExit(f"--experts {args.experts} is not a multiple of the world size {world}")
    layer = ExpertParallelMoE(args, rank, world, device)
    x = tokens_of(rank, args, device)

    # 1. The data movement alone, exactly: dispatch, no expert, combine.
    weights, experts = layer.route(x)
    order = layer.exchange(x, experts)
    st.all_to_all_v_2d_offset(layer.recv, layer.back, layer.dispatch_so, layer.combine_so)
    sync(device)
    moved_back = torch.equal(layer.back, x[order // args.top_k])
    # What arrived here: every rank's copies for our experts, grouped by
    # expert, then by source rank, in the source's order.
    want_rows = []
    for e in range(layer.local):
        g = rank * layer.local + e
        for s in range(world):
            xs = tokens_of(s, args, device)
            _, ex = layer.route(xs)
            flat = ex.reshape(-1)
            sel = torch.argsort(flat, stable=True)
            sel = sel[flat[sel] == g]
            want_rows.append(xs[sel // args.top_k])
    so = layer.dispatch_so.cpu()
    arrived = torch.cat([layer.recv[int(so[1][i]): int(so[1][i]) + int(so[0][i])] for i in range(so.shape[1])])
    dispatched = torch.equal(arrived, torch.cat(want_rows))

    # 2. The layer's forward against the one-GPU reference.
    y = layer.forward(x)
    ref = layer.reference(x)
    sync(device)
    err = (y.float() - ref.float()).abs().max().item()
    tol = 2e-2 * ref.float().abs().max().item() + 1e-2
    ok = moved_back and dispatched and err <= tol
    flags = torch.tensor([int(ok)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    recv_rows = int(so[0].sum())
    print(f"{'OK' if ok else 'FAILED'} rank {rank}: {recv_rows} rows arrived for experts "
          f"{rank * layer.local}..{(rank + 1) * layer.local - 1}; round trip exact {moved_back}, "
          f"dispatch exact {dispatched}; forward max |y - reference| {err:.3g} (tolerance {tol:.3g})"
          f"{'; grouped GEMM' if layer.grouped else ''}", flush=True)
    dist.barrier()  # no rank tears down its connections while a peer still uses them
    dist.destroy_process_group()
    return 0 if int(flags) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
