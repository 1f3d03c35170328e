"""Rank function of test_tensor_parallel.py's torch test (run by
_mp.run_ranks): symmem.torch's tensor-parallel operators on either backend
(CPU tensors on the host backend, CUDA tensors on cuda). The fused
matmuls take small integers, exact in bfloat16 and float32 and in every
sum here, so that their results compare exactly with the same arithmetic
done on the whole tensors. torch is imported inside."""

from __future__ import annotations

from typing import Dict

from _tp_ref import reference


def _ints(torch, seed: int, shape, dtype, device, lo=-2, hi=2):
    """Integers in [lo, hi): every product sum here stays below 256 in
    magnitude, exact in bfloat16."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(dtype).to(device)


def run(rank: int, world: int, init_file: str) -> Dict:
    import torch
    import torch.distributed as dist

    import symmem
    import symmem.torch as st

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if symmem.backend_name() == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    res: Dict = {"fail": []}

    def check(what, ok):
        if not ok:
            res["fail"].append(what)

    # -- all_reduce_rmsnorm: bit for bit against _tp_ref, x symmetric or not.
    for dtype, symmetric in ((torch.bfloat16, True), (torch.float32, False), (torch.float16, True)):
        T, H = 3, 64
        xs = [(torch.randn(T, H, generator=torch.Generator().manual_seed(10 + q)) * 3).to(dtype) for q in range(world)]
        residual0 = torch.randn(T, H, generator=torch.Generator().manual_seed(7)).to(dtype)
        weight = (1 + torch.randn(H, generator=torch.Generator().manual_seed(8)) / 4).to(dtype)
        x = st.empty(T, H, dtype=dtype, device=dev) if symmetric else torch.empty(T, H, dtype=dtype, device=dev)
        x.copy_(xs[rank])
        residual = residual0.to(dev, copy=True)  # on the CPU .to(dev) would be residual0 itself, which the call updates
        out, r2 = st.all_reduce_rmsnorm(x, residual, weight.to(dev), 1e-6)
        check(f"{dtype} returns residual itself", r2 is residual)
        name = str(dtype).replace("torch.", "")
        want_res, want_out = reference(name, [t.float().reshape(-1).tolist() for t in xs],
                                       residual0.float().reshape(-1).tolist(), weight.float().tolist(), H, 1e-6)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        mask = 0xFFFFFFFF if dtype == torch.float32 else 0xFFFF
        got_res = [v & mask for v in residual.cpu().view(bits).reshape(-1).tolist()]
        got_out = [v & mask for v in out.cpu().view(bits).reshape(-1).tolist()]
        check(f"{dtype} symmetric={symmetric}: residual bit for bit", got_res == want_res)
        check(f"{dtype} symmetric={symmetric}: out bit for bit", got_out == want_out)
    errors = {}
    x = st.empty(2, 64, dtype=torch.bfloat16, device=dev)
    r = torch.zeros(2, 64, dtype=torch.bfloat16, device=dev)
    w = torch.ones(64, dtype=torch.bfloat16, device=dev)
    for what, call in (
        ("norm_weight_shape", lambda: st.all_reduce_rmsnorm(x, r, torch.ones(32, dtype=torch.bfloat16, device=dev), 1e-6)),
        ("norm_residual_shape", lambda: st.all_reduce_rmsnorm(x, r[:1], w, 1e-6)),
        ("norm_dtype", lambda: st.all_reduce_rmsnorm(x, r.float(), w, 1e-6)),
        ("norm_hidden", lambda: st.all_reduce_rmsnorm(x[:, :12], r[:, :12], w[:12], 1e-6)),
    ):
        try:
            call()
            errors[what] = None
        except (ValueError, symmem.SymmemError) as exc:
            errors[what] = (type(exc).__name__, str(exc))

    # -- the fused matmuls, against the same arithmetic on whole tensors.
    for dtype in (torch.float32, torch.bfloat16):
        shards = [_ints(torch, 100 + q, (2, 3, 16), dtype, dev) for q in range(world)]
        b1, b2 = _ints(torch, 200, (16, 8), dtype, dev), _ints(torch, 201, (16, 4), dtype, dev)
        for gd in (0, 1):
            a, outs = st.fused_all_gather_matmul(shards[rank], [b1, b2], gd)
            full = torch.cat(shards, dim=gd)
            check(f"ag {dtype} gather_dim {gd}: A", torch.equal(a, full))
            check(f"ag {dtype} gather_dim {gd}: A @ B", torch.equal(outs[0], full @ b1) and torch.equal(outs[1], full @ b2))
            none, outs2 = st.fused_all_gather_matmul(shards[rank], [b1], gd, return_a=False)
            check(f"ag {dtype} gather_dim {gd}: return_a=False", none is None and torch.equal(outs2[0], full @ b1))
        blast = _ints(torch, 202, (16 * world, 8), dtype, dev)
        a, (o,) = st.fused_all_gather_matmul(shards[rank], [blast], 2)
        full = torch.cat(shards, dim=2)
        check(f"ag {dtype} last dim: A", torch.equal(a, full))
        check(f"ag {dtype} last dim: A @ B", torch.equal(o, full @ blast))
        # reduce-scatter: every rank's A, summed, split
        As = [_ints(torch, 300 + q, (2 * world, 3, 16), dtype, dev) for q in range(world)]
        b = _ints(torch, 301, (16, 4 * world), dtype, dev)
        total = sum((t.float() @ b.float()) for t in As)
        for sd in (0, 1, 2):
            for op in ("sum", "avg"):
                if sd == 1 and 3 % world:
                    continue
                got = st.fused_matmul_reduce_scatter(As[rank], b, op, sd)
                want = total / world if op == "avg" else total
                want = want.chunk(world, dim=sd)[rank].to(dtype)
                check(f"rs {dtype} scatter_dim {sd} {op}", got.shape == want.shape and torch.equal(got, want))

    # -- backward: the grads of the whole computation.
    shards = [_ints(torch, 400 + q, (4, 16), torch.float32, dev) for q in range(world)]
    w1 = _ints(torch, 401, (16, 8 * world), torch.float32, dev)
    w2 = _ints(torch, 402, (8 * world, 16), torch.float32, dev)
    f = 8
    xs = shards[rank].clone().requires_grad_()
    w1s = w1[:, rank * f:(rank + 1) * f].clone().requires_grad_()
    w2s = w2[rank * f:(rank + 1) * f].clone().requires_grad_()
    _, (h,) = st.fused_all_gather_matmul(xs, [w1s], 0, return_a=False)
    y = st.fused_matmul_reduce_scatter(h, w2s, "sum", 0)
    (y * _ints(torch, 403, tuple(y.shape), torch.float32, dev)).sum().backward()
    xr, w1r, w2r = (t.clone().requires_grad_() for t in (torch.cat(shards), w1, w2))
    yr = (xr @ w1r) @ w2r
    gr = torch.cat([_ints(torch, 403, tuple(y.shape), torch.float32, dev)] * world)
    (yr * gr).sum().backward()
    per = shards[0].shape[0]
    check("backward: y", torch.equal(y.detach(), yr.detach()[rank * per:(rank + 1) * per]))
    check("backward: grad x", torch.equal(xs.grad, xr.grad[rank * per:(rank + 1) * per]))
    check("backward: grad w1", torch.equal(w1s.grad, w1r.grad[:, rank * f:(rank + 1) * f]))
    check("backward: grad w2", torch.equal(w2s.grad, w2r.grad[rank * f:(rank + 1) * f]))

    a16 = _ints(torch, 500, (4, 16), torch.float32, dev)
    for what, call in (
        ("ag_rows", lambda: st.fused_all_gather_matmul(a16, [_ints(torch, 1, (8, 4), torch.float32, dev)], 0)),
        ("ag_dim", lambda: st.fused_all_gather_matmul(a16, [_ints(torch, 1, (16, 4), torch.float32, dev)], 2)),
        ("ag_dtype", lambda: st.fused_all_gather_matmul(a16, [_ints(torch, 1, (16, 4), torch.bfloat16, dev)], 0)),
        ("rs_op", lambda: st.fused_matmul_reduce_scatter(a16, _ints(torch, 1, (16, 4), torch.float32, dev), "max", 0)),
        ("rs_split", lambda: st.fused_matmul_reduce_scatter(a16[:1], _ints(torch, 1, (16, 4), torch.float32, dev), "sum", 0)),
    ):
        try:
            call()
            errors[what] = None
        except ValueError as exc:
            errors[what] = (type(exc).__name__, str(exc))
    res["errors"] = errors
    dist.barrier()
    dist.destroy_process_group()
    return res
