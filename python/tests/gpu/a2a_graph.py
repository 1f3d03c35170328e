"""The all-to-alls in a CUDA graph and under torch.compile.

usage: a2a_graph.py REPLAYS

1. A graph captured on a side stream holds an MoE step's exchange: the
   dispatch (symmem.torch.all_to_all_v_2d) of a symmetric input into a
   symmetric buffer, a scaling of what arrived, the combine
   (all_to_all_v_2d_offset) back, then all_to_all_v and an equal
   all_to_all. Between replays new splits (random, zeros included) are
   written into the split tensors on the device; every replay's outs and
   out_splits_offsets must equal the reference's (_a2a_ref) for its splits.
2. torch.compile(fullgraph=True) of a function that dispatches, scales
   what arrived in place, combines and reduces what came back (a graph
   break would fail the compile),
   against the same calls made eagerly; then that compiled function
   captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import random
import sys

import _a2a_ref as ref
from _symm_common import first_mismatch, run

H = 64  # float32 columns
ROWS = 2048
OUT_ROWS = 4 * ROWS


def body(ctx):
    torch = ctx.torch
    import symmem
    import symmem.torch as st

    replays = int(sys.argv[1])
    W, me, dev = ctx.world, ctx.rank, ctx.device
    symmem.collectives_load(ctx.dev)
    dist = ctx.init_dist()
    E, align = 4, 16
    S = W * E
    rows_of = []
    for q in range(W):  # every rank's input: row r of rank q holds q * 1e6 + r * 100 + column
        base = torch.arange(ROWS, device=dev, dtype=torch.float32)[:, None] * 100 + q * 1e6
        rows_of.append(base + torch.arange(H, device=dev, dtype=torch.float32)[None, :])
    inp = st.empty(ROWS, H, dtype=torch.float32, device=ctx.dev)
    inp.copy_(rows_of[me])
    mid = st.empty(OUT_ROWS, H, dtype=torch.float32, device=ctx.dev)
    back = torch.empty(OUT_ROWS, H, dtype=torch.float32, device=dev)
    vout = torch.empty(OUT_ROWS, H, dtype=torch.float32, device=dev)
    eq_in = st.empty(W * 256, dtype=torch.float32, device=ctx.dev)
    eq_in.copy_(torch.arange(W * 256, device=dev, dtype=torch.float32) + me * 10000)
    eq_out = torch.empty(W * 256, dtype=torch.float32, device=dev)
    sp2 = torch.zeros(S, dtype=torch.int64, device=dev)
    spv = torch.zeros(W, dtype=torch.int64, device=dev)
    oso_d = torch.zeros(2, S, dtype=torch.int64, device=dev)
    oso_c = torch.zeros(2, S, dtype=torch.int64, device=dev)
    oso_v = torch.zeros(2, W, dtype=torch.int64, device=dev)

    def step():
        st.all_to_all_v_2d(inp, mid, sp2, oso_d, major_align=align)
        mid.mul_(2.0)
        st.all_to_all_v_2d_offset(mid, back, oso_d, oso_c)
        st.all_to_all_v(inp, vout, spv, oso_v)
        st.all_to_all(eq_in, out=eq_out)

    def fill():
        for t in (mid, back, vout, eq_out):
            t.fill_(-1.0)

    def expect_rows(copies, n_rows, scale=1.0, sources=None, fill_value=-1.0):
        want = torch.full((n_rows, H), fill_value, device=dev)
        for q, src, dst, n in copies:
            want[dst:dst + n] = (sources[q] if sources is not None else rows_of[q])[src:src + n] * scale
        return want

    rng = random.Random(31337)

    def new_splits():
        cap = ROWS // S
        s2 = [[0 if rng.random() < 0.3 else rng.randint(1, cap) for _ in range(S)] for _ in range(W)]
        sv = [[0 if rng.random() < 0.3 else rng.randint(1, ROWS // W) for _ in range(W)] for _ in range(W)]
        return s2, sv

    def check(tag, s2, sv, failures):
        disp = [ref.all_to_all_v_2d(s2, E, q, OUT_ROWS, [ROWS] * W, align) for q in range(W)]
        # the rows the dispatch did not write keep their -1, doubled too
        mids = [expect_rows(d.copies, OUT_ROWS, 2.0, fill_value=-2.0) for d in disp]
        comb = ref.all_to_all_v_2d_offset([d.splits for d in disp], [d.offsets for d in disp], E, me,
                                          OUT_ROWS, [OUT_ROWS] * W)
        vrec = ref.all_to_all_v(sv, me, OUT_ROWS, [ROWS] * W)
        eq_want = torch.cat([torch.arange(me * 256, (me + 1) * 256, device=dev, dtype=torch.float32) + q * 10000
                             for q in range(W)])
        for what, got, want in (
            ("dispatch out", mid, mids[me]),
            ("dispatch out_splits_offsets", oso_d.cpu(), torch.tensor([disp[me].splits, disp[me].offsets])),
            ("combine out", back, expect_rows(comb.copies, OUT_ROWS, sources=mids)),
            ("combine out_splits_offsets", oso_c.cpu(), torch.tensor([comb.splits, comb.offsets])),
            ("v out", vout, expect_rows(vrec.copies, OUT_ROWS)),
            ("v out_splits_offsets", oso_v.cpu(), torch.tensor([vrec.splits, vrec.offsets])),
            ("equal out", eq_out, eq_want),
        ):
            bad = first_mismatch(torch, got, want)
            if bad:
                failures.append({"what": f"{tag}: {what}", **bad})

    out = {}
    # Eager first (rendezvous on inp, mid and eq_in happen here, outside any capture).
    s2, sv = new_splits()
    sp2.copy_(torch.tensor(s2[me]))
    spv.copy_(torch.tensor(sv[me]))
    fill()
    ctx.stage("eager step")
    step()
    ctx.wait_gpu("eager step")
    failures = []
    check("eager", s2, sv, failures)

    gs = torch.cuda.Stream(device=dev)
    gs.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    ctx.stage("capture")
    with torch.cuda.stream(gs):
        step()  # warm on the capture stream
        torch.cuda.synchronize(dev)
        with torch.cuda.graph(graph, stream=gs):
            fill()
            step()
    ctx.stage(f"{replays} replays with new splits each")
    for i in range(replays):
        s2, sv = new_splits()
        sp2.copy_(torch.tensor(s2[me]))
        spv.copy_(torch.tensor(sv[me]))
        torch.cuda.synchronize(dev)
        dist.barrier()  # every rank's splits are written before any replay reads them
        graph.replay()
        ctx.wait_gpu(f"replay {i}")
        check(f"replay {i}", s2, sv, failures)
    out["graph_failures"] = failures[:10]

    # torch.compile: no graph break, the same results as eager.
    ctx.stage("torch.compile")

    # The experts' stand-in writes its result into mid in place: the
    # combine's input is the symmetric tensor itself (a tensor computed
    # inside the compiled function would be inductor's memory, not
    # libsymmem's).
    def moe_exchange(x, mid_, back_, splits, oso_d_, oso_c_):
        st.all_to_all_v_2d(x, mid_, splits, oso_d_, major_align=align)
        mid_.copy_(mid_ * 3.0)
        st.all_to_all_v_2d_offset(mid_, back_, oso_d_, oso_c_)
        return back_.sum(dim=1) + 1.0

    compiled = torch.compile(moe_exchange, fullgraph=True)
    s2, _ = new_splits()
    sp2.copy_(torch.tensor(s2[me]))
    torch.cuda.synchronize(dev)
    dist.barrier()
    fill()
    eager_res = moe_exchange(inp, mid, back, sp2, oso_d, oso_c).clone()
    eager_back, eager_oso = back.clone(), oso_c.clone()
    ctx.wait_gpu("eager moe_exchange")
    fill()
    comp_res = compiled(inp, mid, back, sp2, oso_d, oso_c)
    ctx.wait_gpu("compiled moe_exchange")
    out["compiled"] = [first_mismatch(torch, comp_res, eager_res), first_mismatch(torch, back, eager_back),
                       first_mismatch(torch, oso_c, eager_oso)]
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.stream(gs):
        compiled(inp, mid, back, sp2, oso_d, oso_c)
        torch.cuda.synchronize(dev)
        with torch.cuda.graph(graph2, stream=gs):
            fill()
            static = compiled(inp, mid, back, sp2, oso_d, oso_c)
    dist.barrier()
    graph2.replay()
    ctx.wait_gpu("compiled graph replay")
    out["compiled_graph"] = first_mismatch(torch, static, eager_res)
    h = st._fast_entry(torch, inp, None)[4]
    out["device_error"] = h.handle.device_error()
    return out



if __name__ == "__main__":
    run(body)
