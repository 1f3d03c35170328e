"""A peer's buffer is the peer GPU's memory, not a copy (2 ranks, 2 GPUs).

Rank 1 writes a pattern into rank 0's buffer through the mapping (a kernel
on cuda:1 storing over NVLink); after a barrier rank 0 reads its own tensor
with torch on cuda:0 and finds the pattern. Then rank 0 doubles its tensor
in place on cuda:0 and rank 1 reads the doubled values through the mapping.
Mapping the peer's 256 MiB must not take 256 MiB of our own GPU's memory.
"""

from __future__ import annotations

from _symm_common import first_mismatch, run

N = 64 << 20  # floats: 256 MiB


def pattern(torch, device):
    # Exact in float32 (small integers).
    return (torch.remainder(torch.arange(N, dtype=torch.int64, device=device), 4099) + 1).to(torch.float32)


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    rank = ctx.rank
    if ctx.world != 2:
        raise ValueError(f"symm_peer_gpu.py needs 2 ranks, got {ctx.world}")
    g = ctx.group("g")
    t = st.empty(N, dtype=torch.float32, device=ctx.dev)
    t.zero_()
    out = {
        "tensor_device": str(t.device),
        "heap_device": symmem.pointer_info(t.data_ptr()).device,
        "nbytes": N * 4,
    }
    ctx.sync("zero")
    free_before = torch.cuda.mem_get_info(ctx.dev)[0]
    h = st.rendezvous(t, g, timeout=ctx.timeout)
    free_after = torch.cuda.mem_get_info(ctx.dev)[0]
    out["rendezvous_took_bytes"] = int(free_before - free_after)
    peer = 1 - rank
    p = h.get_buffer(peer, (N,), torch.float32)
    out["peer_tensor_device"] = str(p.device)
    ctx.stage("barrier after zeroing")
    h.barrier(stream=ctx.cur())

    if rank == 1:
        p.copy_(pattern(torch, ctx.device))  # cuda:1 writes rank 0's memory
    ctx.stage("barrier after rank 1's write")
    h.barrier(stream=ctx.cur())
    ctx.sync("barrier after rank 1's write")
    if rank == 0:
        want = pattern(torch, ctx.device)
        out["own_after_peer_write"] = first_mismatch(torch, t, want)
        out["own_sum"] = float(t.double().sum())
        out["want_sum"] = float(want.double().sum())
        out["own_head_cpu"] = t[:4].cpu().tolist()
        t.mul_(2)  # on cuda:0, in place
        del want
    ctx.stage("barrier after rank 0's doubling")
    h.barrier(stream=ctx.cur())
    ctx.sync("barrier after rank 0's doubling")
    if rank == 1:
        out["peer_after_double"] = first_mismatch(torch, p, pattern(torch, ctx.device) * 2)
        out["own_untouched"] = bool(torch.all(t == 0))  # nobody wrote rank 1's buffer
    ctx.stage("final barrier")
    h.barrier(stream=ctx.cur())
    ctx.sync("final barrier")
    del p
    h.release()
    g.destroy()
    return out


if __name__ == "__main__":
    run(body)
