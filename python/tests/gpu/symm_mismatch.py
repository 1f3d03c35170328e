"""Ranks that rendezvous on blocks of different sizes all get MismatchError,
quickly (2 ranks): through a symmem.Group ("group"); then the Group still
works (a rendezvous on equal blocks succeeds and data written through it
arrives: "after"); then through torch.distributed ("dist").
"""

from __future__ import annotations

import time

from _symm_common import error_info, first_mismatch, guarded, run

BIG = 4 << 20  # floats (16 MiB): its own segment, at the same heap offset on every rank


def attempt(call):
    t0 = time.monotonic()
    try:
        h = call()
    except Exception as exc:  # noqa: BLE001 - the test checks the class and code
        return error_info(exc, time.monotonic() - t0)
    h.release()
    return {"raised": None, "code": None, "seconds": round(time.monotonic() - t0, 3)}


def body(ctx):
    torch = ctx.torch
    import symmem.torch as st

    rank, world = ctx.rank, ctx.world
    res = {"timeout": ctx.timeout}
    g = ctx.group("g")

    t = st.empty(1024 if rank == 0 else 2048, dtype=torch.float32, device=ctx.dev)
    ctx.stage("mismatched rendezvous (symmem.Group)")
    res["group"] = attempt(lambda: st.rendezvous(t, g, timeout=ctx.timeout))

    # The group survives: equal blocks rendezvous and carry data.
    def after():
        out = {}
        v = st.empty(BIG, dtype=torch.float32, device=ctx.dev)
        v.fill_(float(rank + 1))
        ctx.stage("rendezvous on equal blocks after the mismatch")
        h = st.rendezvous(v, g, timeout=ctx.timeout)
        h.barrier(stream=ctx.cur())
        ctx.sync("barrier after the fill")
        nxt = (rank + 1) % world
        peer = h.get_buffer(nxt, (BIG,), torch.float32)
        out["peer_values"] = first_mismatch(torch, peer, torch.full((BIG,), float(nxt + 1), device=ctx.device))
        del peer
        h.barrier(stream=ctx.cur())
        ctx.sync("final barrier")
        h.release()
        return out

    res["after"] = guarded(ctx, after)
    g.destroy()

    def through_dist():
        dist = ctx.init_dist()
        u = st.empty(3000 if rank == 0 else 5000, dtype=torch.float32, device=ctx.dev)
        ctx.stage("mismatched rendezvous (torch.distributed)")
        return attempt(lambda: st.rendezvous(u, dist.group.WORLD, timeout=ctx.timeout))

    res["dist"] = guarded(ctx, through_dist)
    return res


if __name__ == "__main__":
    run(body)
