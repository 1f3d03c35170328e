"""Symmetric tensors in ordinary torch code (2 ranks).

(a) Rank 0 fills its symmetric int64 tensor with torch.arange (a kernel),
    barrier; rank 1 reads it through get_buffer (kernels on its own GPU
    reading rank 0's memory) and compares with the expected values, on the
    GPU, on the CPU, by sum, and through a storage_offset view.
(b) Every rank runs a matmul into a symmetric tensor from symmetric inputs
    and compares with the same matmul on ordinary tensors and on the CPU
    (inputs are small multiples of 1/8, so every result is exact and any
    summation order gives the same bits); then reads the next rank's result
    through the mapping and compares it with its own reference.
"""

from __future__ import annotations

from _symm_common import first_mismatch, run

N = 1 << 20  # int64 elements (8 MiB)
M, KK, P = 256, 128, 64


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    rank, world = ctx.rank, ctx.world
    dev = ctx.device
    out = {}
    g = ctx.group("g")

    # (a) -------------------------------------------------------------
    t = st.empty(N, dtype=torch.int64, device=ctx.dev)
    out["on_heap"] = symmem.pointer_info(t.data_ptr()).device == ctx.dev
    h = st.rendezvous(t, g, timeout=ctx.timeout)
    if rank == 0:
        torch.arange(N, out=t)  # a kernel writing the symmetric tensor (dtype and device from t)
    else:
        t.fill_(-7)
    ctx.stage("barrier after arange")
    h.barrier(stream=ctx.cur())
    ctx.sync("barrier after arange")
    if rank == 1:
        peer = h.get_buffer(0, (N,), torch.int64)
        want = torch.arange(N, dtype=torch.int64, device=dev)
        out["peer_device"] = str(peer.device)
        out["gpu_equal"] = first_mismatch(torch, peer, want)
        out["cpu_equal"] = first_mismatch(torch, peer.cpu(), torch.arange(N, dtype=torch.int64))
        out["peer_sum"] = int(peer.sum())
        out["want_sum"] = N * (N - 1) // 2
        part = h.get_buffer(0, (16,), torch.int64, storage_offset=1000)
        out["offset_view"] = part.cpu().tolist()
    # rank 0's own tensor was not disturbed by the reads
    if rank == 0:
        out["own_intact"] = first_mismatch(torch, t, torch.arange(N, dtype=torch.int64, device=dev))
    ctx.stage("barrier after the reads")
    h.barrier(stream=ctx.cur())
    ctx.sync("barrier after the reads")

    # (b) -------------------------------------------------------------
    def grid(rows, cols, mod):
        x = torch.arange(rows * cols, dtype=torch.float32, device=dev).view(rows, cols)
        return (torch.remainder(x, mod) - mod // 2) / 8

    a_ref, b_ref = grid(M, KK, 17), grid(KK, P, 13)
    a = st.empty(M, KK, dtype=torch.float32, device=ctx.dev)
    b = st.empty(KK, P, dtype=torch.float32, device=ctx.dev)
    c = st.empty(M, P, dtype=torch.float32, device=ctx.dev)
    a.copy_(a_ref)
    b.copy_(b_ref)
    torch.matmul(a, b, out=c)
    c_ref = torch.matmul(a_ref, b_ref)
    c_cpu = torch.matmul(a_ref.cpu(), b_ref.cpu())
    out["matmul_vs_torch"] = first_mismatch(torch, c, c_ref)
    out["matmul_vs_cpu"] = first_mismatch(torch, c.cpu(), c_cpu)
    out["sum"] = float(c.double().sum())
    out["sum_ref"] = float(c_cpu.double().sum())
    out["sum_f32_equal"] = bool(torch.equal(c.sum(), c_ref.sum()))
    d = a @ b  # an ordinary result from symmetric inputs
    out["matmul_from_symm_inputs"] = first_mismatch(torch, d, c_ref)
    hc = st.rendezvous(c, g, timeout=ctx.timeout)
    ctx.stage("barrier after the matmul")
    hc.barrier(stream=ctx.cur())
    ctx.sync("barrier after the matmul")
    nxt = (rank + 1) % world
    pc = hc.get_buffer(nxt, (M, P), torch.float32)
    out["peer_matmul"] = first_mismatch(torch, pc, c_ref)
    out["peer_matmul_sum"] = float(pc.double().sum())
    ctx.stage("final barrier")
    hc.barrier(stream=ctx.cur())
    ctx.sync("final barrier")
    hc.release()
    h.release()
    g.destroy()
    return out


if __name__ == "__main__":
    run(body)
