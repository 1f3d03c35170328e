"""Groups over NCCL communicators and NCCL symmetric windows on GPUs, one
rank per GPU (NCCL refuses two ranks on one GPU), run by test_nccl_gpu.py.

Parts (each reported separately; see _symm_common.py):

    torch   symmem.torch.rendezvous with torch's NCCL process group (created
            eagerly with device_id=): the group lives on its communicator and
            registers windows; every rank writes every peer; dist.all_reduce,
            all_gather_into_tensor and reduce_scatter_tensor on registered
            libsymmem tensors are exact; free and reallocate in a loop leaves
            no window behind.
    c_comm  a communicator made here with ncclCommInitRank (torch's libnccl
            through ctypes, as a C program would): symmem.Group.from_nccl,
            every rank writes every peer, windows counted.
    pool    ProcessGroupNCCL.register_mem_pool on a libsymmem MemPool, then
            all_reduce on a tensor from the pool: exact.
    lazy    (argument "lazy") a process group without device_id: rendezvous
            raises an error naming device_id= while the communicator does not
            exist, and works after a first collective.
"""

from __future__ import annotations

import ctypes
import datetime
import os

from _symm_common import first_mismatch, guarded, run


def loaded_nccl() -> str:
    """The libnccl this process has loaded (torch's), from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libnccl.so" in os.path.basename(path):
                return path
    raise RuntimeError("no libnccl is loaded in this process")


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def every_peer(ctx, h, t, world: int, salt: int):
    """Every rank writes (salt, writer, owner) into its slot of every peer's
    tensor, then checks its own slots."""
    torch = ctx.torch
    me = ctx.rank
    n = t.numel() // world
    for p in range(world):
        peer = h.get_buffer(p, (t.numel(),), t.dtype)
        peer[me * n : (me + 1) * n].fill_(float(salt * 100 + me * 10 + p))
    h.barrier(stream=ctx.cur())
    ctx.sync("every peer written")
    bad = []
    for w in range(world):
        want = torch.full((n,), float(salt * 100 + w * 10 + me), dtype=t.dtype, device=t.device)
        m = first_mismatch(torch, t[w * n : (w + 1) * n], want)
        if m is not None:
            bad.append({"writer": w, **m})
    h.barrier(stream=ctx.cur())
    ctx.sync("reads done")
    return bad


def part_torch(ctx, dist):
    torch = ctx.torch
    import symmem.torch as st

    world, me = ctx.world, ctx.rank
    out = {}
    ctx.stage("rendezvous over the NCCL process group")
    t = st.empty(world * (1 << 20), dtype=torch.float32, device=ctx.dev)
    t.zero_()
    h = st.rendezvous(t, dist.group.WORLD, timeout=ctx.timeout)
    g = h.handle._group
    out["nccl_group"] = getattr(g, "nccl_comm", 0) != 0
    out["window"] = h.nccl_window is not None
    out["counts_first"] = g.nccl_window_counts()
    h_again = st.rendezvous(t, dist.group.WORLD, timeout=ctx.timeout)
    out["counts_again"] = g.nccl_window_counts()
    h_again.release()
    out["every_peer"] = every_peer(ctx, h, t, world, 1)

    ctx.stage("all_reduce on a registered tensor")
    n = 1 << 22
    x = st.empty(n, dtype=torch.float32, device=ctx.dev)
    hx = st.rendezvous(x, dist.group.WORLD, timeout=ctx.timeout)
    base = torch.remainder(torch.arange(n, device=ctx.device), 1000).to(torch.float32)
    x.copy_(base * (me + 1))
    dist.all_reduce(x)
    out["all_reduce"] = first_mismatch(torch, x, base * (world * (world + 1) // 2))
    y = st.empty(n, dtype=torch.bfloat16, device=ctx.dev)
    hy = st.rendezvous(y, dist.group.WORLD, timeout=ctx.timeout)
    yb = torch.remainder(torch.arange(n, device=ctx.device), 7).to(torch.bfloat16)  # small: exact in bf16
    y.copy_(yb * (me + 1))
    dist.all_reduce(y)
    out["all_reduce_bf16"] = first_mismatch(torch, y, yb * (world * (world + 1) // 2))

    ctx.stage("all_gather_into_tensor / reduce_scatter_tensor on registered tensors")
    m = 1 << 20
    src = st.empty(m, dtype=torch.float32, device=ctx.dev)
    dst = st.empty(world * m, dtype=torch.float32, device=ctx.dev)
    hs = st.rendezvous(src, dist.group.WORLD, timeout=ctx.timeout)
    hd = st.rendezvous(dst, dist.group.WORLD, timeout=ctx.timeout)
    ar = torch.remainder(torch.arange(m, device=ctx.device), 997).to(torch.float32)
    src.copy_(ar + me * 1000)
    dist.all_gather_into_tensor(dst, src)
    want = torch.cat([ar + r * 1000 for r in range(world)])
    out["all_gather"] = first_mismatch(torch, dst, want)
    dst.copy_(torch.cat([ar * (r + 1) + me for r in range(world)]))
    dist.reduce_scatter_tensor(src, dst)
    out["reduce_scatter"] = first_mismatch(torch, src, ar * (me + 1) * world + world * (world - 1) // 2)
    torch.cuda.synchronize(ctx.device)
    out["counts_after_collectives"] = g.nccl_window_counts()
    for hh in (h, hx, hy, hs, hd):
        hh.release()
    del t, x, y, src, dst
    torch.cuda.synchronize(ctx.device)

    ctx.stage("free and reallocate in a loop")
    import symmem

    symmem.empty_cache(ctx.dev)
    before = g.nccl_window_counts()
    live_max = 0
    for i in range(6):
        z = st.empty(8 << 20, dtype=torch.float32, device=ctx.dev)
        hz = st.rendezvous(z, dist.group.WORLD, timeout=ctx.timeout)
        z.fill_(float(me + i))
        dist.all_reduce(z)
        torch.cuda.synchronize(ctx.device)
        ok = bool(torch.all(z == float(world * i + world * (world - 1) // 2)))
        out.setdefault("loop_ok", []).append(ok)
        hz.release()
        del z
        symmem.empty_cache(ctx.dev)
        live_max = max(live_max, g.nccl_window_counts()[2])
    after = g.nccl_window_counts()
    out["loop_counts"] = {"before": before, "after": after, "live_max": live_max}
    return out


def part_c_comm(ctx, dist):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    world, me = ctx.world, ctx.rank
    lib = ctypes.CDLL(loaded_nccl())
    store = dist.distributed_c10d._get_default_store()
    key = f"{ctx.name}/nccl-uid"
    uid = UniqueId()
    if me == 0:
        ctx.stage("ncclGetUniqueId")
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
        # string_at, not bytes(uid.internal): a c_char array reads as a
        # bytes object cut at its first NUL, which would ship a broken id.
        store.set(key, ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)))
    raw = store.get(key)
    assert len(raw) == ctypes.sizeof(uid), len(raw)
    ctypes.memmove(ctypes.addressof(uid), raw, len(raw))
    comm = ctypes.c_void_p()
    ctx.stage("ncclCommInitRank")
    rc = lib.ncclCommInitRank(ctypes.byref(comm), world, uid, me)
    if rc != 0:
        raise RuntimeError(f"ncclCommInitRank: {rc}")
    out = {"version": symmem.nccl_version()}
    ctx.stage("symmem.Group.from_nccl")
    g = symmem.Group.from_nccl(comm.value, f"{ctx.name}-c", timeout=ctx.timeout)
    out["group"] = [g.rank, g.world_size, g.device]
    t = st.empty(world * (1 << 18), dtype=torch.float32, device=ctx.dev)
    t.zero_()
    h = st.rendezvous(t, g, timeout=ctx.timeout)
    out["window"] = h.nccl_window is not None
    out["every_peer"] = every_peer(ctx, h, t, world, 2)
    h.release()
    del t
    torch.cuda.synchronize(ctx.device)
    symmem.empty_cache(ctx.dev)
    out["counts"] = g.nccl_window_counts()
    g.destroy()
    ctx.stage("ncclCommDestroy")
    lib.ncclCommDestroy(comm)
    return out


def part_pool(ctx, dist):
    torch = ctx.torch
    import symmem.torch as st

    world, me = ctx.world, ctx.rank
    pool = st.mem_pool()
    backend = dist.group.WORLD._get_backend(ctx.device)
    ctx.stage("ProcessGroupNCCL.register_mem_pool")
    backend.register_mem_pool(pool)
    with torch.cuda.use_mem_pool(pool):
        x = torch.full((1 << 20,), float(me + 1), device=ctx.device)
    dist.all_reduce(x)
    torch.cuda.synchronize(ctx.device)
    out = {"all_reduce": first_mismatch(torch, x, torch.full_like(x, float(world * (world + 1) // 2)))}
    ctx.stage("deregister_mem_pool")
    backend.deregister_mem_pool(pool)
    del x
    return out


def part_destroy(ctx, dist):
    """symmem.torch.destroy_group: what symmem.torch holds for the process
    group goes, on every rank; a later collective makes a new Group."""
    torch = ctx.torch
    import symmem.torch as st

    world, me = ctx.world, ctx.rank
    want = float(world * (world + 1) // 2)
    out = {}
    ctx.stage("a collective and a rendezvous, then destroy_group")
    x = st.empty(4096, dtype=torch.float32, device=ctx.dev)
    x.fill_(me + 1)
    st.all_reduce(x)
    torch.cuda.synchronize(ctx.device)
    out["sum_before"] = bool(torch.all(x == want))
    h = st.rendezvous(x, dist.group.WORLD, timeout=ctx.timeout)
    first = h.handle._group
    st.destroy_group(dist.group.WORLD)
    try:
        h.barrier()
        out["released_handle"] = "worked"
    except Exception as exc:  # noqa: BLE001 - what the call raised is the result
        out["released_handle"] = type(exc).__name__
    ctx.stage("a collective on the same process group after destroy_group")
    x.fill_(me + 1)
    st.all_reduce(x)
    torch.cuda.synchronize(ctx.device)
    out["sum_after"] = bool(torch.all(x == want))
    h2 = st.rendezvous(x, dist.group.WORLD, timeout=ctx.timeout)
    out["new_group"] = h2.handle._group is not first
    h2.release()
    st.destroy_group(dist.group.WORLD)
    return out


def body_lazy(ctx):
    """A process group without device_id: its communicator does not exist
    until its first collective. rendezvous must then either raise an error
    naming device_id=, or (if torch makes the communicator on request) work
    over NCCL; it must not hang or fail otherwise."""
    import torch.distributed as dist

    import symmem.torch as st

    torch = ctx.torch
    dist.init_process_group(
        "nccl",
        init_method=f"file://{ctx.init_file}",
        rank=ctx.rank,
        world_size=ctx.world,
        timeout=datetime.timedelta(seconds=ctx.dist_timeout),
    )
    t = st.empty(1 << 20, dtype=torch.float32, device=ctx.dev)
    out = {}
    try:
        h = st.rendezvous(t, dist.group.WORLD, timeout=ctx.timeout)
        out["outcome"] = "worked"
        out["window"] = h.nccl_window is not None
        h.release()
    except RuntimeError as exc:
        out["outcome"] = "error"
        out["message"] = str(exc)
    # After one collective the communicator exists: now it works.
    x = torch.ones(4, device=ctx.device)
    dist.all_reduce(x)
    torch.cuda.synchronize(ctx.device)
    h = st.rendezvous(t, dist.group.WORLD, timeout=ctx.timeout)
    out["after_collective_window"] = h.nccl_window is not None
    h.release()
    dist.barrier()
    dist.destroy_process_group()
    return out


def body(ctx):
    import sys

    import torch.distributed as dist

    if sys.argv[1:] == ["lazy"]:
        return body_lazy(ctx)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx.stage("init_process_group(nccl, device_id=...)")
    dist.init_process_group(
        "nccl",
        init_method=f"file://{ctx.init_file}",
        rank=ctx.rank,
        world_size=ctx.world,
        timeout=datetime.timedelta(seconds=ctx.dist_timeout),
        device_id=ctx.device,
    )
    ctx.dist = dist
    res = {}
    res["torch"] = guarded(ctx, lambda: part_torch(ctx, dist))
    res["c_comm"] = guarded(ctx, lambda: part_c_comm(ctx, dist))
    res["pool"] = guarded(ctx, lambda: part_pool(ctx, dist))
    res["destroy"] = guarded(ctx, lambda: part_destroy(ctx, dist))
    dist.barrier()
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    run(body)
