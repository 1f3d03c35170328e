"""The copy-engine collectives (algo "copy_engine", sm_free=True) on GPUs,
against references computed with torch and against NCCL on the same
inputs (every rank).

usage: ce_check.py MAX_BYTES

1. Every rank generates every rank's input (seeded by rank and case), so
   each can compute the reference in the order the library reduces (fp32
   accumulation in rank order, rounded once; int32 wrapping): all_reduce
   (in place, into a plain tensor, into the rendezvoused block),
   reduce_scatter, all_gather (into a plain tensor, in place) and the
   equal-split all_to_all, bfloat16 / float16 / float32 / int32, sizes
   of each rank's input from 4 bytes to MAX_BYTES, odd counts included;
   exact (torch.equal). NCCL (a process group of its own) runs the same
   calls on the same inputs: equal bit for bit to ours where the order of
   a reduction cannot matter (2 ranks: one addition; max, min, int32),
   within the dtype's rounding otherwise.
2. A CUDA graph captured on a side stream (after one eager call of each,
   which makes the scratch): copy the base inputs in, all_gather,
   all_reduce, reduce_scatter and all_to_all on the copy engines, add the
   results into accumulators; replayed REPLAYS times, the accumulators
   must be exactly REPLAYS times the references.
3. What runs on the GPU, from torch.profiler's CUDA activity (CUPTI, which
   sees every kernel of the device, also those a library launches with
   cuLaunchKernel, and every copy): a copy-engine all_gather and all_to_all
   launch no kernel at all and make their copies (one per peer chunk and
   our own part: W each); a copy-engine all_reduce launches exactly one
   kernel, symmem_ce_reduce_<dtype>_sum; the SM all_gather, for contrast,
   a kernel. The library's kernels are all named symmem_*; any other CUDA
   activity the profiler lists is recorded too ("other": none is
   expected, nothing else runs on the device meanwhile).
"""

from __future__ import annotations

import sys
from functools import partial

from _symm_common import first_mismatch, rank_inputs, reduce_reference, run, typed_view

REPLAYS = 200


def body(ctx):
    torch = ctx.torch
    import datetime

    import symmem
    import symmem.torch as st

    max_bytes = int(sys.argv[1])
    W, me = ctx.world, ctx.rank
    dev = ctx.device
    info = symmem.collectives_load(ctx.dev)
    dist = ctx.init_dist()
    ctx.stage("NCCL process group")
    nccl = dist.new_group(list(range(W)), backend="nccl", timeout=datetime.timedelta(seconds=ctx.dist_timeout))
    g = ctx.group("ce")
    half = max(max_bytes * W, 1 << 20)
    buf = st.empty(2 * half, dtype=torch.uint8, device=ctx.dev)
    h = symmem.rendezvous(buf.data_ptr(), g)
    local = torch.empty(half, dtype=torch.uint8, device=dev)
    stream = ctx.cur()
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int32": torch.int32}
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

    inputs = partial(rank_inputs, torch, dev, W)
    reduce = partial(reduce_reference, torch)
    view = partial(typed_view, torch)

    def against_nccl(what, ours, theirs, dt, op):
        """ours against NCCL's result: bit for bit where the reduction's
        order cannot matter, else within the dtype's rounding."""
        exact = dt == torch.int32 or op != "sum" or W == 2
        if exact:
            bad = first_mismatch(torch, ours, theirs)
        else:
            tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dt]
            ok = torch.allclose(ours.float(), theirs.float(), rtol=tol, atol=tol * W * 10)
            bad = None if ok else {"max_abs_diff": float((ours.float() - theirs.float()).abs().max())}
        return None if bad is None else {"what": f"{what} against NCCL", **bad}

    sizes = []
    b = 4
    while b <= max_bytes:
        sizes.append(b)
        b *= 4
    sizes += [max_bytes, 12, 4 * 1001 + 4, 65536 + 36, 3 * (1 << 20) + 20]
    sizes = sorted(s for s in set(sizes) if s <= max_bytes)
    checked = 0
    failures = []
    case = 0

    def record(what, bad):
        nonlocal checked
        checked += 1
        if bad:
            failures.append({"what": what, **bad})

    for name, dt in dtypes.items():
        es = torch.tensor([], dtype=dt).element_size()
        dt_ops = ["sum", "max"] if dt == torch.int32 else ["sum", "max", "min"]
        for nbytes in sizes:
            n = max(1, nbytes // es)
            for op in dt_ops:
                case += 1
                xs = inputs(dt, n, case)
                want = reduce(xs, op, dt)
                ref = xs[me].clone()
                ctx.stage(f"nccl all_reduce {name} {op} {n}")
                dist.all_reduce(ref, ops[op], group=nccl)
                for variant in ("inplace", "local", "block", "sm_free"):
                    ctx.stage(f"all_reduce {name} {op} {n} {variant}")
                    view(buf, 0, dt, n).copy_(xs[me])
                    if variant == "inplace":
                        h.all_reduce(name, op, n, None, stream, algo="copy_engine")
                        got = view(buf, 0, dt, n)
                    elif variant == "local":
                        h.all_reduce(name, op, n, local.data_ptr(), stream, algo="copy_engine")
                        got = view(local, 0, dt, n)
                    elif variant == "sm_free":
                        h.all_reduce(name, op, n, local.data_ptr(), stream, sm_free=True)
                        got = view(local, 0, dt, n)
                    else:
                        h.all_reduce(name, op, n, buf.data_ptr() + half, stream, algo="copy_engine")
                        got = view(buf, half, dt, n)
                    ctx.wait_gpu(f"all_reduce {name} {op} {n} {variant}")
                    record(f"all_reduce {name} {op} n={n} {variant}", first_mismatch(torch, got, want))
                    if variant == "local":
                        record(f"all_reduce {name} {op} n={n}", against_nccl(f"all_reduce {name} {op} n={n}", got, ref, dt, op))
                if n % W:
                    continue
                per = n // W
                ctx.stage(f"reduce_scatter {name} {op} {n}")
                view(buf, 0, dt, n).copy_(xs[me])
                h.reduce_scatter(name, op, n, local.data_ptr(), stream, algo="copy_engine")
                ctx.wait_gpu("reduce_scatter")
                got = view(local, 0, dt, per)
                record(f"reduce_scatter {name} {op} n={n}", first_mismatch(torch, got, want[me * per : (me + 1) * per]))
                theirs = torch.empty(per, dtype=dt, device=dev)
                dist.reduce_scatter_tensor(theirs, xs[me].clone(), ops[op], group=nccl)
                record(f"reduce_scatter {name} {op} n={n}", against_nccl(f"reduce_scatter {name} {op} n={n}", got, theirs, dt, op))
                if (per * es) % 16 == 0:
                    # in place: out is our slice of the input
                    view(buf, 0, dt, n).copy_(xs[me])
                    h.reduce_scatter(name, op, n, buf.data_ptr() + me * per * es, stream, sm_free=True)
                    ctx.wait_gpu("reduce_scatter in place")
                    record(f"reduce_scatter in place {name} {op} n={n}",
                           first_mismatch(torch, view(buf, me * per * es, dt, per), want[me * per : (me + 1) * per]))
            case += 1
            xs = inputs(dt, n, case)
            want = torch.cat(xs)
            ctx.stage(f"all_gather {name} {n}")
            view(buf, 0, dt, n).copy_(xs[me])
            h.all_gather(name, n, local.data_ptr(), stream, sm_free=True)
            ctx.wait_gpu("all_gather")
            got = view(local, 0, dt, W * n)
            record(f"all_gather {name} n={n}", first_mismatch(torch, got, want))
            theirs = torch.empty(W * n, dtype=dt, device=dev)
            dist.all_gather_into_tensor(theirs, xs[me].clone(), group=nccl)
            record(f"all_gather {name} n={n} against NCCL", first_mismatch(torch, got, theirs))
            if (n * es) % 16 == 0 and W * n * es <= half:
                base = half - me * n * es
                view(buf, half, dt, n).copy_(xs[me])
                h2 = symmem.rendezvous(buf.data_ptr() + half, g)
                h2.all_gather(name, n, buf.data_ptr() + base, stream, algo="copy_engine")
                ctx.wait_gpu("all_gather in place")
                record(f"all_gather in place {name} n={n}", first_mismatch(torch, view(buf, base, dt, W * n), want))
                h2.release()
            if n % W == 0:
                case += 1
                xs = inputs(dt, n, case)
                per = n // W
                want = torch.cat([xs[s][me * per : (me + 1) * per] for s in range(W)])
                ctx.stage(f"all_to_all {name} {n}")
                view(buf, 0, dt, n).copy_(xs[me])
                h.all_to_all(name, per, local.data_ptr(), stream, sm_free=True)
                ctx.wait_gpu("all_to_all")
                got = view(local, 0, dt, n)
                record(f"all_to_all {name} n={n}", first_mismatch(torch, got, want))
                theirs = torch.empty(n, dtype=dt, device=dev)
                dist.all_to_all_single(theirs, xs[me].clone(), group=nccl)
                record(f"all_to_all {name} n={n} against NCCL", first_mismatch(torch, got, theirs))

    # 2. A CUDA graph of every copy-engine collective.
    ctx.stage("graph")
    n = (1 << 20) + 8  # int32 elements, a multiple of W for W in 2, 4, 8
    t = st.empty(n, dtype=torch.int32, device=ctx.dev)
    hg = symmem.rendezvous(t.data_ptr(), g)
    xs = [torch.arange(n, dtype=torch.int32, device=dev) * (r + 1) + r for r in range(W)]
    want_ar = reduce(xs, "sum", torch.int32).to(torch.int64)
    per = n // W
    want_ag = torch.cat([x[:per] for x in xs]).to(torch.int64)
    want_rs = want_ar[me * per : (me + 1) * per]
    want_a2a = torch.cat([x[me * (per // W) : (me + 1) * (per // W)] for x in xs]).to(torch.int64)
    gathered = torch.empty(W * per, dtype=torch.int32, device=dev)
    scattered = torch.empty(per, dtype=torch.int32, device=dev)
    exchanged = torch.empty(per, dtype=torch.int32, device=dev)
    acc = {k: torch.zeros(m, dtype=torch.int64, device=dev) for k, m in (("ar", n), ("ag", W * per), ("rs", per), ("a2a", per))}
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))

    def step(record_into_acc):
        t.copy_(xs[me])
        hg.all_gather("int32", per, gathered.data_ptr(), s.cuda_stream, sm_free=True)
        hg.reduce_scatter("int32", "sum", n, scattered.data_ptr(), s.cuda_stream, sm_free=True)
        hg.all_to_all("int32", per // W, exchanged.data_ptr(), s.cuda_stream, sm_free=True)
        hg.all_reduce("int32", "sum", n, None, s.cuda_stream, sm_free=True)
        if record_into_acc:
            acc["ag"].add_(gathered)
            acc["rs"].add_(scattered)
            acc["a2a"].add_(exchanged)
            acc["ar"].add_(t)

    with torch.cuda.stream(s):
        step(False)  # eager first: the scratch is made outside the capture
    ctx.wait_gpu("graph warm-up", s)
    out = {"graph_warm": [first_mismatch(torch, gathered.to(torch.int64), want_ag),
                          first_mismatch(torch, scattered.to(torch.int64), want_rs),
                          first_mismatch(torch, exchanged.to(torch.int64), want_a2a),
                          first_mismatch(torch, t.to(torch.int64), want_ar)]}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        step(True)
    for i in range(REPLAYS):
        graph.replay()
        if i % 50 == 49:
            ctx.wait_gpu(f"replay {i}")
    ctx.wait_gpu("replays")
    out["graph"] = {k: first_mismatch(torch, acc[k], w * REPLAYS)
                    for k, w in (("ag", want_ag), ("rs", want_rs), ("a2a", want_a2a), ("ar", want_ar))}
    out["device_error_after_graph"] = hg.device_error()

    # A reduction whose scratch does not exist yet (channel 1 has run none)
    # is refused inside a capture, before anything is enqueued.
    ctx.stage("scratch inside a capture")
    g2 = torch.cuda.CUDAGraph()
    refused = None
    try:
        with torch.cuda.graph(g2, stream=s):
            hg.all_reduce("int32", "sum", n, None, s.cuda_stream, algo="copy_engine", channel=1)
    except symmem.SymmemError as exc:
        refused = (type(exc).__name__, str(exc)[:400])
    except Exception as exc:  # noqa: BLE001 - reported to the test
        refused = (type(exc).__name__, str(exc)[:400])
    out["capture_without_scratch"] = refused
    torch.cuda.synchronize(dev)

    # 3. What runs on the GPU.
    ctx.stage("profile")
    from torch.profiler import ProfilerActivity, profile

    m = 1 << 20

    def gpu_activity(fn):
        torch.cuda.synchronize(dev)
        dist.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(dev)
        kernels, other, copies = [], [], 0
        for e in prof.events():
            if str(e.device_type) != "DeviceType.CUDA":
                continue
            if e.name.startswith("Memcpy") or e.name.startswith("Memset"):
                copies += e.name.startswith("Memcpy")
            elif e.name.startswith("symmem_"):  # every kernel of the library is named so
                kernels.append(e.name)
            else:
                other.append(e.name)
        return {"kernels": kernels, "copies": copies, "other": sorted(set(other))}

    out["activity"] = {
        "all_gather": gpu_activity(lambda: h.all_gather("bfloat16", m, local.data_ptr(), ctx.cur(), sm_free=True)),
        "all_to_all": gpu_activity(lambda: h.all_to_all("bfloat16", m // W, local.data_ptr(), ctx.cur(), sm_free=True)),
        "all_reduce": gpu_activity(lambda: h.all_reduce("bfloat16", "sum", m, local.data_ptr(), ctx.cur(), sm_free=True)),
        "all_gather_sm": gpu_activity(lambda: h.all_gather("bfloat16", m, local.data_ptr(), ctx.cur(), algo="one_shot")),
        # auto, uncaptured, from SYMMEM_CE_ALL_GATHER_MIN_BYTES per rank
        # (the test sets it to 1 MiB): the copy engines at 2 ranks.
        "all_gather_auto": gpu_activity(lambda: h.all_gather("bfloat16", m, local.data_ptr(), ctx.cur())),
    }
    ctx.wait_gpu("the end")
    out.update(checked=checked, failures=failures[:10], device_error=h.device_error(), kernels=info)
    hg.release()
    h.release()
    return out


if __name__ == "__main__":
    run(body)
