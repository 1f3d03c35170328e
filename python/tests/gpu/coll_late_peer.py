"""A late peer on the GPU (docs/diagnostics.md, "A collective timed out";
core/symm/coll/coll.go, Note [Failed collectives]).

For each size (4 KiB and 4 MiB of float32, in place): a group made with
symmem.torch.group_for(None, device, timeout=2.0) (a fresh one per size:
the first stops); both ranks run symmem.torch.all_reduce #1; rank 0 runs
#2 while rank 1 sleeps 3 s, so rank 0's kernel gives up after 2 s; rank 1
then runs #2, and both run #3-#6, each call with fresh inputs (every
element call*10 + rank + 1). After every call the rank waits for its GPU
(bounded) and records whether the call raised, the message, and what the
tensor holds: the sum, its own input (untouched), or something else.
"""

from __future__ import annotations

import time

from _symm_common import run

SIZES = {"4KiB": 4 << 10, "4MiB": 4 << 20}


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    me, W = ctx.rank, ctx.world
    symmem.collectives_load(ctx.dev)
    dist = ctx.init_dist()
    out = {}
    for label, nbytes in SIZES.items():
        # group_for keeps one symmem group per process group and device:
        # the second size takes a process group of its own (the first
        # size's group is stopped for good).
        pg = None if label == "4KiB" else ctx.new_group(list(range(W)))
        g = st.group_for(pg, ctx.dev, timeout=2.0)
        t = st.empty(nbytes // 4, dtype=torch.float32, device=ctx.dev)
        calls = {}
        dist.barrier()
        for call in range(1, 7):
            if call == 2 and me == 1:
                time.sleep(3.0)
            t.fill_(call * 10 + me + 1)
            want = float(sum(call * 10 + r + 1 for r in range(W)))
            t0 = time.monotonic()
            raised, message = None, ""
            try:
                st.all_reduce(t, group=g)
            except symmem.SymmemError as exc:
                raised, message = type(exc).__name__, str(exc)
            ctx.sync(f"{label} all_reduce #{call}")
            held = sorted(set(t.unique().tolist()))
            state = "sum" if held == [want] else ("input" if held == [float(call * 10 + me + 1)] else "wrong")
            calls[call] = {"raised": raised, "message": message[:600], "state": state, "held": held[:4],
                           "seconds": round(time.monotonic() - t0, 3)}
        try:  # the handle of the tensor's first call (no rendezvous now)
            flag = {"flag": st._coll_handle(t, g).handle.device_error()}
        except symmem.SymmemError as exc:
            flag = {"raised": type(exc).__name__, "message": str(exc)[:300]}
        out[label] = {"calls": calls, "device_error": flag}
        dist.barrier()
    return out


if __name__ == "__main__":
    run(body)
