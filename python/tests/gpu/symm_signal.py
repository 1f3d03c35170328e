"""put_signal / wait_signal order data on streams (2 ranks).

usage: symm_signal.py ROUNDS

Both ranks work on a side stream s (torch.cuda.Stream, non-blocking). Per
round i = 1..ROUNDS:

  rank 0, all queued on s without waiting on the host:
      sleep (so that the data lands late), fill rank 1's tensor with i
      through the mapping, put_signal(1), wait_signal(1) (rank 1's ack)
  rank 1:
      wait_signal(0) on s, min and max of its own tensor on s, wait for s
      (bounded), .item() -> both must be i; then, on s: sleep, fill its
      tensor with -1, put_signal(0)

A signal that overtook the data (queued on the wrong stream, or without the
memory barrier) would show rank 1 a -1 or the previous round's value.
Finally both barrier and check that their signal pads hold exactly the
signals counted: 2 barriers on channel 0 and ROUNDS signals on channel 1
from the peer.
"""

from __future__ import annotations

import sys

from _symm_common import pad_mismatches, run

N = 1 << 20  # floats (4 MiB): the fill is many blocks, not one store
SLEEP_CYCLES = 200_000  # ~0.1 ms


def body(ctx):
    torch = ctx.torch
    import symmem.torch as st

    rounds = int(sys.argv[1])
    rank = ctx.rank
    if ctx.world != 2:
        raise ValueError(f"symm_signal.py needs 2 ranks, got {ctx.world}")
    g = ctx.group("g")
    t = st.empty(N, dtype=torch.float32, device=ctx.dev)
    t.fill_(-1.0)
    h = st.rendezvous(t, g, timeout=ctx.timeout)
    ctx.stage("barrier before the rounds")
    h.barrier(stream=ctx.cur())
    ctx.sync("barrier before the rounds")

    s = torch.cuda.Stream(device=ctx.device)
    s.wait_stream(torch.cuda.current_stream(ctx.device))
    out = {"rounds": rounds, "stream_nonzero": s.cuda_stream != 0}
    if rank == 0:
        peer = h.get_buffer(1, (N,), torch.float32)
        ctx.stage("queue the rounds")
        with torch.cuda.stream(s):
            for i in range(1, rounds + 1):
                torch.cuda._sleep(SLEEP_CYCLES)
                peer.fill_(float(i))
                h.put_signal(1, channel=1, stream=s)
                h.wait_signal(1, channel=1, stream=s)
        ctx.sync("the rounds (rank 1's last ack)", s)
        out["queued"] = rounds
    else:
        bad = []
        seen = 0
        with torch.cuda.stream(s):
            for i in range(1, rounds + 1):
                h.wait_signal(0, channel=1, stream=s)
                lo, hi = t.min(), t.max()  # on s, after the wait
                ctx.wait_gpu(f"round {i}: wait_signal from rank 0", s)
                lo, hi = lo.item(), hi.item()
                seen += 1
                if lo != i or hi != i:
                    bad.append({"round": i, "min": lo, "max": hi})
                torch.cuda._sleep(SLEEP_CYCLES)
                t.fill_(-1.0)
                h.put_signal(0, channel=1, stream=s)
        ctx.sync("the last ack", s)
        out["seen"] = seen
        out["bad"] = bad[:10]
        out["n_bad"] = len(bad)
    ctx.stage("final barrier")
    h.barrier(stream=s)
    ctx.sync("final barrier", s)
    peer = 1 - rank
    out["pad_bad"] = pad_mismatches(ctx, h, rank, 2, {(0, peer): 2, (1, peer): rounds})
    h.release()
    g.destroy()
    return out


if __name__ == "__main__":
    run(body)
