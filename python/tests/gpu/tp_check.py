"""The tensor-parallel operators on GPUs (test_tensor_parallel_gpu.py).

usage: tp_check.py REPLAYS

1. symmem.torch.all_reduce_rmsnorm at the decode shapes of the benchmark (1x4096 .. 128x8192) and
   more, bfloat16 / float16 / float32, every algorithm that can run: the
   residual and out bit for bit against a torch emulation of the
   documented rounding (docs/tensor-parallel.md), within the dtype's
   rounding of an fp32 reference (torch.nn.functional.rms_norm), and the
   same bits on every rank; an x that is not libsymmem memory (staged);
   a CUDA graph replayed REPLAYS times with new inputs.
2. fused_all_gather_matmul and fused_matmul_reduce_scatter against an fp32
   reference and against torch.ops.symm_mem's own operators (where this
   torch can run them: otherwise "torch_unavailable" says why), 2-D and
   3-D, sum and avg; captured in a CUDA graph and replayed (the same bits
   as eager); the backward of a column- then row-parallel MLP against
   autograd on one GPU.
"""

from __future__ import annotations

import os
import sys

from _symm_common import run


def emulate(torch, xs, residual, weight, eps, dtype, device="cpu"):
    """residual and out of the documented rounding, on the CPU (IEEE fp32
    operations, none fused): xs every rank's input in rank order. On
    device="cuda:N" the same operations run on that GPU (explain())."""
    xs = [x.to(device) for x in xs]
    residual, weight = residual.to(device), weight.to(device)
    acc = xs[0].float()
    for x in xs[1:]:
        acc = acc + x.float()
    res = (acc.to(dtype).float() + residual.float()).to(dtype).float()
    T, H = res.shape
    sq = (res * res).view(T, H // 8, 8)
    parts = torch.zeros(T, 256, device=device)
    for o0 in range(0, H // 8, 256):
        blk = sq[:, o0:o0 + 256, :]
        for e in range(8):
            parts[:, :blk.shape[1]] = parts[:, :blk.shape[1]] + blk[:, :, e]
    s = 128
    while s >= 1:
        parts[:, :s] = parts[:, :s] + parts[:, s:2 * s]
        s //= 2
    emulate.last_ss = parts[:, 0].clone()
    # The quotient, sum, square root and reciprocal of fp32 values, each
    # correctly rounded to fp32: computed in fp64 and rounded once (exact
    # for these four operations), because torch's CPU kernels need not
    # round them correctly (its 1 / sqrt(x) is one fp32 step off at times).
    eps32 = torch.tensor(eps, dtype=torch.float32).double().to(device)
    mean = (parts[:, 0].double() / H).float()
    denom = torch.sqrt((mean.double() + eps32).float().double()).float()
    inv = (1.0 / denom.double()).float()
    out = ((res * inv[:, None]) * weight.float()).to(dtype)
    emulate.last_inv = inv
    return res.to(dtype).cpu(), out.cpu()


def explain(torch, got, want, res, weight, dtype, xs, residual0, eps, device) -> str:
    """Where out differs from the emulation: the first element's bits and
    whether the row's inv one fp32 step up or down gives the kernel's
    value (then the row's sum of squares or its square root differed)."""
    H = res.shape[1]
    bad = (got != want).reshape(-1).nonzero().reshape(-1)
    i = int(bad[0])
    t, h = divmod(i, H)
    inv = emulate.last_inv[t]
    ss = float(emulate.last_ss[t])
    _, gpu_out = emulate(torch, xs, residual0, weight, eps, dtype, device)
    gpu_inv, gpu_ss = float(emulate.last_inv[t]), float(emulate.last_ss[t])
    emulate(torch, xs, residual0, weight, eps, dtype)  # the CPU's again
    r, w = res.float()[t, h], weight.float()[h]
    near = []
    for way in (float("inf"), float("-inf")):
        step = torch.nextafter(inv, torch.tensor(way))
        if bool((((res.float()[t] * step) * weight.float()).to(dtype) == got[t]).all()):
            near.append("up" if way > 0 else "down")
    bits = (lambda v: int(v.view(torch.int16)) & 0xffff) if dtype != torch.float32 else (
        lambda v: int(v.view(torch.int32)) & 0xffffffff)
    return (f"{bad.numel()} elements, first row {t} column {h}: got {float(got[t, h])!r} ({bits(got[t, h]):#x}), "
            f"emulation {float(want[t, h])!r} ({bits(want[t, h]):#x}), residual {float(r)!r}, weight {float(w)!r}, "
            f"inv {float(inv)!r}; the row's inv one step {' or '.join(near) or 'up or down does not'} "
            f"{'gives' if near else 'give'} the kernel's row; the CPU's ss {ss!r}, the GPU emulation's ss "
            f"{gpu_ss!r} inv {gpu_inv!r}, whose out {'equals' if torch.equal(gpu_out, got) else 'differs from'} "
            f"the kernel's")


def bits_sum(torch, *ts) -> list:
    """Two position-weighted sums of the tensors' bytes: equal bits give
    equal sums (compared across ranks without moving the tensors)."""
    v = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in ts]).to(torch.int64)
    pos = torch.arange(v.numel(), device=v.device, dtype=torch.int64)
    return [int(v.sum()), int((v * (pos % 1000003 + 1)).sum())]


def rel(torch, got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def body(ctx):
    torch = ctx.torch
    import torch.nn.functional as F

    import symmem
    import symmem.torch as st

    replays = int(sys.argv[1])
    W, me, dev = ctx.world, ctx.rank, ctx.device
    symmem.collectives_load(ctx.dev)
    dist = ctx.init_dist()
    out = {"norm_failures": [], "norm_checked": 0, "fused_failures": [], "fused_checked": 0}
    tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}
    eps = 1e-6

    def inputs(T, H, dtype, call):
        g = torch.Generator().manual_seed(1000 + call)
        xs = [(torch.randn(T, H, generator=g) * 2).to(dtype) for _ in range(W)]
        residual = torch.randn(T, H, generator=g).to(dtype)
        weight = (1 + torch.randn(H, generator=g) / 8).to(dtype)
        return xs, residual, weight

    def norm_case(T, H, dtype, algo, where, call):
        ctx.stage(f"all_reduce_rmsnorm {dtype} {T}x{H} {algo} {where}")
        xs, residual0, weight = inputs(T, H, dtype, call)
        x = (st.empty(T, H, dtype=dtype, device=ctx.dev) if where != "staged"
             else torch.empty(T, H, dtype=dtype, device=dev))
        x.copy_(xs[me])
        residual = residual0.to(dev)
        o = x if where == "inplace" else None
        o, _ = st.all_reduce_rmsnorm(x, residual, weight.to(dev), eps, out=o, algo=algo)
        ctx.wait_gpu(f"norm {call}")
        want_res, want_out = emulate(torch, xs, residual0, weight, eps, dtype)
        ref_res = sum(t.float() for t in xs) + residual0.float()
        ref_out = F.rms_norm(ref_res, (H,), weight.float(), eps)
        case = f"{dtype} {T}x{H} {algo} {where}"
        if not torch.equal(residual.cpu(), want_res):
            out["norm_failures"].append(f"{case}: residual differs from the emulation")
        if not torch.equal(o.cpu(), want_out):
            out["norm_failures"].append(f"{case}: out differs from the emulation at "
                                        + explain(torch, o.cpu(), want_out, want_res, weight, dtype, xs, residual0, eps, dev))
        if rel(torch, o.cpu(), ref_out) > tol[dtype]:
            out["norm_failures"].append(f"{case}: out is {rel(torch, o.cpu(), ref_out):.2e} from the fp32 reference")
        hashes = [None] * W
        dist.all_gather_object(hashes, bits_sum(torch, residual, o))
        if any(h != hashes[0] for h in hashes):
            out["norm_failures"].append(f"{case}: the ranks' bits differ")
        out["norm_checked"] += 1

    call = 0
    shapes = [(1, 4096), (8, 4096), (32, 8192), (128, 8192), (3, 16384), (1024, 4096)]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for T, H in shapes if dtype == torch.bfloat16 else shapes[:2] + shapes[3:5]:
            nbytes = T * H * torch.tensor([], dtype=dtype).element_size()
            algos = [None, "one_shot", "two_shot"] + (["low_latency"] if nbytes <= 256 << 10 else [])
            for algo in algos:
                for where in (("inplace",) if algo == "two_shot" else ("new", "inplace")):
                    call += 1
                    norm_case(T, H, dtype, algo, where, call)
    call += 1
    norm_case(8, 4096, torch.bfloat16, None, "staged", call)

    # A CUDA graph of the decode step's norm, replayed with new inputs.
    ctx.stage("all_reduce_rmsnorm in a CUDA graph")
    T, H, dtype = 8, 4096, torch.bfloat16
    x = st.empty(T, H, dtype=dtype, device=ctx.dev)
    residual = torch.zeros(T, H, dtype=dtype, device=dev)
    weight = torch.ones(H, dtype=dtype, device=dev)
    o = torch.empty(T, H, dtype=dtype, device=dev)
    st.all_reduce_rmsnorm(x, residual, weight, eps, out=o)  # the rendezvous, outside the capture
    torch.cuda.synchronize(dev)
    gs = torch.cuda.Stream(device=dev)
    gs.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=gs):
        st.all_reduce_rmsnorm(x, residual, weight, eps, out=o)
    graph_bad = []
    for i in range(replays):
        call += 1
        xs, residual0, w0 = inputs(T, H, dtype, call)
        x.copy_(xs[me])
        residual.copy_(residual0)
        weight.copy_(w0)
        torch.cuda.synchronize(dev)
        graph.replay()
        ctx.wait_gpu(f"norm replay {i}")
        want_res, want_out = emulate(torch, xs, residual0, w0, eps, dtype)
        if not (torch.equal(residual.cpu(), want_res) and torch.equal(o.cpu(), want_out)):
            graph_bad.append(i)
    out["norm_graph_bad_replays"] = graph_bad

    # -- the fused matmuls
    def check_close(what, got, want, t=2e-2):
        out["fused_checked"] += 1
        if got.shape != want.shape:
            out["fused_failures"].append(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
            return
        e = float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))
        if not e <= t:
            out["fused_failures"].append(f"{what}: relative error {e:.2e}")

    group_name = dist.group.WORLD.group_name
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.enable_symm_mem_for_group(group_name)  # needed before torch 2.9, a no-op after
    except Exception:  # noqa: BLE001 - torch's operators then report why they cannot run
        pass
    torch_ops = getattr(getattr(torch.ops, "symm_mem", None), "fused_all_gather_matmul", None)
    torch_why = None if torch_ops is not None else "torch.ops.symm_mem.fused_all_gather_matmul is missing"
    g = torch.Generator().manual_seed(77)
    bit_equal = {}
    for shape, gd in (((1024, 4096), 0), ((4, 256, 4096), 1), ((512, 2048), 1)):
        ctx.stage(f"fused_all_gather_matmul {shape} gather_dim {gd}")
        shards = [torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in range(W)]
        k = shape[-1] * (W if gd == len(shape) - 1 else 1)
        bs = [(torch.randn(k, 2048, generator=g) / k ** 0.5).to(torch.bfloat16).to(dev),
              (torch.randn(k, 1024, generator=g) / k ** 0.5).to(torch.bfloat16).to(dev)]
        a_full = torch.cat(shards, dim=gd).to(dev)
        a, outs = st.fused_all_gather_matmul(shards[me].to(dev), bs, gd)
        ctx.wait_gpu("fused_all_gather_matmul")
        what = f"ag {shape} gather_dim {gd}"
        out["fused_checked"] += 1
        if not torch.equal(a, a_full):
            out["fused_failures"].append(f"{what}: A differs from the gathered shards")
        for i, b in enumerate(bs):
            check_close(f"{what}: A @ B{i}", outs[i], a_full.float() @ b.float())
        if torch_ops is not None and torch_why is None:
            try:
                ta, touts = torch.ops.symm_mem.fused_all_gather_matmul(shards[me].to(dev), bs, gd, group_name)
                ctx.wait_gpu("torch's fused_all_gather_matmul")
                for i in range(len(bs)):
                    check_close(f"{what}: A @ B{i} against torch's", outs[i], touts[i])
                bit_equal[what] = all(torch.equal(outs[i], touts[i]) for i in range(len(bs)))
            except Exception as exc:  # noqa: BLE001 - reported
                torch_why = f"{type(exc).__name__}: {exc}"[:400]
    rs_ops = getattr(getattr(torch.ops, "symm_mem", None), "fused_matmul_reduce_scatter", None)
    for shape, sd, op in (((2048, 2048), 0, "sum"), ((2048, 2048), 0, "avg"), ((4, 512, 2048), 1, "sum"),
                          ((1024, 2048), 1, "sum")):
        ctx.stage(f"fused_matmul_reduce_scatter {shape} scatter_dim {sd} {op}")
        As = [torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in range(W)]
        b = (torch.randn(shape[-1], 4096, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16).to(dev)
        total = sum(t.to(dev).float() @ b.float() for t in As)
        if op == "avg":
            total = total / W
        want = total.chunk(W, dim=sd)[me]
        got = st.fused_matmul_reduce_scatter(As[me].to(dev), b, op, sd)
        ctx.wait_gpu("fused_matmul_reduce_scatter")
        what = f"rs {shape} scatter_dim {sd} {op}"
        check_close(what, got, want)
        if rs_ops is not None and torch_why is None:
            try:
                theirs = torch.ops.symm_mem.fused_matmul_reduce_scatter(As[me].to(dev), b, op, sd, group_name)
                ctx.wait_gpu("torch's fused_matmul_reduce_scatter")
                check_close(f"{what} against torch's", got, theirs)
                bit_equal[what] = bool(torch.equal(got, theirs))
            except Exception as exc:  # noqa: BLE001 - reported
                torch_why = f"{type(exc).__name__}: {exc}"[:400]
    out["torch_unavailable"] = torch_why
    out["bit_equal_to_torch"] = bit_equal

    # Captured in a CUDA graph: the same bits as eager.
    ctx.stage("fused operators in a CUDA graph")
    x_shard = torch.randn(1024, 2048, generator=g).to(torch.bfloat16).to(dev)
    w1 = (torch.randn(2048, 4096, generator=g) / 45).to(torch.bfloat16).to(dev)
    w2 = (torch.randn(4096, 2048, generator=g) / 64).to(torch.bfloat16).to(dev)

    def mlp():
        _, (h,) = st.fused_all_gather_matmul(x_shard, [w1], 0, return_a=False)
        return st.fused_matmul_reduce_scatter(F.silu(h), w2, "sum", 0)

    eager = mlp().clone()
    torch.cuda.synchronize(dev)
    gs.wait_stream(torch.cuda.current_stream(dev))
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2, stream=gs):
        static = mlp()
    replay_bad = 0
    for i in range(replays):
        graph2.replay()
        ctx.wait_gpu(f"fused replay {i}")
        replay_bad += int(not torch.equal(static, eager))
    out["fused_graph_bad_replays"] = replay_bad

    # Backward of the MLP against autograd on one GPU.
    ctx.stage("backward")
    per_tok, hid, ffn = 512, 1024, 2048 * W
    xs_all = torch.randn(per_tok * W, hid, generator=g)
    w1_all = torch.randn(hid, ffn, generator=g) / hid ** 0.5
    w2_all = torch.randn(ffn, hid, generator=g) / ffn ** 0.5
    f = ffn // W
    xs = xs_all[me * per_tok:(me + 1) * per_tok].to(dev, torch.bfloat16).requires_grad_()
    w1s = w1_all[:, me * f:(me + 1) * f].to(dev, torch.bfloat16).requires_grad_()
    w2s = w2_all[me * f:(me + 1) * f].to(dev, torch.bfloat16).requires_grad_()
    _, (h,) = st.fused_all_gather_matmul(xs, [w1s], 0, return_a=False)
    y = st.fused_matmul_reduce_scatter(F.silu(h), w2s, "sum", 0)
    (y.float().square().mean() / W).backward()
    xr, w1r, w2r = (t.to(dev).requires_grad_() for t in (xs_all, w1_all, w2_all))
    yr = F.silu(xr @ w1r) @ w2r
    yr.square().mean().backward()
    sl = slice(me * per_tok, (me + 1) * per_tok)
    check_close("backward: y", y, yr[sl].detach(), 4e-2)
    check_close("backward: grad x", xs.grad, xr.grad[sl], 4e-2)
    check_close("backward: grad w1", w1s.grad, w1r.grad[:, me * f:(me + 1) * f], 4e-2)
    check_close("backward: grad w2", w2s.grad, w2r.grad[me * f:(me + 1) * f], 4e-2)
    h = st._fast_entry(torch, x, None)[4]
    out["device_error"] = h.handle.device_error()
    if out["norm_failures"] and os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"norm_failures_rank{me}.txt"), "w") as f:
            f.write("\n".join(out["norm_failures"]) + "\n")
    return out


if __name__ == "__main__":
    run(body)
