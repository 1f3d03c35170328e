"""Collectives whose ranks disagree or die, on the GPU (docs/diagnostics.md).

1. "mismatch": the last rank all-reduces half the count of the others (so
   it also launches fewer blocks). Every rank's kernel must return without
   touching out, promptly, and the device error flag must say MISMATCH.
2. "dead": on a second group, after a barrier, the last rank leaves (its
   process exits 0.3 s later); the others' all-reduce kernels must return
   once the library has seen the exit (the abort word), well before the
   group's timeout, and the flag must say PEER.
"""

from __future__ import annotations

import time

from _symm_common import run

N = 4096  # float32: 2 blocks of 512 threads; N // 2 runs on 1 block


def flag(h):
    import symmem

    try:
        return {"flag": h.device_error(), "raised": None}
    except symmem.SymmemError as exc:
        return {"raised": type(exc).__name__, "message": exc.message}


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    W, me = ctx.world, ctx.rank
    last = me == W - 1
    symmem.collectives_load(ctx.dev)
    out = {"timeout": ctx.timeout}

    g = ctx.group("mismatch")
    t = st.empty(N, dtype=torch.float32, device=ctx.dev)
    h = symmem.rendezvous(t.data_ptr(), g)
    t.fill_(me + 1)
    res = torch.full((N,), 7.0, dtype=torch.float32, device=ctx.device)
    ctx.sync("inputs")
    h.barrier(stream=ctx.cur())
    ctx.sync("barrier before the mismatch")
    t0 = time.monotonic()
    h.all_reduce("float32", count=N // 2 if last else N, out=res.data_ptr(), stream=ctx.cur(), algo="one_shot")
    ctx.sync("the mismatched all_reduce")
    out["mismatch"] = dict(flag(h), seconds=round(time.monotonic() - t0, 3), untouched=bool((res == 7.0).all()))

    g2 = ctx.group("dead")
    t2 = st.empty(N, dtype=torch.float32, device=ctx.dev)
    h2 = symmem.rendezvous(t2.data_ptr(), g2)
    h2.barrier(stream=ctx.cur())
    ctx.sync("barrier before the exit")
    if last:
        time.sleep(0.3)
        return out  # the process exits (run) while the others wait for it
    t0 = time.monotonic()
    h2.all_reduce("float32", count=N, stream=ctx.cur())
    ctx.sync("an all_reduce whose last rank exits")
    out["dead"] = dict(flag(h2), seconds=round(time.monotonic() - t0, 3))
    return out


if __name__ == "__main__":
    run(body)
