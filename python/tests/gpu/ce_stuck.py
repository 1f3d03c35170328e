"""A copy-engine call whose stream waits are never answered, on GPUs
(core/symm/coll/copyengine.go, Note [Copy-engine collectives]: the GPU has
no timeout for a stream wait; the host's watchdog fails the call).

For each case a group with a 3 s timeout (a fresh one per case: the first
stops), one matching all_gather on the copy engines first, then:

  absent    rank 1 skips #2: it waits 8 s, then calls #3 and #4;
  mismatch  rank 1 calls #2 with half the count.

Rank 0 (and, for a mismatch, rank 1) enqueues #2 and waits for its stream,
bounded: the stream must move on within the timeout and a little, and the
next call on the group must raise InvalidStateError naming the cause (the
rank that never came, or the rank that called with other arguments). Rank
1's late #3 must not meet rank 0's given-up #2: its stream waits for its
own watchdog, and #4 raises naming rank 0. The record says how long each
wait took and what each call raised.
"""

from __future__ import annotations

import time

from _symm_common import run


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    me, W = ctx.rank, ctx.world
    symmem.collectives_load(ctx.dev)
    dist = ctx.init_dist()
    out = {}
    n = 1 << 20
    for case in ("absent", "mismatch"):
        g = symmem.Group(f"{ctx.name}-stuck-{case}", me, W, device=ctx.dev, timeout=3.0)
        t = st.empty(n, dtype=torch.float32, device=ctx.dev).fill_(me + 1)
        h = symmem.rendezvous(t.data_ptr(), g)
        gathered = torch.empty(W * n, dtype=torch.float32, device=ctx.device)
        calls = {}
        dist.barrier()

        def call(k, count):
            t0 = time.monotonic()
            raised, message = None, ""
            try:
                h.all_gather("float32", count, gathered.data_ptr(), ctx.cur(), sm_free=True)
            except symmem.SymmemError as exc:
                raised, message = type(exc).__name__, str(exc)
            ctx.sync(f"{case} all_gather #{k}")
            calls[k] = {"raised": raised, "message": message[:600], "seconds": round(time.monotonic() - t0, 3)}

        call(1, n)
        if case == "absent" and me == 1:
            time.sleep(8.0)
            call(3, n)
            call(4, n)
        else:
            call(2, n if me == 0 else n // 2)
            call(3, n)
        out[case] = calls
        dist.barrier()
        h.release()
    return out


if __name__ == "__main__":
    run(body)
