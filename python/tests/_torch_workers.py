"""Rank functions for the torch.distributed tests (run by _mp.run_ranks).

They work on either backend: CPU tensors on libsymmem's host backend, CUDA
tensors (rank % device_count) on its cuda backend. torch is imported inside
the functions so that importing this module needs no torch.
"""

from __future__ import annotations

from typing import Dict


def _init(rank: int, world: int, init_file: str):
    import torch
    import torch.distributed as dist

    import symmem

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if symmem.backend_name() == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    return torch, dist, dev


def _sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def write_every_peer(rank: int, world: int, init_file: str) -> Dict:
    """Each rank fills row `rank` of every peer's (world, 64) float tensor."""
    torch, dist, dev = _init(rank, world, init_file)
    import symmem
    import symmem.torch as st

    try:
        t = st.empty(world, 64, dtype=torch.float32, device=dev)
        t.zero_()
        ours = symmem.pointer_info(t.data_ptr())
        h = st.rendezvous(t, dist.group.WORLD)
        _sync(torch, dev)
        h.barrier()
        for peer in range(world):
            p = h.get_buffer(peer, (world, 64), torch.float32)
            assert p.device == dev and p.shape == (world, 64)
            p[rank].fill_(rank * 100 + peer)
        h.barrier()
        _sync(torch, dev)
        want = torch.tensor([[w * 100 + rank] * 64 for w in range(world)], dtype=torch.float32)
        rows_ok = bool(torch.equal(t.cpu(), want))
        # storage_offset in elements: row `rank` of the next peer.
        nxt = (rank + 1) % world
        row = h.get_buffer(nxt, (64,), torch.float32, storage_offset=rank * 64)
        row_ok = bool(torch.all(row.cpu() == rank * 100 + nxt))
        # A second rendezvous reuses the cached group (no new group collective).
        u = st.empty(128, dtype=torch.int32, device=dev)
        h2 = st.rendezvous(u, None)
        same_group = h2.handle._group is h.handle._group
        h.barrier()
        h2.release()
        h.release()
        del t, u, p, row
        return {
            "rows_ok": rows_ok,
            "row_ok": row_ok,
            "same_group": same_group,
            "on_heap": ours.block != 0,
            "world_size": h.world_size,
        }
    finally:
        dist.destroy_process_group()


def mismatch(rank: int, world: int, init_file: str) -> Dict:
    torch, dist, dev = _init(rank, world, init_file)
    import symmem
    import symmem.torch as st

    try:
        t = st.empty(1024 if rank == 0 else 2048, dtype=torch.uint8, device=dev)
        try:
            st.rendezvous(t)
            return {"raised": None}
        except symmem.SymmemError as e:
            return {"raised": type(e).__name__}
    finally:
        dist.destroy_process_group()


def across_machines(rank: int, world: int, init_file: str) -> Dict:
    """A gloo process group whose ranks claim two machines (the process's
    SYMMEM_MACHINE_ID, set by the test): group_for exposes the local team,
    a remote rank's get_buffer raises naming it and its machine, local
    peers' rows are written and read, and a collective, which needs NCCL
    between machines, is UNAVAILABLE naming the missing engine."""
    torch, dist, dev = _init(rank, world, init_file)
    import symmem
    import symmem.torch as st

    try:
        t = st.empty(world, 64, dtype=torch.float32, device=dev)
        t.zero_()
        g = st.group_for(dist.group.WORLD, device=dev.index or 0)
        h = st.rendezvous(t, dist.group.WORLD)
        local = [r for r in range(world) if g.is_local(r)]
        remote = [r for r in range(world) if not g.is_local(r)]
        try:
            h.get_buffer(remote[0], (world, 64), torch.float32)
            remote_error = ""
        except symmem.SymmemError as e:
            remote_error = str(e)
        dist.barrier()
        for peer in local:
            h.get_buffer(peer, (world, 64), torch.float32)[rank].fill_(rank * 100 + peer)
        _sync(torch, dev)
        dist.barrier()
        rows_ok = all(bool(torch.all(t[w].cpu() == w * 100 + rank)) for w in local)
        try:
            st.all_reduce(t, group=dist.group.WORLD)
            coll_error = ""
        except symmem.SymmemError as e:
            coll_error = f"{type(e).__name__}: {e}"
        dist.barrier()
        h.release()
        del t
        return {"local": (g.local_rank, g.local_size), "remote": remote, "remote_error": remote_error,
                "rows_ok": rows_ok, "coll_error": coll_error}
    finally:
        dist.destroy_process_group()
