"""Rendezvous on a tensor view with storage offset > 0 (2 ranks).

"group": symmem.rendezvous(view.data_ptr(), symmem.Group) (a raw interior
pointer; wrapped in symmem.torch.TorchHandle for tensors);
"dist": symmem.torch.rendezvous(view, torch.distributed WORLD).

The handle's offset must be the view's byte offset; get_buffer views start
at the peer's equivalent of the view: every rank writes 16 floats at element
rank*16 of every peer's view, and after a barrier the own tensor holds them
at OFF + w*16, while the elements before the view and after the written
part still hold the fill value.
"""

from __future__ import annotations

from _symm_common import first_mismatch, guarded, run

TOTAL = 4096  # floats
CHUNK = 16
FILL = -1.0


def exercise(ctx, t, off: int, th, salt: int):
    torch = ctx.torch
    rank, world = ctx.rank, ctx.world
    item = t.element_size()
    view_ptr = t.data_ptr() + off * item
    out = {
        "offset": th.offset,
        "want_offset": off * item,
        "buffer_size": th.buffer_size,
        "nbytes": TOTAL * item,
        "own_ptr_ok": th.buffer_ptrs[rank] + th.offset == view_ptr,
        "own_block_ok": th.buffer_ptrs[rank] == t.data_ptr(),
    }
    whole = th.get_buffer((rank + 1) % world)  # uint8, from the view to the end of the block
    out["default_view_bytes"] = int(whole.numel())
    out["want_default_view_bytes"] = th.buffer_size - th.offset
    t.fill_(FILL)
    ctx.stage(f"salt {salt}: barrier after the fill")
    th.barrier(stream=ctx.cur())
    for peer in range(world):
        q = th.get_buffer(peer, (CHUNK,), torch.float32, storage_offset=rank * CHUNK)
        q.fill_(float(salt + rank * 10 + peer + 1))
    ctx.stage(f"salt {salt}: barrier after the writes")
    th.barrier(stream=ctx.cur())
    ctx.sync(f"salt {salt}: barrier after the writes")
    bad = []
    for w in range(world):
        lo = off + w * CHUNK
        m = first_mismatch(
            torch, t[lo : lo + CHUNK], torch.full((CHUNK,), float(salt + w * 10 + rank + 1), device=ctx.device)
        )
        if m is not None:
            m["writer"] = w
            bad.append(m)
    out["bad"] = bad
    end = off + world * CHUNK
    out["prefix_untouched"] = bool(torch.all(t[:off] == FILL))
    out["suffix_untouched"] = bool(torch.all(t[end:] == FILL))
    ctx.stage(f"salt {salt}: final barrier")
    th.barrier(stream=ctx.cur())
    ctx.sync(f"salt {salt}: final barrier")
    return out


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    res = {}
    g = ctx.group("g")
    t = st.empty(TOTAL, dtype=torch.float32, device=ctx.dev)
    off = 256  # 1024 bytes
    view = t[off:]
    res["view_storage_offset"] = view.storage_offset()
    ctx.stage("rendezvous on an interior pointer (symmem.Group)")
    h = symmem.rendezvous(view.data_ptr(), g)
    th = st.TorchHandle(h, ctx.device)
    res["group"] = exercise(ctx, t, off, th, salt=0)

    h.release()
    g.destroy()

    def through_dist():
        dist = ctx.init_dist()
        u = st.empty(TOTAL, dtype=torch.float32, device=ctx.dev)
        off2 = 100  # 400 bytes
        ctx.stage("rendezvous on a view (torch.distributed)")
        th2 = st.rendezvous(u[off2:], dist.group.WORLD, timeout=ctx.timeout)
        out = exercise(ctx, u, off2, th2, salt=1000)
        th2.release()
        return out

    res["dist"] = guarded(ctx, through_dist)
    return res


if __name__ == "__main__":
    run(body)
