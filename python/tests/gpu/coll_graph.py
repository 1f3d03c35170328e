"""Collectives in a CUDA graph, and on two streams at once.

usage: coll_graph.py REPLAYS

1. A graph captured on a side stream holds: copy the base input into the
   rendezvoused tensor, all_reduce it in place (int32 sum), add the result
   into an accumulator. It is replayed REPLAYS times; the accumulator must
   then be exactly REPLAYS * W-sum (the pads' counts are never reset: each
   replay's barriers find them ready).
2. Two streams, two channels: stream A all-reduces tensor a on channel 0
   while stream B all-gathers tensor b on channel 1, 200 times, neither
   waiting for the other; every result exact.
3. symmem.torch.all_reduce on a fresh view of a buffer (buf[:k]) at every
   call, captured after one uncaptured call: the replays sum exactly.
"""

from __future__ import annotations

import sys

from _symm_common import first_mismatch, run


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    replays = int(sys.argv[1])
    W, me = ctx.world, ctx.rank
    dev = ctx.device
    symmem.collectives_load(ctx.dev)
    g = ctx.group("graph")
    n = 4096 + 3
    t = st.empty(n, dtype=torch.int32, device=ctx.dev)
    h = symmem.rendezvous(t.data_ptr(), g)
    base = torch.arange(n, dtype=torch.int32, device=dev) * (me + 1)
    want = sum(torch.arange(n, dtype=torch.int64, device=dev) * (r + 1) for r in range(W))
    acc = torch.zeros(n, dtype=torch.int64, device=dev)
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    ctx.stage("warm-up call")
    with torch.cuda.stream(s):
        t.copy_(base)
        h.all_reduce("int32", count=n, stream=s)
    ctx.wait_gpu("warm-up", s)
    out = {"warm": first_mismatch(torch, t.to(torch.int64), want)}
    graph = torch.cuda.CUDAGraph()
    ctx.stage("capture")
    with torch.cuda.graph(graph, stream=s):
        t.copy_(base)
        h.all_reduce("int32", count=n, stream=s)
        acc.add_(t)
    ctx.stage(f"{replays} replays")
    for i in range(replays):
        graph.replay()
        if i % 100 == 99:
            ctx.wait_gpu(f"replay {i}")
    ctx.wait_gpu("replays")
    out["graph"] = first_mismatch(torch, acc, want * replays)
    out["device_error_after_graph"] = h.device_error()

    # Two streams, two channels, at once.
    ctx.stage("two streams")
    m = 1 << 16
    a = st.empty(m, dtype=torch.float32, device=ctx.dev)
    b = st.empty(m, dtype=torch.bfloat16, device=ctx.dev)
    ha = symmem.rendezvous(a.data_ptr(), g)
    hb = symmem.rendezvous(b.data_ptr(), g)
    gathered = torch.empty(W * m, dtype=torch.bfloat16, device=dev)
    sa, sb = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
    sa.wait_stream(torch.cuda.current_stream(dev))
    sb.wait_stream(torch.cuda.current_stream(dev))
    wrong = []
    for i in range(200):
        with torch.cuda.stream(sa):
            a.fill_(float(me + i))
            ha.all_reduce("float32", count=m, stream=sa, channel=0)
        with torch.cuda.stream(sb):
            b.fill_(float(me * 3 + (i % 7)))
            hb.all_gather("bfloat16", count=m, out=gathered, stream=sb, channel=1)
        if i % 50 == 49:
            ctx.wait_gpu("stream a", sa)
            ctx.wait_gpu("stream b", sb)
            wa = float(sum(r + i for r in range(W)))
            if not bool(torch.all(a == wa)):
                wrong.append({"round": i, "stream": "a"})
            wb = torch.cat([torch.full((m,), float(r * 3 + (i % 7)), device=dev, dtype=torch.bfloat16) for r in range(W)])
            if not torch.equal(gathered, wb):
                wrong.append({"round": i, "stream": "b"})
    ctx.wait_gpu("two streams a", sa)
    ctx.wait_gpu("two streams b", sb)
    out["two_streams_wrong"] = wrong

    # 3. symmem.torch.all_reduce on a fresh view of a buffer at every call
    # (buf[:k]), warmed up once and then captured: the capture finds what
    # the first call resolved (no rendezvous inside the capture).
    ctx.stage("symmem.torch.all_reduce of a fresh view, captured")
    ctx.init_dist()  # symmem.torch's collectives run on torch.distributed's world
    k = 1024
    buf = st.empty(4 * k, dtype=torch.float32, device=ctx.dev)
    src = torch.full((k,), float(me + 1), dtype=torch.float32, device=dev)
    with torch.cuda.stream(s):
        buf[:k].copy_(src)
        st.all_reduce(buf[:k])
    ctx.wait_gpu("view warm-up", s)
    gv = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(gv, stream=s):
            buf[:k].copy_(src)
            st.all_reduce(buf[:k])
        for _ in range(3):
            gv.replay()
        ctx.wait_gpu("view replays", torch.cuda.current_stream(dev))
        out["view_graph"] = first_mismatch(torch, buf[:k], torch.full((k,), float(W * (W + 1) // 2), device=dev))
    except Exception as exc:  # the capture failed: say why
        out["view_graph"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    out["device_error"] = h.device_error()
    for x in (ha, hb, h):
        x.release()
    return out


if __name__ == "__main__":
    run(body)
