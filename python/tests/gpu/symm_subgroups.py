"""One symmetric tensor, rendezvoused in the world group and in subgroups of
SUB consecutive ranks ({0..SUB-1}, {SUB..2*SUB-1}, ...).

usage: symm_subgroups.py [SUB]    (default 2; the world size must be a multiple)

Done twice: with symmem.Groups ("group") and with torch.distributed groups
(WORLD and dist.new_group; "dist"). The tensor has world + SUB rows:

  rows world..world+SUB-1: written through the subgroup handle (row world +
             subgroup rank), checked after a barrier of the subgroup handle
             alone;
  rows 0..world-1: written through the world handle (row = world rank),
             checked after a barrier of the world handle.

Then signals through each handle (put/wait to the subgroup partner, the rank
whose subgroup rank differs in the last bit, through the subgroup handle, a
barrier on channel 1 through the world handle), and each handle's own pad
must hold exactly the signals counted at the end. The two handles must have
different signal pads, and both must see our own buffer at the tensor.
"""

from __future__ import annotations

from _symm_common import first_mismatch, guarded, pad_mismatches, run

import sys

K = 4096
SUB = int(sys.argv[1]) if len(sys.argv) > 1 else 2


def value(kind: int, writer: int, owner: int, salt: int) -> int:
    return salt + kind * 500_000 + writer * 10_000 + owner * 100 + 1


def exercise(ctx, t, hw, hs, salt: int):
    torch = ctx.torch
    rank, world = ctx.rank, ctx.world
    srank = rank % SUB
    first = rank - srank  # world rank of our subgroup's rank 0
    rows = world + SUB
    base = torch.arange(K, dtype=torch.float32, device=ctx.device)
    out = {
        "world_rank": hw.rank,
        "world_size": hw.world_size,
        "sub_rank": hs.rank,
        "sub_size": hs.world_size,
        "own_ptr_world": hw.buffer_ptrs[rank] + hw.offset == t.data_ptr(),
        "own_ptr_sub": hs.buffer_ptrs[srank] + hs.offset == t.data_ptr(),
        "pads_differ": set(hw.signal_pad_ptrs).isdisjoint(hs.signal_pad_ptrs),
        "world_pads_distinct": len(set(hw.signal_pad_ptrs)) == world,
        "sub_pads_distinct": len(set(hs.signal_pad_ptrs)) == SUB,
    }
    t.zero_()
    ctx.stage(f"salt {salt}: world barrier after zeroing")
    hw.barrier(stream=ctx.cur())

    # Through the subgroup handle only.
    for sp in range(SUB):
        p = hs.get_buffer(sp, (rows, K), torch.float32)
        p[world + srank].copy_(base + value(1, rank, first + sp, salt))
    ctx.stage(f"salt {salt}: subgroup barrier")
    hs.barrier(stream=ctx.cur())
    ctx.sync(f"salt {salt}: subgroup barrier")
    bad = []
    for sp in range(SUB):
        m = first_mismatch(torch, t[world + sp], base + value(1, first + sp, rank, salt))
        if m is not None:
            m["writer"] = first + sp
            bad.append(m)
    out["sub_bad"] = bad

    # Through the world handle.
    for peer in range(world):
        p = hw.get_buffer(peer, (rows, K), torch.float32)
        p[rank].copy_(base + value(0, rank, peer, salt))
    ctx.stage(f"salt {salt}: world barrier after the writes")
    hw.barrier(stream=ctx.cur())
    ctx.sync(f"salt {salt}: world barrier after the writes")
    bad = []
    for w in range(world):
        m = first_mismatch(torch, t[w], base + value(0, w, rank, salt))
        if m is not None:
            m["writer"] = w
            bad.append(m)
    out["world_bad"] = bad
    # The subgroup rows are still what the subgroup wrote.
    out["sub_rows_kept"] = all(
        first_mismatch(torch, t[world + sp], base + value(1, first + sp, rank, salt)) is None for sp in range(SUB)
    )

    # Signals through each handle.
    partner = srank ^ 1
    ctx.stage(f"salt {salt}: signals")
    hs.put_signal(partner, channel=1, stream=ctx.cur())
    hs.wait_signal(partner, channel=1, stream=ctx.cur())
    hw.barrier(channel=1, stream=ctx.cur())
    hs.barrier(stream=ctx.cur())
    hw.barrier(stream=ctx.cur())
    ctx.sync(f"salt {salt}: signals and final barriers")
    # World handle: 3 barriers on channel 0, 1 on channel 1, from every
    # peer. Subgroup handle: 2 barriers on channel 0 from every member and
    # one put on channel 1 from the partner.
    others = [p for p in range(world) if p != rank]
    members = [p for p in range(SUB) if p != srank]
    out["world_pad_bad"] = pad_mismatches(ctx, hw, rank, world, {**{(0, p): 3 for p in others}, **{(1, p): 1 for p in others}})
    out["sub_pad_bad"] = pad_mismatches(ctx, hs, srank, SUB, {**{(0, p): 2 for p in members}, (1, partner): 1})
    return out


def body(ctx):
    torch = ctx.torch
    import symmem.torch as st

    rank, world = ctx.rank, ctx.world
    if SUB < 2 or SUB % 2 or world % SUB:
        raise ValueError(f"symm_subgroups.py: subgroups of {SUB} need an even SUB dividing the world size ({world})")
    res = {}

    gw = ctx.group("w")
    gs = ctx.group(f"s{rank // SUB}", rank % SUB, SUB)
    t = st.empty(world + SUB, K, dtype=torch.float32, device=ctx.dev)
    ctx.stage("rendezvous: world symmem.Group")
    hw = st.rendezvous(t, gw, timeout=ctx.timeout)
    ctx.stage("rendezvous: subgroup symmem.Group")
    hs = st.rendezvous(t, gs, timeout=ctx.timeout)
    res["group"] = exercise(ctx, t, hw, hs, salt=0)

    for h in (hs, hw):
        h.release()
    gs.destroy()
    gw.destroy()

    def through_dist():
        dist = ctx.init_dist()
        subs = [ctx.new_group(list(range(i, i + SUB))) for i in range(0, world, SUB)]
        u = st.empty(world + SUB, K, dtype=torch.float32, device=ctx.dev)
        ctx.stage("rendezvous: torch.distributed WORLD")
        hw2 = st.rendezvous(u, dist.group.WORLD, timeout=ctx.timeout)
        ctx.stage("rendezvous: torch.distributed subgroup")
        hs2 = st.rendezvous(u, subs[rank // SUB], timeout=ctx.timeout)
        out = exercise(ctx, u, hw2, hs2, salt=3_000_000)
        hs2.release()
        hw2.release()
        return out

    res["dist"] = guarded(ctx, through_dist)
    return res


if __name__ == "__main__":
    run(body)
