"""Every rank writes its slot of every peer's symmetric tensor.

Done twice, on two symmetric tensors: rendezvous through a symmem.Group
("group"), then through a torch.distributed gloo group ("dist"). Each time:
zero the own tensor, barrier, write row `rank` of every peer's (world, K)
tensor with a torch kernel through the peer tensor get_buffer gives, barrier
on the current stream, synchronise, check that row w of the own tensor holds
what rank w wrote, read back through the mapping what we wrote into the next
peer, final barrier, and check that our signal pad holds the 3 barriers'
signals from each peer and nothing else.
"""

from __future__ import annotations

from _symm_common import first_mismatch, guarded, pad_mismatches, run

K = 1 << 16  # floats per row (256 KiB)


def value(writer: int, owner: int, salt: int) -> int:
    # Exact in float32: below 2**24 with the arange added.
    return salt + writer * 100_000 + owner * 1_000 + 1


def exchange(ctx, h, t, salt: int):
    torch = ctx.torch
    rank, world = ctx.rank, ctx.world
    out = {
        "rank": h.rank,
        "world_size": h.world_size,
        "offset": h.offset,
        "buffer_size": h.buffer_size,
        "nbytes": t.numel() * t.element_size(),
        "own_ptr_ok": h.buffer_ptrs[rank] + h.offset == t.data_ptr(),
        "distinct_ptrs": len(set(h.buffer_ptrs)) == world,
        "distinct_pads": len(set(h.signal_pad_ptrs)) == world,
    }
    t.zero_()
    ctx.stage(f"salt {salt}: barrier after zeroing")
    h.barrier(stream=ctx.cur())  # everyone has zeroed before anyone writes
    base = torch.arange(K, dtype=torch.float32, device=ctx.device)
    devices = []
    for peer in range(world):
        p = h.get_buffer(peer, (world, K), torch.float32)
        devices.append(str(p.device))
        p[rank].copy_(base + value(rank, peer, salt))
    out["peer_devices_ok"] = devices == [str(ctx.device)] * world
    out["peer_devices"] = devices
    ctx.stage(f"salt {salt}: barrier after the writes")
    h.barrier(stream=ctx.cur())
    ctx.sync(f"salt {salt}: barrier after the writes")
    bad = []
    for w in range(world):
        m = first_mismatch(torch, t[w], base + value(w, rank, salt))
        if m is not None:
            m["writer"] = w
            bad.append(m)
    out["bad_slots"] = bad
    # Our own buffer through the handle is the same memory.
    own = h.get_buffer(rank, (world, K), torch.float32)
    out["own_view_ok"] = own.data_ptr() == t.data_ptr() and bool(torch.equal(own, t))
    # Reading a peer's memory through the mapping sees what we wrote there.
    nxt = (rank + 1) % world
    row = h.get_buffer(nxt, (K,), torch.float32, storage_offset=rank * K)
    m = first_mismatch(torch, row, base + value(rank, nxt, salt))
    out["peer_read"] = m
    ctx.stage(f"salt {salt}: final barrier")
    h.barrier(stream=ctx.cur())  # nobody moves on while a peer may still read
    ctx.sync(f"salt {salt}: final barrier")
    out["pad_bad"] = pad_mismatches(ctx, h, rank, world, {(0, p): 3 for p in range(world) if p != rank})
    return out


def body(ctx):
    torch = ctx.torch
    import symmem.torch as st

    world = ctx.world
    res = {}

    g = ctx.group("g")
    t = st.empty(world, K, dtype=torch.float32, device=ctx.dev)
    ctx.stage("rendezvous through the symmem.Group")
    h = st.rendezvous(t, g, timeout=ctx.timeout)
    res["group"] = exchange(ctx, h, t, salt=0)

    h.release()
    g.destroy()

    def through_dist():
        dist = ctx.init_dist()
        u = st.empty(world, K, dtype=torch.float32, device=ctx.dev)
        ctx.stage("rendezvous through the torch.distributed group")
        hu = st.rendezvous(u, dist.group.WORLD, timeout=ctx.timeout)
        out = exchange(ctx, hu, u, salt=2_000_000)
        hu.release()
        return out

    res["dist"] = guarded(ctx, through_dist)
    return res


if __name__ == "__main__":
    run(body)
